package node

// Hot files (docs/design/pin.md, "Hot files"): after a GPU load (a client's
// FILL, or kylix load through the node) of a file whose bytes are all in the
// page cache, the node locks and registers that file's pack ranges by
// itself, as a pin would, so the next load of it — typically by a fresh
// process — is copied by the copy engine straight from the page cache
// instead of through the bounce buffers. Nothing is recorded: hot files
// are the node's own cache, within --hot-budget, released least recently
// loaded first when the budget is full, when a pin needs the memory, when
// the machine runs short of memory, and after hotIdle without a load.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
)

const (
	// DefaultHotBudget is the share of physical memory hot files may lock.
	DefaultHotBudget = "25%"
	// hotIdle: a hot file not loaded for this long is released.
	hotIdle = 30 * time.Minute
	// hotFloorPercent: hot files are released (least recently loaded
	// first) while the memory available to the kernel is below this share
	// of physical memory, and none is made that would take it below.
	hotFloorPercent = 10
	// hotTick is how often idle and memory are checked.
	hotTick = 5 * time.Second
	// hotResidentPercent: a file is made hot only when this share of its
	// pack ranges is in the page cache (locking the rest would read it
	// from the disk, behind the caller's back).
	hotResidentPercent = 99
	// hotMinSize: smaller files are not made hot (a copy through the
	// bounce buffers costs them little, and each hot file is a locked
	// mapping of the node's).
	hotMinSize = 1 << 20
	// hotMaxFiles bounds the hot files (each holds a mapping per pack
	// range, and a process has at most vm.max_map_count, 65530 by
	// default); past it the least recently loaded goes.
	hotMaxFiles = 4096
)

// ParseHotBudget parses --hot-budget: a size, a share of physical memory,
// or 0 (no hot files).
func ParseHotBudget(s string) (int64, error) { return parseMemoryShare("hot-budget", s) }

// hotFile is one file version the node made hot.
type hotFile struct {
	held *pinHeld
	used time.Time // the last load of it
}

type hotReq struct {
	path string
	id   chunkstore.ID
}

// hotState is the hot files of a node's pins (guarded by nodePins.mu; made
// and released under nodePins.op).
type hotState struct {
	budget   int64
	floor    int64 // bytes of memory available below which hot files go
	maxFiles int   // hotMaxFiles; tests lower it
	files    map[chunkstore.ID]*hotFile
	queue    chan hotReq
	done     chan struct{} // the worker ended
	// memAvailable and now: the machine's, replaced in tests.
	memAvailable func() (int64, error)
	now          func() time.Time

	made, skipped, dropped atomic.Int64
	memlockSaid            atomic.Bool      // the memory-lock limit was logged
	evicted                map[string]int64 // by reason
	lastSkip               string
}

// startHot starts the worker that makes files hot, within budget bytes (0:
// none are made).
func (np *nodePins) startHot(budget int64) error {
	total, err := physicalMemory()
	if err != nil {
		return fmt.Errorf("serve: hot files: %w", err)
	}
	np.hot = &hotState{budget: budget, floor: total * hotFloorPercent / 100, maxFiles: hotMaxFiles, files: map[chunkstore.ID]*hotFile{},
		queue: make(chan hotReq, 64), done: make(chan struct{}), memAvailable: gpuio.MemAvailable, now: time.Now, evicted: map[string]int64{}}
	if budget <= 0 {
		close(np.hot.done)
		return nil
	}
	go np.hotLoop(np.ctx)
	return nil
}

// hotOn reports whether the node makes hot files.
func (np *nodePins) hotOn() bool { return np != nil && np.hot != nil && np.hot.budget > 0 }

// noteLoaded tells the node that a GPU load read file version id (at
// namespace path, "" if unknown) from this node: a hot file counts as used,
// any other is queued to be made hot. Cheap: it runs after every GPU fill.
func (np *nodePins) noteLoaded(path func() string, id chunkstore.ID, size int64) {
	if !np.hotOn() || size < hotMinSize {
		return
	}
	np.mu.Lock()
	if h := np.hot.files[id]; h != nil {
		h.used = np.hot.now()
		np.mu.Unlock()
		return
	}
	pinned := np.pinnedLocked(id)
	np.mu.Unlock()
	if pinned {
		return
	}
	select {
	case np.hot.queue <- hotReq{path: path(), id: id}:
	default:
		np.hot.dropped.Add(1) // the worker is behind: a later load asks again
	}
}

// pinnedLocked reports whether a held pin holds file version id (np.mu held).
func (np *nodePins) pinnedLocked(id chunkstore.ID) bool {
	for _, p := range np.pins {
		if p.held() && p.files[id] {
			return true
		}
	}
	return false
}

func (np *nodePins) hotLoop(ctx context.Context) {
	defer close(np.hot.done)
	t := time.NewTicker(hotTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-np.hot.queue:
			np.makeHot(ctx, r)
		case <-t.C:
			np.trimHot()
		}
	}
}

// makeHot locks and registers the pack ranges of r's file version, if it
// is still not hot nor pinned, all in the page cache, and fits the budget
// (after releasing the least recently loaded hot files) and the memory
// floor.
func (np *nodePins) makeHot(ctx context.Context, r hotReq) {
	np.op.Lock()
	defer np.op.Unlock()
	hs := np.hot
	np.mu.Lock()
	skip := hs.files[r.id] != nil || np.pinnedLocked(r.id)
	np.mu.Unlock()
	if skip || ctx.Err() != nil {
		return
	}
	name := r.path
	if name == "" {
		name = "file " + r.id.String()[:16]
	}
	not := func(why string, args ...any) {
		hs.skipped.Add(1)
		np.mu.Lock()
		hs.lastSkip = name + ": " + fmt.Sprintf(why, args...)
		np.mu.Unlock()
		np.log.Debug("not made hot", "file", name, "why", fmt.Sprintf(why, args...))
	}
	p := &pinHeld{path: name, added: hs.now().UTC(), files: map[chunkstore.ID]bool{}}
	if err := np.addFile(p, name, r.id); err != nil {
		not("%v", err)
		return
	}
	var span, resident int64
	for _, sp := range p.spans {
		span += sp.Len
		n, err := gpuio.ResidentBytes(sp.Path, sp.Off, sp.Len)
		if err != nil {
			not("%v", err)
			return
		}
		resident += n
	}
	if resident*100 < span*hotResidentPercent {
		not("%s of its %s in the page cache", human(resident), human(span))
		return
	}
	// An older version of the same path, hot, is no longer what is
	// loaded: it goes first (reason "replaced").
	if r.path != "" {
		np.mu.Lock()
		var old []chunkstore.ID
		for id, f := range hs.files {
			if f.held.path == r.path && id != r.id {
				old = append(old, id)
			}
		}
		np.mu.Unlock()
		for _, id := range old {
			np.releaseHot(id, "replaced")
		}
	}
	need := np.host.Added(p.spans)
	if need > hs.budget {
		not("it needs %s of locked memory, more than the hot budget (%s)", human(need), human(hs.budget))
		return
	}
	for len(np.hotFiles()) >= hs.maxFiles && np.evictHot("budget") {
	}
	for np.hotLocked()+need > hs.budget || np.host.Locked()+need > np.budget {
		if !np.evictHot("budget") {
			not("it needs %s of locked memory and the pins leave %s of the pin budget (%s)", human(need), human(max(0, np.budget-np.host.Locked())), human(np.budget))
			return
		}
		need = np.host.Added(p.spans)
	}
	if avail, err := hs.memAvailable(); err != nil {
		not("memory available unknown: %v", err)
		return
	} else if avail-need < hs.floor {
		not("locking %s would leave %s of memory available, under the %d%% kept free (%s)", human(need), human(avail-need), hotFloorPercent, human(hs.floor))
		return
	}
	for _, sp := range p.spans {
		// Verified when locked, as a pin is: every chunk hashed from the
		// locked pages (on all cores, behind the load that asked). Loads
		// then place the chunks as they are while the pack file keeps
		// the identity it had then, and hash them again once it changed
		// (gpuio.PinnedRange: a write to the pack changes its times),
		// the guarantee passthrough gives (docs/design/pin.md).
		lr, err := np.host.Lock(sp)
		if err != nil {
			p.release()
			not("%v", err)
			// The memory-lock limit refuses every file alike: said once
			// (kylix doctor's pins line says it too), not per load.
			if !errors.Is(err, gpuio.ErrMemlock) || hs.memlockSaid.CompareAndSwap(false, true) {
				np.log.Warn("a file loaded from the page cache could not be made hot", "file", name, "err", err)
			}
			return
		}
		p.locked = append(p.locked, lr)
	}
	p.state = "held"
	np.mu.Lock()
	hs.files[r.id] = &hotFile{held: p, used: hs.now()}
	np.mu.Unlock()
	hs.made.Add(1)
	np.log.Debug("made hot", "file", name, "bytes", need)
}

// inMemory reports whether file version id is locked in the node's memory
// now: held by a pin, or a hot file.
func (np *nodePins) inMemory(id chunkstore.ID) bool {
	if np == nil {
		return false
	}
	np.mu.Lock()
	defer np.mu.Unlock()
	if np.pinnedLocked(id) {
		return true
	}
	if np.hot == nil {
		return false
	}
	_, hot := np.hot.files[id]
	return hot
}

// hotFiles is the hot file versions.
func (np *nodePins) hotFiles() []chunkstore.ID {
	np.mu.Lock()
	defer np.mu.Unlock()
	return slices.Collect(maps.Keys(np.hot.files))
}

// hotLocked is the bytes the hot files lock (a range two of them share is
// counted twice).
func (np *nodePins) hotLocked() int64 {
	np.mu.Lock()
	defer np.mu.Unlock()
	var n int64
	for _, h := range np.hot.files {
		for _, r := range h.held.locked {
			n += r.Size()
		}
	}
	return n
}

// evictHot releases the least recently loaded hot file, for reason; false
// if there is none. The caller holds np.op.
func (np *nodePins) evictHot(reason string) bool {
	hs := np.hot
	if hs == nil {
		return false
	}
	np.mu.Lock()
	var lru chunkstore.ID
	var h *hotFile
	for id, f := range hs.files {
		if h == nil || f.used.Before(h.used) {
			lru, h = id, f
		}
	}
	np.mu.Unlock()
	return h != nil && np.releaseHot(lru, reason)
}

// releaseHot releases hot file version id, for reason; false if it is not
// hot. The caller holds np.op.
func (np *nodePins) releaseHot(id chunkstore.ID, reason string) bool {
	hs := np.hot
	np.mu.Lock()
	h := hs.files[id]
	if h == nil {
		np.mu.Unlock()
		return false
	}
	delete(hs.files, id)
	hs.evicted[reason]++
	np.mu.Unlock()
	if err := h.held.release(); err != nil {
		np.log.Warn("releasing a hot file", "file", h.held.path, "err", err)
	}
	np.log.Debug("hot file released", "file", h.held.path, "reason", reason)
	return true
}

// releaseAllHot releases every hot file (reason gpu-idle): the node gave
// its last GPU context back, and the registrations with it; kept, they
// would all be registered again when the next loader is made, on the path
// of whatever that load is. Loads after it make them hot again.
func (np *nodePins) releaseAllHot() {
	if !np.hotOn() {
		return
	}
	np.op.Lock()
	defer np.op.Unlock()
	for _, id := range np.hotFiles() {
		np.releaseHot(id, "gpu-idle")
	}
}

// trimHot releases hot files not loaded for hotIdle, then, while the
// memory available is under the floor, the least recently loaded.
func (np *nodePins) trimHot() {
	np.op.Lock()
	defer np.op.Unlock()
	hs := np.hot
	for {
		np.mu.Lock()
		idle := false
		for _, h := range hs.files {
			idle = idle || hs.now().Sub(h.used) >= hotIdle
		}
		np.mu.Unlock()
		if !idle || !np.evictHot("idle") {
			break
		}
	}
	for {
		avail, err := hs.memAvailable()
		if err != nil || avail >= hs.floor || !np.evictHot("memory") {
			return
		}
	}
}

// closeHot stops the worker and releases the hot files (node stop).
func (np *nodePins) closeHot() {
	if np.hot == nil {
		return
	}
	<-np.hot.done // np.ctx has ended
	np.op.Lock()
	defer np.op.Unlock()
	for np.evictHot("stop") {
	}
}

// HotStatus is what `kylix node` says about hot files.
type HotStatus struct {
	BudgetBytes int64 `json:"budget_bytes"`
	LockedBytes int64 `json:"locked_bytes"`
	// Files: the hot files, most recently loaded first.
	Files []HotFileStatus `json:"files"`
	Made  int64           `json:"made"`
	// Skipped: loads of files not made hot (LastSkip says why, for the
	// last one); Dropped: loads not even considered (the worker was
	// behind).
	Skipped  int64            `json:"skipped"`
	Dropped  int64            `json:"dropped"`
	LastSkip string           `json:"last_skip,omitempty"`
	Evicted  map[string]int64 `json:"evicted"` // by reason: budget, pin, idle, memory, replaced, gpu-idle
}

type HotFileStatus struct {
	Path        string    `json:"path"`
	Bytes       int64     `json:"bytes"`
	LockedBytes int64     `json:"locked_bytes"`
	LastLoad    time.Time `json:"last_load"`
}

func (np *nodePins) hotStatus() *HotStatus {
	hs := np.hot
	if hs == nil {
		return nil
	}
	out := &HotStatus{BudgetBytes: hs.budget, Files: []HotFileStatus{}, Made: hs.made.Load(), Skipped: hs.skipped.Load(), Dropped: hs.dropped.Load()}
	np.mu.Lock()
	for _, h := range hs.files {
		f := HotFileStatus{Path: h.held.path, Bytes: h.held.bytes, LastLoad: h.used.UTC()}
		for _, r := range h.held.locked {
			f.LockedBytes += r.Size()
		}
		out.LockedBytes += f.LockedBytes
		out.Files = append(out.Files, f)
	}
	out.LastSkip = hs.lastSkip
	out.Evicted = maps.Clone(hs.evicted)
	np.mu.Unlock()
	slices.SortFunc(out.Files, func(a, b HotFileStatus) int { return b.LastLoad.Compare(a.LastLoad) })
	return out
}
