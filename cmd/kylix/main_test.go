package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/damage"
)

// The test binary doubles as the kylix binary: with KYLIX_TEST_AS_MAIN=1 it
// runs main, so tests drive real processes (and can kill -9 them).
func TestMain(m *testing.M) {
	if os.Getenv("KYLIX_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

type result struct {
	stdout, stderr string
	code           int
}

func kylixCmd(data string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "KYLIX_TEST_AS_MAIN=1", "KYLIX_DATA="+data)
	return cmd
}

func kylix(t *testing.T, data string, args ...string) result {
	t.Helper()
	cmd := kylixCmd(data, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

func mustKylix(t *testing.T, data string, args ...string) result {
	t.Helper()
	r := kylix(t, data, args...)
	if r.code != 0 {
		t.Fatalf("kylix %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

// treeHashes returns sha256 of every regular file under dir, by relative path.
func treeHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		io.Copy(h, f)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%x", h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, a, b string) {
	t.Helper()
	ha, hb := treeHashes(t, a), treeHashes(t, b)
	if len(ha) == 0 || len(ha) != len(hb) {
		t.Fatalf("%s has %d files, %s has %d", a, len(ha), b, len(hb))
	}
	for k, v := range ha {
		if hb[k] != v {
			t.Fatalf("%s differs between %s and %s", k, a, b)
		}
	}
}

// demo writes a small demo model (the same bytes each time) into the test's
// own temporary directory. Not shared through a directory of the package's
// own: one left behind by a test binary that panicked or timed out stayed in
// /tmp (49 MB a run); writing one takes well under a second.
func demo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "demo")
	mustKylix(t, t.TempDir(), "demo-model", "--size", "24MiB", dir)
	return dir
}

func TestDemoModelRoundTripAndDedup(t *testing.T) {
	src := demo(t)
	data := t.TempDir()
	r := mustKylix(t, data, "import", "--json", filepath.Join(src, "base"), "models/base")
	var ir chunkstore.ImportResult
	if err := json.Unmarshal([]byte(r.stdout), &ir); err != nil {
		t.Fatal(err)
	}
	r = mustKylix(t, data, "import", "--json", filepath.Join(src, "finetuned"), "models/ft")
	var fr chunkstore.ImportResult
	json.Unmarshal([]byte(r.stdout), &fr)
	if fr.DedupBytes < fr.Bytes*8/10 {
		t.Fatalf("finetuned dedup only %d of %d bytes", fr.DedupBytes, fr.Bytes)
	}
	var st chunkstore.Stats
	json.Unmarshal([]byte(mustKylix(t, data, "df", "--json").stdout), &st)
	if ratio := float64(st.UniqueBytes) / float64(ir.Bytes); ratio > 1.12 {
		t.Fatalf("base+finetuned store %.3fx one version (goal <= 1.12)", ratio)
	}
	if st.LogicalBytes != ir.Bytes+fr.Bytes {
		t.Fatalf("logical_bytes %d, want %d", st.LogicalBytes, ir.Bytes+fr.Bytes)
	}
	for _, v := range []string{"base", "ft"} {
		out := filepath.Join(t.TempDir(), v)
		mustKylix(t, data, "export", "models/"+v, out)
		want := map[string]string{"base": "base", "ft": "finetuned"}[v]
		sameTree(t, filepath.Join(src, want), out)
	}
	// A freshly imported shard is one contiguous extent in a pack of its own.
	var so statOut
	json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "models/base/model-00001-of-00002.safetensors").stdout), &so)
	if !so.Contiguous || so.WholeFilePack == "" || so.Format != "safetensors" || len(so.Extent) != 1 {
		t.Fatalf("stat: %+v", so)
	}
	var ls []lsEntry
	json.Unmarshal([]byte(mustKylix(t, data, "ls", "--json", "models/base").stdout), &ls)
	if len(ls) < 5 {
		t.Fatalf("ls: %+v", ls)
	}
	mustKylix(t, data, "verify")
}

func TestKill9DuringImport(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	src := demo(t)
	data := t.TempDir()
	mustKylix(t, data, "import", filepath.Join(src, "base"), "models/first")
	// How long an import takes, to aim the kills inside it: one that, like
	// theirs, finds most chunks already stored (the first one, which stores
	// everything, is slower: kills aimed by it mostly came after the end).
	start := time.Now()
	mustKylix(t, data, "import", filepath.Join(src, "base"), "models/second")
	full := time.Since(start)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// Kill until 8 kills have landed inside an import (an import that ends
	// before its kill checks nothing about interruption), at most 32 times.
	interrupted, i := 0, 0
	for ; interrupted < 8 && i < 32; i++ {
		dest := fmt.Sprintf("models/m%d", i)
		which := []string{"base", "finetuned"}[i%2]
		cmd := kylixCmd(data, "import", filepath.Join(src, which), dest)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Not synchronisation: a random fault point somewhere in the import.
		time.Sleep(time.Duration(rng.Int64N(int64(full) + 1)))
		cmd.Process.Signal(syscall.SIGKILL)
		var ee *exec.ExitError
		switch err := cmd.Wait(); {
		case err == nil:
			// The import finished before the kill.
		case errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled():
			interrupted++
		default:
			t.Fatalf("import #%d failed on its own: %v\n%s", i, err, stderr.Bytes())
		}
		if r := kylix(t, data, "verify"); r.code != 0 {
			t.Fatalf("after kill -9 #%d: verify exit %d\n%s%s", i, r.code, r.stdout, r.stderr)
		}
		// dest is either absent or complete, never partial.
		if r := kylix(t, data, "stat", dest); r.code == 0 {
			out := filepath.Join(t.TempDir(), "out")
			mustKylix(t, data, "export", dest, out)
			sameTree(t, filepath.Join(src, which), out)
		}
	}
	t.Logf("%d of %d kills landed inside an import", interrupted, i)
	if interrupted == 0 {
		t.Fatalf("every import finished before its kill -9: nothing was interrupted, so nothing was tested")
	}
	mustKylix(t, data, "gc")
	mustKylix(t, data, "import", filepath.Join(src, "finetuned"), "models/last")
	mustKylix(t, data, "verify")
	out := filepath.Join(t.TempDir(), "out")
	mustKylix(t, data, "export", "models/last", out)
	sameTree(t, filepath.Join(src, "finetuned"), out)
}

func TestCorruptPackIsReported(t *testing.T) {
	src := demo(t)
	data := t.TempDir()
	mustKylix(t, data, "import", filepath.Join(src, "base"), "m")
	var so statOut
	json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "m/tokenizer.json").stdout), &so)
	ex := so.Extent[0]
	damage.FlipByte(t, ex.PackPath, ex.PackOff+100)
	r := kylix(t, data, "verify")
	if r.code != 1 || !strings.Contains(r.stdout, "m/tokenizer.json") || !strings.Contains(r.stdout, "CORRUPT") {
		t.Fatalf("verify: exit %d\n%s", r.code, r.stdout)
	}
	var rep chunkstore.VerifyReport
	kr := kylix(t, data, "verify", "--json")
	json.Unmarshal([]byte(kr.stdout), &rep)
	if kr.code != 1 || len(rep.Problems) != 1 || rep.Problems[0].Paths[0] != "m/tokenizer.json" {
		t.Fatalf("verify --json: %+v", rep)
	}
	out := filepath.Join(t.TempDir(), "tok.json")
	r = kylix(t, data, "export", "m/tokenizer.json", out)
	if r.code == 0 || !strings.Contains(r.stderr, "corrupt") {
		t.Fatalf("export of corrupt file: exit %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("export left a file with wrong bytes")
	}
	// The rest of the model still exports.
	mustKylix(t, data, "export", "m/config.json", filepath.Join(t.TempDir(), "c.json"))
}

func TestBadInput(t *testing.T) {
	data := t.TempDir()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("hello"), 0o644)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"import", "/nonexistent/x", "m"}, 1, "no such file"},
		{[]string{"import", src, "../outside"}, 1, "invalid namespace path"},
		{[]string{"import", src, "/"}, 1, "inside the namespace"},
		{[]string{"import", src}, 2, "wrong number of arguments"},
		{[]string{"import", "--nope", src, "m"}, 2, "unknown flag: --nope"},
		{[]string{"export", "missing/path", t.TempDir()}, 1, "missing/path: no such file or directory in the store (kylix ls missing to list)"},
		{[]string{"stat", "nothing"}, 1, "nothing: no such file or directory in the store (kylix ls to list)"},
		{[]string{"demo-model", "--size", "lots", t.TempDir()}, 1, "not a size"},
		{[]string{"frobnicate"}, 2, "unknown command"},
	}
	for _, c := range cases {
		r := kylix(t, data, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("kylix %v: exit %d (want %d), stderr %q (want %q)", c.args, r.code, c.code, r.stderr, c.want)
		}
	}
	// Export never overwrites without --force.
	mustKylix(t, data, "import", src, "m")
	dst := t.TempDir()
	mustKylix(t, data, "export", "m", dst)
	if r := kylix(t, data, "export", "m", dst); r.code != 1 || !strings.Contains(r.stderr, "exists") {
		t.Errorf("export over existing files: %+v", r)
	}
	mustKylix(t, data, "export", "--force", "m", dst)
	// Help works for every command.
	for name := range commands {
		if r := kylix(t, data, name, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Usage: kylix "+name) {
			t.Errorf("%s --help: exit %d, %q", name, r.code, r.stdout)
		}
	}
}

func TestUnreadableSource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run kylix as another user")
	}
	data := t.TempDir()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "ok"), []byte("fine"), 0o644)
	os.WriteFile(filepath.Join(src, "secret"), []byte("no"), 0o000)
	for _, d := range []string{data, src, filepath.Dir(data)} {
		os.Chown(d, 65534, 65534)
		os.Chmod(d, 0o755)
	}
	// The test binary must be reachable by that user too.
	bin := filepath.Join(t.TempDir(), "kylix")
	exe, _ := os.ReadFile(os.Args[0])
	os.WriteFile(bin, exe, 0o755)
	os.Chmod(filepath.Dir(bin), 0o755)
	cmd := kylixCmd(data, "import", src, "m")
	cmd.Path = bin
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied") || !strings.Contains(string(out), "secret") {
		t.Fatalf("import of unreadable file: %v\n%s", err, out)
	}
	if r := kylix(t, data, "stat", "m"); r.code == 0 {
		t.Fatal("a failed import left its destination in the namespace")
	}
	mustKylix(t, data, "verify")
}

func TestFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	src := demo(t)
	data := t.TempDir()
	if err := syscall.Mount("tmpfs", data, "tmpfs", 0, "size=20m"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	defer syscall.Unmount(data, syscall.MNT_DETACH)
	small := t.TempDir()
	os.WriteFile(filepath.Join(small, "a.txt"), []byte("small and precious"), 0o644)
	mustKylix(t, data, "import", small, "keep")
	r := kylix(t, data, "import", filepath.Join(src, "base"), "models/big")
	if r.code != 1 || !strings.Contains(r.stderr, "no space left on device") {
		t.Fatalf("import onto a full disk: exit %d, stderr %s", r.code, r.stderr)
	}
	mustKylix(t, data, "verify")
	mustKylix(t, data, "gc")
	if r := kylix(t, data, "stat", "models/big"); r.code == 0 {
		t.Fatal("failed import visible in the namespace")
	}
	out := filepath.Join(t.TempDir(), "a.txt")
	mustKylix(t, data, "export", "keep/a.txt", out)
	if b, _ := os.ReadFile(out); string(b) != "small and precious" {
		t.Fatalf("earlier data lost: %q", b)
	}
	// After GC there is room again for small imports.
	mustKylix(t, data, "import", small, "again")
}

func TestLockedStore(t *testing.T) {
	data := t.TempDir()
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := kylix(t, data, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "in use by pid") {
		t.Fatalf("ls on a locked store: %+v", r)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "2GiB": 2 << 30, "1g": 1 << 30, "100": 100, "1.5M": 3 << 19} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-1M", "0"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}

// TestMissingDataDir: a command that reads a store refuses a data directory
// that does not exist, naming it, and creates nothing (a mistyped --data
// used to become a new, empty store that ls showed as empty); kylix import
// creates the store.
func TestMissingDataDir(t *testing.T) {
	data := filepath.Join(t.TempDir(), "typo")
	for _, args := range [][]string{{"ls"}, {"stat", "m/f"}, {"df"}, {"gc"}, {"verify"}, {"warm", "m"}, {"evict", "--all"}} {
		r := kylix(t, data, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "no store at "+data+": the directory does not exist") {
			t.Errorf("kylix %v with a missing data directory: exit %d\nstderr: %s", args, r.code, r.stderr)
		}
		if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("kylix %v created %s", args, data)
		}
	}
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("kylix"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustKylix(t, data, "import", src, "m/f")
	if r := mustKylix(t, data, "ls", "m"); !strings.Contains(r.stdout, "f") {
		t.Errorf("kylix ls after import: %s", r.stdout)
	}
}
