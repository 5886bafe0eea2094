package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Flags for cuMemHostAlloc and cuMemHostRegister (cuda.h).
const (
	memHostAllocPortable     = 0x01 // CU_MEMHOSTALLOC_PORTABLE
	memHostAllocDeviceMap    = 0x02 // CU_MEMHOSTALLOC_DEVICEMAP
	memHostRegisterPortable  = 0x01 // CU_MEMHOSTREGISTER_PORTABLE
	memHostRegisterDeviceMap = 0x02 // CU_MEMHOSTREGISTER_DEVICEMAP
	memHostRegisterReadOnly  = 0x08 // CU_MEMHOSTREGISTER_READ_ONLY
)

// useCount is the in-flight reference count that makes freeing memory in
// use an error instead of a corruption. Every transfer (and every
// synchronous copy, while it runs) acquires the buffers it touches and
// releases them once the GPU is done with them.
type useCount struct {
	mu    sync.Mutex
	n     int
	freed bool
}

func (u *useCount) acquire(what string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.freed {
		return fmt.Errorf("CUDA: use %s: %w", what, ErrFreed)
	}
	u.n++
	return nil
}

func (u *useCount) release() {
	u.mu.Lock()
	u.n--
	u.mu.Unlock()
}

// markFreed succeeds once, when nothing is in flight.
func (u *useCount) markFreed(op string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.freed {
		return fmt.Errorf("CUDA: %s: %w", op, ErrFreed)
	}
	if u.n > 0 {
		return fmt.Errorf("CUDA: %s: %w (%d transfers in flight)", op, ErrBusy, u.n)
	}
	u.freed = true
	return nil
}

func (u *useCount) busy() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n
}

func (u *useCount) isFreed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.freed
}

// acquireAll acquires each count or none.
func acquireAll(what []string, us []*useCount) error {
	for i, u := range us {
		if err := u.acquire(what[i]); err != nil {
			for _, v := range us[:i] {
				v.release()
			}
			return err
		}
	}
	return nil
}

func releaseAll(us []*useCount) {
	for _, u := range us {
		u.release()
	}
}

// checkRange validates [off, off+n) within a buffer of size bytes.
func checkRange(what string, size, off, n int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("CUDA: %s: [%d, %d+%d) outside %d bytes: %w", what, off, off, n, size, ErrRange)
	}
	return nil
}

// DeviceMem is a range of device memory: allocated by Alloc (owned, freed
// by Free with cuMemFree) or wrapped from an external pointer by
// WrapDevicePtr (not owned: Free only forgets it).
//
// While transfers that use it are in flight, Free returns ErrBusy and frees
// nothing. Methods are safe for concurrent use.
type DeviceMem struct {
	ctx   *Context
	ptr   uintptr
	size  int
	owned bool
	// ipc: opened from another process's IPC handle (OpenIPCMem); Free
	// closes the mapping (cuIpcCloseMemHandle).
	ipc bool
	use useCount
	// fileReg is set while the buffer is registered with cuFile.
	fileReg atomic.Bool
}

// Alloc allocates size bytes of device memory (cuMemAlloc).
func (c *Context) Alloc(size int) (*DeviceMem, error) {
	if err := c.addLive("alloc"); err != nil {
		return nil, err
	}
	if size <= 0 {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: alloc %d bytes: %w", size, ErrInvalid)
	}
	var p uintptr
	if err := c.do("cuMemAlloc_v2", func() cuResult { return c.d.cuMemAlloc(&p, uintptr(size)) }); err != nil {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: alloc %d bytes on %s: %w", size, c.dev, err)
	}
	return &DeviceMem{ctx: c, ptr: p, size: size, owned: true}, nil
}

// WrapDevicePtr wraps device memory allocated elsewhere in this process
// (PyTorch's caching allocator, cudaMalloc) so that it can be the target of
// copies and cuFile reads with the same in-flight accounting. The range
// must lie inside one allocation (checked with cuMemGetAddressRange). The
// caller keeps ownership: Free marks the wrapper dead and frees nothing.
func (c *Context) WrapDevicePtr(ptr uintptr, size int) (*DeviceMem, error) {
	if err := c.addLive("wrap device pointer"); err != nil {
		return nil, err
	}
	if ptr == 0 || size <= 0 {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: wrap device pointer %#x+%d: %w", ptr, size, ErrInvalid)
	}
	var base, n uintptr
	err := c.do("cuMemGetAddressRange_v2", func() cuResult { return c.d.cuMemGetAddressRange(&base, &n, ptr) })
	if err != nil {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: wrap device pointer %#x: %w", ptr, err)
	}
	if ptr+uintptr(size) > base+n {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: wrap device pointer %#x+%d: allocation is [%#x, %#x): %w", ptr, size, base, base+n, ErrRange)
	}
	return &DeviceMem{ctx: c, ptr: ptr, size: size}, nil
}

// Ptr returns the device address (CUdeviceptr).
func (m *DeviceMem) Ptr() uintptr {
	if m == nil {
		return 0
	}
	return m.ptr
}

// Size returns the size in bytes.
func (m *DeviceMem) Size() int {
	if m == nil {
		return 0
	}
	return m.size
}

// Owned reports whether Free releases the memory (Alloc) or only forgets
// it (WrapDevicePtr).
func (m *DeviceMem) Owned() bool { return m != nil && m.owned }

// Context returns the context the memory belongs to.
func (m *DeviceMem) Context() *Context {
	if m == nil {
		return nil
	}
	return m.ctx
}

// Busy returns the number of transfers or reads now using the memory.
func (m *DeviceMem) Busy() int {
	if m == nil {
		return 0
	}
	return m.use.busy()
}

// Free releases the memory (cuMemFree; deregistering it from cuFile first
// if it was registered). It returns ErrBusy, freeing nothing, while
// transfers that use it are in flight, and ErrFreed the second time.
func (m *DeviceMem) Free() error {
	if m == nil || m.ctx == nil {
		return invalid("free device memory")
	}
	if err := m.use.markFreed("free device memory"); err != nil {
		return err
	}
	defer m.ctx.dropLive()
	var firstErr error
	if m.fileReg.Swap(false) {
		firstErr = fileBufDeregister(m)
	}
	if m.ipc {
		if err := m.ctx.do("cuIpcCloseMemHandle", func() cuResult { return m.ctx.d.cuIpcCloseMemHandle(m.ptr) }); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if m.owned {
		if err := m.ctx.do("cuMemFree_v2", func() cuResult { return m.ctx.d.cuMemFree(m.ptr) }); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// ReadAt copies device memory at off into p (cuMemcpyDtoH, synchronous).
// It implements io.ReaderAt. It is ordered on the legacy default stream,
// not on Kylix streams: wait for transfers into m before reading it back.
func (m *DeviceMem) ReadAt(p []byte, off int64) (int, error) {
	if m == nil || m.ctx == nil {
		return 0, invalid("read device memory")
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := checkRange("read device memory", m.size, int(off), len(p)); err != nil {
		return 0, err
	}
	if err := m.use.acquire("device memory"); err != nil {
		return 0, err
	}
	defer m.use.release()
	err := m.ctx.do("cuMemcpyDtoH_v2", func() cuResult {
		return m.ctx.d.cuMemcpyDtoH(unsafe.Pointer(&p[0]), m.ptr+uintptr(off), uintptr(len(p)))
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt copies p into device memory at off (cuMemcpyHtoD from pageable
// memory, then cuStreamSynchronize on the legacy default stream, so the
// bytes are on the device when it returns). It implements io.WriterAt. For
// bulk data use pinned HostMem and Stream.CopyHtoD.
func (m *DeviceMem) WriteAt(p []byte, off int64) (int, error) {
	if m == nil || m.ctx == nil {
		return 0, invalid("write device memory")
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := checkRange("write device memory", m.size, int(off), len(p)); err != nil {
		return 0, err
	}
	if err := m.use.acquire("device memory"); err != nil {
		return 0, err
	}
	defer m.use.release()
	err := m.ctx.do("cuMemcpyHtoD_v2", func() cuResult {
		if r := m.ctx.d.cuMemcpyHtoD(m.ptr+uintptr(off), unsafe.Pointer(&p[0]), uintptr(len(p))); r != cudaSuccess {
			return r
		}
		return m.ctx.d.cuStreamSynchronize(0)
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// CopyDtoD copies n bytes between device buffers and waits for the copy
// (cuMemcpyDtoD + cuStreamSynchronize on the legacy default stream). For
// stream-ordered copies use Stream.CopyDtoD.
func CopyDtoD(dst *DeviceMem, dstOff int, src *DeviceMem, srcOff int, n int) error {
	if dst == nil || src == nil || dst.ctx == nil {
		return invalid("copy device to device")
	}
	if err := checkRange("copy device to device (dst)", dst.size, dstOff, n); err != nil {
		return err
	}
	if err := checkRange("copy device to device (src)", src.size, srcOff, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	us := []*useCount{&dst.use, &src.use}
	if err := acquireAll([]string{"destination", "source"}, us); err != nil {
		return err
	}
	defer releaseAll(us)
	c := dst.ctx
	return c.do("cuMemcpyDtoD_v2", func() cuResult {
		if r := c.d.cuMemcpyDtoD(dst.ptr+uintptr(dstOff), src.ptr+uintptr(srcOff), uintptr(n)); r != cudaSuccess {
			return r
		}
		return c.d.cuStreamSynchronize(0)
	})
}

// MemsetD8 sets n bytes of dst at off to v and waits (cuMemsetD8 +
// cuStreamSynchronize on the legacy default stream). For stream-ordered
// fills use Stream.MemsetD8.
func MemsetD8(dst *DeviceMem, off, n int, v byte) error {
	if dst == nil || dst.ctx == nil {
		return invalid("memset")
	}
	if err := checkRange("memset", dst.size, off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if err := dst.use.acquire("device memory"); err != nil {
		return err
	}
	defer dst.use.release()
	c := dst.ctx
	return c.do("cuMemsetD8_v2", func() cuResult {
		if r := c.d.cuMemsetD8(dst.ptr+uintptr(off), v, uintptr(n)); r != cudaSuccess {
			return r
		}
		return c.d.cuStreamSynchronize(0)
	})
}

// HostMem is page-locked (pinned) host memory that the GPU can DMA from
// and to: allocated by AllocHost (cuMemHostAlloc) or an existing buffer
// registered by RegisterHost (cuMemHostRegister). Both are portable (usable
// from every context) and mapped into the device address space.
//
// While transfers that use it are in flight, Free returns ErrBusy. Writing
// Bytes() while a transfer reads it is a data race on the contents (as with
// any DMA), never a use-after-free.
type HostMem struct {
	ctx        *Context
	p          unsafe.Pointer
	size       int
	registered bool   // RegisterHost (unregister on Free) vs AllocHost (free on Free)
	keep       []byte // the registered Go-visible buffer, kept reachable
	use        useCount
}

// AllocHost allocates size bytes of pinned host memory (cuMemHostAlloc with
// CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP).
func (c *Context) AllocHost(size int) (*HostMem, error) {
	if err := c.addLive("alloc host"); err != nil {
		return nil, err
	}
	if size <= 0 {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: alloc host %d bytes: %w", size, ErrInvalid)
	}
	var p unsafe.Pointer
	err := c.do("cuMemHostAlloc", func() cuResult {
		return c.d.cuMemHostAlloc(&p, uintptr(size), memHostAllocPortable|memHostAllocDeviceMap)
	})
	if err != nil {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: alloc pinned host memory, %d bytes: %w", size, err)
	}
	return &HostMem{ctx: c, p: p, size: size}, nil
}

// RegisterHost page-locks an existing buffer (cuMemHostRegister with
// CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) so that it
// can be the source or target of async copies. Free unregisters it and
// leaves the buffer to its owner. Prefer memory from mmap (or any memory
// outside the Go heap) and page-aligned ranges; a Go-heap slice works (the
// Go heap does not move) and is kept reachable until Free, but must not be
// reused for other data while registered.
func (c *Context) RegisterHost(b []byte) (*HostMem, error) {
	return c.registerHost(b, memHostRegisterPortable|memHostRegisterDeviceMap)
}

// RegisterHostReadOnly page-locks memory the device will only read
// (CU_MEMHOSTREGISTER_READ_ONLY), such as a read-only mmap of a file: the
// device can then copy from the page cache directly.
func (c *Context) RegisterHostReadOnly(b []byte) (*HostMem, error) {
	return c.registerHost(b, memHostRegisterPortable|memHostRegisterReadOnly)
}

func (c *Context) registerHost(b []byte, flags uint32) (*HostMem, error) {
	if err := c.addLive("register host"); err != nil {
		return nil, err
	}
	if len(b) == 0 {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: register host: empty buffer: %w", ErrInvalid)
	}
	p := unsafe.Pointer(&b[0])
	err := c.do("cuMemHostRegister_v2", func() cuResult {
		return c.d.cuMemHostRegister(p, uintptr(len(b)), flags)
	})
	if err != nil {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: register host memory, %d bytes: %w", len(b), err)
	}
	return &HostMem{ctx: c, p: p, size: len(b), registered: true, keep: b}, nil
}

// Bytes returns the memory as a slice (nil once freed). The slice must not
// be used after Free.
func (h *HostMem) Bytes() []byte {
	if h == nil || h.use.isFreed() {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.size)
}

// Ptr returns the host address.
func (h *HostMem) Ptr() uintptr {
	if h == nil {
		return 0
	}
	return uintptr(h.p)
}

// Size returns the size in bytes.
func (h *HostMem) Size() int {
	if h == nil {
		return 0
	}
	return h.size
}

// Registered reports whether the memory came from RegisterHost.
func (h *HostMem) Registered() bool { return h != nil && h.registered }

// Context returns the context the memory was allocated or registered in.
func (h *HostMem) Context() *Context {
	if h == nil {
		return nil
	}
	return h.ctx
}

// Busy returns the number of transfers now using the memory.
func (h *HostMem) Busy() int {
	if h == nil {
		return 0
	}
	return h.use.busy()
}

// DevicePtr returns the device address of the mapped host memory
// (cuMemHostGetDevicePointer): what a kernel, or the `unified` path on an
// integrated GPU, uses to reach it. Where
// CanUseHostPointerForRegisteredMem is true it equals Ptr().
func (h *HostMem) DevicePtr() (uintptr, error) {
	if h == nil || h.ctx == nil {
		return 0, invalid("host memory device pointer")
	}
	if err := h.use.acquire("host memory"); err != nil {
		return 0, err
	}
	defer h.use.release()
	var dp uintptr
	err := h.ctx.do("cuMemHostGetDevicePointer_v2", func() cuResult { return h.ctx.d.cuMemHostGetDevicePointer(&dp, h.p, 0) })
	return dp, err
}

// Free releases pinned memory (cuMemFreeHost) or unregisters a registered
// buffer (cuMemHostUnregister). ErrBusy while transfers use it.
func (h *HostMem) Free() error {
	if h == nil || h.ctx == nil {
		return invalid("free host memory")
	}
	if err := h.use.markFreed("free host memory"); err != nil {
		return err
	}
	defer h.ctx.dropLive()
	if h.registered {
		err := h.ctx.do("cuMemHostUnregister", func() cuResult { return h.ctx.d.cuMemHostUnregister(h.p) })
		h.keep = nil
		return err
	}
	return h.ctx.do("cuMemFreeHost", func() cuResult { return h.ctx.d.cuMemFreeHost(h.p) })
}
