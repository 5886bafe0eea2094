package peers

import (
	"context"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// For kylix pin, warm and stat across the cluster (docs/design/pin.md):
// a fetch for a caller that stores the chunk itself, and what the peer
// cache holds.

// Node brings the chunks chunkstore.Store.MakeLocal writes into the packs
// through FetchToStore.
var _ chunkstore.StoreFetcher = (*Node)(nil)

// FetchToStore brings chunk id (size bytes) from the members for a caller
// that writes it into this node's packs (chunkstore.Store.MakeLocal: kylix
// pin, KYLIX_IOC_MAKE_LOCAL): like Fetch, from the peer cache, else the
// chunk's relay, else the holders (owners first), each answer checked
// against the id; but what it fetches is not kept in the peer cache, since
// the packs will hold it. A chunk nobody can send fails
// with an error wrapping chunkstore.ErrNotLocal.
func (n *Node) FetchToStore(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error) {
	return n.fetch(ctx, id, size, false)
}

// PeerCached returns how many of refs, and their bytes, the peer cache
// holds now (by its index: the files are checked when read).
func (n *Node) PeerCached(refs []chunkstore.ChunkRef) (chunks int, bytes int64) {
	c := n.cache
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		if _, ok := c.idx[r.ID]; ok {
			chunks++
			bytes += int64(r.Len)
		}
	}
	return chunks, bytes
}

// FreePeerCache evicts the least recently used chunks of the peer cache
// until need bytes of its file system are freed, or it is empty, and
// returns the bytes freed: a write through the mount that would not fit
// comes first (fs.Options.MakeRoom). Those chunks are fetched again when
// read.
// Said in the log at most once a minute (a write at the floor asks at
// every write call), with the bytes freed since.
func (n *Node) FreePeerCache(need int64) int64 {
	freed := n.cache.free(need)
	if freed > 0 {
		total := n.roomFreed.Add(freed)
		now := time.Now().UnixNano()
		if last := n.roomLogged.Load(); now-last >= int64(time.Minute) && n.roomLogged.CompareAndSwap(last, now) {
			n.roomFreed.Add(-total)
			n.log.Info("peer cache: chunks evicted to make room for writes through the mount", "bytes", total)
		}
	}
	return freed
}

// DropPeerCached removes the chunks ids from the peer cache (kylix evict),
// or every chunk in it when all is set, and returns how many it held and
// their bytes. The next read of a dropped chunk fetches it again. Chunks
// in this node's packs are not touched: the peer cache only ever holds
// chunks this node fetched from others.
func (n *Node) DropPeerCached(ids []chunkstore.ID, all bool) (chunks int, bytes int64) {
	c := n.cache
	if c == nil {
		return 0, 0
	}
	if all {
		ids = c.ids()
	}
	for _, id := range ids {
		if size, held := c.drop(id); held {
			chunks++
			bytes += size
		}
	}
	return chunks, bytes
}

// NotOwnedHere returns the bytes of refs (each chunk once) that this
// member stores in its packs and is not a home of by the membership now:
// the copies its rebalance may drop once their homes confirm them, when
// no kept or pinned path names them (node's high watermark).
func (n *Node) NotOwnedHere(refs []chunkstore.ChunkRef) int64 {
	members := n.placementMembers()
	seen := map[chunkstore.ID]bool{}
	var b int64
	for _, c := range refs {
		if seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		if !n.ownsChunk(c.ID, members) && n.s.HasChunk(c.ID) {
			b += int64(c.Len)
		}
	}
	return b
}

// Rebalance asks for a placement pass now: its rebalance drops the copies
// this member does not own that no kept or pinned path names, each once
// its homes confirm they hold it (never the last copy).
func (n *Node) Rebalance() { n.kickPlace() }
