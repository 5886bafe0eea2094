package test

// The LD_PRELOAD shim (contrib/preload, docs/design/preload.md) under real
// programs against a live mount: bytes equal to the sources, the stats
// file proving the bytes bypassed FUSE, the node's rule for shared packs,
// and a damaged pack never read through the shim.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/fs/layout"
	"github.com/kylix/kylix/internal/damage"
	"github.com/kylix/kylix/internal/testneeds"
)

type preloadStats struct {
	Bypassed     uint64 `json:"bypassed_bytes"`
	Fuse         uint64 `json:"fuse_bytes"`
	Mmaps        uint64 `json:"mmaps_composed"`
	MmapCopied   uint64 `json:"mmap_copied_bytes"`
	MmapMapped   uint64 `json:"mmap_mapped_bytes"`
	KylixFiles   uint64 `json:"kylix_files"`
	Streams      uint64 `json:"stdio_streams"`
	statsPresent bool
}

// repoRoot is the repository's root (this package is ./test).
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// preloadLib returns a copy of bin/libkylix_preload.so (built by make if
// missing) in a directory every user can read, and the C test program.
func preloadLib(t *testing.T) (lib, ctest string) {
	t.Helper()
	root := repoRoot(t)
	src := filepath.Join(root, "bin", "libkylix_preload.so")
	ctest = filepath.Join(root, "bin", ".libkylix", "preload-test")
	if _, err := os.Stat(ctest); err != nil {
		testneeds.Command(t, "cc", "gcc libc6-dev") // builds bin/libkylix_preload.so
		out, err := exec.Command("make", "-s", "-C", root, "libkylix").CombinedOutput()
		require.NoError(t, err, "make libkylix: %s", out)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	lib = filepath.Join(dir, "libkylix_preload.so")
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(lib, b, 0o755))
	return lib, ctest
}

// shimRun runs argv with the shim preloaded and a stats file; it returns
// stdout and the stats (statsPresent false when the process wrote none).
func shimRun(t *testing.T, lib string, env []string, argv ...string) ([]byte, preloadStats) {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	stats := filepath.Join(dir, "stats.json")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+lib, "KYLIX_PRELOAD_STATS="+stats), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%v: %s", argv, stderr.String())
	var st preloadStats
	if b, err := os.ReadFile(stats); err == nil {
		require.NoError(t, json.Unmarshal(b, &st), "%s", b)
		st.statsPresent = true
	}
	return out, st
}

func hexSHA(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// preloadFiles imports a large random file, a small text file and a demo
// model with its deduplicated fine-tune (and, when torch is installed, a
// .pt file) as m/..., and returns the source directory.
func preloadFiles(t *testing.T, data string, torch bool) string {
	t.Helper()
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "large.bin"), randomBytes(20<<20|4321, 91), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "small.txt"), []byte(strings.Repeat("kylix shim\n", 300)), 0o644))
	model := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "24MiB", model)
	for _, d := range []string{"base", "finetuned"} {
		out, err := exec.Command("cp", "-r", filepath.Join(model, d), filepath.Join(src, d)).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	if torch {
		out, err := exec.Command("/usr/bin/python3", "-c", `import torch, sys
torch.manual_seed(3)
torch.save({"w": torch.randn(512, 1024), "b": torch.arange(1000)}, sys.argv[1])`, filepath.Join(src, "t.pt")).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	mustKylix(t, "/", "import", "--data", data, src, "m")
	return src
}

func hasTorch() bool {
	return exec.Command("/usr/bin/python3", "-c", "import torch, numpy").Run() == nil
}

// fineTuneShard is the fine-tune's first shard (its name from the source).
func fineTuneShard(t *testing.T, src string) string {
	m, err := filepath.Glob(filepath.Join(src, "finetuned", "*.safetensors"))
	require.NoError(t, err)
	require.NotEmpty(t, m)
	return "finetuned/" + filepath.Base(m[0])
}

// TestPreloadPrograms: cat, sha256sum, cp, python (read and mmap), torch
// (torch.load, numpy.memmap) under the shim read files of the mount
// byte-equal to the sources, and the stats prove the pack path was taken;
// a file outside the mount is left alone.
func TestPreloadPrograms(t *testing.T) {
	requireFUSE(t)
	lib, _ := preloadLib(t)
	data, mnt := dirs(t)
	torch := hasTorch()
	src := preloadFiles(t, data, torch)
	startClientNode(t, data, mnt)
	m := func(name string) string { return filepath.Join(mnt, "m", name) }
	large, err := os.ReadFile(filepath.Join(src, "large.bin"))
	require.NoError(t, err)
	ftName := fineTuneShard(t, src)
	ft, err := os.ReadFile(filepath.Join(src, ftName))
	require.NoError(t, err)

	out, st := shimRun(t, lib, nil, "cat", m("large.bin"))
	require.True(t, bytes.Equal(out, large), "cat: wrong bytes")
	require.Equal(t, uint64(len(large)), st.Bypassed, "cat: %+v", st)
	require.Zero(t, st.Fuse)

	out, st = shimRun(t, lib, nil, "cat", m(ftName))
	require.True(t, bytes.Equal(out, ft), "cat fine-tune: wrong bytes")
	require.Greater(t, st.Bypassed, uint64(len(ft))/2, "fine-tune mostly from packs (its own and the base's): %+v", st)

	out, _ = shimRun(t, lib, nil, "sha256sum", m("large.bin"))
	require.Equal(t, hexSHA(large), strings.Fields(string(out))[0], "sha256sum")

	dst := filepath.Join(t.TempDir(), "copy")
	_, st = shimRun(t, lib, nil, "cp", m("large.bin"), dst)
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, large), "cp: wrong bytes")
	require.Equal(t, uint64(len(large)), st.Bypassed, "cp read through the shim: %+v", st)

	py := `import hashlib, mmap, sys
p = sys.argv[1]
with open(p, "rb") as f:
    a = f.read()
with open(p, "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    b = bytes(m)
    m.close()
print(hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest())`
	for _, c := range []struct {
		name string
		want []byte
	}{{"large.bin", large}, {ftName, ft}} {
		out, st = shimRun(t, lib, nil, "/usr/bin/python3", "-c", py, m(c.name))
		require.Equal(t, hexSHA(c.want)+" "+hexSHA(c.want), strings.TrimSpace(string(out)), "python %s", c.name)
		require.GreaterOrEqual(t, st.Mmaps, uint64(1), "python mmap of %s composed: %+v", c.name, st)
		require.Greater(t, st.Bypassed, uint64(0), "%+v", st)
		if c.name == ftName {
			require.Greater(t, st.MmapCopied, uint64(0), "the fine-tune's shifted extents are copied: %+v", st)
		} else {
			require.Equal(t, uint64(len(large)+4095)/4096*4096, st.MmapMapped, "large.bin maps whole: %+v", st)
		}
	}

	// Not Kylix: byte-equal, and the shim did nothing (all counters zero).
	other := filepath.Join(t.TempDir(), "plain.bin")
	require.NoError(t, os.WriteFile(other, large[:1<<20], 0o644))
	out, st = shimRun(t, lib, nil, "/usr/bin/python3", "-c", py, other)
	require.Equal(t, hexSHA(large[:1<<20])+" "+hexSHA(large[:1<<20]), strings.TrimSpace(string(out)))
	require.Equal(t, preloadStats{statsPresent: true}, st, "a process that touched no Kylix file")
	out, st = shimRun(t, lib, nil, "sh", "-c", "echo hi | tr a-z A-Z; ls / >/dev/null")
	require.Equal(t, "HI\n", string(out))
	require.Equal(t, preloadStats{statsPresent: true}, st)

	// Files opened for writing (O_APPEND, O_RDWR) are left to FUSE; once
	// committed, the new bytes are what the shim serves (the size and
	// mtime changed, so nothing cached is used).
	wpy := `import sys, os
p = sys.argv[1]
with open(p, "ab") as f:
    f.write(b"abc")
with open(p, "ab") as f:
    f.write(b"def")
with open(p, "r+b") as f:
    assert f.read() == b"abcdef", "read back while open for writing"
    f.seek(0); f.write(b"X")
with open(p, "rb") as f:
    print(f.read().decode())`
	out, _ = shimRun(t, lib, nil, "/usr/bin/python3", "-c", wpy, m("written.txt"))
	require.Equal(t, "Xbcdef", strings.TrimSpace(string(out)))
	// While its commit is pending the node answers EBUSY and the shim
	// leaves the file to FUSE; after it, the shim serves the new version.
	waitFor(t, 20*time.Second, "written.txt served by the shim after its commit", func() bool {
		out, st = shimRun(t, lib, nil, "cat", m("written.txt"))
		require.Equal(t, "Xbcdef", string(out))
		return st.KylixFiles == 1
	})
	require.Equal(t, uint64(6), st.Bypassed+st.Fuse, "%+v", st)

	// A static binary (kylix itself, Go, no libc) is not touched.
	out, st = shimRun(t, lib, nil, kylixBin, "export", "--help")
	require.NotEmpty(t, out)
	require.False(t, st.statsPresent, "the loader never loaded the shim into a static binary")

	if !torch {
		t.Log("Debian's python3-torch/numpy not installed: torch.load and numpy.memmap not checked")
		return
	}
	tpy := `import sys, torch, numpy as np, hashlib
a = torch.load(sys.argv[1], weights_only=True)
b = torch.load(sys.argv[2], weights_only=True)
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "torch.load differs"
m = np.memmap(sys.argv[3], dtype=np.uint8, mode="r")
print(hashlib.sha256(m.tobytes()).hexdigest())`
	out, st = shimRun(t, lib, nil, "/usr/bin/python3", "-c", tpy, m("t.pt"), filepath.Join(src, "t.pt"), m("large.bin"))
	require.Equal(t, hexSHA(large), strings.TrimSpace(string(out)), "numpy.memmap")
	require.GreaterOrEqual(t, st.Mmaps, uint64(1), "%+v", st)
	require.Greater(t, st.Bypassed, uint64(0), "%+v", st)
}

// TestPreloadCalls: the C test program under the shim (plain, and the
// ASan+UBSan build) reads the large file, a base shard and the fine-tune
// by every intercepted call, from 8 threads and a forked child, byte-equal.
func TestPreloadCalls(t *testing.T) {
	requireFUSE(t)
	lib, ctest := preloadLib(t)
	data, mnt := dirs(t)
	src := preloadFiles(t, data, false)
	startClientNode(t, data, mnt)
	asan, _ := exec.Command("cc", "-print-file-name=libasan.so").Output()
	asanLib := filepath.Join(filepath.Dir(ctest), "libkylix_preload-asan.so")
	for _, name := range []string{"large.bin", "small.txt", fineTuneShard(t, src)} {
		_, st := shimRun(t, lib, nil, ctest, "compare", filepath.Join(mnt, "m", name), filepath.Join(src, name))
		require.Greater(t, st.Bypassed, uint64(0), "%s: %+v", name, st)
		require.Greater(t, st.Mmaps, uint64(0), "%s: %+v", name, st)
		if a := strings.TrimSpace(string(asan)); filepath.IsAbs(a) {
			shimRun(t, a+" "+asanLib, []string{"ASAN_OPTIONS=detect_leaks=0"}, ctest, "compare", filepath.Join(mnt, "m", name), filepath.Join(src, name))
		}
	}
	shimRun(t, lib, nil, ctest, "unit", t.TempDir())
}

// TestPreloadSharedPackRule: two small files share a pack. A process of
// uid 65534 reading the public one gets no fd of that pack while the
// other file is 0600 root's (its bytes come through FUSE, correctly), and
// gets it once the other file is readable.
func TestPreloadSharedPackRule(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "setpriv", "util-linux")
	lib, _ := preloadLib(t)
	data, mnt := dirs(t)
	for d := filepath.Dir(mnt); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	public, secret := randomBytes(5000, 101), randomBytes(7000, 103)
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "public"), public, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "secret"), secret, 0o644))
	mustKylix(t, "/", "import", "--data", data, work, "m")
	pub, sec := extentsOf(t, data, "m/public"), extentsOf(t, data, "m/secret")
	require.Len(t, pub, 1)
	require.Len(t, sec, 1)
	require.Equal(t, pub[0].Pack, sec[0].Pack, "both small files in one shared pack")
	startClientNode(t, data, mnt)
	require.NoError(t, os.Chmod(filepath.Join(mnt, "m/public"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(mnt, "m/secret"), 0o600))
	asNobody := []string{"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"}
	out, st := shimRun(t, lib, nil, append(asNobody, "cat", filepath.Join(mnt, "m/public"))...)
	require.Equal(t, public, out)
	require.Zero(t, st.Bypassed, "the pack holds a file uid 65534 may not read: %+v", st)
	require.Equal(t, uint64(len(public)), st.Fuse, "%+v", st)

	require.NoError(t, os.Chmod(filepath.Join(mnt, "m/secret"), 0o644))
	out, st = shimRun(t, lib, nil, append(asNobody, "cat", filepath.Join(mnt, "m/public"))...)
	require.Equal(t, public, out)
	require.Equal(t, uint64(len(public)), st.Bypassed, "every file in the pack is readable now: %+v", st)
}

// TestPreloadNeverReadsDamagedPack: a flipped byte in a whole-file pack
// and in a base pack a fine-tune shares: the shim hands out neither
// (the node's checks fail), so reads go through the mount, which fails
// the damaged range with EIO; no wrong byte ever reaches the reader.
func TestPreloadNeverReadsDamagedPack(t *testing.T) {
	requireFUSE(t)
	lib, _ := preloadLib(t)
	data, mnt := dirs(t)
	files := faultFiles(t, data)
	base, ft := extentsOf(t, data, "base.bin"), extentsOf(t, data, "ft.bin")
	require.NotEmpty(t, base)
	require.Greater(t, len(ft), 2, "ft.bin is a multi-extent file")
	damage.FlipByte(t, base[0].PackPath, base[0].PackOff+1000)
	startClientNode(t, data, mnt)
	for _, name := range []string{"base.bin", "ft.bin"} {
		dir := t.TempDir()
		stats := filepath.Join(dir, "stats.json")
		cmd := exec.Command("cat", filepath.Join(mnt, name))
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "KYLIX_PRELOAD_STATS="+stats)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.True(t, bytes.HasPrefix(files[name], out), "%s: the bytes read are not a prefix of the file", name)
		if err == nil {
			require.Equal(t, files[name], out, "%s", name)
		} else {
			require.Contains(t, stderr.String(), "Input/output error", "%s", name)
		}
		b, rerr := os.ReadFile(stats)
		require.NoError(t, rerr)
		var st preloadStats
		require.NoError(t, json.Unmarshal(b, &st))
		if name == "base.bin" {
			require.Zero(t, st.Bypassed, "a damaged whole-file pack is not handed out: %+v", st)
		}
		// ft.bin's own pack may be handed out; the base's (damaged) not:
		// the damaged range came through FUSE (EIO), never from the pack.
	}
}

// TestClientPacksShared: PACKS with the shared flag hands a fine-tune the
// base's pack (flags SHARED|CHECKED) beside its own, each fd reading back
// exactly the fine-tune's chunks at the offsets the node's stat gives;
// version 1's empty body still gives no shared pack; malformed bodies are
// EINVAL and the node serves on.
func TestClientPacksShared(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	files := faultFiles(t, data)
	ext := extentsOf(t, data, "ft.bin")
	_, sock := startClientNode(t, data, mnt)
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "ft.bin"))

	r := c.req(clientproto.OpPacks, nil, int(f.Fd()))
	es, err := clientproto.ParsePacks(r.fields)
	require.NoError(t, err)
	for _, e := range es {
		require.NotZero(t, e.Flags&clientproto.PackWholeFile, "version 1 PACKS: only whole-file packs: %+v", es)
	}
	r.close()

	r = c.req(clientproto.OpPacks, clientproto.AppendPacksRequest(nil, clientproto.PacksShared), int(f.Fd()))
	defer r.close()
	require.Zero(t, r.status, r.msg)
	es, err = clientproto.ParsePacks(r.fields)
	require.NoError(t, err)
	require.Len(t, r.fds, len(es))
	packs := map[uint64]bool{}
	for _, x := range ext {
		packs[x.Pack] = true
	}
	require.Len(t, es, len(packs), "every pack of the fine-tune handed out: %s", r.msg)
	shared := 0
	for i, e := range es {
		require.NotZero(t, e.Flags&clientproto.PackChecked)
		if e.Flags&clientproto.PackShared != 0 {
			shared++
		}
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(int(r.fds[i].Fd()), &st))
		require.Equal(t, layout.Generation(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()), e.Generation)
	}
	require.Positive(t, shared, "the base's pack is shared: %+v", es)
	// Each extent reads back from one of the fds (the one whose file is
	// the extent's pack path).
	for _, x := range ext {
		var want unix.Stat_t
		require.NoError(t, unix.Stat(x.PackPath, &want))
		found := false
		for _, pf := range r.fds {
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(int(pf.Fd()), &st))
			if st.Ino != want.Ino || st.Dev != want.Dev {
				continue
			}
			found = true
			b := make([]byte, x.Len)
			_, err := pf.ReadAt(b, x.PackOff)
			require.NoError(t, err)
			require.Equal(t, files["ft.bin"][x.FileOff:x.FileOff+x.Len], b, "extent at %d", x.FileOff)
		}
		require.True(t, found, "no fd for pack %s", x.PackPath)
	}

	for _, body := range [][]byte{{1, 0, 0}, clientproto.AppendPacksRequest(nil, 2), {1, 0, 0, 0, 9, 0, 0, 0}} {
		r := c.req(clientproto.OpPacks, body, int(f.Fd()))
		require.Equal(t, -int32(syscall.EINVAL), r.status, "body %x: %s", body, r.msg)
		require.Empty(t, r.fds)
	}
	r2 := c.req(clientproto.OpStat, nil, int(f.Fd()))
	require.Zero(t, r2.status, "the node serves on: %s", r2.msg)
}
