package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// cuFile (GPUDirect Storage) binding. Layouts follow cufile.h (CUDA 12.9 -
// 13.0) for LP64 Linux:
//
//	typedef struct CUfileError { CUfileOpError err; CUresult cu_err; } CUfileError_t;
//	  8 bytes, returned by value in RAX (x0 on arm64): err in the low 32 bits.
//	typedef struct CUfileDescr_t {
//	  CUfileFileHandleType type;          // offset 0, 4 bytes (+4 padding)
//	  union { int fd; void *handle; } handle; // offset 8, 8 bytes
//	  const CUfileFSOps_t *fs_ops;        // offset 16
//	} CUfileDescr_t;                      // 24 bytes
//	typedef struct CUfileDrvProps {
//	  struct { unsigned major_version, minor_version; size_t poll_thresh_size,
//	           max_direct_io_size; unsigned dstatusflags, dcontrolflags; } nvfs; // 0..32
//	  unsigned fflags, max_device_cache_size, per_buffer_cache_size,
//	           max_device_pinned_mem_size, max_batch_io_size,
//	           max_batch_io_timeout_msecs;                                     // 32..56
//	} CUfileDrvProps_t;
type cufileLib struct {
	path string

	driverOpen       func() uint64
	driverClose      func() uint64
	driverGetProps   func(p unsafe.Pointer) uint64
	handleRegister   func(fh *uintptr, descr unsafe.Pointer) uint64
	handleDeregister func(fh uintptr)
	bufRegister      func(p uintptr, n uintptr, flags int32) uint64
	bufDeregister    func(p uintptr) uint64
	getVersion       func(v *int32) uint64             // optional (cuFile >= 1.9)
	getParameterBool func(param int32, v *byte) uint64 // optional (cuFile >= 1.9)

	read uintptr // cuFileRead, called through callErrno to see errno
}

func (l *cufileLib) symbols() []symbol {
	s := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names} }
	opt := func(fptr any, names ...string) symbol { return symbol{fptr: fptr, names: names, optional: true} }
	return []symbol{
		s(&l.driverOpen, "cuFileDriverOpen"),
		// cufile.h maps cuFileDriverClose to cuFileDriverClose_v2.
		s(&l.driverClose, "cuFileDriverClose_v2", "cuFileDriverClose"),
		s(&l.driverGetProps, "cuFileDriverGetProperties"),
		s(&l.handleRegister, "cuFileHandleRegister"),
		s(&l.handleDeregister, "cuFileHandleDeregister"),
		s(&l.bufRegister, "cuFileBufRegister"),
		s(&l.bufDeregister, "cuFileBufDeregister"),
		opt(&l.getVersion, "cuFileGetVersion"),
		opt(&l.getParameterBool, "cuFileGetParameterBool"),
	}
}

const cuFileHandleTypeOpaqueFD = 1 // CU_FILE_HANDLE_TYPE_OPAQUE_FD

// cufileDescr is CUfileDescr_t for an fd (see the layout above).
type cufileDescr struct {
	typ   int32
	_     int32
	fd    int32 // the union's int member, at offset 8
	_     int32 // rest of the union (void *handle)
	fsOps uintptr
}

// cufileDrvProps is CUfileDrvProps_t, with slack for larger future layouts.
type cufileDrvProps struct {
	major, minor          uint32
	pollThresh, maxDirect uint64
	dstatus, dcontrol     uint32
	fflags                uint32
	maxDeviceCache        uint32
	perBufferCache        uint32
	maxPinned             uint32
	maxBatchIO            uint32
	batchTimeoutMs        uint32
	_                     [256]byte
}

// CUfileBoolConfigParameter_t values.
const (
	cuFileParamAllowCompatMode = 1 // CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE
	cuFileParamForceCompatMode = 2 // CUFILE_PARAM_FORCE_COMPAT_MODE
	cuFileParamUsePCIP2PDMA    = 7 // CUFILE_PARAM_USE_PCIP2PDMA
)

// Bits of CUfileDrvProps_t.nvfs.dstatusflags (CUfileDriverStatusFlags_t).
var cuFileFSFlags = []struct {
	bit  uint
	name string
}{
	{0, "lustre"}, {1, "wekafs"}, {2, "nfs"}, {3, "gpfs"}, {4, "nvme"},
	{5, "nvmeof"}, {6, "scsi"}, {7, "scaleflux-csd"}, {8, "nvmesh"},
	{9, "beegfs"}, {11, "nvme-p2p"}, {12, "scatefs"},
}

const cuFileNVMeP2PBit = 11 // CU_FILE_NVME_P2P_SUPPORTED

var (
	cufileOnce sync.Once
	cufile     *cufileLib
	cufileErr  error

	// cuFile driver state: open once, kept open until FileDriverClose.
	fileMu      sync.Mutex
	fileOpen    bool
	fileHandles int          // registered file handles
	fileBufs    atomic.Int64 // registered device buffers
)

func libcufileCandidates() []string {
	c := []string{
		"libcufile.so.0",
		"/usr/local/cuda/lib64/libcufile.so.0",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0",
		"/usr/local/cuda/targets/sbsa-linux/lib/libcufile.so.0",
	}
	for _, pat := range []string{
		"/usr/local/cuda-*/targets/*-linux/lib/libcufile.so.0",
		"/usr/local/cuda-*/lib64/libcufile.so.0",
	} {
		m, _ := filepath.Glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
		c = append(c, m...)
	}
	return c
}

// getCuFile loads libcufile once. The CUDA driver must be available first.
func getCuFile() (*driver, *cufileLib, error) {
	d, err := getDriver()
	if err != nil {
		return nil, nil, err
	}
	cufileOnce.Do(func() {
		h, path, err := dlopenFirst(libcufileCandidates())
		if err != nil {
			cufileErr = fmt.Errorf("%w: libcufile.so.0 not found: %v", ErrUnavailable, err)
			return
		}
		l := &cufileLib{path: path}
		if err := bindSymbols(h, l.symbols()); err != nil {
			cufileErr = fmt.Errorf("%w: %s: %v", ErrUnavailable, path, err)
			return
		}
		if l.read = lookupSymbol(h, "cuFileRead"); l.read == 0 {
			cufileErr = fmt.Errorf("%w: %s: missing symbol cuFileRead", ErrUnavailable, path)
			return
		}
		cufile = l
	})
	return d, cufile, cufileErr
}

// fileErr converts a CUfileError_t returned in a register.
func fileErr(d *driver, op string, r uint64) error {
	code := int(int32(uint32(r)))
	if code == 0 {
		return nil
	}
	fe := &FileError{Op: op, Code: code, Name: cuFileErrName(code)}
	if cu := int32(uint32(r >> 32)); cu != 0 {
		fe.CUDA = &Error{Op: op, Code: int(cu), Name: d.errName(cuResult(cu))}
	}
	return fe
}

// FileDriverOpen opens the cuFile driver (cuFileDriverOpen). It is opened
// at most once per process and stays open until FileDriverClose;
// HandleRegister and CuFileStatus open it when needed.
func FileDriverOpen() error {
	d, l, err := getCuFile()
	if err != nil {
		return err
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	return fileDriverOpenLocked(d, l)
}

func fileDriverOpenLocked(d *driver, l *cufileLib) error {
	if fileOpen {
		return nil
	}
	if err := fileErr(d, "cuFileDriverOpen", l.driverOpen()); err != nil {
		return err
	}
	fileOpen = true
	return nil
}

// FileDriverClose closes the cuFile driver (cuFileDriverClose). It returns
// ErrBusy while file handles or buffers are registered.
func FileDriverClose() error {
	d, l, err := getCuFile()
	if err != nil {
		return err
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	if !fileOpen {
		return nil
	}
	if fileHandles > 0 || fileBufs.Load() > 0 {
		return fmt.Errorf("cuFile: close driver: %w (%d handles, %d buffers registered)", ErrBusy, fileHandles, fileBufs.Load())
	}
	if err := fileErr(d, "cuFileDriverClose", l.driverClose()); err != nil {
		return err
	}
	fileOpen = false
	return nil
}

// FileDriverProps is CUfileDrvProps_t (sizes in KiB, as cuFile reports them).
type FileDriverProps struct {
	NvfsMajor, NvfsMinor uint32 // nvidia-fs version; 0.0 without the module
	PollThreshKB         uint64
	MaxDirectIOKB        uint64
	StatusFlags          uint32 // CUfileDriverStatusFlags_t bits
	ControlFlags         uint32 // CUfileDriverControlFlags_t bits
	FeatureFlags         uint32 // CUfileFeatureFlags_t bits
	MaxDeviceCacheKB     uint32
	PerBufferCacheKB     uint32
	MaxDevicePinnedKB    uint32
	MaxBatchIOSize       uint32
	MaxBatchIOTimeoutMs  uint32
}

// Filesystems lists the storage types the driver reports as GDS-capable
// (dstatusflags), e.g. ["nvme"].
func (p FileDriverProps) Filesystems() []string {
	var fs []string
	for _, f := range cuFileFSFlags {
		if p.StatusFlags&(1<<f.bit) != 0 {
			fs = append(fs, f.name)
		}
	}
	return fs
}

// CompatAllowed reports CU_FILE_ALLOW_COMPAT_MODE in the control flags.
func (p FileDriverProps) CompatAllowed() bool { return p.ControlFlags&(1<<1) != 0 }

// PollMode reports CU_FILE_USE_POLL_MODE in the control flags.
func (p FileDriverProps) PollMode() bool { return p.ControlFlags&(1<<0) != 0 }

// FileDriverProperties opens the driver if needed and returns its
// properties (cuFileDriverGetProperties).
func FileDriverProperties() (FileDriverProps, error) {
	d, l, err := getCuFile()
	if err != nil {
		return FileDriverProps{}, err
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	if err := fileDriverOpenLocked(d, l); err != nil {
		return FileDriverProps{}, err
	}
	return fileDriverPropsLocked(d, l)
}

func fileDriverPropsLocked(d *driver, l *cufileLib) (FileDriverProps, error) {
	var p cufileDrvProps
	if err := fileErr(d, "cuFileDriverGetProperties", l.driverGetProps(unsafe.Pointer(&p))); err != nil {
		return FileDriverProps{}, err
	}
	return FileDriverProps{
		NvfsMajor: p.major, NvfsMinor: p.minor,
		PollThreshKB: p.pollThresh, MaxDirectIOKB: p.maxDirect,
		StatusFlags: p.dstatus, ControlFlags: p.dcontrol, FeatureFlags: p.fflags,
		MaxDeviceCacheKB: p.maxDeviceCache, PerBufferCacheKB: p.perBufferCache,
		MaxDevicePinnedKB: p.maxPinned, MaxBatchIOSize: p.maxBatchIO,
		MaxBatchIOTimeoutMs: p.batchTimeoutMs,
	}, nil
}

// CuFileMode is how cuFile moves data on this machine.
type CuFileMode string

const (
	// CuFileNative: GPUDirect Storage through the nvidia-fs kernel module;
	// storage DMAs straight into GPU memory.
	CuFileNative CuFileMode = "native"
	// CuFileP2PDMA: GPUDirect Storage through the kernel's PCI P2PDMA
	// (use_pci_p2pdma, NVMe), without nvidia-fs.
	CuFileP2PDMA CuFileMode = "p2pdma"
	// CuFileCompat: compatibility mode: cuFile reads into host bounce
	// buffers and copies to the GPU. Correct, but not GDS.
	CuFileCompat CuFileMode = "compat"
	// CuFileAbsent: cuFile cannot be used (no library, no GPU, driver open
	// failed, or compat mode disallowed without nvidia-fs/P2PDMA).
	CuFileAbsent CuFileMode = "absent"
)

// CuFileInfo says what cuFile can do here, and why.
type CuFileInfo struct {
	Mode   CuFileMode
	Reason string

	Library     string           // libcufile path loaded
	Version     int              // cuFileGetVersion (e.g. 1150 = 1.15), 0 if unknown
	NvidiaFS    bool             // /proc/driver/nvidia-fs exists (module loaded)
	UdevData    bool             // /run/udev exists: cuFile needs it to identify a file's block device
	ConfigPath  string           // cufile.json consulted
	AllowCompat bool             // allow_compat_mode (effective)
	ForceCompat bool             // force_compat_mode or CUFILE_FORCE_COMPAT_MODE
	PCIP2PDMA   bool             // use_pci_p2pdma (effective)
	Props       *FileDriverProps // nil if the driver could not be opened
}

const (
	nvidiaFSProc = "/proc/driver/nvidia-fs"
	udevDir      = "/run/udev"
)

// CuFileStatus reports cuFile's mode and the reason for it. It loads
// libcufile and opens the cuFile driver (leaving it open, as HandleRegister
// would). Where cuFile cannot be used it returns Mode "absent", the reason,
// and an error wrapping ErrUnavailable.
func CuFileStatus() (CuFileInfo, error) {
	var in CuFileInfo
	_, statErr := os.Stat(nvidiaFSProc)
	in.NvidiaFS = statErr == nil
	_, statErr = os.Stat(udevDir)
	in.UdevData = statErr == nil
	cfg := readCuFileConfig()
	in.ConfigPath = cfg.path

	absent := func(reason string, cause error) (CuFileInfo, error) {
		in.Mode = CuFileAbsent
		in.Reason = reason
		if errors.Is(cause, ErrUnavailable) {
			return in, cause
		}
		return in, fmt.Errorf("%w: cufile: %s", ErrUnavailable, reason)
	}

	d, l, err := getCuFile()
	if err != nil {
		return absent(strings.TrimPrefix(err.Error(), ErrUnavailable.Error()+": "), err)
	}
	in.Library = l.path
	if l.getVersion != nil {
		var v int32
		if fileErr(d, "cuFileGetVersion", l.getVersion(&v)) == nil {
			in.Version = int(v)
		}
	}

	// Effective settings: the library's view where it offers one, else
	// the config file, else cuFile's documented defaults.
	in.AllowCompat = cfg.allowCompat
	in.PCIP2PDMA = cfg.p2pdma
	in.ForceCompat = cfg.forceCompat
	if l.getParameterBool != nil {
		var b byte
		if fileErr(d, "cuFileGetParameterBool", l.getParameterBool(cuFileParamAllowCompatMode, &b)) == nil {
			in.AllowCompat = b != 0
		}
		if fileErr(d, "cuFileGetParameterBool", l.getParameterBool(cuFileParamUsePCIP2PDMA, &b)) == nil {
			in.PCIP2PDMA = b != 0
		}
		if fileErr(d, "cuFileGetParameterBool", l.getParameterBool(cuFileParamForceCompatMode, &b)) == nil {
			in.ForceCompat = in.ForceCompat || b != 0
		}
	}
	if v := strings.ToLower(os.Getenv("CUFILE_FORCE_COMPAT_MODE")); v == "true" || v == "1" {
		in.ForceCompat = true
	}

	fileMu.Lock()
	openErr := fileDriverOpenLocked(d, l)
	var props FileDriverProps
	var propsErr error
	if openErr == nil {
		props, propsErr = fileDriverPropsLocked(d, l)
	}
	fileMu.Unlock()

	nvfsWhy := "no " + nvidiaFSProc + " (nvidia-fs module not loaded)"
	if in.NvidiaFS {
		nvfsWhy = nvidiaFSProc + " present"
	}
	p2pWhy := "use_pci_p2pdma=false"
	if in.PCIP2PDMA {
		p2pWhy = "use_pci_p2pdma=true"
	}
	if openErr != nil {
		return absent(fmt.Sprintf("cuFileDriverOpen failed: %v; %s, %s, allow_compat_mode=%t", openErr, nvfsWhy, p2pWhy, in.AllowCompat), openErr)
	}
	if propsErr != nil {
		return absent(fmt.Sprintf("cuFileDriverGetProperties failed: %v", propsErr), propsErr)
	}
	in.Props = &props
	if props.CompatAllowed() {
		in.AllowCompat = true
	}
	fs := strings.Join(props.Filesystems(), ",")
	if fs == "" {
		fs = "none"
	}

	switch {
	case in.ForceCompat:
		in.Mode = CuFileCompat
		in.Reason = "force_compat_mode is set: cuFile uses host bounce buffers even where GDS would work"
	case in.NvidiaFS && props.NvfsMajor > 0:
		in.Mode = CuFileNative
		in.Reason = fmt.Sprintf("nvidia-fs %d.%d loaded; GDS-capable storage: %s (a file on other storage still falls back to compat)", props.NvfsMajor, props.NvfsMinor, fs)
	case in.PCIP2PDMA && props.StatusFlags&(1<<cuFileNVMeP2PBit) != 0:
		in.Mode = CuFileP2PDMA
		in.Reason = fmt.Sprintf("PCI P2PDMA enabled (use_pci_p2pdma) and the driver reports NVMe P2P support; %s", nvfsWhy)
	case in.AllowCompat:
		in.Mode = CuFileCompat
		why := nvfsWhy
		if in.NvidiaFS {
			why = "nvidia-fs present but the driver reports no nvfs version"
		}
		if in.PCIP2PDMA {
			p2pWhy = "use_pci_p2pdma=true but the driver reports no NVMe P2P support"
		}
		in.Reason = fmt.Sprintf("compatibility mode: %s; %s; allow_compat_mode=true, so cuFile reads go through host bounce buffers, not GPUDirect", why, p2pWhy)
	default:
		return absent(fmt.Sprintf("%s, %s and allow_compat_mode=false", nvfsWhy, p2pWhy), nil)
	}
	if !in.UdevData {
		in.Reason += "; no " + udevDir + ": cuFile cannot identify block devices and refuses to register files on them (CU_FILE_HANDLE_NOT_REGISTERED); use CuFileProbe on the data directory"
	}
	return in, nil
}

// FileHandle is a file registered with cuFile (cuFileHandleRegister). It
// does not own the fd: Close deregisters, and the caller closes the fd
// afterwards. For native GDS the fd should be opened with O_DIRECT.
type FileHandle struct {
	d   *driver
	l   *cufileLib
	h   uintptr
	fd  int
	use useCount
}

// HandleRegister registers fd with cuFile (CU_FILE_HANDLE_TYPE_OPAQUE_FD),
// opening the cuFile driver first if needed.
func HandleRegister(fd int) (*FileHandle, error) {
	d, l, err := getCuFile()
	if err != nil {
		return nil, err
	}
	if fd < 0 {
		return nil, fmt.Errorf("cuFile: register fd %d: %w", fd, ErrInvalid)
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	if err := fileDriverOpenLocked(d, l); err != nil {
		return nil, err
	}
	descr := cufileDescr{typ: cuFileHandleTypeOpaqueFD, fd: int32(fd)}
	var h uintptr
	if err := fileErr(d, "cuFileHandleRegister", l.handleRegister(&h, unsafe.Pointer(&descr))); err != nil {
		return nil, fmt.Errorf("cuFile: register fd %d: %w", fd, err)
	}
	fileHandles++
	return &FileHandle{d: d, l: l, h: h, fd: fd}, nil
}

// Fd returns the registered file descriptor.
func (h *FileHandle) Fd() int {
	if h == nil {
		return -1
	}
	return h.fd
}

// Read reads size bytes at fileOffset into dst at dstOffset (cuFileRead)
// and returns the number of bytes read (short at end of file). It is
// synchronous and can take long: run it in its own goroutine. dst stays
// busy (Free returns ErrBusy) during the read. dst's context is made
// current on the calling thread for the call.
func (h *FileHandle) Read(dst *DeviceMem, size int, fileOffset int64, dstOffset int) (int, error) {
	if h == nil || h.l == nil || dst == nil || dst.ctx == nil {
		return 0, invalid("cufile read")
	}
	if err := checkRange("cufile read", dst.size, dstOffset, size); err != nil {
		return 0, err
	}
	if fileOffset < 0 {
		return 0, fmt.Errorf("cuFile: read at %d: %w", fileOffset, ErrInvalid)
	}
	if size == 0 {
		return 0, nil
	}
	us := []*useCount{&h.use, &dst.use}
	if err := acquireAll([]string{"file handle", "device memory"}, us); err != nil {
		return 0, err
	}
	defer releaseAll(us)
	if err := dst.ctx.enter(); err != nil {
		return 0, err
	}
	r, errno := callErrno(h.l.read, h.h, dst.ptr, uintptr(size), uintptr(fileOffset), uintptr(dstOffset))
	dst.ctx.leave()
	n := int64(r)
	switch {
	case n >= 0:
		return int(n), nil
	case n == -1 && errno != 0:
		return 0, fmt.Errorf("cuFile: cuFileRead fd %d at %d: %w", h.fd, fileOffset, syscall.Errno(errno))
	case n == -1:
		return 0, fmt.Errorf("cuFile: cuFileRead fd %d at %d: returned -1 without errno: %w", h.fd, fileOffset, syscall.EIO)
	default:
		code := int(-n)
		return 0, &FileError{Op: "cuFileRead", Code: code, Name: cuFileErrName(code)}
	}
}

// Close deregisters the handle (cuFileHandleDeregister). ErrBusy while
// reads are in progress.
func (h *FileHandle) Close() error {
	if h == nil || h.l == nil {
		return invalid("cufile close handle")
	}
	if err := h.use.markFreed("cufile close handle"); err != nil {
		return err
	}
	h.l.handleDeregister(h.h)
	fileMu.Lock()
	fileHandles--
	fileMu.Unlock()
	return nil
}

// BufRegister registers device memory with cuFile (cuFileBufRegister), so
// that reads into it can DMA directly (and, in compat mode, avoid an extra
// internal buffer). Free deregisters it automatically.
func BufRegister(m *DeviceMem) error {
	d, l, err := getCuFile()
	if err != nil {
		return err
	}
	if m == nil || m.ctx == nil {
		return invalid("cufile register buffer")
	}
	if err := m.use.acquire("device memory"); err != nil {
		return err
	}
	defer m.use.release()
	fileMu.Lock()
	err = fileDriverOpenLocked(d, l)
	fileMu.Unlock()
	if err != nil {
		return err
	}
	if m.fileReg.Load() {
		return fmt.Errorf("cuFile: register buffer %#x: %w", m.ptr, &FileError{Op: "cuFileBufRegister", Code: cuFileBaseErr + 23, Name: cuFileErrName(cuFileBaseErr + 23)})
	}
	if err := m.ctx.enter(); err != nil {
		return err
	}
	r := l.bufRegister(m.ptr, uintptr(m.size), 0)
	m.ctx.leave()
	if err := fileErr(d, "cuFileBufRegister", r); err != nil {
		return fmt.Errorf("cuFile: register buffer %#x+%d: %w", m.ptr, m.size, err)
	}
	m.fileReg.Store(true)
	fileBufs.Add(1)
	return nil
}

// BufDeregister undoes BufRegister (cuFileBufDeregister). ErrBusy while
// reads into m are in progress.
func BufDeregister(m *DeviceMem) error {
	if _, _, err := getCuFile(); err != nil {
		return err
	}
	if m == nil || m.ctx == nil {
		return invalid("cufile deregister buffer")
	}
	if n := m.use.busy(); n > 0 {
		return fmt.Errorf("cuFile: deregister buffer: %w (%d in flight)", ErrBusy, n)
	}
	if !m.fileReg.Swap(false) {
		return fmt.Errorf("cuFile: deregister buffer %#x: %w", m.ptr, &FileError{Op: "cuFileBufDeregister", Code: cuFileBaseErr + 24, Name: cuFileErrName(cuFileBaseErr + 24)})
	}
	return fileBufDeregister(m)
}

func fileBufDeregister(m *DeviceMem) error {
	d, l, err := getCuFile()
	if err != nil {
		return err
	}
	fileBufs.Add(-1)
	if err := m.ctx.enter(); err != nil {
		return err
	}
	r := l.bufDeregister(m.ptr)
	m.ctx.leave()
	return fileErr(d, "cuFileBufDeregister", r)
}

// CuFileProbe reports whether cuFile can register files that live in dir:
// it creates a small temporary file there (O_DIRECT where the file system
// allows it), registers it with HandleRegister, and removes it. Mode
// "compat" says the driver opened; it does not promise that every file
// system works: cuFile looks up each file's block device (through udev)
// and refuses files whose device it cannot identify, as on a virtio disk
// in a container without udev data.
func CuFileProbe(dir string) error {
	if _, _, err := getCuFile(); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".kylix-cufile-probe-*")
	if err != nil {
		return fmt.Errorf("cuFile: probe %s: %w", dir, err)
	}
	name := f.Name()
	defer os.Remove(name)
	_, werr := f.Write(make([]byte, 4096))
	f.Close()
	if werr != nil {
		return fmt.Errorf("cuFile: probe %s: %w", dir, werr)
	}
	fd, err := syscall.Open(name, syscall.O_RDONLY|oDirect, 0)
	if err != nil {
		if fd, err = syscall.Open(name, syscall.O_RDONLY, 0); err != nil {
			return fmt.Errorf("cuFile: probe %s: %w", dir, err)
		}
	}
	defer syscall.Close(fd)
	h, err := HandleRegister(fd)
	if err != nil {
		return fmt.Errorf("cuFile: probe %s: %w", dir, err)
	}
	return h.Close()
}
