package peers

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// Fetch brings chunk id (n bytes) from the members: it asks the chunk's
// owners first (placement), then the rest in rendezvous order, verifies what each sends against the id, and moves on when a
// member does not hold the chunk, fails, or sends wrong bytes (counted as a
// bad chunk, shown by `kylix peers`). It implements chunkstore.Fetcher; the
// store verifies again before anyone sees the bytes.
func (n *Node) Fetch(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error) {
	if !n.started.Load() {
		return nil, fmt.Errorf("chunk %s: not in a cluster: %w", id.Short(), chunkstore.ErrNotLocal)
	}
	ps := n.fetchOrder(id)
	var lastErr error
	asked := 0
	for _, p := range ps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		asked++
		actx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
		data, err := n.request(actx, p, request{op: opChunk, id: id, len: size}, size)
		cancel()
		st := n.statsFor(p.name)
		switch {
		case err != nil:
			st.Errors.Add(1)
			lastErr = err
			n.log.Warn("fetch: member failed; asking another", "chunk", id.String(), "member", p.name, "err", err)
			continue
		case data == nil:
			continue // not held there
		case uint32(len(data)) != size || chunkstore.Sum(data) != id:
			st.BadChunks.Add(1)
			lastErr = fmt.Errorf("member %s sent a wrong chunk", p.name)
			n.log.Error("fetch: a member sent bytes that fail their hash; asking another", "chunk", id.String(), "member", p.name, "bytes", len(data))
			continue
		}
		st.Fetched.Add(1)
		st.FetchedBytes.Add(int64(len(data)))
		return data, nil
	}
	if lastErr != nil {
		return nil, fmt.Errorf("chunk %s: no member of %d asked sent it (last: %v): %w", id.Short(), asked, lastErr, chunkstore.ErrNotLocal)
	}
	return nil, fmt.Errorf("chunk %s: none of the %d other members holds it: %w", id.Short(), asked, chunkstore.ErrNotLocal)
}

// fetchOrder lists the other live members to ask for chunk id: its
// owners first (where placement puts it), then the rest in rendezvous
// order.
func (n *Node) fetchOrder(id chunkstore.ID) []peer {
	others := n.livePeers()
	var out []peer
	first := map[string]bool{}
	for _, p := range owners(id, n.members(), n.cfg.Replicas) {
		if p.name != n.self && p.addr != "" {
			out = append(out, p)
			first[p.name] = true
		}
	}
	for _, p := range rank(id, others) {
		if !first[p.name] {
			out = append(out, p)
		}
	}
	return out
}

// rank orders peers for chunk id by weighted rendezvous hashing (HRW): each
// peer's score is -capacity/ln(u), u a uniform number from BLAKE3 of the
// chunk id and the peer's name. The order is the same on every node that
// sees the same members, and a member joining or leaving moves only the
// chunks it wins or held.
func rank(id chunkstore.ID, ps []peer) []peer {
	type scored struct {
		p peer
		s float64
	}
	ss := make([]scored, len(ps))
	for i, p := range ps {
		ss[i] = scored{p, score(id, p.name, p.capacity)}
	}
	sort.Slice(ss, func(i, j int) bool {
		if ss[i].s != ss[j].s {
			return ss[i].s > ss[j].s
		}
		return ss[i].p.name < ss[j].p.name
	})
	out := make([]peer, len(ss))
	for i, s := range ss {
		out[i] = s.p
	}
	return out
}

func score(id chunkstore.ID, name string, capacity int64) float64 {
	h := blake3.New()
	h.Write(id[:])
	h.Write([]byte(name))
	var sum [32]byte
	h.Sum(sum[:0])
	// 53 bits into (0, 1).
	u := (float64(binary.BigEndian.Uint64(sum[:8])>>11) + 0.5) / (1 << 53)
	w := float64(max(capacity, 1))
	return -w / math.Log(u)
}

var _ chunkstore.Fetcher = (*Node)(nil)
