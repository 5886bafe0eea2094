package peers

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// startNodeClock is startNodeCfg with the store's wall clock read from now
// (Unix nanoseconds), so a test can move it past chunkstore.DefaultReceivedGrace.
func startNodeClock(t *testing.T, cfg Config, now *atomic.Int64) *testNode {
	t.Helper()
	cfg.Listen, cfg.Capacity, cfg.FetchTimeout = freeAddr(t), 1<<30, 5*time.Second
	n, err := New(cfg)
	require.NoError(t, err)
	s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir(), Fetcher: n, CacheBytes: cacheBytes,
		Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, n.Start(s, nil))
	t.Cleanup(func() { n.Close() })
	return &testNode{n, s}
}

// threeOwnersClock is threeNoPlacement with B's and C's store clocks
// read from now (set to the time now), so a test can move them past the
// grace of received chunks while A's stays.
func threeOwnersClock(t *testing.T, now *atomic.Int64) (a, b, c *testNode) {
	t.Helper()
	key, _ := NewKey()
	now.Store(time.Now().UnixNano())
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	b = startNodeClock(t, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}}, now)
	c = startNodeClock(t, Config{Name: "c", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}}, now)
	eventually(t, "three alive members", func() bool { return len(a.livePeers()) == 2 })
	return a, b, c
}

// threeNoPlacement starts three members that never pull (NoPlacement), so
// only a push can put chunks on them, and waits until they see each other.
func threeNoPlacement(t *testing.T) (a, b, c *testNode) {
	t.Helper()
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	b, err = startNodeCfg(t, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	c, err = startNodeCfg(t, Config{Name: "c", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	eventually(t, "three alive members", func() bool { return len(a.livePeers()) == 2 })
	return a, b, c
}

// streamImport imports src at dest on a, its chunks streamed to their
// owners as it reads (what kylix import does on a member), calling onChunk
// (if set) before each goes to the stream.
func streamImport(t *testing.T, a *testNode, src, dest string, onChunk func()) PushResult {
	t.Helper()
	ctx := context.Background()
	ps := a.NewPushStream(ctx)
	add := ps.Add
	if onChunk != nil {
		add = func(id chunkstore.ID, data []byte) { onChunk(); ps.Add(id, data) }
	}
	_, err := a.s.Import(ctx, src, dest, chunkstore.ImportOptions{OnChunk: add})
	require.NoError(t, err)
	res, err := ps.Close()
	require.NoError(t, err)
	return res
}

// TestPushStream: three members that never pull (NoPlacement), so only the
// push can put chunks on them. An import on A streams its chunks through a
// PushStream; when Close returns, every chunk is on its two owners, the
// owners received what A sent, and importing the same bytes again sends
// nothing (the owners say they hold them).
func TestPushStream(t *testing.T) {
	a, b, c := threeNoPlacement(t)
	data := randBytes(40 << 20)
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, data, 0o644))
	res := streamImport(t, a, src, "d/f", nil)
	require.Empty(t, res.Failed)
	f, _, err := a.s.OpenPath("d/f")
	require.NoError(t, err)
	var owned int64
	for _, ch := range f.M.Chunks {
		for _, o := range owners(ch.ID, a.members(), DefaultReplicas) {
			x := map[string]*testNode{"a": a, "b": b, "c": c}[o.name]
			require.True(t, x.s.HasChunk(ch.ID), "chunk %s not on its owner %s", ch.ID.Short(), o.name)
			if o.name != "a" {
				owned++
			}
		}
	}
	require.Equal(t, owned, res.Chunks, "chunks pushed")
	require.Equal(t, res.Chunks, b.Placement().ReceivedChunks+c.Placement().ReceivedChunks)
	require.Equal(t, res.Chunks, a.Placement().PushedChunks)
	rep, err := a.Replication(context.Background(), "d/f")
	require.NoError(t, err)
	require.Equal(t, 2, rep.MinCopies)
	require.Zero(t, rep.UnderBytes)
	require.Equal(t, int64(len(data)), rep.LocalBytes)

	again := streamImport(t, a, src, "d/g", nil)
	require.Zero(t, again.Chunks, "the same bytes imported again were sent again")
}

// TestPushStreamOwnerDown: an owner that stops answering in the middle of
// the stream is named in the result; the import on A itself succeeds and
// the other owner gets its chunks.
func TestPushStreamOwnerDown(t *testing.T) {
	a, b, c := threeNoPlacement(t)
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, randBytes(48<<20), 0o644))
	ms := a.members() // owners as the stream sees them (c leaves below)
	chunks := 0
	res := streamImport(t, a, src, "d/f", func() {
		if chunks++; chunks == 16 {
			require.NoError(t, c.Close()) // c's data plane goes away mid-stream
		}
	})
	require.Len(t, res.Failed, 1)
	require.Contains(t, res.Failed[0], "c: ")
	f, _, err := a.s.OpenPath("d/f")
	require.NoError(t, err)
	for _, ch := range f.M.Chunks {
		for _, o := range owners(ch.ID, ms, DefaultReplicas) {
			if o.name == "b" {
				require.True(t, b.s.HasChunk(ch.ID), "chunk %s not on its owner b", ch.ID.Short())
			}
		}
	}
}

// TestPushedChunksSurviveGC: chunks pushed to owners that no namespace
// names (an import that never committed on its member: the namespace
// merge will never name them) survive a GC on the owners within
// chunkstore.DefaultReceivedGrace, and are collected by the first GC after it.
func TestPushedChunksSurviveGC(t *testing.T) {
	var now atomic.Int64
	a, b, c := threeOwnersClock(t, &now)
	ctx := context.Background()
	ps := a.NewPushStream(ctx)
	var ids []chunkstore.ID
	for range 24 {
		d := randBytes(512 << 10)
		id := chunkstore.Sum(d)
		ids = append(ids, id)
		ps.Add(id, d)
	}
	res, err := ps.Close()
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.NotZero(t, res.Chunks)
	on := map[string]*testNode{"b": b, "c": c}
	check := func(want bool) {
		t.Helper()
		for _, id := range ids {
			for _, o := range owners(id, a.members(), DefaultReplicas) {
				if x := on[o.name]; x != nil {
					require.Equal(t, want, x.s.HasChunk(id), "chunk %s on its owner %s", id.Short(), o.name)
				}
			}
		}
	}
	check(true)
	for _, x := range on {
		g, err := x.s.GC(ctx)
		require.NoError(t, err)
		require.NotZero(t, g.ReceivedKept)
		require.Zero(t, g.ChunksRemoved)
	}
	check(true)
	// The stream's lease ended at Close: once the owners saw it go, the
	// grace runs from then.
	eventually(t, "the owners saw the lease end", func() bool {
		return !leaseRunning(b, "a") && !leaseRunning(c, "a")
	})
	now.Add(int64(chunkstore.DefaultReceivedGrace + time.Minute))
	for _, x := range on {
		g, err := x.s.GC(ctx)
		require.NoError(t, err)
		require.Zero(t, g.ReceivedKept)
	}
	check(false)
}

// leaseRunning reports whether x sees member's GC lease running.
func leaseRunning(x *testNode, member string) bool {
	x.watchLeases()
	x.lease.mu.Lock()
	defer x.lease.mu.Unlock()
	for _, l := range x.lease.seen {
		if l.member == member && l.ended.IsZero() {
			return true
		}
	}
	return false
}

// TestLeaseKeepsPushedChunks: an import that runs longer than the grace.
// A's push stream delivers chunks to B and C, whose clocks then move past
// the grace while the stream is still open: their GC keeps the chunks,
// because A's lease (its gcl tag) still runs. The import fails (Abort):
// the lease ends, the chunks are kept for the grace after that, then
// collected.
func TestLeaseKeepsPushedChunks(t *testing.T) {
	var now atomic.Int64
	a, b, c := threeOwnersClock(t, &now)
	ctx := context.Background()
	on := map[string]*testNode{"b": b, "c": c}
	ps := a.NewPushStream(ctx)
	defer ps.Abort()
	eventually(t, "B and C see A's lease", func() bool { return leaseRunning(b, "a") && leaseRunning(c, "a") })
	// Three full batches per owner: each owner is sent two while the
	// stream stays open.
	var ids []chunkstore.ID
	for range 3 * 3 * streamBatch / (1 << 20) {
		d := randBytes(1 << 20)
		id := chunkstore.Sum(d)
		ids = append(ids, id)
		ps.Add(id, d)
	}
	delivered := func() map[string][]chunkstore.ID {
		got := map[string][]chunkstore.ID{}
		for _, id := range ids {
			for name, x := range on {
				if x.s.HasChunk(id) {
					got[name] = append(got[name], id)
				}
			}
		}
		return got
	}
	eventually(t, "B and C received chunks of the open stream", func() bool {
		d := delivered()
		return len(d["b"]) > 0 && len(d["c"]) > 0
	})
	held := delivered()

	gc := func(x *testNode) chunkstore.GCResult {
		t.Helper()
		g, err := x.s.GC(ctx)
		require.NoError(t, err)
		return g
	}
	now.Add(int64(chunkstore.DefaultReceivedGrace + time.Minute))
	for name, x := range on {
		g := gc(x)
		require.Zero(t, g.ChunksRemoved, "%s: gc under a running lease", name)
		require.GreaterOrEqual(t, g.ReceivedKept, len(held[name]), "%s: every chunk received kept", name)
		for _, id := range held[name] {
			require.True(t, x.s.HasChunk(id), "%s: chunk %s kept under the lease", name, id.Short())
		}
	}

	ps.Abort()
	eventually(t, "B and C see the lease end", func() bool { return !leaseRunning(b, "a") && !leaseRunning(c, "a") })
	now.Add(int64(chunkstore.DefaultReceivedGrace / 2))
	for name, x := range on {
		g := gc(x)
		require.Zero(t, g.ChunksRemoved, "%s: gc within the grace after the lease ended", name)
		require.NotZero(t, g.ReceivedKept, name)
	}
	now.Add(int64(chunkstore.DefaultReceivedGrace))
	for name, x := range on {
		g := gc(x)
		require.Zero(t, g.ReceivedKept, name)
		require.NotZero(t, g.ChunksRemoved, "%s: the failed import's chunks collected after the grace", name)
		for _, id := range held[name] {
			require.False(t, x.s.HasChunk(id), "%s: chunk %s of the failed import still stored", name, id.Short())
		}
	}
}

// TestLeaseStartClamped: a lease whose tag names a start long past (a
// member's clock far behind, or a lying member) holds received chunks
// from no earlier than the grace before this member first saw it.
func TestLeaseStartClamped(t *testing.T) {
	a, b, _ := threeNoPlacement(t)
	require.NoError(t, a.setTag(tagLease, "1"))
	eventually(t, "B sees A's lease", func() bool { return leaseRunning(b, "a") })
	since, known := b.receivedHold()
	require.True(t, known)
	floor := b.s.Now().Add(-chunkstore.DefaultReceivedGrace - leaseSkew - time.Minute).UnixNano()
	require.Greater(t, since, floor, "a lease announced as started in 1970 holds from %s", time.Unix(0, since))
}

// TestGCMergesMembersFirst: a GC on a cluster member first merges every
// alive member's announced namespace. B imports a file, A has merged it;
// A then renames it while B removes it. B's GC cannot reach A's data
// plane to merge the rename, so it refuses, naming A, and B keeps the
// chunks A's renamed file uses.
func TestGCMergesMembersFirst(t *testing.T) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	eventually(t, "two alive members", func() bool { return len(a.livePeers()) == 1 })
	ctx := context.Background()
	src := t.TempDir()
	data := randBytes(3 << 20)
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), data, 0o644))
	_, err = b.s.Import(ctx, src, "m", chunkstore.ImportOptions{})
	require.NoError(t, err)
	eventually(t, "A merged B's file", func() bool { _, _, err := a.s.OpenPath("m/f"); return err == nil })
	f, _, err := b.s.OpenPath("m/f")
	require.NoError(t, err)
	chunk := f.M.Chunks[0].ID

	a.srv.close() // A stays a member; its namespace cannot be fetched
	require.NoError(t, a.s.Update(func(tx *chunkstore.NSTx) error { return tx.Rename("m/f", "m/g") }))
	aRoot, _, err := a.s.Root()
	require.NoError(t, err)
	require.NoError(t, b.s.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("m/f", false) }))
	eventually(t, "B sees A's new namespace root", func() bool {
		for _, m := range b.serf.Members() {
			if m.Name == "a" {
				return m.Tags[tagNS] == aRoot.String()
			}
		}
		return false
	})
	_, err = b.s.GC(ctx)
	require.ErrorContains(t, err, "member a is not merged")
	require.True(t, b.s.HasChunk(chunk), "B's gc removed a chunk A's renamed file uses")
}
