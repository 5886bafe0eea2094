package cuda

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns wraps one of these or is
// an *Error / *FileError (which may in turn match a sentinel through Is).
var (
	// ErrUnavailable: the CUDA driver (libcuda.so.1), a GPU, or libcufile is
	// not present or could not be initialised. The wrapped text says which
	// and why (library not found, cuInit's error code and name, ...).
	ErrUnavailable = errors.New("CUDA unavailable")

	// ErrBusy: memory, a stream, a file handle or a context cannot be freed
	// or closed because transfers (or allocations) that use it are still in
	// flight. Nothing was freed; wait for the transfers and try again.
	ErrBusy = errors.New("CUDA object busy")

	// ErrFreed: the memory or handle was already freed or closed.
	ErrFreed = errors.New("CUDA memory already freed")

	// ErrClosed: the context or stream was closed.
	ErrClosed = errors.New("CUDA context or object closed")

	// ErrInvalid: an invalid argument (nil object, negative size, ...).
	ErrInvalid = errors.New("invalid argument to CUDA")

	// ErrRange: an offset/length pair falls outside a buffer.
	ErrRange = errors.New("out of range of CUDA memory")

	// ErrOutOfMemory matches CUDA_ERROR_OUT_OF_MEMORY (and cuFile's
	// CU_FILE_NOMEM_ERROR) through errors.Is.
	ErrOutOfMemory = errors.New("out of GPU memory")
)

// CUresult codes this package looks at.
const (
	cudaSuccess                         = 0
	cudaErrorInvalidValue               = 1
	cudaErrorOutOfMemory                = 2
	cudaErrorNotInitialized             = 3
	cudaErrorNoDevice                   = 100
	cudaErrorNotReady                   = 600
	cudaErrorHostMemoryAlreadyRegistred = 712
)

// Error is a CUDA driver API failure: the function that failed and its
// CUresult, with the code's name from cuGetErrorName.
type Error struct {
	Op   string // driver function, e.g. "cuMemAlloc_v2"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, e.Name, e.Code)
}

// Is lets errors.Is(err, ErrOutOfMemory) match CUDA_ERROR_OUT_OF_MEMORY.
func (e *Error) Is(target error) bool {
	return target == ErrOutOfMemory && e.Code == cudaErrorOutOfMemory
}

// FileError is a cuFile failure: the CUfileError_t {err, cu_err} pair.
// When Code is CU_FILE_CUDA_DRIVER_ERROR, CUDA holds the driver error and
// errors.As reaches it through Unwrap.
type FileError struct {
	Op   string // cuFile function, e.g. "cuFileHandleRegister"
	Code int    // CUfileOpError (5000 + n); for cuFileRead, the negated return
	Name string // e.g. "CU_FILE_DRIVER_NOT_INITIALIZED"
	CUDA *Error // the cu_err half, nil when it is CUDA_SUCCESS
}

func (e *FileError) Error() string {
	s := fmt.Sprintf("cufile: %s: %s (%d)", e.Op, e.Name, e.Code)
	if e.CUDA != nil {
		s += fmt.Sprintf(" (CUDA %s (%d))", e.CUDA.Name, e.CUDA.Code)
	}
	return s
}

// Unwrap returns the CUDA driver error carried in cu_err, if any.
func (e *FileError) Unwrap() error {
	if e.CUDA == nil {
		return nil
	}
	return e.CUDA
}

// Is lets errors.Is(err, ErrOutOfMemory) match CU_FILE_NOMEM_ERROR.
func (e *FileError) Is(target error) bool {
	return target == ErrOutOfMemory && e.Code == cuFileBaseErr+43
}

// cuFile's CUfileOpError values are CUFILEOP_BASE_ERR (5000) + n.
const cuFileBaseErr = 5000

var cuFileErrNames = map[int]string{
	0:  "CU_FILE_SUCCESS",
	1:  "CU_FILE_DRIVER_NOT_INITIALIZED",
	2:  "CU_FILE_DRIVER_INVALID_PROPS",
	3:  "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
	4:  "CU_FILE_DRIVER_VERSION_MISMATCH",
	5:  "CU_FILE_DRIVER_VERSION_READ_ERROR",
	6:  "CU_FILE_DRIVER_CLOSING",
	7:  "CU_FILE_PLATFORM_NOT_SUPPORTED",
	8:  "CU_FILE_IO_NOT_SUPPORTED",
	9:  "CU_FILE_DEVICE_NOT_SUPPORTED",
	10: "CU_FILE_NVFS_DRIVER_ERROR",
	11: "CU_FILE_CUDA_DRIVER_ERROR",
	12: "CU_FILE_CUDA_POINTER_INVALID",
	13: "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
	14: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	15: "CU_FILE_CUDA_CONTEXT_MISMATCH",
	16: "CU_FILE_INVALID_MAPPING_SIZE",
	17: "CU_FILE_INVALID_MAPPING_RANGE",
	18: "CU_FILE_INVALID_FILE_TYPE",
	19: "CU_FILE_INVALID_FILE_OPEN_FLAG",
	20: "CU_FILE_DIO_NOT_SET",
	22: "CU_FILE_INVALID_VALUE",
	23: "CU_FILE_MEMORY_ALREADY_REGISTERED",
	24: "CU_FILE_MEMORY_NOT_REGISTERED",
	25: "CU_FILE_PERMISSION_DENIED",
	26: "CU_FILE_DRIVER_ALREADY_OPEN",
	27: "CU_FILE_HANDLE_NOT_REGISTERED",
	28: "CU_FILE_HANDLE_ALREADY_REGISTERED",
	29: "CU_FILE_DEVICE_NOT_FOUND",
	30: "CU_FILE_INTERNAL_ERROR",
	31: "CU_FILE_GETNEWFD_FAILED",
	33: "CU_FILE_NVFS_SETUP_ERROR",
	34: "CU_FILE_IO_DISABLED",
	35: "CU_FILE_BATCH_SUBMIT_FAILED",
	36: "CU_FILE_GPU_MEMORY_PINNING_FAILED",
	37: "CU_FILE_BATCH_FULL",
	38: "CU_FILE_ASYNC_NOT_SUPPORTED",
	39: "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
	40: "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
	41: "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
	42: "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
	43: "CU_FILE_NOMEM_ERROR",
	44: "CU_FILE_IO_ERROR",
	45: "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
	46: "CU_FILE_HASH_OPR_ERROR",
	47: "CU_FILE_INVALID_CONTEXT_ERROR",
	48: "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
	49: "CU_FILE_BATCH_NOCOMPAT_ERROR",
	50: "CU_FILE_IO_MAX_ERROR",
}

// cuFileErrName names a CUfileOpError value.
func cuFileErrName(code int) string {
	if code == 0 {
		return cuFileErrNames[0]
	}
	if n, ok := cuFileErrNames[code-cuFileBaseErr]; ok && code > cuFileBaseErr {
		return n
	}
	return fmt.Sprintf("CU_FILE_ERROR_%d", code)
}

// Fallback names used when cuGetErrorName itself fails (or before the
// library is bound). cuGetErrorName is the authority.
var cudaErrNames = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	35:  "CUDA_ERROR_INSUFFICIENT_DRIVER",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	600: "CUDA_ERROR_NOT_READY",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	999: "CUDA_ERROR_UNKNOWN",
}
