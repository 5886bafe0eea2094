package peers

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// Fetch brings chunk id (n bytes) from the members. A chunk in the peer
// cache (fetched lately) is read from there. Otherwise the chunk's relay
// (relay.go) is asked: the one member, chosen by rendezvous hashing among
// the alive members that do not own the chunk, that fetches it once from a
// holder and serves every member asking, so N members reading one model
// at once take it from its owners about once. When the relay fails, this
// member asks the holders itself (fetchShared: once for all its readers).
// What it fetched is kept in the peer cache, except chunks this member
// owns (placement writes those into its packs). It implements
// chunkstore.VerifiedFetcher: every chunk it returns was checked against
// its id here, so the store checks only the length.
func (n *Node) Fetch(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error) {
	return n.fetch(ctx, id, size, true)
}

// fetch is Fetch; keep false: what it fetches is not kept in the peer
// cache, nor fetched once for all readers (fetchShared), since the caller
// stores it (FetchToStore).
func (n *Node) fetch(ctx context.Context, id chunkstore.ID, size uint32, keep bool) ([]byte, error) {
	if !n.started.Load() {
		return nil, fmt.Errorf("chunk %s: not in a cluster: %w", id.Short(), chunkstore.ErrNotLocal)
	}
	members := n.members()
	// A chunk this member owns is written into its packs by placement:
	// not put in the peer cache too. It is still read from there when it
	// is there: kept (warmed) before this member became its owner, when
	// an owner failed.
	keep = keep && !n.ownsChunk(id, members)
	if note := chunkstore.FetchNoteOf(ctx); note != nil && note.NoKeep {
		keep = false // kylix load --no-keep, its --check too
	}
	if b, ok := n.cache.get(id, size); ok {
		return b, nil
	}
	if r, ok := n.relayFor(id, members); ok && r.name != n.self && !n.cfg.NoRelay {
		if data, err := n.askRelay(ctx, r, id, size, nil); err == nil {
			if keep {
				n.cache.put(id, data)
			}
			return data, nil
		}
	}
	if !keep || n.cfg.NoRelay {
		return n.fetchDirect(ctx, id, size, nil)
	}
	return n.fetchShared(ctx, id, size)
}

// FetchInto is Fetch into memory the caller provides (it implements
// chunkstore.IntoFetcher): the chunk's len(dst) bytes are read from the
// connection straight into dst and hashed as they arrive, so a load
// (gpuio) moves a chunk from the socket into the buffer the device copies
// from with no chunk-sized buffer in between. dst holds the verified chunk
// when it returns nil; after it returns, nothing writes into dst (a
// cancelled transfer closes its connection first: roundTrip). A chunk in
// the peer cache is read from there into dst and verified. The holders and
// relays are asked as for Fetch, except that a relay's part is skipped
// when it is this member (fetchShared would fetch into a buffer of its own
// to share it). What it fetched is kept in the peer cache, except chunks
// this member owns, as Fetch keeps it but behind the caller: a copy is
// queued for the cache's writers (putBehind), so a disk slower than the
// network does not slow the load, and a load that says so
// (chunkstore.FetchNote.NoKeep) keeps nothing. The caller's FetchNote
// counts what came from the cache and what was kept. FetchIntos of one
// chunk at once on this node fetch it once (intoFlight).
func (n *Node) FetchInto(ctx context.Context, id chunkstore.ID, dst []byte) error {
	if !n.started.Load() {
		return fmt.Errorf("chunk %s: not in a cluster: %w", id.Short(), chunkstore.ErrNotLocal)
	}
	note := chunkstore.FetchNoteOf(ctx)
	if n.cache.getInto(id, dst) {
		if note != nil {
			note.Local.Add(1)
			note.LocalBytes.Add(int64(len(dst)))
		}
		return nil
	}
	// One fetch of a chunk for all the loads that want it here at once
	// (the ranks of a tensor-parallel job share the chunks of their
	// column-split tensors): the others copy from the first one's memory,
	// which it keeps until they have.
	n.intoMu.Lock()
	if f, ok := n.intoFlights[id]; ok {
		f.readers.Add(1)
		n.intoMu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			f.readers.Done()
			return ctx.Err()
		}
		shared := f.err == nil && len(f.data) == len(dst)
		if shared {
			copy(dst, f.data)
		}
		f.readers.Done()
		if shared {
			n.intoShared.Add(1)
			return nil
		}
		// The first one failed (its own time limit or cancellation,
		// maybe): fetch it here.
		return n.fetchInto(ctx, id, dst)
	}
	f := &intoFlight{done: make(chan struct{})}
	if n.intoFlights == nil {
		n.intoFlights = map[chunkstore.ID]*intoFlight{}
	}
	n.intoFlights[id] = f
	n.intoMu.Unlock()
	f.err = n.fetchInto(ctx, id, dst)
	if f.err == nil {
		f.data = dst
	}
	n.intoMu.Lock()
	delete(n.intoFlights, id)
	n.intoMu.Unlock()
	close(f.done)
	f.readers.Wait() // every one that joined copied from dst
	return f.err
}

// intoFlight is one FetchInto of a chunk that other FetchIntos of it wait
// for; data is the first caller's memory, valid until readers are done.
type intoFlight struct {
	done    chan struct{}
	data    []byte
	err     error
	readers sync.WaitGroup
}

// fetchInto is FetchInto's fetch: the chunk's relay, then its holders, into
// dst; kept in the peer cache as Fetch keeps it.
func (n *Node) fetchInto(ctx context.Context, id chunkstore.ID, dst []byte) error {
	size := uint32(len(dst))
	members := n.members()
	keep := !n.ownsChunk(id, members)
	fetched := false
	if r, ok := n.relayFor(id, members); ok && r.name != n.self && !n.cfg.NoRelay {
		_, err := n.askRelay(ctx, r, id, size, dst)
		fetched = err == nil
	}
	if !fetched {
		if _, err := n.fetchDirect(ctx, id, size, dst); err != nil {
			return err
		}
	}
	if note := chunkstore.FetchNoteOf(ctx); keep && n.cache != nil && (note == nil || !note.NoKeep) {
		// Kept behind the caller (a copy, written by the cache's writers),
		// so the next load of it on this member is a local read.
		kept := n.cache.putBehind(id, dst)
		if note != nil && kept {
			note.Kept.Add(1)
			note.KeptBytes.Add(int64(len(dst)))
		} else if note != nil {
			note.NotKept.Add(1)
		}
	}
	return nil
}

// fetchDirect asks the holders of chunk id one at a time: its owners first
// (placement), then the rest (a coded chunk: its stripe holder, then its
// stripe, then the rest), each group ordered by measured throughput
// (weights.go: the member expected to deliver soonest first). It verifies
// what each sends against the id, and moves on when a member does not hold
// the chunk, fails, or sends wrong bytes (counted as a bad chunk, shown by
// `kylix peers`).
func (n *Node) fetchDirect(ctx context.Context, id chunkstore.ID, size uint32, into []byte) ([]byte, error) {
	if b, ok := n.stripeRecent(id); ok && uint32(len(b)) == size {
		// A chunk of a stripe rebuilt lately (stripestore.go).
		if into != nil {
			copy(into, b)
			return into, nil
		}
		return b, nil
	}
	var lastErr, stripeErr error
	asked := 0
	tried := map[string]bool{}
	// ask asks the holders not tried yet (ownOnly: its owners only);
	// found is false when none sent it.
	ask := func(ownOnly bool) (data []byte, found bool, err error) {
		for {
			if err := ctx.Err(); err != nil {
				return nil, false, err
			}
			// Ordered again before each attempt: the in-flight counts
			// and measurements move while this fetch waits.
			p, ok := n.pickHolder(id, tried, ownOnly)
			if !ok {
				return nil, false, nil
			}
			tried[p.name] = true
			asked++
			data, err := n.askTimed(ctx, p, id, size, into)
			if errors.Is(err, errNotHeld) {
				continue
			}
			if err != nil {
				lastErr = err
				continue
			}
			return data, true, nil
		}
	}
	// A coded chunk is asked of its stripe holder, then rebuilt from its
	// stripe, and only when that fails of the other members (a holder
	// pushed out of the set keeps its shards: repair is not built): they
	// hold other shards, and asking each of them first cost a round trip
	// per member before every rebuild.
	sm, coded := n.stripeOf(id)
	if coded {
		if data, found, err := ask(true); found || err != nil {
			return data, err
		}
		data, err := n.fetchStriped(ctx, id, sm, into)
		if err == nil {
			return data, nil
		}
		stripeErr = err
	}
	if data, found, err := ask(false); found || err != nil {
		return data, err
	}
	if stripeErr != nil {
		return nil, fmt.Errorf("chunk %s: no member of %d asked sent it, and its stripe: %w: %w", id.Short(), asked, stripeErr, chunkstore.ErrNotLocal)
	}
	if lastErr != nil {
		return nil, fmt.Errorf("chunk %s: no member of %d asked sent it (last: %v): %w", id.Short(), asked, lastErr, chunkstore.ErrNotLocal)
	}
	return nil, fmt.Errorf("chunk %s: none of the %d other members holds it: %w", id.Short(), asked, chunkstore.ErrNotLocal)
}

// errNotHeld: the member asked does not hold the chunk.
var errNotHeld = errors.New("not held")

// ask sends one chunk request (op opChunk or opRelay) to p, with the fetch
// time limit, verifies the answer and counts it in p's stats. With into
// (len size), the answer is read into it and the data returned is into.
func (n *Node) ask(ctx context.Context, p peer, op byte, id chunkstore.ID, size uint32, into []byte) ([]byte, error) {
	actx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
	data, err := n.request(actx, p, request{op: op, id: id, len: size, into: into}, size)
	cancel()
	st := n.statsFor(p.name)
	// request checked the bytes against id as they arrived (roundTrip):
	// wrong ones are errWrongChunk, never data.
	switch {
	case errors.Is(err, errWrongChunk) || err == nil && data != nil && uint32(len(data)) != size:
		st.BadChunks.Add(1)
		n.log.Error("fetch: a member sent bytes that fail their hash; asking another", "chunk", id.String(), "member", p.name, "err", err, "bytes", len(data))
		return nil, fmt.Errorf("member %s sent a wrong chunk", p.name)
	case err != nil:
		st.Errors.Add(1)
		n.log.Warn("fetch: member failed; asking another", "chunk", id.String(), "member", p.name, "err", err)
		return nil, err
	case data == nil:
		return nil, errNotHeld
	}
	st.Fetched.Add(1)
	st.FetchedBytes.Add(int64(len(data)))
	return data, nil
}

// holders returns the other live members that may hold chunk id: its
// owners (where placement puts it), then the rest in rendezvous order.
// fetchDirect asks them in that order of groups, each group by measured
// throughput (pickHolder).
func (n *Node) holders(id chunkstore.ID) (own, rest []peer) {
	first := map[string]bool{}
	homes := owners(id, n.members(), n.cfg.Replicas)
	if p, ok := n.stripeHome(id); ok {
		homes = []peer{p} // a coded chunk's home is its stripe holder (stripestore.go)
	}
	for _, p := range homes {
		if p.name != n.self && p.addr != "" {
			own = append(own, p)
			first[p.name] = true
		}
	}
	for _, p := range rank(id, n.livePeers()) {
		if !first[p.name] {
			rest = append(rest, p)
		}
	}
	return own, rest
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

// FetchVerifies marks Node as a chunkstore.VerifiedFetcher: every path of
// Fetch checks the bytes against the id before returning them (the data
// plane's roundTrip as they arrive, the peer cache on every hit), so the
// store does not hash them again.
func (n *Node) FetchVerifies() {}

var _ chunkstore.VerifiedFetcher = (*Node)(nil)
