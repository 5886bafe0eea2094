package test

import (
	"os"
	"path/filepath"
	"testing"
)

// The read-only mount against the read-write one and ext4 on many small
// files (issue 20, item 1; docs/bench.md, "Small files and listings
// through the mount"), side by side in one run: KYLIX_BENCH_SMALL files of
// 4-64 KiB (default 10 000) read with open+read+close, warm (after a
// warm-up pass) and on the first pass after a node start, medians of
// KYLIX_BENCH_REPS (default 3), the sides interleaved.
//
//	KYLIX_BENCH=1 go test ./test -run 'TestBenchSmallFilesReadOnly$' -count=1 -v
func TestBenchSmallFilesReadOnly(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	requireFUSE(t)
	nSmall, reps := envInt("KYLIX_BENCH_SMALL", 10000), envInt("KYLIX_BENCH_REPS", 3)
	base := t.TempDir()
	src := filepath.Join(base, "small")
	writeSmallFiles(t, src, nSmall, 20)
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	mustKylix(t, base, "import", "--data", data, src, "small")
	msrc := filepath.Join(mnt, "small")
	start := func(ro bool) *node {
		if ro {
			return launchNode(t, data, mnt, nil, nil, "--read-only")
		}
		return startNode(t, data, mnt)
	}
	var ext4, rw, ro, rwFirst, roFirst []float64
	readTree(t, src)
	for range reps {
		ext4 = append(ext4, readTree(t, src))
		for _, readOnly := range []bool{false, true} {
			n := start(readOnly)
			first := readTree(t, msrc)
			readTree(t, msrc)
			warm := readTree(t, msrc)
			n.stop()
			if readOnly {
				ro, roFirst = append(ro, warm), append(roFirst, first)
			} else {
				rw, rwFirst = append(rw, warm), append(rwFirst, first)
			}
		}
	}
	e := median(ext4)
	t.Logf("files/s: ext4 %v; read-write mount warm %v, first %v; read-only mount warm %v, first %v", ext4, rw, rwFirst, ro, roFirst)
	t.Logf("| %d small files, open+read+close, warm | read-write %.0f (%.2fx) | read-only %.0f (%.2fx) | ext4 %.0f |", nSmall, median(rw), median(rw)/e, median(ro), median(ro)/e, e)
	t.Logf("| same, first pass after a node start | read-write %.0f (%.2fx) | read-only %.0f (%.2fx) | |", median(rwFirst), median(rwFirst)/e, median(roFirst), median(roFirst)/e)
}
