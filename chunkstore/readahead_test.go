package chunkstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// orderFetcher serves chunks from a map and records the order they were
// asked for.
type orderFetcher struct {
	m     map[ID][]byte
	mu    sync.Mutex
	order []ID
}

func (f *orderFetcher) Fetch(ctx context.Context, id ID, n uint32) ([]byte, error) {
	f.mu.Lock()
	f.order = append(f.order, id)
	f.mu.Unlock()
	if b, ok := f.m[id]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("fake: %w", ErrNotLocal)
}

func (f *orderFetcher) asked() []ID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ID(nil), f.order...)
}

// remoteFile imports a file of size bytes, hands its chunks to a fetcher
// and drops them from the store: every chunk of the file is then missing
// here, as on a cluster member that holds none of it.
func remoteFile(t *testing.T, size int, opts Options) (*Store, *File, *orderFetcher, []byte) {
	t.Helper()
	fe := &orderFetcher{m: map[ID][]byte{}}
	opts.Fetcher = fe
	s, _, _, want := faultStore(t, map[string]int{"a": size}, opts)
	f := mustOpen(t, s, "m/a")
	var ids []ID
	for i, c := range f.M.Chunks {
		fe.m[c.ID] = want["a"][f.offs[i]:f.offs[i+1]]
		ids = append(ids, c.ID)
	}
	_, _, err := s.DropChunks(context.Background(), ids)
	require.NoError(t, err)
	f = mustOpen(t, s, "m/a")
	for _, l := range f.locs {
		require.Zero(t, l.Pack, "a chunk is still stored here")
	}
	return s, f, fe, want["a"]
}

// settle waits until f's read-ahead has nothing in flight.
func settle(t *testing.T, f *File) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.ra.mu.Lock()
		n := f.ra.inflight
		f.ra.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("read-ahead still in flight after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func indexOf(f *File, id ID) int {
	for i, c := range f.M.Chunks {
		if c.ID == id {
			return i
		}
	}
	return -1
}

// TestReadAheadWindow: a sequential reader of a file held elsewhere gets
// the next chunks fetched ahead of it, a window of them and no more while
// it stops; a jump starts no read-ahead until reads follow on from there;
// read to the end, the file is byte-equal and each chunk was fetched once.
func TestReadAheadWindow(t *testing.T) {
	s, f, fe, want := remoteFile(t, 40<<20, Options{ReadAheadChunks: 6})
	n := len(f.M.Chunks)
	require.Greater(t, n, 20, "want more chunks")

	p := make([]byte, 64<<10)
	_, err := f.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, want[:len(p)], p)
	settle(t, f)
	// Chunk 0 (the read's own), then the window: chunks 1 to 6.
	got := map[int]bool{}
	for _, id := range fe.asked() {
		got[indexOf(f, id)] = true
	}
	require.Equal(t, map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true, 6: true}, got)
	require.EqualValues(t, 6, s.Counters().ReadAheadChunks)

	// The reader stops: nothing more is fetched.
	require.Len(t, fe.asked(), 7)

	// A jump to chunk 15: only that chunk is fetched.
	_, err = f.ReadAt(p, f.offs[15])
	require.NoError(t, err)
	settle(t, f)
	require.Len(t, fe.asked(), 8)
	require.Equal(t, 15, indexOf(f, fe.asked()[7]))

	// Reads follow on from there: the window moves with them.
	_, err = f.ReadAt(p, f.offs[15]+int64(len(p)))
	require.NoError(t, err)
	settle(t, f)
	asked := fe.asked()
	require.Len(t, asked, 14)
	for k, id := range asked[8:] {
		require.Less(t, indexOf(f, id), 22, "fetch %d: beyond the window", k)
		require.Greater(t, indexOf(f, id), 15)
	}

	// The whole file, in 1 MiB reads: byte-equal, each chunk fetched once.
	buf := make([]byte, f.M.Size)
	for off := int64(0); off < f.M.Size; off += 1 << 20 {
		_, err := f.ReadAt(buf[off:min(off+1<<20, f.M.Size)], off)
		require.NoError(t, err)
	}
	settle(t, f)
	require.True(t, bytes.Equal(buf, want))
	seen := map[ID]int{}
	for _, id := range fe.asked() {
		seen[id]++
	}
	for id, k := range seen {
		require.Equal(t, 1, k, "chunk %s fetched %d times", id.Short(), k)
	}
	require.Len(t, seen, n)
	require.Greater(t, s.Counters().ReadAheadChunks, int64(n/2))
}

// TestReadAheadOff: with ReadAheadChunks negative a reader fetches only
// the chunks it reads.
func TestReadAheadOff(t *testing.T) {
	s, f, fe, want := remoteFile(t, 8<<20, Options{ReadAheadChunks: -1})
	p := make([]byte, 64<<10)
	_, err := f.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, want[:len(p)], p)
	require.Len(t, fe.asked(), 1)
	require.Zero(t, s.Counters().ReadAheadChunks)
}

// TestReadAheadBoundedByCache: the window holds at most a quarter of the
// chunk cache, whatever its length in chunks.
func TestReadAheadBoundedByCache(t *testing.T) {
	s, f, fe, _ := remoteFile(t, 40<<20, Options{ReadAheadChunks: 64})
	// faultStore's cache is 64 MiB: at most 16 MiB ahead.
	p := make([]byte, 64<<10)
	_, err := f.ReadAt(p, 0)
	require.NoError(t, err)
	settle(t, f)
	var ahead int64
	for _, id := range fe.asked() {
		i := indexOf(f, id)
		if i == 0 {
			continue // the read's own chunk
		}
		ahead += f.offs[i+1] - f.offs[i]
	}
	require.LessOrEqual(t, ahead, int64(16<<20))
	require.Greater(t, ahead, int64(8<<20))
	require.Equal(t, ahead, s.Counters().ReadAheadBytes)
}

// TestReadAheadManyReaders: eight files read at once, each sequentially,
// with more windows than the chunk cache holds if each took a full one:
// their windows share a quarter of the cache, so no chunk fetched ahead is
// evicted before its reader gets to it and fetched again (with a full
// window each, this fetched 1.54 times the chunks).
func TestReadAheadManyReaders(t *testing.T) {
	if testing.Short() {
		// How many chunks are fetched again depends on how the readers'
		// starts interleave, which the race detector's slowdown (make
		// test-race runs -short) can stretch past the tolerance.
		t.Skip("timing-dependent figure: runs in the normal tests, not with -short")
	}
	const nfiles, size = 8, 24 << 20
	fe := &orderFetcher{m: map[ID][]byte{}}
	sizes := map[string]int{}
	for i := range nfiles {
		sizes[fmt.Sprintf("f%d", i)] = size
	}
	s, _, _, want := faultStore(t, sizes, Options{Fetcher: fe}) // a 64 MiB chunk cache
	var ids []ID
	for name := range sizes {
		f := mustOpen(t, s, "m/"+name)
		for j, c := range f.M.Chunks {
			fe.m[c.ID] = want[name][f.offs[j]:f.offs[j+1]]
			ids = append(ids, c.ID)
		}
	}
	_, _, err := s.DropChunks(context.Background(), ids)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, nfiles)
	for name := range sizes {
		f := mustOpen(t, s, "m/"+name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 1<<20)
			for off := int64(0); off < f.M.Size; off += int64(len(p)) {
				n, err := f.ReadAt(p, off)
				if err != nil && n < len(p) && off+int64(n) < f.M.Size {
					errs <- fmt.Errorf("%s at %d: %w", name, off, err)
					return
				}
				if !bytes.Equal(p[:n], want[name][off:off+int64(n)]) {
					errs <- fmt.Errorf("%s at %d: wrong bytes", name, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	asked := len(fe.asked())
	require.Positive(t, s.ctr.readAheadChunks.Load(), "nothing was read ahead")
	// A reader's window is sized by the files read in the last 2 s when it
	// starts, so readers that start together may each take more than
	// their share before the others are counted: a few chunks are then
	// evicted and fetched again (1.00x on an idle machine, 1.07x to 1.11x
	// seen on a loaded one, CI included). The test allows 1.25x: it is
	// there to catch the thrash of unshared windows (1.54x).
	require.LessOrEqual(t, asked, len(ids)*125/100, "%d chunks fetched %d times: chunks read ahead were evicted and fetched again", len(ids), asked)
}
