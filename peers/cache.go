package peers

import (
	"container/list"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/internal/units"
)

// DefaultCacheBytes is the default budget of the peer cache: chunks this
// member fetched from others, kept on disk under DATA/peer-cache.
const DefaultCacheBytes = 8 << 30

// peerCache keeps chunks fetched from other members, one file per chunk
// named by its id, and evicts the least recently used beyond its byte
// budget. Every hit is checked against its id (a damaged file is dropped).
type peerCache struct {
	dir    string
	budget int64
	// minFree is the free space on dir's file system the cache leaves to
	// others (Config.CacheMinFree); zero: none. claimed (nil: none) is
	// Config.CacheClaimed, bytes others set aside, kept free above it.
	minFree units.SizeOrPercent
	claimed func() int64

	mu   sync.Mutex
	ll   *list.List // front: most recently used; values *cacheEntry
	idx  map[chunkstore.ID]*list.Element
	used int64
	// pending: bytes of chunks admitted under the floor and being written.
	pending int64

	hits, misses, evictions, stored, writeFailures atomic.Int64
	// tmpSeq names files being written; noDirect: the file system refused
	// O_DIRECT once (store).
	tmpSeq   atomic.Uint64
	noDirect atomic.Bool

	// The writer behind the loads (putBehind): chunks queued (queued of
	// them, counting those being copied in; under mu), their bytes (at
	// most behindMax), the writers, and whether close has begun (under
	// mu).
	behind chan behindChunk
	queued int
	// inQueue: the chunks queued (under mu), so a chunk two loads fetch
	// at once is copied and written once.
	inQueue     map[chunkstore.ID]struct{}
	behindBytes atomic.Int64
	behindMax   int64 // behindMax; tests lower it
	behindWG    sync.WaitGroup
	closed      bool
	// spare: buffers of chunks written, kept for the next (at most
	// behindFree bytes; under mu): a fresh page costs more than the copy
	// into it, and a sync.Pool is emptied by every garbage collection.
	spare      [][]byte
	spareBytes int64
	lastBehind time.Time // the last chunk written
	spareTimer bool      // a dropSpare is due
	// notKeptBehind counts chunks loads fetched and the cache did not
	// keep: putBehind found the queue full (or the cache closed), or the
	// writer found no room above the floor.
	notKeptBehind atomic.Int64
}

// behindMax bounds the bytes of fetched chunks queued to be written into
// the peer cache behind the loads that fetched them; beyond it a chunk is
// not kept, so a disk (or a writer short of CPU) slower than the network
// never slows a load.
// behindWriters write them, each a chunk at a time.
const (
	behindMax     = 128 << 20
	behindWriters = 4
	// behindFree: the buffers kept for the next chunks, as many bytes as
	// the queue may hold, so a load fills none fresh after its first
	// 128 MiB; dropped once the writers have been idle spareIdle.
	behindFree = behindMax
	spareIdle  = 30 * time.Second
)

type behindChunk struct {
	id  chunkstore.ID
	buf []byte // aligned, its capacity a multiple of 4 KiB
}

// takeBuffer returns an aligned buffer of n bytes with room for its
// padding to 4 KiB: a kept one when one is large enough.
func (c *peerCache) takeBuffer(n int) []byte {
	c.mu.Lock()
	for i, b := range c.spare {
		if cap(b) >= n {
			c.spare = append(c.spare[:i], c.spare[i+1:]...)
			c.spareBytes -= int64(cap(b))
			c.mu.Unlock()
			return b[:n]
		}
	}
	c.mu.Unlock()
	return storeio.AlignedBuffer(n)[:n]
}

// giveBackLocked keeps b for takeBuffer, within behindFree bytes, and
// when the queue is empty, drops the buffers kept once it has stayed
// empty for spareIdle.
func (c *peerCache) giveBackLocked(b []byte) {
	if c.closed {
		return
	}
	if c.spareBytes+int64(cap(b)) <= behindFree {
		c.spare = append(c.spare, b[:0])
		c.spareBytes += int64(cap(b))
	}
	c.lastBehind = time.Now()
	if c.queued == 0 && !c.spareTimer {
		c.spareTimer = true
		time.AfterFunc(spareIdle, c.dropSpare)
	}
}

// dropSpare drops the buffers kept when the queue has been empty for
// spareIdle, else looks again later.
func (c *peerCache) dropSpare() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if idle := time.Since(c.lastBehind); c.queued > 0 || idle < spareIdle {
		time.AfterFunc(spareIdle-min(idle, spareIdle)+time.Second, c.dropSpare)
		return
	}
	c.spare, c.spareBytes, c.spareTimer = nil, 0, false
}

type cacheEntry struct {
	id   chunkstore.ID
	size int64
}

// CacheStats is the peer cache as `kylix peers` shows it.
type CacheStats struct {
	Dir         string `json:"dir"`
	BudgetBytes int64  `json:"budget_bytes"`
	Bytes       int64  `json:"bytes"`
	Chunks      int    `json:"chunks"`
	Hits        int64  `json:"hits"`
	Misses      int64  `json:"misses"`
	Evictions   int64  `json:"evictions"`
	Stored      int64  `json:"stored"`
	// NotKept: fetched chunks a load did not keep: the writers behind it
	// were a full queue behind, or found no room above the floor;
	// WriteFailures: writes into
	// the cache that failed (a full disk, say). Neither is an error for
	// the reader.
	NotKept       int64 `json:"not_kept,omitempty"`
	WriteFailures int64 `json:"write_failures,omitempty"`
	// Writes: how the writers behind loads write chunks: "O_DIRECT", or
	// "buffered" and why.
	Writes string `json:"writes"`
}

// openPeerCache opens (creating) the cache in dir; the chunks already
// there are kept, the least recently modified evicted first (beyond the
// budget, or while free space is below minFree).
func openPeerCache(dir string, budget int64, minFree units.SizeOrPercent, claimed func() int64) (*peerCache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("peer cache %s: %w", dir, err)
	}
	c := &peerCache{dir: dir, budget: budget, minFree: minFree, claimed: claimed, ll: list.New(), idx: map[chunkstore.ID]*list.Element{},
		behind: make(chan behindChunk, 4096), behindMax: behindMax}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("peer cache %s: %w", dir, err)
	}
	type found struct {
		id   chunkstore.ID
		size int64
		mod  int64
	}
	var fs []found
	for _, de := range des {
		b, err := hex.DecodeString(de.Name())
		if err != nil || len(b) != len(chunkstore.ID{}) {
			os.Remove(filepath.Join(dir, de.Name())) // a partial write
			continue
		}
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		fs = append(fs, found{chunkstore.ID(b), fi.Size(), fi.ModTime().UnixNano()})
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].mod < fs[j].mod })
	c.mu.Lock()
	for _, f := range fs {
		c.idx[f.id] = c.ll.PushFront(&cacheEntry{f.id, f.size})
		c.used += f.size
	}
	c.evictLocked()
	c.roomLocked(0)
	c.mu.Unlock()
	for range behindWriters {
		c.behindWG.Add(1)
		go c.writeBehind()
	}
	return c, nil
}

// putBehind queues a copy of a verified chunk to be kept (put) by the
// writers behind the caller, who may reuse data as soon as it returns. It
// reports whether the chunk is kept or queued (a writer may still find no
// room for it: counted in NotKept): false when the cache is closed, the
// chunk larger than its budget, or behindMax bytes (or as many chunks as
// the queue holds) are queued already.
func (c *peerCache) putBehind(id chunkstore.ID, data []byte) bool {
	if c == nil || int64(len(data)) > c.budget {
		return false
	}
	n := int64(len(data))
	c.mu.Lock()
	_, kept := c.idx[id]
	_, queued := c.inQueue[id]
	if kept || queued {
		c.mu.Unlock()
		return true
	}
	if c.closed || c.behindBytes.Load()+n > c.behindMax || c.queued == cap(c.behind) {
		c.mu.Unlock()
		c.notKeptBehind.Add(1)
		return false
	}
	c.behindBytes.Add(n)
	c.queued++
	if c.inQueue == nil {
		c.inQueue = map[chunkstore.ID]struct{}{}
	}
	c.inQueue[id] = struct{}{}
	c.mu.Unlock()
	// The copy is made outside the lock; the reservation above keeps the
	// send below from blocking.
	b := c.takeBuffer(len(data))
	copy(b, data)
	clear(b[len(data):storeio.AlignUp(int64(len(data)))]) // the padding, cut off after the write
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.behindBytes.Add(-n)
		c.queued--
		delete(c.inQueue, id)
		c.giveBackLocked(b)
		return false
	}
	c.behind <- behindChunk{id, b}
	return true
}

// writeBehind is a writer: it keeps the queued chunks until close.
func (c *peerCache) writeBehind() {
	defer c.behindWG.Done()
	for ch := range c.behind {
		c.mu.Lock()
		c.queued--
		c.mu.Unlock()
		b := ch.buf
		c.store(ch.id, b, b[:storeio.AlignUp(int64(len(b)))])
		c.behindBytes.Add(-int64(len(b)))
		c.mu.Lock()
		delete(c.inQueue, ch.id) // after store: kept (in idx) or not, it is no longer queued
		c.giveBackLocked(b)
		c.mu.Unlock()
	}
}

// close writes the chunks queued and stops the writers.
func (c *peerCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.behind)
	}
	c.mu.Unlock()
	c.behindWG.Wait()
	c.mu.Lock()
	c.spare, c.spareBytes = nil, 0
	c.mu.Unlock()
}

func (c *peerCache) path(id chunkstore.ID) string { return filepath.Join(c.dir, id.String()) }

// get returns chunk id's bytes when the cache holds them, verified.
func (c *peerCache) get(id chunkstore.ID, size uint32) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	b := make([]byte, size)
	if !c.getInto(id, b) {
		return nil, false
	}
	return b, true
}

// getInto reads chunk id into dst (len(dst) its size) when the cache holds
// it, verified, and counts the hit or miss. On a miss dst may hold some
// bytes.
func (c *peerCache) getInto(id chunkstore.ID, dst []byte) bool {
	if c == nil {
		return false
	}
	if c.readInto(id, dst) {
		c.hits.Add(1)
		return true
	}
	c.misses.Add(1)
	// A miss is about to fetch over the network, which dwarfs a statfs:
	// give back space others' writes took below the floor.
	c.mu.Lock()
	c.roomLocked(0)
	c.mu.Unlock()
	return false
}

// peek is get without counting (the data plane serving a peer).
func (c *peerCache) peek(id chunkstore.ID, size uint32) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	b := make([]byte, size)
	if !c.readInto(id, b) {
		return nil, false
	}
	return b, true
}

// readInto reads chunk id into dst, which must be its size, and checks it
// against id; a file of another size or with other bytes is dropped.
func (c *peerCache) readInto(id chunkstore.ID, dst []byte) bool {
	c.mu.Lock()
	e, ok := c.idx[id]
	if ok {
		c.ll.MoveToFront(e)
	}
	c.mu.Unlock()
	if !ok {
		return false
	}
	f, err := os.Open(c.path(id))
	if err != nil {
		c.drop(id)
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && fi.Size() != int64(len(dst)) {
		err = fmt.Errorf("%d bytes, want %d", fi.Size(), len(dst))
	}
	if err == nil {
		_, err = f.ReadAt(dst, 0)
	}
	if err != nil || chunkstore.Sum(dst) != id {
		c.drop(id)
		return false
	}
	return true
}

// put keeps a verified chunk and reports whether the cache holds it
// afterwards; a failure to write only means it is not kept.
func (c *peerCache) put(id chunkstore.ID, data []byte) bool { return c.store(id, data, nil) }

// store is put; padded, when not nil, is data's buffer rounded up to 4 KiB
// and aligned (storeio.AlignedBuffer), and the file is written from it
// with O_DIRECT (then cut to its length): the bytes go from that reused
// buffer to the disk, not through new page-cache pages, whose first touch
// costs a load's CPU more than the copy (docs/bench.md, "A copy kept for
// the next start"). A file system that refuses O_DIRECT gets buffered
// writes.
func (c *peerCache) store(id chunkstore.ID, data, padded []byte) bool {
	if c == nil || int64(len(data)) > c.budget {
		return false
	}
	need := int64(len(data))
	c.mu.Lock()
	_, ok := c.idx[id]
	if ok {
		c.mu.Unlock()
		return true
	}
	if !c.roomLocked(need) {
		c.mu.Unlock()
		if padded != nil { // a chunk a load queued: counted as not kept
			c.notKeptBehind.Add(1)
		}
		return false // no room above the floor, even with the cache empty
	}
	c.pending += need
	c.mu.Unlock()
	tmp := filepath.Join(c.dir, fmt.Sprintf("%s.tmp%d", id, c.tmpSeq.Add(1)))
	var f *os.File
	var err error
	if padded != nil && !c.noDirect.Load() {
		f, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_DIRECT, 0o600)
		if err == nil {
			_, err = f.Write(padded)
			if err == nil {
				err = f.Truncate(int64(len(data)))
			}
		}
		if errors.Is(err, unix.EINVAL) { // refused, at the open or the write
			c.noDirect.Store(true)
			if f != nil {
				f.Close()
				f = nil
			}
			// Some file systems create the file before they refuse
			// O_DIRECT at the open (ramfs).
			os.Remove(tmp)
			tmp = filepath.Join(c.dir, fmt.Sprintf("%s.tmp%d", id, c.tmpSeq.Add(1)))
		}
	}
	if f == nil {
		f, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.Write(data)
		}
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, c.path(id))
		}
		if err != nil {
			os.Remove(tmp)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending -= need
	if err != nil {
		c.writeFailures.Add(1)
		return false
	}
	if _, ok := c.idx[id]; ok {
		return true
	}
	c.idx[id] = c.ll.PushFront(&cacheEntry{id, int64(len(data))})
	c.used += int64(len(data))
	c.stored.Add(1)
	c.evictLocked()
	return true
}

// drop removes chunk id and returns its size if the cache held it.
func (c *peerCache) drop(id chunkstore.ID) (size int64, held bool) {
	c.mu.Lock()
	if e, ok := c.idx[id]; ok {
		c.ll.Remove(e)
		delete(c.idx, id)
		size, held = e.Value.(*cacheEntry).size, true
		c.used -= size
	}
	c.mu.Unlock()
	os.Remove(c.path(id))
	return size, held
}

// free evicts the least recently used chunks until need bytes are
// freed (each counted as its size rounded up to 4 KiB, what a file
// system gives back) or the cache is empty, and returns the bytes freed.
func (c *peerCache) free(need int64) int64 {
	if c == nil || need <= 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var freed int64
	for freed < need {
		n := c.evictOldestLocked()
		if n == 0 {
			break
		}
		freed += (n + 4095) &^ 4095
	}
	return freed
}

func (c *peerCache) evictLocked() {
	for c.used > c.budget {
		if c.evictOldestLocked() == 0 {
			return
		}
	}
}

// evictOldestLocked drops the least recently used chunk and returns its
// size (0: the cache is empty).
func (c *peerCache) evictOldestLocked() int64 {
	e := c.ll.Back()
	if e == nil {
		return 0
	}
	ce := e.Value.(*cacheEntry)
	c.ll.Remove(e)
	delete(c.idx, ce.id)
	c.used -= ce.size
	c.evictions.Add(1)
	os.Remove(c.path(ce.id))
	return max(ce.size, 1)
}

// roomLocked makes the cache keep within min(budget, what leaves minFree
// free on its file system): it evicts the least recently used chunks while
// the free space, less the chunks being written and need more bytes, is
// below the floor, and reports whether need bytes then fit above it. The
// mount's reserve is the floor the node gives (node.New): before it, a
// member on a small disk filled it with chunks it read from others, and
// root's own writes through the mount got ENOSPC. An evicted file is
// counted as freeing its size rounded up to the block size (what tmpfs,
// ext4 and xfs give back for a file written whole). A statfs failure
// leaves the budget alone in charge (it only means the floor cannot be
// checked); concurrent puts are accounted through pending, so they cannot
// all take the same free bytes.
func (c *peerCache) roomLocked(need int64) bool {
	if c.minFree.Bytes <= 0 && c.minFree.Percent <= 0 && c.claimed == nil {
		return true
	}
	var st unix.Statfs_t
	if err := unix.Statfs(c.dir, &st); err != nil {
		return true
	}
	bs := st.Frsize
	if bs <= 0 {
		bs = st.Bsize
	}
	bs = max(bs, 1)
	free := int64(st.Bavail) * bs
	floor := c.minFree.Of(int64(st.Blocks) * bs)
	if c.claimed != nil {
		floor += max(c.claimed(), 0)
	}
	round := func(n int64) int64 { return (n + bs - 1) / bs * bs }
	for free-c.pending-round(need) < floor {
		n := c.evictOldestLocked()
		if n == 0 {
			return false
		}
		free += round(n)
	}
	return true
}

// writesMode says how the writers behind loads write (CacheStats.Writes).
func (c *peerCache) writesMode() string {
	if c.noDirect.Load() {
		return "buffered: the file system refused O_DIRECT"
	}
	return "O_DIRECT"
}

func (c *peerCache) statsOf() CacheStats {
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Dir: c.dir, BudgetBytes: c.budget, Bytes: c.used, Chunks: len(c.idx),
		Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load(), Stored: c.stored.Load(),
		NotKept: c.notKeptBehind.Load(), WriteFailures: c.writeFailures.Load(), Writes: c.writesMode()}
}

// ids lists the chunks in the cache.
func (c *peerCache) ids() []chunkstore.ID {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]chunkstore.ID, 0, len(c.idx))
	for id := range c.idx {
		out = append(out, id)
	}
	return out
}
