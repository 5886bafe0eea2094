package node

// Pins (docs/design/pin.md): a running node keeps the packs of pinned paths
// mapped and locked in memory, within --pin-budget, registered with the
// device of every GPU loader it holds (gpuio.PinnedHost), and records the
// pinned paths in DATA/pins.json so a restarted node pins them again.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/internal/pace"
	"github.com/kylix/kylix/internal/units"
)

const (
	pinRecordName = "pins.json"
)

// pinRecord is DATA/pins.json.
type pinRecord struct {
	Version int              `json:"version"`
	Pins    []pinRecordEntry `json:"pins"`
}

type pinRecordEntry struct {
	Path  string    `json:"path"`
	Added time.Time `json:"added"`
	// Pending: a pin in a cluster still bringing its chunks here. It is
	// recorded so that rebalance keeps what arrives (the record is the
	// node's keep set) and removed if the pin fails; a node that stopped
	// in the middle resumes it at its next start (fetchMissing).
	Pending bool `json:"pending,omitempty"`
	// Kept: not a pin but a file made local by KYLIX_IOC_MAKE_LOCAL on a
	// cluster member. Nothing is locked; its chunks stored here are in
	// the keep set, so rebalance does not drop them again.
	Kept bool `json:"kept,omitempty"`
}

// nodePins is the pins of a running node.
type nodePins struct {
	s      *chunkstore.Store
	log    *slog.Logger
	host   *gpuio.PinnedHost
	budget int64
	// ctx ends the start-up re-pins when the node stops.
	ctx    context.Context
	cancel context.CancelFunc

	op sync.Mutex // one pin or unpin at a time (and the start-up re-pins)

	mu   sync.Mutex // guards pins, kept, pending
	pins map[string]*pinHeld
	// kept: paths made local by KYLIX_IOC_MAKE_LOCAL (keepLocal), when
	// recorded.
	kept map[string]time.Time
	// pending: the path of a pin fetching its chunks ("" none).
	pending string
	// relocked is closed when the recorded pins were locked again at
	// start (or failed to be).
	relocked chan struct{}
	// hot: the files the node made hot by itself (hot.go).
	hot *hotState
}

// pinHeld is one pin: the file versions it resolved to and their locked
// ranges.
type pinHeld struct {
	path   string
	added  time.Time
	files  map[chunkstore.ID]bool
	nfiles int
	bytes  int64 // file bytes (logical)
	spans  []gpuio.PackSpan
	locked []*gpuio.PinnedRange
	// state: "pinning" (at start), "held", or why it is not held.
	state string
	// notHere: not held at start because chunks are not stored here;
	// fetchMissing brings them in a cluster.
	notHere bool
}

func (p *pinHeld) held() bool { return p.state == "held" }

func (p *pinHeld) release() error {
	var errs []error
	for _, r := range p.locked {
		errs = append(errs, r.Release())
	}
	p.locked = nil
	return errors.Join(errs...)
}

// fetchMissing brings the chunks of the recorded pins that could not be
// held at start because chunks were not stored here (a pin the node
// stopped in the middle of, or chunks lost since), from the members of
// node's cluster, and pins them. While no member can send a chunk (the
// cluster is still forming, or its holders are down) it tries again, at
// growing intervals up to a minute, until the node stops; kylix node shows
// the pin as not held meanwhile. Other failures (the pin budget) end it,
// and so does the end of ctx.
func (np *nodePins) fetchMissing(ctx context.Context) {
	select {
	case <-np.relocked:
	case <-ctx.Done():
		return
	}
	np.mu.Lock()
	var paths []string
	for path, p := range np.pins {
		if p.notHere {
			paths = append(paths, path)
		}
	}
	np.mu.Unlock()
	slices.Sort(paths)
	for _, path := range paths {
		wait := 2 * time.Second
		for try := 1; ; try++ {
			np.mu.Lock()
			cur := np.pins[path]
			np.mu.Unlock()
			if cur == nil || !cur.notHere {
				break // unpinned, or pinned again by kylix pin meanwhile
			}
			_, got, err := np.pin(ctx, path, &pinCluster{})
			if err == nil {
				np.log.Info("pinned again after fetching its missing chunks from the members", "path", path, "chunks", got.chunks, "bytes", got.bytes)
				break
			}
			if ctx.Err() != nil {
				return
			}
			np.mu.Lock()
			if cur := np.pins[path]; cur != nil && cur.notHere {
				cur.state = "not held: " + err.Error()
			}
			np.mu.Unlock()
			if !errors.Is(err, chunkstore.ErrNotLocal) && !errors.Is(err, errNotHere) {
				np.mu.Lock()
				if cur := np.pins[path]; cur != nil {
					cur.notHere = false
				}
				np.mu.Unlock()
				np.log.Warn("a recorded pin could not be held (kylix node; kylix unpin removes it)", "path", path, "err", err)
				break
			}
			if try == 1 {
				np.log.Warn("fetching a recorded pin's missing chunks failed; trying again", "path", path, "err", err)
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
			wait = min(2*wait, time.Minute)
		}
	}
}

// ParsePinBudget parses a pin budget: a size (64GiB), a share of physical
// memory (50%), or 0 (no pins).
func ParsePinBudget(s string) (int64, error) { return parseMemoryShare("pin-budget", s) }

// parseMemoryShare parses the value of flag name: a size, a share of
// physical memory, or 0.
func parseMemoryShare(name, s string) (int64, error) {
	v, err := units.ParseSizeOrPercent(s)
	if err != nil {
		return 0, fmt.Errorf("%s %w: want a size such as 64GiB or a share of memory such as 50%%", name, err)
	}
	if v.Percent == 0 {
		return v.Bytes, nil
	}
	total, err := physicalMemory()
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", name, s, err)
	}
	return v.Of(total), nil
}

// physicalMemory is the machine's memory in bytes (sysinfo).
func physicalMemory() (int64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("reading the machine's memory size: %w", err)
	}
	return int64(uint64(si.Totalram) * uint64(si.Unit)), nil
}

// startPins makes the node's pins and pins the recorded paths again, in the
// background (the mount does not wait for them; `kylix node` shows them as
// "pinning" until they are held).
func startPins(s *chunkstore.Store, budget, hotBudget int64, log *slog.Logger) (np *nodePins, err error) {
	np = &nodePins{s: s, log: log, host: gpuio.NewPinnedHost(), budget: budget, pins: map[string]*pinHeld{}, kept: map[string]time.Time{}, relocked: make(chan struct{})}
	np.ctx, np.cancel = context.WithCancel(context.Background())
	if err := np.startHot(hotBudget); err != nil {
		np.cancel()
		return nil, err
	}
	cancel := np.cancel // np is nil on an error return
	defer func() {
		if err != nil {
			cancel()
		}
	}()
	os.Remove(filepath.Join(s.Dir(), pinRecordName+".tmp")) // left by a node killed while writing
	rec, err := readPinRecord(s.Dir())
	if err != nil {
		return nil, fmt.Errorf("serve: %w (fix or remove it; it only lists pinned paths)", err)
	}
	if i := slices.IndexFunc(rec.Pins, func(r pinRecordEntry) bool { return r.Pending }); i >= 0 {
		// A pin still bringing its chunks here when the node stopped: it
		// is pinned again like the others, and what is missing is fetched
		// once the node is a cluster member again (fetchMissing).
		for i, r := range rec.Pins {
			if r.Pending {
				log.Warn("a pin was still fetching its chunks when the node stopped; it is resumed", "path", r.Path)
				rec.Pins[i].Pending = false
			}
		}
		if err := writePinRecord(s.Dir(), rec); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	for _, r := range rec.Pins {
		if r.Kept {
			np.kept[r.Path] = r.Added
		}
	}
	rec.Pins = slices.DeleteFunc(rec.Pins, func(r pinRecordEntry) bool { return r.Kept })
	if len(rec.Pins) == 0 {
		close(np.relocked)
		return np, nil
	}
	np.op.Lock()
	for _, r := range rec.Pins {
		np.pins[r.Path] = &pinHeld{path: r.Path, added: r.Added, state: "pinning"}
	}
	go func() {
		defer close(np.relocked)
		defer np.op.Unlock()
		for _, r := range rec.Pins {
			p, err := np.lockPath(np.ctx, r.Path)
			np.mu.Lock()
			if errors.Is(err, errNotHere) {
				// Fetched from the members once the node is in its
				// cluster (fetchMissing); without one it stays so.
				np.pins[r.Path].state = "not held: " + err.Error()
				np.pins[r.Path].notHere = true
				log.Warn("a recorded pin is missing chunks on this node; in a cluster they are fetched from the members", "path", r.Path, "err", err)
			} else if err != nil {
				np.pins[r.Path].state = "not held: " + err.Error()
				log.Warn("a recorded pin could not be held (kylix node; kylix unpin removes it)", "path", r.Path, "err", err)
			} else {
				p.added = r.Added
				np.pins[r.Path] = p
				log.Info("pinned again", "path", r.Path, "bytes", p.bytes)
			}
			np.mu.Unlock()
		}
	}()
	return np, nil
}

// hostOrNil is the pinned memory for gpuio.Options.Pinned (nil: no pins).
func (np *nodePins) hostOrNil() *gpuio.PinnedHost {
	if np == nil {
		return nil
	}
	return np.host
}

// close releases every pin (node stop; the record stays).
func (np *nodePins) close() {
	np.cancel()
	np.closeHot()
	np.op.Lock()
	defer np.op.Unlock()
	np.mu.Lock()
	defer np.mu.Unlock()
	for _, p := range np.pins {
		p.release()
	}
}

// resolve finds the file versions under path and their pack spans.
func (np *nodePins) resolve(ctx context.Context, path string) (*pinHeld, error) {
	p := &pinHeld{path: path, added: time.Now().UTC(), files: map[chunkstore.ID]bool{}}
	files, err := np.s.FilesBelow(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", ShownPath(path), err)
	}
	for _, pf := range files {
		if pf.Again {
			continue
		}
		if err := np.addFile(p, pf.Path, pf.Entry.ID); err != nil {
			return nil, fmt.Errorf("pin %s: %w", ShownPath(path), err)
		}
	}
	return p, nil
}

// addFile adds file version id (at namespace path fp) to p: its size and
// the pack spans that hold it, each with its chunks.
func (np *nodePins) addFile(p *pinHeld, fp string, id chunkstore.ID) error {
	f, err := np.s.OpenFile(id)
	if err != nil {
		return fmt.Errorf("%s: %w", fp, err)
	}
	p.files[id] = true
	p.nfiles++
	p.bytes += f.Size()
	// Each span carries its chunks: the pin hashes them from the
	// locked pages, and loads then need not (docs/design/pin.md).
	plan, err := f.Plan(0, f.Size())
	if err != nil {
		return fmt.Errorf("%s: %w", fp, err)
	}
	defer plan.Release()
	pieces := plan.Pieces
	for _, x := range f.Extents() {
		if x.Pack == 0 {
			return fmt.Errorf("%s: %s at offset %d is %w; only local data can be pinned (in a cluster, kylix pin brings it from the members first)", fp, human(x.Len), x.FileOff, errNotHere)
		}
		var chunks []chunkstore.Piece
		for len(pieces) > 0 && pieces[0].FileOff < x.FileOff+x.Len {
			if pc := pieces[0]; pc.FileOff >= x.FileOff {
				chunks = append(chunks, chunkstore.Piece{ID: pc.ID, FileOff: pc.FileOff, Len: pc.Len, Pack: pc.Pack, PackOff: pc.PackOff})
			}
			pieces = pieces[1:]
		}
		p.spans = append(p.spans, gpuio.PackSpan{Pack: x.Pack, Path: x.PackPath, Off: x.PackOff, Len: x.Len, Chunks: chunks})
	}
	return nil
}

// ShownPath is a namespace path as messages show it ("/" for the root).
func ShownPath(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// lockPath resolves path and locks all of it within the budget, or nothing.
// The caller holds np.op.
func (np *nodePins) lockPath(ctx context.Context, path string) (*pinHeld, error) {
	p, err := np.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	used, need := np.host.Locked(), np.host.Added(p.spans)
	// Hot files (hot.go) are the node's own cache: a pin comes first.
	for used+need > np.budget && np.evictHot("pin") {
		used, need = np.host.Locked(), np.host.Added(p.spans)
	}
	if used+need > np.budget {
		return nil, fmt.Errorf("pin %s: refused: it needs %s more locked memory (%s of files), the node's pin budget is %s and %s of it is used (%s free): unpin something (kylix unpin) or restart the node with a larger --pin-budget",
			ShownPath(path), human(need), human(p.bytes), human(np.budget), human(used), human(max(0, np.budget-used)))
	}
	for _, sp := range p.spans {
		if err := ctx.Err(); err != nil {
			p.release()
			return nil, err
		}
		r, err := np.host.Lock(sp)
		if err != nil {
			p.release() // nothing half-pinned
			return nil, fmt.Errorf("pin %s: %w", ShownPath(path), err)
		}
		p.locked = append(p.locked, r)
	}
	p.state = "held"
	return p, nil
}

// pinFetched is what a pin brought from the cluster before it locked.
type pinFetched struct {
	chunks int
	bytes  int64
}

// pin pins path (again: the pin then follows the path's current version).
// In a cluster (cl not nil) it first brings the chunks of path not stored
// here from the members into this node's packs, recording the path as a
// pending pin meanwhile so that rebalance keeps them; a failure leaves the
// record as it was.
func (np *nodePins) pin(ctx context.Context, path string, cl *pinCluster) (*pinHeld, pinFetched, error) {
	np.op.Lock()
	defer np.op.Unlock()
	var got pinFetched
	pending := false
	defer func() {
		if pending { // failed: the record without the pending entry
			np.mu.Lock()
			np.pending = ""
			if err := np.saveLocked(); err != nil {
				np.log.Error("removing a failed pin from the record", "path", path, "err", err)
			}
			np.mu.Unlock()
		}
	}()
	var p *pinHeld
	for try := 0; ; try++ {
		if cl != nil {
			miss, bytes, err := np.s.MissingBelow(ctx, path)
			if err != nil {
				return nil, got, fmt.Errorf("pin %s: %w", ShownPath(path), err)
			}
			if len(miss) > 0 {
				// Bytes no pin locks yet: the pin needs at least that much.
				if used := np.host.Locked(); used+bytes > np.budget {
					return nil, got, fmt.Errorf("pin %s: refused: %s of it is not on this node, more than the node's pin budget leaves free (%s of %s used): unpin something (kylix unpin) or restart the node with a larger --pin-budget",
						ShownPath(path), human(bytes), human(used), human(np.budget))
				}
				np.mu.Lock()
				if np.pins[path] == nil && !pending {
					np.pending = path
					if err := np.saveLocked(); err != nil {
						np.pending = ""
						np.mu.Unlock()
						return nil, got, fmt.Errorf("pin %s: %w", ShownPath(path), err)
					}
					pending = true
				}
				np.mu.Unlock()
				label := "pin " + ShownPath(path) + ": fetching"
				res, err := np.s.MakeLocal(ctx, miss, func(done, total int64) { cl.progress.report(label, done, total) })
				got.chunks += res.Chunks
				got.bytes += res.Bytes
				if err != nil {
					return nil, got, fmt.Errorf("pin %s: not pinned: %w", ShownPath(path), err)
				}
			}
		}
		var err error
		p, err = np.lockPath(ctx, path)
		if err == nil {
			break
		}
		// A chunk brought here was dropped again before the pending
		// record kept it (a rebalance pass already under way): bring it
		// again.
		if cl == nil || !errors.Is(err, errNotHere) || try == 2 {
			return nil, got, err
		}
	}
	np.mu.Lock()
	old := np.pins[path]
	np.pins[path] = p
	if old != nil {
		p.added = old.added
	}
	np.pending = ""
	err := np.saveLocked()
	if err != nil {
		if pending {
			np.pending = path
		}
		if old != nil {
			np.pins[path] = old
		} else {
			delete(np.pins, path)
		}
	} else {
		pending = false
	}
	np.mu.Unlock()
	if err != nil {
		p.release()
		return nil, got, err
	}
	if old != nil {
		old.release()
	}
	return p, got, nil
}

// followMoved locks again, where their chunks are now, the pins whose
// locked ranges lie in pack files that are gone (a GC removed them, its
// compaction having moved their chunks to other packs): the mappings of a
// removed pack keep its disk space taken until they go
// (docs/design/pin.md). The store runs it after every GC that removed or
// compacted packs (Node's SetAfterGC). The old ranges go first, so that
// the pin budget is not needed twice; a pin that cannot be locked again
// says why in kylix node. It returns the pins it moved.
func (np *nodePins) followMoved(ctx context.Context) []string {
	np.op.Lock()
	defer np.op.Unlock()
	gone := func(sp gpuio.PackSpan) bool {
		_, err := os.Stat(sp.Path)
		return errors.Is(err, fs.ErrNotExist)
	}
	np.mu.Lock()
	var moved []string
	for path, p := range np.pins {
		if p.held() && slices.ContainsFunc(p.spans, gone) {
			moved = append(moved, path)
		}
	}
	np.mu.Unlock()
	slices.Sort(moved)
	for _, path := range moved {
		np.mu.Lock()
		old := np.pins[path]
		err := old.release()
		old.state = "pinning"
		np.mu.Unlock()
		if err != nil {
			np.log.Warn("pin: releasing the ranges of a removed pack", "path", ShownPath(path), "err", err)
		}
		p, err := np.lockPath(ctx, path)
		np.mu.Lock()
		if err != nil {
			old.state = "not held: locking it where gc moved its chunks failed: " + err.Error()
			np.log.Error("pin: could not lock again a pin whose chunks gc moved (kylix pin PATH tries again)", "path", ShownPath(path), "err", err)
		} else {
			p.added = old.added
			np.pins[path] = p
		}
		np.mu.Unlock()
	}
	return moved
}

// pinCluster is what a pin in a cluster needs: the store's fetcher (the
// membership) brings the chunks; progress is told how far it is.
type pinCluster struct {
	progress Progress
}

// errNotHere: a chunk of a path to pin is not stored on this node.
var errNotHere = errors.New("not stored on this node")

func (np *nodePins) unpin(path string) error {
	np.op.Lock()
	defer np.op.Unlock()
	np.mu.Lock()
	p := np.pins[path]
	if p == nil {
		if ok, err := np.releaseLocked(path); ok || err != nil {
			np.mu.Unlock()
			return err
		}
		names := np.namesLocked()
		np.mu.Unlock()
		return notPinned(path, names)
	}
	delete(np.pins, path)
	if err := np.saveLocked(); err != nil {
		np.pins[path] = p
		np.mu.Unlock()
		return err
	}
	np.mu.Unlock()
	return p.release()
}

// release stops keeping path (made local by KYLIX_IOC_MAKE_LOCAL) here:
// rebalance may then drop its copies of chunks owned elsewhere (the high
// watermark, watermark.go). false when path is not kept (unpinned
// meanwhile); a pinned path is never released.
func (np *nodePins) release(path string) (bool, error) {
	np.op.Lock()
	defer np.op.Unlock()
	np.mu.Lock()
	defer np.mu.Unlock()
	return np.releaseLocked(path)
}

// releaseLocked is release with np.op and np.mu held.
func (np *nodePins) releaseLocked(path string) (bool, error) {
	added, ok := np.kept[path]
	if !ok {
		return false, nil
	}
	delete(np.kept, path)
	if err := np.saveLocked(); err != nil {
		np.kept[path] = added
		return false, err
	}
	return true, nil
}

func notPinned(path string, names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("unpin %s: not pinned (nothing is)", ShownPath(path))
	}
	for i := range names {
		names[i] = ShownPath(names[i])
	}
	return fmt.Errorf("unpin %s: not pinned (pinned: %s)", ShownPath(path), strings.Join(names, ", "))
}

func (np *nodePins) namesLocked() []string {
	var names []string
	for n := range np.pins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// saveLocked writes the record (np.mu held): the pins, the pin still
// bringing its chunks (pending) and the paths kept by MAKE_LOCAL.
func (np *nodePins) saveLocked() error {
	rec := pinRecord{Version: 1, Pins: []pinRecordEntry{}}
	for _, n := range np.namesLocked() {
		rec.Pins = append(rec.Pins, pinRecordEntry{Path: n, Added: np.pins[n].added})
	}
	if np.pending != "" {
		rec.Pins = append(rec.Pins, pinRecordEntry{Path: np.pending, Added: time.Now().UTC(), Pending: true})
	}
	for _, n := range slices.Sorted(maps.Keys(np.kept)) {
		rec.Pins = append(rec.Pins, pinRecordEntry{Path: n, Added: np.kept[n], Kept: true})
	}
	return writePinRecord(np.s.Dir(), rec)
}

// keepLocal records path as kept on this node before KYLIX_IOC_MAKE_LOCAL
// stores chunks of it (fs.Options.KeepLocal): rebalance, whose keep set is
// the record's paths, then leaves them here. kylix unpin PATH removes it.
func (np *nodePins) keepLocal(path string) error {
	np.mu.Lock()
	defer np.mu.Unlock()
	if _, ok := np.kept[path]; ok {
		return nil
	}
	if p := np.pins[path]; p != nil {
		return nil
	}
	np.kept[path] = time.Now().UTC()
	if err := np.saveLocked(); err != nil {
		delete(np.kept, path)
		return err
	}
	return nil
}

func pinRecordPath(dir string) string { return filepath.Join(dir, pinRecordName) }

// recordedPaths is the paths of dir's pin record: the node's keep set in
// a cluster (peers.Config.Keep).
func recordedPaths(dir string) ([]string, error) {
	rec, err := readPinRecord(dir)
	var ps []string
	for _, p := range rec.Pins {
		ps = append(ps, p.Path)
	}
	return ps, err
}

func readPinRecord(dir string) (pinRecord, error) {
	var rec pinRecord
	b, err := os.ReadFile(filepath.Join(dir, pinRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return rec, fmt.Errorf("pin record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Version != 1 {
		return rec, fmt.Errorf("pin record %s: not a version 1 record: %v", filepath.Join(dir, pinRecordName), err)
	}
	return rec, nil
}

// writePinRecord replaces the record atomically: a temporary file written
// and synced, renamed over it, the directory synced.
func writePinRecord(dir string, rec pinRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, pinRecordName)
	tmp := path + ".tmp"
	err = func() error {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(append(b, '\n'))
		if err == nil {
			err = f.Sync()
		}
		return errors.Join(err, f.Close())
	}()
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(dir); err == nil {
			err = errors.Join(d.Sync(), d.Close())
		}
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing the pin record %s: %w", path, err)
	}
	return nil
}

// PinView is a snapshot of the pins for ls and stat: the running node's
// pins, or, without a node, the recorded paths.
type PinView struct {
	node     bool
	held     []pinSnap
	recorded []string
	kept     []string // made local by KYLIX_IOC_MAKE_LOCAL, kept here
}

type pinSnap struct {
	path   string
	held   bool
	state  string
	files  map[chunkstore.ID]bool // shared with the pin: read-only once held
	locked []*gpuio.PinnedRange
}

// RecordedPins is the PinView of a data directory no node serves: the
// paths its pin record lists, none of them held.
func RecordedPins(dataDir string) *PinView {
	rec, _ := readPinRecord(dataDir)
	v := &PinView{}
	for _, r := range rec.Pins {
		switch {
		case r.Kept:
			v.kept = append(v.kept, r.Path)
		case !r.Pending:
			v.recorded = append(v.recorded, r.Path)
		}
	}
	return v
}

// PinView is a snapshot of the node's pins.
func (n *Node) PinView() *PinView {
	np := n.pins
	if np == nil {
		v := &PinView{}
		return v
	}
	v := &PinView{node: true}
	np.mu.Lock()
	defer np.mu.Unlock()
	for _, n := range np.namesLocked() {
		p := np.pins[n]
		v.held = append(v.held, pinSnap{path: n, held: p.held(), state: p.state, files: p.files, locked: slices.Clone(p.locked)})
	}
	v.kept = slices.Sorted(maps.Keys(np.kept))
	return v
}

// GPU says whether the memory of the pin that holds path is registered
// for GPU copies ("" when path is not held by a pin).
func (v *PinView) GPU(path string, ent chunkstore.Entry) string {
	clean, _ := chunkstore.CleanPath(path)
	for _, p := range v.held {
		if !p.held || !(ent.Kind == chunkstore.KindFile && p.files[ent.ID] || ent.Kind == chunkstore.KindDir && Within("/"+clean, "/"+p.path)) {
			continue
		}
		var locked, reg int64
		devs := map[string]bool{}
		for _, r := range p.locked {
			locked += r.Size()
			if d := r.RegisteredBy(); d != "" {
				reg += r.Size()
				devs[d] = true
			}
		}
		names := slices.Sorted(maps.Keys(devs))
		switch {
		case reg == 0:
			return fmt.Sprintf("%s locked, not registered with any GPU: the node registers pinned memory while it holds a GPU loader (made by a client's GPU fill, given back after --gpu-idle); none holds it now", human(locked))
		case reg < locked:
			return fmt.Sprintf("%s locked, only %s of it registered for GPU copies (by %s): the rest is copied through bounce buffers (kylix node says why)", human(locked), human(reg), strings.Join(names, ", "))
		}
		return fmt.Sprintf("%s locked and registered for GPU copies (by %s)", human(locked), strings.Join(names, ", "))
	}
	return ""
}

// Info says whether a namespace entry is pinned, and by what. A file is
// pinned when its version is held by a pin (a deduplicated copy elsewhere
// shares the same locked packs); a directory when it is at or below a
// pinned path. Without a node, nothing is held; a recorded pin is named.
func (v *PinView) Info(path string, ent chunkstore.Entry) (bool, string) {
	clean, _ := chunkstore.CleanPath(path)
	if !v.node {
		for _, r := range v.recorded {
			if Within("/"+clean, "/"+r) {
				return false, fmt.Sprintf("recorded pin %s; pins are held only while a node runs (none does)", ShownPath(r))
			}
		}
		if slices.Contains(v.kept, clean) {
			return false, "recorded as kept on this node (made local by KYLIX_IOC_MAKE_LOCAL)"
		}
		return false, ""
	}
	var stale string
	for _, p := range v.held {
		under := Within("/"+clean, "/"+p.path)
		switch {
		case !p.held && under:
			return false, fmt.Sprintf("pin %s is %s", ShownPath(p.path), p.state)
		case !p.held:
		case ent.Kind == chunkstore.KindFile && p.files[ent.ID]:
			return true, "pin " + ShownPath(p.path)
		case ent.Kind == chunkstore.KindDir && under:
			return true, "pin " + ShownPath(p.path)
		case under:
			stale = fmt.Sprintf("pin %s was made before this version of the file: kylix pin %s again", ShownPath(p.path), ShownPath(p.path))
		}
	}
	if stale == "" && slices.Contains(v.kept, clean) {
		return false, "its chunks made local by KYLIX_IOC_MAKE_LOCAL are kept on this node (kylix unpin " + ShownPath(clean) + " lets rebalance drop them)"
	}
	return false, stale
}

// FileResident is how many of a file's bytes are in the page cache.
func FileResident(f *chunkstore.File) int64 {
	var n int64
	for _, x := range f.Extents() {
		if x.Pack == 0 {
			continue
		}
		r, err := gpuio.ResidentBytes(x.PackPath, x.PackOff, x.Len)
		if err == nil {
			n += r
		}
	}
	return n
}

// PinsStatus is what `kylix node` says about pins.
type PinsStatus struct {
	BudgetBytes int64       `json:"budget_bytes"`
	LockedBytes int64       `json:"locked_bytes"`
	Pins        []PinStatus `json:"pins"`
	// GPU is, per device loader the node holds now, what it registered.
	GPU []gpuio.PinRegistration `json:"gpu"`
	// GPUNote says plainly whether the locked bytes are registered.
	GPUNote string `json:"gpu_note"`
	// Kept lists the files made local by KYLIX_IOC_MAKE_LOCAL whose
	// chunks this node keeps (not locked; kylix unpin removes one).
	Kept []string `json:"kept,omitempty"`
	// Hot: the files the node locked by itself after loads (hot.go);
	// their bytes are in LockedBytes too.
	Hot *HotStatus `json:"hot,omitempty"`
}

type PinStatus struct {
	Path        string    `json:"path"`
	Held        bool      `json:"held"`
	State       string    `json:"state"`
	Files       int       `json:"files"`
	Bytes       int64     `json:"bytes"`
	LockedBytes int64     `json:"locked_bytes"`
	Added       time.Time `json:"added"`
}

func (np *nodePins) status() *PinsStatus {
	if np == nil {
		return nil
	}
	out := &PinsStatus{BudgetBytes: np.budget, LockedBytes: np.host.Locked(), Pins: []PinStatus{}, GPU: np.host.Registrations(), Hot: np.hotStatus()}
	np.mu.Lock()
	for _, n := range np.namesLocked() {
		p := np.pins[n]
		ps := PinStatus{Path: ShownPath(n), Held: p.held(), State: p.state, Files: p.nfiles, Bytes: p.bytes, Added: p.added}
		for _, r := range p.locked {
			ps.LockedBytes += r.Size()
		}
		out.Pins = append(out.Pins, ps)
	}
	for _, k := range slices.Sorted(maps.Keys(np.kept)) {
		out.Kept = append(out.Kept, ShownPath(k))
	}
	np.mu.Unlock()
	if out.GPU == nil {
		out.GPU = []gpuio.PinRegistration{}
	}
	out.GPUNote = pinGPUNote(out)
	return out
}

func pinGPUNote(st *PinsStatus) string {
	if len(st.GPU) == 0 {
		return "not registered with any GPU: the node holds no GPU loader now (a client's GPU fill takes one and registers the pinned memory with it; it is given back after --gpu-idle)"
	}
	var parts []string
	for _, g := range st.GPU {
		s := fmt.Sprintf("%s: %s of %s registered", g.Device, human(g.Bytes), human(g.TotalBytes))
		if g.Failed > 0 {
			s += fmt.Sprintf("; %d ranges NOT registered (%s): their fills copy through bounce buffers", g.Failed, g.FailedWhy)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// recheckLoop re-hashes the pinned memory verified when pinned, at rate
// bytes per second (the scrub's rate; 0: never), a pass a minute, until ctx
// ends. A range that no longer matches loses its verified mark, so loads
// hash it again (docs/design/pin.md).
func (np *nodePins) recheckLoop(ctx context.Context, rate int64) {
	if np == nil || rate <= 0 {
		return
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pacer := pace.New(rate) // a fresh start each pass
		pace := func(n int64) error { return pacer.Wait(ctx, n) }
		_, bad := np.host.Recheck(pace)
		for _, err := range bad {
			np.log.Error("pinned memory no longer matches its chunks: loads of it are hashed again (kylix verify)", "err", err)
		}
		t.Reset(time.Minute)
	}
}
