package peers

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers/stripe"
)

// Coded data over the data plane (docs/design/erasure.md): a member codes
// chunks into stripes and stores each shard on its holder (a shard is a
// chunk under its own id: the put op, verified on receipt and committed
// before the answer), and a fetch that finds a chunk nowhere rebuilds it
// from its stripe. Which chunks are in which stripe comes from the file
// manifests (a cold file's names its stripes): every placement pass, and
// every change of the namespace on a member without placement, rebuilds
// this node's index of them (indexStripes).

// stripeIndex maps a shard (a coded chunk or a parity shard) to its
// stripe: the stripes of the manifests reachable from the head
// (indexStripes) and those this node was told of (AddStripes).
type stripeIndex struct {
	mu     sync.Mutex
	member map[chunkstore.ID]stripeMember
	added  []*stripe.Record              // by AddStripes, kept through indexStripes
	known  int                           // stripes indexed
	codecs map[StripeShape]*stripe.Codec // one per shape, made when first used
	// flights: the stripes being rebuilt now; recent: the member chunks of
	// the stripes rebuilt lately (recentOrder, oldest first, recentBytes
	// in all), served from memory.
	flights     map[chunkstore.ID]*stripeFlight
	recent      map[chunkstore.ID][]byte
	recentOrder []*stripe.Record
	recentAt    []time.Time // when each of recentOrder was kept
	recentBytes int64
	// now is the kept stripes' clock (nil: time.Now; tests move it).
	now func() time.Time
}

// codec returns the codec of shape sh (a Codec is safe for concurrent use;
// making one builds reedsolomon's matrices).
func (n *Node) codec(sh StripeShape) (*stripe.Codec, error) {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	if c, ok := n.stripes.codecs[sh]; ok {
		return c, nil
	}
	c, err := stripe.New(sh.K, sh.M)
	if err != nil {
		return nil, err
	}
	if n.stripes.codecs == nil {
		n.stripes.codecs = map[StripeShape]*stripe.Codec{}
	}
	n.stripes.codecs[sh] = c
	return c, nil
}

type stripeMember struct {
	rec *stripe.Record
	id  chunkstore.ID // the record's
	idx int           // shard index: data shard of a chunk, k+i of parity i
}

func (sm stripeMember) shape() StripeShape { return StripeShape{K: sm.rec.K, M: sm.rec.M} }

// AddStripes makes this node rebuild the shards of recs from their
// stripes when no member sends them, and keep them at their stripe
// holders, as if a manifest named them.
func (n *Node) AddStripes(recs []*stripe.Record) {
	n.stripes.mu.Lock()
	n.stripes.added = append(n.stripes.added, recs...)
	n.stripes.mu.Unlock()
	n.indexMore(recs)
}

// indexMore adds recs to the stripes this node knows until the next
// indexStripes (a conversion's, before the manifests naming them are
// committed).
func (n *Node) indexMore(recs []*stripe.Record) {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	for _, r := range recs {
		n.stripes.index(r)
	}
}

// indexStripes makes recs (and those given to AddStripes) the stripes this
// node knows: those of the manifests reachable from its head now. A shard
// in two stripes (two conversions of files sharing a chunk, at once) is
// kept in the one with the smaller id, the same on every member.
func (n *Node) indexStripes(recs []*stripe.Record) {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	n.stripes.member = make(map[chunkstore.ID]stripeMember, len(recs)*8)
	n.stripes.known = 0
	for _, r := range append(recs, n.stripes.added...) {
		n.stripes.index(r)
	}
}

// index adds r's shards; x.mu is held.
func (x *stripeIndex) index(r *stripe.Record) {
	sid, err := r.ID()
	if err != nil {
		return // not a valid record: nothing to rebuild from
	}
	x.known++
	if x.member == nil {
		x.member = map[chunkstore.ID]stripeMember{}
	}
	for i := range r.Shards() {
		id, _, ok := r.ShardID(i)
		if !ok {
			continue
		}
		if old, ok := x.member[id]; ok && bytes.Compare(old.id[:], sid[:]) <= 0 {
			continue
		}
		x.member[id] = stripeMember{rec: r, id: sid, idx: i}
	}
}

// StripesKnown is the number of stripes this node has indexed.
func (n *Node) StripesKnown() int {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	return n.stripes.known
}

// homes returns the members that keep chunk id, from members: a shard of
// a known stripe (a coded chunk or a parity shard) has one, its stripe
// holder; any other chunk its R owners (placement.go). A stripe wider
// than the members now (members lost past the failure grace, too few to
// repair onto) has its shards kept as replicas meanwhile: more copies,
// never fewer.
func (n *Node) homes(id chunkstore.ID, members []peer) []peer {
	if sm, ok := n.stripeOf(id); ok {
		if hs, err := stripeHolders(sm.id, members, sm.shape()); err == nil {
			return hs[sm.idx : sm.idx+1]
		}
	}
	return owners(id, members, n.cfg.Replicas)
}

// ownsChunk reports whether this member is a home of chunk id (homes).
func (n *Node) ownsChunk(id chunkstore.ID, members []peer) bool {
	return slices.ContainsFunc(n.homes(id, members), func(p peer) bool { return p.name == n.self })
}

// stripeHome is the member a coded chunk was stored on: its stripe's
// holder at the chunk's position (false: not coded, as far as this node
// knows, or no holder set).
func (n *Node) stripeHome(id chunkstore.ID) (peer, bool) {
	sm, ok := n.stripeOf(id)
	if !ok {
		return peer{}, false
	}
	hs, err := stripeHolders(sm.id, n.placementMembers(), sm.shape())
	if err != nil {
		return peer{}, false
	}
	return hs[sm.idx], true
}

func (n *Node) stripeOf(id chunkstore.ID) (stripeMember, bool) {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	m, ok := n.stripes.member[id]
	return m, ok
}

// EncodeStripes codes chunks (stored on this node) into stripes of the
// cluster's shape (StripeShape; *ClusterTooSmallError when it has none),
// grouped by length (stripe.Group), and stores shard i of each on the
// i-th of its holders (stripeHolders): data shards are the chunks
// themselves, parity shards new chunks. It returns when every holder has
// committed its shards, with the stripes' records (also given to
// AddStripes). It drops nothing: the replicas stay until a caller drops
// them.
func (n *Node) EncodeStripes(ctx context.Context, chunks []chunkstore.ChunkRef) ([]*stripe.Record, error) {
	sh, err := n.StripeShape()
	if err != nil {
		return nil, err
	}
	var recs []*stripe.Record
	for _, g := range stripe.Group(chunks, sh.K) {
		rec, err := n.encodeStripe(ctx, g, sh)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	n.AddStripes(recs)
	return recs, nil
}

// storeShard stores shard bytes b (id its BLAKE3) on member p: in this
// node's packs when p is this node, else by the put op, which the member
// verifies against the id and commits before it answers.
func (n *Node) storeShard(ctx context.Context, p peer, id chunkstore.ID, b []byte) error {
	if p.name == n.self {
		if n.s.HasChunk(id) {
			return nil
		}
		im := n.s.NewImporter()
		if err := im.PutReceived(id, b); err != nil {
			im.Abort()
			return err
		}
		return im.Close()
	}
	held, err := n.askHas(ctx, p, []chunkstore.ChunkRef{{ID: id, Len: uint32(len(b))}})
	if err != nil {
		return fmt.Errorf("member %s: %w", p.name, err)
	}
	if held[0] {
		return nil
	}
	if _, err := n.request(ctx, p, request{op: opPut, raw: appendPut(nil, id, b)}, 0); err != nil {
		return fmt.Errorf("member %s: %w", p.name, err)
	}
	return nil
}

// fetchStriped rebuilds chunk id of stripe sm from other shards, once for
// all the chunks of the stripe (stripeRebuild): the other lost chunks of a
// stripe, which a sequential read asks for next, and the chunks gathered
// to rebuild them are kept a while (recentStripeBytes) and served from
// memory. With into, the chunk is copied into it. Fewer good shards than a
// rebuild needs is ErrNotLocal (the mount's EIO) wrapping
// stripe.ErrTooFewShards.
func (n *Node) fetchStriped(ctx context.Context, id chunkstore.ID, sm stripeMember, into []byte) ([]byte, error) {
	b, ok := n.stripeRecent(id)
	if !ok {
		f := n.stripeRebuild(sm)
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil {
			return nil, fmt.Errorf("chunk %s: rebuilding from its stripe %s: %w", id.Short(), sm.id.Short(), f.err)
		}
		if sm.idx < len(f.chunks) {
			b = f.chunks[sm.idx]
		} else {
			var err error
			if b, err = n.encodeParity(sm, f.chunks); err != nil {
				return nil, err
			}
		}
	}
	if _, size, _ := sm.rec.ShardID(sm.idx); uint32(len(b)) != size {
		return nil, fmt.Errorf("chunk %s: rebuilt %d bytes, want %d: %w", id.Short(), len(b), size, chunkstore.ErrCorrupt)
	}
	if into != nil {
		copy(into, b)
		return into, nil
	}
	return b, nil
}

// encodeParity computes parity shard sm.idx of stripe sm from its member
// chunks (rebuilt or gathered, each checked against its id), and checks it
// against the record: the repair of a lost parity shard.
func (n *Node) encodeParity(sm stripeMember, chunks [][]byte) ([]byte, error) {
	codec, err := n.codec(sm.shape())
	if err != nil {
		return nil, err
	}
	data := make([]stripe.Chunk, len(chunks))
	for i, c := range chunks {
		data[i] = stripe.Chunk{ID: sm.rec.Chunks[i].ID, Data: c}
	}
	rec, parity, err := codec.Encode(data, nil)
	if err != nil {
		return nil, fmt.Errorf("stripe %s: coding its parity again: %w", sm.id.Short(), err)
	}
	i := sm.idx - sm.rec.K
	if rec.Parity[i] != sm.rec.Parity[i] {
		return nil, fmt.Errorf("stripe %s: parity shard %d coded again differs from its record: %w", sm.id.Short(), i, chunkstore.ErrCorrupt)
	}
	return parity[i], nil
}

// recentStripeBytes bounds the chunks of stripes rebuilt lately that this
// node keeps in memory (the oldest stripe goes first); recentStripeTTL how
// long one is kept: the reads of a lost region come together, and the
// memory goes back when they are done.
const (
	recentStripeBytes = 64 << 20
	recentStripeTTL   = time.Minute
)

// stripeFlight is one rebuild of a stripe, which every fetch of its
// chunks at that time waits for.
type stripeFlight struct {
	done   chan struct{}
	chunks [][]byte // by data shard index, each checked against its id
	err    error
}

// stripeRebuild returns the rebuild of stripe sm, starting it unless one
// runs: it gathers as many good shards as a rebuild needs (each fetched
// and checked against its id by fetchShard; a shard that fails is
// replaced by another), rebuilds every member chunk it did not gather
// (each checked against its id by the codec) and keeps them all in the
// recent cache. It runs under the node's context and the fetch time
// limit, not a caller's: the others waiting on it may outlive the first.
func (n *Node) stripeRebuild(sm stripeMember) *stripeFlight {
	n.stripes.mu.Lock()
	if f, ok := n.stripes.flights[sm.id]; ok {
		n.stripes.mu.Unlock()
		return f
	}
	f := &stripeFlight{done: make(chan struct{})}
	if n.stripes.flights == nil {
		n.stripes.flights = map[chunkstore.ID]*stripeFlight{}
	}
	n.stripes.flights[sm.id] = f
	n.stripes.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.FetchTimeout)
		f.chunks, f.err = n.rebuildStripe(ctx, sm)
		cancel()
		n.stripes.mu.Lock()
		delete(n.stripes.flights, sm.id)
		if f.err == nil {
			n.keepRecent(sm.rec, f.chunks)
		}
		n.stripes.mu.Unlock()
		close(f.done)
	}()
	return f
}

// rebuildStripe is stripeRebuild's work.
func (n *Node) rebuildStripe(ctx context.Context, sm stripeMember) ([][]byte, error) {
	rec := sm.rec
	codec, err := n.codec(StripeShape{K: rec.K, M: rec.M})
	if err != nil {
		return nil, err
	}
	// Where the shards should be; with members gone past what the set
	// needs (left, or failed past the grace: repair, not built, would
	// have moved their shards), every live member is asked.
	holders, _ := stripeHolders(sm.id, n.placementMembers(), StripeShape{K: rec.K, M: rec.M})
	shards, err := stripe.NewShards(rec)
	if err != nil {
		return nil, err
	}
	// Candidates: the other data shards (the chunk asked for was just
	// sought everywhere), then the parity, in that order among equals.
	var cand []int
	for i := range rec.Shards() {
		if _, _, ok := rec.ShardID(i); ok && i != sm.idx {
			cand = append(cand, i)
		}
	}
	// Shards whose holder is alive first: a shard
	// whose holder is gone is sought from every member, a round trip
	// each, so it is asked for only when the others are not enough.
	alive := map[string]bool{}
	for _, p := range n.livePeers() {
		alive[p.name] = true
	}
	// Of those, the holders expected to deliver soonest first (measured
	// throughput, weights.go): the k asked at once are the fastest, and a
	// slow or failing member is asked only when the others are not enough.
	var up []peer
	for _, i := range cand {
		if i < len(holders) && alive[holders[i].name] {
			up = append(up, holders[i])
		}
	}
	pos := map[string]int{}
	for r, p := range n.weigh(up) {
		pos[p.name] = r
	}
	key := func(i int) int {
		if i < len(holders) {
			if holders[i].name == n.self {
				return -1 // read here (fetchShard)
			}
			if r, ok := pos[holders[i].name]; ok {
				return r
			}
		}
		return len(holders) // holder gone: last
	}
	slices.SortStableFunc(cand, func(a, b int) int { return key(a) - key(b) })
	need := len(rec.Chunks) // good stored shards that rebuild a stripe (the zero ones count too)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type got struct {
		i    int
		data []byte
	}
	// Each shard is asked of its holder first; only when those are not
	// enough is a missing shard sought from every member (wide): a shard
	// whose holder is gone, before gossip says so, would otherwise cost a
	// round trip to every member.
	type attempt struct {
		i    int
		wide bool
	}
	var attempts []attempt
	for _, wide := range []bool{false, true} {
		for _, i := range cand {
			attempts = append(attempts, attempt{i, wide})
		}
	}
	results := make(chan got, len(attempts))
	gathered := map[int]bool{}
	next, pending := 0, 0
	launch := func() bool {
		for next < len(attempts) {
			a := attempts[next]
			next++
			if gathered[a.i] {
				continue
			}
			pending++
			go func() {
				results <- got{a.i, n.fetchShard(ctx, rec, a.i, holders, a.wide)}
			}()
			return true
		}
		return false
	}
	for pending < need && launch() {
	}
	for pending > 0 && !shards.Enough() {
		r := <-results
		pending--
		if r.data != nil {
			if err := shards.AddVerified(r.i, r.data); err == nil {
				gathered[r.i] = true
				continue
			}
		}
		launch()
	}
	cancel()
	all := make([]int, len(rec.Chunks))
	for i := range all {
		all[i] = i
	}
	out, err := codec.Chunks(shards, all)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if !gathered[i] {
			n.stripeReads.Add(1)
		}
	}
	return out, nil
}

// keepRecent keeps the member chunks of a stripe just rebuilt, dropping
// the oldest stripes kept beyond recentStripeBytes. n.stripes.mu is held.
func (n *Node) keepRecent(rec *stripe.Record, chunks [][]byte) {
	x := &n.stripes
	size := rec.Logical()
	if size > recentStripeBytes {
		return
	}
	for len(x.recentOrder) > 0 && x.recentBytes+size > recentStripeBytes {
		n.dropOldestRecent()
	}
	if x.recent == nil {
		x.recent = map[chunkstore.ID][]byte{}
	}
	for i, c := range rec.Chunks {
		x.recent[c.ID] = chunks[i]
	}
	x.recentOrder = append(x.recentOrder, rec)
	x.recentAt = append(x.recentAt, n.stripeClock())
	x.recentBytes += size
	time.AfterFunc(recentStripeTTL, n.dropStaleRecent)
}

// dropOldestRecent drops the oldest stripe kept. n.stripes.mu is held.
func (n *Node) dropOldestRecent() {
	x := &n.stripes
	old := x.recentOrder[0]
	x.recentOrder, x.recentAt = x.recentOrder[1:], x.recentAt[1:]
	for _, c := range old.Chunks {
		delete(x.recent, c.ID)
	}
	x.recentBytes -= old.Logical()
}

// dropStaleRecent drops the stripes kept longer than recentStripeTTL.
func (n *Node) dropStaleRecent() {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	n.dropStaleRecentLocked()
}

func (n *Node) dropStaleRecentLocked() {
	for x := &n.stripes; len(x.recentOrder) > 0 && n.stripeClock().Sub(x.recentAt[0]) >= recentStripeTTL; {
		n.dropOldestRecent()
	}
}

func (n *Node) stripeClock() time.Time {
	if n.stripes.now != nil {
		return n.stripes.now()
	}
	return time.Now()
}

// stripeRecent returns chunk id if a stripe rebuilt lately holds it.
func (n *Node) stripeRecent(id chunkstore.ID) ([]byte, bool) {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	n.dropStaleRecentLocked()
	b, ok := n.stripes.recent[id]
	return b, ok
}

// forgetRecent drops the chunks of the stripes rebuilt lately.
func (n *Node) forgetRecent() {
	n.stripes.mu.Lock()
	defer n.stripes.mu.Unlock()
	n.stripes.recent, n.stripes.recentOrder, n.stripes.recentAt, n.stripes.recentBytes = nil, nil, nil, 0
}

// fetchShard returns shard i of rec, checked against its id, from the
// member the stripe placed it on; wide, else from the other holders
// (holders may be nil), else from the other live members (a holder pushed
// out of the set by a join keeps its shards until repair moves them,
// which is not built); nil when none sends it.
func (n *Node) fetchShard(ctx context.Context, rec *stripe.Record, i int, holders []peer, wide bool) []byte {
	sid, size, _ := rec.ShardID(i)
	var order []peer
	inSet := map[string]bool{}
	if i < len(holders) {
		order = append(order, holders[i])
		inSet[holders[i].name] = true
	}
	if wide {
		for _, p := range holders {
			if !inSet[p.name] {
				order = append(order, p)
				inSet[p.name] = true
			}
		}
		for _, p := range n.livePeers() {
			if !inSet[p.name] {
				order = append(order, p)
			}
		}
	}
	for _, p := range order {
		if ctx.Err() != nil {
			return nil
		}
		if p.name == n.self {
			if b, err := n.s.ReadChunk(ctx, sid); err == nil {
				return b
			}
			continue
		}
		// Measured like any fetch (askTimed), so the next rebuild knows
		// which holders are slow.
		n.statsFor(p.name).weight.inflight.Add(1)
		if b, err := n.askTimed(ctx, p, sid, size, nil); err == nil {
			return b
		}
	}
	return nil
}

// StripeReads is how many chunks this node rebuilt from their stripes.
func (n *Node) StripeReads() int64 { return n.stripeReads.Load() }
