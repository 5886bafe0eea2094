package gpuio

import "context"

// Device is the accelerator gpuio loads into.
type Device interface {
	// String names the device, e.g. "cuda:0 (NVIDIA H200)".
	String() string
	// Alloc allocates n bytes of device memory.
	Alloc(n int64) (DeviceMem, error)
	// AllocPinned allocates n bytes of page-locked host memory, aligned to
	// at least 4 KiB, that the device can copy from asynchronously.
	AllocPinned(n int) (PinnedMem, error)
	// NewStream returns an ordered queue for asynchronous copies.
	NewStream() (Stream, error)
	// Integrated reports whether CPU and GPU share physical memory (then
	// the unified path applies).
	Integrated() bool
	Close() error
}

// DeviceMem is device memory. Offsets are in bytes from its start.
type DeviceMem interface {
	Ptr() uintptr
	Size() int64
	// CopyToHost copies len(dst) bytes at off back to the host and waits.
	CopyToHost(dst []byte, off int64) error
	Free() error
}

// PinnedMem is page-locked host memory.
type PinnedMem interface {
	Bytes() []byte
	Free() error
}

// Stream queues asynchronous copies; each returns a Transfer to wait on. The
// buffers of a transfer must not be reused or freed before it completes.
type Stream interface {
	CopyHtoD(dst DeviceMem, dstOff int64, src PinnedMem, srcOff, n int) (Transfer, error)
	// Copy2DHtoD copies rows rows of width bytes: source rows srcPitch bytes
	// apart from srcOff, destination rows dstPitch bytes apart from dstOff.
	Copy2DHtoD(dst DeviceMem, dstOff int64, dstPitch int, src PinnedMem, srcOff, srcPitch, width, rows int) (Transfer, error)
	CopyDtoD(dst DeviceMem, dstOff int64, src DeviceMem, srcOff int64, n int) (Transfer, error)
	// Copy2DDtoD is Copy2DHtoD from device memory.
	Copy2DDtoD(dst DeviceMem, dstOff int64, dstPitch int, src DeviceMem, srcOff int64, srcPitch, width, rows int) (Transfer, error)
	Close() error
}

// Transfer is an asynchronous copy in flight.
type Transfer interface {
	// Wait blocks until the copy completes (or ctx is done; the copy then
	// still runs and its buffers stay in use).
	Wait(ctx context.Context) error
}

// GDSDevice is implemented by devices that can read files with cuFile.
type GDSDevice interface {
	Device
	// CuFileMode reports "native", "p2pdma", "compat" or "absent", and why;
	// probe is non-nil when cuFile cannot register files in dir (the data
	// directory), whatever its mode.
	CuFileMode(dir string) (mode, reason string, probe error)
	// OpenGDS registers an O_DIRECT file descriptor with cuFile.
	OpenGDS(fd int) (GDSFile, error)
}

// GDSFile is a file registered with cuFile.
type GDSFile interface {
	// Read reads n bytes at fileOff into dst at dstOff (synchronously).
	Read(dst DeviceMem, dstOff int64, fileOff int64, n int) (int, error)
	Close() error
}

// HostViewer is implemented by device memory the CPU can address directly
// (integrated GPUs, and HostDevice).
type HostViewer interface {
	HostView() []byte
}

// HostRegisterer is implemented by devices that can copy straight out of
// ordinary host memory once it is registered (page-locked), such as a
// read-only mmap of a pack file whose pages are in the page cache: the copy
// then needs no bounce through a pinned buffer.
type HostRegisterer interface {
	RegisterReadOnly(b []byte) (PinnedMem, error)
}

// DeviceVerifier is implemented by devices that can BLAKE3-hash data in their
// own memory. With it, a load copies whole chunks to device staging memory,
// verifies them there and places the wanted bytes with device-to-device
// copies, so the CPU never touches the data (on the H200 machine the CPU's
// BLAKE3 on all cores is slower than PCIe).
type DeviceVerifier interface {
	// VerifyAsync queues, on s after the work already queued there, the
	// hashing of each message inside mem and its comparison with Want.
	VerifyAsync(s Stream, mem DeviceMem, msgs []VerifyMsg) (VerifyWait, error)
}

// VerifyMsg is one chunk in device memory and the ID it must hash to.
type VerifyMsg struct {
	Off, Len int64
	Want     [32]byte
}

// VerifyWait is a queued verification.
type VerifyWait interface {
	// Wait returns the indexes of the messages whose hash did not match.
	Wait(ctx context.Context) (bad []int, err error)
}
