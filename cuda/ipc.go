package cuda

import "fmt"

// IPCHandleSize is the size of a CUipcMemHandle.
const IPCHandleSize = 64

// ipcMemHandle is CUipcMemHandle, passed by value (a 64-byte struct: on
// stack memory on x86-64, by reference on arm64; purego follows the ABI).
type ipcMemHandle struct{ Reserved [IPCHandleSize]byte }

// ipcLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
const ipcLazyEnablePeerAccess = 1

// OpenIPCMem maps device memory another process exported with
// cuIpcGetMemHandle (torch: storage._share_cuda_()) into this context. The
// DeviceMem returned covers the whole exported allocation as the driver
// reports it (cuMemGetAddressRange on the mapped pointer), never a size a
// caller claims, so every copy into it is bounds-checked against the real
// allocation. Free unmaps it (cuIpcCloseMemHandle) and frees nothing. A
// process cannot open its own handles (the driver refuses).
func (c *Context) OpenIPCMem(handle [IPCHandleSize]byte) (*DeviceMem, error) {
	if err := c.check("open IPC memory"); err != nil {
		return nil, err
	}
	if c.d.cuIpcOpenMemHandle == nil || c.d.cuIpcCloseMemHandle == nil {
		return nil, fmt.Errorf("CUDA: open IPC memory: %w: the driver %s has no cuIpcOpenMemHandle", ErrUnavailable, c.d.path)
	}
	if err := c.addLive("open IPC memory"); err != nil {
		return nil, err
	}
	var ptr, base, n uintptr
	err := c.do("cuIpcOpenMemHandle_v2", func() cuResult {
		return c.d.cuIpcOpenMemHandle(&ptr, ipcMemHandle{handle}, ipcLazyEnablePeerAccess)
	})
	if err != nil {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: open IPC memory: %w", err)
	}
	err = c.do("cuMemGetAddressRange_v2", func() cuResult { return c.d.cuMemGetAddressRange(&base, &n, ptr) })
	if err == nil && (ptr < base || ptr-base >= n) {
		err = fmt.Errorf("mapped pointer %#x outside the range [%#x, %#x) the driver reports: %w", ptr, base, base+n, ErrRange)
	}
	if err != nil {
		c.do("cuIpcCloseMemHandle", func() cuResult { return c.d.cuIpcCloseMemHandle(ptr) })
		c.dropLive()
		return nil, fmt.Errorf("CUDA: open IPC memory: %w", err)
	}
	return &DeviceMem{ctx: c, ptr: ptr, size: int(n - (ptr - base)), ipc: true}, nil
}
