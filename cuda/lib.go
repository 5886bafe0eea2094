package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// cuResult is CUresult (a C enum, 32 bits).
type cuResult int32

// driver holds the bound entry points of libcuda.so.1. A *driver exists only
// once cuInit(0) has succeeded. Names follow the C functions; where cuda.h
// maps a name to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2) the
// versioned symbol is bound, as the header would.
type driver struct {
	path string

	cuInit             func(flags uint32) cuResult
	cuDriverGetVersion func(v *int32) cuResult
	cuGetErrorName     func(r cuResult, s *unsafe.Pointer) cuResult

	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(d *int32, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, d int32) cuResult
	cuDeviceTotalMem          func(b *uintptr, d int32) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) cuResult
	cuDeviceGetPCIBusId       func(id *byte, n int32, d int32) cuResult
	cuDevicePrimaryCtxRetain  func(c *uintptr, d int32) cuResult
	cuDevicePrimaryCtxRelease func(d int32) cuResult

	cuCtxPushCurrent func(c uintptr) cuResult
	cuCtxPopCurrent  func(c *uintptr) cuResult
	cuCtxGetCurrent  func(c *uintptr) cuResult

	cuMemGetInfo              func(free, total *uintptr) cuResult
	cuMemAlloc                func(p *uintptr, n uintptr) cuResult
	cuMemFree                 func(p uintptr) cuResult
	cuMemGetAddressRange      func(base, size *uintptr, p uintptr) cuResult
	cuMemHostAlloc            func(p *unsafe.Pointer, n uintptr, flags uint32) cuResult
	cuMemFreeHost             func(p unsafe.Pointer) cuResult
	cuMemHostRegister         func(p unsafe.Pointer, n uintptr, flags uint32) cuResult
	cuMemHostUnregister       func(p unsafe.Pointer) cuResult
	cuMemHostGetDevicePointer func(d *uintptr, p unsafe.Pointer, flags uint32) cuResult

	cuStreamCreate      func(s *uintptr, flags uint32) cuResult
	cuStreamDestroy     func(s uintptr) cuResult
	cuStreamSynchronize func(s uintptr) cuResult

	cuMemcpyHtoD      func(dst uintptr, src unsafe.Pointer, n uintptr) cuResult
	cuMemcpyDtoH      func(dst unsafe.Pointer, src uintptr, n uintptr) cuResult
	cuMemcpyDtoD      func(dst, src, n uintptr) cuResult
	cuMemsetD8        func(dst uintptr, v uint8, n uintptr) cuResult
	cuMemcpyHtoDAsync func(dst uintptr, src unsafe.Pointer, n uintptr, s uintptr) cuResult
	cuMemcpyDtoHAsync func(dst unsafe.Pointer, src uintptr, n uintptr, s uintptr) cuResult
	cuMemcpyDtoDAsync func(dst, src, n, s uintptr) cuResult
	cuMemsetD8Async   func(dst uintptr, v uint8, n uintptr, s uintptr) cuResult
	// Optional: without it Copy2D falls back to one copy per row.
	cuMemcpy2DAsync func(p unsafe.Pointer, s uintptr) cuResult

	cuEventCreate      func(e *uintptr, flags uint32) cuResult
	cuEventDestroy     func(e uintptr) cuResult
	cuEventRecord      func(e, s uintptr) cuResult
	cuEventQuery       func(e uintptr) cuResult
	cuEventSynchronize func(e uintptr) cuResult
	cuEventElapsedTime func(ms *float32, start, end uintptr) cuResult

	// Modules and kernel launches (module.go). Optional: a driver (or the
	// test stub) without them still serves memory, streams and cuFile;
	// LoadModule and Launch then report ErrUnavailable.
	cuModuleLoadData    func(m *uintptr, image unsafe.Pointer) cuResult
	cuModuleLoadDataEx  func(m *uintptr, image unsafe.Pointer, n uint32, opts unsafe.Pointer, vals unsafe.Pointer) cuResult
	cuModuleUnload      func(m uintptr) cuResult
	cuModuleGetFunction func(f *uintptr, m uintptr, name string) cuResult
	cuLaunchKernel      func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult

	// CUDA IPC (ipc.go). Optional: without them OpenIPCMem reports
	// ErrUnavailable.
	cuIpcOpenMemHandle  func(p *uintptr, h ipcMemHandle, flags uint32) cuResult
	cuIpcCloseMemHandle func(p uintptr) cuResult
}

// symbol binds one C function to a Go func variable. names are tried in
// order (the versioned name first).
type symbol struct {
	fptr     any
	names    []string
	optional bool
}

func (d *driver) symbols() []symbol {
	s := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names} }
	opt := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names, optional: true} }
	return []symbol{
		s(&d.cuInit, "cuInit"),
		s(&d.cuDriverGetVersion, "cuDriverGetVersion"),
		s(&d.cuGetErrorName, "cuGetErrorName"),
		s(&d.cuDeviceGetCount, "cuDeviceGetCount"),
		s(&d.cuDeviceGet, "cuDeviceGet"),
		s(&d.cuDeviceGetName, "cuDeviceGetName"),
		s(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		s(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
		s(&d.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
		s(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		s(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
		s(&d.cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
		s(&d.cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
		s(&d.cuCtxGetCurrent, "cuCtxGetCurrent"),
		s(&d.cuMemGetInfo, "cuMemGetInfo_v2"),
		s(&d.cuMemAlloc, "cuMemAlloc_v2"),
		s(&d.cuMemFree, "cuMemFree_v2"),
		s(&d.cuMemGetAddressRange, "cuMemGetAddressRange_v2"),
		s(&d.cuMemHostAlloc, "cuMemHostAlloc"),
		s(&d.cuMemFreeHost, "cuMemFreeHost"),
		s(&d.cuMemHostRegister, "cuMemHostRegister_v2"),
		s(&d.cuMemHostUnregister, "cuMemHostUnregister"),
		s(&d.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
		s(&d.cuStreamCreate, "cuStreamCreate"),
		s(&d.cuStreamDestroy, "cuStreamDestroy_v2"),
		s(&d.cuStreamSynchronize, "cuStreamSynchronize"),
		s(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
		s(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
		s(&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
		s(&d.cuMemsetD8, "cuMemsetD8_v2"),
		s(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
		s(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
		s(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
		s(&d.cuMemsetD8Async, "cuMemsetD8Async"),
		opt(&d.cuMemcpy2DAsync, "cuMemcpy2DAsync_v2"),
		s(&d.cuEventCreate, "cuEventCreate"),
		s(&d.cuEventDestroy, "cuEventDestroy_v2"),
		s(&d.cuEventRecord, "cuEventRecord"),
		s(&d.cuEventQuery, "cuEventQuery"),
		s(&d.cuEventSynchronize, "cuEventSynchronize"),
		// CUDA 12.8 added cuEventElapsedTime_v2 (cuda.h maps the plain name
		// to it); older drivers only have the plain symbol.
		s(&d.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
		opt(&d.cuModuleLoadData, "cuModuleLoadData"),
		opt(&d.cuModuleLoadDataEx, "cuModuleLoadDataEx"),
		opt(&d.cuModuleUnload, "cuModuleUnload"),
		opt(&d.cuModuleGetFunction, "cuModuleGetFunction"),
		opt(&d.cuLaunchKernel, "cuLaunchKernel"),
		opt(&d.cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"),
		opt(&d.cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
	}
}

// err turns a non-zero CUresult into an *Error (nil for CUDA_SUCCESS).
func (d *driver) err(op string, r cuResult) error {
	if r == cudaSuccess {
		return nil
	}
	return &Error{Op: op, Code: int(r), Name: d.errName(r)}
}

func (d *driver) errName(r cuResult) string {
	if d != nil && d.cuGetErrorName != nil {
		var p unsafe.Pointer
		if d.cuGetErrorName(r, &p) == cudaSuccess && p != nil {
			return cString(p, 128)
		}
	}
	if n, ok := cudaErrNames[int(r)]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// cString copies a NUL-terminated C string of at most max bytes.
func cString(p unsafe.Pointer, max int) string {
	if p == nil {
		return ""
	}
	b := unsafe.Slice((*byte)(p), max)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// bufString returns the NUL-terminated prefix of b.
func bufString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Loading is lazy and happens once per process. Tests may replace the
// loader (see export_test.go) to exercise the unavailable paths on a GPU
// machine too.
var (
	loadOnce   sync.Once
	loadedDrv  *driver
	loadDrvErr error
	driverHook atomic.Pointer[func() (*driver, error)]
)

// getDriver returns the bound, initialised driver, or an error wrapping
// ErrUnavailable that says why there is none.
func getDriver() (*driver, error) {
	if h := driverHook.Load(); h != nil {
		return (*h)()
	}
	loadOnce.Do(func() { loadedDrv, loadDrvErr = openDriver() })
	return loadedDrv, loadDrvErr
}

// openDriver loads libcuda, binds every symbol and runs cuInit(0).
func openDriver() (*driver, error) {
	h, path, err := dlopenFirst(libcudaCandidates())
	if err != nil {
		return nil, fmt.Errorf("%w: CUDA driver library not found: %v", ErrUnavailable, err)
	}
	d := &driver{path: path}
	if err := bindSymbols(h, d.symbols()); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, path, err)
	}
	if r := d.cuInit(0); r != cudaSuccess {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, path, d.err("cuInit", r))
	}
	return d, nil
}

func libcudaCandidates() []string {
	return []string{"libcuda.so.1", "libcuda.so"}
}

// Available reports whether the CUDA driver is loaded and initialised: nil,
// or an error wrapping ErrUnavailable with the reason (library not found,
// cuInit's error code and name). The first call loads the library.
func Available() error {
	_, err := getDriver()
	return err
}

// LibraryPath returns the path of the loaded CUDA driver library.
func LibraryPath() (string, error) {
	d, err := getDriver()
	if err != nil {
		return "", err
	}
	return d.path, nil
}

// DriverVersion returns the CUDA version the driver supports, as
// 1000*major + 10*minor (13000 for 13.0), from cuDriverGetVersion.
func DriverVersion() (int, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.err("cuDriverGetVersion", d.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// invalid is the error for an operation on a nil or zero object: where no
// driver is available (the only way such objects arise there) it is the
// ErrUnavailable error, otherwise ErrInvalid.
func invalid(op string) error {
	if err := Available(); err != nil {
		return err
	}
	return fmt.Errorf("CUDA: %s: %w", op, ErrInvalid)
}
