package test

import (
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// readAheadOut is `kylix peers --json`'s read_ahead, with each member's
// measured throughput.
type readAheadOut struct {
	ReadAhead struct {
		Window int   `json:"window_chunks"`
		Chunks int64 `json:"chunks"`
		Bytes  int64 `json:"bytes"`
	} `json:"read_ahead"`
	Members []struct {
		Name       string `json:"name"`
		Fetched    int64  `json:"chunks_fetched"`
		Throughput struct {
			BytesPerSec int64 `json:"bytes_per_sec"`
			Samples     int64 `json:"samples"`
		} `json:"throughput"`
	} `json:"members"`
}

func readAheadOf(t *testing.T, m *member) readAheadOut {
	t.Helper()
	var out readAheadOut
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// writeThrough writes src into a mount at p (mount writes are not pushed to
// the owners: the file stays on the writer until placement pulls it).
func writeThrough(t *testing.T, src, p string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// seqSHA reads p from start to end in 1 MiB reads and returns its
// SHA-256 and how long the read took.
func seqSHA(t *testing.T, m *member, p string) ([32]byte, time.Duration) {
	t.Helper()
	start := time.Now()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		t.Fatalf("read %s: %v\nnode log:\n%s", p, err, m.log)
	}
	return [32]byte(h.Sum(nil)), time.Since(start)
}

// TestClusterReadAhead: a file written on A (and held only there: B's
// placement pulls at most a chunk, --repair-rate 1) reads byte-equal
// through B's mount, and B's counters show the chunks fetched ahead of
// the reader; `kylix peers` shows A's measured throughput.
func TestClusterReadAhead(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.60", key, nil)
	b := startMemberArgs(t, "127.0.0.61", key, nil, []string{"--repair-rate", "1"}, a.addr)
	waitFor(t, membershipWait, "two alive members seen by B", func() bool { return aliveCount(t, b) == 2 })

	src, sum := randomFile(t, 48<<20+777)
	writeThrough(t, src, filepath.Join(a.mnt, "models", "ra.bin"))
	onB := filepath.Join(b.mnt, "models", "ra.bin")
	waitFor(t, nsWait, "models/ra.bin in B's mount", visible(onB))
	if got, _ := seqSHA(t, b, onB); got != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
	out := readAheadOf(t, b)
	t.Logf("B: %+v", out)
	if out.ReadAhead.Window != 16 {
		t.Errorf("read-ahead window %d chunks, want the default 16", out.ReadAhead.Window)
	}
	// About 48 chunks; all but the first and the one placement may have
	// pulled are fetched ahead (some may be read by the kernel's own
	// readahead first: at least half).
	if out.ReadAhead.Chunks < 24 {
		t.Errorf("B fetched %d chunks ahead of the reader, want at least 24: %+v", out.ReadAhead.Chunks, out)
	}
	var fromA int64
	for _, m := range out.Members {
		if m.Name == "127.0.0.60" {
			fromA = m.Fetched
			if m.Throughput.Samples == 0 || m.Throughput.BytesPerSec <= 0 {
				t.Errorf("A's throughput not measured: %+v", m)
			}
		}
	}
	if fromA < 30 {
		t.Errorf("B fetched %d chunks from A, want nearly all of the file's (about 45)", fromA)
	}
	if txt := mustKylix(t, "/", "peers", "--data", b.data); !strings.Contains(txt, "read-ahead: window 16 chunks") ||
		!strings.Contains(txt, "throughput ") {
		t.Errorf("kylix peers:\n%s", txt)
	}
}

// TestClusterReadAheadBench (KYLIX_BENCH_READAHEAD=1): sequential reads
// through the mount of 64 MiB files held only on A, by B (read-ahead on,
// the default) and C (--read-ahead 0), each file read cold by one of them,
// interleaved; medians of 5. KYLIX_BENCH_DELAY=20ms delays A's answers.
func TestClusterReadAheadBench(t *testing.T) {
	if os.Getenv("KYLIX_BENCH_READAHEAD") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH_READAHEAD=1")
	}
	requireFUSE(t)
	key := clusterKey(t)
	// Three replicas: every member owns every chunk, so no relay and no
	// peer cache; --repair-rate 1: placement pulls at most a chunk.
	common := []string{"--replicas", "3", "--repair-rate", "1"}
	// KYLIX_BENCH_DELAY (a duration): A's answers arrive that much later
	// (KYLIX_TEST_PEER_DELAY), as from a distant member.
	var env []string
	if d := os.Getenv("KYLIX_BENCH_DELAY"); d != "" {
		env = []string{"KYLIX_TEST_PEER_DELAY=" + d}
	}
	a := startMemberArgs(t, "127.0.0.62", key, env, common)
	b := startMemberArgs(t, "127.0.0.63", key, nil, common, a.addr)
	c := startMemberArgs(t, "127.0.0.64", key, nil, append([]string{"--read-ahead", "0"}, common...), a.addr)
	waitFor(t, membershipWait, "three alive members", func() bool { return aliveCount(t, b) == 3 && aliveCount(t, c) == 3 })
	// Each file is read by one reader only: a reader that read a file
	// serves it from memory, so the other would not fetch it from A.
	var on, off []time.Duration
	for i, m := range []*member{b, c, c, b, b, c, c, b, b, c} {
		src, sum := randomFile(t, 64<<20)
		name := filepath.Join("bench", "f"+string(rune('0'+i))+".bin")
		writeThrough(t, src, filepath.Join(a.mnt, name))
		waitFor(t, nsWait, name+" in the reader's mount", visible(filepath.Join(m.mnt, name)))
		got, d := seqSHA(t, m, filepath.Join(m.mnt, name))
		if got != sum {
			t.Fatal("bytes differ from the source")
		}
		if m == b {
			on = append(on, d)
		} else {
			off = append(off, d)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	mbps := func(d time.Duration) float64 { return 64 / d.Seconds() }
	t.Logf("64 MiB sequential read through the mount, held on another member (delay %q): read-ahead on %v (%.0f MiB/s) runs %v; off %v (%.0f MiB/s) runs %v",
		os.Getenv("KYLIX_BENCH_DELAY"), med(on), mbps(med(on)), on, med(off), mbps(med(off)), off)
	t.Logf("B read ahead: %+v; C: %+v", readAheadOf(t, b).ReadAhead, readAheadOf(t, c).ReadAhead)
}
