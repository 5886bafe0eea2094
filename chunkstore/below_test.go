package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// belowStore is a store holding m/a (3 MiB), m/d/b (1 MiB), m/d/a-copy
// (a's bytes again) and m/e (empty), with fe as its Fetcher.
func belowStore(t *testing.T, fe Fetcher) (*Store, map[string][]byte) {
	t.Helper()
	src := t.TempDir()
	want := writeTree(t, src, map[string]int{"a": 3 << 20, "d/b": 1 << 20, "e": 0}, 7)
	if err := os.WriteFile(filepath.Join(src, "d", "a-copy"), want["a"], 0o644); err != nil {
		t.Fatal(err)
	}
	want["d/a-copy"] = want["a"]
	s, err := Open(Options{Dir: t.TempDir(), IO: "pread", CacheBytes: 64 << 20, Fetcher: fe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Import(context.Background(), src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	return s, want
}

func TestFilesBelow(t *testing.T) {
	s, _ := belowStore(t, nil)
	ctx := context.Background()
	got, err := s.FilesBelow(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	var again []string
	for _, pf := range got {
		paths = append(paths, pf.Path)
		if pf.Again {
			again = append(again, pf.Path)
		}
		if pf.Entry.Kind != KindFile {
			t.Errorf("%s: kind %v", pf.Path, pf.Entry.Kind)
		}
	}
	if want := []string{"m/a", "m/d/a-copy", "m/d/b", "m/e"}; !slices.Equal(paths, want) {
		t.Fatalf("FilesBelow(m) = %v, want %v", paths, want)
	}
	if !slices.Equal(again, []string{"m/d/a-copy"}) {
		t.Fatalf("Again on %v, want the copy of m/a only", again)
	}
	if got[0].Entry.Size != 3<<20 {
		t.Fatalf("m/a: size %d", got[0].Entry.Size)
	}
	one, err := s.FilesBelow(ctx, "/m/d/b")
	if err != nil || len(one) != 1 || one[0].Path != "m/d/b" || one[0].Again {
		t.Fatalf("FilesBelow of a file: %+v, %v", one, err)
	}
	for _, p := range []string{"m/nope", "nope/x"} {
		_, err := s.FilesBelow(ctx, p)
		if !errors.Is(err, ErrNotFound) || err.Error() != "no such path in the namespace (kylix ls shows what is there)" {
			t.Fatalf("FilesBelow(%s): %v", p, err)
		}
	}
	if _, err := s.FilesBelow(ctx, "m/a/x"); !errors.Is(err, ErrNotDir) {
		t.Fatalf("below a file: %v, want ErrNotDir", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.FilesBelow(cctx, "m"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestChunksBelow(t *testing.T) {
	s, _ := belowStore(t, nil)
	ctx := context.Background()
	refs, err := s.ChunksBelow(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	// The chunks of m/a then m/d/b (the copy and the empty file add none).
	var want []ChunkRef
	for _, p := range []string{"m/a", "m/d/b"} {
		want = append(want, mustOpen(t, s, p).M.Chunks...)
	}
	if len(want) < 3 || !slices.Equal(refs, want) {
		t.Fatalf("ChunksBelow(m): %d chunks, want the %d of m/a and m/d/b in order", len(refs), len(want))
	}
	if _, err := s.ChunksBelow(ctx, "x"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no such path") {
		t.Fatalf("ChunksBelow(x): %v", err)
	}
}

// storeFetcher counts which of its two doors was used.
type storeFetcher struct {
	mapFetcher
	mu      sync.Mutex
	toStore int
}

func (f *storeFetcher) FetchToStore(ctx context.Context, id ID, n uint32) ([]byte, error) {
	f.mu.Lock()
	f.toStore++
	f.mu.Unlock()
	return f.mapFetcher.Fetch(ctx, id, n)
}

// dropChunks makes the chunks of path not stored here and returns them.
func dropChunks(t *testing.T, s *Store, path string, want []byte) map[ID][]byte {
	t.Helper()
	f := mustOpen(t, s, path)
	var ids []ID
	out := map[ID][]byte{}
	for i, c := range f.M.Chunks {
		ids = append(ids, c.ID)
		out[c.ID] = want[f.ChunkOffset(i):f.ChunkOffset(i+1)]
	}
	if _, _, err := s.DropChunks(context.Background(), ids); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMissingBelowAndMakeLocal(t *testing.T) {
	fe := &storeFetcher{mapFetcher: mapFetcher{m: map[ID][]byte{}}}
	s, want := belowStore(t, fe)
	ctx := context.Background()
	if miss, n, err := s.MissingBelow(ctx, "m"); err != nil || len(miss) != 0 || n != 0 {
		t.Fatalf("before any drop: %d missing (%d bytes), %v", len(miss), n, err)
	}
	chunks := dropChunks(t, s, "m/a", want["a"])
	miss, n, err := s.MissingBelow(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	fa := mustOpen(t, s, "m/a")
	if len(miss) != len(fa.M.Chunks) || n != 3<<20 {
		t.Fatalf("%d missing (%d bytes), want the %d chunks of m/a once each", len(miss), n, len(fa.M.Chunks))
	}
	for i, m := range miss {
		if m.Path != "m/a" || m.ID != fa.M.Chunks[i].ID || m.FileOff != fa.ChunkOffset(i) || m.File != fa.ID {
			t.Fatalf("missing %d: %+v", i, m)
		}
	}
	// One chunk no one has: the whole fails naming the file and offset,
	// what arrived is committed.
	last := miss[len(miss)-1]
	for id, b := range chunks {
		if id != last.ID {
			fe.m[id] = b
		}
	}
	res, err := s.MakeLocal(ctx, miss, nil)
	if !errors.Is(err, ErrNotLocal) || !strings.Contains(err.Error(), "m/a: the chunk at offset") {
		t.Fatalf("MakeLocal without one chunk: %v", err)
	}
	left, _, err := s.MissingBelow(ctx, "m")
	if err != nil || len(left) != len(miss)-res.Chunks || !slices.ContainsFunc(left, func(m MissingChunk) bool { return m.ID == last.ID }) {
		t.Fatalf("after a failed MakeLocal that stored %d: %d still missing (%v)", res.Chunks, len(left), err)
	}
	// All there: stored, progress reaches the total, reads need no fetch.
	fe.m[last.ID] = chunks[last.ID]
	var dones []int64
	var total int64
	res, err = s.MakeLocal(ctx, left, func(done, tot int64) { dones = append(dones, done); total = tot })
	if err != nil || res.Chunks != len(left) {
		t.Fatalf("MakeLocal: %+v, %v", res, err)
	}
	var leftBytes int64
	for _, m := range left {
		leftBytes += int64(m.Len)
	}
	if res.Bytes != leftBytes || total != leftBytes || len(dones) != len(left) || dones[len(dones)-1] != leftBytes || !slices.IsSorted(dones) {
		t.Fatalf("progress %v of %d; stored %d bytes, want %d", dones, total, res.Bytes, leftBytes)
	}
	if fe.toStore == 0 || fe.calls.Load() != int64(fe.toStore) {
		t.Fatalf("Fetch called %d times, FetchToStore %d: a StoreFetcher is asked through FetchToStore", fe.calls.Load(), fe.toStore)
	}
	if m, _, _ := s.MissingBelow(ctx, "m"); len(m) != 0 {
		t.Fatalf("%d chunks still missing", len(m))
	}
	fe.m = map[ID][]byte{}
	got := make([]byte, 3<<20)
	if _, err := mustOpen(t, s, "m/d/a-copy").ReadAt(got, 0); err != nil || !bytes.Equal(got, want["a"]) {
		t.Fatalf("reading the stored chunks: %v", err)
	}
	if _, _, err := s.MissingBelow(ctx, "zz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MissingBelow(zz): %v", err)
	}
}

// TestFileMakeLocal: a range of a file, through a plain Fetcher (whose
// bytes the store checks: a wrong chunk is not stored).
func TestFileMakeLocal(t *testing.T) {
	fe := &mapFetcher{m: map[ID][]byte{}}
	s, want := belowStore(t, fe)
	chunks := dropChunks(t, s, "m/d/b", want["d/b"])
	f := mustOpen(t, s, "m/d/b")
	c0 := f.M.Chunks[0]
	bad := bytes.Clone(chunks[c0.ID])
	bad[0] ^= 1
	fe.m[c0.ID] = bad
	if _, err := f.MakeLocal(context.Background(), 0, 10); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "file "+f.ID.Short()) {
		t.Fatalf("a wrong chunk: %v; want ErrCorrupt naming the file", err)
	}
	for id, b := range chunks {
		fe.m[id] = b
	}
	n, err := f.MakeLocal(context.Background(), 0, 10)
	if err != nil || n != 1 {
		t.Fatalf("MakeLocal of the first 10 bytes: %d chunks, %v; want 1", n, err)
	}
	g := mustOpen(t, s, "m/d/b")
	if g.Extents()[0].Pack == 0 || (len(g.M.Chunks) > 1 && g.Extents()[len(g.Extents())-1].Pack != 0) {
		t.Fatalf("extents after MakeLocal of the first chunk: %+v", g.Extents())
	}
}

func TestWarm(t *testing.T) {
	fe := &mapFetcher{m: map[ID][]byte{}}
	s, want := belowStore(t, fe)
	chunks := dropChunks(t, s, "m/d/b", want["d/b"])
	for id, b := range chunks {
		fe.m[id] = b
	}
	var asked []ChunkRef
	var last WarmProgress
	calls := 0
	res, err := s.Warm(context.Background(), "m", WarmOptions{
		Fetching: func(refs []ChunkRef) { asked = refs },
		Progress: func(p WarmProgress) { last = p; calls++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	fb := mustOpen(t, s, "m/d/b")
	if !slices.Equal(asked, fb.M.Chunks) {
		t.Fatalf("Fetching got %d chunks, want the %d of m/d/b", len(asked), len(fb.M.Chunks))
	}
	// m/a and its copy are one version: read once.
	if len(res.Files) != 3 || res.Bytes != 4<<20 || res.LocalBytes != 3<<20 || res.FetchedBytes != 1<<20 || res.FetchedChunks != len(chunks) {
		t.Fatalf("Warm: %d files, %d bytes, %d local, %d fetched (%d chunks)", len(res.Files), res.Bytes, res.LocalBytes, res.FetchedBytes, res.FetchedChunks)
	}
	if calls == 0 || last.Done != 4<<20 || last.Total != 4<<20 || last.Fetched != 1<<20 {
		t.Fatalf("last progress %+v after %d calls", last, calls)
	}
	if fe.calls.Load() != int64(len(chunks)) {
		t.Fatalf("%d fetches, want %d: each missing chunk once", fe.calls.Load(), len(chunks))
	}
	// A fetched chunk that fails its hash fails the warm.
	var id ID
	for id = range chunks {
		break
	}
	bad := bytes.Clone(chunks[id])
	bad[1] ^= 1
	fe.m[id] = bad
	s.cache.remove(id)
	if _, err := s.Warm(context.Background(), "m/d", WarmOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("warm with a corrupt fetched chunk: %v", err)
	}
	if _, err := s.Warm(context.Background(), "m/zz", WarmOptions{}); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no such path") {
		t.Fatalf("Warm(m/zz): %v", err)
	}
}

func TestChunkAtAndOffset(t *testing.T) {
	s, _ := belowStore(t, nil)
	f := mustOpen(t, s, "m/a")
	n := len(f.M.Chunks)
	if f.ChunkOffset(0) != 0 || f.ChunkOffset(n) != f.Size() {
		t.Fatalf("offsets: first %d, end %d, size %d", f.ChunkOffset(0), f.ChunkOffset(n), f.Size())
	}
	var off int64
	for i, c := range f.M.Chunks {
		if f.ChunkOffset(i) != off {
			t.Fatalf("chunk %d at %d, want %d", i, f.ChunkOffset(i), off)
		}
		for _, o := range []int64{off, off + int64(c.Len)/2, off + int64(c.Len) - 1} {
			if got := f.ChunkAt(o); got != i {
				t.Fatalf("ChunkAt(%d) = %d, want %d", o, got, i)
			}
		}
		off += int64(c.Len)
	}
	if f.ChunkAt(f.Size()) != n {
		t.Fatalf("ChunkAt(size) = %d, want %d", f.ChunkAt(f.Size()), n)
	}
}
