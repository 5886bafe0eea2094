package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestShardReadAfterCompaction: a tar shard of hundreds of chunks (the
// store keeps such a file's chunk locations between opens:
// docs/design/store.md, "Reads") read through the mount; then, through
// the node, an rm and a GC that compacts the pack its members shared with
// the removed file (their chunks moved, the old pack deleted); then the
// shard opened and read again with the page cache dropped, so every byte
// comes from the node: the same bytes; and `kylix stat` (an open in the
// node, as the layout ioctl's) names only packs that exist: the chunks'
// new places, not the cached old ones.
func TestShardReadAfterCompaction(t *testing.T) {
	requireFUSE(t)
	top := openTempDir(t)
	require.NoError(t, os.Rename(shardSource(t, 300), filepath.Join(top, "keep")))
	require.NoError(t, os.MkdirAll(filepath.Join(top, "drop"), 0o755))
	for i := range 400 { // small files: in the pack of keep's
		require.NoError(t, os.WriteFile(filepath.Join(top, "drop", fmt.Sprintf("%03d.bin", i)), randomBytes(12<<10, uint64(100+i)), 0o644))
	}
	data, mnt := filepath.Join(openTempDir(t), "data"), filepath.Join(openTempDir(t), "mnt")
	mustKylix(t, top, "import", "--data", data, top, "t")
	mustKylix(t, top, "shards", "--data", data, "t/keep", "t/keep.shards")
	startNode(t, data, mnt)

	shard := filepath.Join(mnt, "t", "keep.shards", "shard-000000.tar")
	before, err := os.ReadFile(shard)
	require.NoError(t, err)
	require.Greater(t, len(before), 300*1024)
	again, err := os.ReadFile(shard) // a second open
	require.NoError(t, err)
	require.Equal(t, before, again)

	packs := func() map[string]bool {
		var st struct {
			Extents []struct {
				PackPath string `json:"pack_path"`
			} `json:"extents"`
		}
		out := mustKylix(t, top, "stat", "--data", data, "--json", "t/keep.shards/shard-000000.tar")
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		m := map[string]bool{}
		for _, e := range st.Extents {
			m[e.PackPath] = true
		}
		require.NotEmpty(t, m, out)
		return m
	}
	old := packs()

	mustKylix(t, top, "rm", "--data", data, "-r", "t/drop")
	r := gcJSON(t, data)
	require.Positive(t, r.PacksCompacted, "the GC compacted nothing: %+v", r)
	require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0o200))
	after, err := os.ReadFile(shard)
	require.NoError(t, err, "a read after the compaction")
	require.Equal(t, before, after, "the shard's bytes after its chunks moved")
	now := packs()
	require.NotEqual(t, old, now, "the shard's extents are the ones before the compaction")
	for p := range now {
		_, err := os.Stat(p)
		require.NoError(t, err, "kylix stat names a pack that is gone")
	}
}
