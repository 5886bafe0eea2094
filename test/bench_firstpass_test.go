package test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
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
	if baseBin != "" {
		abs, err := filepath.Abs(baseBin)
		if err != nil {
			t.Fatalf("KYLIX_BENCH_BASE_BIN: %v", err)
		}
		baseBin = abs
	}
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
	// Where a first pass goes: each listing and file timed (one more
	// start, and the same walk over ext4 and the warm mount beside it).
	n := launchNode(t, data, mnt, nil, nil, "--read-only")
	t.Logf("timed first pass: %v", readTreeTimed(t, msrc))
	t.Logf("timed warm pass:  %v", readTreeTimed(t, msrc))
	n.stop()
	t.Logf("timed ext4 pass:  %v", readTreeTimed(t, src))
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

// passTimes is where one pass of readTreeTimed spent its time.
type passTimes struct {
	files              int
	total, listing     time.Duration
	fast, mid, slow    int           // files under 30 µs, 30-100 µs, over
	fastT, midT, slowT time.Duration // and their time
	firstOfDir         time.Duration // the first file of each directory
}

func (p passTimes) String() string {
	return fmt.Sprintf("%d files in %v: listings %v; first file of each directory %v; files <30µs %d (%v), 30-100µs %d (%v), >100µs %d (%v)",
		p.files, p.total.Round(time.Millisecond), p.listing.Round(time.Millisecond), p.firstOfDir.Round(time.Millisecond),
		p.fast, p.fastT.Round(time.Millisecond), p.mid, p.midT.Round(time.Millisecond), p.slow, p.slowT.Round(time.Millisecond))
}

// readTreeTimed reads dir as readTree does (directories in name order,
// each listed whole, then its files open+read+close), timing each listing
// and each file.
func readTreeTimed(t *testing.T, dir string) passTimes {
	t.Helper()
	var p passTimes
	start := time.Now()
	var walk func(d string)
	walk = func(d string) {
		t0 := time.Now()
		ents, err := os.ReadDir(d)
		p.listing += time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		first := true
		for _, e := range ents {
			path := filepath.Join(d, e.Name())
			if e.IsDir() {
				walk(path)
				continue
			}
			t1 := time.Now()
			b, err := os.ReadFile(path)
			el := time.Since(t1)
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v", path, err)
			}
			p.files++
			if first {
				p.firstOfDir += el
				first = false
			}
			switch {
			case el < 30*time.Microsecond:
				p.fast++
				p.fastT += el
			case el < 100*time.Microsecond:
				p.mid++
				p.midT += el
			default:
				p.slow++
				p.slowT += el
			}
		}
	}
	walk(dir)
	p.total = time.Since(start)
	return p
}
