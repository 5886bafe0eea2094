package chunkstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore/storeio/storeiotest"
	"github.com/kylix/kylix/internal/damage"
)

// TestCounters: imports, exports, cache hits and misses and each kind of
// chunk failure move the counters by what happened.
func TestCounters(t *testing.T) {
	sizes := map[string]int{"a": 3<<20 + 5, "b": 2 << 20, "c": 1<<20 + 9, "d": 70000}
	s, fr, clk, want := faultStore(t, sizes, Options{})
	var total int64
	for _, n := range sizes {
		total += int64(n)
	}
	c0 := s.Counters()
	assert.Equal(t, total, c0.ImportBytes, "bytes imported")
	assert.Zero(t, c0.CacheHits+c0.CacheMisses+c0.ChunkCorrupt+c0.ChunkReadError+c0.ChunkNotLocal+c0.ChunkOther+c0.ExportBytes)

	// A whole-file read misses every chunk (and keeps none: it needs
	// them no more); a partial read keeps its chunk, which the next one
	// finds.
	f := mustOpen(t, s, "m/a")
	n := int64(len(f.M.Chunks))
	buf := make([]byte, f.Size())
	_, err := f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, want["a"], buf)
	c1 := s.Counters()
	assert.Equal(t, n, c1.CacheMisses)
	assert.Zero(t, c1.CacheHits)
	for range 2 {
		_, err = f.ReadAt(buf[:10], 0)
		require.NoError(t, err)
	}
	c2 := s.Counters()
	assert.Equal(t, int64(1), c2.CacheHits)
	assert.Equal(t, n+1, c2.CacheMisses)

	out := t.TempDir()
	files, bytes, err := s.Export(context.Background(), "m/b", filepath.Join(out, "b"), ExportOptions{})
	require.NoError(t, err)
	assert.Equal(t, 1, files)
	assert.Equal(t, int64(sizes["b"]), s.Counters().ExportBytes)
	assert.Equal(t, int64(sizes["b"]), bytes)

	// An I/O error, then (after the failure is forgotten) a flipped byte,
	// then a missing pack: one count each, of its kind.
	fb := mustOpen(t, s, "m/c")
	before := s.Counters()
	fr.Always(storeiotest.EIO)
	_, err = fb.ReadAt(make([]byte, 10), 0)
	require.Error(t, err)
	_, err = fb.ReadAt(make([]byte, 10), 0) // remembered: no second attempt
	require.Error(t, err)
	fr.Clear()
	after := s.Counters()
	assert.Equal(t, int64(1), after.ChunkReadError)
	assert.Equal(t, before.CacheMisses+1, after.CacheMisses, "one attempt")
	assert.Equal(t, before.CacheHits, after.CacheHits, "a failure remembered is no hit")
	clk.advance(2 * DefaultFailTTL)
	ext := fb.Extents()[0]
	damage.FlipByte(t, ext.PackPath, ext.PackOff+1)
	_, err = fb.ReadAt(make([]byte, 10), 0)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Equal(t, int64(1), s.Counters().ChunkCorrupt)

	fd := mustOpen(t, s, "m/d")
	require.NoError(t, os.Remove(fd.Extents()[0].PackPath))
	_, err = fd.ReadAt(make([]byte, 10), 0)
	require.ErrorIs(t, err, ErrNotLocal)
	c3 := s.Counters()
	assert.Equal(t, int64(1), c3.ChunkNotLocal)
	assert.Equal(t, int64(1), c3.ChunkReadError)
	assert.Equal(t, int64(1), c3.ChunkCorrupt)
	assert.Zero(t, c3.ChunkOther)
}

// TestDiskUsage: a file and a copy of it with one changed chunk; logical
// bytes count both names, unique bytes the distinct chunks, stored bytes
// the 4 KiB blocks they take in the packs.
func TestDiskUsage(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]int{"x/big": 6 << 20, "x/small": 5000, "y/tiny": 10}, 3)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	_, err := s.Import(ctx, src, "t", ImportOptions{})
	require.NoError(t, err)
	// A second copy of x: every chunk shared.
	_, err = s.Import(ctx, filepath.Join(src, "x"), "t/x2", ImportOptions{})
	require.NoError(t, err)

	total, kids, err := s.DiskUsage(ctx, "t", true)
	require.NoError(t, err)
	require.Len(t, kids, 3)
	x, x2, y := kids[0], kids[1], kids[2]
	assert.Equal(t, "t/x", x.Path)
	assert.Equal(t, "t/x2", x2.Path)
	assert.Equal(t, "t/y", y.Path)
	assert.Equal(t, int64(6<<20+5000), x.LogicalBytes)
	assert.Equal(t, x.LogicalBytes, x.UniqueBytes)
	assert.Equal(t, x, Usage{Path: "t/x", LogicalBytes: x2.LogicalBytes, UniqueBytes: x2.UniqueBytes, StoredBytes: x2.StoredBytes,
		Files: x2.Files, Dirs: x2.Dirs, Chunks: x2.Chunks, Packs: x2.Packs}, "a copy takes what the original takes")
	assert.Equal(t, 2*x.LogicalBytes+10, total.LogicalBytes)
	assert.Equal(t, x.UniqueBytes+10, total.UniqueBytes, "shared chunks count once")
	assert.Equal(t, int64(5), total.Files)
	assert.Equal(t, int64(4), total.Dirs) // t, x, x2, y

	// big has a pack of its own holding exactly it: 6 MiB, a multiple of
	// 4 KiB. small and tiny sit in the shared pack, each in its own
	// 4 KiB-aligned region: 8 KiB and 4 KiB (or less where the pack ends).
	fbig, _, err := s.OpenPath("t/x/big")
	require.NoError(t, err)
	_, whole := fbig.WholeFilePack()
	require.True(t, whole)
	assert.LessOrEqual(t, x.StoredBytes, int64(6<<20+8192))
	assert.Greater(t, x.StoredBytes, int64(6<<20+4096))
	assert.GreaterOrEqual(t, y.StoredBytes, int64(10))
	assert.LessOrEqual(t, y.StoredBytes, int64(4096))

	// A file alone; -s of the root.
	u, none, err := s.DiskUsage(ctx, "t/y/tiny", true)
	require.NoError(t, err)
	assert.Empty(t, none)
	assert.Equal(t, int64(10), u.LogicalBytes)
	root, none, err := s.DiskUsage(ctx, "", false)
	require.NoError(t, err)
	assert.Empty(t, none)
	assert.Equal(t, total.UniqueBytes, root.UniqueBytes)
	assert.Equal(t, total.StoredBytes, root.StoredBytes)
	st, err := s.Stats()
	require.NoError(t, err)
	assert.Equal(t, st.UniqueBytes, root.UniqueBytes)
	assert.Equal(t, st.StoredBytes, root.StoredBytes, "a store without garbage: the packs hold just these blocks")

	_, _, err = s.DiskUsage(ctx, "t/nope", false)
	require.ErrorIs(t, err, ErrNotFound)
}
