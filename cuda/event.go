package cuda

import (
	"fmt"
	"sync"
	"time"
)

// EventFlags are cuEventCreate flags.
type EventFlags uint32

const (
	EventDefault       EventFlags = eventDefault       // CU_EVENT_DEFAULT: timing on, spin/yield on synchronize
	EventBlockingSync  EventFlags = eventBlockingSync  // CU_EVENT_BLOCKING_SYNC: Synchronize sleeps instead of spinning
	EventDisableTiming EventFlags = eventDisableTiming // CU_EVENT_DISABLE_TIMING: cheaper; ElapsedTime fails
)

// Event is a CUDA event, for timing and for ordering against a stream.
// (Transfers use their own pooled events; this type is for callers.)
type Event struct {
	ctx *Context
	h   uintptr

	mu        sync.Mutex
	destroyed bool
}

// NewEvent creates an event (cuEventCreate).
func (c *Context) NewEvent(flags EventFlags) (*Event, error) {
	if err := c.addLive("new event"); err != nil {
		return nil, err
	}
	var h uintptr
	if err := c.do("cuEventCreate", func() cuResult { return c.d.cuEventCreate(&h, uint32(flags)) }); err != nil {
		c.dropLive()
		return nil, err
	}
	return &Event{ctx: c, h: h}, nil
}

func (e *Event) check(op string) error {
	if e == nil || e.ctx == nil {
		return invalid(op)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.destroyed {
		return fmt.Errorf("CUDA: %s: event: %w", op, ErrFreed)
	}
	return nil
}

// Record captures the work queued on s so far (cuEventRecord).
func (e *Event) Record(s *Stream) error {
	if err := e.check("record event"); err != nil {
		return err
	}
	if s == nil {
		return invalid("record event")
	}
	return e.ctx.do("cuEventRecord", func() cuResult { return e.ctx.d.cuEventRecord(e.h, s.h) })
}

// Query reports whether the recorded work is done (cuEventQuery), without
// blocking.
func (e *Event) Query() (bool, error) {
	if err := e.check("query event"); err != nil {
		return false, err
	}
	var r cuResult
	e.ctx.do("cuEventQuery", func() cuResult { r = e.ctx.d.cuEventQuery(e.h); return cudaSuccess })
	switch r {
	case cudaSuccess:
		return true, nil
	case cudaErrorNotReady:
		return false, nil
	}
	return false, e.ctx.d.err("cuEventQuery", r)
}

// Synchronize blocks the calling thread until the recorded work is done
// (cuEventSynchronize).
func (e *Event) Synchronize() error {
	if err := e.check("synchronize event"); err != nil {
		return err
	}
	return e.ctx.do("cuEventSynchronize", func() cuResult { return e.ctx.d.cuEventSynchronize(e.h) })
}

// Destroy releases the event (cuEventDestroy).
func (e *Event) Destroy() error {
	if err := e.check("destroy event"); err != nil {
		return err
	}
	e.mu.Lock()
	if e.destroyed {
		e.mu.Unlock()
		return fmt.Errorf("CUDA: destroy event: %w", ErrFreed)
	}
	e.destroyed = true
	e.mu.Unlock()
	defer e.ctx.dropLive()
	return e.ctx.do("cuEventDestroy_v2", func() cuResult { return e.ctx.d.cuEventDestroy(e.h) })
}

// ElapsedTime returns the GPU time between two completed events recorded
// with timing enabled (cuEventElapsedTime; resolution about 0.5µs).
func ElapsedTime(start, end *Event) (time.Duration, error) {
	if err := start.check("elapsed time"); err != nil {
		return 0, err
	}
	if err := end.check("elapsed time"); err != nil {
		return 0, err
	}
	var ms float32
	err := start.ctx.do("cuEventElapsedTime", func() cuResult { return start.ctx.d.cuEventElapsedTime(&ms, start.h, end.h) })
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
