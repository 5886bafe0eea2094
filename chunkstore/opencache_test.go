package chunkstore

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenFileCache: a file opened again while the index is unchanged is
// served from the open cache (its own read-ahead, the same manifest);
// after any commit (an import, a compaction that moved its chunks) it is
// read from the index again, at the chunks' new places, so a cached open
// never reads where a chunk no longer is.
func TestOpenFileCache(t *testing.T) {
	defer func(n int) { openCacheMinChunks = n }(openCacheMinChunks)
	openCacheMinChunks = 1
	dir, keep := compactFixture(t)
	s := openTest(t, dir)
	ctx := context.Background()
	read := func(f *File) []byte {
		got := make([]byte, f.Size())
		_, err := f.ReadAt(got, 0)
		require.NoError(t, err)
		return got
	}

	f1, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	f2, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	require.Same(t, f1.M, f2.M, "the second open did not come from the cache")
	require.NotSame(t, f1.ra, f2.ra, "two opens share their read-ahead")
	require.True(t, bytes.Equal(keep["k1"], read(f2)))

	// A commit elsewhere in the namespace drops the cache.
	src := t.TempDir()
	require.NoError(t, os.WriteFile(src+"/x", []byte("another file"), 0o644))
	_, err = s.Import(ctx, src, "other", ImportOptions{})
	require.NoError(t, err)
	f3, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	require.NotSame(t, f1.M, f3.M, "served from the cache after a commit")

	// A compaction moves k1's chunks and removes the old pack: the next
	// open finds them at their new place.
	oldPack := f3.Extents()[0].Pack
	_, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	_, err = os.Stat(s.PackPath(oldPack))
	require.True(t, os.IsNotExist(err), "the compaction left the old pack: %v", err)
	f4, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	require.NotEqual(t, oldPack, f4.Extents()[0].Pack, "an open after the compaction has the old locations")
	require.True(t, bytes.Equal(keep["k1"], read(f4)))
	f5, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	require.Same(t, f4.M, f5.M)
	require.Equal(t, f4.Extents(), f5.Extents())
}
