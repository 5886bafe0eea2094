package node

// Whole copies (docs/design/whole.md): a large file the mount serves
// through the node because no pack holds exactly its bytes (a fine-tune
// deduplicated against its base) is given a pack of its own
// (chunkstore.Store.MakeWhole) after its second such open, so its later
// opens are FUSE passthrough, within --whole-budget of bytes stored twice;
// the least recently opened copies are dropped (chunkstore.DropWhole) to
// make room.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
)

const (
	// DefaultWholeBudget is the share of the data directory's file system
	// whole copies may store a second time.
	DefaultWholeBudget = "10%"
	// wholeMinSize: smaller files are read through the node at little
	// cost; what they spend is the open, which passthrough does not save.
	wholeMinSize = 16 << 20
	// wholeAfterOpens: served opens of one file version before it is
	// given a whole copy.
	wholeAfterOpens = 2
	// wholeFreePercent: no copy is made that would leave less of the data
	// file system free.
	wholeFreePercent = 10
	// wholeTracked bounds the file versions whose served opens are counted.
	wholeTracked = 4096
	// wholeRetry: a file not given a copy is not tried again for this long
	// (its chunks may arrive, or room be made, meanwhile).
	wholeRetry = 10 * time.Minute
)

// ParseWholeBudget parses --whole-budget: a size or a share of the file
// system of dir, or 0 (no whole copies).
func ParseWholeBudget(s, dir string) (int64, error) {
	v, err := units.ParseSizeOrPercent(s)
	if err != nil {
		return 0, fmt.Errorf("whole-budget %w: want a size such as 200GiB or a share of the data file system such as 10%%", err)
	}
	if v.Percent == 0 {
		return v.Bytes, nil
	}
	total, _, err := diskSpace(dir)
	if err != nil {
		return 0, fmt.Errorf("whole-budget %q: %w", s, err)
	}
	return v.Of(total), nil
}

// diskSpace is the size of the file system holding dir and what is free
// on it for this process.
// A dir not made yet is on its nearest existing parent's.
func diskSpace(dir string) (total, free int64, err error) {
	var st unix.Statfs_t
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		err = unix.Statfs(d, &st)
		if err == nil || !errors.Is(err, unix.ENOENT) || d == filepath.Dir(d) {
			break
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// wholeCopies is the node's policy for whole copies.
type wholeCopies struct {
	s      *chunkstore.Store
	log    *slog.Logger
	budget int64
	off    string // why none are made (WholeStatus.Off), "" when on
	queue  chan wholeReq
	done   chan struct{}
	// changed, if set, tells the mount that a file version got a whole
	// copy (fs.FS.PassthroughChanged). Set before the mount serves.
	changed func(chunkstore.ID)

	mu     sync.Mutex
	opens  map[chunkstore.ID]int       // served opens per file version
	tried  map[chunkstore.ID]time.Time // not given a copy, when
	queued map[chunkstore.ID]bool      // waiting or being made
	used   map[uint64]time.Time        // whole pack -> its file's last open (made or seen this run)
	packOf map[chunkstore.ID]uint64    // file version -> its whole pack, made this run
	recent []WholeStatusFile           // made this run, newest last
	made   atomic.Int64
	failed atomic.Int64
	drops  atomic.Int64
	last   string // why the last file was not made whole
}

type wholeReq struct {
	id   chunkstore.ID
	size int64
}

func startWhole(ctx context.Context, s *chunkstore.Store, budget int64, off string, log *slog.Logger) *wholeCopies {
	w := &wholeCopies{s: s, log: log, budget: budget, queue: make(chan wholeReq, 16), done: make(chan struct{}),
		opens: map[chunkstore.ID]int{}, tried: map[chunkstore.ID]time.Time{}, queued: map[chunkstore.ID]bool{}, used: map[uint64]time.Time{},
		packOf: map[chunkstore.ID]uint64{}, off: off}
	if budget <= 0 {
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-w.queue:
				w.make(ctx, r)
			}
		}
	}()
	return w
}

// opened is fs.Options.OpenedForRead: every open of a large file for
// reading, by passthrough or served by the node.
func (w *wholeCopies) opened(id chunkstore.ID, size int64, passthrough bool) {
	if w == nil || w.budget <= 0 || size < wholeMinSize {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if passthrough {
		if p, ok := w.packOf[id]; ok {
			w.used[p] = time.Now()
		}
		return
	}
	if w.queued[id] {
		return
	}
	if at, ok := w.tried[id]; ok && time.Since(at) < wholeRetry {
		return
	}
	if len(w.opens) >= wholeTracked {
		clear(w.opens) // a fresh count: a hot file is seen again soon
	}
	w.opens[id]++
	if w.opens[id] < wholeAfterOpens {
		return
	}
	delete(w.opens, id)
	select {
	case w.queue <- wholeReq{id: id, size: size}:
		w.queued[id] = true
	default: // the worker is behind: a later open asks again
	}
}

// make gives r's file a whole copy if the budget and the disk allow, after
// dropping the least recently opened copies as needed.
func (w *wholeCopies) make(ctx context.Context, r wholeReq) {
	defer func() {
		w.mu.Lock()
		delete(w.queued, r.id)
		w.mu.Unlock()
	}()
	not := func(why string) {
		w.failed.Add(1)
		w.mu.Lock()
		w.last = fmt.Sprintf("file %s (%s): %s", r.id.Short(), human(r.size), why)
		if len(w.tried) >= wholeTracked {
			clear(w.tried)
		}
		w.tried[r.id] = time.Now()
		w.mu.Unlock()
		w.log.Info("no whole copy made; the file stays served by the node", "file", r.id.Short(), "why", why)
	}
	if r.size > w.budget {
		not(fmt.Sprintf("larger than the whole-copy budget (%s)", human(w.budget)))
		return
	}
	for {
		copies, err := w.s.WholeCopies()
		if err != nil {
			not(err.Error())
			return
		}
		var stored int64
		for _, c := range copies {
			stored += c.SecondCopyBytes()
		}
		// The copy stores at most the file's size a second time.
		if stored+r.size <= w.budget {
			break
		}
		if !w.dropLRU(copies) {
			not(fmt.Sprintf("the budget (%s) is used by copies made before", human(w.budget)))
			return
		}
	}
	total, free, err := diskSpace(w.s.Dir())
	if err != nil {
		not(err.Error())
		return
	}
	if free-r.size < total*wholeFreePercent/100 {
		not(fmt.Sprintf("it would leave %s free on the data file system, under %d%%", human(free-r.size), wholeFreePercent))
		return
	}
	w.log.Info("making a whole copy", "file", r.id.Short(), "bytes", r.size)
	res, err := w.s.MakeWhole(ctx, r.id, nil)
	if errors.Is(err, chunkstore.ErrAlreadyWhole) {
		// An open that raced the copy went to the node and made the
		// mount forget the copy: tell it again.
		w.passthroughChanged(r.id)
		return
	}
	if err != nil {
		not(err.Error())
		if errors.Is(err, chunkstore.ErrCorrupt) {
			w.log.Error("making a whole copy found a damaged chunk (kylix verify names the files)", "err", err)
		}
		return
	}
	w.made.Add(1)
	w.passthroughChanged(r.id)
	w.mu.Lock()
	w.packOf[r.id] = res.Pack
	w.used[res.Pack] = time.Now()
	w.recent = append(w.recent, WholeStatusFile{File: r.id.String(), Pack: res.Path, Bytes: res.Bytes, CopyBytes: res.CopyBytes, Seconds: res.Elapsed.Seconds()})
	if len(w.recent) > 32 {
		w.recent = w.recent[len(w.recent)-32:]
	}
	w.mu.Unlock()
	w.log.Info("whole copy made: the file is now served by passthrough", "file", r.id.Short(), "bytes", res.Bytes,
		"stored_twice", res.CopyBytes, "seconds", res.Elapsed.Seconds())
}

func (w *wholeCopies) passthroughChanged(id chunkstore.ID) {
	if w.changed != nil {
		w.changed(id)
	}
}

// dropLRU drops the least recently opened whole copy among copies (one
// not opened since the node started first); false if there is none.
func (w *wholeCopies) dropLRU(copies []chunkstore.WholeCopy) bool {
	if len(copies) == 0 {
		return false
	}
	w.mu.Lock()
	slices.SortStableFunc(copies, func(a, b chunkstore.WholeCopy) int { return w.used[a.Pack].Compare(w.used[b.Pack]) })
	victim := copies[0].Pack
	delete(w.used, victim)
	for id, p := range w.packOf {
		if p == victim {
			delete(w.packOf, id)
		}
	}
	w.mu.Unlock()
	if err := w.s.DropWhole(victim); err != nil {
		w.log.Warn("dropping a whole copy", "pack", victim, "err", err)
		return false
	}
	w.drops.Add(1)

	w.log.Info("whole copy dropped to make room (the next kylix gc gives its space back by compaction)", "pack", victim)
	return true
}

func (w *wholeCopies) close() {
	if w != nil {
		<-w.done
	}
}

// WholeStatus is what kylix node says about whole copies.
type WholeStatus struct {
	BudgetBytes int64 `json:"budget_bytes"`
	// Off says why none are made: "--whole-budget 0", or
	// "--no-passthrough" (a whole copy is only good for passthrough).
	Off string `json:"off,omitempty"`
	// Copies and StoredBytes: the store's whole copies and the bytes they
	// hold a second time.
	Copies      int   `json:"copies"`
	StoredBytes int64 `json:"stored_bytes"`
	Made        int64 `json:"made"`
	NotMade     int64 `json:"not_made"`
	Dropped     int64 `json:"dropped"`
	// LastNotMade says why the last file was not given one.
	LastNotMade string            `json:"last_not_made,omitempty"`
	Recent      []WholeStatusFile `json:"recent"`
}

type WholeStatusFile struct {
	File      string  `json:"file"`
	Pack      string  `json:"pack"`
	Bytes     int64   `json:"bytes"`
	CopyBytes int64   `json:"copy_bytes"`
	Seconds   float64 `json:"seconds"`
}

func (w *wholeCopies) status() *WholeStatus {
	if w == nil {
		return nil
	}
	out := &WholeStatus{BudgetBytes: w.budget, Off: w.off, Made: w.made.Load(), NotMade: w.failed.Load(), Dropped: w.drops.Load(), Recent: []WholeStatusFile{}}
	out.Copies, out.StoredBytes, _ = w.s.WholeUsage() // a recent count (it reads the chunk index)
	w.mu.Lock()
	out.LastNotMade = w.last
	out.Recent = append(out.Recent, w.recent...)
	w.mu.Unlock()
	return out
}
