// Package storeiotest has storeio.Reader wrappers for tests: one that counts
// the reads that reach storage and injects faults at chosen reads (EIO at the
// Nth read, a short read), in the spirit of pebble's errorfs, so tests of
// the chunk store assert the exact outcome of a fault instead of hoping a
// random one happens.
package storeiotest

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// Fault is what happens to one read (one Request).
type Fault struct {
	// Err, when set, is the read's error (e.g. syscall.EIO); no bytes are read.
	Err error
	// Short, when Err is nil, makes the read return only this many bytes
	// (as if the file ended there).
	Short int
}

// EIO is a Fault failing the read with EIO.
var EIO = Fault{Err: syscall.EIO}

// Reader wraps a storeio.Reader: it counts the requests it runs and applies
// the faults set with At and Always. Safe for concurrent use.
type Reader struct {
	storeio.Reader
	n      atomic.Int64
	mu     sync.Mutex
	at     map[int64]Fault // 1-based request number -> fault
	always *Fault
	// Before, when set, runs before every batch (tests use it to hold a
	// read in flight while other readers pile up or GC runs).
	Before func(reqs []*storeio.Request)
}

// Wrap returns a Reader around r.
func Wrap(r storeio.Reader) *Reader { return &Reader{Reader: r, at: map[int64]Fault{}} }

// At makes the nth request from now on (1 = the next one) fail with f.
func (r *Reader) At(nth int, f Fault) {
	r.mu.Lock()
	r.at[r.n.Load()+int64(nth)] = f
	r.mu.Unlock()
}

// Always applies f to every request until Clear.
func (r *Reader) Always(f Fault) {
	r.mu.Lock()
	r.always = &f
	r.mu.Unlock()
}

// Clear removes every fault.
func (r *Reader) Clear() {
	r.mu.Lock()
	r.at, r.always = map[int64]Fault{}, nil
	r.mu.Unlock()
}

// Reads is the number of requests run so far.
func (r *Reader) Reads() int64 { return r.n.Load() }

// Read runs reqs through the wrapped reader, then applies the faults.
func (r *Reader) Read(ctx context.Context, reqs []*storeio.Request) error {
	if r.Before != nil {
		r.Before(reqs)
	}
	faults := make([]*Fault, len(reqs))
	r.mu.Lock()
	for i := range reqs {
		k := r.n.Add(1)
		if f, ok := r.at[k]; ok {
			faults[i] = &f
			delete(r.at, k)
		} else if r.always != nil {
			f := *r.always
			faults[i] = &f
		}
	}
	r.mu.Unlock()
	err := r.Reader.Read(ctx, reqs)
	var first error
	for i, rq := range reqs {
		if f := faults[i]; f != nil {
			switch {
			case f.Err != nil:
				clear(rq.Buf)
				rq.N, rq.Err = 0, f.Err
			case f.Short < rq.N:
				clear(rq.Buf[f.Short:])
				rq.N = f.Short
			}
		}
		if first == nil && rq.Err != nil {
			first = rq.Err
		}
	}
	if first == nil {
		first = err
	}
	return first
}
