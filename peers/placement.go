package peers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/pace"
	"github.com/kylix/kylix/peers/stripe"
)

// Placement: every chunk named by the namespace has R owners, the first R
// live members in rendezvous order (rank, weighted by capacity). Each
// member finds the chunks it owns and does not hold, and pulls them from
// the others (verified, then written into its own packs). So an import on
// any member reaches its owners without a coordinator, and after a member
// is lost the new owners of its chunks copy them from the survivors.

// DefaultReplicas is the number of owners of each chunk.
const DefaultReplicas = 2

// DefaultRepairRate bounds placement and repair pulls, bytes a second.
const DefaultRepairRate = 200 << 20

// DefaultFailureGrace is how long a member serf marked failed still owns
// its chunks before the others repair them.
const DefaultFailureGrace = 30 * time.Second

// DefaultLeaveDelay is Config.LeaveDelay's default: serf's.
const DefaultLeaveDelay = time.Second

// placeEvery is how often placement runs without a namespace or membership
// change.
const placeEvery = 30 * time.Second

// placeRetry is how soon placement runs again after a pass left owned
// chunks missing (a shard being rebuilt needed shards that were on their
// way too, or this member's disk was full): doubled after each such pass,
// up to placeEvery.
const placeRetry = 2 * time.Second

// placeWorkers is the number of chunks pulled at once.
const placeWorkers = 8

// flushBytes is how much pulled data is committed at a time.
const flushBytes = 64 << 20

// PlacementStats is what the last placement pass found.
type PlacementStats struct {
	Passes       int64     `json:"passes"`
	LastPass     time.Time `json:"last_pass"`     // when the last completed pass began
	Members      int       `json:"members"`       // alive members it placed over
	OwnedChunks  int64     `json:"owned_chunks"`  // chunks this member owns
	OwnedMissing int64     `json:"owned_missing"` // of those, not stored here after the pass
	PulledChunks int64     `json:"pulled_chunks"` // since start
	PulledBytes  int64     `json:"pulled_bytes"`
	// Pushes: chunks this node sent to their owners on import, and chunks
	// other members pushed here (push.go).
	PushedChunks   int64 `json:"pushed_chunks"`
	PushedBytes    int64 `json:"pushed_bytes"`
	ReceivedChunks int64 `json:"received_chunks"`
	ReceivedBytes  int64 `json:"received_bytes"`
	// Dropped: copies this member no longer owns, removed once their R
	// owners confirmed holding them (rebalance, push.go).
	DroppedChunks int64 `json:"dropped_chunks"`
	DroppedBytes  int64 `json:"dropped_bytes"`
	// RepairRate is the limit on pulls, bytes a second (0: none);
	// FailureGrace how long a failed member still counts as an owner.
	RepairRate   int64         `json:"repair_rate_bytes_per_s"`
	FailureGrace time.Duration `json:"failure_grace_ns"`
	// InGrace lists failed members still counted as owners.
	InGrace []string `json:"in_grace,omitempty"`
}

type placement struct {
	mu    sync.Mutex
	stats PlacementStats
	// retries counts the passes in a row that left owned chunks missing.
	retries int
	kick    chan struct{}
	// limit spaces pulls so that they average at most the repair rate
	// (a chunk is never split: one may go early, the next waits).
	limit *pace.Pacer
}

func (n *Node) kickPlace() {
	select {
	case n.place.kick <- struct{}{}:
	default:
	}
}

// Replicas is the number of members that keep each chunk.
func (n *Node) Replicas() int { return n.cfg.Replicas }

// Placement returns what the last placement pass found.
func (n *Node) Placement() PlacementStats {
	n.place.mu.Lock()
	defer n.place.mu.Unlock()
	return n.place.stats
}

func (n *Node) placeLoop() {
	defer n.wg.Done()
	t := time.NewTicker(placeEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.place.kick:
		}
		if err := n.placePass(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("placement: pass failed; will retry", "err", err)
		}
	}
}

// members lists the alive members, this node included (the fetcher's
// order of owners).
func (n *Node) members() []peer {
	var ps []peer
	for _, m := range n.serf.Members() {
		if m.Status == serf.StatusAlive {
			ps = append(ps, peerOf(m))
		}
	}
	return ps
}

// placementMembers lists the members placement places over, this node
// included: the alive ones, and those serf marked failed less than the
// failure grace ago (so a member that comes back soon finds its chunks
// still its own, and nobody copies them meanwhile).
func (n *Node) placementMembers() []peer {
	ps, _ := n.placementMembersGrace(false)
	return ps
}

// placementMembersGrace is placementMembers and the failed members in
// their grace; with kick, placement runs again when each grace ends.
func (n *Node) placementMembersGrace(kick bool) ([]peer, []string) {
	var ps []peer
	var inGrace []string
	now := time.Now()
	for _, m := range n.serf.Members() {
		if m.Status != serf.StatusAlive {
			if m.Status != serf.StatusFailed || n.cfg.FailureGrace <= 0 {
				continue
			}
			n.mu.Lock()
			since, ok := n.seen[m.Name]
			n.mu.Unlock()
			left := n.cfg.FailureGrace - now.Sub(since)
			if !ok || left <= 0 {
				continue
			}
			inGrace = append(inGrace, m.Name)
			if kick {
				time.AfterFunc(left+10*time.Millisecond, n.kickPlace)
			}
		}
		ps = append(ps, peerOf(m))
	}
	return ps, inGrace
}

// placePass pulls the chunks this member owns and lacks. It indexes the
// stripes the manifests name first (indexStripes): a coded chunk and a
// parity shard have one home, their stripe holder (homes), and a shard
// this member should hold and nobody sends is rebuilt from its stripe
// (repair).
func (n *Node) placePass(ctx context.Context) error {
	start := time.Now()
	members, inGrace := n.placementMembersGrace(true)
	refs, recs, err := n.namedChunks(ctx)
	if err != nil {
		return err
	}
	n.indexStripes(recs)
	var want, extra []chunkstore.ChunkRef
	var owned int64
	for _, c := range refs {
		if !n.ownsChunk(c.ID, members) {
			if n.s.HasChunk(c.ID) {
				extra = append(extra, c)
			}
			continue
		}
		owned++
		if !n.s.HasChunk(c.ID) {
			want = append(want, c)
		}
	}
	var missing atomic.Int64
	var perr error
	if len(want) > 0 {
		missing.Store(int64(len(want)))
		// A pull that fails to store (a full disk: ENOSPC) still ends
		// the pass: the copies this member no longer owns are dropped
		// (GC gives their room back), what it misses is counted from its
		// index (a failed commit stored nothing the workers counted) and
		// reported, and the pass runs again after placeRetry, not at the
		// next 30 s one.
		if perr = n.pull(ctx, want, &missing); perr != nil {
			var left int64
			for _, c := range want {
				if !n.s.HasChunk(c.ID) {
					left++
				}
			}
			missing.Store(left)
		}
	}
	if len(extra) > 0 && len(inGrace) == 0 {
		if err := n.rebalance(ctx, members, extra); err != nil {
			perr = errors.Join(perr, err)
		}
	}
	if perr != nil && ctx.Err() != nil {
		return perr
	}
	n.place.mu.Lock()
	if missing.Load() > 0 {
		time.AfterFunc(min(placeRetry<<min(n.place.retries, 8), placeEvery), n.kickPlace)
		n.place.retries++
	} else {
		n.place.retries = 0
	}
	n.place.stats.Passes++
	n.place.stats.LastPass = start
	n.place.stats.Members = len(members)
	n.place.stats.OwnedChunks = owned
	n.place.stats.OwnedMissing = missing.Load()
	n.place.stats.InGrace = inGrace
	n.place.mu.Unlock()
	return perr
}

// namedChunks returns every chunk the namespace names, each once: the
// chunks of the files and every shard of the stripes their manifests name
// (a stripe's parity, and its data shards that are chunks of files since
// removed: the stripe needs them), and those stripes, each once. A
// manifest not stored here yet is skipped (the next pass).
func (n *Node) namedChunks(ctx context.Context) ([]chunkstore.ChunkRef, []*stripe.Record, error) {
	refs, recs, err := n.chunksAndStripes(ctx, "", true)
	if err != nil {
		return nil, nil, err
	}
	seen := make(map[chunkstore.ID]bool, len(refs))
	for _, c := range refs {
		seen[c.ID] = true
	}
	for _, r := range recs {
		for i := range r.Shards() {
			if id, size, ok := r.ShardID(i); ok && !seen[id] {
				seen[id] = true
				refs = append(refs, chunkstore.ChunkRef{ID: id, Len: size})
			}
		}
	}
	return refs, recs, nil
}

// chunksAndStripes returns the distinct chunks of the files at and below
// p, in file order, and the stripes their manifests name (each once).
// Errors as chunkstore's FilesBelow; a manifest not stored here is an
// error naming the file, or with skipMissing skipped.
func (n *Node) chunksAndStripes(ctx context.Context, p string, skipMissing bool) ([]chunkstore.ChunkRef, []*stripe.Record, error) {
	files, err := n.s.FilesBelow(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	var refs []chunkstore.ChunkRef
	var recs []*stripe.Record
	seen := map[chunkstore.ID]bool{}
	seenStripe := map[chunkstore.ID]bool{} // by its first parity shard, its alone
	for _, pf := range files {
		if pf.Again {
			continue
		}
		m, err := n.s.FileManifest(pf.Entry.ID)
		if err != nil {
			if skipMissing {
				continue
			}
			return nil, nil, fmt.Errorf("%s: %w", pf.Path, err)
		}
		for _, c := range m.Chunks {
			if !seen[c.ID] {
				seen[c.ID] = true
				refs = append(refs, c)
			}
		}
		for _, r := range m.Stripes {
			if !seenStripe[r.Parity[0]] {
				seenStripe[r.Parity[0]] = true
				recs = append(recs, r)
			}
		}
	}
	return refs, recs, nil
}

// owns reports whether self is among the owners of id.
func owns(id chunkstore.ID, members []peer, self string, r int) bool {
	for _, p := range owners(id, members, r) {
		if p.name == self {
			return true
		}
	}
	return false
}

// owners returns the r owners of chunk id: the first members in rendezvous
// order, taking at most one per zone while members of unused zones remain
// (a member without a zone tag is a zone of its own), then the next in
// order if fewer than r zones are alive. Readers (Config.Reader) own
// nothing.
func owners(id chunkstore.ID, members []peer, r int) []peer {
	ranked := rank(id, storers(members))
	if r >= len(ranked) {
		return ranked
	}
	var out []peer
	picked := make([]bool, len(ranked))
	used := map[string]bool{}
	for i, p := range ranked {
		if len(out) == r {
			break
		}
		if p.zone != "" && used[p.zone] {
			continue
		}
		used[p.zone] = p.zone != ""
		picked[i] = true
		out = append(out, p)
	}
	for i, p := range ranked {
		if len(out) == r {
			break
		}
		if !picked[i] {
			out = append(out, p)
		}
	}
	return out
}

// storers is members without the readers (Config.Reader), which own
// nothing: the members replicas and stripes (stripes.go) are placed on.
func storers(members []peer) []peer {
	if slices.ContainsFunc(members, isReader) {
		return slices.DeleteFunc(slices.Clone(members), isReader)
	}
	return members
}

func isReader(p peer) bool { return p.reader }

// pull fetches chunks from the other members and stores them here.
func (n *Node) pull(ctx context.Context, want []chunkstore.ChunkRef, missing *atomic.Int64) error {
	im := n.s.NewImporter()
	var mu sync.Mutex // the importer is used by one goroutine at a time
	var ferr error
	// failed: set at the first failure to store (a full disk): the
	// workers stop fetching what they could not store either; the pass
	// counts what is missing and runs again (placePass).
	var failed atomic.Bool
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(placeWorkers, len(want)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(want)) && ctx.Err() == nil && !failed.Load(); i = next.Add(1) - 1 {
				c := want[i]
				if n.place.limit.Wait(ctx, int64(c.Len)) != nil {
					return
				}
				data, err := n.Fetch(ctx, c.ID, c.Len)
				if err != nil {
					if !errors.Is(err, chunkstore.ErrNotLocal) {
						n.log.Warn("placement: could not pull a chunk", "chunk", c.ID.String(), "err", err)
					}
					continue
				}
				mu.Lock()
				err = im.PutChunk(c.ID, data)
				if err == nil && im.PendingBytes() >= flushBytes {
					err = im.Flush()
				}
				if err != nil && ferr == nil {
					ferr = err
				}
				if err != nil {
					failed.Store(true)
				}
				mu.Unlock()
				if err == nil {
					missing.Add(-1)
					n.place.mu.Lock()
					n.place.stats.PulledChunks++
					n.place.stats.PulledBytes += int64(len(data))
					n.place.mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := im.Close(); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}
