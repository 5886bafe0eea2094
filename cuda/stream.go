package cuda

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

const (
	streamNonBlocking = 0x1 // CU_STREAM_NON_BLOCKING

	eventDefault       = 0x0 // CU_EVENT_DEFAULT
	eventBlockingSync  = 0x1 // CU_EVENT_BLOCKING_SYNC
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING
)

// WaitPolicy is how a stream's poller learns that transfers completed.
// Every stream with transfers in flight has exactly one poller goroutine; it
// waits for the oldest transfer's event (events on one stream complete in
// order), completes it, and moves to the next; it exits when nothing is in
// flight. No goroutine or thread is held per transfer.
type WaitPolicy int

const (
	// WaitBlockingSync: transfer events are created with
	// CU_EVENT_BLOCKING_SYNC and the poller blocks in cuEventSynchronize.
	// The poller's thread sleeps in the driver until the GPU signals; no
	// CPU is spent while waiting. One OS thread per busy stream.
	WaitBlockingSync WaitPolicy = iota

	// WaitSpin: default events; the poller calls cuEventSynchronize, which
	// spins or yields according to the context's scheduling flags (the
	// primary context's default, CU_CTX_SCHED_AUTO, spins when there are
	// fewer active contexts than cores). Lowest latency, one busy core per
	// busy stream.
	WaitSpin

	// WaitPoll: the poller calls cuEventQuery and sleeps with exponential
	// backoff (from 20µs to 1ms) while the event is not ready. It never
	// blocks a thread in the driver, but Go's timer granularity makes its
	// completion latency the worst of the three.
	WaitPoll
)

func (p WaitPolicy) String() string {
	switch p {
	case WaitBlockingSync:
		return "blocking-sync"
	case WaitSpin:
		return "spin"
	case WaitPoll:
		return "poll"
	}
	return fmt.Sprintf("WaitPolicy(%d)", int(p))
}

// StreamOptions configures NewStreamWith. The zero value is the default.
type StreamOptions struct {
	Wait WaitPolicy
}

// Stream is a CUDA stream created with CU_STREAM_NON_BLOCKING (it does not
// synchronise with the legacy default stream, so PyTorch's work on that
// stream does not stall our copies, and vice versa). Copies on one stream
// run in issue order; use several streams for concurrency. Methods are safe
// for concurrent use by many goroutines.
type Stream struct {
	ctx    *Context
	h      uintptr
	policy WaitPolicy

	mu      sync.Mutex
	pending []*Transfer // in issue (= completion) order
	polling bool        // a poller goroutine is running
	events  []uintptr   // free completion events
	closed  bool
}

// NewStream creates a non-blocking stream with the default wait policy.
func (c *Context) NewStream() (*Stream, error) { return c.NewStreamWith(StreamOptions{}) }

// NewStreamWith creates a non-blocking stream (cuStreamCreate).
func (c *Context) NewStreamWith(o StreamOptions) (*Stream, error) {
	if err := c.addLive("new stream"); err != nil {
		return nil, err
	}
	var h uintptr
	if err := c.do("cuStreamCreate", func() cuResult { return c.d.cuStreamCreate(&h, streamNonBlocking) }); err != nil {
		c.dropLive()
		return nil, err
	}
	return &Stream{ctx: c, h: h, policy: o.Wait}, nil
}

// Handle returns the CUstream.
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return s.h
}

// Context returns the stream's context.
func (s *Stream) Context() *Context {
	if s == nil {
		return nil
	}
	return s.ctx
}

// Policy returns the stream's wait policy.
func (s *Stream) Policy() WaitPolicy {
	if s == nil {
		return 0
	}
	return s.policy
}

// InFlight returns the number of transfers issued and not yet completed.
func (s *Stream) InFlight() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Transfer is an asynchronous operation in flight on a stream. It holds the
// buffers it uses (their Free returns ErrBusy) until the GPU has finished
// with them; then Done is closed and the buffers are released.
type Transfer struct {
	n     int
	ev    uintptr
	holds []*useCount
	done  chan struct{}
	err   error
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done is closed once the transfer completed (or failed) and its buffers
// were released.
func (t *Transfer) Done() <-chan struct{} {
	if t == nil {
		return closedChan
	}
	return t.done
}

// Wait blocks until the transfer completes or ctx ends. It returns the
// transfer's error, or ctx.Err(); a transfer abandoned this way stays in
// flight and keeps its buffers until the GPU is done.
func (t *Transfer) Wait(ctx context.Context) error {
	if t == nil {
		return invalid("wait")
	}
	select {
	case <-t.done:
		return t.err
	default:
	}
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err returns the transfer's error once Done is closed (nil before).
func (t *Transfer) Err() error {
	if t == nil {
		return invalid("transfer")
	}
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Len returns the number of bytes the transfer moves.
func (t *Transfer) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

func (t *Transfer) finish(err error) {
	releaseAll(t.holds)
	t.holds = nil
	t.err = err
	close(t.done)
}

func doneTransfer() *Transfer {
	return &Transfer{done: closedChan}
}

// CopyHtoD copies n bytes from pinned host memory to device memory,
// asynchronously on s (cuMemcpyHtoDAsync).
func (s *Stream) CopyHtoD(dst *DeviceMem, dstOff int, src *HostMem, srcOff int, n int) (*Transfer, error) {
	if s == nil || dst == nil || src == nil {
		return nil, invalid("copy host to device")
	}
	if err := checkRange("copy host to device (dst)", dst.size, dstOff, n); err != nil {
		return nil, err
	}
	if err := checkRange("copy host to device (src)", src.size, srcOff, n); err != nil {
		return nil, err
	}
	d := s.ctx.d
	return s.issue("cuMemcpyHtoDAsync_v2", n, []string{"destination", "source"}, []*useCount{&dst.use, &src.use}, func() cuResult {
		return d.cuMemcpyHtoDAsync(dst.ptr+uintptr(dstOff), unsafe.Add(src.p, srcOff), uintptr(n), s.h)
	})
}

// CopyDtoH copies n bytes from device memory to pinned host memory,
// asynchronously on s (cuMemcpyDtoHAsync).
func (s *Stream) CopyDtoH(dst *HostMem, dstOff int, src *DeviceMem, srcOff int, n int) (*Transfer, error) {
	if s == nil || dst == nil || src == nil {
		return nil, invalid("copy device to host")
	}
	if err := checkRange("copy device to host (dst)", dst.size, dstOff, n); err != nil {
		return nil, err
	}
	if err := checkRange("copy device to host (src)", src.size, srcOff, n); err != nil {
		return nil, err
	}
	d := s.ctx.d
	return s.issue("cuMemcpyDtoHAsync_v2", n, []string{"destination", "source"}, []*useCount{&dst.use, &src.use}, func() cuResult {
		return d.cuMemcpyDtoHAsync(unsafe.Add(dst.p, dstOff), src.ptr+uintptr(srcOff), uintptr(n), s.h)
	})
}

// CopyDtoD copies n bytes between device buffers, asynchronously on s
// (cuMemcpyDtoDAsync).
func (s *Stream) CopyDtoD(dst *DeviceMem, dstOff int, src *DeviceMem, srcOff int, n int) (*Transfer, error) {
	if s == nil || dst == nil || src == nil {
		return nil, invalid("copy device to device")
	}
	if err := checkRange("copy device to device (dst)", dst.size, dstOff, n); err != nil {
		return nil, err
	}
	if err := checkRange("copy device to device (src)", src.size, srcOff, n); err != nil {
		return nil, err
	}
	d := s.ctx.d
	return s.issue("cuMemcpyDtoDAsync_v2", n, []string{"destination", "source"}, []*useCount{&dst.use, &src.use}, func() cuResult {
		return d.cuMemcpyDtoDAsync(dst.ptr+uintptr(dstOff), src.ptr+uintptr(srcOff), uintptr(n), s.h)
	})
}

// MemsetD8 sets n bytes of dst at off to v, asynchronously on s
// (cuMemsetD8Async).
func (s *Stream) MemsetD8(dst *DeviceMem, off, n int, v byte) (*Transfer, error) {
	if s == nil || dst == nil {
		return nil, invalid("memset")
	}
	if err := checkRange("memset", dst.size, off, n); err != nil {
		return nil, err
	}
	d := s.ctx.d
	return s.issue("cuMemsetD8Async", n, []string{"destination"}, []*useCount{&dst.use}, func() cuResult {
		return d.cuMemsetD8Async(dst.ptr+uintptr(off), v, uintptr(n), s.h)
	})
}

// issue acquires the buffers, enqueues op and a completion event on the
// stream, and hands the transfer to the stream's poller.
func (s *Stream) issue(op string, n int, what []string, holds []*useCount, call func() cuResult) (*Transfer, error) {
	if s.ctx == nil {
		return nil, invalid(op)
	}
	if n == 0 {
		return doneTransfer(), nil
	}
	if err := acquireAll(what, holds); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		releaseAll(holds)
		return nil, fmt.Errorf("CUDA: %s: stream: %w", op, ErrClosed)
	}
	d := s.ctx.d
	if err := s.ctx.enter(); err != nil {
		releaseAll(holds)
		return nil, err
	}
	ev, err := s.eventLocked()
	if err != nil {
		s.ctx.leave()
		releaseAll(holds)
		return nil, err
	}
	if r := call(); r != cudaSuccess {
		s.ctx.leave()
		s.events = append(s.events, ev)
		releaseAll(holds)
		return nil, d.err(op, r)
	}
	if r := d.cuEventRecord(ev, s.h); r != cudaSuccess {
		// The copy is queued but cannot be tracked: wait for the stream
		// before letting go of the buffers.
		d.cuStreamSynchronize(s.h)
		s.ctx.leave()
		d.cuEventDestroy(ev)
		releaseAll(holds)
		return nil, d.err("cuEventRecord", r)
	}
	s.ctx.leave()
	t := &Transfer{n: n, ev: ev, holds: holds, done: make(chan struct{})}
	s.pending = append(s.pending, t)
	if !s.polling {
		s.polling = true
		s.ctx.pollers.Add(1)
		go s.poll()
	}
	return t, nil
}

// eventLocked returns a free completion event, creating one if needed. The
// context must be current.
func (s *Stream) eventLocked() (uintptr, error) {
	if n := len(s.events); n > 0 {
		ev := s.events[n-1]
		s.events = s.events[:n-1]
		return ev, nil
	}
	flags := uint32(eventDisableTiming)
	if s.policy == WaitBlockingSync {
		flags |= eventBlockingSync
	}
	var ev uintptr
	if err := s.ctx.d.err("cuEventCreate", s.ctx.d.cuEventCreate(&ev, flags)); err != nil {
		return 0, err
	}
	return ev, nil
}

// poll completes the stream's transfers in order, then exits.
func (s *Stream) poll() {
	// Event waits need no current context, but some drivers are stricter
	// than the documentation: keep the stream's context current for the
	// poller's lifetime, on its own locked thread.
	defer s.ctx.pollers.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := s.ctx.d
	if d.cuCtxPushCurrent(s.ctx.h) == cudaSuccess {
		defer func() {
			var old uintptr
			d.cuCtxPopCurrent(&old)
		}()
	}
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			s.polling = false
			s.mu.Unlock()
			return
		}
		t := s.pending[0]
		s.mu.Unlock()

		err := s.waitEvent(t.ev)

		s.mu.Lock()
		s.pending[0] = nil
		s.pending = s.pending[1:]
		if err == nil {
			s.events = append(s.events, t.ev)
		} else {
			d.cuEventDestroy(t.ev)
		}
		s.mu.Unlock()
		t.finish(err)
	}
}

func (s *Stream) waitEvent(ev uintptr) error {
	d := s.ctx.d
	if s.policy != WaitPoll {
		return d.err("cuEventSynchronize", d.cuEventSynchronize(ev))
	}
	delay := 20 * time.Microsecond
	for {
		r := d.cuEventQuery(ev)
		if r != cudaErrorNotReady {
			return d.err("cuEventQuery", r)
		}
		time.Sleep(delay)
		if delay < time.Millisecond {
			delay *= 2
		}
	}
}

// Wait blocks until every transfer issued on s before the call has
// completed, or ctx ends. It returns the last transfer's error.
func (s *Stream) Wait(ctx context.Context) error {
	if s == nil {
		return invalid("wait stream")
	}
	s.mu.Lock()
	var last *Transfer
	if n := len(s.pending); n > 0 {
		last = s.pending[n-1]
	}
	s.mu.Unlock()
	if last == nil {
		return nil
	}
	return last.Wait(ctx)
}

// Synchronize blocks the calling thread in cuStreamSynchronize until all
// work queued on s is done (transfers are still completed by the poller).
func (s *Stream) Synchronize() error {
	if s == nil || s.ctx == nil {
		return invalid("synchronize stream")
	}
	return s.ctx.do("cuStreamSynchronize", func() cuResult { return s.ctx.d.cuStreamSynchronize(s.h) })
}

// Close destroys the stream (cuStreamDestroy). ErrBusy while transfers are
// in flight on it.
func (s *Stream) Close() error {
	if s == nil || s.ctx == nil {
		return invalid("close stream")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("CUDA: close stream: %w", ErrClosed)
	}
	if n := len(s.pending); n > 0 {
		return fmt.Errorf("CUDA: close stream: %w (%d transfers in flight)", ErrBusy, n)
	}
	s.closed = true
	d := s.ctx.d
	err := s.ctx.do("cuStreamDestroy_v2", func() cuResult {
		for _, ev := range s.events {
			d.cuEventDestroy(ev)
		}
		return d.cuStreamDestroy(s.h)
	})
	s.events = nil
	s.ctx.dropLive()
	return err
}
