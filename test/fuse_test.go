package test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/internal/testneeds"
)

// TestServeAdminSocket: while a node runs, the CLI works through its socket
// (relative paths resolve against the client's directory), the mount shows
// what import and rm change, and SIGTERM unmounts.
func TestServeAdminSocket(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, "src", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(work, "src", "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(work, "src", "sub", "b.bin"), bytes.Repeat([]byte("kylix"), 500000), 0o644)
	n := startNode(t, data, mnt)
	if st, err := os.Stat(filepath.Join(data, "kylix.sock")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("socket: %v %v", st, err)
	}
	// Relative SRC, resolved against this client's working directory.
	out := mustKylix(t, work, "import", "--data", data, "src", "models/m")
	if !strings.Contains(out, "imported src -> models/m: 2 files") {
		t.Errorf("import output: %s", out)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "models", "m", "a.txt")); err != nil || string(b) != "alpha\n" {
		t.Fatalf("mount after import: %q %v", b, err)
	}
	for _, args := range [][]string{{"ls", "-R"}, {"stat", "models/m/sub/b.bin"}, {"df"}, {"verify"}, {"node"}} {
		mustKylix(t, work, append(args[:1:1], append([]string{"--data", data}, args[1:]...)...)...)
	}
	// Relative DEST of export, too.
	mustKylix(t, work, "export", "--data", data, "models/m", "out")
	if b, err := os.ReadFile(filepath.Join(work, "out", "sub", "b.bin")); err != nil || len(b) != 2500000 {
		t.Errorf("export: %d bytes, %v", len(b), err)
	}
	// Errors and exit codes come back.
	if _, errs, code := kylix(t, work, "stat", "--data", data, "no/such"); code != 1 || !strings.Contains(errs, "kylix: no/such: no such file or directory in the store (kylix ls no to list)") {
		t.Errorf("stat of a missing path: exit %d, %q", code, errs)
	}
	mustKylix(t, work, "rm", "--data", data, "models/m/a.txt")
	if _, err := os.Stat(filepath.Join(mnt, "models", "m", "a.txt")); !os.IsNotExist(err) {
		t.Errorf("a.txt after rm: %v", err)
	}
	// A file written in the mount is seen by the CLI at once.
	os.WriteFile(filepath.Join(mnt, "models", "m", "new.txt"), []byte("written in the mount"), 0o644)
	if out := mustKylix(t, work, "ls", "--data", data, "models/m"); !strings.Contains(out, "new.txt") {
		t.Errorf("ls after a write in the mount: %s", out)
	}
	n.stop()
	// Without a node, the same commands open the store directly.
	if out := mustKylix(t, work, "ls", "--data", data, "models/m"); !strings.Contains(out, "new.txt") {
		t.Errorf("ls without a node: %s", out)
	}
}

func sha(t *testing.T, p string) [32]byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// treeSums returns the SHA-256 of every regular file under root, by
// relative path.
func treeSums(t *testing.T, root string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			out[rel] = sha(t, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// demoModel writes the synthetic model (base + finetuned) once per test.
func demoModel(t *testing.T, size string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "model")
	mustKylix(t, "/", "demo-model", "--size", size, out)
	return out
}

// TestCopyModel: cp -r of a model into the mount and back, compared with
// cmp and sha256sum; the copy survives a restart of the node; importing the
// model gives the same bytes through the mount.
func TestCopyModel(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	model := demoModel(t, "24MiB")
	want := treeSums(t, model)
	n := startNode(t, data, mnt)
	run(t, "/", "cp", "-r", model, filepath.Join(mnt, "copy"))
	mustKylix(t, "/", "import", "--data", data, model, "imported")
	for rel := range want {
		for _, top := range []string{"copy", "imported"} {
			run(t, "/", "cmp", filepath.Join(model, rel), filepath.Join(mnt, top, rel))
		}
	}
	// sha256sum -c against the source's sums, inside the mount.
	var list strings.Builder
	for rel := range want {
		fmt.Fprintf(&list, "%s  %s\n", sumHex(t, filepath.Join(model, rel)), rel)
	}
	sums := filepath.Join(t.TempDir(), "SHA256SUMS")
	os.WriteFile(sums, []byte(list.String()), 0o644)
	run(t, filepath.Join(mnt, "copy"), "sha256sum", "--quiet", "-c", sums)
	n.stop()
	startNode(t, data, mnt)
	if got := treeSums(t, filepath.Join(mnt, "copy")); !equalSums(got, want) {
		t.Fatalf("copy differs after restart")
	}
	mustKylix(t, "/", "verify", "--data", data)
}

func sumHex(t *testing.T, p string) string {
	s := sha(t, p)
	return fmt.Sprintf("%x", s[:])
}

func equalSums(a, b map[string][32]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestKill9DuringReads kills the node while programs read through the mount,
// restarts it (clearing the stale mount) and checks the store.
func TestKill9DuringReads(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	model := demoModel(t, "24MiB")
	want := treeSums(t, model)
	n := startNode(t, data, mnt)
	mustKylix(t, "/", "import", "--data", data, model, "m")
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Also when waitFor fails: no reader outlives the test.
	defer func() { stop.Store(true); wg.Wait() }()
	var reads atomic.Int64 // whole files read through the mount
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for rel := range want {
					// errors expected once the node dies
					if _, err := os.ReadFile(filepath.Join(mnt, "m", rel)); err == nil {
						reads.Add(1)
					}
				}
			}
		}()
	}
	// Kill while the readers are at it: after they have read the model at
	// least once between them, not after a guessed time.
	waitFor(t, 30*time.Second, fmt.Sprintf("readers to read %d files through the mount", len(want)),
		func() bool { return reads.Load() >= int64(len(want)) })
	n.kill9()
	stop.Store(true)
	wg.Wait()
	t.Logf("%d files read through the mount before kill -9", reads.Load())
	n = startNode(t, data, mnt)
	mustKylix(t, "/", "verify", "--data", data)
	if got := treeSums(t, filepath.Join(mnt, "m")); !equalSums(got, want) {
		t.Fatalf("model differs after kill -9 and restart")
	}
	n.stop()
}

// TestKill9DuringWrites kills the node while files are being written into
// the mount. After a restart the store verifies, and every file it has is
// whole: one of the versions a writer closed, never a torn one.
func TestKill9DuringWrites(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	os.Mkdir(filepath.Join(mnt, "w"), 0o755)
	content := func(i, size int) []byte {
		r := rand.New(rand.NewPCG(uint64(i), uint64(size)))
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		return b
	}
	sizes := []int{3000, 70000, 1 << 20, 3<<20 + 17}
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Also when waitFor fails: no writer outlives the test.
	defer func() { stop.Store(true); wg.Wait() }()
	var written atomic.Int64
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; !stop.Load(); i += 2 {
				size := sizes[i%len(sizes)]
				p := filepath.Join(mnt, "w", fmt.Sprintf("f%04d", i))
				f, err := os.Create(p)
				if err != nil {
					return
				}
				b := content(i, size)
				for off := 0; off < len(b); off += 64 << 10 {
					if _, err := f.Write(b[off:min(len(b), off+64<<10)]); err != nil {
						break
					}
				}
				f.Close()
				written.Add(1)
			}
		}()
	}
	// Kill while the writers are at it, not after a guessed time: once the
	// store has committed a few of the files they closed. What it had
	// committed before the kill must survive it. The state is read through
	// the mount (user.kylix.state), not with the CLI: a child process
	// (fork+exec) closes its copies of the writers' descriptors, and each
	// such close(2) is a FUSE flush, which would commit a half-written file.
	const committedBeforeKill = 2
	var committed []string
	waitFor(t, 30*time.Second, fmt.Sprintf("the store to commit %d files written into the mount", committedBeforeKill), func() bool {
		committed = committedIn(filepath.Join(mnt, "w"))
		return len(committed) >= committedBeforeKill
	})
	n.kill9()
	stop.Store(true)
	wg.Wait()
	t.Logf("%d files closed before kill -9, %d of them committed before it", written.Load(), len(committed))
	n = startNode(t, data, mnt)
	mustKylix(t, "/", "verify", "--data", data)
	ents, err := os.ReadDir(filepath.Join(mnt, "w"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
	}
	for _, name := range committed {
		if !have[name] {
			t.Errorf("%s was committed before kill -9 and is gone after the restart", name)
		}
	}
	for _, e := range ents {
		var i int
		fmt.Sscanf(e.Name(), "f%04d", &i)
		got, err := os.ReadFile(filepath.Join(mnt, "w", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content(i, sizes[i%len(sizes)])) {
			t.Errorf("%s: %d bytes, not the whole file a writer closed (torn commit)", e.Name(), len(got))
		}
	}
	t.Logf("%d whole files after restart", len(ents))
	// Left-over working copies are gone.
	if tmp, _ := os.ReadDir(filepath.Join(data, "tmp")); len(tmp) != 0 {
		t.Errorf("tmp/ holds %d entries after restart", len(tmp))
	}
	n.stop()
}

// committedIn lists the files in dir whose user.kylix.state says the store
// has committed them.
func committedIn(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	buf := make([]byte, 64)
	for _, e := range ents {
		n, err := syscall.Getxattr(filepath.Join(dir, e.Name()), "user.kylix.state", buf)
		if err == nil && string(buf[:n]) == "committed" {
			names = append(names, e.Name())
		}
	}
	return names
}

// python returns Debian's python3 if it has torch and numpy.
func python(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch, numpy").Run(); err != nil {
		testneeds.Missing(t, "%s lacks torch or numpy (apt-get install -y --no-install-recommends python3-torch python3-numpy): %v", py, err)
	}
	return py
}

const torchScript = `
import sys, json, struct, torch, numpy as np
mnt, src = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
sd = {"w%d" % i: torch.randn(256, 97 + i) for i in range(8)}
sd["big"] = torch.randn(1024, 1025)
torch.save({"model": sd, "step": 7}, mnt + "/ckpt/model.pt")
back = torch.load(mnt + "/ckpt/model.pt")
assert back["step"] == 7
for k, v in sd.items():
    assert torch.equal(back["model"][k], v), k
# safetensors tensors through the mount with numpy.memmap, against the source.
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return 8 + n, hdr
checked = 0
import os
for root, _, files in os.walk(src):
    for name in files:
        if not name.endswith(".safetensors"):
            continue
        s = os.path.join(root, name)
        m = os.path.join(mnt, "model", os.path.relpath(s, src))
        base, hdr = tensors(s)
        a = np.memmap(s, dtype=np.uint8, mode="r")
        b = np.memmap(m, dtype=np.uint8, mode="r")
        assert a.shape == b.shape, (s, a.shape, b.shape)
        for t, info in hdr.items():
            lo, hi = info["data_offsets"]
            assert np.array_equal(a[base+lo:base+hi], b[base+lo:base+hi]), (name, t)
            checked += 1
print("ok", checked)
`

// TestTorch: torch.save into the mount and torch.load back; safetensors
// tensors read through the mount with numpy.memmap equal the source.
func TestTorch(t *testing.T) {
	requireFUSE(t)
	py := python(t)
	data, mnt := dirs(t)
	model := demoModel(t, "16MiB")
	startNode(t, data, mnt)
	os.Mkdir(filepath.Join(mnt, "ckpt"), 0o755)
	mustKylix(t, "/", "import", "--data", data, model, "model")
	script := filepath.Join(t.TempDir(), "t.py")
	os.WriteFile(script, []byte(torchScript), 0o644)
	out := run(t, "/", py, script, mnt, model)
	if !strings.HasPrefix(strings.TrimSpace(out), "ok ") || strings.TrimSpace(out) == "ok 0" {
		t.Fatalf("python: %s", out)
	}
	t.Logf("python: %s", strings.TrimSpace(out))
	mustKylix(t, "/", "verify", "--data", data)
}

// TestAdminSocketRefusesOtherUsers: even with the socket's file mode opened
// up, the node refuses a peer whose uid (SO_PEERCRED) is neither its own nor
// root's.
func TestAdminSocketRefusesOtherUsers(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	startNode(t, data, mnt)
	for _, p := range []string{filepath.Dir(filepath.Dir(data)), filepath.Dir(data), data, filepath.Join(data, "kylix.sock")} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(kylixBin, "ls", "--data", data)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied: the node runs as uid") {
		t.Fatalf("uid 65534 through the socket: %v\n%s", err, out)
	}
}

// TestWriterKilled: a program killed with SIGKILL while writing into the
// mount leaves, as on a local file system, the bytes it wrote: the kernel
// closes its file, the node commits that version whole, and the store
// verifies. (What it had not written is simply not there.)
func TestWriterKilled(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	startNode(t, data, mnt)
	p := filepath.Join(mnt, "partial.bin")
	w := exec.Command("dd", "if=/dev/zero", "of="+p, "bs=64k", "count=100000")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Process.Kill() // also when waitFor fails
	// Kill dd once its file in the mount holds at least one of its blocks:
	// then the file it leaves must not be empty.
	waitFor(t, 30*time.Second, "dd to write 64 KiB into the mount", func() bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Size() >= 64<<10
	})
	w.Process.Kill()
	w.Wait()
	mustKylix(t, "/", "verify", "--data", data) // waits for the commit first
	out := mustKylix(t, "/", "stat", "--data", data, "partial.bin")
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || len(got) >= 100000*65536 {
		t.Fatalf("killed writer left %d bytes", len(got))
	}
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatalf("killed writer's file holds bytes it never wrote")
	}
	if !strings.Contains(out, fmt.Sprintf("size:     %d", len(got))) {
		t.Errorf("store size differs from the mount's %d:\n%s", len(got), out)
	}
	t.Logf("killed writer left %d bytes, committed whole", len(got))
}

// TestChildCloseDoesNotCommit: a file held open for writing is not committed
// when a child process of the writer exits (or execs), closing its copy of
// the descriptor, nor when the writer closes a duplicate (dash's `printf >&3`
// is dup2, printf, dup2 back). Each close(2) is a FUSE flush; the node took
// a flush of its only writer for the writer's close and committed the
// half-written file, so that a kill -9 (or a reader elsewhere) saw a version
// no writer closed. On ext4 nothing changes when a copy is closed; the node
// now commits at RELEASE, when the open file goes (fs/closer.go).
func TestChildCloseDoesNotCommit(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	startNode(t, data, mnt)
	p := filepath.Join(mnt, "half.bin")
	// The writer is a shell, not this process: the CLI run below is a child
	// of this process and must not hold the descriptor itself.
	sh := exec.Command("sh", "-c", `exec 3>"$1"; printf first-half >&3; /bin/true; echo ready; read _; printf second-half >&3`, "sh", p)
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); sh.Wait() }()
	line := make([]byte, 6)
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("writer: %q, %v", line, err)
	}
	// The CLI waits for every handed-off commit: if the child's close was
	// taken for the writer's, the half-written file is in the store now.
	if out, _, code := kylix(t, "/", "stat", "--data", data, "half.bin"); code == 0 {
		t.Fatalf("a file still open for writing was committed when a child of its writer exited:\n%s", out)
	}
	stdin.Close()
	if err := sh.Wait(); err != nil {
		t.Fatal(err)
	}
	if out := mustKylix(t, "/", "stat", "--data", data, "half.bin"); !strings.Contains(out, "size:     21") {
		t.Fatalf("after the writer closed the file:\n%s", out)
	}
}
