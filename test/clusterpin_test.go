package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/fs/layout"
)

// Pins, warm-up and stat across the cluster (docs/design/pin.md, "In a
// cluster"), with real `kylix serve` processes on 127.0.0.60 and .61.

type clusterStatOut struct {
	Size           int64           `json:"size"`
	Pinned         bool            `json:"pinned"`
	LocalBytes     *int64          `json:"local_bytes"`
	PeerCacheBytes *int64          `json:"peer_cache_bytes"`
	Cluster        *replicationOut `json:"cluster"`
}

func clusterStat(t *testing.T, m *member, p string) clusterStatOut {
	t.Helper()
	var out clusterStatOut
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "stat", "--data", m.data, "--json", p)), &out); err != nil {
		t.Fatal(err)
	}
	if out.LocalBytes == nil || out.PeerCacheBytes == nil || out.Cluster == nil {
		t.Fatalf("kylix stat --json %s on a cluster member lacks local_bytes, peer_cache_bytes or cluster: %+v", p, out)
	}
	return out
}

func droppedOn(t *testing.T, m *member) int64 {
	t.Helper()
	var out struct {
		Placement struct {
			Dropped int64 `json:"dropped_chunks"`
		} `json:"placement"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out.Placement.Dropped
}

// startPairR1 starts two members on ipA and ipB with --replicas 1 (so B
// stores only the chunks it owns of a file imported on A), B joining A,
// and waits until each sees both; it returns them and the cluster key.
func startPairR1(t *testing.T, ipA, ipB string) (a, b *member, key string) {
	t.Helper()
	key = clusterKey(t)
	r1 := []string{"--replicas", "1"}
	a = startMemberArgs(t, ipA, key, nil, r1)
	b = startMemberArgs(t, ipB, key, nil, r1, a.addr)
	waitFor(t, membershipWait, "two alive members seen by each", func() bool {
		return aliveCount(t, a) == 2 && aliveCount(t, b) == 2
	})
	return a, b, key
}

// TestClusterPinWarmStat: two members, one copy of each chunk (R=1), so B
// stores only the chunks it owns of a file imported on A.
//   - kylix pin on B brings the rest from A into B's packs (progress bar on
//     a pty), then stat on B shows every byte local and B holding every
//     chunk;
//   - a file of A's made local on B by KYLIX_IOC_MAKE_LOCAL is kept on B
//     (kylix node lists it);
//   - a rebalance pass on B that drops copies it does not own (those of a
//     file imported on B) keeps the pinned chunks and those made local;
//   - kylix warm on B of another file of A's fetches the chunks B lacks
//     (fetched bytes > 0) into B's peer cache, as stat then shows; kylix
//     evict drops exactly those (not the pinned file's), --all the rest;
//   - after kill -9 of A, the pinned file and the file made local read
//     byte-equal through B's mount;
//   - a pin of a file whose chunks only A held fails naming the file and
//     leaves nothing pinned or recorded; kylix unpin of the file made
//     local removes it from the record.
func TestClusterPinWarmStat(t *testing.T) {
	requireFUSE(t)
	a, b, _ := startPairR1(t, "127.0.0.60", "127.0.0.61")

	// A file of A's: B stores only the chunks it owns.
	src, sum := randomFile(t, 24<<20+4321)
	mustKylix(t, "/", "import", "--data", a.data, src, "cp/pinned.bin")
	waitFor(t, nsWait, "cp/pinned.bin in B's namespace", visible(filepath.Join(b.mnt, "cp", "pinned.bin")))
	before := clusterStat(t, b, "cp/pinned.bin")
	if *before.LocalBytes >= before.Size || before.Pinned {
		t.Fatalf("before the pin, B stores %d of %d bytes (pinned %v): want fewer (R=1, two members)", *before.LocalBytes, before.Size, before.Pinned)
	}

	// The pin brings the rest. On a pty it shows its progress.
	var pinOut string
	if _, err := exec.LookPath("script"); err == nil {
		pinOut = run(t, "/", "script", "-qec", kylixBin+" pin --data "+b.data+" cp/pinned.bin", "/dev/null")
		if !strings.Contains(pinOut, "pin cp/pinned.bin: fetching [") {
			t.Errorf("no progress bar on a pty:\n%q", pinOut)
		}
	} else {
		t.Log("no script(1): progress bar not checked")
		pinOut = mustKylix(t, "/", "pin", "--data", b.data, "cp/pinned.bin")
	}
	m := regexp.MustCompile(`pinned cp/pinned.bin: 1 files, .*; ([0-9.]+ [KMG]?i?B) fetched from the members into this node's packs first`).FindStringSubmatch(pinOut)
	if m == nil || m[1] == "0 B" {
		t.Fatalf("kylix pin on B:\n%s\nnode log:\n%s", pinOut, b.log)
	}
	after := clusterStat(t, b, "cp/pinned.bin")
	if *after.LocalBytes != after.Size || !after.Pinned {
		t.Fatalf("after the pin, B stores %d of %d bytes, pinned %v", *after.LocalBytes, after.Size, after.Pinned)
	}
	for _, h := range after.Cluster.Holders {
		if h.Member == "127.0.0.61" && h.Chunks != after.Cluster.Chunks {
			t.Errorf("stat on B: B holds %d of %d chunks", h.Chunks, after.Cluster.Chunks)
		}
	}
	if out := mustKylix(t, "/", "stat", "--data", b.data, "cp/pinned.bin"); !strings.Contains(out, "in this node's packs") ||
		!strings.Contains(out, "held by 127.0.0.60") || !strings.Contains(out, "held by 127.0.0.61") {
		t.Errorf("kylix stat on B:\n%s", out)
	}
	if rec, err := os.ReadFile(filepath.Join(b.data, "pins.json")); err != nil || strings.Contains(string(rec), "pending") ||
		!strings.Contains(string(rec), `"cp/pinned.bin"`) {
		t.Errorf("B's pin record after the pin: %s %v", rec, err)
	}

	// A file of A's made local on B through the mount (KYLIX_IOC_MAKE_LOCAL).
	msrc, msum := randomFile(t, 16<<20+17)
	mustKylix(t, "/", "import", "--data", a.data, msrc, "cp/local.bin")
	lp := filepath.Join(b.mnt, "cp", "local.bin")
	waitFor(t, nsWait, "cp/local.bin in B's namespace", visible(lp))
	if st := clusterStat(t, b, "cp/local.bin"); *st.LocalBytes >= st.Size {
		t.Fatalf("B stores all of cp/local.bin (%d bytes) before MAKE_LOCAL", st.Size)
	}
	lf, err := os.Open(lp)
	if err != nil {
		t.Fatal(err)
	}
	if err := layout.MakeLocal(int(lf.Fd()), 0, 0); err != nil {
		t.Fatalf("%v\nnode log:\n%s", err, b.log)
	}
	lf.Close()
	if st := clusterStat(t, b, "cp/local.bin"); *st.LocalBytes != st.Size || st.Pinned {
		t.Fatalf("after MAKE_LOCAL, B stores %d of %d bytes of cp/local.bin (pinned %v)", *st.LocalBytes, st.Size, st.Pinned)
	}
	if out := mustKylix(t, "/", "node", "--data", b.data); !strings.Contains(out, "kept here (made local, not locked): cp/local.bin") {
		t.Errorf("kylix node on B does not list the file made local:\n%s", out)
	}

	// A rebalance pass on B that drops copies it does not own (those of a
	// file imported on B, pushed to A) must keep the pinned chunks and
	// those made local.
	d0 := droppedOn(t, b)
	ctl, _ := randomFile(t, 16<<20)
	mustKylix(t, "/", "import", "--data", b.data, ctl, "cp/control.bin")
	waitFor(t, 90*time.Second, "B's rebalance dropping the copies of cp/control.bin it does not own", func() bool { return droppedOn(t, b) > d0 })
	if st := clusterStat(t, b, "cp/pinned.bin"); *st.LocalBytes != st.Size {
		t.Fatalf("after a rebalance pass on B, B stores %d of %d bytes of the pinned file", *st.LocalBytes, st.Size)
	}
	if st := clusterStat(t, b, "cp/local.bin"); *st.LocalBytes != st.Size {
		t.Fatalf("after a rebalance pass on B, B stores %d of %d bytes of the file made local", *st.LocalBytes, st.Size)
	}

	// Warm on B of another file of A's: what B lacks is fetched.
	wsrc, wsum := randomFile(t, 16<<20+99)
	mustKylix(t, "/", "import", "--data", a.data, wsrc, "cp/warm.bin")
	waitFor(t, nsWait, "cp/warm.bin in B's namespace", visible(filepath.Join(b.mnt, "cp", "warm.bin")))
	var w struct {
		Bytes        int64 `json:"bytes"`
		LocalBytes   int64 `json:"local_bytes"`
		FetchedBytes int64 `json:"fetched_bytes"`
		Verified     bool  `json:"verified"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "warm", "--data", b.data, "--json", "cp/warm.bin")), &w); err != nil {
		t.Fatal(err)
	}
	if w.FetchedBytes <= 0 || w.LocalBytes+w.FetchedBytes != w.Bytes || w.Bytes != 16<<20+99 || !w.Verified {
		t.Fatalf("kylix warm on B: %+v", w)
	}
	ws := clusterStat(t, b, "cp/warm.bin")
	if *ws.PeerCacheBytes != w.FetchedBytes || *ws.LocalBytes != w.LocalBytes {
		t.Errorf("stat on B after warm: %d bytes in packs, %d in the peer cache; warm read %d local, fetched %d",
			*ws.LocalBytes, *ws.PeerCacheBytes, w.LocalBytes, w.FetchedBytes)
	}
	// Again, as text (on a pty when there is script(1): the progress bar
	// says local and fetched bytes): the chunks are not in B's packs, so
	// they are read through the fetcher again (from the peer cache).
	var warmOut string
	if _, err := exec.LookPath("script"); err == nil {
		warmOut = run(t, "/", "script", "-qec", kylixBin+" warm --data "+b.data+" cp/warm.bin", "/dev/null")
		if !regexp.MustCompile(`warm cp/warm.bin \([0-9.]+ [KMG]?i?B local, [0-9.]+ [KMG]?i?B fetched\) \[`).MatchString(warmOut) {
			t.Errorf("no progress bar with local and fetched bytes on a pty:\n%q", warmOut)
		}
	} else {
		warmOut = mustKylix(t, "/", "warm", "--data", b.data, "cp/warm.bin")
	}
	if !strings.Contains(warmOut, "fetched from the members into the peer cache") || !strings.Contains(warmOut, "was there already") {
		t.Errorf("kylix warm on B:\n%s", warmOut)
	}
	if shaOn(t, b, filepath.Join(b.mnt, "cp", "warm.bin")) != wsum {
		t.Fatal("the warmed file read through B's mount differs from the source")
	}

	// kylix evict drops what warm fetched, and only that: the pinned
	// file's chunks are in B's packs and stay.
	type evicted struct {
		Chunks      int   `json:"chunks"`
		Bytes       int64 `json:"bytes"`
		CacheChunks int   `json:"cache_chunks"`
	}
	evict := func(args ...string) evicted {
		t.Helper()
		var ev evicted
		out := mustKylix(t, "/", append([]string{"evict", "--data", b.data, "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &ev); err != nil {
			t.Fatalf("kylix evict %v: %v\n%s", args, err, out)
		}
		return ev
	}
	if ev := evict("cp/warm.bin"); ev.Bytes != w.FetchedBytes || ev.Chunks == 0 {
		t.Errorf("kylix evict cp/warm.bin on B dropped %+v; warm had fetched %d bytes", ev, w.FetchedBytes)
	}
	if st := clusterStat(t, b, "cp/warm.bin"); *st.PeerCacheBytes != 0 || *st.LocalBytes != w.LocalBytes {
		t.Errorf("stat on B after evict: %d bytes in packs, %d in the peer cache; want %d and 0", *st.LocalBytes, *st.PeerCacheBytes, w.LocalBytes)
	}
	if ev := evict("cp/pinned.bin"); ev.Chunks != 0 {
		t.Errorf("kylix evict of the pinned file dropped %+v from the peer cache, want nothing", ev)
	}
	if st := clusterStat(t, b, "cp/pinned.bin"); *st.LocalBytes != st.Size || !st.Pinned {
		t.Errorf("after kylix evict, B stores %d of %d bytes of the pinned file (pinned %v)", *st.LocalBytes, st.Size, st.Pinned)
	}
	if shaOn(t, b, filepath.Join(b.mnt, "cp", "warm.bin")) != wsum {
		t.Fatal("the evicted file read through B's mount differs from the source")
	}
	// --all empties the cache: another file of A's warmed on B first.
	w2src, _ := randomFile(t, 8<<20+5)
	mustKylix(t, "/", "import", "--data", a.data, w2src, "cp/warm2.bin")
	waitFor(t, nsWait, "cp/warm2.bin in B's namespace", visible(filepath.Join(b.mnt, "cp", "warm2.bin")))
	mustKylix(t, "/", "warm", "--data", b.data, "cp/warm2.bin")
	if st := clusterStat(t, b, "cp/warm2.bin"); *st.PeerCacheBytes == 0 {
		t.Fatalf("warm of cp/warm2.bin on B left nothing in the peer cache: %+v", st)
	}
	if ev := evict("--all"); ev.Chunks == 0 || ev.CacheChunks != 0 {
		t.Errorf("kylix evict --all on B: %+v", ev)
	}
	if st := clusterStat(t, b, "cp/warm2.bin"); *st.PeerCacheBytes != 0 {
		t.Errorf("after kylix evict --all, B's peer cache holds %d bytes of cp/warm2.bin", *st.PeerCacheBytes)
	}
	if out, errs, code := kylix(t, "/", "evict", "--data", b.data); code != 2 || !strings.Contains(errs, "give a PATH or --all") {
		t.Errorf("kylix evict without PATH or --all: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := kylix(t, "/", "evict", "--data", b.data, "cp/nope"); code != 1 || !strings.Contains(errs, "no such path") {
		t.Errorf("kylix evict of a missing path: exit %d\n%s%s", code, out, errs)
	}

	// A file only A holds the rest of, then A is gone.
	lsrc, _ := randomFile(t, 16<<20)
	mustKylix(t, "/", "import", "--data", a.data, lsrc, "cp/lost.bin")
	waitFor(t, nsWait, "cp/lost.bin in B's namespace", visible(filepath.Join(b.mnt, "cp", "lost.bin")))
	if st := clusterStat(t, b, "cp/lost.bin"); *st.LocalBytes >= st.Size {
		t.Fatalf("B stores all of cp/lost.bin (%d bytes) before A is killed", st.Size)
	}
	a.kill9()
	syscall.Unmount(a.mnt, syscall.MNT_DETACH)
	if shaOn(t, b, filepath.Join(b.mnt, "cp", "pinned.bin")) != sum {
		t.Fatal("the pinned file read through B's mount after A was killed differs from the source")
	}
	if shaOn(t, b, lp) != msum {
		t.Fatal("the file made local read through B's mount after A was killed differs from the source")
	}
	out, errs, code := kylix(t, "/", "pin", "--data", b.data, "cp/lost.bin")
	// The message names the pin, the file and the chunk that no member
	// could send (chunkstore.Store.MakeLocal's wording).
	if code != 1 || !strings.Contains(errs, "pin cp/lost.bin: not pinned: ") || !strings.Contains(errs, "cp/lost.bin: the chunk at offset ") ||
		!strings.Contains(errs, "could not be fetched") {
		t.Fatalf("pin of a file whose chunks no member can send: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	if st := clusterStat(t, b, "cp/lost.bin"); st.Pinned {
		t.Error("stat on B says cp/lost.bin is pinned after its pin failed")
	}
	rec, err := os.ReadFile(filepath.Join(b.data, "pins.json"))
	if err != nil || strings.Contains(string(rec), "lost.bin") || !strings.Contains(string(rec), `"cp/pinned.bin"`) {
		t.Errorf("B's pin record after a failed pin: %s %v", rec, err)
	}
	var node struct {
		Pins struct {
			Pins []struct {
				Path string `json:"path"`
			} `json:"pins"`
		} `json:"pins"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "node", "--data", b.data, "--json")), &node); err != nil {
		t.Fatal(err)
	}
	if len(node.Pins.Pins) != 1 || node.Pins.Pins[0].Path != "cp/pinned.bin" {
		t.Errorf("B's pins after a failed pin: %+v", node.Pins.Pins)
	}
	// kylix unpin of a file made local: no longer kept.
	if out := mustKylix(t, "/", "unpin", "--data", b.data, "cp/local.bin"); !strings.Contains(out, "cp/local.bin is no longer kept on this node") {
		t.Errorf("kylix unpin of the file made local: %s", out)
	}
	if rec, err := os.ReadFile(filepath.Join(b.data, "pins.json")); err != nil || strings.Contains(string(rec), "local.bin") {
		t.Errorf("B's pin record after unpin of the file made local: %s %v", rec, err)
	}
}
