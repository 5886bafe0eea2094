package pace

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeClock is a clock whose sleeps only move its time forward.
type fakeClock struct {
	t      time.Time
	slept  []time.Duration
	cancel context.CancelFunc // called by a sleep, when set
}

func (c *fakeClock) pacer(rate int64) *Pacer {
	p := New(rate)
	p.now = func() time.Time { return c.t }
	p.sleep = func(ctx context.Context, d time.Duration) error {
		c.slept = append(c.slept, d)
		if c.cancel != nil {
			c.cancel()
			return ctx.Err()
		}
		c.t = c.t.Add(d)
		return nil
	}
	return p
}

func TestWaitSpacesCalls(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	p := c.pacer(100) // 100 bytes a second
	ctx := context.Background()
	for _, n := range []int64{50, 100, 25, 25} {
		if err := p.Wait(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// The first call goes at once; each next one waits out the one before.
	want := []time.Duration{500 * time.Millisecond, time.Second, 250 * time.Millisecond}
	if len(c.slept) != len(want) {
		t.Fatalf("slept %v, want %v", c.slept, want)
	}
	for i := range want {
		if c.slept[i] != want[i] {
			t.Fatalf("slept %v, want %v", c.slept, want)
		}
	}
}

func TestIdleTimeIsNotSaved(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	p := c.pacer(1000)
	ctx := context.Background()
	p.Wait(ctx, 1000) // due: +1s
	c.t = c.t.Add(time.Hour)
	p.Wait(ctx, 1000) // an hour later: at once
	p.Wait(ctx, 1000) // waits the 1s of the one before, not less
	if len(c.slept) != 1 || c.slept[0] != time.Second {
		t.Fatalf("slept %v, want [1s]", c.slept)
	}
}

func TestNoLimit(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	for _, p := range []*Pacer{c.pacer(0), c.pacer(-5), nil} {
		for range 3 {
			if err := p.Wait(context.Background(), 1<<30); err != nil {
				t.Fatal(err)
			}
		}
		if p.Rate() != 0 {
			t.Fatalf("rate %d, want 0", p.Rate())
		}
	}
	if len(c.slept) != 0 {
		t.Fatalf("slept %v without a limit", c.slept)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.pacer(0).Wait(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context without a limit: %v", err)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	p := c.pacer(10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := p.Wait(ctx, 10); err != nil {
		t.Fatal(err)
	}
	c.cancel = cancel
	if err := p.Wait(ctx, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled while waiting: %v", err)
	}
}

// TestRealSleep: the real sleep waits, and ends early with its context.
func TestRealSleep(t *testing.T) {
	t0 := time.Now()
	if err := sleep(context.Background(), 20*time.Millisecond); err != nil || time.Since(t0) < 20*time.Millisecond {
		t.Fatalf("sleep: %v after %v", err, time.Since(t0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("sleep with an ended context: %v", err)
	}
}
