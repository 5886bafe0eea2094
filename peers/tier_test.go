package peers

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// tierCluster starts 8 members with placement and a reader (which stores
// nothing), and imports a file of size random bytes on the first; it
// returns when every chunk is on its two owners.
func tierCluster(t *testing.T, size int) (ms []*testNode, reader *testNode, data []byte, m *chunkstore.FileManifest) {
	start := func(cfg Config) *testNode {
		n, err := startNodeCfg(t, cfg)
		require.NoError(t, err)
		return n
	}
	ms, reader = tierMembers(t, start)
	// Seeded: the content-defined chunks, and so each stripe's overhead
	// (its parity is as long as its longest chunk), are the same every
	// run; crypto-random bytes made a full stripe cost 1.52x in one CI run
	// (TestMakeColdThenWarm asserts below 1.5x).
	data = make([]byte, size)
	mrand.NewChaCha8([32]byte{19}).Read(data)
	m = importPlaced(t, ms, reader, "cold/model.bin", data)
	return ms, reader, data, m
}

// tierMembers starts 8 members with placement (R = 2) and a reader by
// start, each joining those before it.
func tierMembers(tb testing.TB, start func(Config) *testNode) (ms []*testNode, reader *testNode) {
	key, _ := NewKey()
	var join []string
	for i := range 8 {
		n := start(Config{Name: fmt.Sprintf("m%d", i), Key: key, Replicas: 2, Join: join})
		ms = append(ms, n)
		join = append(join, n.cfg.Listen)
	}
	reader = start(Config{Name: "reader", Key: key, NoPlacement: true, NoRelay: true, Reader: true, Join: join})
	tb.Cleanup(func() { closeAll(tb, append([]*testNode{reader}, ms...)...) })
	for _, n := range append([]*testNode{reader}, ms...) {
		waitFor(tb, "9 members alive on "+n.self, func() bool { return len(n.livePeers()) == 8 })
	}
	return ms, reader
}

// importPlaced imports data at p on the first member and returns its
// manifest once every chunk is on its two owners and the reader sees p.
func importPlaced(tb testing.TB, ms []*testNode, reader *testNode, p string, data []byte) *chunkstore.FileManifest {
	src := filepath.Join(tb.TempDir(), "src")
	require.NoError(tb, os.WriteFile(src, data, 0o644))
	_, err := ms[0].s.Import(context.Background(), src, p, chunkstore.ImportOptions{})
	require.NoError(tb, err)
	f, _, err := ms[0].s.OpenPath(p)
	require.NoError(tb, err)
	waitFor(tb, "every chunk on its two owners", func() bool {
		for _, c := range f.M.Chunks {
			if copiesOf(ms, c.ID) < 2 {
				return false
			}
		}
		return true
	})
	waitFor(tb, p+" on the reader", func() bool {
		_, err := reader.s.Lookup(p)
		return err == nil
	})
	return f.M
}

// atHomesAlone reports whether every stored shard of recs is held by its
// stripe holder and no other member of ms.
func atHomesAlone(t *testing.T, ms []*testNode, recs []*chunkstore.Stripe) bool {
	for _, r := range recs {
		hs := stripeHoldersOf(t, ms[0], r)
		for i := range r.Shards() {
			id, _, ok := r.ShardID(i)
			if ok && (copiesOf(ms, id) != 1 || !nodeNamed(ms, hs[i].name).s.HasChunk(id)) {
				return false
			}
		}
	}
	return true
}

// copiesOf counts the members storing chunk id.
func copiesOf(ms []*testNode, id chunkstore.ID) int {
	k := 0
	for _, n := range ms {
		if n.s.HasChunk(id) {
			k++
		}
	}
	return k
}

// TestMakeColdThenWarm: a file made cold is named coded on every member
// (its stripes spread with the namespace), each shard ends up on its home
// alone, so the raw bytes fall from 2x to (k+m)/k for full stripes; it reads byte-equal
// through a member storing nothing, with two holders of a stripe crashed;
// and made warm again, every chunk is on its two owners and the reader
// knows no stripe.
func TestMakeColdThenWarm(t *testing.T) {
	ms, reader, data, m := tierCluster(t, 24<<20+777)
	ctx := context.Background()
	var calls int
	var last [2]int64
	res, err := ms[3].MakeCold(ctx, "cold", func(done, total int64) { calls++; last = [2]int64{done, total} })
	require.NoError(t, err)
	require.Equal(t, 1, res.Files)
	require.Equal(t, "6+2", res.Shape)
	require.GreaterOrEqual(t, res.Stripes, 2)
	require.Positive(t, calls)
	require.Equal(t, last[0], last[1], "progress ends at the total")
	require.Equal(t, int64(len(data)), res.Logical)
	e, err := ms[3].s.Lookup("cold/model.bin")
	require.NoError(t, err)
	cm, err := ms[3].s.FileManifest(e.ID)
	require.NoError(t, err)
	require.Len(t, cm.Stripes, res.Stripes)

	for _, n := range append([]*testNode{reader}, ms...) {
		waitFor(t, "the stripes known on "+n.self, func() bool { return n.StripesKnown() == res.Stripes })
	}
	raw := func() (sum int64) {
		for _, n := range ms {
			for _, c := range m.Chunks {
				if n.s.HasChunk(c.ID) {
					sum += int64(c.Len)
				}
			}
			for _, r := range cm.Stripes {
				for _, p := range r.Parity {
					if n.s.HasChunk(p) {
						sum += int64(r.ShardSize)
					}
				}
			}
		}
		return sum
	}
	want := res.Logical + res.Parity
	waitFor(t, "each shard on its home alone", func() bool { return atHomesAlone(t, ms, cm.Stripes) && raw() == want })
	full := 0
	for _, r := range cm.Stripes {
		if len(r.Chunks) == r.K {
			full++
			require.Less(t, r.Overhead(), MaxStripeOverhead, "a full stripe costing 1.5x or more")
		}
	}
	require.GreaterOrEqual(t, full, len(cm.Stripes)-1, "one short stripe at most")
	require.Less(t, raw(), 2*int64(len(data)), "cold costs less than two replicas")

	rep, err := reader.Replication(ctx, "cold")
	require.NoError(t, err)
	require.Equal(t, int64(len(m.Chunks)), rep.ColdChunks)
	require.Equal(t, res.Stripes, rep.Stripes)
	require.Equal(t, res.Parity, rep.ParityBytes)
	require.Zero(t, rep.UnderChunks, "one copy is what a coded chunk wants")
	require.Zero(t, rep.DegradedStripes)
	require.Equal(t, 1, rep.MinCopies)
	require.Len(t, rep.Tiers, 3)
	cold := rep.Tiers[2]
	require.Equal(t, "cold", cold.Tier)
	require.Equal(t, int64(len(data)), cold.Logical)
	require.Equal(t, res.Logical+res.Parity, cold.RawCluster, "one copy of each shard, parity included")
	require.Zero(t, cold.RawHere, "the reader stores nothing")
	require.Zero(t, rep.Tiers[1].Chunks, "nothing warm")

	got, err := readAll(reader, "cold/model.bin")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "a healthy read of the cold file differs")

	// Warm again: two owners for every chunk, the stripes forgotten.
	wres, err := ms[5].MakeWarm(ctx, "cold", nil)
	require.NoError(t, err)
	require.Equal(t, 1, wres.Files)
	require.Positive(t, wres.Pushed)
	for _, n := range append([]*testNode{reader}, ms...) {
		waitFor(t, "no stripe known on "+n.self, func() bool { return n.StripesKnown() == 0 })
	}
	// A member that merged the warm namespace late may have dropped a
	// copy pushed to it (by its cold view, not its to keep); placement on
	// its owner pulls it again.
	waitFor(t, "every chunk of the warm file on its two owners", func() bool {
		for _, c := range m.Chunks {
			if copiesOf(ms, c.ID) < 2 {
				return false
			}
		}
		return true
	})
	e, err = ms[0].s.Lookup("cold/model.bin")
	require.NoError(t, err)
	wm, err := ms[0].s.FileManifest(e.ID)
	require.NoError(t, err)
	require.Empty(t, wm.Stripes)
	names, err := ms[0].s.List("cold")
	require.NoError(t, err)
	require.Len(t, names, 1, "a conversion is no conflict: the content is the same")

	// Cold again, then two holders of the first stripe crash.
	res, err = ms[1].MakeCold(ctx, "cold", nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Files)
	e, err = ms[1].s.Lookup("cold/model.bin")
	require.NoError(t, err)
	require.Equal(t, cm.Encode(), func() []byte {
		m2, err := ms[1].s.FileManifest(e.ID)
		require.NoError(t, err)
		return m2.Encode()
	}(), "the same chunks code into the same stripes on any member")
	for _, n := range append([]*testNode{reader}, ms...) {
		waitFor(t, "the stripes known again on "+n.self, func() bool { return n.StripesKnown() == len(cm.Stripes) })
	}
	// A full stripe: every one of its k+m holders holds a shard.
	r := cm.Stripes[slices.IndexFunc(cm.Stripes, func(r *chunkstore.Stripe) bool { return len(r.Chunks) == r.K })]
	hs := stripeHoldersOf(t, ms[0], r)
	// Every stripe settled, not only r's: the two crashed hold a shard of
	// each full stripe, and a shard still on its way to its home (a member
	// on the warm view dropped its copy, the home pulls it) would be a
	// third missing.
	waitFor(t, "every shard on its home alone again", func() bool { return atHomesAlone(t, ms, cm.Stripes) })
	gone := [2]peer{hs[0], hs[1]}
	for _, h := range gone {
		require.NoError(t, nodeNamed(ms, h.name).close(false))
	}
	reader.forgetRecent()
	got, err = readAll(reader, "cold/model.bin")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "the read with two holders gone differs")
	require.Positive(t, reader.StripeReads())
	rep, err = reader.Replication(ctx, "cold")
	require.NoError(t, err)
	require.Positive(t, rep.DegradedStripes)
	require.Zero(t, rep.UnreadableStripes)

	// A third: a chunk of stripe 0 whose home is gone, rebuilt (never
	// kept in the peer cache), can come only from its stripe.
	var third peer
	for _, h := range hs {
		if h.name != gone[0].name && h.name != gone[1].name {
			third = h
			break
		}
	}
	require.NoError(t, nodeNamed(ms, third.name).close(false))
	reader.forgetRecent()
	lost := slices.IndexFunc(hs[:len(r.Chunks)], func(p peer) bool { return p.name == gone[0].name || p.name == gone[1].name || p.name == third.name })
	require.GreaterOrEqual(t, lost, 0)
	b, err := reader.Fetch(ctx, r.Chunks[lost].ID, r.Chunks[lost].Len)
	require.ErrorIs(t, err, chunkstore.ErrNotLocal, "three shards of a 6+2 stripe gone: an error, never wrong bytes")
	require.Nil(t, b)
}

// TestMakeColdIdle: serve --cold-after's pass makes cold a file nobody
// read, and leaves warm a file read today on another member (a reader:
// GPU nodes read through their own mounts), which the member running the
// pass asks.
func TestMakeColdIdle(t *testing.T) {
	ms, reader, _, _ := tierCluster(t, 12<<20)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "read")
	require.NoError(t, os.WriteFile(src, randBytes(12<<20), 0o644))
	_, err := ms[0].s.Import(ctx, src, "cold/read.bin", chunkstore.ImportOptions{})
	require.NoError(t, err)
	var read chunkstore.Entry
	waitFor(t, "read.bin on the reader", func() bool {
		read, err = reader.s.Lookup("cold/read.bin")
		return err == nil
	})
	waitFor(t, "read.bin on the member running the pass", func() bool {
		_, err := ms[2].s.Lookup("cold/read.bin")
		return err == nil
	})
	reader.s.NoteRead(read.ID) // as its mount's open does

	res, err := ms[2].MakeColdIdle(ctx, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, res.Files)
	unread, err := ms[2].s.Lookup("cold/model.bin")
	require.NoError(t, err)
	um, err := ms[2].s.FileManifest(unread.ID)
	require.NoError(t, err)
	require.NotEmpty(t, um.Stripes, "the file nobody read is cold")
	e, err := ms[2].s.Lookup("cold/read.bin")
	require.NoError(t, err)
	require.Equal(t, read.ID, e.ID, "the file read on the reader today stays warm")

	res, err = ms[2].MakeColdIdle(ctx, time.Hour)
	require.NoError(t, err)
	require.Zero(t, res.Files, "nothing idle for an hour")

	// Shapes a user may ask for: 1.5x or more refused, wider than the
	// members refused, 5+2 and 6+2 fit eight.
	_, err = ms[2].StripeShapeK(4)
	require.ErrorContains(t, err, "1.50x")
	_, err = ms[2].StripeShapeK(7)
	require.ErrorIs(t, err, ErrClusterTooSmall)
	sh, err := ms[2].StripeShapeK(5)
	require.NoError(t, err)
	require.Equal(t, StripeShape{5, 2}, sh)
	res, err = ms[2].MakeColdK(ctx, "cold/read.bin", 5, nil)
	require.NoError(t, err)
	require.Equal(t, "5+2", res.Shape)
	require.Equal(t, 1, res.Files)
}

// TestColdMemberLeaves: a member of every stripe leaves a cold cluster
// of 8 for good.
//
// Stripes of 6+2 (the default, as wide as the cluster) no longer fit 7
// members, so their shards are kept as replicas meanwhile: placement
// pulls each data chunk and parity shard to its two owners, rebuilding
// the leaver's from their stripes (parity coded again), and the file
// reads byte-equal. A member joining makes room again: each shard goes
// back to its home alone.
//
// Stripes of 5+2 (kylix tier cold --data-shards 5) still fit: the shards
// are repaired onto their new homes and stay coded, each held once.
func TestColdMemberLeaves(t *testing.T) {
	t.Run("6+2 falls back to replicas", func(t *testing.T) { coldMemberLeaves(t, 0) })
	t.Run("5+2 repaired in its stripes", func(t *testing.T) { coldMemberLeaves(t, 5) })
}

func coldMemberLeaves(t *testing.T, k int) {
	ms, reader, data, _ := tierCluster(t, 12<<20)
	ctx := context.Background()
	_, err := ms[0].MakeColdK(ctx, "cold", k, nil)
	require.NoError(t, err)
	e, err := ms[0].s.Lookup("cold/model.bin")
	require.NoError(t, err)
	cm, err := ms[0].s.FileManifest(e.ID)
	require.NoError(t, err)
	var shards []chunkstore.ChunkRef
	for _, r := range cm.Stripes {
		for i := range r.Shards() {
			if id, size, ok := r.ShardID(i); ok {
				shards = append(shards, chunkstore.ChunkRef{ID: id, Len: size})
			}
		}
	}
	once := func(ns []*testNode) func() bool {
		return func() bool {
			for _, c := range shards {
				if copiesOf(ns, c.ID) != 1 {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "each shard on its home alone", once(ms))

	// The leaver holds a shard of every 6+2 stripe; of 5+2 ones, of most.
	leaver := ms[7]
	var lost int
	for _, c := range shards {
		if leaver.s.HasChunk(c.ID) {
			lost++
		}
	}
	require.Positive(t, lost)
	require.NoError(t, leaver.close(true))
	rest := ms[:7]
	for _, n := range append([]*testNode{reader}, rest...) {
		waitFor(t, "the leaver gone on "+n.self, func() bool { return len(n.livePeers()) == 7 })
	}
	if k == 0 {
		waitFor(t, "every shard on two of the seven left", func() bool {
			for _, c := range shards {
				if copiesOf(rest, c.ID) < 2 {
					return false
				}
			}
			return true
		})
	} else {
		waitFor(t, "every shard on its new home alone", once(rest))
		rep, err := reader.Replication(ctx, "cold")
		require.NoError(t, err)
		require.Zero(t, rep.DegradedStripes)
		require.Zero(t, rep.UnderChunks)
	}
	var pulled int64
	for _, n := range rest {
		pulled += n.Placement().PulledChunks
	}
	require.GreaterOrEqual(t, pulled, int64(lost), "the leaver's shards were rebuilt and pulled")
	reader.forgetRecent()
	got, err := readAll(reader, "cold/model.bin")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	if k != 0 {
		return
	}

	// A new member: stripes fit again, each shard back on its home alone.
	key := ms[0].cfg.Key
	n, err := startNodeCfg(t, Config{Name: "m8", Key: key, Replicas: 2, Join: []string{ms[0].cfg.Listen}})
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	waitFor(t, "each shard on its home alone again", once(append(append([]*testNode{}, rest...), n)))
}

// TestShardPolicy: serve --cold-shards PATH=K specs, parsed and applied
// by the longest path at or above a file.
func TestShardPolicy(t *testing.T) {
	sp, err := ParseShardPolicy([]string{"models=8", "/models/small/=5", "data/sets = 10", "/=6"})
	require.NoError(t, err)
	for p, want := range map[string]int{
		"models/a.bin":          8,
		"/models/small/x/y.bin": 5,
		"models/smaller.bin":    8, // a sibling with the same prefix is not under models/small
		"data/sets/s.tar":       10,
		"data/other":            6,
		"top.bin":               6,
	} {
		k, err := mergeShardRules(nil, sp).forFile(p)
		require.NoError(t, err)
		require.Equal(t, want, k, p)
	}
	none, err := ParseShardPolicy(nil)
	require.NoError(t, err)
	k, err := mergeShardRules(nil, none).forFile("any/file")
	require.NoError(t, err)
	require.Equal(t, 0, k, "no policy: the default")
	for _, bad := range [][]string{{"models"}, {"models=x"}, {"models=4"}, {"models=11"}, {"a=5", "/a/=6"}} {
		_, err := ParseShardPolicy(bad)
		require.Error(t, err, "%q", bad)
	}
}
