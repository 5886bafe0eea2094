package chunkstore

import (
	"container/list"
	"sync"
)

// chunkCache keeps recently read, verified chunks so that several small reads
// inside one chunk read and hash it once. Bounded by bytes, LRU.
type chunkCache struct {
	mu    sync.Mutex
	max   int64
	used  int64
	ll    *list.List
	items map[ID]*list.Element
}

type cacheItem struct {
	id   ID
	data []byte
}

func newChunkCache(max int64) *chunkCache {
	return &chunkCache{max: max, ll: list.New(), items: map[ID]*list.Element{}}
}

// get returns a verified chunk; the slice must not be modified.
func (c *chunkCache) get(id ID) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		c.ll.MoveToFront(e)
		return e.Value.(*cacheItem).data, true
	}
	return nil, false
}

func (c *chunkCache) add(id ID, data []byte) {
	if int64(len(data)) > c.max/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[id]; ok {
		return
	}
	c.items[id] = c.ll.PushFront(&cacheItem{id: id, data: data})
	c.used += int64(len(data))
	for c.used > c.max {
		e := c.ll.Back()
		it := e.Value.(*cacheItem)
		c.ll.Remove(e)
		delete(c.items, it.id)
		c.used -= int64(len(it.data))
	}
}

func (c *chunkCache) remove(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		c.ll.Remove(e)
		delete(c.items, id)
		c.used -= int64(len(e.Value.(*cacheItem).data))
	}
}
