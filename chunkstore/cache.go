package chunkstore

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"
)

// chunkCache is the store's one cache of verified chunks, shared by every
// reader (the mount, export, tools). It does two jobs:
//
//   - Single flight: concurrent readers of one chunk share one storage read
//     and one hash. The kernel splits a sequential read into several
//     concurrent 1 MiB requests that start and end inside chunks; without
//     this each of them would read and hash the whole chunks it touches.
//   - LRU by bytes: recently read chunks stay for partial reads of the same
//     chunk. Chunks are content-addressed, so an entry serves every file
//     that has the chunk.
//
// A failed read is never cached as bytes. Its error is remembered for
// failTTL so that the retries a failing read provokes (the kernel's
// readahead, then its synchronous read, then the application's own retry)
// get the same answer at once, with one log line and one storage read,
// instead of hammering a bad disk; after failTTL the next reader tries
// again (the pack may have been restored). There is no retry loop: each
// reader makes at most one attempt.
type chunkCache struct {
	mu      sync.Mutex
	max     int64
	used    int64
	ll      list.List // of *cacheEntry holding bytes, most recent first
	items   map[ID]*cacheEntry
	failTTL time.Duration
	now     func() time.Time
	// hits: claims of cached chunks or of reads in flight; misses: claims
	// that read (Counters). A failure remembered is neither.
	hits, misses atomic.Int64
}

// DefaultFailTTL is how long a failed chunk read is remembered.
const DefaultFailTTL = 2 * time.Second

type cacheEntry struct {
	id    ID
	ready chan struct{} // closed when data or err is set
	data  []byte
	err   error
	until time.Time     // failed entries: remembered until then
	elem  *list.Element // set while the bytes are in the LRU
	// waiters counts the claims that found the read in flight (tests).
	waiters int
}

func newChunkCache(max int64, now func() time.Time) *chunkCache {
	if now == nil {
		now = time.Now
	}
	return &chunkCache{max: max, items: map[ID]*cacheEntry{}, failTTL: DefaultFailTTL, now: now}
}

// claim returns the entry for id. With owner true the caller created it and
// must complete it with finish; otherwise it is cached, failed recently, or
// being read by someone else (wait on ready).
func (c *chunkCache) claim(id ID) (e *cacheEntry, owner bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		if e.elem != nil {
			c.ll.MoveToFront(e.elem)
			c.hits.Add(1)
			return e, false
		}
		if e.err == nil || c.now().Before(e.until) {
			if e.err == nil {
				c.hits.Add(1) // a read in flight, shared
				if e.data == nil {
					e.waiters++
				}
			}
			return e, false // in flight, or failed a moment ago
		}
		delete(c.items, id) // an old failure: try again
	}
	c.misses.Add(1)
	e = &cacheEntry{id: id, ready: make(chan struct{})}
	c.items[id] = e
	return e, true
}

// finish completes an entry the caller owns. keep says whether its bytes
// stay in the LRU (a whole-file export does not keep what it streams).
func (c *chunkCache) finish(e *cacheEntry, data []byte, err error, keep bool) {
	c.mu.Lock()
	switch {
	case err != nil:
		e.err = err
		e.until = c.now().Add(c.failTTL)
		if c.failTTL <= 0 && c.items[e.id] == e {
			delete(c.items, e.id)
		}
	case keep && int64(len(data)) <= c.max/4:
		e.data = data
		e.elem = c.ll.PushFront(e)
		c.used += int64(len(data))
		for c.used > c.max && c.ll.Len() > 1 {
			old := c.ll.Remove(c.ll.Back()).(*cacheEntry)
			old.elem = nil
			if c.items[old.id] == old {
				delete(c.items, old.id)
			}
			c.used -= int64(len(old.data))
		}
	default:
		// Handed to the waiters only.
		e.data = data
		if c.items[e.id] == e {
			delete(c.items, e.id)
		}
	}
	c.mu.Unlock()
	close(e.ready)
}

// get returns a cached chunk without claiming it.
func (c *chunkCache) get(id ID) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok && e.elem != nil {
		c.ll.MoveToFront(e.elem)
		return e.data, true
	}
	return nil, false
}

// remove forgets id (its bytes or its failure): GC deleted it, or verify
// found its stored copy bad. A read in flight completes for its waiters.
func (c *chunkCache) remove(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	if !ok {
		return
	}
	if e.elem != nil {
		c.ll.Remove(e.elem)
		e.elem = nil
		c.used -= int64(len(e.data))
		delete(c.items, id)
	} else if e.err != nil {
		delete(c.items, id)
	}
}

// waiting returns how many readers wait for the read of id in flight (tests).
func (c *chunkCache) waiting(id ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		return e.waiters
	}
	return 0
}

// present reports whether id is cached or being read (a prefetch need not
// start it).
func (c *chunkCache) present(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	return ok && e.err == nil
}
