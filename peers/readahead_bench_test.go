package peers

import (
	"bytes"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// readerNode is a member that only reads, with the given read-ahead.
func readerNode(t *testing.T, cfg Config, readAhead int) *testNode {
	t.Helper()
	cfg.Listen, cfg.Capacity, cfg.NoPlacement = freeAddr(t), 1<<30, true
	n, err := New(cfg)
	require.NoError(t, err)
	s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir(), Fetcher: n, CacheBytes: 256 << 20, ReadAheadChunks: readAhead})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, n.Start(s, nil))
	t.Cleanup(func() { n.Close() })
	return &testNode{n, s}
}

// TestReadAheadFarMemberBench (KYLIX_BENCH_READAHEAD=1): File.ReadAt in
// 1 MiB steps from start to end (a reader without the mount's prefetch:
// the library, kylix warm) of 64 MiB files held only on a member whose
// answers arrive KYLIX_BENCH_DELAY later (default 20ms), by one reader
// with read-ahead (the default window) and one without, each file cold on
// each, interleaved; medians of 5.
func TestReadAheadFarMemberBench(t *testing.T) {
	if os.Getenv("KYLIX_BENCH_READAHEAD") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH_READAHEAD=1")
	}
	delay := 20 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv("KYLIX_BENCH_DELAY")); err == nil {
		delay = d
	}
	key, _ := NewKey()
	// Three replicas over three members: each owns every chunk, so the
	// readers ask the holder directly (no relay, no peer cache).
	a, err := startNodeCfg(t, Config{Name: "holder", Key: key, Replicas: 3, ServeDelay: delay})
	require.NoError(t, err)
	on := readerNode(t, Config{Name: "on", Key: key, Join: []string{a.cfg.Listen}, Replicas: 3}, 0)
	off := readerNode(t, Config{Name: "off", Key: key, Join: []string{a.cfg.Listen}, Replicas: 3}, -1)
	eventually(t, "three alive members", func() bool { return len(on.livePeers()) == 2 && len(off.livePeers()) == 2 })

	const size = 64 << 20
	var ton, toff []time.Duration
	// Each file is read by one reader only: a reader that read a file
	// serves it from memory, so the other would not fetch it from afar.
	for i, r := range []*testNode{on, off, off, on, on, off, off, on, on, off} {
		data := randBytes(size)
		name := "f" + strconv.Itoa(i)
		importBytes(t, a, name, data)
		eventually(t, name+" on the reader", func() bool { _, err := r.s.Lookup(name); return err == nil })
		f, _, err := r.s.OpenPath(name)
		require.NoError(t, err)
		buf := make([]byte, size)
		start := time.Now()
		for off := int64(0); off < size; off += 1 << 20 {
			_, err := f.ReadAt(buf[off:off+1<<20], off)
			require.NoError(t, err)
		}
		d := time.Since(start)
		require.True(t, bytes.Equal(buf, data))
		if r == on {
			ton = append(ton, d)
		} else {
			toff = append(toff, d)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	mibs := func(d time.Duration) float64 { return 64 / d.Seconds() }
	t.Logf("64 MiB by ReadAt, 1 MiB steps, holder %v away: read-ahead on %v (%.0f MiB/s) runs %v; off %v (%.0f MiB/s) runs %v; read ahead: %d chunks",
		delay, med(ton), mibs(med(ton)), ton, med(toff), mibs(med(toff)), toff, on.s.Counters().ReadAheadChunks)
	t.Logf("holder as the reader with read-ahead measured it: %+v", on.statsFor("holder").weight.throughput())
}
