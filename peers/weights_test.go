package peers

import (
	"bytes"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func names(ps []peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.name)
	}
	return out
}

// TestByWeight: the order byWeight gives, case by case.
func TestByWeight(t *testing.T) {
	ps := []peer{{name: "a"}, {name: "b"}, {name: "c"}}
	now := time.Unix(1000, 0)
	const mb = 1 << 20
	cases := []struct {
		what  string
		views []weightView
		prior float64 // 0: the mean of views
		want  []string
	}{
		{"none measured: the given order", []weightView{{}, {}, {}}, 0, []string{"a", "b", "c"}},
		{"the fastest first", []weightView{{bps: 10 * mb}, {bps: 100 * mb}, {bps: 50 * mb}}, 0, []string{"b", "c", "a"}},
		{"in flight counts: 100 MB/s with 3 in flight after 50 MB/s idle",
			[]weightView{{bps: 10 * mb}, {bps: 100 * mb, inflight: 3}, {bps: 50 * mb}}, 0, []string{"c", "b", "a"}},
		{"unmeasured at the mean of the measured (55 MB/s): tried before the slow one",
			[]weightView{{bps: 10 * mb}, {bps: 100 * mb}, {}}, 0, []string{"b", "c", "a"}},
		{"a member that failed just now sinks",
			[]weightView{{bps: 100 * mb, fail: 0.25, lastFail: now}, {bps: 20 * mb}, {bps: 10 * mb}}, 0, []string{"b", "c", "a"}},
		{"an old failure weighs little (5 half-lives)",
			[]weightView{{bps: 100 * mb, fail: 0.25, lastFail: now.Add(-5 * failHalfLife)}, {bps: 20 * mb}, {bps: 10 * mb}}, 0, []string{"a", "b", "c"}},
		{"ties keep the given order", []weightView{{bps: mb}, {bps: mb}, {bps: mb}}, 0, []string{"a", "b", "c"}},
		{"one slow member measured among unmeasured ones: the prior (the mean of every member measured) puts it last",
			[]weightView{{bps: mb}, {}, {}}, 50 * mb, []string{"b", "c", "a"}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, names(byWeight(ps, c.views, c.prior, now)), c.what)
	}
}

// TestWeightMeasures: answers set the moving averages; failures raise the
// failure rate, answers lower it.
func TestWeightMeasures(t *testing.T) {
	var w weight
	w.answered(1<<20, time.Second)
	v := w.view()
	require.InDelta(t, 1<<20, v.bps, 1)
	require.InDelta(t, 1.0, v.latency, 1e-9)
	w.answered(4<<20, time.Second) // 0.75 * 1 MiB/s + 0.25 * 4 MiB/s
	require.InDelta(t, 1.75*(1<<20), w.view().bps, 1)
	now := time.Now()
	w.failed(now)
	require.InDelta(t, weightAlpha, w.view().recentFail(now), 1e-9)
	require.InDelta(t, weightAlpha/2, w.view().recentFail(now.Add(failHalfLife)), 1e-9)
	w.answered(1<<20, time.Second)
	require.Less(t, w.view().fail, weightAlpha)
	require.EqualValues(t, 3, w.view().samples)
}

// slowCluster starts three holders, one serving at 2 MiB/s, and a reader
// (four replicas over four members: every member owns every chunk, so the
// reader asks the three holders directly, no relay, in the order of their
// measured throughput).
func slowCluster(t *testing.T) (rd *testNode, holders []*testNode) {
	key, _ := NewKey()
	cfg := func(name string, join ...string) Config {
		return Config{Name: name, Key: key, Join: join, Replicas: 4}
	}
	f1, err := startNodeCfg(t, cfg("fast1"))
	require.NoError(t, err)
	f2, err := startNodeCfg(t, cfg("fast2", f1.cfg.Listen))
	require.NoError(t, err)
	sc := cfg("slow", f1.cfg.Listen)
	sc.ServeRate = 2 << 20
	slow, err := startNodeCfg(t, sc)
	require.NoError(t, err)
	rc := cfg("reader", f1.cfg.Listen)
	rc.NoPlacement = true
	rd, err = startNodeCfg(t, rc)
	require.NoError(t, err)
	eventually(t, "four alive members", func() bool { return len(rd.livePeers()) == 3 })
	return rd, []*testNode{f1, f2, slow}
}

// TestFetchPrefersFastHolders: three members hold a file, one of them
// serving at 2 MiB/s. A fourth reads it: most chunks come from the two fast
// ones, the bytes are right, and every holder was measured.
func TestFetchPrefersFastHolders(t *testing.T) {
	rd, holders := slowCluster(t)
	data := randBytes(32 << 20)
	for _, n := range holders {
		importBytes(t, n, "f", data) // same content: the same chunks on each
	}
	eventually(t, "f on reader", func() bool { _, err := rd.s.Lookup("f"); return err == nil })
	f, _, err := rd.s.OpenPath("f")
	require.NoError(t, err)
	chunks := int64(len(f.M.Chunks))

	got, err := readAll(rd, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data), "bytes read differ from the source")

	fast := rd.statsFor("fast1").Fetched.Load() + rd.statsFor("fast2").Fetched.Load()
	slowN := rd.statsFor("slow").Fetched.Load()
	t.Logf("%d chunks: fast members sent %d, the slow one %d", chunks, fast, slowN)
	for _, m := range rd.Members() {
		t.Logf("%s: %+v", m.Name, m.Throughput)
	}
	require.Equal(t, chunks, fast+slowN, "each chunk fetched once")
	require.LessOrEqual(t, slowN*4, chunks, "the slow member sent more than a quarter of the chunks")
	for _, name := range []string{"fast1", "fast2", "slow"} {
		tp := rd.statsFor(name).weight.throughput()
		require.Positive(t, tp.Samples, "%s never measured", name)
		require.Zero(t, tp.InFlight, "%s: requests left counted in flight", name)
	}
	require.Less(t, rd.statsFor("slow").weight.view().bps, rd.statsFor("fast1").weight.view().bps)
}

// TestFetchWeightsBench (KYLIX_BENCH_WEIGHTS=1): the reader of
// slowCluster reads 32 MiB files (each new, cold) with holders chosen by
// measured throughput and, alternately, in the fixed order (owners by
// rendezvous: the slow member first for a third of the chunks); medians
// of 3.
func TestFetchWeightsBench(t *testing.T) {
	if os.Getenv("KYLIX_BENCH_WEIGHTS") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH_WEIGHTS=1")
	}
	rd, holders := slowCluster(t)
	var with, without []time.Duration
	var slowWith, slowWithout int64
	for i, weighted := range []bool{true, false, false, true, true, false} {
		data := randBytes(32 << 20)
		name := "f" + strconv.Itoa(i)
		for _, n := range holders {
			importBytes(t, n, name, data)
		}
		eventually(t, name+" on reader", func() bool { _, err := rd.s.Lookup(name); return err == nil })
		fixedOrder.Store(!weighted)
		before := rd.statsFor("slow").Fetched.Load()
		start := time.Now()
		got, err := readAll(rd, name)
		d := time.Since(start)
		fixedOrder.Store(false)
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, data))
		slowN := rd.statsFor("slow").Fetched.Load() - before
		if weighted {
			with, slowWith = append(with, d), slowWith+slowN
		} else {
			without, slowWithout = append(without, d), slowWithout+slowN
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	t.Logf("32 MiB from 3 holders, one at 2 MiB/s: by measured throughput %v (runs %v, %d chunks from the slow one in all); fixed order %v (runs %v, %d from the slow one)",
		med(with), with, slowWith, med(without), without, slowWithout)
}

// TestSlowListener: the test hook delays what a member sends by
// ServeDelay, in order, and limits it to ServeRate.
func TestSlowListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &slowListener{Listener: raw, rate: 8 << 20, delay: 50 * time.Millisecond}
	defer l.Close()
	payload := randBytes(1 << 20)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("abc"))
		c.Write(payload)
	}()
	c, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	got := make([]byte, 3+len(payload))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	d := time.Since(start)
	require.Equal(t, "abc", string(got[:3]))
	require.True(t, bytes.Equal(payload, got[3:]))
	// 1 MiB at 8 MiB/s: 125 ms, plus the 50 ms delay.
	require.GreaterOrEqual(t, d, 170*time.Millisecond)
}
