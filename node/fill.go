package node

// FILL: the node reads a file range into GPU memory of the caller's
// (docs/design/client.md). One gpuio loader per device, made at the first
// FILL for it and closed, with its CUDA context, after --gpu-idle without
// one; the slices of all clients' FILLs share it round-robin.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/gpuio"
)

const (
	// fillSlice is the unit of fairness: a FILL is cut into slices of at
	// most this size, and the device's slots go round-robin among clients
	// slice by slice (256 MiB: ~6 ms at 40 GB/s).
	fillSlice = 256 << 20
	// fillSlots is how many slices run at once on one device: enough to
	// keep a loader's buffers (32 x 16 MiB at most) all busy.
	fillSlots = 4
)

// GPUHeld is one device context the node holds for FILL.
type GPUHeld struct {
	Device int `json:"device"`
	// LoaderBytes is the device memory the loader took (cuMemGetInfo's
	// free memory before and after it was made); the context's own
	// overhead is not in it (the driver cannot measure before it exists).
	LoaderBytes int64  `json:"loader_bytes"`
	DeviceFree  int64  `json:"device_free"`
	DeviceTotal int64  `json:"device_total"`
	Fills       int64  `json:"fills"`
	Active      int    `json:"active"`
	Path        string `json:"path"`
}

// fillService runs FILL requests.
type fillService struct {
	s      *chunkstore.Store
	pinned *gpuio.PinnedHost // nil: no pins
	// loaded, if set, is told of each file version a FILL read (its
	// namespace path, "" if unknown, asked only when needed; its size):
	// hot files (hot.go).
	loaded func(path func() string, id chunkstore.ID, size int64)
	// inMemory says which file versions the node holds locked in memory
	// (pins, hot files): a fill prefers such a file to its rank layout.
	inMemory func(chunkstore.ID) bool
	// allIdle, if set, is called when the last device's context was given
	// back after the idle time (hot files go with their registration).
	allIdle func()
	log     *slog.Logger
	idle    time.Duration

	mu     sync.Mutex
	devs   map[int]*fillDev
	closed bool
	// reading counts FILLs in flight per file (manifest id) and device,
	// to tell when the ranks of one job read the same file at once.
	reading map[chunkstore.ID]map[int]int
}

type fillDev struct {
	ord         int
	dev         *gpuio.CUDADevice
	loader      *gpuio.Loader
	loaderBytes int64
	active      int // FILLs in flight (under fillService.mu)
	timer       *time.Timer
	fills       atomic.Int64
	sched       *fairSched
	kv          kvDev // the KV store's arena on this device (kv.go)
}

func newFillService(s *chunkstore.Store, pinned *gpuio.PinnedHost, idle time.Duration, log *slog.Logger) *fillService {
	if idle <= 0 {
		idle = DefaultGPUIdle
	}
	return &fillService{s: s, pinned: pinned, log: log, idle: idle, devs: map[int]*fillDev{}, reading: map[chunkstore.ID]map[int]int{}}
}

// acquire returns device ord's loader, making it on first use, and marks a
// FILL in flight on it (release ends it).
func (fs *fillService) acquire(ord int) (*fillDev, error) {
	if err := cuda.Available(); err != nil {
		return nil, fmt.Errorf("no GPU fill on this node: %v: %w", err, syscall.ENODEV)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed {
		return nil, fmt.Errorf("the node is stopping: %w", syscall.ESHUTDOWN)
	}
	if d := fs.devs[ord]; d != nil {
		d.active++
		if d.timer != nil {
			d.timer.Stop()
			d.timer = nil
		}
		return d, nil
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("no GPU fill on this node: %v: %w", err, syscall.ENODEV)
	}
	if ord < 0 || ord >= n {
		return nil, fmt.Errorf("no CUDA device %d here (%d devices): %w", ord, n, syscall.ENODEV)
	}
	// Made under the lock: concurrent first FILLs for one device wait for
	// one loader rather than racing to make two.
	dev, err := gpuio.NewCUDADevice(ord)
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %v: %w", ord, err, syscall.ENODEV)
	}
	free0, _, _ := dev.MemInfo()
	l, err := gpuio.New(fs.s, dev, gpuio.Options{Pinned: fs.pinned}) // pinned packs registered (pins.go)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("cuda:%d: %w", ord, err)
	}
	free1, _, _ := dev.MemInfo()
	d := &fillDev{ord: ord, dev: dev, loader: l, loaderBytes: max(0, int64(free0)-int64(free1)), active: 1, sched: newFairSched(fillSlots)}
	path, note := l.Path()
	fs.log.Info("GPU fill: took a CUDA context", "device", ord, "path", path, "note", note, "loader_bytes", d.loaderBytes)
	fs.devs[ord] = d
	return d, nil
}

// release ends a FILL on d; the last one arms the idle timer.
func (fs *fillService) release(d *fillDev) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	d.active--
	if d.active == 0 && !fs.closed {
		d.timer = time.AfterFunc(fs.idle, func() { fs.expire(d) })
	}
}

// startReading records a FILL of file id on device dev; the returned func
// ends it.
func (fs *fillService) startReading(id chunkstore.ID, dev int) func() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	m := fs.reading[id]
	if m == nil {
		m = map[int]int{}
		fs.reading[id] = m
	}
	m[dev]++
	return func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if m[dev]--; m[dev] == 0 {
			delete(m, dev)
		}
		if len(m) == 0 {
			delete(fs.reading, id)
		}
	}
}

// sharedRead reports whether file id is being filled on more than one
// device now: then reads go through the page cache, so the disk is read
// once for all of them (gpuio.ReadOptions.Shared).
func (fs *fillService) sharedRead(id chunkstore.ID) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.reading[id]) > 1
}

// expire gives d's loader and context back if it is still idle.
func (fs *fillService) expire(d *fillDev) {
	fs.mu.Lock()
	if d.active != 0 || fs.devs[d.ord] != d {
		fs.mu.Unlock()
		return
	}
	delete(fs.devs, d.ord)
	last := len(fs.devs) == 0
	fs.mu.Unlock()
	fs.closeDev(d)
	fs.log.Info("GPU fill: gave the CUDA context back after the idle time", "device", d.ord, "idle", fs.idle)
	if last && fs.allIdle != nil {
		fs.allIdle()
	}
}

func (fs *fillService) closeDev(d *fillDev) {
	if err := errors.Join(d.kv.close(), d.loader.Close(), d.dev.Close()); err != nil {
		fs.log.Warn("GPU fill: closing", "device", d.ord, "err", err)
	}
}

// close ends the service at node stop (after the client connections).
func (fs *fillService) close() {
	fs.mu.Lock()
	fs.closed = true
	devs := fs.devs
	fs.devs = map[int]*fillDev{}
	fs.mu.Unlock()
	for _, d := range devs {
		if d.timer != nil {
			d.timer.Stop()
		}
		fs.closeDev(d)
	}
}

func (fs *fillService) held() []GPUHeld {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []GPUHeld
	for _, d := range fs.devs {
		h := GPUHeld{Device: d.ord, LoaderBytes: d.loaderBytes, Fills: d.fills.Load(), Active: d.active}
		if f, t, err := d.dev.MemInfo(); err == nil {
			h.DeviceFree, h.DeviceTotal = int64(f), int64(t)
		}
		p, _ := d.loader.Path()
		h.Path = string(p)
		out = append(out, h)
	}
	return out
}

// opFill checks every range against the file and, once the caller's
// allocation is mapped, against the allocation's real size, before a byte
// is written; then runs the slices through the device's loader.
func (c *clientServer) opFill(sf *chunkstore.File, fd int, body []byte, p peer) reply {
	req, err := clientproto.ParseFill(body)
	if err != nil {
		return refuse(err)
	}
	ranges := req.List()
	if sf, err = sf.Fresh(); err != nil { // chunks moved by kylix gc since the open
		return refuse(err)
	}
	size := uint64(sf.Size())
	for i, r := range ranges {
		if r.FileOffset > size || r.Length > size-r.FileOffset {
			return refuse(fmt.Errorf("range %d [%d, +%d) is outside the file's %d bytes: %w", i, r.FileOffset, r.Length, size, syscall.EINVAL))
		}
		// Strided: by division, so that no product can wrap past the check.
		if rows := max(1, r.Rows); rows > 1 {
			if r.Pitch < r.Length || r.Pitch == 0 {
				return refuse(fmt.Errorf("range %d: %d rows of %d bytes with a pitch of %d overlap: %w", i, rows, r.Length, r.Pitch, syscall.EINVAL))
			}
			if rows-1 > (size-r.FileOffset-r.Length)/r.Pitch {
				return refuse(fmt.Errorf("range %d: %d rows of %d bytes, %d apart, from %d pass the file's end (%d bytes): %w", i, rows, r.Length, r.Pitch, r.FileOffset, size, syscall.EINVAL))
			}
		}
	}
	if c.fill == nil {
		return refuse(fmt.Errorf("this node serves no GPU fill: %w", syscall.ENODEV))
	}
	d, err := c.fill.acquire(int(req.Device))
	if err != nil {
		return refuse(err)
	}
	defer c.fill.release(d)
	dst, err := d.dev.OpenIPC(req.IPCHandle)
	if err != nil {
		return refuse(fmt.Errorf("cannot open the CUDA IPC handle on cuda:%d (from cuIpcGetMemHandle of an allocation on that device, in another process): %v: %w", req.Device, err, syscall.EINVAL))
	}
	defer dst.Free()
	alloc := uint64(dst.Size())
	for i, r := range ranges {
		if rows := max(1, r.Rows); r.DstOffset > alloc || (r.Length > 0 && rows > (alloc-r.DstOffset)/r.Length) {
			return refuse(fmt.Errorf("range %d: %d x %d bytes at offset %d do not fit the allocation's %d bytes: %w", i, rows, r.Length, r.DstOffset, alloc, syscall.EFAULT))
		}
	}
	start := time.Now()
	defer c.fill.startReading(sf.ID, d.ord)()
	res, err := c.fillSlices(d, c.fillParts(sf, ranges), dst, uint64(p.pid), req.Flags&clientproto.FillVerify != 0)
	if err != nil {
		c.fillFailures.add(chunkstore.FailureKind(err), 0)
		return refuse(fmt.Errorf("fill: %w", errnoOr(err, syscall.EIO)))
	}
	d.fills.Add(1)
	if c.fill.loaded != nil {
		c.fill.loaded(func() string { return c.fsys.PathOfFd(fd) }, sf.ID, sf.Size())
	}
	c.procs.add(p, d.ord, res)
	c.fills.Add(1)
	c.fillBytes.Add(res.Bytes)
	c.fillPaths.add(string(res.Path), res.Bytes)
	verified := "no"
	if res.Verified {
		verified = res.VerifyOn
	}
	out := clientproto.FillReply{Bytes: uint64(res.Bytes), Nanos: uint64(time.Since(start).Nanoseconds()), Path: string(res.Path), IO: res.IO, Verified: verified}
	if req.Flags&clientproto.FillVerify != 0 && !(res.Verified && res.VerifyOn == "device") {
		return reply{errno: syscall.EOPNOTSUPP, fields: out.Append(nil),
			msg: fmt.Sprintf("verification on the GPU was required but the chunks were verified on %q (%s); the bytes are in place", verified, d.loader.VerifyNote())}
	}
	return reply{fields: out.Append(nil)}
}

// errnoOr keeps the errno err wraps, else wraps def.
func errnoOr(err error, def syscall.Errno) error {
	var e syscall.Errno
	if errors.As(err, &e) {
		return err
	}
	return fmt.Errorf("%w: %w", err, def)
}

// fillSlices cuts the ranges into batches of about fillSlice bytes (a
// large range is split; small ranges, like a tensor-parallel share's one
// per tensor, are packed together) and runs each batch as one pipeline
// run (gpuio.ReadRanges) under one of the device's fair slots, all batches
// of the request at once (the slots bound them). Packing matters: with one
// run per small range, only as many of the loader's buffers were busy as
// there were slots (docs/bench.md, issue 11).
func (c *clientServer) fillSlices(d *fillDev, parts []fillPart, dst gpuio.DeviceMem, client uint64, verifyEach bool) (gpuio.Result, error) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		total gpuio.Result
		first error
		wg    sync.WaitGroup
	)
	total.Verified = true
	for _, part := range parts {
		if part.layout {
			total.IO = "rank layout"
		}
	}
	for i := range parts {
		var err error
		if parts[i].f, err = parts[i].f.Fresh(); err != nil { // chunks moved by kylix gc since it was opened
			return total, err
		}
	}
	for part, batch := range allBatches(parts) {
		sf := part.f
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.sched.acquire(client)
			defer d.sched.release()
			if ctx.Err() != nil {
				return
			}
			o := gpuio.ReadOptions{Shared: func() bool { return c.fill.sharedRead(sf.ID) }, VerifyEveryLoad: verifyEach}
			res, err := d.loader.ReadRangesWith(ctx, sf, batch, dst, o)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
					cancel()
				}
				return
			}
			total.Bytes += res.Bytes
			total.Read += res.Read
			total.Path, total.VerifyOn = res.Path, res.VerifyOn
			total.Verified = total.Verified && res.Verified
			if total.IO == "" {
				total.IO = res.IO
			} else if res.IO != total.IO && res.IO != "" {
				total.IO = mergeIO(total.IO, res.IO)
			}
		}()
	}
	wg.Wait()
	return total, first
}

// fillPart is what a fill reads from one file: the file the client opened,
// or a rank layout of it (layout).
type fillPart struct {
	f      *chunkstore.File
	ranges []clientproto.Range
	layout bool
}

// allBatches yields the batches of every part (fillBatches), with the part.
func allBatches(parts []fillPart) func(yield func(fillPart, []gpuio.Range) bool) {
	return func(yield func(fillPart, []gpuio.Range) bool) {
		for _, p := range parts {
			for _, b := range fillBatches(p.ranges, fillSlice) {
				if !yield(p, b) {
					return
				}
			}
		}
	}
}

// fillParts sorts a fill's ranges by the file they are read from: a
// strided range that is exactly a tensor's share held by a stored rank
// layout of sf's version (kylix layout) is read from the layout as one
// contiguous run (docs/design/ranklayout.md); the rest from sf.
func (c *clientServer) fillParts(sf *chunkstore.File, ranges []clientproto.Range) []fillPart {
	if !slices.ContainsFunc(ranges, func(r clientproto.Range) bool { return r.Rows > 1 }) {
		return []fillPart{{f: sf, ranges: ranges}}
	}
	x := c.layouts.index(c.s, sf, c.log)
	if x == nil {
		return []fillPart{{f: sf, ranges: ranges}}
	}
	var rest []clientproto.Range
	var parts []fillPart
	at := map[*chunkstore.File]int{}
	held := c.fill.inMemory != nil && c.fill.inMemory(sf.ID)
	for _, r := range ranges {
		if r.Rows > 1 {
			if lf, off, ok := x.Find(int64(r.FileOffset), int64(r.Length), int64(r.Rows), int64(r.Pitch)); ok && preferLayout(held, c.fill.inMemory, lf.ID) {
				i, seen := at[lf]
				if !seen {
					i, at[lf] = len(parts), len(parts)
					parts = append(parts, fillPart{f: lf, layout: true})
				}
				parts[i].ranges = append(parts[i].ranges, clientproto.Range{FileOffset: uint64(off), Length: r.Length * r.Rows, DstOffset: r.DstOffset})
				continue
			}
		}
		rest = append(rest, r)
	}
	if len(rest) > 0 {
		parts = append(parts, fillPart{f: sf, ranges: rest})
	}
	return parts
}

// preferLayout is the one rule of whether a rank's share is read from its
// layout rather than from the file (kylix load and GPU fills): yes, unless
// the file is held locked in memory (fileHeld: a pin, a hot file) and the
// layout is not, since copying the strided rows from registered pages
// costs less than reading the layout's unlocked ones.
func preferLayout(fileHeld bool, inMemory func(chunkstore.ID) bool, layout chunkstore.ID) bool {
	return !fileHeld || (inMemory != nil && inMemory(layout))
}

// layoutIndexes caches the rank layout index of the file versions fills
// read strided ranges of, keyed by the layouts stored (a layout made or
// dropped since is seen at the next fill).
type layoutIndexes struct {
	mu sync.Mutex
	m  map[chunkstore.ID]cachedIndex
}

type cachedIndex struct {
	stored string
	x      *gpuio.RankLayoutIndex
}

// maxLayoutIndexes bounds the cache: past it, it starts over.
const maxLayoutIndexes = 256

func (li *layoutIndexes) index(s *chunkstore.Store, sf *chunkstore.File, log *slog.Logger) *gpuio.RankLayoutIndex {
	ls, err := s.RankLayouts(sf.ID)
	if err != nil || len(ls) == 0 {
		return nil
	}
	var key strings.Builder
	for _, l := range ls {
		key.WriteString(l.ID.String())
	}
	li.mu.Lock()
	defer li.mu.Unlock()
	if c, ok := li.m[sf.ID]; ok && c.stored == key.String() {
		return c.x
	}
	x, skipped, err := gpuio.NewRankLayoutIndex(s, sf)
	if err != nil {
		log.Warn("rank layouts not used for fills", "file", sf.ID.Short(), "err", err)
		return nil
	}
	for _, why := range skipped {
		log.Warn("a rank layout not used for fills", "file", sf.ID.Short(), "why", why)
	}
	if li.m == nil || len(li.m) >= maxLayoutIndexes {
		li.m = map[chunkstore.ID]cachedIndex{}
	}
	li.m[sf.ID] = cachedIndex{key.String(), x}
	return x
}

// fillBatches splits ranges into batches of at most limit bytes each: ranges
// longer than max are cut (a strided one by whole rows, so a batch may pass
// limit by less than one row), shorter ones packed in order.
func fillBatches(ranges []clientproto.Range, limit uint64) [][]gpuio.Range {
	var (
		out   [][]gpuio.Range
		cur   []gpuio.Range
		bytes uint64
	)
	flush := func() {
		if len(cur) > 0 {
			out, cur, bytes = append(out, cur), nil, 0
		}
	}
	for _, r := range ranges {
		if r.Rows <= 1 {
			for o := uint64(0); o < r.Length; {
				n := min(limit-bytes, r.Length-o)
				cur = append(cur, gpuio.Range{Off: int64(r.FileOffset + o), N: int64(n), DstOff: int64(r.DstOffset + o)})
				bytes += n
				o += n
				if bytes == limit {
					flush()
				}
			}
			continue
		}
		if r.Length == 0 {
			continue
		}
		for i := uint64(0); i < r.Rows; {
			if limit-bytes < r.Length {
				flush()
			}
			k := max(1, min(r.Rows-i, (limit-bytes)/r.Length))
			cur = append(cur, gpuio.Range{Off: int64(r.FileOffset + i*r.Pitch), N: int64(r.Length), DstOff: int64(r.DstOffset + i*r.Length), Rows: int64(k), Pitch: int64(r.Pitch)})
			bytes += k * r.Length
			i += k
			if bytes >= limit {
				flush()
			}
		}
	}
	flush()
	return out
}

func mergeIO(a, b string) string {
	for _, s := range splitPlus(a) {
		if s == b {
			return a
		}
	}
	return a + " + " + b
}

func splitPlus(s string) []string {
	var out []string
	for s != "" {
		i := 0
		for i < len(s) && !(i+3 <= len(s) && s[i:i+3] == " + ") {
			i++
		}
		out = append(out, s[:i])
		if i+3 > len(s) {
			break
		}
		s = s[i+3:]
	}
	return out
}

// fairSched hands out n slots round-robin among clients: a client with
// many slices waiting gets one slot, then every other waiting client gets
// one, and so on, so that one big load cannot starve another.
type fairSched struct {
	mu     sync.Mutex
	free   int
	queues map[uint64][]chan struct{}
	order  []uint64 // clients with waiters, in turn order
}

func newFairSched(n int) *fairSched {
	return &fairSched{free: n, queues: map[uint64][]chan struct{}{}}
}

func (s *fairSched) acquire(client uint64) {
	s.mu.Lock()
	if s.free > 0 && len(s.order) == 0 {
		s.free--
		s.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	if len(s.queues[client]) == 0 {
		s.order = append(s.order, client)
	}
	s.queues[client] = append(s.queues[client], ch)
	s.mu.Unlock()
	<-ch
}

func (s *fairSched) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.order) == 0 {
		s.free++
		return
	}
	c := s.order[0]
	s.order = s.order[1:]
	q := s.queues[c]
	ch := q[0]
	if len(q) > 1 {
		s.queues[c] = q[1:]
		s.order = append(s.order, c)
	} else {
		delete(s.queues, c)
	}
	close(ch)
}

// maxFillProcs bounds the client processes whose fills kylix node lists.
const maxFillProcs = 16

// ProcFills is one client process's GPU fills.
type ProcFills struct {
	PID     int32  `json:"pid"`
	UID     uint32 `json:"uid"`
	Devices []int  `json:"devices"`
	Fills   int64  `json:"fills"`
	// Bytes were placed in the process's memory; ReadBytes were read
	// from the packs for them (whole chunks: a share's rows need their
	// chunks whole, for verification).
	Bytes     int64 `json:"bytes"`
	ReadBytes int64 `json:"read_bytes"`
}

// fillProcs keeps the latest maxFillProcs client processes' fills.
type fillProcs struct {
	mu    sync.Mutex
	procs []ProcFills // oldest first
}

func (f *fillProcs) add(p peer, dev int, res gpuio.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.procs, func(x ProcFills) bool { return x.PID == p.pid && x.UID == p.uid })
	if i < 0 {
		if len(f.procs) == maxFillProcs {
			f.procs = f.procs[1:]
		}
		f.procs = append(f.procs, ProcFills{PID: p.pid, UID: p.uid})
		i = len(f.procs) - 1
	}
	x := &f.procs[i]
	if !slices.Contains(x.Devices, dev) {
		x.Devices = append(x.Devices, dev)
	}
	x.Fills++
	x.Bytes += res.Bytes
	x.ReadBytes += res.Read
}

func (f *fillProcs) list() []ProcFills {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]ProcFills, len(f.procs))
	for i, x := range f.procs {
		x.Devices = slices.Clone(x.Devices)
		out[i] = x
	}
	return out
}
