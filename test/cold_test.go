package test

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gcKept runs kylix gc on m and returns the received chunks it kept that
// no path names.
func gcKept(t *testing.T, m *member) int {
	t.Helper()
	var out struct {
		Kept int `json:"received_kept"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "gc", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out.Kept
}

// memberData is the data plane address of member name as m sees it.
func memberData(t *testing.T, m *member, name string) string {
	t.Helper()
	var out struct {
		Members []struct {
			Name string `json:"name"`
			Data string `json:"data_addr"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range out.Members {
		if p.Name == name {
			return p.Data
		}
	}
	return ""
}

// TestClusterCold: eight `kylix serve` processes. A member killed
// (SIGKILL) in the middle of kylix tier cold loses nothing: after its
// restart the files are warm and read byte-equal. Run again on another
// member, the conversion codes the files (6+2 stripes), names the parity
// the crashed one stored (gc keeps no unnamed received chunk anywhere),
// and the replicas beyond each shard's home go, so every chunk is held
// once (df and stat say so). A file reads byte-equal through a member's
// mount with any two members killed (kill -9); with a third killed, a
// file nobody read gives EIO, not wrong bytes. kylix tier refuses a bad
// tier and a path that is not there.
func TestClusterCold(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	grace := []string{"--failure-grace", "5m"} // the killed stay their stripes' holders
	var ms []*member
	for i := range 8 {
		var join []string
		if i > 0 {
			join = []string{ms[0].addr}
		}
		var env []string
		if i == 1 {
			env = []string{"KYLIX_TEST_TIER_CRASH_AFTER=2"} // B dies in its first conversion
		}
		ms = append(ms, startMemberArgs(t, fmt.Sprintf("127.0.0.%d", 70+i), key, env, grace, join...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range ms {
				t.Logf("log of %s:\n%s", m.addr, m.log)
			}
		}
	})
	waitFor(t, membershipWait, "eight alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 8 {
				return false
			}
		}
		return true
	})
	// m.bin is read; n.bin is never read before the end, and is imported
	// on a member killed before that, so that no member keeps its chunks
	// in memory (members serve what they read, wrote or relayed lately,
	// rightly).
	src, sum := randomFile(t, 40<<20)
	mustKylix(t, "/", "import", "--data", ms[0].data, src, "d/m.bin")
	src2, sum2 := randomFile(t, 24<<20)
	mustKylix(t, "/", "import", "--data", ms[7].data, src2, "d/n.bin") // H, killed below, with what it keeps in memory
	for _, m := range ms {
		waitFor(t, nsWait, "d/n.bin in the mount of "+m.addr, visible(filepath.Join(m.mnt, "d/n.bin")))
	}

	if _, errs, code := kylix(t, "/", "tier", "--data", ms[1].data, "tepid", "m.bin"); code != 2 || !strings.Contains(errs, "cold or warm") {
		t.Errorf("kylix tier tepid: exit %d, %s", code, errs)
	}
	if _, errs, code := kylix(t, "/", "tier", "--data", ms[1].data, "--data-shards", "4", "cold", "d"); code != 1 || !strings.Contains(errs, "cost 1.50x") {
		t.Errorf("kylix tier cold --data-shards 4: exit %d, %s", code, errs)
	}
	if _, errs, code := kylix(t, "/", "tier", "--data", ms[1].data, "--data-shards", "9", "cold", "d"); code != 1 || !strings.Contains(errs, "need 11 members") {
		t.Errorf("kylix tier cold --data-shards 9 on 8 members: exit %d, %s", code, errs)
	}
	if _, errs, code := kylix(t, "/", "tier", "--data", ms[1].data, "cold", "no/such"); code == 0 || !strings.Contains(errs, "no such path") {
		t.Errorf("kylix tier cold of a missing path: exit %d, %s", code, errs)
	}
	// B is killed (SIGKILL) after storing two stripes, before naming
	// them: nothing changes, and the parity it stored is named by nothing
	// (garbage after the received-chunk grace).
	if out, errs, code := kylix(t, "/", "tier", "--data", ms[1].data, "cold", "d"); code == 0 {
		t.Fatalf("kylix tier cold on a member that crashes in it: exit 0: %s", out)
	} else if !strings.Contains(errs, "node") {
		t.Errorf("kylix tier cold on a member that crashed: %s", errs)
	}
	if ms[1].cmd.Wait(); ms[1].cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("B did not die of SIGKILL: %v", ms[1].cmd.ProcessState)
	}
	ms[1] = &member{node: launchNode(t, ms[1].data, ms[1].mnt, nil, nil, "--listen", ms[1].addr, "--cluster-key", key,
		"--node-name", "127.0.0.71", "--log-gossip", "--leave-delay", "10ms", "--failure-grace", "5m", "--join", ms[0].addr), addr: ms[1].addr}
	waitFor(t, membershipWait, "B back, alive at its new data plane address for each", func() bool {
		data := memberData(t, ms[1], "127.0.0.71")
		for _, m := range ms {
			if aliveCount(t, m) != 8 || memberData(t, m, "127.0.0.71") != data {
				return false
			}
		}
		return true
	})
	if st := statCluster(t, ms[1], "d/m.bin"); st.Stripes != 0 || st.ColdChunks != 0 {
		t.Fatalf("after the crash, d/m.bin has stripes: %+v", st)
	}
	if shaOn(t, ms[1], filepath.Join(ms[1].mnt, "d/m.bin")) != sum {
		t.Fatal("d/m.bin read through B after its crash differs from the source")
	}
	var kept int
	for _, m := range ms {
		kept += gcKept(t, m)
	}
	if kept == 0 {
		t.Error("no member keeps a received chunk no path names: where did the crashed conversion's parity go?")
	}

	// The conversion run again on C codes the same stripes: the parity B
	// stored is named now, and no member keeps an unnamed chunk.
	out := mustKylix(t, "/", "tier", "--data", ms[2].data, "cold", "d")
	if !strings.Contains(out, "cold d: 2 files") || !strings.Contains(out, "of 6+2") {
		t.Fatalf("kylix tier cold: %s", out)
	}
	var st replicationOut
	waitFor(t, 90*time.Second, "every chunk held once, no stripe missing a shard (df on C)", func() bool {
		st = dfCluster(t, ms[2]) // the namespace is d
		var held int64
		for _, h := range st.Holders {
			held += h.Bytes
		}
		return st.ColdChunks == st.Chunks && st.UnderChunks == 0 && st.DegradedStripes == 0 && held == st.Bytes && st.Bytes == 64<<20
	})
	if raw := st.Bytes + st.ParityBytes; float64(raw) >= 1.5*float64(st.Bytes) {
		t.Errorf("cold d costs %d bytes for %d: %.2fx, want below 1.5x", raw, st.Bytes, float64(raw)/float64(st.Bytes))
	}
	if df := dfCluster(t, ms[3]); df.Stripes != st.Stripes || df.MinCopies != 1 {
		t.Errorf("kylix df on D: %+v, want %d stripes and one copy of each chunk", df, st.Stripes)
	}
	var top struct {
		Metrics map[string]float64 `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "top", "--data", ms[3].data, "--count", "1", "--json")), &top); err != nil {
		t.Fatal(err)
	}
	if got := top.Metrics["kylix_cluster_stripes"]; got != float64(st.Stripes) {
		t.Errorf("kylix top on D: kylix_cluster_stripes %v, want %d", got, st.Stripes)
	}
	if out, _, _ := kylix(t, "/", "doctor", "--data", ms[3].data); !strings.Contains(out, "ok  erasure coding") || !strings.Contains(out, "6+2 (1.33x)") {
		t.Errorf("kylix doctor on D says nothing of erasure coding:\n%s", out)
	}
	if out := mustKylix(t, "/", "df", "--data", ms[3].data); !strings.Contains(out, "tiers:") || !strings.Contains(out, "  cold ") || strings.Contains(out, "  warm ") {
		t.Errorf("kylix df on D shows no cold tier alone:\n%s", out)
	}
	for _, m := range ms {
		if k := gcKept(t, m); k != 0 {
			t.Errorf("after the conversion, gc on %s keeps %d received chunks no path names", m.addr, k)
		}
	}

	// Any two members killed: F and H.
	for _, m := range []*member{ms[5], ms[7]} {
		m.kill9()
		syscall.Unmount(m.mnt, syscall.MNT_DETACH)
	}
	if shaOn(t, ms[2], filepath.Join(ms[2].mnt, "d/m.bin")) != sum {
		t.Fatal("bytes read through C's mount with two members killed differ from the source")
	}
	if st := dfCluster(t, ms[2]); st.DegradedStripes == 0 || st.UnreadableStripes != 0 {
		t.Errorf("stat on C with two members killed: %+v, want degraded stripes, none past repair", st)
	}

	// A third: some stripe of n.bin lost three of its eight shards.
	ms[6].kill9()
	syscall.Unmount(ms[6].mnt, syscall.MNT_DETACH)
	if st := statCluster(t, ms[2], "d/n.bin"); st.UnreadableStripes == 0 {
		t.Errorf("stat on C with three members killed: %+v, want stripes past repair", st)
	}
	// A member that read or relayed a chunk lately may still serve it from
	// memory (rightly): the read gives EIO or the right bytes, never
	// others.
	start := time.Now()
	b, err := os.ReadFile(filepath.Join(ms[4].mnt, "d/n.bin"))
	switch {
	case err == nil && sha256.Sum256(b) != sum2:
		t.Fatal("d/n.bin read through E with three members killed: wrong bytes")
	case err == nil:
		t.Log("d/n.bin still read whole with three members killed: its lost chunks were in members' memory")
	case !strings.Contains(err.Error(), "input/output error"):
		t.Fatalf("read through E's mount with three members killed: %v, want EIO", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the read took %s", d)
	}
}

// TestClusterColdAfter: eight members, one started with --cold-after 5s
// and one that serves wrong bytes for every chunk (a liar). A file nobody
// read goes cold by itself (the liar's copies never enter a stripe: the
// converter checks every chunk it fetches); a file read through the
// first member's mount (the open notes the read: it counts until the end
// of the day) stays warm. The cold file reads byte-equal through another
// member's mount, the liar's shards caught and rebuilt from their stripes,
// and again with an honest member killed as well (two bad shards a
// stripe at most). serve refuses --cold-after without --listen.
func TestClusterColdAfter(t *testing.T) {
	requireFUSE(t)
	if out := refusedServe(t, "--cold-after", "1h"); !strings.Contains(out, "need a cluster") {
		t.Errorf("serve --cold-after without --listen: %s", out)
	}
	if out := refusedServe(t, "--cold-shards", "narrow=5"); !strings.Contains(out, "need a cluster") {
		t.Errorf("serve --cold-shards without --listen: %s", out)
	}
	if out := refusedServe(t, "--listen", "127.0.0.1:1", "--cold-shards", "narrow=4"); !strings.Contains(out, "cost 1.50x") {
		t.Errorf("serve --cold-shards narrow=4 (stripes of 1.5x): %s", out)
	}
	key := clusterKey(t)
	var ms []*member
	for i := range 8 {
		var join, extra, env []string
		switch i {
		case 0:
			extra = []string{"--cold-after", "5s", "--cold-shards", "narrow=5"}
		case 7:
			env = []string{"KYLIX_TEST_PEER_CORRUPT=1"}
		}
		if i > 0 {
			join = []string{ms[0].addr}
		}
		ms = append(ms, startMemberArgs(t, fmt.Sprintf("127.0.0.%d", 90+i), key, env, extra, join...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of the member with --cold-after:\n%s", ms[0].log)
		}
	})
	a, b, c, liar := ms[0], ms[1], ms[2], ms[7]
	src, sum := randomFile(t, 8<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "read.bin")
	if shaOn(t, a, filepath.Join(a.mnt, "read.bin")) != sum {
		t.Fatal("read.bin through A's mount differs from the source")
	}
	// 32 chunks of about 1 MiB: 6 stripes, each with one shard on the
	// liar, a data shard in all but certainly one of them.
	src2, sum2 := randomFile(t, 32<<20)
	mustKylix(t, "/", "import", "--data", a.data, src2, "unread.bin")
	// A path A's --cold-shards gives 5 data shards: its idle file goes
	// cold in stripes of 5+2, the rest in the default 6+2 (8 members).
	src3, sum3 := randomFile(t, 8<<20)
	mustKylix(t, "/", "import", "--data", a.data, src3, "narrow/x.bin")
	waitFor(t, membershipWait+30*time.Second, "unread.bin and narrow/x.bin cold by themselves", func() bool {
		return statCluster(t, a, "unread.bin").Stripes > 0 && statCluster(t, a, "narrow/x.bin").Stripes > 0
	})
	// The round logs what it did once it returns, after the manifests
	// changed: the log is polled.
	waitFor(t, nsWait, "A's log saying it coded stripes of 5+2 (narrow, --cold-shards) and 6+2 (the rest)", func() bool {
		var moved []string
		for _, l := range strings.Split(a.log.String(), "\n") {
			if strings.Contains(l, "cold-after: moved idle files to the cold tier") {
				moved = append(moved, l)
			}
		}
		m := strings.Join(moved, "\n")
		return strings.Contains(m, "5+2") && strings.Contains(m, "6+2")
	})
	if st := statCluster(t, a, "read.bin"); st.Stripes != 0 {
		t.Errorf("read.bin, read through A's mount today, went cold: %+v", st)
	}
	waitFor(t, 90*time.Second, "unread.bin's shards each held once", func() bool {
		st := statCluster(t, b, "unread.bin")
		var held int64
		for _, h := range st.Holders {
			held += h.Bytes
		}
		return st.ColdChunks == st.Chunks && st.DegradedStripes == 0 && held == st.Bytes
	})
	if shaOn(t, b, filepath.Join(b.mnt, "unread.bin")) != sum2 {
		t.Fatal("cold unread.bin through B's mount differs from the source")
	}
	if shaOn(t, b, filepath.Join(b.mnt, "narrow/x.bin")) != sum3 {
		t.Fatal("cold narrow/x.bin (5+2) through B's mount differs from the source")
	}
	if p := peersOf(t, b)[liar.addr[:strings.LastIndex(liar.addr, ":")]]; p.BadChunks == 0 {
		t.Errorf("B caught no bad chunk from the liar reading unread.bin: %+v", p)
	}
	ms[3].kill9()
	syscall.Unmount(ms[3].mnt, syscall.MNT_DETACH)
	if shaOn(t, c, filepath.Join(c.mnt, "unread.bin")) != sum2 {
		t.Fatal("cold unread.bin through C's mount with a member killed and the liar differs from the source")
	}
}
