package main

import (
	"runtime"
	"sync"
	"testing"
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
