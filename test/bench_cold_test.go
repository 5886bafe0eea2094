package test

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBenchColdRead: a cold (erasure-coded) file read through a member's
// mount against the same size of file replicated, with real processes
// (issue 19, item 7; docs/bench.md, "A cold file read through a member,
// real processes"). Eight `kylix serve` processes on loopback (mutual TLS
// data plane, R = 2, --failure-grace 5m so no repair runs during the
// reads). Per round r, three files of KYLIX_BENCH_MIB MiB (default 256,
// random bytes) imported on the first member: warm/r.bin stays
// replicated, cold/r.bin and lost/r.bin are made cold (`kylix tier
// cold`: 6+2 stripes, every chunk then held once). Each read is the
// first of that file on its member (no member's memory holds its
// chunks), after the members' data files left the page cache (evictData:
// the programs' pages stay, as on a node that runs), timed from open to
// the last byte through the mount of member 1+r, and checked against the
// source's SHA-256 afterwards (untimed):
//
//   - replicated: warm/r.bin; cold: cold/r.bin (their order alternates
//     by round);
//   - 2 gone: two members killed (kill -9) after the healthy rounds, then
//     lost/r.bin (stripes that lost shards rebuilt on the fly).
//
// Before the rounds each reader reads a small file of its own, untimed
// (its connections set up). Medians of KYLIX_BENCH_REPS rounds (default
// 5, at most 5: the readers are members 1 to 5). Root (FUSE); behind
// KYLIX_BENCH=1. Each read logs what the reader fetched from whom. With KYLIX_BENCH_JSONL=FILE
// each read is appended to FILE as a JSON line. With KYLIX_BENCH_NETNS=RATE
// (tc's units: "10gbit") each member runs in its own network namespace
// behind a link of that rate each way (netns_test.go, netfaults_test.go),
// and KYLIX_BENCH_NETNS_DELAY (a netem delay: "100us") adds latency where
// the kernel has netem: the members then talk over veths and a bridge, not
// loopback.
func TestBenchColdRead(t *testing.T) {
	benchGate(t)
	requireFUSE(t)
	size := envInt("KYLIX_BENCH_MIB", 256) << 20
	reps := min(envInt("KYLIX_BENCH_REPS", 5), 5)
	key := clusterKey(t)
	grace := []string{"--failure-grace", "5m"}
	var ms []*member
	if rate := os.Getenv("KYLIX_BENCH_NETNS"); rate != "" {
		c := newNetnsCluster(t, 8)
		for i := range 8 {
			c.setFaults(i, linkFaults{rate: rate, delay: os.Getenv("KYLIX_BENCH_NETNS_DELAY"), burst: "8mb"})
			var join []int
			if i > 0 {
				join = []int{0}
			}
			ms = append(ms, c.start(i, key, grace, join...))
		}
		t.Logf("members in network namespaces, links of %s each way, delay %q", rate, os.Getenv("KYLIX_BENCH_NETNS_DELAY"))
	}
	for i := len(ms); i < 8; i++ {
		var join []string
		if i > 0 {
			join = []string{ms[0].addr}
		}
		ms = append(ms, startMemberArgs(t, fmt.Sprintf("127.0.0.%d", 90+i), key, nil, grace, join...))
	}
	waitFor(t, membershipWait, "eight alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 8 {
				return false
			}
		}
		return true
	})
	sums := map[string][32]byte{}
	for r := range reps {
		for _, dir := range []string{"warm", "cold", "lost"} {
			src, sum := randomFile(t, size)
			name := fmt.Sprintf("%s/%d.bin", dir, r)
			mustKylix(t, "/", "import", "--data", ms[0].data, src, name)
			sums[name] = sum
			require.NoError(t, os.Remove(src))
		}
	}
	for _, dir := range []string{"cold", "lost"} {
		out := mustKylix(t, "/", "tier", "--data", ms[0].data, "cold", dir)
		t.Logf("kylix tier cold %s: %s", dir, out)
	}
	// Placement done: no chunk under its copies, no stripe missing a
	// shard, and the cold files' chunks held once (the replicas beyond
	// each shard's home gone).
	waitFor(t, 5*time.Minute, "placement and the conversion settled (df on member 1)", func() bool {
		st := dfCluster(t, ms[1])
		return st.UnderChunks == 0 && st.DegradedStripes == 0 && st.ColdChunks > 0 && st.Stripes > 0
	})
	for name := range sums {
		if filepath.Dir(name) == "warm" {
			continue
		}
		waitFor(t, 5*time.Minute, name+" held once (the replicas beyond each shard's home dropped)", func() bool {
			st := statCluster(t, ms[1], name)
			var held int64
			for _, h := range st.Holders {
				held += h.Bytes
			}
			return st.ColdChunks == st.Chunks && held == st.Bytes
		})
	}
	for _, m := range ms[1:] {
		waitFor(t, nsWait, "the files in the mount of "+m.addr, visible(filepath.Join(m.mnt, fmt.Sprintf("lost/%d.bin", reps-1))))
	}

	var jl *os.File
	if p := os.Getenv("KYLIX_BENCH_JSONL"); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(t, err)
		defer f.Close()
		jl = f
	}
	rates := map[string][]float64{}
	var datas []string
	for _, m := range ms {
		datas = append(datas, m.data)
	}
	read := func(way string, r int, m *member, name string) {
		t.Helper()
		evictData(t, datas...)
		p := filepath.Join(m.mnt, name)
		before, pl0 := peersJSON(t, m)
		start := time.Now()
		f, err := os.Open(p)
		require.NoError(t, err)
		n, err := io.Copy(io.Discard, f)
		f.Close()
		d := time.Since(start)
		require.NoError(t, err, "%s through %s", name, m.addr)
		require.EqualValues(t, size, n)
		gbs := float64(n) / d.Seconds() / 1e9
		rates[way] = append(rates[way], gbs)
		// What the reader asked of whom, and the placement work it did
		// meanwhile: where a slow read's time went.
		after, pl1 := peersJSON(t, m)
		var from []string
		for name, a := range after {
			if b := before[name]; a.Fetched != b.Fetched || a.Errors != b.Errors {
				from = append(from, fmt.Sprintf("%s +%d chunks +%d errors", name, a.Fetched-b.Fetched, a.Errors-b.Errors))
			}
		}
		slices.Sort(from)
		t.Logf("%s round %d via %s: %.3f GB/s; placement pulled %d chunks meanwhile; fetched %v", way, r, m.addr, gbs, pl1.PulledChunks-pl0.PulledChunks, from)
		// Checked after the timed read (the bytes are in the page cache).
		require.Equal(t, sums[name], shaOn(t, m, p), "%s through %s: wrong bytes", name, m.addr)
		if jl != nil {
			b, _ := json.Marshal(map[string]any{"bench": "cold-read", "way": way, "round": r, "member": m.addr,
				"bytes": n, "seconds": d.Seconds(), "gb_s": gbs, "load": loadAvg()})
			fmt.Fprintln(jl, string(b))
		}
	}
	// Each reader's first read through its mount sets up its connections
	// to the members (and the members' to it): untimed, of a file of its
	// own, so that neither way pays it.
	for r := range reps {
		src, _ := randomFile(t, 8<<20)
		mustKylix(t, "/", "import", "--data", ms[0].data, src, fmt.Sprintf("prime/%d.bin", r))
		waitFor(t, nsWait, "prime file visible", visible(filepath.Join(ms[1+r].mnt, fmt.Sprintf("prime/%d.bin", r))))
		b, err := os.ReadFile(filepath.Join(ms[1+r].mnt, fmt.Sprintf("prime/%d.bin", r)))
		require.NoError(t, err)
		require.Len(t, b, 8<<20)
	}
	for r := range reps {
		m := ms[1+r]
		first, second := []string{"replicated", "warm"}, []string{"cold", "cold"}
		if r%2 == 1 {
			first, second = second, first
		}
		for _, w := range [][]string{first, second} {
			read(w[0], r, m, fmt.Sprintf("%s/%d.bin", w[1], r))
		}
	}
	for _, m := range ms[6:] {
		m.kill9()
		syscall.Unmount(m.mnt, syscall.MNT_DETACH)
	}
	for r := range reps {
		read("cold, 2 gone", r, ms[1+r], fmt.Sprintf("lost/%d.bin", r))
	}
	rep, cold, gone := median(rates["replicated"]), median(rates["cold"]), median(rates["cold, 2 gone"])
	t.Logf("GB/s, %d rounds of %d MiB: replicated %.3f, cold %.3f, cold 2 gone %.3f", reps, size>>20, rates["replicated"], rates["cold"], rates["cold, 2 gone"])
	t.Logf("| %d MiB through a member's mount, its data out of the page cache | replicated %.3f GB/s | cold %.3f (%.2fx) | cold, 2 members gone %.3f (%.2fx) |",
		size>>20, rep, cold, cold/rep, gone, gone/rep)
}

// evictData drops the page cache of every file under dirs (the members'
// packs and indexes: posix_fadvise DONTNEED after a sync), leaving the
// programs' own pages, which a full drop would make every process fault
// back in from the disk during the next timed read: a cold read of data,
// as a user meets it, not of the binaries.
func evictData(t *testing.T, dirs ...string) {
	t.Helper()
	unix.Sync()
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil // a file removed meanwhile, a socket: nothing cached
			}
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		})
		require.NoError(t, err)
	}
}
