package gpuio

// Pinned host memory: a node's pins (docs/design/pin.md). PinnedHost holds
// read-only mappings of pack ranges locked in memory (mlock), and registers
// each once with the device of a loader made with Options.Pinned, so a load
// of bytes inside a pinned range copies straight from the locked page cache
// ("page cache (pinned)") with no CPU copy and no per-load registration.
//
// One registration serves every loader: the CUDA registration is portable
// (CU_MEMHOSTREGISTER_PORTABLE: pinned for every context), and registering
// the same pages again would fail with "already registered". When the
// loader whose device registered a range closes (its context goes), the
// range is registered again with another attached loader's device, if any.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
)

// ErrMemlock reports that the kernel refused to lock a range in memory
// (RLIMIT_MEMLOCK, or not enough memory).
var ErrMemlock = errors.New("cannot lock the pages in memory")

// PackSpan is a byte range of a pack file.
type PackSpan struct {
	Pack uint64
	Path string // the pack file
	Off  int64
	Len  int64
	// Chunks, when given, are the chunks lying in the span: Lock hashes
	// each from the locked pages and refuses the span if one does not
	// match, and loads then copy the span's chunks without hashing them
	// again (see PinnedRange.verified).
	Chunks []chunkstore.Piece
}

// aligned returns the span widened to whole pages.
func (s PackSpan) aligned() (int64, int64) {
	a := s.Off &^ (storeio.BlockSize - 1)
	b := storeio.AlignUp(s.Off + s.Len)
	return a, b
}

// PinnedHost is the set of locked pack ranges of a node. Safe for concurrent
// use.
type PinnedHost struct {
	mu      sync.Mutex
	idle    *sync.Cond // on mu: a range's users dropped to 0
	ranges  map[uint64][]*PinnedRange
	loaders map[*Loader]struct{}
}

// PinnedRange is one locked mapping of a pack range (page aligned).
type PinnedRange struct {
	h    *PinnedHost
	pack uint64
	off  int64
	b    []byte
	// Under h.mu:
	refs   int
	users  int       // loads copying from it now
	closed bool      // being released: no new users
	reg    PinnedMem // the registration, nil if none
	regBy  *Loader   // whose device made reg
	regErr map[*Loader]error
	// verified: every chunk of the span was hashed from these locked
	// pages when it was pinned and matched its id. The pages cannot be
	// evicted and packs are never rewritten in place (only appended to,
	// and removed whole by gc), so a load may place the range's chunks
	// without hashing them again, unless it asks for verification at
	// every load (ReadOptions.VerifyEveryLoad): the guarantee
	// passthrough gives, "verified when first opened" (verification.md).
	// [vlo, vhi) is the span whose chunks were hashed (pack offsets): the
	// page-aligned range may hold a few bytes of other chunks beyond it.
	verified bool
	vlo, vhi int64
	chunks   []chunkstore.Piece // the verified span's chunks, for Recheck
	// path and ident: the pack file and its identity (device, inode,
	// modification and change times) when the span was hashed. A load
	// trusts the verified mark only while the file still has it: a
	// write to the pack (which changes the bytes of these very pages)
	// changes its times, and the load then hashes the chunks again, as
	// passthrough checks a pack again after its identity changed
	// (verification.md).
	path  string
	ident fileIdent
}

// fileIdent is what changes when a file is written or replaced.
type fileIdent struct {
	dev, ino             uint64
	mtimeNsec, ctimeNsec int64
}

func identOf(st *unix.Stat_t) fileIdent {
	return fileIdent{dev: st.Dev, ino: st.Ino, mtimeNsec: st.Mtim.Nano(), ctimeNsec: st.Ctim.Nano()}
}

// identHolds reports whether r's pack file has the identity it had when
// r's span was hashed.
func (r *PinnedRange) identHolds() bool {
	var st unix.Stat_t
	return unix.Stat(r.path, &st) == nil && identOf(&st) == r.ident
}

// NewPinnedHost returns an empty set.
func NewPinnedHost() *PinnedHost {
	h := &PinnedHost{ranges: map[uint64][]*PinnedRange{}, loaders: map[*Loader]struct{}{}}
	h.idle = sync.NewCond(&h.mu)
	return h
}

// Size is the number of bytes the range locks.
func (r *PinnedRange) Size() int64 { return int64(len(r.b)) }

// Lock maps span (widened to whole pages) and locks it in memory, reading
// what is not in the page cache from disk, and registers it with the device
// of every attached loader. Locking the same span twice shares one mapping
// (Release once per Lock).
func (h *PinnedHost) Lock(span PackSpan) (*PinnedRange, error) {
	a, b := span.aligned()
	if b <= a {
		return nil, fmt.Errorf("empty range of %s", span.Path)
	}
	if r := h.find(span.Pack, a, b, true); r != nil {
		if len(span.Chunks) > 0 && !r.isVerified() {
			var st unix.Stat_t
			if err := unix.Stat(span.Path, &st); err != nil {
				r.Release()
				return nil, err
			}
			if err := verifyPinned(r.b, r.off, span); err != nil {
				r.Release()
				return nil, err
			}
			h.mu.Lock()
			r.verified, r.vlo, r.vhi, r.chunks = true, span.Off, span.Off+span.Len, span.Chunks
			r.path, r.ident = span.Path, identOf(&st)
			h.mu.Unlock()
		}
		return r, nil
	}
	f, err := os.Open(span.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t // before the hashing: a write during it changes the identity
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	} else if st.Size < span.Off+span.Len {
		return nil, fmt.Errorf("%s is %d bytes, the range ends at %d: the pack is damaged (kylix verify)", span.Path, st.Size, span.Off+span.Len)
	}
	m, err := unix.Mmap(int(f.Fd()), a, int(b-a), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of %s: %w", b-a, span.Path, err)
	}
	if err := unix.Mlock(m); err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("locking %d bytes of %s in memory: %w: %w (%s)", b-a, span.Path, ErrMemlock, err, MemlockLimit())
	}
	verified := false
	if len(span.Chunks) > 0 {
		if err := verifyPinned(m, a, span); err != nil {
			unix.Munmap(m)
			return nil, err
		}
		verified = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.findLocked(span.Pack, a, b, true); r != nil { // locked meanwhile
		unix.Munmap(m)
		if verified && !r.verified {
			r.verified, r.vlo, r.vhi, r.chunks = true, span.Off, span.Off+span.Len, span.Chunks
			r.path, r.ident = span.Path, identOf(&st)
		}
		return r, nil
	}
	r := &PinnedRange{h: h, pack: span.Pack, off: a, b: m, refs: 1, regErr: map[*Loader]error{}, verified: verified, vlo: span.Off, vhi: span.Off + span.Len}
	if verified {
		r.chunks, r.path, r.ident = span.Chunks, span.Path, identOf(&st)
	}
	h.ranges[span.Pack] = append(h.ranges[span.Pack], r)
	for l := range h.loaders {
		if r.register(l) {
			break
		}
	}
	return r, nil
}

// MemlockLimit describes this process's RLIMIT_MEMLOCK for error messages.
func MemlockLimit() string {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return "RLIMIT_MEMLOCK unknown"
	}
	if rl.Cur == unix.RLIM_INFINITY || HasCapIPCLock() {
		return "locking is not limited for this process (CAP_IPC_LOCK or RLIMIT_MEMLOCK unlimited): the machine is short of memory"
	}
	return fmt.Sprintf("RLIMIT_MEMLOCK is %d bytes and this process has no CAP_IPC_LOCK (root has it): raise the limit with `ulimit -l`, LimitMEMLOCK= in a systemd unit or memlock in limits.conf", rl.Cur)
}

// HasCapIPCLock reports whether this process has CAP_IPC_LOCK in its
// effective set (/proc/self/status CapEff), which lifts RLIMIT_MEMLOCK.
func HasCapIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_IPC_LOCK) != 0
		}
	}
	return false
}

func (h *PinnedHost) find(pack uint64, a, b int64, exact bool) *PinnedRange {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.findLocked(pack, a, b, exact)
}

// findLocked returns the range of pack that is [a, b) (exact; its count of
// Locks is raised) or that contains [a, b).
func (h *PinnedHost) findLocked(pack uint64, a, b int64, exact bool) *PinnedRange {
	for _, r := range h.ranges[pack] {
		if r.closed {
			continue
		}
		end := r.off + int64(len(r.b))
		if exact && r.off == a && end == b {
			r.refs++
			return r
		}
		if !exact && r.off <= a && b <= end {
			return r
		}
	}
	return nil
}

// RegisteredBy names the device whose registration of the range loads copy
// from ("" when it is not registered with any).
func (r *PinnedRange) RegisteredBy() string {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.reg == nil || r.regBy == nil {
		return ""
	}
	return r.regBy.dev.String()
}

// Release undoes one Lock. The last one waits for loads copying from the
// range, unregisters it, unlocks and unmaps it.
func (r *PinnedRange) Release() error {
	h := r.h
	h.mu.Lock()
	r.refs--
	if r.refs > 0 {
		h.mu.Unlock()
		return nil
	}
	r.closed = true
	for r.users > 0 {
		h.idle.Wait()
	}
	var errs []error
	if r.reg != nil {
		errs = append(errs, r.reg.Free())
		r.reg, r.regBy = nil, nil
	}
	h.ranges[r.pack] = slices.DeleteFunc(h.ranges[r.pack], func(x *PinnedRange) bool { return x == r })
	if len(h.ranges[r.pack]) == 0 {
		delete(h.ranges, r.pack)
	}
	h.mu.Unlock()
	errs = append(errs, unix.Munlock(r.b), unix.Munmap(r.b))
	return errors.Join(errs...)
}

// register registers r with l's device unless it is registered already
// (under h.mu); it reports whether r is registered.
func (r *PinnedRange) register(l *Loader) bool {
	if r.reg != nil {
		return true
	}
	hr, ok := l.dev.(HostRegisterer)
	if !ok {
		r.regErr[l] = fmt.Errorf("%s cannot register host memory", l.dev)
		return false
	}
	p, err := hr.RegisterReadOnly(r.b)
	if err != nil {
		r.regErr[l] = err
		return false
	}
	r.reg, r.regBy = p, l
	delete(r.regErr, l)
	return true
}

// attach registers every range with l's device (New, with Options.Pinned).
func (h *PinnedHost) attach(l *Loader) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loaders[l] = struct{}{}
	for _, rs := range h.ranges {
		for _, r := range rs {
			r.register(l)
		}
	}
}

// detach unregisters the ranges l's device registered (Loader.Close; no
// load of l runs then) and registers them with another attached loader's
// device, if any. Loads of other loaders copying from such a range now
// are waited for first.
func (h *PinnedHost) detach(l *Loader) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.loaders, l)
	var mine []*PinnedRange
	for _, rs := range h.ranges {
		for _, r := range rs {
			delete(r.regErr, l)
			if r.regBy == l {
				mine = append(mine, r)
			}
		}
	}
	var errs []error
	for _, r := range mine {
		for r.users > 0 { // loads of other loaders
			h.idle.Wait()
		}
		if r.regBy != l { // released meanwhile
			continue
		}
		errs = append(errs, r.reg.Free())
		r.reg, r.regBy = nil, nil
		for other := range h.loaders {
			if r.closed || r.register(other) {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// source returns the pinned, registered bytes of group g for l, marking the
// range in use until done is called; ok is false when g is not inside one
// range registered with l's device.
func (h *PinnedHost) source(l *Loader, g group) (source, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.findLocked(g.pack, g.dataOff, g.dataOff+g.dataLen, false)
	if r == nil || r.closed || r.reg == nil {
		return source{}, false
	}
	p := r.reg
	if r.verified && !r.identHolds() {
		// Written since it was hashed: this load and later ones hash
		// its chunks (locking the span with its chunks again, as kylix
		// pin does, verifies it anew).
		r.verified = false
	}
	r.users++
	done := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		r.users--
		if r.users == 0 {
			h.idle.Broadcast()
		}
	}
	return source{host: r.b, pinned: p, hostOff: g.dataOff - r.off, kind: ioPinned, done: done,
		verified: r.verified && g.dataOff >= r.vlo && g.dataOff+g.dataLen <= r.vhi}, true
}

func (r *PinnedRange) isVerified() bool {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.verified
}

// verifyPinned hashes the span's chunks from m (the pages from file offset
// base), on all CPUs.
func verifyPinned(m []byte, base int64, span PackSpan) error {
	var (
		next atomic.Int64
		bad  atomic.Pointer[chunkstore.CorruptError]
		wg   sync.WaitGroup
	)
	for range min(runtime.GOMAXPROCS(0), len(span.Chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(span.Chunks) && bad.Load() == nil; i = int(next.Add(1) - 1) {
				c := span.Chunks[i]
				o := c.PackOff - base
				if o < 0 || c.Len < 0 || o+c.Len > int64(len(m)) {
					bad.CompareAndSwap(nil, &chunkstore.CorruptError{Chunk: c.ID, Pack: span.Pack, PackOff: c.PackOff, Reason: "outside the pinned range"})
					continue
				}
				if chunkstore.Sum(m[o:o+c.Len]) != c.ID {
					bad.CompareAndSwap(nil, &chunkstore.CorruptError{Chunk: c.ID, Pack: span.Pack, PackOff: c.PackOff, Reason: "hash mismatch when pinned"})
				}
			}
		}()
	}
	wg.Wait()
	if e := bad.Load(); e != nil {
		return fmt.Errorf("pinning %s: %w (kylix verify names the files it affects)", span.Path, e)
	}
	return nil
}

// Locked is the number of bytes locked: the union of the ranges of each pack.
func (h *PinnedHost) Locked() int64 {
	return h.Added(nil)
}

// Added is how many bytes Locked would grow by if spans were locked too.
func (h *PinnedHost) Added(spans []PackSpan) int64 {
	h.mu.Lock()
	cur := map[uint64][][2]int64{}
	for p, rs := range h.ranges {
		for _, r := range rs {
			cur[p] = append(cur[p], [2]int64{r.off, r.off + int64(len(r.b))})
		}
	}
	h.mu.Unlock()
	before := unionLen(cur)
	if spans == nil {
		return before
	}
	for _, s := range spans {
		a, b := s.aligned()
		cur[s.Pack] = append(cur[s.Pack], [2]int64{a, b})
	}
	return unionLen(cur) - before
}

func unionLen(m map[uint64][][2]int64) int64 {
	var n int64
	for _, iv := range m {
		slices.SortFunc(iv, func(x, y [2]int64) int {
			if x[0] != y[0] {
				if x[0] < y[0] {
					return -1
				}
				return 1
			}
			return 0
		})
		end := int64(-1)
		for _, x := range iv {
			switch {
			case x[0] >= end:
				n += x[1] - x[0]
				end = x[1]
			case x[1] > end:
				n += x[1] - end
				end = x[1]
			}
		}
	}
	return n
}

// PinRegistration says how much of the pinned memory one loader's device
// can copy from directly (registered by it, or portably by another).
type PinRegistration struct {
	Device     string `json:"device"`
	Bytes      int64  `json:"registered_bytes"`
	Ranges     int    `json:"registered_ranges"`
	Failed     int    `json:"failed_ranges"`
	FailedWhy  string `json:"failed_why,omitempty"`
	TotalBytes int64  `json:"pinned_bytes"`
}

// Registrations reports, per attached loader, what is registered.
func (h *PinnedHost) Registrations() []PinRegistration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []PinRegistration
	for l := range h.loaders {
		pr := PinRegistration{Device: l.dev.String()}
		for _, rs := range h.ranges {
			for _, r := range rs {
				pr.TotalBytes += int64(len(r.b))
				if r.reg != nil {
					pr.Bytes += int64(len(r.b))
					pr.Ranges++
				} else if err := r.regErr[l]; err != nil {
					pr.Failed++
					pr.FailedWhy = err.Error()
				}
			}
		}
		out = append(out, pr)
	}
	slices.SortFunc(out, func(a, b PinRegistration) int {
		if a.Device < b.Device {
			return -1
		}
		return 1
	})
	return out
}

// ResidentBytes reports how many bytes of [off, off+n) of the file at path
// are in the page cache (mincore over a temporary mapping).
func ResidentBytes(path string, off, n int64) (int64, error) {
	if n <= 0 {
		return 0, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := min(off+n, st.Size())
	if end <= off {
		return 0, nil
	}
	a, b := off&^(storeio.BlockSize-1), storeio.AlignUp(end)
	m, err := unix.Mmap(int(f.Fd()), a, int(b-a), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	vec := make([]byte, (b-a)/storeio.BlockSize)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, errno
	}
	var in int64
	for i, v := range vec {
		if v&1 == 0 {
			continue
		}
		p0 := a + int64(i)*storeio.BlockSize
		in += min(p0+storeio.BlockSize, end) - max(p0, off)
	}
	return in, nil
}

// Recheck hashes the chunks of every range verified when pinned again,
// from the locked pages, calling pace with the bytes of each range before
// hashing it (a rate limit; its error ends the pass). A range whose chunks
// no longer match loses its verified mark: loads then hash its chunks
// again (and fail on the bad one) instead of placing them as they are.
// It returns the ranges checked and the errors of those that failed.
func (h *PinnedHost) Recheck(pace func(n int64) error) (int, []error) {
	h.mu.Lock()
	var rs []*PinnedRange
	for _, l := range h.ranges {
		for _, r := range l {
			if r.verified && !r.closed {
				r.users++ // kept mapped while hashed (Release waits)
				rs = append(rs, r)
			}
		}
	}
	h.mu.Unlock()
	var bad []error
	checked := 0
	for i, r := range rs {
		var err error
		if pace != nil {
			err = pace(r.vhi - r.vlo)
		}
		if err == nil {
			checked++
			if verr := verifyPinned(r.b, r.off, PackSpan{Pack: r.pack, Path: fmt.Sprintf("pack %016x", r.pack), Off: r.vlo, Len: r.vhi - r.vlo, Chunks: r.chunks}); verr != nil {
				bad = append(bad, verr)
				h.mu.Lock()
				r.verified = false
				h.mu.Unlock()
			}
		}
		h.mu.Lock()
		r.users--
		if r.users == 0 {
			h.idle.Broadcast()
		}
		h.mu.Unlock()
		if err != nil {
			for _, rest := range rs[i+1:] {
				h.mu.Lock()
				rest.users--
				if rest.users == 0 {
					h.idle.Broadcast()
				}
				h.mu.Unlock()
			}
			break
		}
	}
	return checked, bad
}
