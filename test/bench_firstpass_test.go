package test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Where the first pass after a node start spends its time (issue 20,
// item 1; docs/bench.md, "The first pass after a node start"): the
// small-files tree of TestBenchSmallFilesReadOnly read once after a start
// of a read-only node, with a CPU profile of the node written to
// KYLIX_BENCH_PROFILE (when set) and, with KYLIX_BENCH_OPS=1, a second
// first pass under --debug that counts the FUSE requests by opcode.
//
//	KYLIX_BENCH=1 KYLIX_BENCH_PROFILE=/tmp/first.prof go test ./test -run 'TestBenchFirstPass$' -count=1 -v
func TestBenchFirstPass(t *testing.T) {
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
	readTree(t, src)
	// KYLIX_BENCH_BASE_BIN: another build of kylix, whose first pass is
	// measured in the same run, interleaved (before/after a change).
	baseBin := os.Getenv("KYLIX_BENCH_BASE_BIN")
	var ext4, first, baseFirst []float64
	for range reps {
		ext4 = append(ext4, readTree(t, src))
		if baseBin != "" {
			mine := kylixBin
			kylixBin = baseBin
			n := launchNode(t, data, mnt, nil, nil, "--read-only")
			baseFirst = append(baseFirst, readTree(t, msrc))
			n.stop()
			kylixBin = mine
		}
		n := launchNode(t, data, mnt, nil, nil, "--read-only")
		first = append(first, readTree(t, msrc))
		st := regexp.MustCompile(`"(daemon_reads|prefetched_files)": *\d+`).FindAllString(mustKylix(t, base, "node", "--data", data, "--json"), -1)
		t.Logf("after the pass: %v", st)
		n.stop()
	}
	t.Logf("files/s: ext4 %v; read-only first pass %v (median %.0f, %.2fx)", ext4, first, median(first), median(first)/median(ext4))
	if baseBin != "" {
		t.Logf("files/s: read-only first pass of %s %v (median %.0f, %.2fx)", baseBin, baseFirst, median(baseFirst), median(baseFirst)/median(ext4))
	}
	// The listing alone after a start: a walk that lstats every entry.
	var list []float64
	for range reps {
		n := launchNode(t, data, mnt, nil, nil, "--read-only")
		list = append(list, walkTree(t, msrc))
		n.stop()
	}
	t.Logf("walk with lstat of the same tree after a start, s: %v (median %.3f)", list, median(list))
	if p := os.Getenv("KYLIX_BENCH_PROFILE"); p != "" {
		n := launchNode(t, data, mnt, []string{"KYLIX_CPUPROFILE=" + p}, nil, "--read-only")
		t.Logf("profiled first pass: %.0f files/s", readTree(t, msrc))
		n.stop()
	}
	if os.Getenv("KYLIX_BENCH_OPS") == "1" {
		n := launchNode(t, data, mnt, nil, nil, "--read-only", "--debug")
		readTree(t, msrc)
		n.stop()
		ops := map[string]int{}
		re := regexp.MustCompile(`rx \d+: ([A-Z_]+)`)
		for _, m := range re.FindAllStringSubmatch(n.log.String(), -1) {
			ops[m[1]]++
		}
		var names []string
		for k := range ops {
			names = append(names, k)
		}
		sort.Strings(names)
		var b strings.Builder
		for _, k := range names {
			fmt.Fprintf(&b, "%s=%d ", k, ops[k])
		}
		t.Logf("FUSE requests in a first pass of %d files: %s", nSmall, b.String())
	}
}
