package gpuio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
)

// Path is how bytes travel from storage to the device.
type Path string

// Paths, fastest first.
const (
	PathAuto      Path = "auto"
	PathGDS       Path = "gds"
	PathGDSCompat Path = "gds-compat"
	PathUnified   Path = "unified"
	PathBounce    Path = "bounce"
)

// IOMode says how the bounce and unified paths read storage.
type IOMode string

// IO modes.
const (
	// IOAuto copies what is resident in the page cache through the pinned
	// buffers and reads what is not with O_DIRECT (decided per read with
	// mincore).
	IOAuto IOMode = "auto"
	// IODirect reads everything with O_DIRECT into pinned buffers.
	IODirect IOMode = "direct"
	// IOBuffered reads everything through the page cache into pinned buffers.
	IOBuffered IOMode = "buffered"
	// IOMapped copies straight from the page cache: the pack is mapped and
	// the mapping registered with the device once, so later loads of the
	// pack by the same loader take no CPU at all when chunks are verified
	// on the device (data not in the page cache is faulted in). For
	// long-lived loaders that load the same packs again.
	IOMapped IOMode = "mapped"
)

// VerifyOn says where chunks are hashed.
type VerifyOn string

// Where chunks are verified.
const (
	VerifyAuto   VerifyOn = "auto"
	VerifyCPU    VerifyOn = "cpu"
	VerifyDevice VerifyOn = "device"
)

// ErrStrict reports that the path asked for is unavailable and Strict forbids
// taking a slower one.
var ErrStrict = errors.New("the path asked for is not available (strict)")

// ErrNotLocal reports that a chunk is neither stored on this node nor
// fetched from the members (a store alone, or no member sent it): the
// store's sentinel (chunkstore.ErrNotLocal), so errors.Is works with either.
var ErrNotLocal = chunkstore.ErrNotLocal

// Options configure a Loader. Zero values mean the defaults.
type Options struct {
	// Path to use; PathAuto picks the fastest available.
	Path Path
	// Strict fails instead of falling back to a slower path than Path.
	Strict bool
	// IO chooses page cache or O_DIRECT reads (default IOAuto).
	IO IOMode
	// CacheColdReads: with IOAuto, bytes not in the page cache are read
	// through it instead of with O_DIRECT, so that the next load of them
	// is a warm one. Set it when the caller's whole load fits the page
	// cache without evicting everything else (FitsPageCache); a load too
	// large for that reads them with O_DIRECT and leaves the cache to the
	// rest of the machine (docs/design/gpuio.md, "One page-cache policy").
	CacheColdReads bool
	// BufferSize is the size of each pinned buffer (default 16 MiB + 8 KiB:
	// a whole 16 MiB tensor chunk with 4 KiB alignment slack on both sides).
	// A chunk larger than BufferSize-8 KiB cannot be loaded.
	BufferSize int
	// Buffers is the number of pinned buffers, which bounds both the
	// pinned memory used (Buffers x BufferSize) and the reads, hashes and
	// copies in flight. Default: 2 per core, at least 4, at most 32.
	Buffers int
	// NoVerify skips re-hashing chunks on the way (results say so).
	NoVerify bool
	// VerifyOn says where chunks are hashed: VerifyAuto (the device when it
	// can, else the CPU), VerifyCPU or VerifyDevice (an error if it cannot).
	VerifyOn VerifyOn
	// Reader is the storage reader (default: a pread pool with one worker
	// per buffer; pass the store's Reader() for io_uring).
	Reader storeio.Reader
	// Pinned, when set, is a node's locked pack ranges: the loader
	// registers them with its device (New) and copies bytes inside them
	// straight from there; Close unregisters them.
	Pinned *PinnedHost
}

// Result reports one load.
type Result struct {
	Path     Path          `json:"path"`
	IO       string        `json:"io"`                    // how storage was read: "O_DIRECT", "page cache", "page cache (mapped)", "page cache (pinned)", "page cache (pinned, verified)" (chunks hashed when pinned, not again), "cufile", "unified", joined with " + "
	Bytes    int64         `json:"bytes"`                 // bytes placed on the device
	Read     int64         `json:"read_bytes"`            // bytes read from storage (whole chunks, alignment)
	Duration time.Duration `json:"duration_ns"`           //
	Verified bool          `json:"verified"`              // every chunk re-hashed before use
	VerifyOn string        `json:"verified_on,omitempty"` // "cpu" or "device"
	Note     string        `json:"note,omitempty"`        // why this path and not a faster one
	// Fetched and FetchedChunks: the bytes (whole chunks) and chunks not
	// stored here that were fetched from the members during the load
	// (a cluster member), verified on arrival; part of Read.
	Fetched       int64 `json:"fetched_bytes,omitempty"`
	FetchedChunks int   `json:"fetched_chunks,omitempty"`
}

// GBps is Bytes over Duration in GB/s (10^9).
func (r Result) GBps() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Duration.Seconds() / 1e9
}

// Loader loads stored files into one device. It is safe for concurrent use;
// concurrent loads share its buffers.
type Loader struct {
	st   *chunkstore.Store
	dev  Device
	opts Options
	path Path
	note string
	io   storeio.Reader
	// ownReader: io was made by New and is closed by Close.
	ownReader bool
	// verifier hashes chunks on the device; nil: on the CPU (or not at all).
	verifier   DeviceVerifier
	verifyNote string

	free    chan PinnedMem
	streams chan Stream
	stage   chan DeviceMem // gds: device staging buffers
	all     []PinnedMem

	mu    sync.Mutex
	packs map[uint64]*packFiles
	gds   map[uint64]GDSFile
}

type packFiles struct {
	buffered *os.File
	direct   *os.File
	mapped   []byte

	regOnce sync.Once
	reg     PinnedMem // mapped, registered with the device (IOMapped)
	regErr  error
}

// registered returns the pack's mapping registered with the device,
// registering it on first use. Registering pins every page of the pack (about
// as long as copying it once: 21 GB/s against 28 GB/s for a first load of 8 GiB
// on the H200 machine), so it pays off for loaders that load a pack again
// (a node); IOAuto copies instead.
func (l *Loader) registered(pf *packFiles) (PinnedMem, error) {
	pf.regOnce.Do(func() {
		hr, ok := l.dev.(HostRegisterer)
		switch {
		case !ok:
			pf.regErr = fmt.Errorf("device %s cannot register host memory", l.dev)
		case pf.mapped == nil:
			pf.regErr = fmt.Errorf("pack is not mapped")
		default:
			pf.reg, pf.regErr = hr.RegisterReadOnly(pf.mapped)
		}
	})
	return pf.reg, pf.regErr
}

// New prepares a loader: resolves the path (failing in strict mode if it is
// unavailable) and allocates the pinned buffers.
func New(st *chunkstore.Store, dev Device, opts Options) (*Loader, error) {
	if opts.Path == "" {
		opts.Path = PathAuto
	}
	switch opts.IO {
	case "":
		opts.IO = IOAuto
	case IOAuto, IODirect, IOBuffered, IOMapped:
	default:
		return nil, fmt.Errorf("unknown IO mode %q (want auto, direct, buffered or mapped)", opts.IO)
	}
	if opts.BufferSize <= 0 {
		opts.BufferSize = 16<<20 + 2*storeio.BlockSize
	}
	opts.BufferSize = int(storeio.AlignUp(int64(opts.BufferSize)))
	if opts.Buffers <= 0 {
		opts.Buffers = min(32, max(4, 2*runtime.GOMAXPROCS(0)))
	}
	ownReader := false
	if opts.Reader == nil {
		// One read per buffer in flight: a pread pool as wide as the buffers
		// keeps as many reads going as io_uring would, and page-cache copies
		// then run on every core instead of inside one ring's submit call.
		opts.Reader = storeio.NewPread(opts.Buffers)
		ownReader = true
	}
	l := &Loader{st: st, dev: dev, opts: opts, io: opts.Reader, ownReader: ownReader, packs: map[uint64]*packFiles{}, gds: map[uint64]GDSFile{}}
	var err error
	if l.path, l.note, err = resolvePath(dev, filepath.Join(st.Dir(), "packs"), opts.Path, opts.Strict); err != nil {
		return nil, err
	}
	if err := l.resolveVerify(); err != nil {
		return nil, err
	}
	l.free = make(chan PinnedMem, opts.Buffers)
	l.streams = make(chan Stream, opts.Buffers)
	for range opts.Buffers {
		p, err := dev.AllocPinned(opts.BufferSize)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("allocate %d pinned buffers of %d bytes: %w", opts.Buffers, opts.BufferSize, err)
		}
		l.all = append(l.all, p)
		l.free <- p
		s, err := dev.NewStream()
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("stream: %w", err)
		}
		l.streams <- s
	}
	if l.path == PathGDS || l.path == PathGDSCompat || l.verifier != nil {
		l.stage = make(chan DeviceMem, opts.Buffers)
		for range opts.Buffers {
			m, err := dev.Alloc(int64(opts.BufferSize))
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("gds staging buffers: %w", err)
			}
			l.stage <- m
		}
	}
	if opts.Pinned != nil {
		opts.Pinned.attach(l)
	}
	return l, nil
}

// resolvePath picks the path for a device.
func resolvePath(dev Device, dir string, want Path, strict bool) (Path, string, error) {
	mode, reason := "absent", "the device has no cuFile binding"
	var probe error = errors.New(reason)
	if g, ok := dev.(GDSDevice); ok {
		mode, reason, probe = g.CuFileMode(dir)
		if probe != nil && mode != "absent" {
			reason = fmt.Sprintf("%s; and it cannot register files in %s: %v", reason, dir, probe)
		}
	}
	gdsNative := (mode == "native" || mode == "p2pdma") && probe == nil
	switch want {
	case PathAuto:
		if dev.Integrated() {
			return PathUnified, "integrated GPU: CPU and GPU share memory", nil
		}
		if gdsNative {
			return PathGDS, "cuFile " + mode, nil
		}
		return PathBounce, fmt.Sprintf("gds unavailable (cuFile %s: %s); gds-compat is not faster than bounce, so bounce", mode, reason), nil
	case PathGDS:
		if gdsNative {
			return PathGDS, "cuFile " + mode, nil
		}
		if strict {
			return "", "", fmt.Errorf("%w: gds needs cuFile in native or p2pdma mode; this machine: %s (%s)", ErrStrict, mode, reason)
		}
		return PathBounce, fmt.Sprintf("gds asked, unavailable (cuFile %s: %s): fell back to bounce", mode, reason), nil
	case PathGDSCompat:
		if (mode == "compat" || mode == "native" || mode == "p2pdma") && probe == nil {
			return PathGDSCompat, "cuFile " + mode + " (compatibility calls requested)", nil
		}
		if strict {
			return "", "", fmt.Errorf("%w: gds-compat needs cuFile; this machine: %s (%s)", ErrStrict, mode, reason)
		}
		return PathBounce, fmt.Sprintf("gds-compat asked, cuFile %s (%s): fell back to bounce", mode, reason), nil
	case PathUnified:
		if dev.Integrated() {
			return PathUnified, "integrated GPU", nil
		}
		if strict {
			return "", "", fmt.Errorf("%w: unified needs an integrated GPU; %s is discrete", ErrStrict, dev)
		}
		return PathBounce, fmt.Sprintf("unified asked, %s is a discrete GPU: bounce", dev), nil
	case PathBounce:
		return PathBounce, "bounce asked", nil
	}
	return "", "", fmt.Errorf("unknown path %q (want auto, gds, gds-compat, unified or bounce)", want)
}

// Path returns the path this loader uses and why.
func (l *Loader) Path() (Path, string) { return l.path, l.note }

// Device returns the loader's device.
func (l *Loader) Device() Device { return l.dev }

// Close frees the buffers and closes files. Loads must have finished.
func (l *Loader) Close() error {
	var errs []error
	if l.opts.Pinned != nil {
		errs = append(errs, l.opts.Pinned.detach(l))
	}
	for _, p := range l.all {
		errs = append(errs, p.Free())
	}
	l.all = nil
	if l.streams != nil {
		close(l.streams)
		for s := range l.streams {
			errs = append(errs, s.Close())
		}
		l.streams = nil
	}
	if l.stage != nil {
		close(l.stage)
		for m := range l.stage {
			errs = append(errs, m.Free())
		}
		l.stage = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, pf := range l.packs {
		if pf.reg != nil {
			errs = append(errs, pf.reg.Free())
		}
		if pf.buffered != nil {
			pf.buffered.Close()
		}
		if pf.direct != nil {
			pf.direct.Close()
		}
		if pf.mapped != nil {
			unix.Munmap(pf.mapped)
		}
		delete(l.packs, id)
	}
	for id, g := range l.gds {
		errs = append(errs, g.Close())
		delete(l.gds, id)
	}
	if l.ownReader && l.io != nil {
		errs = append(errs, l.io.Close())
		l.io = nil
	}
	return errors.Join(errs...)
}

func (l *Loader) pack(id uint64) (*packFiles, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pf, ok := l.packs[id]; ok {
		return pf, nil
	}
	path := l.st.PackPath(id)
	pf := &packFiles{}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	pf.buffered = f
	if l.opts.IO != IOBuffered {
		d, err := storeio.OpenDirect(path)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w (use buffered IO on this filesystem)", err)
		}
		pf.direct = d
	}
	if l.opts.IO == IOAuto || l.opts.IO == IOMapped { // mapped for mincore (auto) or copies (mapped)
		if st, err := f.Stat(); err == nil && st.Size() > 0 {
			if m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err == nil {
				pf.mapped = m
			}
		}
	}
	l.packs[id] = pf
	return pf, nil
}

// resident reports whether most of [off, off+n) of the pack is in the page
// cache.
func (pf *packFiles) resident(off, n int64) bool {
	if pf.mapped == nil {
		return false
	}
	end := min(off+n, int64(len(pf.mapped)))
	if off >= end {
		return false
	}
	pages := (end - off + storeio.BlockSize - 1) / storeio.BlockSize
	vec := make([]byte, pages)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&pf.mapped[off])), uintptr(end-off), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return false
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return int64(in)*2 >= pages
}

// ResolvePath says which path a loader asked for want would take on dev with
// packs in dir, and why (for kylix doctor).
func ResolvePath(dev Device, dir string, want Path) (Path, string) {
	p, note, err := resolvePath(dev, dir, want, false)
	if err != nil {
		return "", err.Error()
	}
	return p, note
}

// resolveVerify decides where chunks are hashed.
func (l *Loader) resolveVerify() error {
	if l.opts.NoVerify {
		l.verifyNote = "not verified (asked)"
		return nil
	}
	dv, ok := l.dev.(DeviceVerifier)
	var why error
	if !ok {
		why = fmt.Errorf("%s cannot hash in its memory", l.dev)
	} else if c, ok := dv.(interface{ CanVerify() error }); ok {
		why = c.CanVerify()
	}
	switch l.opts.VerifyOn {
	case "", VerifyAuto:
		if why == nil {
			l.verifier, l.verifyNote = dv, "verified on the device"
		} else {
			l.verifyNote = fmt.Sprintf("verified on the CPU (device verification unavailable: %v)", why)
		}
	case VerifyCPU:
		l.verifyNote = "verified on the CPU (asked)"
	case VerifyDevice:
		if why != nil {
			return fmt.Errorf("verification on the device asked for: %w", why)
		}
		l.verifier, l.verifyNote = dv, "verified on the device"
	default:
		return fmt.Errorf("unknown verify place %q (want auto, cpu or device)", l.opts.VerifyOn)
	}
	return nil
}

// VerifyNote says where chunks are verified, and why.
func (l *Loader) VerifyNote() string { return l.verifyNote }
