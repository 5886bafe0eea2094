package cuda

import (
	"fmt"
	"runtime"
	"sync"
)

// Context is a retained reference to a device's primary context, the one
// the CUDA runtime (and so PyTorch) uses: device pointers allocated by
// PyTorch in the same process are valid here, and ours are valid there.
//
// Threading rule. A CUDA context is "current" per OS thread, while
// goroutines move between threads. So no Context method relies on what is
// current: every call that needs a context locks the goroutine to its
// thread (runtime.LockOSThread), pushes this context (cuCtxPushCurrent),
// makes the driver call(s), pops it again (cuCtxPopCurrent) and unlocks.
// Push/pop rather than cuCtxSetCurrent leaves whatever the thread had
// current before untouched, which matters when Go code runs on a foreign
// thread (a c-shared library called from Python). The cost is two extra
// driver calls (well under a microsecond each) per operation.
//
// A Context counts what was made from it (memory, streams, events); Close
// refuses with ErrBusy while any of them is alive.
type Context struct {
	d   *driver
	dev Device
	h   uintptr

	mu     sync.Mutex
	live   int
	closed bool

	// pollers counts running stream pollers; Close waits for them so
	// that none still has the context pushed when it is released.
	pollers sync.WaitGroup
}

// PrimaryContext retains the device's primary context
// (cuDevicePrimaryCtxRetain). Close releases it. Several Contexts for the
// same device may exist; each holds one reference.
func (dev Device) PrimaryContext() (*Context, error) {
	d, err := getDriver()
	if err != nil {
		return nil, err
	}
	var h uintptr
	if err := d.err("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&h, dev.h)); err != nil {
		return nil, fmt.Errorf("CUDA: %s: %w", dev, err)
	}
	return &Context{d: d, dev: dev, h: h}, nil
}

// Device returns the context's device.
func (c *Context) Device() Device {
	if c == nil {
		return Device{}
	}
	return c.dev
}

// Handle returns the CUcontext, for callers that must hand it to C code.
func (c *Context) Handle() uintptr {
	if c == nil {
		return 0
	}
	return c.h
}

// Close releases the primary context reference
// (cuDevicePrimaryCtxRelease). It returns ErrBusy while memory, streams or
// events made from this Context are alive.
func (c *Context) Close() error {
	if c == nil {
		return invalid("close context")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("CUDA: close context: %w", ErrClosed)
	}
	if c.live > 0 {
		return fmt.Errorf("CUDA: close context: %w (%d objects alive)", ErrBusy, c.live)
	}
	c.closed = true
	// No stream is alive, so no transfer is pending: pollers are exiting.
	c.pollers.Wait()
	return c.d.err("cuDevicePrimaryCtxRelease_v2", c.d.cuDevicePrimaryCtxRelease(c.dev.h))
}

// check returns an error for a nil or closed context.
func (c *Context) check(op string) error {
	if c == nil || c.d == nil {
		return invalid(op)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("CUDA: %s: %w", op, ErrClosed)
	}
	return nil
}

// addLive counts one more object made from c; it fails once c is closed.
func (c *Context) addLive(op string) error {
	if c == nil || c.d == nil {
		return invalid(op)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("CUDA: %s: %w", op, ErrClosed)
	}
	c.live++
	return nil
}

func (c *Context) dropLive() {
	c.mu.Lock()
	c.live--
	c.mu.Unlock()
}

// enter locks the calling goroutine to its OS thread and pushes c as the
// thread's current context. Every enter must be followed by leave.
func (c *Context) enter() error {
	runtime.LockOSThread()
	if r := c.d.cuCtxPushCurrent(c.h); r != cudaSuccess {
		runtime.UnlockOSThread()
		return c.d.err("cuCtxPushCurrent_v2", r)
	}
	return nil
}

// leave pops c and unlocks the thread.
func (c *Context) leave() {
	var old uintptr
	c.d.cuCtxPopCurrent(&old)
	runtime.UnlockOSThread()
}

// do runs fn with c current on the calling thread and converts its result.
func (c *Context) do(op string, fn func() cuResult) error {
	if err := c.enter(); err != nil {
		return err
	}
	r := fn()
	c.leave()
	return c.d.err(op, r)
}

// MemInfo returns the device's free and total memory (cuMemGetInfo).
func (c *Context) MemInfo() (free, total uint64, err error) {
	if err := c.check("mem info"); err != nil {
		return 0, 0, err
	}
	var f, t uintptr
	err = c.do("cuMemGetInfo_v2", func() cuResult { return c.d.cuMemGetInfo(&f, &t) })
	return uint64(f), uint64(t), err
}
