package peers

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
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
