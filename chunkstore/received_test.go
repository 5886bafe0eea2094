package chunkstore

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGCKeepsReceivedChunks: a chunk stored by PutReceived (pushed by
// another member) that no head names survives GC within DefaultReceivedGrace, across a
// restart too, and is collected once the grace has passed. A chunk that was
// imported here and then removed from the namespace, or stored by PutChunk
// (placement's pulls), gets no grace. A
// received chunk that the namespace then names, then stops naming, is
// collected at once (it left the list when it was named).
func TestGCKeepsReceivedChunks(t *testing.T) {
	dir := t.TempDir()
	var now atomic.Int64
	now.Store(time.Unix(3_000_000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	open := func() *Store {
		s, err := Open(Options{Dir: dir, IO: "pread", Now: clock})
		require.NoError(t, err)
		return s
	}
	s := open()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 1))
	pushed := randBytes(r, 100<<10)
	id := Sum(pushed)
	pulled := randBytes(r, 60<<10) // stored by PutChunk: no grace
	im := s.NewImporter()
	require.NoError(t, im.PutReceived(id, pushed))
	require.NoError(t, im.PutChunk(Sum(pulled), pulled))
	require.NoError(t, im.Close())
	// A local file, removed: not received, so no grace.
	src := t.TempDir()
	writeTree(t, src, map[string]int{"f": 200 << 10}, 8)
	_, err := s.Import(ctx, src, "m", ImportOptions{})
	require.NoError(t, err)
	f, _, err := s.OpenPath("m/f")
	require.NoError(t, err)
	local := f.M.Chunks[0].ID
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("m", true) }))

	res, err := s.GC(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.ReceivedKept)
	require.True(t, s.HasChunk(id), "a chunk received a moment ago was collected")
	require.False(t, s.HasChunk(local), "a removed local chunk was kept")
	require.False(t, s.HasChunk(Sum(pulled)), "a chunk stored by PutChunk, not received, was kept")

	// A restart keeps the record.
	now.Add(int64(30 * time.Minute))
	require.NoError(t, s.Close())
	s = open()
	defer func() { s.Close() }()
	res, err = s.GC(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.ReceivedKept)
	require.True(t, s.HasChunk(id), "a received chunk was collected after a restart within its grace")
	got, err := s.ReadChunk(ctx, id)
	require.NoError(t, err)
	require.Equal(t, pushed, got)

	// Past the grace it goes.
	now.Add(int64(DefaultReceivedGrace))
	res, err = s.GC(ctx)
	require.NoError(t, err)
	require.Zero(t, res.ReceivedKept)
	require.False(t, s.HasChunk(id), "a received chunk outlived its grace")

	// Received, then named, then unnamed: collected at the next GC.
	other := randBytes(r, 50<<10)
	oid := Sum(other)
	im = s.NewImporter()
	require.NoError(t, im.PutReceived(oid, other))
	require.NoError(t, im.Close())
	src2 := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src2, "g"), other, 0o644))
	_, err = s.Import(ctx, src2, "n", ImportOptions{})
	require.NoError(t, err)
	_, err = s.GC(ctx) // named: forgotten by the received list
	require.NoError(t, err)
	require.True(t, s.HasChunk(oid))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("n", true) }))
	res, err = s.GC(ctx)
	require.NoError(t, err)
	require.Zero(t, res.ReceivedKept)
	require.False(t, s.HasChunk(oid), "a chunk once named and then removed kept a grace")
}

// TestReceivedHold: a cluster member's hold (peers' GC leases) keeps
// received chunks past the grace: those received after its since, and,
// while the member cannot tell yet (known false, before it joined), every
// recorded one, across a restart too (records past the grace are read
// back: a lease may still need them). With the hold at none the grace
// alone decides. A shorter Options.ReceivedGrace is the grace.
func TestReceivedHold(t *testing.T) {
	dir := t.TempDir()
	var now atomic.Int64
	now.Store(time.Unix(3_000_000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	const grace = 10 * time.Minute
	open := func() *Store {
		s, err := Open(Options{Dir: dir, IO: "pread", Now: clock, ReceivedGrace: grace})
		require.NoError(t, err)
		return s
	}
	s := open()
	defer func() { s.Close() }()
	require.Equal(t, grace, s.ReceivedGrace())
	ctx := context.Background()
	r := rand.New(rand.NewPCG(8, 1))
	put := func() ID {
		b := randBytes(r, 40<<10)
		im := s.NewImporter()
		require.NoError(t, im.PutReceived(Sum(b), b))
		require.NoError(t, im.Close())
		return Sum(b)
	}
	early := put()
	leaseStart := now.Load()
	now.Add(int64(time.Minute))
	late := put()
	now.Add(int64(2 * grace))
	gc := func() GCResult {
		t.Helper()
		res, err := s.GC(ctx)
		require.NoError(t, err)
		return res
	}

	// Not known yet: everything recorded is kept.
	s.SetReceivedHold(func() (int64, bool) { return 0, false })
	require.Equal(t, 2, gc().ReceivedKept)
	// Across a restart, still unknown: the records past the grace are back.
	require.NoError(t, s.Close())
	s = open()
	s.SetReceivedHold(func() (int64, bool) { return 0, false })
	require.Equal(t, 2, gc().ReceivedKept)
	require.True(t, s.HasChunk(early) && s.HasChunk(late))
	// A lease that started after the first chunk arrived keeps the second.
	s.SetReceivedHold(func() (int64, bool) { return leaseStart + 1, true })
	res := gc()
	require.Equal(t, 1, res.ReceivedKept)
	require.False(t, s.HasChunk(early), "a chunk received before the lease outlived the grace")
	require.True(t, s.HasChunk(late), "a chunk received under a running lease was collected")
	// No lease: the grace alone.
	s.SetReceivedHold(func() (int64, bool) { return 0, true })
	res = gc()
	require.Zero(t, res.ReceivedKept)
	require.False(t, s.HasChunk(late))
}

// TestImportOnChunk: OnChunk sees every chunk of the import in file order,
// repeats and chunks already stored included, with the bytes stored.
func TestImportOnChunk(t *testing.T) {
	s := openTest(t, t.TempDir())
	src := t.TempDir()
	files := writeTree(t, src, map[string]int{"a": 5 << 20, "b": 300 << 10}, 9)
	ctx := context.Background()
	_, err := s.Import(ctx, src, "m", ImportOptions{})
	require.NoError(t, err)
	var ids []ID
	var n int64
	_, err = s.Import(ctx, src, "again", ImportOptions{OnChunk: func(id ID, data []byte) {
		require.Equal(t, id, Sum(data))
		ids = append(ids, id)
		n += int64(len(data))
	}})
	require.NoError(t, err)
	require.Equal(t, int64(len(files["a"])+len(files["b"])), n, "bytes seen by OnChunk")
	var want []ID
	for _, name := range []string{"a", "b"} {
		f, _, err := s.OpenPath("m/" + name)
		require.NoError(t, err)
		for _, c := range f.M.Chunks {
			want = append(want, c.ID)
		}
	}
	require.Equal(t, want, ids)
}
