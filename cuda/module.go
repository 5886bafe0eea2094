package cuda

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"strings"
	"unsafe"
)

// Modules and kernel launches. Signatures (cuda.h):
//
//	CUresult cuModuleLoadData(CUmodule *module, const void *image);
//	CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
//	                            CUjit_option *options, void **optionValues);
//	CUresult cuModuleUnload(CUmodule hmod);
//	CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
//	CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ,
//	                        unsigned blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes,
//	                        CUstream hStream, void **kernelParams, void **extra);
//
// cuLaunchKernel copies the parameter values while it runs, so the
// parameter memory only has to live (and stay put) for the call.

// CUjit_option values used with cuModuleLoadDataEx.
const (
	jitErrorLogBuffer          = 5 // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSizeBytes = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)

// Module is a loaded CUDA module (cuModuleLoadData): PTX, which the driver
// compiles for the device when it loads it, or a CUBIN. Get images from
// Compile (NVRTC). Unload returns ErrBusy while launches of its functions
// are in flight.
type Module struct {
	ctx *Context
	h   uintptr
	use useCount
}

// LoadModule loads a module image (cuModuleLoadDataEx, with the JIT's error
// log in the error when loading PTX fails): PTX text or a CUBIN/fatbin, as
// Compile returns them.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	if err := c.addLive("load module"); err != nil {
		return nil, err
	}
	d := c.d
	if d.cuModuleLoadData == nil || d.cuModuleGetFunction == nil || d.cuLaunchKernel == nil || d.cuModuleUnload == nil {
		c.dropLive()
		return nil, fmt.Errorf("%w: %s has no module/launch API (cuModuleLoadData, cuLaunchKernel)", ErrUnavailable, d.path)
	}
	if len(image) == 0 {
		c.dropLive()
		return nil, fmt.Errorf("CUDA: load module: empty image: %w", ErrInvalid)
	}
	img := image
	if !bytes.HasPrefix(img, []byte("\x7fELF")) && img[len(img)-1] != 0 {
		img = append(append([]byte(nil), img...), 0) // PTX must be NUL-terminated
	}
	var h uintptr
	logBuf := make([]byte, 8192)
	err := c.do("cuModuleLoadData", func() cuResult {
		if d.cuModuleLoadDataEx == nil {
			return d.cuModuleLoadData(&h, unsafe.Pointer(&img[0]))
		}
		opts := []int32{jitErrorLogBuffer, jitErrorLogBufferSizeBytes}
		// Option values are void*; the size travels as an integer in one.
		// uintptr keeps the GC away from them; logBuf is kept alive below.
		vals := []uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
		r := d.cuModuleLoadDataEx(&h, unsafe.Pointer(&img[0]), uint32(len(opts)), unsafe.Pointer(&opts[0]), unsafe.Pointer(&vals[0]))
		runtime.KeepAlive(opts)
		runtime.KeepAlive(vals)
		return r
	})
	runtime.KeepAlive(logBuf)
	runtime.KeepAlive(img)
	if err != nil {
		c.dropLive()
		if l := strings.TrimSpace(bufString(logBuf)); l != "" {
			return nil, fmt.Errorf("CUDA: load module: %w:\n%s", err, l)
		}
		return nil, fmt.Errorf("CUDA: load module: %w", err)
	}
	return &Module{ctx: c, h: h}, nil
}

// Handle returns the CUmodule.
func (m *Module) Handle() uintptr {
	if m == nil {
		return 0
	}
	return m.h
}

// Context returns the context the module was loaded in.
func (m *Module) Context() *Context {
	if m == nil {
		return nil
	}
	return m.ctx
}

// Busy returns the number of launches of the module's functions in flight.
func (m *Module) Busy() int {
	if m == nil {
		return 0
	}
	return m.use.busy()
}

// Function looks up a kernel by name (cuModuleGetFunction). Kernels meant
// to be looked up should be declared extern "C" so that the name is not
// mangled.
func (m *Module) Function(name string) (*Function, error) {
	if m == nil || m.ctx == nil {
		return nil, invalid("module function")
	}
	if err := m.use.acquire("module"); err != nil {
		return nil, err
	}
	defer m.use.release()
	var h uintptr
	c := m.ctx
	if err := c.do("cuModuleGetFunction", func() cuResult { return c.d.cuModuleGetFunction(&h, m.h, name) }); err != nil {
		return nil, fmt.Errorf("CUDA: function %q: %w", name, err)
	}
	return &Function{mod: m, h: h, name: name}, nil
}

// Unload unloads the module (cuModuleUnload). It returns ErrBusy while
// launches of its functions are in flight, and ErrFreed the second time.
func (m *Module) Unload() error {
	if m == nil || m.ctx == nil {
		return invalid("unload module")
	}
	if err := m.use.markFreed("unload module"); err != nil {
		return err
	}
	defer m.ctx.dropLive()
	c := m.ctx
	return c.do("cuModuleUnload", func() cuResult { return c.d.cuModuleUnload(m.h) })
}

// Function is a kernel in a loaded Module (a CUfunction).
type Function struct {
	mod  *Module
	h    uintptr
	name string
}

// Name returns the kernel's name.
func (f *Function) Name() string {
	if f == nil {
		return ""
	}
	return f.name
}

// Handle returns the CUfunction.
func (f *Function) Handle() uintptr {
	if f == nil {
		return 0
	}
	return f.h
}

// Dim3 is a grid or block shape. A zero component counts as 1.
type Dim3 struct{ X, Y, Z uint32 }

// LaunchConfig is the shape of a kernel launch.
type LaunchConfig struct {
	Grid      Dim3   // blocks
	Block     Dim3   // threads per block
	SharedMem uint32 // dynamic shared memory per block, bytes
}

func one(v uint32) uint32 {
	if v == 0 {
		return 1
	}
	return v
}

// Launch queues kernel f on s (cuLaunchKernel) and returns a *Transfer that
// completes when the kernel has finished. Like a copy, the launch holds
// every buffer passed as an argument (and f's module) until then: their
// Free (Unload) returns ErrBusy. Work queued later on the same stream runs
// after the kernel, so a CopyDtoH of its results issued next on s sees
// them; waiting on that copy's Transfer also covers the kernel.
//
// args are the kernel's parameters, in order, converted to the C types:
//
//	*DeviceMem           a device pointer (T*): its base address
//	*HostMem             its device-mapped address (cuMemHostGetDevicePointer)
//	int32, uint32        int, unsigned int (4 bytes)
//	int64, uint64, int,
//	uint, uintptr        long long, unsigned long long, size_t (8 bytes)
//	float32, float64     float, double
//
// The types must match the kernel's declaration: the driver copies each
// parameter's size from the kernel's signature, not from Go. The Transfer's
// Len is 0.
func (s *Stream) Launch(f *Function, cfg LaunchConfig, args ...any) (*Transfer, error) {
	if s == nil || s.ctx == nil || f == nil || f.mod == nil {
		return nil, invalid("launch")
	}
	d := s.ctx.d
	if d.cuLaunchKernel == nil {
		return nil, fmt.Errorf("%w: %s has no cuLaunchKernel", ErrUnavailable, d.path)
	}
	if f.mod.ctx.h != s.ctx.h {
		return nil, fmt.Errorf("CUDA: launch %s: module and stream belong to different contexts: %w", f.name, ErrInvalid)
	}
	// One 8-byte slot per parameter (little-endian: a 4-byte value sits at
	// the slot's start), and the array of their addresses that
	// cuLaunchKernel reads. Both are pinned for the call.
	slots := make([]uint64, len(args)+1)
	params := make([]unsafe.Pointer, len(args)+1)
	what := []string{"module"}
	holds := []*useCount{&f.mod.use}
	for i, a := range args {
		switch v := a.(type) {
		case *DeviceMem:
			if v == nil || v.ctx == nil {
				return nil, fmt.Errorf("CUDA: launch %s: argument %d: nil device memory: %w", f.name, i, ErrInvalid)
			}
			if v.ctx.h != s.ctx.h {
				return nil, fmt.Errorf("CUDA: launch %s: argument %d: device memory of another context: %w", f.name, i, ErrInvalid)
			}
			slots[i] = uint64(v.ptr)
			what = append(what, fmt.Sprintf("argument %d", i))
			holds = append(holds, &v.use)
		case *HostMem:
			if v == nil || v.ctx == nil {
				return nil, fmt.Errorf("CUDA: launch %s: argument %d: nil host memory: %w", f.name, i, ErrInvalid)
			}
			p, err := v.DevicePtr()
			if err != nil {
				return nil, fmt.Errorf("CUDA: launch %s: argument %d: %w", f.name, i, err)
			}
			slots[i] = uint64(p)
			what = append(what, fmt.Sprintf("argument %d", i))
			holds = append(holds, &v.use)
		case int32:
			slots[i] = uint64(uint32(v))
		case uint32:
			slots[i] = uint64(v)
		case int64:
			slots[i] = uint64(v)
		case uint64:
			slots[i] = v
		case int:
			slots[i] = uint64(v)
		case uint:
			slots[i] = uint64(v)
		case uintptr:
			slots[i] = uint64(v)
		case float32:
			slots[i] = uint64(math.Float32bits(v))
		case float64:
			slots[i] = math.Float64bits(v)
		default:
			return nil, fmt.Errorf("CUDA: launch %s: argument %d: unsupported type %T: %w", f.name, i, a, ErrInvalid)
		}
		params[i] = unsafe.Pointer(&slots[i])
	}
	var pin runtime.Pinner
	pin.Pin(&slots[0])
	pin.Pin(&params[0])
	defer pin.Unpin()
	var pp unsafe.Pointer
	if len(args) > 0 {
		pp = unsafe.Pointer(&params[0])
	}
	g, b := cfg.Grid, cfg.Block
	t, err := s.issue("cuLaunchKernel", 1, what, holds, func() cuResult {
		return d.cuLaunchKernel(f.h, one(g.X), one(g.Y), one(g.Z), one(b.X), one(b.Y), one(b.Z), cfg.SharedMem, s.h, pp, nil)
	})
	runtime.KeepAlive(slots)
	runtime.KeepAlive(params)
	if err != nil {
		return nil, fmt.Errorf("CUDA: launch %s: %w", f.name, err)
	}
	t.n = 0
	return t, nil
}
