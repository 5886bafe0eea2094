// Package pace spaces work measured in bytes so that it averages at most a
// given rate: the store's scrub, the recheck of pinned memory and the pulls
// of a cluster member's rebalance all read at a set number of bytes a
// second, so as to leave the disk and the cores to the readers.
package pace

import (
	"context"
	"sync"
	"time"
)

// Pacer spaces calls to Wait so that the bytes they name average at most
// its rate. A call is never split: the first one goes at once, and the
// time its bytes take at the rate is waited out by the next. Time in
// which nobody called is not saved up (no burst after a pause). Safe for
// concurrent use; a nil *Pacer, or one of rate 0, never waits.
type Pacer struct {
	rate int64
	now  func() time.Time
	// sleep waits d or until ctx ends (a fake clock in tests).
	sleep func(ctx context.Context, d time.Duration) error

	mu   sync.Mutex
	next time.Time // when the next call may go
}

// New returns a pacer of rate bytes a second (0 or less: no limit).
func New(rate int64) *Pacer {
	return &Pacer{rate: rate, now: time.Now, sleep: sleep}
}

// Rate is the pacer's rate in bytes a second (0: no limit).
func (p *Pacer) Rate() int64 {
	if p == nil || p.rate <= 0 {
		return 0
	}
	return p.rate
}

// Wait accounts n bytes and returns once the bytes before them have had
// their time at the rate, or with ctx's error when ctx ends first. Without
// a limit it returns at once, with ctx's error if ctx has ended.
func (p *Pacer) Wait(ctx context.Context, n int64) error {
	if p.Rate() == 0 {
		return ctx.Err()
	}
	p.mu.Lock()
	now := p.now()
	if p.next.Before(now) {
		p.next = now
	}
	d := p.next.Sub(now)
	p.next = p.next.Add(time.Duration(float64(n) / float64(p.rate) * float64(time.Second)))
	p.mu.Unlock()
	if d <= 0 {
		return ctx.Err()
	}
	return p.sleep(ctx, d)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
