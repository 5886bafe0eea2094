package peers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kylix/kylix/chunkstore"
)

// Swarm start (docs/design/peers.md): for each chunk one member is its
// relay, the first by rendezvous hashing among the alive members that do
// not own it. Readers ask the relay (op relay); the relay fetches the chunk
// once from a holder (single flight: askers of the same chunk at once wait
// for the one fetch), keeps it in its peer cache and serves every asker.
// So N members reading one model at once take each chunk from its owners
// about once, and each member relays about 1/N of the model.

// relayFor is chunk id's relay among members (this node included), and
// false when every member owns it (fewer members than replicas + 1).
func (n *Node) relayFor(id chunkstore.ID, members []peer) (peer, bool) {
	own := map[string]bool{}
	for _, p := range owners(id, members, n.cfg.Replicas) {
		own[p.name] = true
	}
	var rest []peer
	for _, p := range members {
		if !own[p.name] && (p.addr != "" || p.name == n.self) {
			rest = append(rest, p)
		}
	}
	if len(rest) == 0 {
		return peer{}, false
	}
	return rank(id, rest)[0], true
}

// askRelay asks relay r for chunk id (verified, like every fetch).
func (n *Node) askRelay(ctx context.Context, r peer, id chunkstore.ID, size uint32, into []byte) ([]byte, error) {
	data, err := n.ask(ctx, r, opRelay, id, size, into)
	if err == nil {
		n.relay.asked.Add(1)
	}
	return data, err
}

// flight is one fetch of a chunk that others wait for.
type flight struct {
	done chan struct{}
	data []byte
	err  error
}

// relayState is the single flight of fetches and the relay's counters.
type relayState struct {
	mu      sync.Mutex
	flights map[chunkstore.ID]*flight

	asked   atomic.Int64 // chunks this node got through a relay
	served  atomic.Int64 // relay requests this node answered
	fetches atomic.Int64 // fetches this node made as the one flight
}

// fetchShared fetches chunk id from its holders once for all callers at
// the same time, and keeps it in the peer cache.
func (n *Node) fetchShared(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error) {
	rs := &n.relay
	rs.mu.Lock()
	if rs.flights == nil {
		rs.flights = map[chunkstore.ID]*flight{}
	}
	f, ok := rs.flights[id]
	if !ok {
		f = &flight{done: make(chan struct{})}
		rs.flights[id] = f
		// Not the caller's context: others wait for this fetch too; each
		// attempt is bounded by the fetch time limit.
		go func() {
			rs.fetches.Add(1)
			f.data, f.err = n.fetchDirect(n.ctx, id, size, nil)
			if f.err == nil {
				n.cache.put(id, f.data)
			}
			rs.mu.Lock()
			delete(rs.flights, id)
			rs.mu.Unlock()
			close(f.done)
		}()
	}
	rs.mu.Unlock()
	select {
	case <-f.done:
		return f.data, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serveRelay answers a relay request: from the peer cache, else through
// the one flight (which asks the holders). The packs and the store's
// memory cache were tried first by the server.
func (n *Node) serveRelay(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error) {
	n.relay.served.Add(1)
	if b, ok := n.cache.peek(id, size); ok {
		return b, nil
	}
	data, err := n.fetchShared(ctx, id, size)
	if errors.Is(err, chunkstore.ErrNotLocal) {
		return nil, nil // nobody holds it: the asker tries the holders itself
	}
	return data, err
}

// SwarmStats is the peer cache and the relay as `kylix peers` shows them.
type SwarmStats struct {
	Cache CacheStats `json:"cache"`
	// RelayAsked: chunks this node got through their relay.
	RelayAsked int64 `json:"relay_asked"`
	// RelayServed: relay requests this node answered as a relay.
	RelayServed int64 `json:"relay_served"`
	// SharedFetches: fetches this node made for itself and every member
	// that asked for the chunk at the same time.
	SharedFetches int64 `json:"shared_fetches"`
}

// Swarm returns the peer cache's and the relay's counters.
func (n *Node) Swarm() SwarmStats {
	return SwarmStats{Cache: n.cache.statsOf(), RelayAsked: n.relay.asked.Load(), RelayServed: n.relay.served.Load(),
		SharedFetches: n.relay.fetches.Load()}
}
