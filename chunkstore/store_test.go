package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kylix/kylix/internal/damage"
)

func openTest(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, IO: "pread", CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeTree writes files of the given sizes under dir and returns their contents.
func writeTree(t *testing.T, dir string, sizes map[string]int, seed uint64) map[string][]byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	out := map[string][]byte{}
	for name, n := range sizes {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		b := randBytes(r, n)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

var testSizes = map[string]int{
	"empty":          0,
	"one":            1,
	"page-1":         4095,
	"page":           4096,
	"sub/under-1m":   1<<20 - 1,
	"sub/exactly-1m": 1 << 20,
	"big":            5<<20 + 3,
	"sub/deep/x":     70000,
}

func TestImportReadBack(t *testing.T) {
	src := t.TempDir()
	want := writeTree(t, src, testSizes, 1)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	res, err := s.Import(ctx, src, "models/m", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != len(testSizes) || res.DedupBytes != 0 {
		t.Fatalf("result %+v", res)
	}
	r := rand.New(rand.NewPCG(2, 2))
	for name, data := range want {
		f, e, err := s.OpenPath("models/m/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if e.Size != int64(len(data)) || f.Size() != int64(len(data)) {
			t.Fatalf("%s: size %d, want %d", name, f.Size(), len(data))
		}
		var buf bytes.Buffer
		if _, err := f.WriteTo(ctx, &buf, nil); err != nil || !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("%s: WriteTo differs (err %v)", name, err)
		}
		for range 50 {
			if len(data) == 0 {
				break
			}
			off := r.IntN(len(data))
			p := make([]byte, r.IntN(3<<20)+1)
			n, err := f.ReadAt(p, int64(off))
			wantN := min(len(p), len(data)-off)
			if n != wantN || !bytes.Equal(p[:n], data[off:off+n]) {
				t.Fatalf("%s: ReadAt(%d, %d) = %d, %v", name, len(p), off, n, err)
			}
			if n < len(p) && err != io.EOF {
				t.Fatalf("%s: short read without EOF: %v", name, err)
			}
		}
		if _, err := f.ReadAt(make([]byte, 1), int64(len(data))); err != io.EOF {
			t.Fatalf("%s: read at end: %v", name, err)
		}
	}
	// Small files share packs at 4 KiB-aligned regions and are never
	// whole-file packs; large new files are.
	for name, data := range want {
		f, _, _ := s.OpenPath("models/m/" + name)
		ex := f.Extents()
		_, whole := f.WholeFilePack()
		if len(data) >= DefaultLargeFileMin {
			if len(ex) != 1 || ex[0].PackOff != 0 || !whole {
				t.Errorf("%s: large file extents %+v whole %v", name, ex, whole)
			}
			continue
		}
		if whole {
			t.Errorf("%s: small file claims a whole-file pack", name)
		}
		if len(ex) > 0 && ex[0].PackOff%4096 != 0 {
			t.Errorf("%s: region starts at %d, not 4 KiB aligned", name, ex[0].PackOff)
		}
	}
	// Importing the same tree again stores nothing new.
	res2, err := s.Import(ctx, src, "models/m2", ImportOptions{})
	if err != nil || res2.NewBytes != 0 || res2.DedupBytes != res.Bytes {
		t.Fatalf("re-import: %+v, %v", res2, err)
	}
	if rep, err := s.Verify(ctx, "", nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

func TestPartialDedupIsMultiExtent(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	a := randBytes(r, 12<<20)
	b := append([]byte(nil), a...)
	copy(b[6<<20:], randBytes(r, 1<<20)) // change a region in the middle
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), a, 0o644)
	os.WriteFile(filepath.Join(dir, "b"), b, 0o644)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Import(ctx, filepath.Join(dir, "a"), "a", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Import(ctx, filepath.Join(dir, "b"), "b", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.DedupBytes < 6<<20 {
		t.Fatalf("content-defined chunking found only %d shared bytes", res.DedupBytes)
	}
	f, _, _ := s.OpenPath("b")
	if len(f.Extents()) < 2 {
		t.Fatalf("extents %+v", f.Extents())
	}
	if _, ok := f.WholeFilePack(); ok {
		t.Fatal("a deduplicated file must not claim a whole-file pack")
	}
	var buf bytes.Buffer
	if _, err := f.WriteTo(ctx, &buf, nil); err != nil || !bytes.Equal(buf.Bytes(), b) {
		t.Fatalf("read back differs: %v", err)
	}
}

// corruptOneByte flips a byte in the middle of the file's first extent.
func corruptOneByte(t *testing.T, f *File) {
	t.Helper()
	ex := f.Extents()[0]
	damage.FlipByte(t, ex.PackPath, ex.PackOff+ex.Len/2)
}

func TestCorruptChunkIsNeverServed(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]int{"big": 3 << 20, "small": 9000}, 4)
	dir := t.TempDir()
	s := openTest(t, dir)
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"big", "small"} {
		f, _, _ := s.OpenPath("m/" + name)
		corruptOneByte(t, f)
		p := make([]byte, f.Size())
		if n, err := f.ReadAt(p, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: read of corrupt data returned %d bytes, err %v", name, n, err)
		}
		if _, err := f.WriteTo(ctx, io.Discard, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: WriteTo err %v", name, err)
		}
	}
	rep, err := s.Verify(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for _, p := range rep.Problems {
		for _, q := range p.Paths {
			paths[q] = true
		}
	}
	if rep.OK() || !paths["m/big"] || !paths["m/small"] {
		t.Fatalf("verify did not name both files: %+v", rep.Problems)
	}
	// Export fails and leaves nothing under the real name.
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := s.Export(ctx, "m/big", out, ExportOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("export: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("export left %s behind", out)
	}
	if ents, _ := os.ReadDir(filepath.Dir(out)); len(ents) != 0 {
		t.Fatalf("export left its partial file behind: %v", ents)
	}
}

func TestOpenRepairsTornWrites(t *testing.T) {
	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"a": 5000, "b": 2 << 20}, 5)
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, IO: "pread"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	fa, _, _ := s.OpenPath("m/a")
	shared := fa.Extents()[0].PackPath
	s.Close()
	// Simulate a crash mid-write: bytes past the committed end of a shared
	// pack, and a pack nothing references. Without an intent record in the
	// metadata log nothing proves the latter was an interrupted write, so it
	// must be left alone (faults_test.go covers the intent case).
	st, _ := os.Stat(shared)
	pf, _ := os.OpenFile(shared, os.O_WRONLY|os.O_APPEND, 0)
	pf.Write(bytes.Repeat([]byte{0xee}, 10000))
	pf.Close()
	orphan := filepath.Join(dir, "packs", "00000000000000ff.pack")
	os.WriteFile(orphan, []byte("half a file"), 0o644)

	s = openTest(t, dir)
	if st2, _ := os.Stat(shared); st2.Size() != st.Size() {
		t.Fatalf("shared pack is %d bytes after reopen, want %d", st2.Size(), st.Size())
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Fatalf("a pack the index does not know was touched: %v", err)
	}
	for name, data := range want {
		f, _, err := s.OpenPath("m/" + name)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, len(data))
		if _, err := f.ReadAt(p, 0); err != nil || !bytes.Equal(p, data) {
			t.Fatalf("%s after recovery: %v", name, err)
		}
	}
	// New packs never reuse the orphan's number.
	if s.allocPack() <= 0xff {
		t.Fatal("pack id reused")
	}
}

func TestGCRemovesOnlyUnreachable(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]int{"a": 3 << 20, "b": 100}, 6)
	src2 := t.TempDir()
	writeTree(t, src2, map[string]int{"c": 2 << 20}, 7)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	s.Import(ctx, src, "keep", ImportOptions{})
	s.Import(ctx, src2, "drop", ImportOptions{})
	if err := s.Update(func(tx *NSTx) error { return tx.Remove("drop", true) }); err != nil {
		t.Fatal(err)
	}
	res, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.BytesRemoved != 2<<20 || res.PacksRemoved != 1 {
		t.Fatalf("gc: %+v", res)
	}
	if rep, err := s.Verify(ctx, "", nil); err != nil || !rep.OK() || rep.Bytes != 3<<20+100 {
		t.Fatalf("verify after gc: %+v %v", rep, err)
	}
	if _, err := s.Lookup("drop"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed path still there: %v", err)
	}
}

func TestNamespaceTx(t *testing.T) {
	s := openTest(t, t.TempDir())
	f := Entry{Kind: KindFile, Mode: 0o644, ID: Sum([]byte("x")), Size: 1}
	err := s.Update(func(tx *NSTx) error {
		if err := tx.Put("a/b/c", f); err != nil {
			return err
		}
		if err := tx.Put("a/link", Entry{Kind: KindSymlink, Target: "b/c", Mode: 0o777}); err != nil {
			return err
		}
		return tx.Rename("a/b", "z")
	})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := s.Lookup("z/c"); err != nil || e.ID != f.ID {
		t.Fatalf("z/c: %+v %v", e, err)
	}
	if _, err := s.Lookup("a/b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a/b after rename: %v", err)
	}
	if e, _ := s.Lookup("a/link"); e.Target != "b/c" || e.Size != 3 {
		t.Fatalf("symlink %+v", e)
	}
	err = s.Update(func(tx *NSTx) error { return tx.Remove("z", false) })
	if !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("remove non-empty: %v", err)
	}
	if err := s.Update(func(tx *NSTx) error { return tx.Put("z/c/d", f) }); !errors.Is(err, ErrNotDir) {
		t.Fatalf("put under a file: %v", err)
	}
	if err := s.Update(func(tx *NSTx) error { return tx.Rename("a", "a/x") }); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("rename into itself: %v", err)
	}
	if _, err := s.Import(context.Background(), t.TempDir(), "../escape", ImportOptions{}); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("import outside the namespace: %v", err)
	}
	if _, err := s.Import(context.Background(), t.TempDir(), "/", ImportOptions{}); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("import over the root: %v", err)
	}
	// A tombstone stays in the manifest for merges but is not listed.
	s.Update(func(tx *NSTx) error { return tx.Remove("a/link", false) })
	root, _, _ := s.Root()
	rd, _ := s.DirManifest(root)
	i, _ := rd.Find("a")
	ad, _ := s.DirManifest(rd.Entries[i].ID)
	j, ok := ad.Find("link")
	if !ok || !ad.Entries[j].Deleted {
		t.Fatalf("no tombstone: %+v", ad.Entries)
	}
	if l, _ := s.List("a"); len(l) != 0 {
		t.Fatalf("list shows %+v", l)
	}
}

func TestLockExcludesSecondOpen(t *testing.T) {
	dir := t.TempDir()
	openTest(t, dir)
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
}

func TestHLCSurvivesClockStepBack(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := NewClock(func() time.Time { return now })
	a := c.Now()
	now = now.Add(-time.Hour)
	b := c.Now()
	c.Observe(b + 100)
	d := c.Now()
	if !(a < b && b < d && d > b+100) {
		t.Fatalf("not monotonic: %v %v %v", a, b, d)
	}
	dir := t.TempDir()
	s, _ := Open(Options{Dir: dir, IO: "pread", Now: func() time.Time { return time.Unix(2_000_000, 0) }})
	s.Update(func(tx *NSTx) error { return tx.Put("x", Entry{Kind: KindSymlink, Target: "y"}) })
	_, h1, _ := s.Root()
	s.Close()
	s, _ = Open(Options{Dir: dir, IO: "pread", Now: func() time.Time { return time.Unix(1_000_000, 0) }})
	defer s.Close()
	s.Update(func(tx *NSTx) error { return tx.Put("x", Entry{Kind: KindSymlink, Target: "z"}) })
	_, h2, _ := s.Root()
	if h2 <= h1 {
		t.Fatalf("update after restart with an earlier clock ordered before: %v <= %v", h2, h1)
	}
}
