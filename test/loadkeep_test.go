package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loadOut is the part of `kylix load --json`'s report these tests read.
type loadOut struct {
	Bytes           int64 `json:"bytes"`
	FetchedChunks   int   `json:"fetched_chunks"`
	LocalCopyChunks int   `json:"local_copy_chunks"`
	KeptChunks      int   `json:"kept_chunks"`
	NotKept         int   `json:"not_kept_chunks"`
	Files           []struct {
		Checked bool `json:"checked"`
	} `json:"files"`
}

// loadOn runs kylix load --device host --check --json on m.
func loadOn(t *testing.T, m *member, extra ...string) loadOut {
	t.Helper()
	out := mustKylix(t, "/", append([]string{"load", "--data", m.data, "--device", "host", "--check", "--json"}, extra...)...)
	var r loadOut
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("kylix load --json: %v\n%s", err, out)
	}
	for _, f := range r.Files {
		if !f.Checked {
			t.Fatalf("kylix load --check did not compare a file: %s", out)
		}
	}
	return r
}

// peerCacheChunks is what `kylix peers` says m's peer cache holds.
func peerCacheChunks(t *testing.T, m *member) int {
	t.Helper()
	var out struct {
		Swarm struct {
			Cache struct {
				Chunks int `json:"chunks"`
			} `json:"cache"`
		} `json:"swarm"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out.Swarm.Cache.Chunks
}

// TestClusterLoadKeeps: kylix load on a member that lacks a model fetches
// it from the members and keeps a copy behind the load, so the next load
// there reads it locally; the copy survives a kill -9 and restart of the
// member and serves the load with every holder gone. A damaged copy is
// fetched again, never loaded; --no-keep keeps nothing. Every load
// compares every byte it placed with the store's (--check).
func TestClusterLoadKeeps(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.90", key, nil)
	bArgs := []string{"--role", "reader"} // owns nothing: what it loads is fetched
	b := startMemberArgs(t, "127.0.0.91", key, nil, bArgs, a.addr)
	waitFor(t, membershipWait, "two alive members seen by B", func() bool { return aliveCount(t, b) == 2 })

	src, _ := randomFile(t, 24<<20+777)
	other, _ := randomFile(t, 6<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "m/model.bin")
	mustKylix(t, "/", "import", "--data", a.data, other, "n.bin")
	waitFor(t, nsWait, "both files in B's mount", func() bool {
		return visible(filepath.Join(b.mnt, "m", "model.bin"))() && visible(filepath.Join(b.mnt, "n.bin"))()
	})

	first := loadOn(t, b, "m")
	if first.FetchedChunks == 0 || first.KeptChunks != first.FetchedChunks || first.LocalCopyChunks != 0 {
		t.Fatalf("first load on B: %+v, want every chunk fetched and kept", first)
	}
	n := first.FetchedChunks
	waitFor(t, 30*time.Second, "the fetched chunks written into B's peer cache", func() bool { return peerCacheChunks(t, b) >= n })
	if out := mustKylix(t, "/", "peers", "--data", b.data); !strings.Contains(out, "kept behind them, written ") {
		t.Errorf("kylix peers does not say how kept chunks are written:\n%s", out)
	}

	second := loadOn(t, b, "m")
	if second.LocalCopyChunks != n || second.FetchedChunks != 0 {
		t.Fatalf("second load on B: %+v, want all %d chunks from its copy", second, n)
	}

	// --no-keep: fetched, not kept.
	nk := loadOn(t, b, "--no-keep", "n.bin")
	if nk.FetchedChunks == 0 || nk.KeptChunks != 0 {
		t.Fatalf("load --no-keep: %+v, want chunks fetched and none kept", nk)
	}
	if got := peerCacheChunks(t, b); got != n {
		t.Errorf("B's peer cache holds %d chunks after a --no-keep load, want %d", got, n)
	}
	if txt := mustKylix(t, "/", "load", "--data", b.data, "--device", "host", "n.bin"); !strings.Contains(txt, "\nkept: ") || strings.Contains(txt, "local copy:") {
		t.Errorf("a load after the --no-keep one should fetch and keep n.bin:\n%s", txt)
	}

	// A damaged copy (zeros where a chunk was) is fetched again.
	cacheDir := filepath.Join(b.data, "peer-cache")
	des, err := os.ReadDir(cacheDir)
	if err != nil || len(des) == 0 {
		t.Fatalf("B's peer cache %s: %v (%d files)", cacheDir, err, len(des))
	}
	victim := filepath.Join(cacheDir, des[0].Name())
	fi, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, make([]byte, fi.Size()), 0o600); err != nil {
		t.Fatal(err)
	}
	// Every byte compared (--check): the zeros never reach the device.
	if r := loadOn(t, b, "m", "n.bin"); r.FetchedChunks != 1 || r.LocalCopyChunks != n+nk.FetchedChunks-1 {
		t.Fatalf("load with one kept chunk damaged: %+v, want that one fetched again and the other %d from the copy", r, n+nk.FetchedChunks-1)
	}

	// The next start: B killed and started again, A gone.
	waitFor(t, 30*time.Second, "the refetched chunks written", func() bool { return peerCacheChunks(t, b) >= n+nk.FetchedChunks })
	b.kill9()
	a.kill9()
	b2 := &member{node: launchNode(t, b.data, b.mnt, nil, nil, append([]string{"--listen", b.addr, "--cluster-key", key, "--node-name", "127.0.0.91", "--log-gossip", "--leave-delay", "10ms"}, bArgs...)...), addr: b.addr}
	after := loadOn(t, b2, "m")
	if after.LocalCopyChunks != n || after.FetchedChunks != 0 {
		t.Fatalf("load on B after its restart, A gone: %+v, want all %d chunks from its copy", after, n)
	}
}

// TestClusterWriteEvictsPeerCache: on a member whose disk is nearly full
// of chunks it keeps for others (its peer cache, filled by a load), a
// write through its mount that would not fit evicts those copies first
// and succeeds, byte-equal after its commit; the model still loads there
// (fetched again where evicted).
func TestClusterWriteEvictsPeerCache(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.92", key, nil)
	disk := smallDisk(t, 160<<20)
	b := startMemberOn(t, "127.0.0.93", key, disk, []string{"--role", "reader"}, a.addr)
	waitFor(t, membershipWait, "two alive members seen by B", func() bool { return aliveCount(t, b) == 2 })

	src, _ := randomFile(t, 96<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "model.bin")
	waitFor(t, nsWait, "model.bin in B's mount", visible(filepath.Join(b.mnt, "model.bin")))
	first := loadOn(t, b, "model.bin")
	waitFor(t, 30*time.Second, "the fetched chunks kept on B", func() bool { return peerCacheChunks(t, b) >= first.KeptChunks })
	if first.KeptChunks < first.FetchedChunks*3/4 {
		t.Fatalf("B kept %d of %d chunks: too few to fill its disk", first.KeptChunks, first.FetchedChunks)
	}

	// A write needs about twice its size free (its working copy, then its
	// commit): this one does not fit beside the kept chunks.
	size := freeBytes(t, disk)/2 + 16<<20
	data, sum := randomFile(t, int(size))
	dst := filepath.Join(b.mnt, "written.bin")
	out, err := exec.Command("cp", data, dst).CombinedOutput()
	if err != nil {
		t.Fatalf("cp of %d MiB into B's mount with %d MiB free: %v\n%s\nnode log:\n%s", size>>20, freeBytes(t, disk)>>20, err, out, b.log)
	}
	if got := peerCacheChunks(t, b); got >= first.KeptChunks {
		t.Errorf("B's peer cache holds %d chunks after the write, %d before: nothing evicted", got, first.KeptChunks)
	}
	if !strings.Contains(b.log.String(), "evicted to make room for writes") {
		t.Errorf("B's log does not say it evicted chunks for the write:\n%s", b.log)
	}
	waitFor(t, nsWait, "written.bin committed", func() bool {
		out, _, code := kylix(t, "/", "stat", "--data", b.data, "--json", "written.bin")
		var st struct {
			Size int64 `json:"size"`
		}
		return code == 0 && json.Unmarshal([]byte(out), &st) == nil && st.Size == size
	})
	if shaOn(t, b, dst) != sum {
		t.Fatal("the file written through B's mount reads back different")
	}
	if again := loadOn(t, b, "model.bin"); again.FetchedChunks == 0 { // --check: every byte right
		t.Fatalf("the load after the write fetched nothing (the evicted chunks): %+v", again)
	}

	// A user other than root may not write into the mount's reserve (5%
	// of the disk). A load of a model larger than the disk fills the
	// cache down to that floor; a write by another user, for which
	// nothing is left above the reserve, still makes the cache give way.
	const reserve = 160 << 20 / 20
	big, _ := randomFile(t, 200<<20)
	mustKylix(t, "/", "import", "--data", a.data, big, "big.bin")
	waitFor(t, nsWait, "big.bin in B's mount", visible(filepath.Join(b.mnt, "big.bin")))
	loadOn(t, b, "big.bin")
	// The copies are written behind the load, and those a busy disk's
	// writers are a full queue behind are not kept (under CI's load, one
	// load left the cache short of the floor): a load again fetches and
	// queues what was not kept.
	waitFor(t, 60*time.Second, "B's disk filled by its peer cache down to the reserve", func() bool {
		if freeBytes(t, disk) < reserve+4<<20 {
			return true
		}
		loadOn(t, b, "big.bin")
		return freeBytes(t, disk) < reserve+4<<20
	})
	if err := os.Mkdir(filepath.Join(b.mnt, "u"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(b.mnt, "u"), 0o777); err != nil {
		t.Fatal(err)
	}
	size2 := int64(8 << 20)
	data2, sum2 := randomFile(t, int(size2))
	for _, p := range []string{filepath.Dir(filepath.Dir(data2)), filepath.Dir(data2)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(data2, 0o644); err != nil {
		t.Fatal(err)
	}
	before := peerCacheChunks(t, b)
	dst2 := filepath.Join(b.mnt, "u", "by-nobody.bin")
	cmd := exec.Command("cp", data2, dst2)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cp as uid 65534 of %d MiB into B's mount with %d MiB free: %v\n%s", size2>>20, freeBytes(t, disk)>>20, err, out)
	}
	if got := peerCacheChunks(t, b); got >= before {
		t.Errorf("B's peer cache holds %d chunks after uid 65534's write, %d before: nothing evicted", got, before)
	}
	if shaOn(t, b, dst2) != sum2 {
		t.Fatal("the file uid 65534 wrote through B's mount reads back different")
	}
}
