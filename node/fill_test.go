package node

import (
	"runtime"
	"sync"
	"testing"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/gpuio"
)

// TestFairSchedRoundRobin: with one slot, a client that queued many slices
// first and a client that comes later alternate: the late one waits for at
// most one slice of the early one, not for all of them.
func TestFairSchedRoundRobin(t *testing.T) {
	s := newFairSched(1)
	s.acquire(0) // the slot is busy while both queue
	var mu sync.Mutex
	var order []uint64
	var wg sync.WaitGroup
	queue := func(client uint64, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.acquire(client)
				mu.Lock()
				order = append(order, client)
				mu.Unlock()
				s.release()
			}()
		}
	}
	waiting := func(n int) func() bool {
		return func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			w := 0
			for _, q := range s.queues {
				w += len(q)
			}
			return w == n
		}
	}
	queue(1, 6)
	waitCond(t, waiting(6))
	queue(2, 3)
	waitCond(t, waiting(9))
	s.release()
	wg.Wait()
	want := []uint64{1, 2, 1, 2, 1, 2, 1, 1, 1}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("slots went %v, want %v", order, want)
		}
	}
	if s.free != 1 {
		t.Errorf("free slots %d after all released, want 1", s.free)
	}
}

func waitCond(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 1e7 {
			t.Fatal("condition never held")
		}
		runtime.Gosched()
	}
}

func TestMergeIO(t *testing.T) {
	for _, c := range [][3]string{
		{"page cache", "page cache", "page cache"},
		{"page cache", "O_DIRECT", "page cache + O_DIRECT"},
		{"page cache + O_DIRECT", "O_DIRECT", "page cache + O_DIRECT"},
	} {
		if got := mergeIO(c[0], c[1]); got != c[2] {
			t.Errorf("mergeIO(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}

// TestFillBatches: a FILL's ranges become batches of at most max bytes,
// small ranges packed together and large ones cut, every byte once, in order.
func TestFillBatches(t *testing.T) {
	ranges := []clientproto.Range{
		{FileOffset: 0, Length: 10, DstOffset: 1000},
		{FileOffset: 10, Length: 3, DstOffset: 1016},
		{FileOffset: 100, Length: 25, DstOffset: 0},
		{FileOffset: 5, Length: 0, DstOffset: 7},
		{FileOffset: 200, Length: 4, DstOffset: 500},
		{FileOffset: 300, Length: 3, DstOffset: 600, Rows: 5, Pitch: 10}, // strided: 15 bytes
		{FileOffset: 400, Length: 9, DstOffset: 700, Rows: 2, Pitch: 9},  // rows longer than a batch
	}
	bs := fillBatches(ranges, 8)
	var flat []gpuio.Range
	for i, b := range bs {
		var n int64
		for _, r := range b {
			n += r.Bytes()
			flat = append(flat, r)
		}
		// Full batches, except before a strided row that does not fit,
		// and a lone row longer than a batch.
		if (n > 8 && len(b) > 1) || n == 0 {
			t.Fatalf("batch %d holds %d bytes: %+v", i, n, b)
		}
	}
	// Every byte of every range maps to the same destination as before.
	want := map[int64]int64{}
	for _, r := range ranges {
		for row := uint64(0); row < max(1, r.Rows); row++ {
			for k := uint64(0); k < r.Length; k++ {
				want[int64(r.FileOffset+row*r.Pitch+k)] = int64(r.DstOffset + row*r.Length + k)
			}
		}
	}
	got := map[int64]int64{}
	for _, r := range flat {
		for row := int64(0); row < max(1, r.Rows); row++ {
			for k := int64(0); k < r.N; k++ {
				fo := r.Off + row*r.Pitch + k
				if _, dup := got[fo]; dup {
					t.Fatalf("file byte %d placed twice", fo)
				}
				got[fo] = r.DstOff + row*r.N + k
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d bytes placed, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("file byte %d goes to %d, want %d", k, got[k], v)
		}
	}
	if len(bs) < 8 { // 75 bytes in batches of 8 or one row
		t.Fatalf("%d batches: %+v", len(bs), bs)
	}
}
