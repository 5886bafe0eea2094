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
// (Unix nanoseconds), so a test can move it past chunkstore.ReceivedGrace.
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
// chunkstore.ReceivedGrace, and are collected by the first GC after it.
func TestPushedChunksSurviveGC(t *testing.T) {
	key, _ := NewKey()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	b := startNodeClock(t, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}}, &now)
	c := startNodeClock(t, Config{Name: "c", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}}, &now)
	eventually(t, "three alive members", func() bool { return len(a.livePeers()) == 2 })
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
	now.Add(int64(chunkstore.ReceivedGrace + time.Minute))
	for _, x := range on {
		g, err := x.s.GC(ctx)
		require.NoError(t, err)
		require.Zero(t, g.ReceivedKept)
	}
	check(false)
}
