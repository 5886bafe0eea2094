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

// HostMemory names what the host tier is made of, for stats: plain
// (pageable) Go memory. Pinning it (cuda.HostAlloc) pays only once a GPU
// copies from it, which this version does not do (docs/design/kv.md).
const HostMemory = "pageable"

// entry is one key's block, in one or both tiers.
type entry struct {
	key  Key
	data []byte // the block in host memory; nil when only on disk
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

	mu       sync.Mutex
	idle     *sync.Cond // signalled when the write queue empties
	wake     chan struct{}
	m        map[Key]*entry
	memLRU   *list.List // front: most recently used
	diskLRU  *list.List
	memUsed  int64
	diskUsed int64
	dirty    int
	queue    []queued
	writing  bool
	closed   bool
	done     chan struct{}
	st       counters

	// write writes a block file (tests inject failures).
	write func(path string, data []byte, tr []byte) error
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
	if opt.MemBudget < int64(opt.BlockSize) {
		return nil, fmt.Errorf("kv: the host tier budget (%d bytes) must hold at least one block of %d bytes: %w", opt.MemBudget, opt.BlockSize, ErrFull)
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
	s := &Store{opt: opt, log: opt.Logger, diskSize: diskSize(opt.BlockSize), m: map[Key]*entry{},
		memLRU: list.New(), diskLRU: list.New(), wake: make(chan struct{}, 1), done: make(chan struct{}), write: writeBlockFile}
	s.idle = sync.NewCond(&s.mu)
	if opt.DiskBudget > 0 {
		if err := s.rebuild(); err != nil {
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

// Put stores block b (exactly BlockSize bytes) under k. The store keeps b
// (the caller must not change it afterwards). It returns once b is in host
// memory; the disk write follows. ErrFull when the host tier has no room
// that eviction can make; ErrSize for a block of another size.
func (s *Store) Put(k Key, b []byte) error {
	if len(b) != s.opt.BlockSize {
		return fmt.Errorf("%w: %d bytes, the block size is %d", ErrSize, len(b), s.opt.BlockSize)
	}
	sum := chunkstore.Sum(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	e := s.m[k]
	if e != nil && e.data != nil && e.sum == sum {
		s.memLRU.MoveToFront(e.mem)
		s.st.puts++
		return nil
	}
	if e == nil || e.data == nil {
		if !s.makeMemRoom(e) {
			s.st.refused++
			return fmt.Errorf("%w (%d blocks of %d waiting for the disk, budget %d bytes)", ErrFull, s.dirty, s.memLRU.Len(), s.opt.MemBudget)
		}
	}
	if e == nil {
		e = &entry{key: k}
		s.m[k] = e
	}
	onDisk := e.disk != nil && e.sum == sum && !e.dirty
	e.data, e.sum = b, sum
	e.gen++
	if e.mem == nil {
		e.mem = s.memLRU.PushFront(e)
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

// makeMemRoom evicts clean blocks from the host tier, least recently used
// first, until one more block fits; keep is not evicted. Blocks waiting
// for their disk write are skipped. s.mu held.
func (s *Store) makeMemRoom(keep *entry) bool {
	bs := int64(s.opt.BlockSize)
	for el := s.memLRU.Back(); s.memUsed+bs > s.opt.MemBudget && el != nil; {
		e := el.Value.(*entry)
		el = el.Prev()
		if e.dirty || e == keep {
			continue
		}
		s.dropMem(e)
		s.st.memEvictions++
	}
	return s.memUsed+bs <= s.opt.MemBudget
}

// dropMem removes e from the host tier (and from the store when it is on
// no disk either). s.mu held.
func (s *Store) dropMem(e *entry) {
	if e.mem == nil {
		return
	}
	s.memLRU.Remove(e.mem)
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
	start := time.Now()
	s.mu.Lock()
	e := s.m[k]
	switch {
	case s.closed || e == nil:
		s.st.misses++
		s.mu.Unlock()
		return Miss, nil
	case e.data != nil:
		d := e.data
		s.memLRU.MoveToFront(e.mem)
		s.st.memHits++
		s.st.memReadBytes += int64(len(d))
		s.mu.Unlock()
		err := fn(d)
		s.getLatency[Memory].since(start)
		return Memory, err
	}
	gen := e.gen
	s.diskLRU.MoveToFront(e.disk)
	s.mu.Unlock()

	b, sum, err := readBlockFile(s.path(k), k, s.opt.BlockSize)
	s.mu.Lock()
	if err != nil {
		s.st.misses++
		if s.m[k] != e || e.disk == nil || e.gen != gen || e.data != nil {
			// Evicted, cleared or put again while it was read: a plain
			// miss (its file may be gone), not the file's fault.
			s.mu.Unlock()
			return Miss, nil
		}
		s.st.verifyFailures++
		s.dropDisk(e, true)
		s.mu.Unlock()
		s.log.Warn("kv: dropped a block that failed its check on disk", "key", fmt.Sprintf("%x", k.ID[:8]), "ns", k.NS, "err", err)
		return Miss, nil
	}
	s.st.diskHits++
	s.st.diskReadBytes += int64(len(b))
	// Keep it in memory too, if that costs no block waiting for the disk.
	if s.m[k] == e && e.data == nil && s.makeMemRoom(e) {
		e.data = b
		e.sum = sum
		e.mem = s.memLRU.PushFront(e)
		s.memUsed += int64(s.opt.BlockSize)
	}
	s.mu.Unlock()
	err = fn(b)
	s.getLatency[Disk].since(start)
	return Disk, err
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
	for _, e := range s.m {
		e.data = nil
	}
	s.m = map[Key]*entry{}
	s.memLRU.Init()
	s.diskLRU.Init()
	s.memUsed, s.diskUsed, s.dirty = 0, 0, 0
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
	BlockSize  int       `json:"block_size"`
	HostMemory string    `json:"host_memory"`
	Dir        string    `json:"dir,omitempty"`
	Memory     TierStats `json:"memory"`
	Disk       TierStats `json:"disk"`
	Puts       int64     `json:"puts"`
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
	out := Stats{BlockSize: s.opt.BlockSize, HostMemory: HostMemory, Dir: s.opt.Dir,
		Memory: TierStats{Blocks: int64(s.memLRU.Len()), Bytes: s.memUsed, Budget: s.opt.MemBudget, Hits: st.memHits, ReadBytes: st.memReadBytes, Evictions: st.memEvictions},
		Disk:   TierStats{Blocks: int64(s.diskLRU.Len()), Bytes: s.diskUsed, Budget: s.opt.DiskBudget, Hits: st.diskHits, ReadBytes: st.diskReadBytes, Evictions: st.diskEvictions},
		Puts:   st.puts, Refused: st.refused, Misses: st.misses, Dirty: int64(s.dirty), DiskWrites: st.diskWrites,
		DiskWriteErrors: st.diskWriteErrors, MemoryOnly: st.memOnly, VerifyFailures: st.verifyFailures}
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
