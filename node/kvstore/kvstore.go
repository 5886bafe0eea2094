// Package kvstore is the node's KV-cache block store (docs/design/kv.md):
// fixed-size blocks keyed by a 32-byte key the caller computes (a hash of
// a token prefix), in a namespace (the caller's uid), kept in two tiers:
// host memory (a byte budget, LRU) and local disk (a byte budget, LRU,
// written behind the put, in a directory of its own). Every block carries
// its BLAKE3; a block read from the disk is verified before anyone sees
// it, and one that fails or cannot be read is a miss (and is dropped),
// never wrong data. A put the budgets cannot take is refused (ErrFull),
// never blocked. The disk tier's index is rebuilt from its directory at
// Open. Nothing here is package-level state: a *Store is one tier set.
package kvstore

import (
	"container/list"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// Errors. Each is wrapped with the details; test with errors.Is.
var (
	// ErrSize: a put whose block is not the store's block size, or a
	// store opened without a block size.
	ErrSize = errors.New("kv: block is not the store's block size")
	// ErrFull: a put refused because the host tier is full of blocks
	// still waiting for their disk write (none can be evicted without
	// losing it), or is smaller than one block. The caller may retry
	// later or recompute; the store never blocks the put.
	ErrFull = errors.New("kv: no room: the host tier is full of blocks not yet written to disk")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("kv: store is closed")
)

// Tier says where a block was found.
type Tier uint8

// Tiers, fastest first. Miss: in no tier.
const (
	Miss Tier = iota
	Memory
	Disk
)

func (t Tier) String() string {
	switch t {
	case Memory:
		return "memory"
	case Disk:
		return "disk"
	}
	return "miss"
}

// Key names a block: the caller's 32-byte key in a namespace (the node
// uses the client's uid, so one uid never reads another's blocks).
type Key struct {
	NS uint32
	ID [32]byte
}

// Options configure a Store. Zero budgets mean no such tier, except that
// the host tier must hold at least one block: every put lands there first.
type Options struct {
	// BlockSize is the size of every block in bytes (required, > 0).
	BlockSize int
	// MemBudget is the most bytes of blocks kept in host memory.
	MemBudget int64
	// DiskBudget is the most bytes of block files kept in Dir (each file
	// counted as diskSize(BlockSize)); 0: no disk tier.
	DiskBudget int64
	// Dir is the disk tier's directory (required with DiskBudget); made
	// 0700 if missing. Files in it other than block files are left alone;
	// block files of another block size are removed at Open.
	Dir string
	// Logger receives what the store does (default: discard).
	Logger *slog.Logger
}

// HostMemory names what the host tier is made of, for stats, until the
// node says more (Store.SetHostMemory): one anonymous mapping, pageable
// until a GPU request page-locks it (arena.go).
const HostMemory = "pageable"

// entry is one key's block, in one or both tiers.
type entry struct {
	key  Key
	data []byte // the block in host memory (its arena slot); nil when only on disk
	slot int32  // data's slot in the arena
	sum  chunkstore.ID
	gen  uint64 // bumped by every put that changes data
	mem  *list.Element
	disk *list.Element // non-nil while the block file exists or is being written
	// dirty: data is queued for its disk write and may not be evicted
	// from memory before it.
	dirty bool
}

// queued is one disk write to do.
type queued struct {
	e   *entry
	gen uint64
}

// Store is a KV block store. Its methods are safe for concurrent use.
type Store struct {
	opt      Options
	log      *slog.Logger
	diskSize int64 // bytes a block file is counted for

	// getLatency: gets that hit, per tier (Memory, Disk), including the
	// copy to the caller (fn).
	getLatency [3]latency

	mu      sync.Mutex
	arena   *arena
	hostMem string
	// direct: disk reads use O_DIRECT (until the file system refuses it;
	// diskReads then says why).
	direct    atomic.Bool
	diskReads string
	lent      int        // slots lent to readers and puts filling slots
	unlent    *sync.Cond // signalled when lent falls to 0
	idle      *sync.Cond // signalled when the write queue empties
	wake      chan struct{}
	m         map[Key]*entry
	memLRU    *list.List // front: most recently used
	diskLRU   *list.List
	memUsed   int64
	diskUsed  int64
	// memNS, diskNS: blocks per namespace in each tier (share.go).
	memNS, diskNS nsCount
	dirty         int
	queue         []queued
	writing       bool
	closed        bool
	done          chan struct{}
	st            counters

	// write writes a block file (tests inject failures).
	write func(path string, data []byte, tr []byte) error
	// read reads and verifies a block file (readBlockFile; tests make
	// a file system refuse O_DIRECT with it).
	read func(path string, k Key, data []byte, direct bool) (chunkstore.ID, error)
}

type counters struct {
	puts, refused, memHits, diskHits, misses, memEvictions, diskEvictions int64
	memReadBytes, diskReadBytes, diskWrites, diskWriteErrors, memOnly     int64
	verifyFailures                                                        int64
	lastDiskError                                                         string
	lastDiskErrorAt                                                       time.Time
}

// Open makes a store; with a disk tier it rebuilds the disk index from
// Dir and starts the disk writer. Close stops it.
func Open(opt Options) (*Store, error) {
	if opt.BlockSize <= 0 {
		return nil, fmt.Errorf("kv: a block size is required: %w", ErrSize)
	}
	if opt.DiskBudget < 0 {
		opt.DiskBudget = 0
	}
	if opt.DiskBudget > 0 && opt.Dir == "" {
		return nil, errors.New("kv: a disk budget needs a directory")
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	a, err := newArena(opt.MemBudget, opt.BlockSize)
	if err != nil {
		return nil, err
	}
	s := &Store{opt: opt, log: opt.Logger, diskSize: diskSize(opt.BlockSize), m: map[Key]*entry{}, arena: a, hostMem: HostMemory,
		memNS: nsCount{}, diskNS: nsCount{},
		memLRU: list.New(), diskLRU: list.New(), wake: make(chan struct{}, 1), done: make(chan struct{}), write: writeBlockFile, read: readBlockFile}
	s.idle = sync.NewCond(&s.mu)
	s.unlent = sync.NewCond(&s.mu)
	if opt.BlockSize%pageSize == 0 {
		s.direct.Store(true)
		s.diskReads = DiskReadsDirect
	} else {
		s.diskReads = fmt.Sprintf("%s: the block size (%d bytes) is not a multiple of %d", DiskReadsBuffered, opt.BlockSize, pageSize)
	}
	if opt.DiskBudget > 0 {
		if err := s.rebuild(); err != nil {
			a.unmap()
			return nil, err
		}
		go s.writer()
	} else {
		close(s.done)
	}
	return s, nil
}

// BlockSize is the store's block size.
func (s *Store) BlockSize() int { return s.opt.BlockSize }

// Put stores a copy of block b (exactly BlockSize bytes) under k. It
// returns once the block is in host memory; the disk write follows.
// ErrFull when the host tier has no room that eviction can make; ErrSize
// for a block of another size.
func (s *Store) Put(k Key, b []byte) error {
	if len(b) != s.opt.BlockSize {
		return fmt.Errorf("%w: %d bytes, the block size is %d", ErrSize, len(b), s.opt.BlockSize)
	}
	return s.PutFrom(k, func(dst []byte) error { copy(dst, b); return nil })
}

// PutFrom stores under k the block that fill writes into dst, a slot of
// the host tier (BlockSize bytes, in Arena: the caller may copy into it
// by DMA; fill returns when every byte is there). The slot is taken
// before fill runs, so a put the host tier cannot take is refused with
// ErrFull before any byte moves; an error of fill is returned and
// nothing is stored.
func (s *Store) PutFrom(k Key, fill func(dst []byte) error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	slot, ok := s.takeSlot(k.NS)
	if !ok {
		s.st.refused++
		err := fmt.Errorf("%w (%d blocks of %d waiting for the disk, budget %d bytes)", ErrFull, s.dirty, s.memLRU.Len(), s.opt.MemBudget)
		s.mu.Unlock()
		return err
	}
	s.lent++
	s.mu.Unlock()

	dst := s.arena.bytes(slot)
	err := fill(dst)
	var sum chunkstore.ID
	if err == nil {
		sum = chunkstore.Sum(dst)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.unlend()
	if err == nil && s.closed {
		err = ErrClosed
	}
	if err != nil {
		s.arena.release(slot)
		return err
	}
	e := s.m[k]
	if e != nil && e.data != nil && e.sum == sum {
		s.arena.release(slot)
		s.memLRU.MoveToFront(e.mem)
		s.st.puts++
		return nil
	}
	if e == nil {
		e = &entry{key: k}
		s.m[k] = e
	}
	onDisk := e.disk != nil && e.sum == sum && !e.dirty
	if e.data != nil {
		s.arena.release(e.slot) // replaced; a reader of the old block keeps it until done
	}
	e.data, e.slot, e.sum = dst, slot, sum
	e.gen++
	if e.mem == nil {
		e.mem = s.memLRU.PushFront(e)
		s.memNS.add(k.NS, 1)
		s.memUsed += int64(s.opt.BlockSize)
	} else {
		s.memLRU.MoveToFront(e.mem)
	}
	if s.opt.DiskBudget > 0 && !onDisk {
		if !e.dirty {
			e.dirty = true
			s.dirty++
		}
		s.queue = append(s.queue, queued{e, e.gen})
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	s.st.puts++
	return nil
}

// unlend ends one loan of a slot (s.lent). s.mu held.
func (s *Store) unlend() {
	s.lent--
	if s.lent == 0 {
		s.unlent.Broadcast()
	}
}

// takeSlot returns a free slot of the host tier for a block of namespace
// ns, evicting clean blocks by the fair-share rule (share.go), least
// recently used first, until one is free. Blocks waiting for their disk
// write are skipped, and so are blocks lent to a reader: evicting one
// would free no slot before its release. s.mu held.
func (s *Store) takeSlot(ns uint32) (int32, bool) {
	if i, ok := s.arena.take(); ok {
		return i, true
	}
	for _, may := range s.memNS.victims(len(s.arena.refs), ns) {
		for el := s.memLRU.Back(); el != nil; {
			e := el.Value.(*entry)
			el = el.Prev()
			if e.dirty || s.arena.refs[e.slot] > 0 || !may(e.key) {
				continue
			}
			s.dropMem(e)
			s.st.memEvictions++
			if i, ok := s.arena.take(); ok {
				return i, true
			}
		}
	}
	return 0, false
}

// dropMem removes e from the host tier (and from the store when it is on
// no disk either). s.mu held.
func (s *Store) dropMem(e *entry) {
	if e.mem == nil {
		return
	}
	s.memLRU.Remove(e.mem)
	s.memNS.add(e.key.NS, -1)
	s.arena.release(e.slot)
	e.mem, e.data = nil, nil
	s.memUsed -= int64(s.opt.BlockSize)
	if e.dirty {
		e.dirty = false
		s.dirty--
	}
	if e.disk == nil {
		delete(s.m, e.key)
	}
}

// Get finds k's block and calls fn with it (valid only during the call;
// fn must not keep or change it). A block from the disk is verified
// first; one that fails, or cannot be read, is dropped and is a miss.
// The error is fn's.
func (s *Store) Get(k Key, fn func([]byte) error) (Tier, error) {
	h := s.Hold(k)
	if h.Tier == Miss {
		return Miss, nil
	}
	err := fn(h.Bytes)
	h.Release()
	return h.Tier, err
}

// Held is a block lent by Hold: Bytes stay valid and unchanged until
// Release, whatever happens to the key meanwhile (an eviction, a clear or
// a new put waits for Release to reuse the memory), so a copy engine may
// read them asynchronously. A miss holds nothing (Tier Miss, Bytes nil).
type Held struct {
	Tier     Tier
	Bytes    []byte
	Sum      chunkstore.ID // Bytes' BLAKE3
	s        *Store
	slot     int32 // -1: Bytes are not in the arena
	start    time.Time
	quiet    bool // from Peek: no get to time
	released bool // under s.mu
}

// Peek lends k's block as Hold does when it is in memory, for the node's
// own use (a copy to another member): not counted as a get, the LRU order
// unchanged. A block on disk only, or none, is a miss here.
func (s *Store) Peek(k Key) *Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if s.closed || e == nil || e.data == nil {
		return &Held{}
	}
	s.arena.hold(e.slot)
	s.lent++
	return &Held{Tier: Memory, Bytes: e.data, Sum: e.sum, s: s, slot: e.slot, quiet: true}
}

// Hold finds k's block as Get does and lends it until Release. Every Held
// that is not a miss must be released (a second Release does nothing);
// the get's latency counts until then.
func (s *Store) Hold(k Key) *Held {
	start := time.Now()
	s.mu.Lock()
	e := s.m[k]
	switch {
	case s.closed || e == nil:
		s.st.misses++
		s.mu.Unlock()
		return &Held{}
	case e.data != nil:
		s.memLRU.MoveToFront(e.mem)
		s.st.memHits++
		s.st.memReadBytes += int64(len(e.data))
		s.arena.hold(e.slot)
		s.lent++
		s.mu.Unlock()
		return &Held{Tier: Memory, Bytes: e.data, Sum: e.sum, s: s, slot: e.slot, start: start}
	}
	gen := e.gen
	s.diskLRU.MoveToFront(e.disk)
	// Read into a slot of the host tier when one can be had without
	// dropping a block still waiting for the disk: the block then stays
	// in memory too, and the read lands where a copy engine can take it.
	slot, inArena := s.takeSlot(k.NS)
	s.lent++
	s.mu.Unlock()

	var buf []byte
	if inArena {
		buf = s.arena.bytes(slot)
	} else {
		buf = make([]byte, s.opt.BlockSize)
	}
	sum, err := s.readBlock(s.path(k), k, buf)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &Held{Tier: Disk, Bytes: buf, Sum: sum, s: s, slot: -1, start: start}
	if inArena {
		h.slot = slot
		s.arena.hold(slot)
		s.arena.release(slot) // freed at Release unless kept below
	}
	if err != nil {
		s.st.misses++
		s.releaseLocked(h)
		if s.m[k] != e || e.disk == nil || e.gen != gen || e.data != nil {
			// Evicted, cleared or put again while it was read: a plain
			// miss (its file may be gone), not the file's fault.
			return &Held{}
		}
		s.st.verifyFailures++
		s.dropDisk(e, true)
		s.log.Warn("kv: dropped a block that failed its check on disk", "key", fmt.Sprintf("%x", k.ID[:8]), "ns", k.NS, "err", err)
		return &Held{}
	}
	s.st.diskHits++
	s.st.diskReadBytes += int64(len(buf))
	// Keep it in memory too, unless the key changed meanwhile.
	if inArena && !s.closed && s.m[k] == e && e.data == nil {
		s.arena.orphan[slot] = false
		e.data, e.slot, e.sum = buf, slot, sum
		e.mem = s.memLRU.PushFront(e)
		s.memNS.add(k.NS, 1)
		s.memUsed += int64(s.opt.BlockSize)
	}
	return h
}

// Release ends the loan of a held block (nil or a miss: nothing).
func (h *Held) Release() {
	if h == nil || h.s == nil {
		return
	}
	h.s.mu.Lock()
	first := h.s.releaseLocked(h)
	h.s.mu.Unlock()
	if first && !h.quiet {
		h.s.getLatency[h.Tier].since(h.start)
	}
}

// releaseLocked ends h's loan, once; it reports whether this call did.
func (s *Store) releaseLocked(h *Held) bool {
	if h.released {
		return false
	}
	h.released = true
	if h.slot >= 0 {
		s.arena.unhold(h.slot)
	}
	s.unlend()
	return true
}

// Arena is the host tier's memory: every block in memory, and every slot
// PutFrom fills, lies in it. The node page-locks it for a GPU's copy
// engine; it stays mapped until Close returns.
func (s *Store) Arena() []byte { return s.arena.mem }

// ArenaOffset says where b starts in Arena, if it lies there.
func (s *Store) ArenaOffset(b []byte) (int64, bool) { return s.arena.offset(b) }

// SetHostMemory sets what Stats says the host tier is made of (the node:
// "pinned on cuda:0" once it page-locked the arena).
func (s *Store) SetHostMemory(what string) {
	s.mu.Lock()
	s.hostMem = what
	s.mu.Unlock()
}

// Contains says which tier holds k's block (without verifying it or
// changing the LRU order).
func (s *Store) Contains(k Key) Tier {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e := s.m[k]; {
	case e == nil:
		return Miss
	case e.data != nil:
		return Memory
	default:
		return Disk
	}
}

// Clear drops every block of namespace ns from both tiers; all: of every
// namespace. It returns the blocks dropped. The files are removed under
// the lock: a block put again at once must not lose its new file to a
// late removal of the old one.
func (s *Store) Clear(ns uint32, all bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var unlink []string
	n := 0
	for k, e := range s.m {
		if !all && k.NS != ns {
			continue
		}
		n++
		s.dropMemQuiet(e)
		if e.disk != nil {
			unlink = append(unlink, s.path(k))
			s.dropDisk(e, false)
		}
		delete(s.m, k)
	}
	removeFiles(unlink)
	return n
}

func (s *Store) dropMemQuiet(e *entry) {
	d := e.disk
	e.disk = nil // keep dropMem from deleting the map entry twice
	s.dropMem(e)
	e.disk = d
}

// Flush waits until every block put so far has been written to disk (or
// failed to be, see Stats), or the store is closed.
func (s *Store) Flush() {
	s.mu.Lock()
	for (len(s.queue) > 0 || s.writing) && !s.closed {
		s.idle.Wait()
	}
	s.mu.Unlock()
}

// Close writes what is queued for the disk, stops the writer and drops
// the host tier. It is idempotent.
func (s *Store) Close() {
	s.Flush()
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.wake)
	}
	s.idle.Broadcast()
	s.mu.Unlock()
	<-s.done
	s.mu.Lock()
	// Blocks lent (a get's copy in flight) and slots being filled keep
	// the arena mapped until they are done.
	for s.lent > 0 {
		s.unlent.Wait()
	}
	for _, e := range s.m {
		e.data = nil
	}
	s.m = map[Key]*entry{}
	s.memLRU.Init()
	s.diskLRU.Init()
	s.memNS, s.diskNS = nsCount{}, nsCount{}
	s.memUsed, s.diskUsed, s.dirty = 0, 0, 0
	if err := s.arena.unmap(); err != nil {
		s.log.Warn("kv: unmapping the host tier", "err", err)
	}
	s.mu.Unlock()
}

// TierStats are one tier's figures.
type TierStats struct {
	// GetLatency: the gets this tier answered, from the lookup to the
	// block's copy to the caller done.
	GetLatency Latency `json:"get_latency"`
	Blocks     int64   `json:"blocks"`
	Bytes      int64   `json:"bytes"`
	Budget     int64   `json:"budget"`
	Hits       int64   `json:"hits"`
	ReadBytes  int64   `json:"read_bytes"`
	Evictions  int64   `json:"evictions"`
}

// Stats are the store's figures since Open.
type Stats struct {
	BlockSize  int    `json:"block_size"`
	HostMemory string `json:"host_memory"`
	Dir        string `json:"dir,omitempty"`
	// DiskReads: how the disk tier reads blocks: DiskReadsDirect, or
	// DiskReadsBuffered and why.
	DiskReads string    `json:"disk_reads,omitempty"`
	Memory    TierStats `json:"memory"`
	Disk      TierStats `json:"disk"`
	Puts      int64     `json:"puts"`
	// Refused: puts refused with ErrFull.
	Refused int64 `json:"refused"`
	Misses  int64 `json:"misses"`
	// Dirty: blocks in memory waiting for their disk write.
	Dirty      int64 `json:"dirty"`
	DiskWrites int64 `json:"disk_writes"`
	// DiskWriteErrors: disk writes that failed; those blocks stayed in
	// memory only (MemoryOnly counts them, with the ones the disk budget
	// could not take). DiskLastError says why.
	DiskWriteErrors int64  `json:"disk_write_errors"`
	MemoryOnly      int64  `json:"memory_only"`
	DiskLastError   string `json:"disk_last_error,omitempty"`
	// VerifyFailures: disk blocks that failed their check or could not be
	// read (each a miss, the block dropped).
	VerifyFailures int64 `json:"verify_failures"`
}

// Stats returns the store's figures.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	out := Stats{BlockSize: s.opt.BlockSize, HostMemory: s.hostMem, Dir: s.opt.Dir,
		Memory: TierStats{Blocks: int64(s.memLRU.Len()), Bytes: s.memUsed, Budget: s.opt.MemBudget, Hits: st.memHits, ReadBytes: st.memReadBytes, Evictions: st.memEvictions},
		Disk:   TierStats{Blocks: int64(s.diskLRU.Len()), Bytes: s.diskUsed, Budget: s.opt.DiskBudget, Hits: st.diskHits, ReadBytes: st.diskReadBytes, Evictions: st.diskEvictions},
		Puts:   st.puts, Refused: st.refused, Misses: st.misses, Dirty: int64(s.dirty), DiskWrites: st.diskWrites,
		DiskWriteErrors: st.diskWriteErrors, MemoryOnly: st.memOnly, VerifyFailures: st.verifyFailures}
	if s.opt.DiskBudget > 0 {
		out.DiskReads = s.diskReads
	}
	out.Memory.GetLatency, out.Disk.GetLatency = s.getLatency[Memory].snapshot(), s.getLatency[Disk].snapshot()
	if st.lastDiskError != "" {
		out.DiskLastError = st.lastDiskErrorAt.UTC().Format(time.RFC3339) + ": " + st.lastDiskError
	}
	return out
}

// NSStats counts namespace ns's blocks per tier (a block in both tiers
// counts in both).
func (s *Store) NSStats(ns uint32) (memBlocks, diskBlocks int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.m {
		if k.NS != ns {
			continue
		}
		if e.data != nil {
			memBlocks++
		}
		if e.disk != nil {
			diskBlocks++
		}
	}
	return memBlocks, diskBlocks
}
