package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/chunkstore/storeio/storeiotest"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// faultStore opens a store whose storage reads go through a fault injector,
// with a fake clock, and imports files of the given sizes under m/.
func faultStore(t *testing.T, sizes map[string]int, opts Options) (*Store, *storeiotest.Reader, *fakeClock, map[string][]byte) {
	t.Helper()
	src := t.TempDir()
	want := writeTree(t, src, sizes, 21)
	clk := &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	opts.Dir, opts.IO, opts.CacheBytes, opts.Now = t.TempDir(), "pread", 64<<20, clk.now
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Import(context.Background(), src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	fr := storeiotest.Wrap(s.io)
	s.io = fr
	return s, fr, clk, want
}

func mustOpen(t *testing.T, s *Store, path string) *File {
	t.Helper()
	f, _, err := s.OpenPath(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestPlanLeaseKeepsPackThroughGC(t *testing.T) {
	s, _, _, want := faultStore(t, map[string]int{"a": 3 << 20, "b": 100}, Options{})
	f := mustOpen(t, s, "m/a")
	plan, err := f.Plan(0, f.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Release()
	if len(plan.Pieces) != len(f.M.Chunks) || len(plan.Missing()) != 0 {
		t.Fatalf("plan: %d pieces (%d missing), file has %d chunks", len(plan.Pieces), len(plan.Missing()), len(f.M.Chunks))
	}
	pc := plan.Pieces[0]
	path := pc.Lease.Path()
	if err := s.Update(func(tx *NSTx) error { return tx.Remove("m/a", false) }); err != nil {
		t.Fatal(err)
	}
	if res, err := s.GC(context.Background()); err != nil || res.PacksRemoved != 1 {
		t.Fatalf("gc: %+v %v", res, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("GC deleted a leased pack: %v", err)
	}
	// The lease's fd still reads the chunk.
	buf := make([]byte, pc.Len)
	if n, err := unix.Pread(pc.Lease.Fd(), buf, pc.PackOff); err != nil || int64(n) != pc.Len || Sum(buf) != pc.ID {
		t.Fatalf("read through the lease after GC: %d %v", n, err)
	}
	if !bytes.Equal(buf, want["a"][:pc.Len]) {
		t.Fatal("wrong bytes through the lease")
	}
	// Collected: a new plan finds the chunks missing, never a deleted file.
	p2, err := f.Plan(0, f.Size())
	if err != nil {
		t.Fatal(err)
	}
	if len(p2.Missing()) != len(p2.Pieces) {
		t.Fatalf("a collected pack was leased again")
	}
	p2.Release()
	plan.Release()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("pack still there after the last lease: %v", err)
	}
	if n := s.packs.leases(pc.Pack); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

func TestNotLocalIsNotNotFound(t *testing.T) {
	s, _, _, _ := faultStore(t, map[string]int{"a": 3 << 20}, Options{})
	if _, _, err := s.OpenPath("m/nope"); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotLocal) {
		t.Fatalf("missing path: %v; want ErrNotFound", err)
	}
	f := mustOpen(t, s, "m/a")
	if err := os.Remove(f.Extents()[0].PackPath); err != nil {
		t.Fatal(err)
	}
	_, err := f.ReadAt(make([]byte, 10), 0)
	if !errors.Is(err, ErrNotLocal) || errors.Is(err, ErrNotFound) {
		t.Fatalf("chunk of a missing pack: %v; want ErrNotLocal, not ErrNotFound", err)
	}
	if _, err := s.ReadChunk(context.Background(), Sum([]byte("never stored"))); !errors.Is(err, ErrNotLocal) || errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown chunk: %v; want ErrNotLocal", err)
	}
	plan, err := f.Plan(0, 1)
	if err != nil || len(plan.Missing()) != 1 {
		t.Fatalf("plan of a missing pack: %v %+v", err, plan)
	}
	plan.Release()
}

// TestSingleFlight: N readers of one chunk at once share one storage read.
func TestSingleFlight(t *testing.T) {
	s, fr, _, want := faultStore(t, map[string]int{"a": 3 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	id := f.M.Chunks[0].ID
	const n = 8
	var held atomic.Bool
	fr.Before = func([]*storeio.Request) {
		if held.Swap(true) {
			return
		}
		// Hold the first read until every other reader waits for it.
		deadline := time.Now().Add(10 * time.Second)
		for s.cache.waiting(id) < n-1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 1000)
			off := int64(i * 1000)
			if _, err := f.ReadAt(p, off); err != nil {
				errs <- err
			} else if !bytes.Equal(p, want["a"][off:off+1000]) {
				errs <- fmt.Errorf("reader %d: wrong bytes", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if w := s.cache.waiting(id); w != n-1 {
		t.Fatalf("%d readers waited for the read; want %d", w, n-1)
	}
	if r := fr.Reads(); r != 1 {
		t.Fatalf("%d storage reads for %d concurrent readers of one chunk; want 1", r, n)
	}
}

// TestFailureNotCached: an EIO from the disk reaches the reader wrapped and
// naming the chunk; it is remembered for a moment (no second storage read),
// never cached as bytes, and forgotten after DefaultFailTTL.
func TestFailureNotCached(t *testing.T) {
	s, fr, clk, want := faultStore(t, map[string]int{"a": 3 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	fr.Always(storeiotest.EIO)
	p := make([]byte, 4096)
	_, err := f.ReadAt(p, 0)
	var re *ReadError
	if !errors.Is(err, syscall.EIO) || !errors.As(err, &re) || re.Chunk != f.M.Chunks[0].ID || re.Pack == 0 {
		t.Fatalf("EIO from the disk: %v; want it wrapped in a ReadError naming chunk %s", err, f.M.Chunks[0].ID.Short())
	}
	if !Logged(err) {
		t.Fatal("a chunk read failure should count as logged by the store")
	}
	fr.Clear()
	if _, err := f.ReadAt(p, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("within the failure memory: %v; want the same EIO", err)
	}
	if r := fr.Reads(); r != 1 {
		t.Fatalf("%d storage reads; a remembered failure must not read again", r)
	}
	if _, ok := s.cache.get(f.M.Chunks[0].ID); ok {
		t.Fatal("a failed chunk is in the cache")
	}
	clk.advance(DefaultFailTTL + time.Second)
	if _, err := f.ReadAt(p, 0); err != nil || !bytes.Equal(p, want["a"][:4096]) {
		t.Fatalf("after the failure was forgotten: %v", err)
	}
}

func TestShortReadIsCorrupt(t *testing.T) {
	s, fr, _, _ := faultStore(t, map[string]int{"a": 3 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	ex := f.Extents()[0]
	fr.At(1, storeiotest.Fault{Short: 10})
	_, err := f.ReadAt(make([]byte, 100), 0)
	var ce *CorruptError
	if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
		t.Fatalf("short read: %v; want a CorruptError", err)
	}
	if ce.Chunk != f.M.Chunks[0].ID || ce.Pack != ex.Pack || ce.PackOff != ex.PackOff || !strings.Contains(ce.Reason, "holds 10 of") {
		t.Fatalf("short read: %+v; want chunk %s, pack %016x at %d", ce, f.M.Chunks[0].ID.Short(), ex.Pack, ex.PackOff)
	}
	if p := WithPath(err, "/m/a"); !strings.Contains(p.Error(), "/m/a") || !errors.Is(p, ErrCorrupt) {
		t.Fatalf("WithPath: %v", p)
	}
}

// TestEIOAtNthRead: the second chunk's read fails; the error names it and
// the first chunk (read fine in the same batch) is still served.
func TestEIOAtNthRead(t *testing.T) {
	s, fr, _, want := faultStore(t, map[string]int{"a": 5 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	if len(f.M.Chunks) < 2 {
		t.Fatalf("want several chunks, got %d", len(f.M.Chunks))
	}
	fr.At(2, storeiotest.EIO)
	end := int(f.M.Chunks[0].Len) + 10
	_, err := f.ReadAt(make([]byte, end), 0)
	var re *ReadError
	if !errors.Is(err, syscall.EIO) || !errors.As(err, &re) || re.Chunk != f.M.Chunks[1].ID {
		t.Fatalf("EIO at the 2nd read: %v; want a ReadError naming chunk %s", err, f.M.Chunks[1].ID.Short())
	}
	p := make([]byte, 100)
	if _, err := f.ReadAt(p, 0); err != nil || !bytes.Equal(p, want["a"][:100]) {
		t.Fatalf("the first chunk: %v", err)
	}
}

type mapFetcher struct {
	m     map[ID][]byte
	calls atomic.Int64
}

func (f *mapFetcher) Fetch(ctx context.Context, id ID, n uint32) ([]byte, error) {
	f.calls.Add(1)
	if b, ok := f.m[id]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("fake: %w", ErrNotLocal)
}

// TestFetcherFillsMissingVerified: missing chunks go to the Fetcher, and
// what it returns is verified before use.
func TestFetcherFillsMissingVerified(t *testing.T) {
	fe := &mapFetcher{m: map[ID][]byte{}}
	s, _, _, want := faultStore(t, map[string]int{"a": 3 << 20}, Options{Fetcher: fe})
	f := mustOpen(t, s, "m/a")
	c0 := f.M.Chunks[0]
	fe.m[c0.ID] = want["a"][:c0.Len]
	if err := os.Remove(f.Extents()[0].PackPath); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 100)
	if _, err := f.ReadAt(p, 0); err != nil || !bytes.Equal(p, want["a"][:100]) {
		t.Fatalf("read of a fetched chunk: %v", err)
	}
	c1 := f.M.Chunks[1]
	bad := bytes.Clone(want["a"][c0.Len : c0.Len+c1.Len])
	bad[5] ^= 1
	fe.m[c1.ID] = bad
	var ce *CorruptError
	if _, err := f.ReadAt(p, int64(c0.Len)); !errors.As(err, &ce) || ce.Chunk != c1.ID || ce.Pack != 0 {
		t.Fatalf("a fetched chunk with wrong bytes: %v; want a CorruptError naming it", err)
	}
}

// verifiedMapFetcher is a mapFetcher that claims to verify what it returns.
type verifiedMapFetcher struct{ mapFetcher }

func (*verifiedMapFetcher) FetchVerifies() {}

// TestVerifiedFetcherNotHashedAgain: the store takes the word of a
// VerifiedFetcher for the hash (a fetcher that lies would get wrong bytes
// through: peers.Node hashes every chunk as it arrives), but still checks
// the length.
func TestVerifiedFetcherNotHashedAgain(t *testing.T) {
	fe := &verifiedMapFetcher{mapFetcher{m: map[ID][]byte{}}}
	s, _, _, want := faultStore(t, map[string]int{"a": 3 << 20}, Options{Fetcher: fe})
	f := mustOpen(t, s, "m/a")
	c0, c1 := f.M.Chunks[0], f.M.Chunks[1]
	if err := os.Remove(f.Extents()[0].PackPath); err != nil {
		t.Fatal(err)
	}
	marked := bytes.Clone(want["a"][:c0.Len])
	marked[0] ^= 1 // not the chunk's bytes: shows the store did not hash them
	fe.m[c0.ID] = marked
	p := make([]byte, 100)
	if _, err := f.ReadAt(p, 0); err != nil || p[0] != marked[0] {
		t.Fatalf("read through a VerifiedFetcher: %v (first byte %x, the fetcher's %x): the store hashed again", err, p[0], marked[0])
	}
	fe.m[c1.ID] = want["a"][c0.Len : c0.Len+c1.Len-1] // one byte short
	var ce *CorruptError
	if _, err := f.ReadAt(p, int64(c0.Len)); !errors.As(err, &ce) || ce.Chunk != c1.ID {
		t.Fatalf("a short chunk from a VerifiedFetcher: %v; want a CorruptError naming it", err)
	}
}

// TestReadSlice: a range inside one chunk comes back without a copy (the
// cached chunk's bytes), a range across chunks is refused (ok false) so the
// caller copies, and the end of the file clips the slice.
func TestReadSlice(t *testing.T) {
	s, _, _, want := faultStore(t, map[string]int{"a": 5 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	a := want["a"]
	if len(f.M.Chunks) < 2 {
		t.Fatalf("a has %d chunks, the test needs two or more", len(f.M.Chunks))
	}
	ctx := context.Background()
	c0 := f.offs[1] // the first chunk's size
	check := func(off int64, n int, wantOK bool, wantLen int) []byte {
		t.Helper()
		b, ok, err := f.ReadSlice(ctx, off, n)
		if err != nil || ok != wantOK || len(b) != wantLen {
			t.Fatalf("ReadSlice(%d, %d) = %d bytes, ok %v, %v; want %d bytes, ok %v", off, n, len(b), ok, err, wantLen, wantOK)
		}
		if len(b) > 0 && !bytes.Equal(b, a[off:off+int64(len(b))]) {
			t.Fatalf("ReadSlice(%d, %d): wrong bytes", off, n)
		}
		if cap(b) != len(b) {
			t.Fatalf("ReadSlice(%d, %d): cap %d > len %d: an append would write into the cached chunk", off, n, cap(b), len(b))
		}
		return b
	}
	b1 := check(10, 4096, true, 4096)
	b2 := check(20, 4096, true, 4096)
	if &b1[10] != &b2[0] {
		t.Fatal("two slices of one chunk do not share the cached bytes (a copy was made)")
	}
	check(c0-100, 100, true, 100) // ends at the chunk's end
	check(c0-100, 200, false, 0)  // across the boundary: the caller copies
	size := int64(len(a))
	check(size-50, 4096, true, 50) // clipped at EOF
	check(size, 10, true, 0)       // at EOF
	check(size+10, 10, true, 0)    // beyond
	if _, _, err := f.ReadSlice(ctx, -1, 10); err == nil {
		t.Fatal("negative offset accepted")
	}
}
