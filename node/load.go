package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/gpuio"
)

// LoadRequest is kylix load's work (OpLoad, or run in the CLI's process
// when no node serves the data directory): its flags, named alike.
type LoadRequest struct {
	Paths    []string `json:"paths"`
	Device   string   `json:"device"` // cuda:N or host
	Path     string   `json:"path"`   // gpuio.Path: auto, gds, ...
	Strict   bool     `json:"strict,omitempty"`
	IO       string   `json:"io"`
	TPRank   int      `json:"tp_rank"`
	TPSize   int      `json:"tp_size"`
	Buffers  int      `json:"buffers,omitempty"`
	BufMiB   int      `json:"buffer_mib"`
	NoVerify bool     `json:"no_verify,omitempty"`
	VerifyOn string   `json:"verify_on"`
	Check    bool     `json:"check,omitempty"`
	Repeat   int      `json:"repeat"`
	Files    int      `json:"files"`  // files loaded at once
	Reader   string   `json:"reader"` // pread or io_uring
	// NoKeep: chunks fetched from the members are not kept on this
	// member (by default they are, in its peer cache, behind the load).
	NoKeep bool `json:"no_keep,omitempty"`
	// NoLayout: a rank's share is read from the file as it is even when
	// a rank layout is stored (kylix layout).
	NoLayout bool `json:"no_layout,omitempty"`
}

// LoadPass is one pass of a load, as it ends.
type LoadPass struct {
	Report LoadReport `json:"report"`
	// VerifyNote says where chunks are verified (gpuio.Loader.VerifyNote).
	VerifyNote string `json:"verify_note"`
}

type LoadFile struct {
	Path     string  `json:"path"`
	Tensors  int     `json:"tensors,omitempty"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	GBps     float64 `json:"gb_per_s"`
	DataPath string  `json:"data_path"`
	IO       string  `json:"io"`
	Verified bool    `json:"verified"`
	VerifyOn string  `json:"verified_on,omitempty"`
	Checked  bool    `json:"checked,omitempty"`
	// RankLayout: the rank layout the share was read from (kylix layout),
	// or why a stored one was not used; empty when none is stored.
	RankLayout string `json:"rank_layout,omitempty"`
	// Fetched: bytes of chunks not stored here, fetched from the members
	// during the load (a cluster member).
	Fetched       int64 `json:"fetched_bytes,omitempty"`
	FetchedChunks int   `json:"fetched_chunks,omitempty"`
	fetchCounts

	check func() error  // --check: compare the device bytes with the store
	id    chunkstore.ID // the file version loaded (a rank layout's when one was read)
	size  int64         // its size (Bytes is what a share placed)
	name  string        // what hot files call it: Path, or Path and the layout read
}

type LoadReport struct {
	Device  string     `json:"device"`
	Path    string     `json:"data_path"`
	Note    string     `json:"note"`
	TPRank  int        `json:"tp_rank"`
	TPSize  int        `json:"tp_size"`
	Files   []LoadFile `json:"files"`
	Bytes   int64      `json:"bytes"`
	Seconds float64    `json:"seconds"`
	GBps    float64    `json:"gb_per_s"`
	// FetchedChunks and Fetched: on a cluster member, the chunks of the
	// files not stored here (and their bytes), fetched from the members
	// during the load, in the order the load needs them (timed in
	// Seconds).
	FetchedChunks int   `json:"fetched_chunks"`
	Fetched       int64 `json:"fetched_bytes"`
	fetchCounts
	// CPUSeconds: user + system CPU time of the process that ran the
	// pass (the node, when the command was forwarded to one) while it
	// ran, all its threads, not only the load's.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CachePolicy says how bytes not in the page cache were read, and why
	// (gpuio.FitsPageCache); empty when --io chose.
	CachePolicy string `json:"cache_policy,omitempty"`
}

// fetchCounts: what a load read of chunks not in this member's packs,
// besides what it fetched from the members (chunkstore.FetchNote).
type fetchCounts struct {
	// LocalCopyChunks and LocalCopy: chunks (bytes) read from this
	// member's copy of chunks an earlier load fetched (its peer cache).
	LocalCopyChunks int   `json:"local_copy_chunks,omitempty"`
	LocalCopy       int64 `json:"local_copy_bytes,omitempty"`
	// KeptChunks and Kept: chunks (bytes) fetched and queued to be kept
	// on this member, written behind the load; NotKept: fetched and not
	// queued (the writers were a full queue behind).
	KeptChunks int   `json:"kept_chunks,omitempty"`
	Kept       int64 `json:"kept_bytes,omitempty"`
	NotKept    int   `json:"not_kept_chunks,omitempty"`
}

func (c *fetchCounts) add(o fetchCounts) {
	c.LocalCopyChunks += o.LocalCopyChunks
	c.LocalCopy += o.LocalCopy
	c.KeptChunks += o.KeptChunks
	c.Kept += o.Kept
	c.NotKept += o.NotKept
}

// Load runs req in the node: the CUDA context is the node's, not the
// caller's. onPass receives each pass as it ends. Pinned packs (kylix pin)
// are copied from their locked pages registered with the device
// (gpuio.Options.Pinned), as GPU fills copy them: the node's fill device
// for that GPU, whose loader holds the pins' registration, is held for the
// load (made if need be, kept --gpu-idle after), so the registration is
// made once, not at every load. With hot files on (hot.go) the device is
// held for every GPU load, so files the load makes hot are registered with
// it behind the load.
func (n *Node) Load(ctx context.Context, req LoadRequest, onPass func(LoadPass)) error {
	// Files closed in the mount are loaded as written, as the commands a
	// node runs see them.
	if err := n.Sync(); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	pinned := n.pins.hostOrNil()
	if pinned != nil && (pinned.Locked() > 0 || n.pins.hotOn()) && n.fill != nil {
		if ord, ok := cudaOrdinal(req.Device); ok {
			// A device the fill service cannot take fails the load's
			// own open below, with its reason; the report's io says
			// whether pinned pages were used.
			if d, err := n.fill.acquire(ord); err == nil {
				defer n.fill.release(d)
			}
		}
	} else {
		pinned = nil
	}
	if _, ok := cudaOrdinal(req.Device); ok {
		// Files read from the page cache become hot (hot.go), so the
		// next load copies them straight from registered pages.
		inner := onPass
		onPass = func(p LoadPass) {
			for _, f := range p.Report.Files {
				n.pins.noteLoaded(func() string { return f.name }, f.id, f.size)
			}
			inner(p)
		}
	}
	return load(ctx, n.s, pinned, n.pins.inMemory, req, onPass)
}

// Load loads req.Paths of s into a device, req.Repeat times, and gives each
// pass's report to onPass.
func Load(ctx context.Context, s *chunkstore.Store, req LoadRequest, onPass func(LoadPass)) error {
	return load(ctx, s, nil, nil, req, onPass)
}

// load is Load, copying pinned packs from pinned (nil: none); inMemory
// (nil: none is) says which file versions the node holds locked in
// memory (pins, hot files).
func load(ctx context.Context, s *chunkstore.Store, pinned *gpuio.PinnedHost, inMemory func(chunkstore.ID) bool, req LoadRequest, onPass func(LoadPass)) error {
	if req.TPSize < 1 || req.TPRank < 0 || req.TPRank >= req.TPSize {
		return fmt.Errorf("load: --tp-rank %d must be in [0, --tp-size %d)", req.TPRank, req.TPSize)
	}
	dev, err := openDevice(req.Device)
	if err != nil {
		return err
	}
	defer dev.Close()
	opts := gpuio.Options{
		Path: gpuio.Path(req.Path), Strict: req.Strict, IO: gpuio.IOMode(req.IO),
		Buffers: req.Buffers, BufferSize: req.BufMiB<<20 + 8192, NoVerify: req.NoVerify,
		VerifyOn: gpuio.VerifyOn(req.VerifyOn), Pinned: pinned,
	}
	switch req.Reader {
	case "pread", "":
	case "io_uring":
		// A ring of the loader's own: the store reads the page cache with
		// pread (docs/design/store.md), and a load must not depend on it.
		r, err := storeio.New("io_uring", req.Buffers)
		if err != nil {
			return fmt.Errorf("load: --reader io_uring: %w", err)
		}
		defer r.Close()
		opts.Reader = r
	default:
		return fmt.Errorf("load: --reader %q: want pread or io_uring", req.Reader)
	}
	var files []string
	var total int64
	for _, p := range req.Paths {
		below, err := s.FilesBelow(ctx, p)
		if err != nil {
			return fmt.Errorf("load %s: %w", p, err)
		}
		for _, pf := range below {
			files = append(files, pf.Path)
			total += pf.Entry.Size
		}
	}
	if len(files) == 0 {
		return fmt.Errorf("load: no files under %s", strings.Join(req.Paths, " "))
	}
	// One page-cache policy (docs/design/gpuio.md): a model that fits
	// the cache is read through it, so loading it again is warm.
	var cacheNote string
	if opts.IO == "" || opts.IO == gpuio.IOAuto {
		opts.CacheColdReads, cacheNote = gpuio.FitsPageCache(total)
	}
	l, err := gpuio.New(s, dev, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	for pass := 0; pass < max(1, req.Repeat); pass++ {
		rep, err := loadOnce(ctx, s, l, dev, files, req, inMemory)
		if err != nil {
			return err
		}
		rep.Device = dev.String()
		rep.Path, rep.Note = func() (string, string) { p, n := l.Path(); return string(p), n }()
		rep.CachePolicy = cacheNote
		onPass(LoadPass{Report: *rep, VerifyNote: l.VerifyNote()})
	}
	return nil
}

// processCPU is the user + system CPU time this process has used, in
// seconds (0 if the kernel does not say).
func processCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// cudaOrdinal returns N of "cuda:N".
func cudaOrdinal(name string) (int, bool) {
	n, ok := strings.CutPrefix(name, "cuda:")
	ord, err := strconv.Atoi(n)
	return ord, ok && err == nil && ord >= 0
}

// openDevice opens "cuda:N" or "host". No GPU is an error, never a silent
// switch to the host device.
func openDevice(name string) (gpuio.Device, error) {
	if name == "host" {
		// Freed memory is reused, as GPU allocators do, so --repeat
		// measures loads into memory touched before (gpuio.HostDevice).
		return &gpuio.HostDevice{Reuse: true}, nil
	}
	ord, ok := cudaOrdinal(name)
	if !ok {
		return nil, fmt.Errorf("load: --device %q: want cuda:N or host", name)
	}
	d, err := gpuio.NewCUDADevice(ord)
	if err != nil {
		return nil, fmt.Errorf("load: %w (see kylix doctor; --device host loads into host memory for testing)", err)
	}
	return d, nil
}

func loadOnce(ctx context.Context, s *chunkstore.Store, l *gpuio.Loader, dev gpuio.Device, files []string, req LoadRequest, inMemory func(chunkstore.ID) bool) (*LoadReport, error) {
	rep := &LoadReport{TPRank: req.TPRank, TPSize: req.TPSize}
	var mems []gpuio.DeviceMem
	defer func() {
		for _, m := range mems {
			m.Free()
		}
	}()
	start, cpu0 := time.Now(), processCPU()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make([]error, len(files))
		outs = make([]*LoadFile, len(files))
		next atomic.Int64
	)
	keep := func(m gpuio.DeviceMem) {
		mu.Lock()
		mems = append(mems, m)
		mu.Unlock()
	}
	// Several files in flight share the loader's buffers, so the pipeline
	// does not drain at each file boundary. The first failure stops the rest.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range max(1, min(req.Files, len(files))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(files) {
					return
				}
				outs[i], errs[i] = loadOne(ctx, s, l, dev, files[i], req, keep, inMemory)
				if errs[i] != nil {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	// Report the failure that stopped the load, not the cancellations it
	// caused in the other files.
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, context.Canceled)) {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	for _, lf := range outs {
		if lf != nil {
			rep.Files = append(rep.Files, *lf)
			rep.Bytes += lf.Bytes
			rep.Fetched += lf.Fetched
			rep.FetchedChunks += lf.FetchedChunks
			rep.fetchCounts.add(lf.fetchCounts)
		}
	}
	el, cpu := time.Since(start), processCPU()-cpu0
	// Checks run after the clock stopped: they copy everything back.
	for i := range rep.Files {
		if c := rep.Files[i].check; c != nil {
			if err := c(); err != nil {
				return nil, fmt.Errorf("load --check %s: %w", rep.Files[i].Path, err)
			}
			rep.Files[i].Checked = true
		}
	}
	rep.Seconds, rep.CPUSeconds = el.Seconds(), cpu
	if rep.Seconds > 0 {
		rep.GBps = float64(rep.Bytes) / rep.Seconds / 1e9
	}
	return rep, nil
}

// loadOne loads one stored file; keep takes ownership of device memory.
func loadOne(ctx context.Context, s *chunkstore.Store, l *gpuio.Loader, dev gpuio.Device, p string, req LoadRequest, keep func(gpuio.DeviceMem), inMemory func(chunkstore.ID) bool) (*LoadFile, error) {
	rank, size := req.TPRank, req.TPSize
	note := &chunkstore.FetchNote{NoKeep: req.NoKeep}
	ctx = chunkstore.WithFetchNote(ctx, note)
	file, _, err := s.OpenPath(p)
	if err != nil {
		return nil, err
	}
	s.NoteRead(file.ID) // serve --cold-after counts from here (chunkstore/lastread.go)
	lf := LoadFile{Path: p, id: file.ID, size: file.Size(), name: p}
	var res gpuio.Result
	var verifyFn func() error
	if file.M.Format == chunkstore.FormatSafetensors {
		h, err := safetensors.Parse(file, file.Size())
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", p, err)
		}
		var targets []gpuio.TensorTarget
		var total int64
		offs := make([]int64, len(h.Tensors))
		layouts := make([]gpuio.ShareLayout, len(h.Tensors))
		for i, t := range h.Tensors {
			sh := gpuio.TPShare(t, rank, size)
			sl, err := sh.Layout(t)
			if err != nil {
				return nil, fmt.Errorf("load %s: %w", p, err)
			}
			offs[i], layouts[i] = total, sl
			total += (sl.Bytes + 255) &^ 255 // 256-byte aligned, like allocators
			targets = append(targets, gpuio.TensorTarget{Name: t.Name, Share: sh, Off: offs[i]})
		}
		mem, err := dev.Alloc(max(total, 1))
		if err != nil {
			return nil, fmt.Errorf("load %s: allocate %d bytes: %w", p, total, err)
		}
		keep(mem)
		for i := range targets {
			targets[i].Mem = mem
		}
		lf.Tensors = len(targets)
		// A rank layout holds exactly these shares, back to back: the
		// share is then one run of the layout (docs/design/ranklayout.md).
		from, fromH := file, h
		if size > 1 && !req.NoLayout {
			rl, rlh, err := gpuio.OpenRankLayout(s, file, h, rank, size)
			switch {
			case err != nil:
				lf.RankLayout = "not used: " + err.Error()
			case rl != nil && !preferLayout(inMemory != nil && inMemory(file.ID), inMemory, rl.ID):
				lf.RankLayout = fmt.Sprintf("not used: the file is held in memory (pinned or hot), its layout tp%d-rank%d is not", size, rank)
			case rl != nil:
				from, fromH = rl, rlh
				for i := range targets {
					targets[i].Share = nil
				}
				lf.RankLayout = fmt.Sprintf("tp%d-rank%d %s", size, rank, rl.ID.Short())
				lf.id, lf.size, lf.name = rl.ID, rl.Size(), p+" ("+lf.RankLayout+")"
			}
		}
		res, err = l.LoadTensors(ctx, from, fromH, targets)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", p, err)
		}
		verifyFn = func() error {
			for i, t := range h.Tensors {
				src := make([]byte, t.Size())
				if _, err := file.ReadAtContext(ctx, src, h.DataStart()+t.Begin); err != nil {
					return err
				}
				sl := layouts[i]
				want := make([]byte, 0, sl.Bytes)
				for r := int64(0); r < sl.Rows; r++ {
					want = append(want, src[r*sl.Pitch+sl.ColOff:][:sl.Width]...)
				}
				got := make([]byte, sl.Bytes)
				if err := mem.CopyToHost(got, offs[i]); err != nil {
					return err
				}
				if chunkstore.Sum(got) != chunkstore.Sum(want) {
					return fmt.Errorf("tensor %s: device bytes differ from the store", t.Name)
				}
			}
			return nil
		}
	} else {
		if rank != 0 && size > 1 {
			return nil, nil // opaque files go to rank 0 only
		}
		mem, err := dev.Alloc(max(file.Size(), 1))
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", p, err)
		}
		keep(mem)
		res, err = l.ReadRange(ctx, file, 0, file.Size(), mem, 0)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", p, err)
		}
		verifyFn = func() error {
			want := make([]byte, file.Size())
			if _, err := file.ReadAtContext(ctx, want, 0); err != nil && file.Size() > 0 {
				return err
			}
			got := make([]byte, file.Size())
			if err := mem.CopyToHost(got, 0); err != nil {
				return err
			}
			if chunkstore.Sum(got) != chunkstore.Sum(want) {
				return errors.New("device bytes differ from the store")
			}
			return nil
		}
	}
	lf.Bytes, lf.Seconds, lf.GBps = res.Bytes, res.Duration.Seconds(), res.GBps()
	lf.DataPath, lf.IO, lf.Verified, lf.VerifyOn = string(res.Path), res.IO, res.Verified, res.VerifyOn
	// res counts every chunk not in the packs as fetched; those read
	// from this member's copy were not.
	lf.LocalCopyChunks, lf.LocalCopy = int(note.Local.Load()), note.LocalBytes.Load()
	lf.Fetched, lf.FetchedChunks = max(0, res.Fetched-lf.LocalCopy), max(0, res.FetchedChunks-lf.LocalCopyChunks)
	lf.KeptChunks, lf.Kept, lf.NotKept = int(note.Kept.Load()), note.KeptBytes.Load(), int(note.NotKept.Load())
	if req.Check {
		lf.check = verifyFn
	}
	return &lf, nil
}
