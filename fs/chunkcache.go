package fs

import (
	"container/list"
	"context"
	"sort"
	"sync"

	"github.com/kylix/kylix/chunkstore"
)

// DefaultChunkCacheBytes bounds the verified chunks the node keeps for
// reads it serves.
const DefaultChunkCacheBytes = 128 << 20

// chunkCache holds whole, verified chunks by ID for the reads the node
// serves, and makes concurrent readers of one chunk share a single read.
// The kernel splits a sequential read into several concurrent 1 MiB
// requests that start and end inside chunks: without this each of them
// would read and hash the whole chunks it touches. Chunks are
// content-addressed, so an entry is valid for every file that has it.
type chunkCache struct {
	s     *chunkstore.Store
	sem   chan struct{} // bounds the chunk reads in flight
	mu    sync.Mutex
	m     map[chunkstore.ID]*chunkEntry
	lru   list.List // of *chunkEntry, most recent first
	bytes int64
	max   int64
}

type chunkEntry struct {
	id    chunkstore.ID
	data  []byte
	err   error
	ready chan struct{}
	elem  *list.Element
}

// chunkReadsInFlight bounds the concurrent chunk reads of the node.
const chunkReadsInFlight = 16

func newChunkCache(s *chunkstore.Store, max int64) *chunkCache {
	return &chunkCache{s: s, sem: make(chan struct{}, chunkReadsInFlight), m: map[chunkstore.ID]*chunkEntry{}, max: max}
}

// PrefetchBytes is how far past a sequential read the node reads ahead.
const PrefetchBytes = 8 << 20

// lookup returns the entry for id (loaded or being loaded), or nil.
func (c *chunkCache) lookup(id chunkstore.ID) *chunkEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[id]
	if e != nil && e.elem != nil {
		c.lru.MoveToFront(e.elem)
	}
	return e
}

// fetch loads the chunks [i, j) of sf that are neither cached nor being
// loaded, several at once. Store.ReadChunk hands over the verified bytes
// it read (no copy), and the concurrent calls keep the store's I/O queue
// and all cores busy.
func (c *chunkCache) fetch(sf *chunkstore.File, offs []int64, i, j int) {
	var mine []*chunkEntry
	c.mu.Lock()
	for k := i; k < j; k++ {
		id := sf.M.Chunks[k].ID
		if _, ok := c.m[id]; ok {
			continue
		}
		e := &chunkEntry{id: id, ready: make(chan struct{})}
		c.m[id] = e
		mine = append(mine, e)
	}
	c.mu.Unlock()
	if len(mine) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, e := range mine {
		c.sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Not tied to one request's context: other readers wait for it.
			data, err := c.s.ReadChunk(context.Background(), e.id)
			<-c.sem
			c.mu.Lock()
			if err != nil {
				delete(c.m, e.id)
				e.err = err
			} else {
				e.data = data
				e.elem = c.lru.PushFront(e)
				c.bytes += int64(len(data))
				for c.bytes > c.max && c.lru.Len() > 1 {
					old := c.lru.Remove(c.lru.Back()).(*chunkEntry)
					delete(c.m, old.id)
					old.elem = nil
					c.bytes -= int64(len(old.data))
				}
			}
			c.mu.Unlock()
			close(e.ready)
		}()
	}
	wg.Wait()
}

// chunkOffsets returns the file offset of each chunk of sf, and the size
// at the end.
func chunkOffsets(sf *chunkstore.File) []int64 {
	offs := make([]int64, len(sf.M.Chunks)+1)
	var o int64
	for i, c := range sf.M.Chunks {
		offs[i] = o
		o += int64(c.Len)
	}
	offs[len(sf.M.Chunks)] = o
	return offs
}

// readAt serves p at off from whole chunks through the cache. seq says
// the caller reads sequentially: the chunks of the next PrefetchBytes are
// then loaded in the background.
func (c *chunkCache) readAt(sf *chunkstore.File, offs []int64, p []byte, off int64, seq bool) (int, error) {
	size := offs[len(offs)-1]
	if off >= size {
		return 0, nil
	}
	end := min(size, off+int64(len(p)))
	nchunks := len(offs) - 1
	first := sort.Search(nchunks, func(k int) bool { return offs[k+1] > off })
	last := first
	for last < nchunks && offs[last] < end {
		last++
	}
	c.fetch(sf, offs, first, last)
	if seq && last < nchunks {
		stop := last
		for stop < nchunks && offs[stop]-offs[last] < PrefetchBytes {
			stop++
		}
		go c.fetch(sf, offs, last, stop)
	}
	n := 0
	for i := first; i < last; i++ {
		e := c.lookup(sf.M.Chunks[i].ID)
		for e == nil { // evicted meanwhile
			c.fetch(sf, offs, i, i+1)
			e = c.lookup(sf.M.Chunks[i].ID)
		}
		<-e.ready
		if e.err != nil {
			return n, e.err
		}
		s, t := max(off, offs[i])-offs[i], min(end, offs[i+1])-offs[i]
		n += copy(p[n:], e.data[s:t])
	}
	return n, nil
}
