package test

// The LD_PRELOAD shim's stdio streams (docs/design/preload.md, "stdio"):
// sha256sum, numpy.fromfile and a C program reading through fopen, fread,
// fseek, getline... get the source's bytes from the packs, and the
// attacks: permissions (uid 65534), a file rewritten under an open
// stream, fork, other files, the switch that turns it off.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/damage"
	"github.com/kylix/kylix/internal/testneeds"
)

// TestPreloadStdio: real programs that read through stdio under the shim
// (sha256sum and other coreutils, sed, Debian's numpy.fromfile, C++'s
// std::ifstream, the C program's every stdio read
// call compared with glibc's stream on the source, plain and ASan+UBSan)
// read byte-equal files whose bytes the stats show came from the packs,
// not FUSE (before the stdio streams, sha256sum's were all FUSE's).
func TestPreloadStdio(t *testing.T) {
	requireFUSE(t)
	lib, ctest := preloadLib(t)
	data, mnt := dirs(t)
	src := t.TempDir()
	large := randomBytes(20<<20|4321, 93)
	var text, wide strings.Builder
	for i := 0; i < 20000; i++ {
		text.WriteString(strings.Repeat("kylix ", i%13) + "line\n")
	}
	for i := 0; i < 300; i++ {
		wide.WriteString("h\u00e9llo w\u00f6rld \u20ac \U0001F600 zeile\n")
	}
	files := map[string][]byte{"large.bin": large, "text.txt": []byte(text.String()), "wide.txt": []byte(wide.String())}
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o644))
	}
	mustKylix(t, "/", "import", "--data", data, src, "m")
	startClientNode(t, data, mnt)
	m := func(name string) string { return filepath.Join(mnt, "m", name) }

	out, st := shimRun(t, lib, nil, "sha256sum", m("large.bin"))
	require.Equal(t, hexSHA(large), strings.Fields(string(out))[0], "sha256sum")
	require.Equal(t, uint64(len(large)), st.Bypassed, "sha256sum's fread from the packs: %+v", st)
	require.Zero(t, st.Fuse, "%+v", st)
	require.Equal(t, uint64(1), st.Streams, "%+v", st)

	// Other stdio readers of coreutils and sed: the same output as on the
	// source, every byte from the packs.
	for _, argv := range [][]string{{"sort"}, {"cut", "-c1-5"}, {"nl"}, {"od", "-An", "-tx1"},
		{"sed", "-n", "5p;$p"}, {"paste", "-s", "-d,"}, {"fold", "-w", "50"}, {"md5sum"}} {
		want, err := exec.Command(argv[0], append(argv[1:], filepath.Join(src, "text.txt"))...).Output()
		require.NoError(t, err, "%v", argv)
		out, st := shimRun(t, lib, nil, append(argv, m("text.txt"))...)
		if argv[0] == "md5sum" {
			want, out = bytes.Fields(want)[0], bytes.Fields(out)[0]
		}
		require.Equal(t, string(want), string(out), "%v", argv)
		require.Equal(t, uint64(1), st.Streams, "%v: %+v", argv, st)
		require.GreaterOrEqual(t, st.Bypassed, uint64(len(files["text.txt"])), "%v: %+v", argv, st)
		require.Zero(t, st.Fuse, "%v: %+v", argv, st)
	}

	// The switch: glibc's streams, FUSE (the shim sees none of it).
	out, st = shimRun(t, lib, []string{"KYLIX_PRELOAD_STDIO=0"}, "sha256sum", m("large.bin"))
	require.Equal(t, hexSHA(large), strings.Fields(string(out))[0])
	require.Zero(t, st.Streams+st.Bypassed, "KYLIX_PRELOAD_STDIO=0: %+v", st)

	// A file outside the mount: untouched (all counters zero).
	other := filepath.Join(t.TempDir(), "plain.bin")
	require.NoError(t, os.WriteFile(other, large[:1<<20], 0o644))
	out, st = shimRun(t, lib, nil, "sha256sum", other)
	require.Equal(t, hexSHA(large[:1<<20]), strings.Fields(string(out))[0])
	require.Equal(t, preloadStats{statsPresent: true}, st, "a stream on a file outside the mount")

	// numpy.fromfile: a path (numpy's own fopen) and an open file object
	// at an offset (dup + fdopen, fseek/ftell, fread), then the Python
	// file's position where numpy left it.
	if py, err := testneeds.Python("numpy"); err == nil {
		npy := `import sys, hashlib, numpy as np
p = sys.argv[1]
a = np.fromfile(p, dtype=np.uint8)
with open(p, "rb") as f:
    f.seek(1000)
    b = np.fromfile(f, dtype=np.uint8, count=5000)
    pos = f.tell()
    c = np.fromfile(f, dtype=np.uint32, count=1000, offset=8)
    pos2 = f.tell()
print(hashlib.sha256(a.tobytes()).hexdigest(), hashlib.sha256(b.tobytes()).hexdigest(), pos,
      hashlib.sha256(c.tobytes()).hexdigest(), pos2)`
		out, st = shimRun(t, lib, nil, py, "-c", npy, m("large.bin"))
		want := strings.Join([]string{hexSHA(large), hexSHA(large[1000:6000]), "6000",
			hexSHA(large[6008:10008]), "10008"}, " ")
		require.Equal(t, want, strings.TrimSpace(string(out)), "numpy.fromfile")
		require.Equal(t, uint64(3), st.Streams, "numpy's fopen and two fdopens: %+v", st)
		require.GreaterOrEqual(t, st.Bypassed, uint64(len(large)), "%+v", st)
		require.Zero(t, st.Fuse, "%+v", st)
	} else {
		testneeds.Missing(t, "numpy.fromfile not checked: %v (apt-get install python3-numpy)", err)
	}

	// C++: libstdc++'s filebuf opens with fopen and reads, seeks and
	// stats through fileno(): the cookie stream's fileno must be the fd.
	cxx := testneeds.Command(t, "c++", "g++")
	ifs := filepath.Join(t.TempDir(), "ifs")
	ifsSrc := ifs + ".cc"
	require.NoError(t, os.WriteFile(ifsSrc, []byte(`#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
int main(int argc, char **argv) {
	std::ifstream f(argv[1], std::ios::binary);
	if (!f) return 2;
	std::ostringstream all;
	all << f.rdbuf();
	f.clear();
	f.seekg(1000);
	char b[5000];
	f.read(b, sizeof b);
	std::string mid(b, (size_t)f.gcount());
	long pos = (long)f.tellg();
	f.seekg(-100, std::ios::end);
	std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
	std::hash<std::string> h;
	std::cout << all.str().size() << " " << h(all.str()) << " " << h(mid) << " " << pos << " " << h(tail) << "\n";
}
`), 0o644))
	bout, err := exec.Command(cxx, "-O2", "-o", ifs, ifsSrc).CombinedOutput()
	require.NoError(t, err, "%s", bout)
	wantIfs, err := exec.Command(ifs, filepath.Join(src, "large.bin")).Output()
	require.NoError(t, err)
	out, st = shimRun(t, lib, nil, ifs, m("large.bin"))
	require.Equal(t, string(wantIfs), string(out), "std::ifstream")
	require.Equal(t, uint64(1), st.Streams, "%+v", st)
	require.GreaterOrEqual(t, st.Bypassed, uint64(len(large)), "%+v", st)
	require.Zero(t, st.Fuse, "%+v", st)

	// The C program: every stdio read call against glibc's stream on the
	// source, plain and under ASan+UBSan.
	asan, _ := exec.Command("cc", "-print-file-name=libasan.so").Output()
	asanLib := filepath.Join(filepath.Dir(ctest), "libkylix_preload-asan.so")
	for _, c := range [][]string{
		{"stdio", m("large.bin"), filepath.Join(src, "large.bin"), "served"},
		{"stdio", m("text.txt"), filepath.Join(src, "text.txt"), "served"},
		{"stdio-wide", m("wide.txt"), filepath.Join(src, "wide.txt"), "served"},
	} {
		out, st = shimRun(t, lib, nil, append([]string{ctest}, c...)...)
		require.Equal(t, "ok\n", string(out), "%v", c)
		require.Positive(t, st.Streams, "%v: %+v", c, st)
		require.Positive(t, st.Bypassed, "%v: %+v", c, st)
		require.Zero(t, st.Fuse, "%v: %+v", c, st)
		if a := strings.TrimSpace(string(asan)); filepath.IsAbs(a) {
			out, _ = shimRun(t, a+" "+asanLib, []string{"ASAN_OPTIONS=detect_leaks=0", "UBSAN_OPTIONS=halt_on_error=1"},
				append([]string{ctest}, c...)...)
			require.Equal(t, "ok\n", string(out), "ASan+UBSan %v", c)
		} else {
			testneeds.Missing(t, "no libasan.so for cc: the ASan run skipped")
		}
	}
}

// TestPreloadStdioRewrite: a stream that read part of a file goes on
// reading after the file is rewritten through the mount as it does
// without the shim: what its buffer held of the old version, then the new
// version (the shim sees the new size and mtime and looks again: never
// the old version's packs for the new bytes).
func TestPreloadStdioRewrite(t *testing.T) {
	requireFUSE(t)
	lib, ctest := preloadLib(t)
	data, mnt := dirs(t)
	src := t.TempDir()
	orig := randomBytes(300<<10|77, 95)
	require.NoError(t, os.WriteFile(filepath.Join(src, "rw.bin"), orig, 0o644))
	mustKylix(t, "/", "import", "--data", data, src, "m")
	startClientNode(t, data, mnt)
	p := filepath.Join(mnt, "m", "rw.bin")

	plain, err := exec.Command(ctest, "stdio-rewrite", p).Output()
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(plain, orig[:5000]), "without the shim: the first 5000 bytes are the old version's")
	rewritten, err := os.ReadFile(p)
	require.NoError(t, err)

	// Back to the original; once committed the shim serves it again.
	require.NoError(t, os.WriteFile(p, orig, 0o644))
	waitFor(t, 20*time.Second, "rw.bin served from the packs again", func() bool {
		out, st := shimRun(t, lib, nil, "cat", p)
		require.Equal(t, orig, out)
		return st.Bypassed == uint64(len(orig))
	})
	out, st := shimRun(t, lib, nil, ctest, "stdio-rewrite", p)
	require.Equal(t, uint64(1), st.Streams, "%+v", st)
	require.GreaterOrEqual(t, st.Bypassed, uint64(5000), "the first part from the packs: %+v", st)
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, rewritten, got, "the rewrite itself")

	// Both read what their buffer held of the old version (glibc's 8 KiB,
	// the shim's stream 64 KiB), then the new version from there to its
	// end: never another byte.
	for _, c := range []struct {
		name string
		out  []byte
		max  int
	}{{"without the shim", plain, 8192}, {"with the shim", out, 65536}} {
		require.True(t, bytes.HasSuffix(c.out, []byte("ok\n")), "%s: the program's checks passed", c.name)
		c.out = c.out[:len(c.out)-3]
		k := 0
		for k < len(c.out) && k < len(orig) && c.out[k] == orig[k] {
			k++
		}
		require.GreaterOrEqual(t, k, 5000, "%s: the old version's first 5000 bytes", c.name)
		require.LessOrEqual(t, k, c.max, "%s: at most the buffer of the old version", c.name)
		require.Equal(t, len(rewritten), len(c.out), "%s: read to the new version's end", c.name)
		require.True(t, bytes.Equal(rewritten[k:], c.out[k:]), "%s: the new version's bytes after the old ones (from %d)", c.name, k)
	}
}

// TestPreloadStdioPermissions: uid 65534 cannot read through a stream a
// file it may not read (its own, chmod 000 by itself; root's 0600), and
// its stream on a readable file whose shared pack holds root's 0600 file
// is glibc's (no pack handed out), until that file is readable.
func TestPreloadStdioPermissions(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "setpriv", "util-linux")
	lib, _ := preloadLib(t)
	data, mnt := dirs(t)
	for d := filepath.Dir(mnt); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	public, secret, own := randomBytes(5000, 111), randomBytes(7000, 113), randomBytes(3000, 117)
	work := t.TempDir()
	for name, b := range map[string][]byte{"public": public, "secret": secret, "own": own} {
		require.NoError(t, os.WriteFile(filepath.Join(work, name), b, 0o644))
	}
	// uid 65534's own file, owned so from the import.
	require.NoError(t, os.Chown(filepath.Join(work, "own"), 65534, 65534))
	mustKylix(t, "/", "import", "--data", data, work, "m")
	pub, sec := extentsOf(t, data, "m/public"), extentsOf(t, data, "m/secret")
	require.Equal(t, pub[0].Pack, sec[0].Pack, "public and secret in one shared pack")
	startClientNode(t, data, mnt)
	m := func(name string) string { return filepath.Join(mnt, "m", name) }
	require.NoError(t, os.Chmod(m("secret"), 0o600))
	asNobody := []string{"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"}
	nobody := func(argv ...string) *exec.Cmd {
		c := exec.Command(asNobody[0], append(asNobody[1:], argv...)...)
		c.Env = append(os.Environ(), "LD_PRELOAD="+lib)
		return c
	}
	require.NoError(t, nobody("chmod", "000", m("own")).Run(), "uid 65534 makes its own file unreadable")
	for _, name := range []string{"own", "secret"} {
		out, err := nobody("sha256sum", m(name)).CombinedOutput()
		require.Error(t, err, "uid 65534 read %s through a stream: %s", name, out)
		require.Contains(t, string(out), "Permission denied", name)
	}

	out, st := shimRun(t, lib, nil, append(asNobody, "sha256sum", m("public"))...)
	require.Equal(t, hexSHA(public), strings.Fields(string(out))[0])
	require.Zero(t, st.Bypassed, "the pack holds a file uid 65534 may not read: %+v", st)
	require.Zero(t, st.Streams, "no pack handed out: glibc's stream: %+v", st)

	require.NoError(t, os.Chmod(m("secret"), 0o644))
	require.NoError(t, os.Chmod(m("own"), 0o644))
	out, st = shimRun(t, lib, nil, append(asNobody, "sha256sum", m("public"))...)
	require.Equal(t, hexSHA(public), strings.Fields(string(out))[0])
	require.Equal(t, uint64(len(public)), st.Bypassed, "every file in the pack readable now: %+v", st)
	require.Equal(t, uint64(1), st.Streams, "%+v", st)
}

// TestPreloadStdioPacks: a fine-tune whose extents lie in its own pack
// and in its base's shared pack, read through every stdio call (the C
// program against glibc's stream on the source); and a flipped byte in a
// base pack: sha256sum under the shim never prints a digest of wrong
// bytes (the damaged pack is not handed out; the mount fails the damaged
// range with EIO).
func TestPreloadStdioPacks(t *testing.T) {
	requireFUSE(t)
	lib, ctest := preloadLib(t)
	t.Run("fine-tune", func(t *testing.T) {
		data, mnt := dirs(t)
		files := faultFiles(t, data)
		require.Greater(t, len(extentsOf(t, data, "ft.bin")), 2, "ft.bin is a multi-extent file")
		startClientNode(t, data, mnt)
		src := filepath.Join(t.TempDir(), "ft.bin")
		require.NoError(t, os.WriteFile(src, files["ft.bin"], 0o644))
		out, st := shimRun(t, lib, nil, ctest, "stdio", filepath.Join(mnt, "ft.bin"), src, "served")
		require.Equal(t, "ok\n", string(out))
		require.Positive(t, st.Streams, "%+v", st)
		require.Positive(t, st.Bypassed, "%+v", st)
	})
	t.Run("damaged", func(t *testing.T) {
		data, mnt := dirs(t)
		files := faultFiles(t, data)
		base := extentsOf(t, data, "base.bin")
		require.NotEmpty(t, base)
		damage.FlipByte(t, base[0].PackPath, base[0].PackOff+1000)
		startClientNode(t, data, mnt)
		for _, name := range []string{"base.bin", "ft.bin"} {
			dir := t.TempDir()
			stats := filepath.Join(dir, "stats.json")
			cmd := exec.Command("sha256sum", filepath.Join(mnt, name))
			cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "KYLIX_PRELOAD_STATS="+stats)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err == nil {
				require.Equal(t, hexSHA(files[name]), strings.Fields(string(out))[0], "%s: a digest, so of the right bytes", name)
			} else {
				require.Contains(t, stderr.String(), "Input/output error", "%s", name)
				require.Empty(t, out, "%s: no digest printed", name)
			}
			b, rerr := os.ReadFile(stats)
			require.NoError(t, rerr)
			var st preloadStats
			require.NoError(t, json.Unmarshal(b, &st))
			if name == "base.bin" {
				require.Zero(t, st.Bypassed+st.Streams, "a damaged whole-file pack is not handed out: %+v", st)
			}
		}
	})
}
