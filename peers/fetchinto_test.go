package peers

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
)

// TestFetchInto: a member fetches chunks straight into memory it provides
// (chunkstore.IntoFetcher): the right bytes, from a good member even when
// a lying one ranks first for some (each counted as bad), and an error,
// never wrong bytes reported as good, for chunks only the liar holds.
func TestFetchInto(t *testing.T) {
	key, _ := NewKey()
	good := mustStart(t, "good", key, false)
	bad := mustStart(t, "bad", key, true, good.cfg.Listen)
	rd := mustStart(t, "reader", key, false, good.cfg.Listen)
	eventually(t, "three alive members", func() bool { return len(rd.livePeers()) == 2 })
	var _ chunkstore.IntoFetcher = rd.Node

	data := randBytes(24 << 20)
	importBytes(t, good, "f", data)
	importBytes(t, bad, "f", data)
	eventually(t, "f on reader", func() bool { _, err := rd.s.Lookup("f"); return err == nil })
	f, _, err := rd.s.OpenPath("f")
	require.NoError(t, err)
	badFirst, off := 0, 0
	for _, c := range f.M.Chunks {
		if rank(c.ID, rd.livePeers())[0].name == "bad" {
			badFirst++
		}
		dst := bytes.Repeat([]byte{0xa5}, int(c.Len))
		require.NoError(t, rd.FetchInto(context.Background(), c.ID, dst))
		require.True(t, bytes.Equal(data[off:off+int(c.Len)], dst), "chunk at %d: wrong bytes in the caller's memory", off)
		off += int(c.Len)
	}
	require.Positive(t, badFirst, "no chunk ranks the bad member first; use more chunks")
	require.Positive(t, rd.statsFor("bad").BadChunks.Load())

	only := randBytes(1 << 20)
	importBytes(t, bad, "g", only)
	eventually(t, "g on reader", func() bool { _, err := rd.s.Lookup("g"); return err == nil })
	g, _, err := rd.s.OpenPath("g")
	require.NoError(t, err)
	for _, c := range g.M.Chunks {
		err := rd.FetchInto(context.Background(), c.ID, make([]byte, c.Len))
		require.ErrorIs(t, err, chunkstore.ErrNotLocal, "a chunk only the liar holds")
	}
}

// TestFetchIntoCancelledMidAnswer: a fetch into the caller's memory that
// is cancelled while its answer is arriving (a slow sender) returns only
// after the connection's reader stopped writing there: the connection is
// closed, and the caller may reuse the memory at once (run with -race: a
// write by the reader after the return is a data race with the caller's
// clear). A new connection then reads the chunk into the same memory.
func TestFetchIntoCancelledMidAnswer(t *testing.T) {
	key, _ := NewKey()
	slow, err := startNodeCfg(t, Config{Name: "slow", Key: key, ServeRate: 512 << 10})
	require.NoError(t, err)
	data := randBytes(4 << 20)
	importBytes(t, slow, "f", data)
	f, _, err := slow.s.OpenPath("f")
	require.NoError(t, err)
	c := f.M.Chunks[0]
	cc, err := dialPeer(context.Background(), slow.DataAddr(), slow.sec)
	require.NoError(t, err)
	defer cc.close(net.ErrClosed)

	into := make([]byte, c.Len)
	// At 512 KiB a second the header arrives at once and the chunk (about
	// 1 MiB) in about two seconds: half a second in, the reader is writing.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, _, err = cc.roundTrip(ctx, request{op: opChunk, id: c.ID, len: c.Len, into: into}, c.Len)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	clear(into) // the caller takes its memory back
	require.True(t, cc.dead(), "the connection whose answer was being read into the caller's memory is still up")

	// A new connection serves the chunk into the same memory.
	cc2, err := dialPeer(context.Background(), slow.DataAddr(), slow.sec)
	require.NoError(t, err)
	defer cc2.close(net.ErrClosed)
	st, got, err := cc2.roundTrip(context.Background(), request{op: opChunk, id: c.ID, len: c.Len, into: into}, c.Len)
	require.NoError(t, err)
	require.Equal(t, stOK, st)
	require.True(t, bytes.Equal(data[:c.Len], into))
	require.Same(t, &into[0], &got[0], "the answer was not read into the caller's memory")
}

// TestFetchIntoOnceForAll: loads on one member that want the same chunk at
// once (the ranks of a tensor-parallel job) fetch it from its holder once;
// the others copy it from the first one's memory, every copy right. The
// holder sends at 512 KiB a second, so the first fetch lasts about two
// seconds while the others start.
func TestFetchIntoOnceForAll(t *testing.T) {
	key, _ := NewKey()
	slow, err := startNodeCfg(t, Config{Name: "slow", Key: key, ServeRate: 512 << 10})
	require.NoError(t, err)
	// NoPlacement: the reader pulls nothing for placement, so the
	// holder's sends are the loads' only.
	rd, err := startNodeCfg(t, Config{Name: "reader", Key: key, Join: []string{slow.cfg.Listen}, NoPlacement: true})
	require.NoError(t, err)
	// A reader owns no chunks: a member keeps those it owns in its packs
	// (placement), not in the peer cache.
	eventually(t, "two alive members", func() bool { return len(rd.livePeers()) == 1 })
	data := randBytes(1 << 20)
	importBytes(t, slow, "f", data)
	f, _, err := slow.s.OpenPath("f")
	require.NoError(t, err)
	c := f.M.Chunks[0]
	served0 := slow.statsFor("slow").Served.Load()

	const loads = 4
	dsts := make([][]byte, loads)
	errs := make([]error, loads)
	var wg sync.WaitGroup
	for i := range loads {
		dsts[i] = make([]byte, c.Len)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rd.FetchInto(context.Background(), c.ID, dsts[i])
		}()
	}
	wg.Wait()
	for i := range loads {
		require.NoError(t, errs[i])
		require.True(t, bytes.Equal(data[:c.Len], dsts[i]), "load %d: wrong bytes", i)
	}
	require.Equal(t, int64(1), slow.statsFor("slow").Served.Load()-served0, "the holder sent the chunk more than once")
	require.Equal(t, int64(loads-1), rd.intoShared.Load())
}

// TestFetchIntoKeptBehind: what a load fetches into its own memory is
// kept in the member's peer cache, written behind it, so the next load
// reads it here (counted as local, right bytes) even with every holder
// gone; a damaged copy is never used; a load that says NoKeep keeps
// nothing; a writer behind by its whole queue skips a chunk instead of
// holding up the load.
func TestFetchIntoKeptBehind(t *testing.T) {
	key, _ := NewKey()
	good := mustStart(t, "good", key, false)
	rd, err := startNodeCfg(t, Config{Name: "reader", Key: key, Join: []string{good.cfg.Listen}, Reader: true, CacheDir: filepath.Join(t.TempDir(), "peer-cache")})
	require.NoError(t, err)
	// A reader owns no chunks: a member keeps those it owns in its packs
	// (placement), not in the peer cache.
	eventually(t, "two alive members", func() bool { return len(rd.livePeers()) == 1 })

	data, other := randBytes(12<<20), randBytes(4<<20)
	importBytes(t, good, "f", data)
	importBytes(t, good, "g", other)
	eventually(t, "f and g on reader", func() bool {
		_, e1 := rd.s.Lookup("f")
		_, e2 := rd.s.Lookup("g")
		return e1 == nil && e2 == nil
	})
	chunksOf := func(p string) []chunkstore.ChunkRef {
		f, _, err := rd.s.OpenPath(p)
		require.NoError(t, err)
		return f.M.Chunks
	}
	// load fetches every chunk of p into fresh memory under note and
	// checks the bytes.
	load := func(p string, want []byte, note *chunkstore.FetchNote) {
		t.Helper()
		ctx := chunkstore.WithFetchNote(context.Background(), note)
		off := 0
		for _, c := range chunksOf(p) {
			dst := bytes.Repeat([]byte{0x5a}, int(c.Len))
			require.NoError(t, rd.FetchInto(ctx, c.ID, dst))
			require.True(t, bytes.Equal(want[off:off+int(c.Len)], dst), "%s at %d: wrong bytes", p, off)
			off += int(c.Len)
		}
	}
	fc := chunksOf("f")
	first := &chunkstore.FetchNote{}
	load("f", data, first)
	require.EqualValues(t, len(fc), first.Kept.Load(), "every fetched chunk queued to be kept")
	require.EqualValues(t, len(data), first.KeptBytes.Load())
	require.Zero(t, first.Local.Load())
	eventually(t, "f's chunks written into the peer cache", func() bool { return rd.cache.statsOf().Chunks == len(fc) })
	require.NotEmpty(t, rd.cache.statsOf().Writes, "the cache says how it writes")

	// A damaged copy is dropped and fetched again, never returned.
	require.NoError(t, os.WriteFile(filepath.Join(rd.cache.dir, fc[0].ID.String()), make([]byte, fc[0].Len), 0o600))
	again := &chunkstore.FetchNote{}
	load("f", data, again)
	require.EqualValues(t, len(fc)-1, again.Local.Load(), "all but the damaged chunk read here")
	require.EqualValues(t, 1, again.Kept.Load(), "the damaged chunk fetched and kept again")

	// NoKeep: g's chunks are fetched, none kept.
	nk := &chunkstore.FetchNote{NoKeep: true}
	load("g", other, nk)
	require.Zero(t, nk.Kept.Load()+nk.NotKept.Load())
	eventually(t, "the writers idle", func() bool {
		rd.cache.mu.Lock()
		defer rd.cache.mu.Unlock()
		return rd.cache.queued == 0 && rd.cache.behindBytes.Load() == 0
	})
	require.Equal(t, len(fc), rd.cache.statsOf().Chunks, "the damaged chunk rewritten, nothing of g")
	for _, c := range chunksOf("g") {
		_, held := rd.cache.peek(c.ID, c.Len)
		require.False(t, held, "a chunk of a --no-keep load was kept")
	}

	// Every holder gone: the next load of f is a local read.
	require.NoError(t, good.Close())
	local := &chunkstore.FetchNote{}
	load("f", data, local)
	require.EqualValues(t, len(fc), local.Local.Load())
	require.EqualValues(t, len(data), local.LocalBytes.Load())

	// A writer behind by its whole queue: the chunk is not kept, and the
	// call does not wait.
	c, err := openPeerCache(t.TempDir(), 1<<30, units.SizeOrPercent{}, nil)
	require.NoError(t, err)
	c.behindMax = 1 << 20
	c.behindBytes.Store(1 << 20) // as if 1 MiB were queued
	d := randBytes(1000)
	require.False(t, c.putBehind(chunkstore.Sum(d), d))
	require.EqualValues(t, 1, c.statsOf().NotKept)
	c.behindBytes.Store(0)
	require.True(t, c.putBehind(chunkstore.Sum(d), d))
	c.close() // writes what is queued
	got, ok := c.get(chunkstore.Sum(d), 1000)
	require.True(t, ok)
	require.Equal(t, d, got)
	e := randBytes(10)
	require.False(t, c.putBehind(chunkstore.Sum(e), e), "a closed cache queued a chunk")
}
