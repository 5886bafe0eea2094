package node

// The KV store's members tier (docs/design/kv.md, "The members tier"): on
// a node in a cluster, a block put here is copied behind the put to its
// home member (peers.PushKV: one copy elsewhere, by rendezvous hashing of
// its key), and a block missing here is asked of its home (peers.FetchKV,
// checked against its BLAKE3: a lying member is a miss), kept here and
// served. The members serve each other from their own KV stores
// (peers.KVBlocks).

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/node/kvstore"
	"github.com/kylix/kylix/peers"
)

const (
	// kvPushQueue bounds the blocks waiting to be copied to their homes;
	// a put that finds it full is not copied (counted as dropped).
	kvPushQueue = 4096
	// kvPushers copy blocks to members at once.
	kvPushers = 4
)

// KVMemberStats are the members tier's figures since the node started.
type KVMemberStats struct {
	// Hits: gets answered by another member; Misses: gets that asked the
	// members and found nothing (a lying member's block counts here).
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// Pushed: blocks copied to their home member; PushFailed: copies the
	// home refused or did not answer; PushDropped: puts not copied
	// because the queue was full.
	Pushed      int64 `json:"pushed"`
	PushFailed  int64 `json:"push_failed"`
	PushDropped int64 `json:"push_dropped"`
	// PushWaiting: blocks queued or being copied now.
	PushWaiting int64 `json:"push_waiting"`
}

// kvMembers links the KV store with the cluster.
type kvMembers struct {
	kv   *kvstore.Store
	m    *peers.Node
	log  *slog.Logger
	q    chan kvstore.Key
	stop context.CancelFunc
	wg   sync.WaitGroup

	hits, misses, pushed, pushFailed, pushDropped, waiting atomic.Int64
}

// startKVMembers serves kv's blocks to the members and starts the copies
// to their homes; close stops them (before the membership closes).
func startKVMembers(kv *kvstore.Store, m *peers.Node, log *slog.Logger) (*kvMembers, error) {
	km := &kvMembers{kv: kv, m: m, log: log, q: make(chan kvstore.Key, kvPushQueue)}
	if err := m.SetKV(kvBlocks{kv}); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	km.stop = stop
	for range kvPushers {
		km.wg.Go(func() { km.pushLoop(ctx) })
	}
	return km, nil
}

func (km *kvMembers) close() {
	km.m.SetKV(nil)
	km.stop()
	close(km.q)
	km.wg.Wait()
}

// put notes a block stored here by a put: it is copied to its home
// behind the put, unless this member is its home.
func (km *kvMembers) put(k kvstore.Key) {
	if km == nil || km.m.KVHomeIsSelf(k.NS, k.ID) {
		return
	}
	km.waiting.Add(1)
	select {
	case km.q <- k:
	default:
		km.waiting.Add(-1)
		km.pushDropped.Add(1)
	}
}

func (km *kvMembers) pushLoop(ctx context.Context) {
	for k := range km.q {
		km.pushOne(ctx, k)
		km.waiting.Add(-1)
	}
}

func (km *kvMembers) pushOne(ctx context.Context, k kvstore.Key) {
	if ctx.Err() != nil {
		return // stopping: the queue drains
	}
	h := km.kv.Peek(k) // not a get
	if h.Tier == kvstore.Miss {
		h = km.kv.Hold(k) // on disk only by now
	}
	if h.Tier == kvstore.Miss {
		return // evicted or cleared since
	}
	defer h.Release()
	if len(h.Bytes) > peers.MaxKVBlock {
		km.pushFailed.Add(1)
		return
	}
	if _, err := km.m.PushKV(ctx, k.NS, k.ID, h.Sum, h.Bytes); err != nil {
		km.pushFailed.Add(1)
		if ctx.Err() == nil {
			km.log.Warn("kv: copying a block to its home member failed", "err", err)
		}
		return
	}
	km.pushed.Add(1)
}

// kvHit is a block a get found: lent by the store (h), or fetched from a
// member and not kept here (h nil).
type kvHit struct {
	b    []byte
	h    *kvstore.Held
	tier byte
}

func (x kvHit) release() { x.h.Release() }

// hold finds k's block here, else on the members; tier 0 is a miss. A
// block from a member is kept here (so the next get is local) and lent
// from the host tier when it fits there.
func (km *kvMembers) hold(kv *kvstore.Store, k kvstore.Key) kvHit {
	h := kv.Hold(k)
	if h.Tier != kvstore.Miss || km == nil {
		return kvHit{b: h.Bytes, h: h, tier: byte(h.Tier)}
	}
	b, _, ok := km.m.FetchKV(context.Background(), k.NS, k.ID)
	if !ok || len(b) != kv.BlockSize() {
		km.misses.Add(1)
		return kvHit{}
	}
	km.hits.Add(1)
	if kv.Put(k, b) == nil {
		if h := kv.Hold(k); h.Tier != kvstore.Miss {
			return kvHit{b: h.Bytes, h: h, tier: clientproto.KVMember}
		}
	}
	return kvHit{b: b, tier: clientproto.KVMember}
}

// contains marks, in tiers (KV_CONTAINS' answer for this node), the keys
// missing here that a member keeps (KVMember).
func (km *kvMembers) contains(ns uint32, keys [][32]byte, tiers []byte) {
	if km == nil {
		return
	}
	var idx []int
	var ask [][32]byte
	for i, t := range tiers {
		if t == clientproto.KVMiss {
			idx = append(idx, i)
			ask = append(ask, keys[i])
		}
	}
	for j, kept := range km.m.KVHas(context.Background(), ns, ask) {
		if kept {
			tiers[idx[j]] = clientproto.KVMember
		}
	}
}

func (km *kvMembers) stats() *KVMemberStats {
	if km == nil {
		return nil
	}
	return &KVMemberStats{Hits: km.hits.Load(), Misses: km.misses.Load(), Pushed: km.pushed.Load(),
		PushFailed: km.pushFailed.Load(), PushDropped: km.pushDropped.Load(), PushWaiting: km.waiting.Load()}
}

// kvBlocks serves the KV store to the members (peers.KVBlocks).
type kvBlocks struct{ kv *kvstore.Store }

func (a kvBlocks) PutBlock(ns uint32, key [32]byte, b []byte) error {
	err := a.kv.Put(kvstore.Key{NS: ns, ID: key}, b)
	if errors.Is(err, kvstore.ErrSize) {
		return errors.Join(err, errors.New("the members' KV block sizes differ (kylix serve --kv-block)"))
	}
	return err
}

func (a kvBlocks) HasBlock(ns uint32, key [32]byte) bool {
	return a.kv.Contains(kvstore.Key{NS: ns, ID: key}) != kvstore.Miss
}

func (a kvBlocks) GetBlock(ns uint32, key [32]byte) ([]byte, chunkstore.ID, func(), bool) {
	h := a.kv.Hold(kvstore.Key{NS: ns, ID: key})
	if h.Tier == kvstore.Miss {
		return nil, chunkstore.ID{}, nil, false
	}
	return h.Bytes, h.Sum, h.Release, true
}
