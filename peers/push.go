package peers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// Push, holders and replication reports (docs/design/peers.md, "Push" and
// "Replication"). An import on a member streams its chunks to their owners
// while it reads and returns when they hold them (pushstream.go); `kylix stat` and `kylix df` ask the members which
// chunks they hold (opHas), so what they report is what the alive members
// answered at that moment, not a guess from placement.

// rebalanceRetry is how soon placement runs again while copies this
// member does not own wait for their owners to confirm them.
const rebalanceRetry = 2 * time.Second

// rebalanceSettle is how long the membership must be still before a
// member drops copies it does not own.
const rebalanceSettle = 5 * time.Second

// PushResult says what a push (PushStream) sent.
type PushResult struct {
	Chunks  int64 `json:"chunks"`  // chunks sent (owners already holding one are not sent it)
	Bytes   int64 `json:"bytes"`   // their bytes
	Members int   `json:"members"` // members sent at least one chunk
	// Failed lists members the push could not reach, with why; their
	// chunks reach them by their own placement pass later.
	Failed []string `json:"failed,omitempty"`
}

// askHas asks p which of refs it stores in its packs.
func (n *Node) askHas(ctx context.Context, p peer, refs []chunkstore.ChunkRef) ([]bool, error) {
	codes, err := n.askHasCodes(ctx, p, refs)
	out := make([]bool, len(codes))
	for i, c := range codes {
		out[i] = c&hasHeld != 0
	}
	return out, err
}

// askHasCodes asks p which of refs it stores and owns (hasHeld, hasOwner).
func (n *Node) askHasCodes(ctx context.Context, p peer, refs []chunkstore.ChunkRef) ([]byte, error) {
	out := make([]byte, 0, len(refs))
	for start := 0; start < len(refs); start += maxHasIDs {
		batch := refs[start:min(start+maxHasIDs, len(refs))]
		raw := make([]byte, 0, 32*len(batch))
		for _, c := range batch {
			raw = append(raw, c.ID[:]...)
		}
		ans, err := n.request(ctx, p, request{op: opHas, raw: raw}, uint32(len(batch)))
		if err != nil {
			return nil, err
		}
		if len(ans) != len(batch) {
			return nil, fmt.Errorf("member %s answered %d of %d: %w", p.name, len(ans), len(batch), errProtocol)
		}
		out = append(out, ans...)
	}
	return out, nil
}

// Bits of an opHas answer byte.
const (
	hasHeld  = 1 // stored in the member's packs
	hasOwner = 2 // the member owns it, by its own view of the membership
)

// has answers opHas from the local packs and this member's placement.
func (sv *server) has(raw []byte) (byte, []byte) {
	var owns func(chunkstore.ID) bool
	if sv.owner != nil {
		owns = sv.owner()
	}
	out := make([]byte, len(raw)/32)
	for i := range out {
		id := chunkstore.ID(raw[32*i : 32*i+32])
		if sv.s.HasChunk(id) {
			out[i] |= hasHeld
		}
		if owns != nil && owns(id) {
			out[i] |= hasOwner
		}
	}
	return stOK, out
}

// ownsFn returns whether this member owns a chunk, by the membership now
// (failed members in their grace included).
func (n *Node) ownsFn() func(chunkstore.ID) bool {
	members := n.placementMembers()
	return func(id chunkstore.ID) bool { return n.ownsChunk(id, members) }
}

// put stores pushed chunks (each verified against its id by PutReceived,
// which also gives them their GC grace until the namespace merge names
// them) and commits them before answering.
func (sv *server) put(raw []byte) (byte, []byte) {
	pc, err := decodePut(raw)
	if err != nil {
		return stError, errMsg(err)
	}
	im := sv.s.NewImporter()
	for _, c := range pc {
		if err := im.PutReceived(chunkstore.ID(c.id), c.data); err != nil {
			im.Abort()
			var ce *chunkstore.CorruptError
			if errors.As(err, &ce) {
				sv.log.Warn("data plane: a member pushed a chunk that fails its hash; refused", "chunk", ce.Chunk.String())
			}
			return stError, errMsg(err)
		}
	}
	if err := im.Close(); err != nil {
		return stError, errMsg(err)
	}
	if sv.received != nil {
		var b int64
		for _, c := range pc {
			b += int64(len(c.data))
		}
		sv.received(int64(len(pc)), b)
	}
	return stOK, nil
}

func (n *Node) countReceived(chunks, bytes int64) {
	n.place.mu.Lock()
	n.place.stats.ReceivedChunks += chunks
	n.place.stats.ReceivedBytes += bytes
	n.place.mu.Unlock()
}

// Holder is one member's share of a file or of the namespace.
type Holder struct {
	Member string `json:"member"`
	Chunks int64  `json:"chunks"`
	Bytes  int64  `json:"bytes"`
}

// Replication is how many alive members hold the chunks of a path, as they
// answered when asked.
type Replication struct {
	Replicas int   `json:"replicas"` // R, the copies wanted
	Alive    int   `json:"alive_members"`
	Chunks   int64 `json:"chunks"` // distinct chunks
	Bytes    int64 `json:"bytes"`  // their bytes
	// LocalBytes are the bytes of those chunks stored on this node.
	LocalBytes int64 `json:"local_bytes"`
	// MinCopies is the fewest alive members holding one chunk.
	MinCopies int `json:"min_copies"`
	// UnderReplicated: chunks held by fewer than R alive members that
	// answered (members that did not answer count as not holding).
	UnderChunks int64 `json:"under_replicated_chunks"`
	UnderBytes  int64 `json:"under_replicated_bytes"`
	// Unheld: chunks no alive member holds (lost, unless a failed member
	// comes back).
	UnheldChunks int64    `json:"unheld_chunks"`
	UnheldBytes  int64    `json:"unheld_bytes"`
	Holders      []Holder `json:"holders"`
	// Unanswered lists alive members that could not be asked, with why.
	Unanswered []string `json:"unanswered,omitempty"`
	// Cold data (docs/design/erasure.md): chunks coded in stripes want
	// one copy (their stripe holder's), counted in UnderReplicated when
	// they have none; ParityBytes are the parity shards of their stripes
	// held (all copies). A stripe missing stored shards is degraded, and
	// past repair (Unreadable) when it misses more than its m.
	// Tiers: per tier, the bytes of the path's chunks (logical) and what
	// storing them costs on this member and across the answering members
	// (raw; parity counted in cold). hot: chunks of the paths pinned on
	// this member (also counted in warm or cold).
	Tiers             []TierUsage `json:"tiers"`
	ColdChunks        int64       `json:"cold_chunks"`
	ColdBytes         int64       `json:"cold_bytes"`
	Stripes           int         `json:"stripes"`
	ParityBytes       int64       `json:"parity_bytes"`
	DegradedStripes   int         `json:"degraded_stripes"`
	UnreadableStripes int         `json:"unreadable_stripes"`
}

// TierUsage is one tier's share of a path (Replication.Tiers).
type TierUsage struct {
	Tier       string `json:"tier"` // hot, warm or cold
	Chunks     int64  `json:"chunks"`
	Logical    int64  `json:"logical_bytes"`
	RawHere    int64  `json:"raw_here_bytes"`
	RawCluster int64  `json:"raw_cluster_bytes"`
}

// Replication asks every alive member which chunks of the files at and
// below path ("" is the whole namespace) it holds, and sums up.
func (n *Node) Replication(ctx context.Context, path string) (Replication, error) {
	res := Replication{Replicas: n.cfg.Replicas}
	refs, recs, err := n.chunksAndStripes(ctx, path, false)
	if err != nil {
		return res, err
	}
	// The chunks of the files, then the parity of their stripes.
	files := len(refs)
	at := map[chunkstore.ID]int{}
	for i, c := range refs {
		at[c.ID] = i
	}
	for _, r := range recs {
		for i := range r.Shards() {
			if id, size, ok := r.ShardID(i); ok {
				if _, dup := at[id]; !dup {
					at[id] = len(refs)
					refs = append(refs, chunkstore.ChunkRef{ID: id, Len: size})
				}
			}
		}
	}
	want := make([]int, len(refs))
	for i := range refs {
		want[i] = n.cfg.Replicas
		if i >= files {
			want[i] = 1 // a parity shard
		}
	}
	for _, r := range recs {
		for _, c := range r.Chunks {
			want[at[c.ID]] = 1 // a coded chunk: its stripe holder's
		}
	}
	copies := make([]int, len(refs))
	here := make([]bool, len(refs))
	peers := n.livePeers()
	res.Alive = len(peers) + 1
	self := Holder{Member: n.self}
	for i, c := range refs {
		if i < files {
			res.Chunks++
			res.Bytes += int64(c.Len)
		}
		if n.s.HasChunk(c.ID) {
			copies[i]++
			here[i] = true
			if i < files {
				self.Chunks++
				self.Bytes += int64(c.Len)
			}
		}
	}
	res.LocalBytes = self.Bytes
	res.Holders = append(res.Holders, self)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held, err := n.askHas(ctx, p, refs)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Unanswered = append(res.Unanswered, fmt.Sprintf("%s: %v", p.name, err))
				return
			}
			h := Holder{Member: p.name}
			for i, ok := range held {
				if ok {
					copies[i]++
					if i < files {
						h.Chunks++
						h.Bytes += int64(refs[i].Len)
					}
				}
			}
			res.Holders = append(res.Holders, h)
		}()
	}
	wg.Wait()
	sort.Slice(res.Holders, func(i, j int) bool { return res.Holders[i].Member < res.Holders[j].Member })
	sort.Strings(res.Unanswered)
	res.MinCopies = -1
	for i, c := range refs {
		if i >= files {
			res.ParityBytes += int64(copies[i]) * int64(c.Len)
			continue
		}
		if res.MinCopies < 0 || copies[i] < res.MinCopies {
			res.MinCopies = copies[i]
		}
		if want[i] == 1 {
			res.ColdChunks++
			res.ColdBytes += int64(c.Len)
		}
		if copies[i] < want[i] {
			res.UnderChunks++
			res.UnderBytes += int64(c.Len)
		}
		if copies[i] == 0 {
			res.UnheldChunks++
			res.UnheldBytes += int64(c.Len)
		}
	}
	res.Tiers, err = n.tierUsage(ctx, path, refs, files, want, copies, here)
	if err != nil {
		return res, err
	}
	res.Stripes = len(recs)
	for _, r := range recs {
		missing := 0
		for i := range r.Shards() {
			if id, _, ok := r.ShardID(i); ok && copies[at[id]] == 0 {
				missing++
			}
		}
		if missing > 0 {
			res.DegradedStripes++
		}
		if missing > r.M {
			res.UnreadableStripes++
		}
	}
	if res.MinCopies < 0 {
		res.MinCopies = 0
	}
	return res, ctx.Err()
}

// tierUsage sums Replication's refs (the path's chunks, then parity) by
// tier: cold for coded chunks (want 1) and parity, warm for the rest, hot
// for the chunks of the paths this member pins that are under path.
func (n *Node) tierUsage(ctx context.Context, path string, refs []chunkstore.ChunkRef, files int, want, copies []int, here []bool) ([]TierUsage, error) {
	hot := TierUsage{Tier: "hot"}
	warm := TierUsage{Tier: "warm"}
	cold := TierUsage{Tier: "cold"}
	pinned := map[chunkstore.ID]bool{}
	if n.cfg.Keep != nil {
		pins, err := n.cfg.Keep()
		if err != nil {
			return nil, fmt.Errorf("reading the pinned paths: %w", err)
		}
		for _, p := range pins {
			if !below(p, path) && !below(path, p) {
				continue
			}
			cs, err := n.s.ChunksBelow(ctx, p)
			if err != nil {
				continue // a pinned path not in the namespace pins nothing
			}
			for _, c := range cs {
				pinned[c.ID] = true
			}
		}
	}
	for i, c := range refs {
		t := &warm
		if i >= files || want[i] == 1 {
			t = &cold
		}
		size := int64(c.Len)
		if i < files {
			t.Chunks++
			t.Logical += size
		}
		t.RawCluster += int64(copies[i]) * size
		if here[i] {
			t.RawHere += size
		}
		if i < files && pinned[c.ID] {
			hot.Chunks++
			hot.Logical += size
			if here[i] {
				hot.RawHere += size
			}
			hot.RawCluster += int64(copies[i]) * size
		}
	}
	return []TierUsage{hot, warm, cold}, nil
}

// rebalance drops the chunks this member holds but no longer owns (a join
// moved them to the new member), each only once every one of its R owners,
// all alive and none this member, answers that it holds it: the last
// copies are never dropped. Chunks of pinned paths are kept (Config.Keep).
// A member that cannot be asked keeps its chunks here for a later pass. An
// owner confirms only a chunk it holds and owns by its own view of the
// membership, and a member never drops what it owns by its view; so two
// members whose views differ cannot each drop their copy counting on the
// other.
func (n *Node) rebalance(ctx context.Context, members []peer, extra []chunkstore.ChunkRef) error {
	r := n.cfg.Replicas
	if len(members) <= r {
		return nil
	}
	// While members join or leave, views differ (a member that just
	// rejoined may not see the others yet): drop nothing until the
	// membership this node sees has been still for rebalanceSettle.
	n.mu.Lock()
	wait := rebalanceSettle - time.Since(n.memberChanged)
	n.mu.Unlock()
	if wait > 0 {
		time.AfterFunc(wait+10*time.Millisecond, n.kickPlace)
		return nil
	}
	keep := map[chunkstore.ID]bool{}
	if n.cfg.Keep != nil {
		paths, err := n.cfg.Keep()
		if err != nil {
			return fmt.Errorf("rebalance: reading the pinned paths: %w", err)
		}
		for _, p := range paths {
			refs, err := n.s.ChunksBelow(ctx, p)
			if err != nil {
				continue // a pinned path not in the namespace pins nothing
			}
			for _, c := range refs {
				keep[c.ID] = true
			}
		}
	}
	alive := map[string]peer{}
	for _, p := range n.livePeers() {
		alive[p.name] = p
	}
	per := map[string][]chunkstore.ChunkRef{}
	need := map[chunkstore.ID]int{}
	for _, c := range extra {
		if keep[c.ID] {
			continue
		}
		ow := n.homes(c.ID, members)
		ok := len(ow) > 0
		for _, o := range ow {
			if _, live := alive[o.name]; !live || o.name == n.self {
				ok = false
			}
		}
		if !ok {
			continue
		}
		need[c.ID] = len(ow)
		for _, o := range ow {
			per[o.name] = append(per[o.name], c)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, refs := range per {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes, err := n.askHasCodes(ctx, alive[name], refs)
			if err != nil {
				n.log.Warn("rebalance: could not ask a member what it holds; keeping the copies here", "member", name, "err", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, c := range codes {
				// Held, and owned by the member's own view too: two
				// members with different views never both count on the
				// other to keep the copy.
				if c&hasHeld != 0 && c&hasOwner != 0 {
					need[refs[i].ID]--
				}
			}
		}()
	}
	wg.Wait()
	var drop []chunkstore.ID
	for id, left := range need {
		if left == 0 {
			drop = append(drop, id)
		}
	}
	if len(drop) < len(need) {
		// Owners still pulling (a member just joined): look again soon
		// rather than at the next 30 s pass.
		time.AfterFunc(rebalanceRetry, n.kickPlace)
	}
	if len(drop) == 0 {
		return ctx.Err()
	}
	chunks, bytes, err := n.s.DropChunks(ctx, drop)
	if errors.Is(err, chunkstore.ErrBusy) {
		// An import is running here: try again after it.
		time.AfterFunc(rebalanceRetry, n.kickPlace)
		return nil
	}
	if err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	n.place.mu.Lock()
	n.place.stats.DroppedChunks += int64(chunks)
	n.place.stats.DroppedBytes += bytes
	n.place.mu.Unlock()
	if chunks > 0 {
		n.log.Info("rebalance: dropped copies owned elsewhere, each confirmed on its owners", "chunks", chunks, "bytes", bytes)
	}
	return nil
}
