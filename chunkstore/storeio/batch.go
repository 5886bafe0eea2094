package storeio

import (
	"context"
	"sync/atomic"
)

// batch tracks the requests of one Read call that were handed to workers or
// to the kernel. The submitting goroutine holds one reference of its own until
// it has submitted everything, so done closes only after submission ended and
// every submitted request finished.
type batch struct {
	ctx     context.Context
	pending atomic.Int64
	done    chan struct{}
}

func newBatch(ctx context.Context) *batch {
	b := &batch{ctx: ctx, done: make(chan struct{})}
	b.pending.Store(1)
	return b
}

func (b *batch) add() { b.pending.Add(1) }

func (b *batch) finish() {
	if b.pending.Add(-1) == 0 {
		close(b.done)
	}
}

// wait drops the submitter's reference and waits for every submitted request.
func (b *batch) wait() {
	b.finish()
	<-b.done
}
