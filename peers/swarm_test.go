package peers

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
)

// TestPeerCacheLRU: the peer cache keeps chunks under its budget, evicts
// the least recently used, drops a damaged file, and keeps its chunks
// across a reopen.
func TestPeerCacheLRU(t *testing.T) {
	dir := t.TempDir()
	c, err := openPeerCache(dir, 3000, units.SizeOrPercent{}, nil)
	require.NoError(t, err)
	var ids []chunkstore.ID
	var datas [][]byte
	for range 4 {
		d := randBytes(1000)
		ids, datas = append(ids, chunkstore.Sum(d)), append(datas, d)
	}
	c.put(ids[0], datas[0])
	c.put(ids[1], datas[1])
	c.put(ids[2], datas[2])
	_, ok := c.get(ids[0], 1000) // now the most recently used
	require.True(t, ok)
	c.put(ids[3], datas[3]) // evicts ids[1]
	_, ok = c.get(ids[1], 1000)
	require.False(t, ok, "the least recently used chunk was kept")
	b, ok := c.get(ids[0], 1000)
	require.True(t, ok)
	require.Equal(t, datas[0], b)
	st := c.statsOf()
	require.Equal(t, CacheStats{Dir: dir, BudgetBytes: 3000, Bytes: 3000, Chunks: 3, Hits: 2, Misses: 1, Evictions: 1, Stored: 4, Writes: "O_DIRECT"}, st)
	_, err = os.Stat(filepath.Join(dir, ids[1].String()))
	require.True(t, os.IsNotExist(err), "an evicted chunk's file is left")

	// A damaged file is never returned, and is dropped.
	require.NoError(t, os.WriteFile(filepath.Join(dir, ids[2].String()), make([]byte, 1000), 0o600))
	_, ok = c.get(ids[2], 1000)
	require.False(t, ok)
	require.Equal(t, 2, c.statsOf().Chunks)

	c2, err := openPeerCache(dir, 3000, units.SizeOrPercent{}, nil)
	require.NoError(t, err)
	b, ok = c2.get(ids[3], 1000)
	require.True(t, ok)
	require.Equal(t, datas[3], b)
	require.Equal(t, 2, c2.statsOf().Chunks)
}

// TestSwarmRelay: five members; a file imported on one and placed; the
// four others read it at once. Every byte is right, the bytes leaving the
// members' packs (the holders) are at most 1.5 times the file, and a
// second read on a member goes to its peer cache, not the network.
func TestSwarmRelay(t *testing.T) {
	key, _ := NewKey()
	start := func(name string, join ...string) *testNode {
		n, err := startNodeCfg(t, Config{Name: name, Key: key, Join: join, CacheDir: filepath.Join(t.TempDir(), "peer-cache")})
		require.NoError(t, err)
		return n
	}
	a := start("a")
	ns := []*testNode{a}
	for _, name := range []string{"b", "c", "d", "e"} {
		ns = append(ns, start(name, a.cfg.Listen))
	}
	eventually(t, "five alive members", func() bool {
		for _, n := range ns {
			if len(n.members()) != 5 {
				return false
			}
		}
		return true
	})
	data := randBytes(24 << 20)
	importBytes(t, a, "m", data)
	eventually(t, "placed over 5", func() bool {
		for _, n := range ns[1:] {
			if pl := n.Placement(); pl.Members != 5 || pl.OwnedMissing != 0 || pl.OwnedChunks == 0 {
				return false
			}
		}
		return true
	})
	packBytes := func() int64 {
		var s int64
		for _, n := range ns {
			s += n.statsFor(n.self).ServedPackBytes.Load()
		}
		return s
	}
	// Placement pulled through the relays, which kept the chunks: empty
	// every peer cache, so that the read below is a cold swarm start.
	for _, n := range ns {
		for _, id := range n.cache.ids() {
			n.cache.drop(id)
		}
	}
	before := packBytes()
	var wg sync.WaitGroup
	errs := make([]error, len(ns))
	for i, n := range ns[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := readAll(n, "m")
			if err == nil && !bytes.Equal(got, data) {
				err = os.ErrInvalid
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs[:4] {
		require.NoError(t, err, "read on %s", ns[i+1].self)
	}
	ratio := float64(packBytes()-before) / float64(len(data))
	t.Logf("bytes served from packs during the swarm read / file size: %.2f", ratio)
	require.LessOrEqual(t, ratio, 1.5)

	// A second fetch of every chunk on a member that owns none of them
	// comes from its peer cache.
	f, _, err := a.s.OpenPath("m")
	require.NoError(t, err)
	b := ns[1]
	fetched := func() (s int64) {
		for _, n := range ns {
			s += b.statsFor(n.self).Fetched.Load()
		}
		return s
	}
	was, hits := fetched(), b.Swarm().Cache.Hits
	tried := 0
	for _, c := range f.M.Chunks {
		if owns(c.ID, b.members(), b.self, b.cfg.Replicas) {
			continue
		}
		tried++
		got, err := b.Fetch(t.Context(), c.ID, c.Len)
		require.NoError(t, err)
		require.Equal(t, c.ID, chunkstore.Sum(got))
	}
	require.Positive(t, tried)
	require.Equal(t, was, fetched(), "a second read went to the network")
	require.Equal(t, hits+int64(tried), b.Swarm().Cache.Hits)
}

// TestBadRelaySkipped: a relay that sends wrong bytes is counted as a bad
// member and skipped: the reader gets every chunk right from the holder.
func TestBadRelaySkipped(t *testing.T) {
	key, _ := NewKey()
	cache := func() string { return filepath.Join(t.TempDir(), "peer-cache") }
	a := mustStart(t, "a", key, false)
	bad, err := startNodeCfg(t, Config{Name: "bad", Key: key, Join: []string{a.cfg.Listen}, CorruptServed: true, NoPlacement: true, CacheDir: cache()})
	require.NoError(t, err)
	rd, err := startNodeCfg(t, Config{Name: "reader", Key: key, Join: []string{a.cfg.Listen}, NoPlacement: true, CacheDir: cache()})
	require.NoError(t, err)
	eventually(t, "three alive members", func() bool { return len(rd.members()) == 3 && len(bad.members()) == 3 })
	data := randBytes(24 << 20)
	importBytes(t, a, "f", data)
	eventually(t, "f on reader", func() bool { _, err := rd.s.Lookup("f"); return err == nil })
	f, _, err := rd.s.OpenPath("f")
	require.NoError(t, err)
	viaBad := 0
	for _, c := range f.M.Chunks {
		if r, ok := rd.relayFor(c.ID, rd.members()); ok && r.name == "bad" {
			viaBad++
		}
	}
	require.Positive(t, viaBad, "the bad member relays no chunk; use more chunks")
	got, err := readAll(rd, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
	require.Positive(t, rd.statsFor("bad").BadChunks.Load())
	require.Positive(t, bad.Swarm().RelayServed)
}
