package chunkstore

import (
	"container/list"
	"fmt"
	"os"
	"sync"
)

// packTable is the store's one table of open pack files. Every reader that
// touches a pack's bytes (the store's own reads, gpuio, the layout ioctl's
// callers) holds a Lease on it for as long as it uses the pack's fd or
// path; GC asks the table to retire a dead pack, and the table closes the
// fd and deletes the file only when no lease is held. Before it, three
// tables of open packs existed and GC closed an fd a read still used
// (issue 7 finding 8).
//
// The table keeps at most max descriptors of packs no one leases (idle),
// closing the least recently released first (issue 18: a node kept one fd
// per pack it ever read, 1 459 after a load test, with no bound). A leased
// pack is never closed under its reader, so while more than max packs are
// leased at once the table holds them all; the cap bounds what is kept
// open for reuse, not what readers use.
type packTable struct {
	s   *Store
	mu  sync.Mutex
	m   map[uint64]*packEntry
	max int
	// idle lists the entries with no lease, the most recently released
	// at the front.
	idle *list.List
}

// DefaultMaxOpenPacks is the table's cap on open pack descriptors when
// Store.SetMaxOpenPacks was not called. Reopening a closed pack costs one
// open(2) (microseconds) against a chunk read of milliseconds, while each
// descriptor kept counts against RLIMIT_NOFILE, which the node shares
// with its client connections, passthrough files and the packs it hands
// out. 256 covers the packs of every file of a large sharded model read
// at once (one pack per large file; small files share 256 MiB packs).
const DefaultMaxOpenPacks = 256

type packEntry struct {
	id      uint64
	f       *os.File
	leases  int
	retired bool          // GC removed the pack from the index: delete at the last release
	closing bool          // the store closed: close the fd at the last release
	elem    *list.Element // in idle while no lease is held
}

func newPackTable(s *Store) *packTable {
	return &packTable{s: s, m: map[uint64]*packEntry{}, max: DefaultMaxOpenPacks, idle: list.New()}
}

// SetMaxOpenPacks sets the cap on open pack descriptors (packTable); n < 1
// means DefaultMaxOpenPacks. Idle packs beyond it are closed now.
func (s *Store) SetMaxOpenPacks(n int) {
	if n < 1 {
		n = DefaultMaxOpenPacks
	}
	t := s.packs
	t.mu.Lock()
	defer t.mu.Unlock()
	t.max = n
	t.trimLocked()
}

// trimLocked closes idle packs, least recently released first, while more
// than max are open.
func (t *packTable) trimLocked() {
	for len(t.m) > t.max && t.idle.Len() > 0 {
		e := t.idle.Remove(t.idle.Back()).(*packEntry)
		e.elem = nil
		e.f.Close()
		delete(t.m, e.id)
	}
}

// unidleLocked takes e off the idle list (it is leased or going).
func (t *packTable) unidleLocked(e *packEntry) {
	if e.elem != nil {
		t.idle.Remove(e.elem)
		e.elem = nil
	}
}

// Lease keeps one pack open and on disk until Release. A lease is cheap (a
// counter under a mutex); take one per read, not per process.
type Lease struct {
	t    *packTable
	e    *packEntry
	once sync.Once
}

// Pack is the leased pack's id.
func (l *Lease) Pack() uint64 { return l.e.id }

// Fd is a read-only descriptor of the pack, valid until Release. It is shared:
// do not close it or change its offset (use pread).
func (l *Lease) Fd() int { return int(l.e.f.Fd()) }

// Path is the pack's file; it exists at least until Release.
func (l *Lease) Path() string { return l.t.s.PackPath(l.e.id) }

// Release gives the lease back. A pack GC retired while it was leased is
// closed and deleted at its last release. Release is idempotent.
func (l *Lease) Release() {
	l.once.Do(func() { l.t.release(l.e) })
}

// acquire opens (once) pack id and leases it. A pack GC has retired cannot be
// leased again: its chunks are no longer in the index, so to a reader they
// are not stored here.
func (t *packTable) acquire(id uint64) (*Lease, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		return nil, ErrClosed
	}
	e, ok := t.m[id]
	if !ok {
		f, err := os.Open(t.s.PackPath(id))
		if err != nil {
			if os.IsNotExist(err) {
				// The index names the pack but the file is gone: the
				// chunk is not here, and verify will say which files lost it.
				return nil, fmt.Errorf("pack %016x is missing (%w): %w", id, err, ErrNotLocal)
			}
			return nil, fmt.Errorf("open pack %016x: %w", id, err)
		}
		e = &packEntry{id: id, f: f}
		t.m[id] = e
		t.trimLocked()
	}
	if e.retired {
		return nil, fmt.Errorf("pack %016x was garbage collected: %w", id, ErrNotLocal)
	}
	t.unidleLocked(e)
	e.leases++
	return &Lease{t: t, e: e}, nil
}

func (t *packTable) release(e *packEntry) {
	// The file is removed under the lock: an acquire in between would
	// otherwise open the file about to go and hold it as a fresh entry.
	t.mu.Lock()
	defer t.mu.Unlock()
	e.leases--
	if e.leases > 0 {
		return
	}
	if !(e.retired || e.closing) {
		e.elem = t.idle.PushFront(e)
		t.trimLocked()
		return
	}
	e.f.Close()
	if t.m != nil && t.m[e.id] == e {
		delete(t.m, e.id)
	}
	if e.retired {
		t.remove(e.id)
	}
}

// retire is GC's way to drop a pack it found dead: closed and deleted now if
// no one holds a lease, else at the last release. The caller has already
// removed the pack from the index, so a crash before the deletion leaves an
// file whose removal intent the next Open carries out (docs/design/index.md).
// removed says whether the file is gone now.
func (t *packTable) retire(id uint64) (removed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if ok && e.leases > 0 {
		e.retired = true
		t.s.log.Info("pack is in use by a read; it is deleted when the read ends", "pack", id)
		return false, nil
	}
	if ok {
		t.unidleLocked(e)
		e.f.Close()
		delete(t.m, id)
	}
	if err := t.removeErr(id); err != nil {
		return false, err
	}
	return true, nil
}

func (t *packTable) remove(id uint64) {
	if err := t.removeErr(id); err != nil {
		t.s.log.Error("removing a garbage-collected pack after its last read", "pack", id, "err", err)
	}
}

func (t *packTable) removeErr(id uint64) error {
	if err := t.s.fs.Remove(t.s.PackPath(id)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove pack %016x: %w", id, err)
	}
	return nil
}

// leases reports how many leases pack id has (tests).
func (t *packTable) leases(id uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[id]; ok {
		return e.leases
	}
	return 0
}

// close closes every fd at Store.Close; later acquires get ErrClosed. A
// leased fd is closed at its last release instead: closing it under a read
// would let the number be reused by an unrelated open file.
func (t *packTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.m {
		if e.leases > 0 {
			e.closing = true
		} else {
			e.f.Close()
		}
		delete(t.m, id)
	}
	t.m = nil
	t.idle.Init()
}

// Lease leases pack id directly, for readers that planned with Plan and
// need the pack again (or for tools). Release it when done.
func (s *Store) Lease(id uint64) (*Lease, error) { return s.packs.acquire(id) }
