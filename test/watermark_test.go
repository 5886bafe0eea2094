package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/fs/layout"
)

// watermarkOut is kylix node --json's high watermark.
type watermarkOut struct {
	Watermark *struct {
		High     int      `json:"high_percent"`
		Used     float64  `json:"used_percent"`
		Released int64    `json:"released_files"`
		Bytes    int64    `json:"released_bytes"`
		Recent   []string `json:"recent_released"`
		GCs      int64    `json:"gcs"`
		Freed    int64    `json:"gc_freed_bytes"`
	} `json:"watermark"`
	Pins struct {
		Pinned []struct {
			Path string `json:"path"`
		} `json:"pins"`
		Kept []string `json:"kept"`
	} `json:"pins"`
}

func nodeWatermark(t *testing.T, m *member) watermarkOut {
	t.Helper()
	var out watermarkOut
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "node", "--data", m.data, "--json")), &out))
	require.NotNil(t, out.Watermark, "kylix node --json of a cluster member has no watermark")
	return out
}

// usedPercent is the share of the file system at p in use, as the node
// counts it (size less what an unprivileged writer may still write).
func usedPercent(t *testing.T, p string) float64 {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(p, &st))
	return 100 * float64(st.Blocks-st.Bavail) / float64(st.Blocks)
}

// TestClusterHighWatermark: serve --high-watermark through real processes
// (docs/design/space.md, "The high watermark"). Three members, R = 2; B's
// data directory on a tmpfs of its own. Three files imported on A; on B
// two are made local (KYLIX_IOC_MAKE_LOCAL: kept, first one, then two)
// and the third pinned. Another program then fills B's disk past the
// watermark. B releases the kept files, the least recently used first
// (one before two), never the pinned one; rebalance drops B's copies of
// chunks owned elsewhere once their owners confirm them, and a gc gives
// the room back, so B's disk falls under the watermark by itself. Every
// file still reads byte-equal through B's mount, and no chunk of the
// cluster has fewer than two copies.
func TestClusterHighWatermark(t *testing.T) {
	requireFUSE(t)
	if out := refusedServe(t, "--high-watermark", "80"); !strings.Contains(out, "--high-watermark needs a cluster") {
		t.Errorf("serve --high-watermark without --listen: %s", out)
	}
	for _, bad := range []string{"101", "-1", "5"} {
		if out := refusedServe(t, "--listen", "127.0.0.1:1", "--high-watermark", bad); !strings.Contains(out, "want a percent") {
			t.Errorf("serve --high-watermark %s: %s", bad, out)
		}
	}
	key := clusterKey(t)
	disk := smallDisk(t, 192<<20)
	a := startMemberArgs(t, "127.0.0.160", key, nil, nil)
	b := startMemberOn(t, "127.0.0.161", key, filepath.Join(disk, "data"), []string{"--high-watermark", "60", "--peer-cache", "0"}, a.addr)
	startMemberArgs(t, "127.0.0.162", key, nil, nil, a.addr)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("B's log:\n%s", b.log)
			// Where B's disk went: its packs, the filler, and removed
			// packs still mapped (pins).
			pid := b.cmd.Process.Pid
			out, _ := exec.Command("sh", "-c", fmt.Sprintf("ls -la %s/data/packs; du -sh %s/*; grep deleted /proc/%d/maps | head", disk, disk, pid)).CombinedOutput()
			t.Logf("%s", out)
		}
	})
	waitFor(t, membershipWait, "three alive members seen by B", func() bool { return aliveCount(t, b) == 3 })

	sums := map[string][32]byte{}
	for _, name := range []string{"one", "two", "pinned"} {
		src, sum := randomFile(t, 24<<20+123)
		p := "wm/" + name + ".bin"
		mustKylix(t, "/", "import", "--data", a.data, src, p)
		sums[p] = sum
		waitFor(t, nsWait, p+" in B's mount", visible(filepath.Join(b.mnt, p)))
	}
	for _, name := range []string{"one", "two"} {
		p := "wm/" + name + ".bin"
		f, err := os.Open(filepath.Join(b.mnt, p))
		require.NoError(t, err)
		require.NoError(t, layout.MakeLocal(int(f.Fd()), 0, 0), "MAKE_LOCAL of %s on B\nnode log:\n%s", p, b.log)
		f.Close()
		st := clusterStat(t, b, p)
		require.Equal(t, st.Size, *st.LocalBytes, "%s all local on B after MAKE_LOCAL", p)
	}
	mustKylix(t, "/", "pin", "--data", b.data, "wm/pinned.bin")
	before := nodeWatermark(t, b)
	require.Equal(t, 60, before.Watermark.High)
	require.Equal(t, []string{"wm/one.bin", "wm/two.bin"}, before.Pins.Kept)
	require.Zero(t, before.Watermark.Released, "released before the disk passed the watermark")

	// Another program takes the disk to just past the watermark.
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(disk, &st))
	total := int64(st.Blocks) * st.Bsize
	used := int64(st.Blocks-st.Bavail) * st.Bsize
	fill := total*61/100 - used + 1<<20
	require.Positive(t, fill, "B's data already takes %.1f%% of its disk", usedPercent(t, disk))
	require.NoError(t, os.WriteFile(filepath.Join(disk, "filler"), make([]byte, fill), 0o600))
	require.Greater(t, usedPercent(t, disk), 60.0)

	// Under the watermark, and the GC that gave the room back counted
	// (the pins it moved are locked again before the GC returns).
	waitFor(t, 2*time.Minute, "B back under its high watermark, its gc counted", func() bool {
		return usedPercent(t, disk) < 60 && nodeWatermark(t, b).Watermark.GCs > 0
	})
	after := nodeWatermark(t, b)
	t.Logf("B: %+v; kept %v; disk %.1f%% used", *after.Watermark, after.Pins.Kept, usedPercent(t, disk))
	require.NotZero(t, after.Watermark.Released)
	require.NotZero(t, after.Watermark.GCs)
	require.Positive(t, after.Watermark.Freed)
	require.Equal(t, "wm/one.bin", after.Watermark.Recent[0], "the kept file used least recently goes first")
	if slices.Contains(after.Watermark.Recent, "wm/two.bin") {
		require.Empty(t, after.Pins.Kept)
	} else {
		require.Equal(t, []string{"wm/two.bin"}, after.Pins.Kept)
	}
	require.Len(t, after.Pins.Pinned, 1)
	require.Equal(t, "wm/pinned.bin", after.Pins.Pinned[0].Path, "the pinned file was released")
	pst := clusterStat(t, b, "wm/pinned.bin")
	require.Equal(t, pst.Size, *pst.LocalBytes, "the pinned file is no longer all on B")
	one := clusterStat(t, b, "wm/one.bin")
	require.Less(t, *one.LocalBytes, one.Size, "B still holds every chunk of the released file")

	// Never the last copy: every chunk on two members.
	df := dfCluster(t, a)
	require.Zero(t, df.UnderChunks, "chunks with fewer than two copies after B released its kept files")
	require.Equal(t, 2, df.MinCopies)
	for p, sum := range sums {
		require.Equal(t, sum, shaOn(t, b, filepath.Join(b.mnt, p)), "%s through B's mount", p)
	}
}
