package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBenchNodeMemoryAtRest measures a real node's memory against the
// files in its namespace (issue 20, item 1: "node memory at rest", goal
// ≤ 300 bytes a file at 1 000 000 files; docs/bench.md, "Node memory at
// rest and per known file"): `kylix serve` over a namespace of
// KYLIX_BENCH_TREE files (default 1 000 000, 1000 to a directory, built
// with no node running), its Go heap in use after a GC and its RSS as
// `kylix node --gc --json` reports them, compared with a node over an
// empty data directory: after the start (at rest: no file known to the
// kernel), after a walk that lstats every entry (every file an inode the
// kernel holds, and so a node the node keeps), and after the kernel
// dropped its dentries and inodes (drop_caches 2: FORGET for each), when
// the heap has settled.
//
//	KYLIX_BENCH=1 go test ./test -run 'TestBenchNodeMemoryAtRest$' -count=1 -v -timeout 30m
func TestBenchNodeMemoryAtRest(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	requireFUSE(t)
	n := envInt("KYLIX_BENCH_TREE", 1000000)
	base := t.TempDir()
	type mem struct {
		RSS  int64 `json:"rss_bytes"`
		Heap int64 `json:"heap_bytes"`
	}
	measure := func(data string) mem {
		var m mem
		if err := json.Unmarshal([]byte(mustKylix(t, base, "node", "--data", data, "--gc", "--json")), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	empty, emptyMnt := filepath.Join(base, "empty"), filepath.Join(base, "empty-mnt")
	e := launchNode(t, empty, emptyMnt, nil, nil)
	m0 := measure(empty)
	e.stop()

	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	mkTree(t, data, n, 1000)
	nd := launchNode(t, data, mnt, nil, nil)
	defer nd.stop()
	per := func(m mem) (float64, float64) {
		return float64(m.Heap-m0.Heap) / float64(n), float64(m.RSS-m0.RSS) / float64(n)
	}
	rest := measure(data)
	h, r := per(rest)
	t.Logf("empty node: heap %d, RSS %d", m0.Heap, m0.RSS)
	t.Logf("at rest over %d files: heap %d, RSS %d: %.0f B heap, %.0f B RSS a file more than the empty node", n, rest.Heap, rest.RSS, h, r)

	start := time.Now()
	walked := walkTree(t, filepath.Join(mnt, "bench"))
	after := measure(data)
	h, r = per(after)
	t.Logf("after a walk that lstats every entry (%.1f s): heap %d, RSS %d: %.0f B heap, %.0f B RSS a file", walked, after.Heap, after.RSS, h, r)

	// The kernel forgets what it no longer caches; its FORGETs arrive as
	// it evicts, so the heap is read until it stops falling.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0); err != nil {
		t.Fatalf("drop_caches: %v", err)
	}
	prev := after
	deadline := time.Now().Add(60 * time.Second)
	for {
		cur := measure(data)
		if cur.Heap >= prev.Heap-prev.Heap/100 || time.Now().After(deadline) {
			prev = cur
			break
		}
		prev = cur
	}
	h, r = per(prev)
	t.Logf("after the kernel dropped its inodes: heap %d, RSS %d: %.0f B heap, %.0f B RSS a file (%.0f s from the walk's start)", prev.Heap, prev.RSS, h, r, time.Since(start).Seconds())
}
