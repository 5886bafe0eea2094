package cuda

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC (the CUDA runtime compiler, libnvrtc.so) bound at run time, like the
// driver: CUDA C source becomes PTX or a CUBIN in-process, with no nvcc and
// no cgo. Signatures (nvrtc.h, CUDA 12-13):
//
//	nvrtcResult nvrtcVersion(int *major, int *minor);
//	const char *nvrtcGetErrorString(nvrtcResult r);
//	nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name,
//	                               int numHeaders, const char * const *headers,
//	                               const char * const *includeNames);
//	nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p);
//	nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int numOptions, const char * const *options);
//	nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n);   nvrtcGetPTX(p, char *ptx);
//	nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n); nvrtcGetCUBIN(p, char *cubin);
//	nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n); nvrtcGetProgramLog(p, char *log);
type nvrtcLib struct {
	path string

	version        func(major, minor *int32) int32
	errorString    func(r int32) string
	createProgram  func(p *uintptr, src, name string, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	destroyProgram func(p *uintptr) int32
	compileProgram func(p uintptr, numOptions int32, options unsafe.Pointer) int32
	getPTXSize     func(p uintptr, n *uintptr) int32
	getPTX         func(p uintptr, out unsafe.Pointer) int32
	getCUBINSize   func(p uintptr, n *uintptr) int32 // optional (CUDA >= 11.1)
	getCUBIN       func(p uintptr, out unsafe.Pointer) int32
	getLogSize     func(p uintptr, n *uintptr) int32
	getLog         func(p uintptr, out unsafe.Pointer) int32
}

func (l *nvrtcLib) symbols() []symbol {
	s := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names} }
	opt := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names, optional: true} }
	return []symbol{
		s(&l.version, "nvrtcVersion"),
		s(&l.errorString, "nvrtcGetErrorString"),
		s(&l.createProgram, "nvrtcCreateProgram"),
		s(&l.destroyProgram, "nvrtcDestroyProgram"),
		s(&l.compileProgram, "nvrtcCompileProgram"),
		s(&l.getPTXSize, "nvrtcGetPTXSize"),
		s(&l.getPTX, "nvrtcGetPTX"),
		opt(&l.getCUBINSize, "nvrtcGetCUBINSize"),
		opt(&l.getCUBIN, "nvrtcGetCUBIN"),
		s(&l.getLogSize, "nvrtcGetProgramLogSize"),
		s(&l.getLog, "nvrtcGetProgramLog"),
	}
}

var (
	nvrtcOnce sync.Once
	nvrtc     *nvrtcLib
	nvrtcErr  error
)

// libnvrtcCandidates lists where libnvrtc may be: the loader's search
// first (LD_LIBRARY_PATH, ld.so.cache), then the CUDA toolkit's usual
// directories, newest toolkit first.
func libnvrtcCandidates() []string {
	c := []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}
	for _, dir := range []string{
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/local/cuda/targets/sbsa-linux/lib",
	} {
		for _, n := range []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"} {
			c = append(c, filepath.Join(dir, n))
		}
	}
	for _, pat := range []string{
		"/usr/local/cuda-*/targets/*-linux/lib/libnvrtc.so*",
		"/usr/local/cuda-*/lib64/libnvrtc.so*",
	} {
		m, _ := filepath.Glob(pat)
		var keep []string
		for _, p := range m {
			if !strings.Contains(filepath.Base(p), "builtins") && !strings.HasSuffix(p, ".alt.so") {
				keep = append(keep, p)
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(keep))) // newest version first
		c = append(c, keep...)
	}
	return c
}

// getNVRTC loads libnvrtc once. The driver is not needed to compile, but a
// test that simulates a machine without CUDA (SetUnavailableForTest) makes
// NVRTC unavailable too.
func getNVRTC() (*nvrtcLib, error) {
	if h := driverHook.Load(); h != nil {
		if _, err := (*h)(); err != nil {
			return nil, err
		}
	}
	nvrtcOnce.Do(func() {
		h, path, err := dlopenFirst(libnvrtcCandidates())
		if err != nil {
			nvrtcErr = fmt.Errorf("%w: NVRTC library (libnvrtc.so) not found: %v", ErrUnavailable, err)
			return
		}
		l := &nvrtcLib{path: path}
		if err := bindSymbols(h, l.symbols()); err != nil {
			nvrtcErr = fmt.Errorf("%w: %s: %v", ErrUnavailable, path, err)
			return
		}
		preloadNVRTCBuiltins()
		nvrtc = l
	})
	return nvrtc, nvrtcErr
}

// preloadNVRTCBuiltins opens libnvrtc-builtins from the directory libnvrtc
// was loaded from. NVRTC dlopens it by soname at compile time; when that
// directory is not on the loader's path the compile fails with
// NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Once it is loaded, the soname
// lookup finds the loaded copy.
func preloadNVRTCBuiltins() {
	dir := loadedLibDir("libnvrtc.so")
	if dir == "" {
		return
	}
	m, _ := filepath.Glob(filepath.Join(dir, "libnvrtc-builtins.so*"))
	sort.Sort(sort.Reverse(sort.StringSlice(m)))
	for _, p := range m {
		if _, _, err := dlopenFirst([]string{p}); err == nil {
			return
		}
	}
}

// loadedLibDir returns the directory of a loaded shared object whose file
// name starts with prefix, from /proc/self/maps ("" if none).
func loadedLibDir(prefix string) string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		p := fields[len(fields)-1]
		if strings.HasPrefix(filepath.Base(p), prefix) {
			return filepath.Dir(p)
		}
	}
	return ""
}

// NVRTCError is a failed NVRTC call. For a compilation error (nvrtcResult
// NVRTC_ERROR_COMPILATION, 6) Log holds the compiler's messages.
type NVRTCError struct {
	Op   string // e.g. "nvrtcCompileProgram"
	Code int    // nvrtcResult
	Name string // nvrtcGetErrorString, e.g. "NVRTC_ERROR_COMPILATION"
	Log  string // the program log, where there is one
}

func (e *NVRTCError) Error() string {
	s := fmt.Sprintf("nvrtc: %s: %s (%d)", e.Op, e.Name, e.Code)
	if e.Log != "" {
		s += ":\n" + e.Log
	}
	return s
}

// Is lets errors.Is(err, ErrOutOfMemory) match NVRTC_ERROR_OUT_OF_MEMORY.
func (e *NVRTCError) Is(target error) bool {
	return target == ErrOutOfMemory && e.Code == 1
}

func (l *nvrtcLib) err(op string, r int32) error {
	if r == 0 {
		return nil
	}
	return &NVRTCError{Op: op, Code: int(r), Name: l.errorString(r)}
}

// NVRTCAvailable reports whether libnvrtc is loaded: nil, or an error
// wrapping ErrUnavailable that says why not. The first call loads it.
func NVRTCAvailable() error {
	_, err := getNVRTC()
	return err
}

// NVRTCPath returns the name or path libnvrtc was loaded by.
func NVRTCPath() (string, error) {
	l, err := getNVRTC()
	if err != nil {
		return "", err
	}
	if dir := loadedLibDir("libnvrtc.so"); dir != "" && !strings.Contains(l.path, "/") {
		return l.path + " (" + dir + ")", nil
	}
	return l.path, nil
}

// NVRTCVersion returns NVRTC's version (nvrtcVersion), e.g. 13, 0.
func NVRTCVersion() (major, minor int, err error) {
	l, err := getNVRTC()
	if err != nil {
		return 0, 0, err
	}
	var ma, mi int32
	if err := l.err("nvrtcVersion", l.version(&ma, &mi)); err != nil {
		return 0, 0, err
	}
	return int(ma), int(mi), nil
}

// CompileOptions configures Compile.
type CompileOptions struct {
	// Arch is the target: "sm_90" makes SASS for exactly that GPU
	// (with CUBIN) or PTX for it; "compute_90" makes PTX that the driver
	// compiles (JIT) when the module is loaded. Empty: NVRTC's default
	// (PTX for its oldest supported architecture).
	Arch string
	// CUBIN asks for a CUBIN (nvrtcGetCUBIN) instead of PTX; it needs an
	// sm_XX Arch. A CUBIN loads without a driver JIT step, and does not
	// depend on the driver accepting this NVRTC's PTX version.
	CUBIN bool
	// Options are further nvrtc options, e.g. "-O3", "--use_fast_math",
	// "-default-device", "-DNAME=value".
	Options []string
}

// Arch returns the device's architecture name for NVRTC, "sm_<major><minor>"
// ("sm_90" on an H100/H200).
func (dev Device) Arch() (string, error) {
	ma, mi, err := dev.ComputeCapability()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("sm_%d%d", ma, mi), nil
}

// Compile compiles CUDA C++ source with NVRTC and returns the image (PTX
// text, NUL-terminated, or a CUBIN) for Context.LoadModule, and the
// compiler's log (warnings; may be empty). name is the program's name in
// messages. A compilation error is an *NVRTCError with the log. Without
// libnvrtc the error wraps ErrUnavailable. The source cannot #include
// system headers (NVRTC has no toolkit include path here): use built-in
// types (unsigned int, unsigned long long) in place of <stdint.h>.
func Compile(src, name string, o CompileOptions) (image []byte, log string, err error) {
	l, err := getNVRTC()
	if err != nil {
		return nil, "", err
	}
	if o.CUBIN && (l.getCUBIN == nil || l.getCUBINSize == nil) {
		return nil, "", fmt.Errorf("%w: %s has no nvrtcGetCUBIN", ErrUnavailable, l.path)
	}
	if o.CUBIN && !strings.HasPrefix(o.Arch, "sm_") {
		return nil, "", fmt.Errorf("CUDA: compile %s: a CUBIN needs an sm_XX architecture, not %q: %w", name, o.Arch, ErrInvalid)
	}
	if name == "" {
		name = "kernel.cu"
	}
	var prog uintptr
	if err := l.err("nvrtcCreateProgram", l.createProgram(&prog, src, name, 0, nil, nil)); err != nil {
		return nil, "", err
	}
	defer l.destroyProgram(&prog)

	opts := append([]string(nil), o.Options...)
	if o.Arch != "" {
		opts = append(opts, "--gpu-architecture="+o.Arch)
	}
	// The option strings and the array of their addresses live in Go
	// memory that is kept alive (and does not move: it is heap memory)
	// until the call returns. The array holds the addresses as uintptr so
	// that the GC never scans them; the strings are kept by cstrs.
	cstrs := make([][]byte, len(opts))
	ptrs := make([]uintptr, len(opts)+1)
	for i, s := range opts {
		cstrs[i] = append([]byte(s), 0)
		ptrs[i] = uintptr(unsafe.Pointer(&cstrs[i][0]))
	}
	r := l.compileProgram(prog, int32(len(opts)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstrs)
	runtime.KeepAlive(ptrs)
	log = programLog(l, prog)
	if r != 0 {
		e := l.err("nvrtcCompileProgram", r).(*NVRTCError)
		e.Log = log
		return nil, log, fmt.Errorf("CUDA: compile %s (%s): %w", name, strings.Join(opts, " "), e)
	}
	sizeFn, getFn, op := l.getPTXSize, l.getPTX, "nvrtcGetPTX"
	if o.CUBIN {
		sizeFn, getFn, op = l.getCUBINSize, l.getCUBIN, "nvrtcGetCUBIN"
	}
	var n uintptr
	if err := l.err(op+"Size", sizeFn(prog, &n)); err != nil {
		return nil, log, err
	}
	if n == 0 {
		return nil, log, fmt.Errorf("CUDA: compile %s: %s returned nothing: %w", name, op, ErrInvalid)
	}
	out := make([]byte, n+1) // +1: PTX must be NUL-terminated for cuModuleLoadData
	if err := l.err(op, getFn(prog, unsafe.Pointer(&out[0]))); err != nil {
		return nil, log, err
	}
	return out, log, nil
}

func programLog(l *nvrtcLib, prog uintptr) string {
	var n uintptr
	if l.getLogSize(prog, &n) != 0 || n <= 1 {
		return ""
	}
	b := make([]byte, n)
	if l.getLog(prog, unsafe.Pointer(&b[0])) != 0 {
		return ""
	}
	return strings.TrimSpace(bufString(b))
}
