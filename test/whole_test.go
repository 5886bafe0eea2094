package test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/testneeds"
)

// fineTune imports a 24 MiB base and a fine-tune of it (a 100-byte longer
// head, so every shared chunk sits at another offset, three regions
// changed) as m/base and m/ft, and returns their SHA-256s.
func fineTune(t *testing.T, data string) (string, string) { return fineTuneOf(t, data, 24<<20) }

// fineTuneOf is fineTune with a base of size bytes.
func fineTuneOf(t *testing.T, data string, size int) (string, string) {
	t.Helper()
	r := rand.New(rand.NewChaCha8([32]byte{31}))
	bytesOf := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	base := bytesOf(size)
	ft := append(bytesOf(100), base...)
	for _, at := range []int{size / 8, size / 2, size * 3 / 4} {
		copy(ft[at:], bytesOf(256<<10))
	}
	work := t.TempDir()
	for _, f := range []struct {
		name string
		b    []byte
	}{{"base", base}, {"ft", ft}} { // in this order: the fine-tune is the deduplicated one
		require.NoError(t, os.WriteFile(filepath.Join(work, f.name), f.b, 0o644))
		mustKylix(t, work, "import", "--data", data, f.name, "m/"+f.name)
	}
	hb, hf := sha256.Sum256(base), sha256.Sum256(ft)
	return hex.EncodeToString(hb[:]), hex.EncodeToString(hf[:])
}

// sha256sum runs the real sha256sum on path.
func sha256sum(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command(testneeds.Command(t, "sha256sum", "coreutils"), path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Fields(string(out))[0]
}

type wholeNode struct {
	FS struct {
		PassthroughOpens int64 `json:"passthrough_opens"`
	} `json:"fs"`
	Whole struct {
		BudgetBytes int64  `json:"budget_bytes"`
		Copies      int    `json:"copies"`
		StoredBytes int64  `json:"stored_bytes"`
		Made        int64  `json:"made"`
		NotMade     int64  `json:"not_made"`
		LastNotMade string `json:"last_not_made"`
	} `json:"whole"`
}

func nodeWhole(t *testing.T, data string) wholeNode {
	t.Helper()
	var out wholeNode
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "node", "--json", "--data", data)), &out))
	return out
}

type wholeStat struct {
	PassthroughPack string `json:"passthrough_pack"`
	WholeCopy       bool   `json:"whole_copy"`
}

func statWhole(t *testing.T, data, path string) wholeStat {
	t.Helper()
	var st wholeStat
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "--data", data, path)), &st))
	return st
}

// TestWholeCopyThroughMount: a fine-tune deduplicated against its base is
// served by the node (no pack holds exactly it); after its second open
// through the mount (sha256sum) the node gives it a whole copy, and its
// next open is FUSE passthrough, byte-equal, while the base keeps its own
// pack; kylix stat and kylix node say so; kylix gc (compacting) keeps the
// copy; removing the fine-tune and collecting removes it.
func TestWholeCopyThroughMount(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "sha256sum", "coreutils")
	data, mnt := dirs(t)
	hb, hf := fineTune(t, data)
	require.Empty(t, statWhole(t, data, "m/ft").PassthroughPack)
	addr := freeAddr(t)
	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--metrics", addr)
	ft := filepath.Join(mnt, "m", "ft")

	pt0 := nodeWhole(t, data).FS.PassthroughOpens
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, pt0, nodeWhole(t, data).FS.PassthroughOpens, "the fine-tune was served by the node")
	waitFor(t, 30*time.Second, "a whole copy of the fine-tune", func() bool { return nodeWhole(t, data).Whole.Made == 1 })
	st := statWhole(t, data, "m/ft")
	require.True(t, st.WholeCopy, "%+v", st)
	require.NotEmpty(t, st.PassthroughPack)
	require.Contains(t, mustKylix(t, data, "stat", "--data", data, "m/ft"), "a whole copy of this deduplicated file")

	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, pt0+1, nodeWhole(t, data).FS.PassthroughOpens, "the fine-tune's next open is passthrough\n%s", n.log)
	require.Equal(t, hb, sha256sum(t, filepath.Join(mnt, "m", "base")))
	require.Equal(t, pt0+2, nodeWhole(t, data).FS.PassthroughOpens, "the base keeps its pack")
	w := nodeWhole(t, data).Whole
	require.Equal(t, 1, w.Copies)
	require.Greater(t, w.StoredBytes, int64(12<<20), "most of the fine-tune is stored twice")
	require.Equal(t, 1.0, metrics(t, "http://"+addr+"/metrics")["kylix_whole_copies_made_total"])
	text := mustKylix(t, data, "node", "--data", data)
	require.Regexp(t, `whole: +1 copies, \d+\.\d MiB stored twice of a .* budget \(1 made, 0 not made, 0 dropped since start\)`, text)

	require.Regexp(t, `whole copies \(the whole store, not in STORED\): 1 files, \d+\.\d MiB stored a second time`, mustKylix(t, data, "du", "--data", data, "m"))
	mustKylix(t, data, "gc", "--data", data)
	require.True(t, statWhole(t, data, "m/ft").WholeCopy)
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, hb, sha256sum(t, filepath.Join(mnt, "m", "base")))

	mustKylix(t, data, "rm", "--data", data, "m/ft")
	mustKylix(t, data, "gc", "--data", data)
	require.Zero(t, nodeWhole(t, data).Whole.Copies)
	require.Equal(t, hb, sha256sum(t, filepath.Join(mnt, "m", "base")))
}

// TestWholeCopyBudget: --whole-budget 0 makes none (kylix node: off), as
// does --no-passthrough (saying why); a budget smaller than the file
// makes none and says why.
func TestWholeCopyBudget(t *testing.T) {
	requireFUSE(t)
	for _, c := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"0", []string{"--whole-budget", "0"}, "whole:    off (--whole-budget 0)"},
		{"no-passthrough", []string{"--no-passthrough"}, "whole:    off (--no-passthrough: a whole copy is only good for passthrough opens)"},
		{"8MiB", []string{"--whole-budget", "8MiB"}, "larger than the whole-copy budget (8.0 MiB)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data, mnt := dirs(t)
			_, hf := fineTune(t, data)
			n := launchNode(t, data, mnt, nil, nil, append([]string{"--client-socket", "none"}, c.flags...)...)
			for range 3 {
				require.Equal(t, hf, sha256sum(t, filepath.Join(mnt, "m", "ft")))
			}
			if c.name == "8MiB" {
				waitFor(t, 30*time.Second, "the node to decide", func() bool { return nodeWhole(t, data).Whole.NotMade > 0 })
			}
			require.Contains(t, mustKylix(t, data, "node", "--data", data), c.want)
			require.Zero(t, nodeWhole(t, data).Whole.Made, "%s", n.log)
			require.False(t, statWhole(t, data, "m/ft").WholeCopy)
		})
	}
}

// TestWholeCopyDamagedOrKilled attacks whole copies through the real
// node: a byte flipped in the copy's second copy of a shared chunk makes
// the next open fall back to the node (its check fails), which reads the
// right bytes from where the index keeps them; a node killed with SIGKILL
// while it makes a copy leaves a store that verifies, holds no pack file
// the index does not know, reads right, and makes the copy again.
func TestWholeCopyDamagedOrKilled(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, hf := fineTuneOf(t, data, 256<<20) // large enough that SIGKILL mostly lands while the copy is written
	ft := filepath.Join(mnt, "m", "ft")
	packFiles := func() int {
		ents, err := os.ReadDir(filepath.Join(data, "packs"))
		require.NoError(t, err)
		n := 0
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".pack") {
				n++
			}
		}
		return n
	}
	type df struct {
		Packs int `json:"packs"`
	}
	indexedPacks := func() int {
		var d df
		require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "df", "--json", "--data", data)), &d))
		return d.Packs
	}

	// SIGKILL while the copy is being written.
	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	require.Equal(t, hf, sha256sum(t, ft))
	f, err := os.Open(ft) // the second open starts the copy; reading would wait it out
	require.NoError(t, err)
	require.NoError(t, f.Close())
	waitFor(t, 30*time.Second, "the node to start the copy", func() bool { return strings.Contains(n.log.String(), "making a whole copy") })
	n.kill9()
	madeBeforeKill := strings.Contains(n.log.String(), "whole copy made")
	t.Logf("killed with the copy made: %v", madeBeforeKill)
	clearStaleMount(t, mnt)
	out := mustKylix(t, data, "verify", "--data", data)
	t.Logf("kylix verify after SIGKILL: %s", out)
	require.Equal(t, indexedPacks(), packFiles(), "a pack file the index does not know was left")
	n = launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	require.Equal(t, hf, sha256sum(t, ft))
	if !madeBeforeKill {
		require.False(t, statWhole(t, data, "m/ft").WholeCopy)
		require.Equal(t, hf, sha256sum(t, ft))
		waitFor(t, 30*time.Second, "the copy made again", func() bool { return nodeWhole(t, data).Whole.Made == 1 })
	}
	st := statWhole(t, data, "m/ft")
	require.True(t, st.WholeCopy)

	// A flipped byte in the copy, where it holds a second copy of a
	// chunk shared with the base (the middle of the first quarter).
	pt := nodeWhole(t, data).FS.PassthroughOpens
	damageAt(t, st.PassthroughPack, 16<<20)
	require.Equal(t, hf, sha256sum(t, ft), "the node reads the chunk from where the index keeps it")
	require.Equal(t, pt, nodeWhole(t, data).FS.PassthroughOpens, "a damaged copy is not handed to passthrough")
	// The failed check drops the copy; the next two opens make a new one.
	waitFor(t, 30*time.Second, "the damaged copy dropped", func() bool { return !statWhole(t, data, "m/ft").WholeCopy })
	made := nodeWhole(t, data).Whole.Made
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, hf, sha256sum(t, ft))
	waitFor(t, 30*time.Second, "a new copy", func() bool { return nodeWhole(t, data).Whole.Made == made+1 })
	require.NotEqual(t, st.PassthroughPack, statWhole(t, data, "m/ft").PassthroughPack)
	pt = nodeWhole(t, data).FS.PassthroughOpens
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, pt+1, nodeWhole(t, data).FS.PassthroughOpens)
	mustKylix(t, data, "gc", "--data", data)
	_, err = os.Stat(st.PassthroughPack)
	require.ErrorIs(t, err, os.ErrNotExist, "gc gives the damaged copy's space back")
	require.Equal(t, hf, sha256sum(t, ft))
}

// damageAt flips one byte of the file at path at off.
func damageAt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
}

// TestWholeCopyUnderReaders: readers keep reading the fine-tune through
// the mount (real sha256sum, four at once) while the node makes its whole
// copy and kylix gc deletes the pack its chunks moved out of: every read
// is byte-equal, before, during and after.
func TestWholeCopyUnderReaders(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, hf := fineTuneOf(t, data, 64<<20)
	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	ft := filepath.Join(mnt, "m", "ft")
	sum := testneeds.Command(t, "sha256sum", "coreutils")
	stop := make(chan struct{})
	errs := make(chan error, 4)
	var reads [4]atomic.Int64
	for i := range 4 {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				out, err := exec.Command(sum, ft).CombinedOutput()
				if err != nil || strings.Fields(string(out))[0] != hf {
					errs <- fmt.Errorf("reader %d, read %d: %v: %s", i, reads[i].Load(), err, out)
					return
				}
				reads[i].Add(1)
			}
		}()
	}
	waitFor(t, 60*time.Second, "the whole copy", func() bool { return nodeWhole(t, data).Whole.Made == 1 })
	gc := mustKylix(t, data, "gc", "--data", data)
	t.Logf("kylix gc under the readers: %s", gc)
	require.True(t, statWhole(t, data, "m/ft").WholeCopy)
	var n0 [4]int64
	for i := range reads {
		n0[i] = reads[i].Load()
	}
	waitFor(t, 60*time.Second, "every reader to read again after the gc", func() bool {
		for i := range reads {
			if reads[i].Load() < n0[i]+2 {
				return false
			}
		}
		return true
	})
	close(stop)
	for range 4 {
		require.NoError(t, <-errs)
	}
	t.Logf("reads per reader: %d %d %d %d", reads[0].Load(), reads[1].Load(), reads[2].Load(), reads[3].Load())
	// Readers overlapping without a pause keep the file's inode in the
	// node's cached mode (the kernel does not mix cached and passthrough
	// opens of one inode); with them closed, the next open is passthrough.
	pt := nodeWhole(t, data).FS.PassthroughOpens
	require.Equal(t, hf, sha256sum(t, ft))
	require.Equal(t, pt+1, nodeWhole(t, data).FS.PassthroughOpens)
}
