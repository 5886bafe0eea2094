package fs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/fs/layout"
)

// pattern returns n bytes with no zero byte, so that a zero-filled tail is
// told apart from leaked neighbour bytes.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32()) | 1
	}
	return b
}

// importTree writes files (namespace-relative name -> bytes) into a local
// directory and imports it under dest.
func importTree(t *testing.T, m *fstest.Mounted, dest string, files map[string][]byte) {
	t.Helper()
	src := t.TempDir()
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Store.Import(context.Background(), src, dest, chunkstore.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
}

func getxattr(t *testing.T, path, name string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		t.Fatalf("getxattr %s %s: %v", path, name, err)
	}
	return string(buf[:n])
}

// TestNoBytesPastEnd proves that no read and no mmap of a file returns a
// byte beyond its end, for files in shared packs (served by the daemon) and
// files with a pack of their own (served by passthrough).
func TestNoBytesPastEnd(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	sizes := []int{1, 100, 4095, 4097, 65537, 300001, 1<<20 + 123, 3<<20 + 5}
	files := map[string][]byte{}
	for i, n := range sizes {
		files[fmt.Sprintf("f%d", n)] = pattern(uint64(i+1), n)
	}
	importTree(t, m, "m", files)
	for name, want := range files {
		p := filepath.Join(m.Dir, "m", name)
		size := len(want)
		path := getxattr(t, p, "user.kylix.path")
		if wantPath := map[bool]string{true: "passthrough", false: "daemon"}[size >= chunkstore.DefaultLargeFileMin]; path != wantPath {
			t.Errorf("%s: user.kylix.path = %q, want %q", name, path, wantPath)
		}
		before := m.FS.Stats()
		got, err := os.ReadFile(p)
		st := m.FS.Stats()
		if size >= chunkstore.DefaultLargeFileMin && (st.DaemonReads != before.DaemonReads || st.PassthroughOpens != before.PassthroughOpens+1) {
			t.Errorf("%s: not served by passthrough: %+v -> %+v", name, before, st)
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: ReadFile: %d bytes, err %v; want %d bytes", name, len(got), err, size)
		}
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, size+3*8192)
		for _, off := range []int{0, size / 2, size - 1, size, size + 1, size + 4096} {
			n, err := unix.Pread(fd, buf, int64(off))
			wantN := max(0, size-off)
			if err != nil || n != wantN {
				t.Errorf("%s: pread at %d: %d bytes, %v; want %d", name, off, n, err, wantN)
			} else if !bytes.Equal(buf[:n], want[min(off, size):]) {
				t.Errorf("%s: pread at %d: wrong bytes", name, off)
			}
		}
		mapLen := (size + 4095) &^ 4095
		mm, err := unix.Mmap(fd, 0, mapLen, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("%s: mmap: %v", name, err)
		}
		if !bytes.Equal(mm[:size], want) {
			t.Errorf("%s: mmap: wrong bytes", name)
		}
		for i := size; i < mapLen; i++ {
			if mm[i] != 0 {
				t.Errorf("%s: mmap shows byte %d past the end (%#x)", name, i, mm[i])
				break
			}
		}
		unix.Munmap(mm)
		unix.Close(fd)
	}
}

// TestRandomReads compares thousands of reads at random offsets and lengths
// with the source, from one thread and from several.
func TestRandomReads(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	base := pattern(7, 12<<20+777)
	// A second version sharing most chunks: several extents in two packs.
	dedup := append(append(append([]byte{}, base[:5<<20]...), pattern(8, 3<<20+11)...), base[5<<20:]...)
	files := map[string][]byte{"base.bin": base, "small.bin": pattern(9, 200003)}
	importTree(t, m, "a", files)
	importTree(t, m, "b", map[string][]byte{"dedup.bin": dedup})
	files["dedup.bin"] = dedup
	dirs := map[string]string{"base.bin": "a", "small.bin": "a", "dedup.bin": "b"}
	for name, want := range files {
		p := filepath.Join(m.Dir, dirs[name], name)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		check := func(r *rand.Rand, n int) error {
			buf := make([]byte, 2<<20)
			for range n {
				off := r.IntN(len(want) + 100)
				l := r.IntN(len(buf))
				if r.IntN(4) == 0 {
					l = r.IntN(8192)
				}
				got, err := f.ReadAt(buf[:l], int64(off))
				if err != nil && !errors.Is(err, os.ErrClosed) && got == l {
					return err
				}
				end := min(len(want), off+l)
				exp := []byte{}
				if off < len(want) {
					exp = want[off:end]
				}
				if !bytes.Equal(buf[:got], exp) {
					return fmt.Errorf("read [%d, +%d): %d bytes differ from the source (want %d)", off, l, got, len(exp))
				}
			}
			return nil
		}
		if err := check(rand.New(rand.NewPCG(1, 2)), 1500); err != nil {
			t.Fatalf("%s single-threaded: %v", name, err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for g := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[g] = check(rand.New(rand.NewPCG(uint64(g), 3)), 500)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("%s multi-threaded: %v", name, err)
			}
		}
		f.Close()
	}
}

func TestLayoutIoctl(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	base := pattern(11, 6<<20+99)
	importTree(t, m, "a", map[string][]byte{"w.bin": base, "s.bin": pattern(12, 5000)})
	dedup := append(append([]byte{}, base[:3<<20]...), pattern(13, 2<<20+1)...)
	importTree(t, m, "b", map[string][]byte{"d.bin": dedup})
	for _, c := range []struct {
		path  string
		data  []byte
		whole bool
	}{{"a/w.bin", base, true}, {"a/s.bin", pattern(12, 5000), false}, {"b/d.bin", dedup, false}} {
		f, err := os.Open(filepath.Join(m.Dir, c.path))
		if err != nil {
			t.Fatal(err)
		}
		fd := int(f.Fd())
		var off uint64
		n := 0
		for off < uint64(len(c.data)) {
			rep, err := layout.Query(fd, off, 0)
			if err != nil {
				t.Fatalf("%s: %v", c.path, err)
			}
			if rep.FileSize != uint64(len(c.data)) {
				t.Fatalf("%s: size %d", c.path, rep.FileSize)
			}
			for _, x := range rep.Extents {
				if x.FileOffset != off || x.Flags&layout.ExtentLocal == 0 {
					t.Fatalf("%s: extent %+v at %d", c.path, x, off)
				}
				if (x.Flags&layout.ExtentWholeFile != 0) != c.whole {
					t.Errorf("%s: whole-file flag %v, want %v", c.path, x.Flags&layout.ExtentWholeFile != 0, c.whole)
				}
				pp, err := layout.PackPath(fd, x.PackID)
				if err != nil {
					t.Fatalf("%s: pack path: %v", c.path, err)
				}
				pf, err := os.Open(pp)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, x.Length)
				if _, err := pf.ReadAt(got, int64(x.PackOffset)); err != nil {
					t.Fatal(err)
				}
				pf.Close()
				if !bytes.Equal(got, c.data[x.FileOffset:x.FileOffset+x.Length]) {
					t.Fatalf("%s: extent %+v: pack bytes differ", c.path, x)
				}
				off += x.Length
				n++
			}
			if rep.NextOffset != off {
				t.Fatalf("%s: next offset %d, covered up to %d", c.path, rep.NextOffset, off)
			}
		}
		t.Logf("%s: %d extents", c.path, n)
		// A sub-range is clipped.
		rep, err := layout.Query(fd, 10, 20)
		if err != nil || len(rep.Extents) != 1 || rep.Extents[0].FileOffset != 10 || rep.Extents[0].Length != 20 || rep.NextOffset != 30 {
			t.Errorf("%s: sub-range: %+v, %v", c.path, rep, err)
		}
		// Garbage gets EINVAL, never a crash.
		bad := func(what string, b []byte, cmd uint32) {
			if err := layout.Raw(fd, cmd, b); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("%s: %s: got %v, want EINVAL", c.path, what, err)
			}
		}
		req := layout.EncodeRequest(layout.Request{})
		req[0] ^= 1
		bad("bad magic", req, layout.CmdLayout)
		req = layout.EncodeRequest(layout.Request{})
		req[4] = 9
		bad("bad version", req, layout.CmdLayout)
		req = layout.EncodeRequest(layout.Request{})
		req[6] = 1
		bad("flags", req, layout.CmdLayout)
		req = layout.EncodeRequest(layout.Request{})
		req[100] = 1
		bad("non-zero output field", req, layout.CmdLayout)
		bad("offset past the end", layout.EncodeRequest(layout.Request{Offset: uint64(len(c.data)) + 1}), layout.CmdLayout)
		bad("overflow", layout.EncodeRequest(layout.Request{Offset: 1 << 40, Length: ^uint64(0) - 10}), layout.CmdLayout)
		bad("pack id 0", layout.EncodePackPathRequest(0), layout.CmdPackPath)
		bad("foreign pack id", layout.EncodePackPathRequest(1<<40), layout.CmdPackPath)
		r := rand.New(rand.NewPCG(5, 5))
		for range 300 {
			b := make([]byte, layout.LayoutSize)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			if r.IntN(2) == 0 {
				copy(b, layout.EncodeRequest(layout.Request{})[:8])
			}
			bad("random bytes", b, layout.CmdLayout)
			pb := make([]byte, layout.PackPathSize)
			for i := range 64 {
				pb[i] = byte(r.Uint32())
			}
			bad("random pack path request", pb, layout.CmdPackPath)
		}
		if err := layout.Raw(fd, 0x8010_4b07, make([]byte, 16)); !errors.Is(err, syscall.ENOTTY) {
			t.Errorf("unknown ioctl: %v, want ENOTTY", err)
		}
		f.Close()
	}
}

// TestReconcile: changes made to the store behind the mount (what the admin
// socket's import and rm do) show in the mount after Reconcile.
func TestReconcile(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "m", map[string][]byte{"x": []byte("version one"), "y": []byte("stays")})
	p := filepath.Join(m.Dir, "m", "x")
	if b, err := os.ReadFile(p); err != nil || string(b) != "version one" {
		t.Fatalf("read: %q %v", b, err)
	}
	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	importTree(t, m, "m", map[string][]byte{"x": []byte("version two!"), "z": []byte("new")})
	if b, err := os.ReadFile(p); err != nil || string(b) != "version two!" {
		t.Fatalf("after import: %q %v", b, err)
	}
	// A reader that opened the old version keeps reading it.
	buf := make([]byte, 64)
	if n, _ := old.ReadAt(buf, 0); string(buf[:n]) != "version one" {
		t.Errorf("old handle reads %q", buf[:n])
	}
	if _, err := os.Stat(filepath.Join(m.Dir, "m", "y")); !os.IsNotExist(err) {
		t.Errorf("y after replacing m: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(m.Dir, "m", "z")); err != nil || string(b) != "new" {
		t.Errorf("z: %q %v", b, err)
	}
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("m/z", false) }); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	if _, err := os.Stat(filepath.Join(m.Dir, "m", "z")); !os.IsNotExist(err) {
		t.Errorf("z after rm: %v", err)
	}
}
