package peers

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/units"
)

// tmpfsDir mounts a tmpfs of size bytes under a temporary directory
// (root only), unmounted at cleanup.
func tmpfsDir(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root; CI runs this as root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+itoa(size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func itoa(n int64) string { return units.SizeOrPercent{Bytes: n}.String() }

// freeBytes is what statfs says non-root writers may still use.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	return int64(st.Bavail) * st.Frsize
}

// fill writes a file of n bytes into dir.
func fill(t *testing.T, dir, name string, n int64) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), make([]byte, n), 0o600))
}

// TestPeerCacheKeepsFreeSpace: the peer cache's budget (here the 8 GiB
// default) is bounded by the free space of its file system: it stores a
// fetched chunk only while at least Config.CacheMinFree (the node sets
// the mount's reserve) stays free, evicting its least recently used
// chunks first, and gives space back when the file system's free space
// falls below the floor (others wrote). A reader member on a 48 MiB tmpfs
// with 22 MiB free and a 16 MiB floor reads a 16 MiB file from a node
// (bytes right), and 16 MiB stay free; filler then takes the free space
// below the floor, and the next read through the cache evicts.
func TestPeerCacheKeepsFreeSpace(t *testing.T) {
	const mib = 1 << 20
	disk := tmpfsDir(t, 48*mib)
	fill(t, disk, "filler1", 26*mib)
	floor := int64(16 * mib)
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	r, err := startNodeCfg(t, Config{Name: "r", Key: key, Join: []string{a.cfg.Listen}, Reader: true,
		CacheDir: filepath.Join(disk, "peer-cache"), CacheMinFree: units.SizeOrPercent{Bytes: floor}})
	require.NoError(t, err)
	eventually(t, "two alive members", func() bool { return len(r.livePeers()) == 1 && len(a.livePeers()) == 1 })

	one, two := randBytes(16*mib), randBytes(8*mib)
	importBytes(t, a, "one", one)
	importBytes(t, a, "two", two)
	eventually(t, "the files on the reader", func() bool {
		_, err1 := r.s.Lookup("one")
		_, err2 := r.s.Lookup("two")
		return err1 == nil && err2 == nil
	})
	got, err := readAll(r, "one")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, one), "the reader read wrong bytes")
	st := r.cache.statsOf()
	t.Logf("after reading 16 MiB: cache %d chunks, %d bytes; %d MiB free", st.Chunks, st.Bytes, freeBytes(t, disk)/mib)
	require.Positive(t, st.Chunks, "nothing was cached although 6 MiB were free above the floor")
	require.GreaterOrEqual(t, freeBytes(t, disk), floor, "the peer cache took the free space below its floor")

	// Others take the free space below the floor; the next fetch through
	// the cache gives back what it can.
	fill(t, disk, "filler2", 4*mib)
	require.Less(t, freeBytes(t, disk), floor)
	before := st.Bytes
	got, err = readAll(r, "two")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, two), "the reader read wrong bytes")
	st = r.cache.statsOf()
	t.Logf("after the filler and reading 8 MiB: cache %d chunks, %d bytes (was %d); %d MiB free", st.Chunks, st.Bytes, before, freeBytes(t, disk)/mib)
	require.Less(t, st.Bytes, before, "the cache did not give space back")
	if st.Chunks > 0 {
		require.GreaterOrEqual(t, freeBytes(t, disk), floor, "the cache keeps chunks while free space is below its floor")
	}
}

// TestPeerCacheLeavesClaimedFree: the cache also leaves free what others
// have set aside and not written yet (Config.CacheClaimed: the mount's
// pending commits), so its writers never take room a write through the
// mount was promised: with more claimed than is free it keeps nothing,
// and gives back what it holds; with nothing claimed it keeps the chunk.
func TestPeerCacheLeavesClaimedFree(t *testing.T) {
	dir := t.TempDir()
	var claimed atomic.Int64
	c, err := openPeerCache(dir, 1<<30, units.SizeOrPercent{}, claimed.Load)
	require.NoError(t, err)
	defer c.close()
	d, e := randBytes(4096), randBytes(4096)
	require.True(t, c.put(chunkstore.Sum(d), d), "nothing claimed: kept")
	claimed.Store(freeBytes(t, dir) + 1<<30)
	require.False(t, c.put(chunkstore.Sum(e), e), "kept into room the mount set aside")
	require.Zero(t, c.statsOf().Chunks, "the cache kept chunks in room the mount set aside")
	claimed.Store(0)
	require.True(t, c.put(chunkstore.Sum(e), e))
}
