package test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The swarm start benchmark of issue 9, deliverable 8 (docs/bench.md,
// "Peers: eight members start one model at once"): eight real `kylix
// serve` processes on 127.0.0.40..47 (R = 2, mutual TLS), a model imported
// on one and placed, the peer caches emptied, then
// all eight read the whole model through their mounts at once, against,
// on a cluster set up the same way, one member reading it alone. Bytes
// that left the members' packs during the read (bytes_served_from_packs
// of `kylix peers --json`, summed) / model size, and the time until every
// reader finished. Runs interleaved, medians.
//
//	KYLIX_BENCH=1 go test ./test -run 'TestBenchSwarm8$' -count=1 -v -timeout 60m
//
// KYLIX_BENCH_SWARM_MIB sets the model's size (default 256, four files),
// KYLIX_BENCH_REPS the pairs of runs (default 3); KYLIX_BENCH_DEBUG=1 logs
// every member's `kylix peers` after each read.

// stopAll stops the nodes at once (one SIGTERM each: a second one makes a
// node exit at once) and waits for them: members stopped one by one would
// pull the chunks of those that left before them.
func stopAll(t *testing.T, ms []*member) {
	t.Helper()
	for _, m := range ms {
		m.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, m := range ms {
		done := make(chan error, 1)
		go func() { done <- m.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v: %s", m.addr, err, m.log)
			}
		case <-time.After(30 * time.Second):
			m.cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop: %s", m.addr, m.log)
		}
		if isMounted(m.mnt) {
			syscall.Unmount(m.mnt, syscall.MNT_DETACH)
			t.Errorf("%s still mounted after the node stopped", m.mnt)
		}
	}
}

// settled: every member sees n members alive, and its last placement pass,
// over all n, left none of the chunks it owns missing.
func settled(t *testing.T, ms []*member, files []string) func() bool {
	return func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != len(ms) {
				return false
			}
			if _, pl := peersJSON(t, m); pl.Passes == 0 || pl.OwnedMissing != 0 || pl.Members != len(ms) {
				return false
			}
			for _, f := range files {
				if !visible(filepath.Join(m.mnt, f))() {
					return false
				}
			}
		}
		return true
	}
}

// selfCPU is this process's user + system CPU seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func TestBenchSwarm8(t *testing.T) {
	benchGate(t)
	size := int64(envInt("KYLIX_BENCH_SWARM_MIB", 256)) << 20
	reps := envInt("KYLIX_BENCH_REPS", 3)
	const nfiles = 4
	src := modelFiles(t, filepath.Join(t.TempDir(), "model"), nfiles, size)
	var files []string
	for _, p := range src {
		files = append(files, "model/"+filepath.Base(p))
	}
	key := clusterKey(t)
	var ips []string
	for i := range 8 {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", 40+i))
	}

	// cluster starts eight members, imports the model on the first (push
	// on import sends each chunk to its two owners) and waits for
	// placement.
	cluster := func() []*member {
		ms := []*member{startMember(t, ips[0], key, nil)}
		for _, ip := range ips[1:] {
			ms = append(ms, startMember(t, ip, key, nil, ms[0].addr))
		}
		for _, m := range ms {
			waitFor(t, membershipWait, "eight alive members", func() bool { return aliveCount(t, m) == 8 })
		}
		for i, p := range src {
			mustKylix(t, "/", "import", "--data", ms[0].data, p, files[i])
		}
		waitFor(t, 5*time.Minute, "placement over eight members", settled(t, ms, files))
		return ms
	}
	readAll := func(m *member) error {
		for _, f := range files {
			r, err := os.Open(filepath.Join(m.mnt, f))
			if err != nil {
				return err
			}
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, make([]byte, 1<<20))
			r.Close()
			if err != nil {
				return fmt.Errorf("%s through %s's mount: %w", f, m.addr, err)
			}
			if want := size / nfiles; n != want {
				return fmt.Errorf("%s through %s's mount: %d bytes, want %d", f, m.addr, n, want)
			}
		}
		return nil
	}
	type run struct {
		ratio float64
		took  time.Duration
		perGB float64
	}
	results := map[string][]run{}
	for rep := range reps {
		for _, mode := range []string{"8 at once", "1 alone"} {
			ms := cluster()
			readers := ms
			if mode == "1 alone" {
				readers = ms[1:2] // not the member that imported
			}
			// Placement pulls (a pass that ran before a push arrived) go
			// through relays, which keep the chunks in their peer caches:
			// their files are deleted, so every reader starts cold (a
			// cached chunk whose file is gone is a miss).
			cached := 0
			for _, m := range ms {
				des, _ := os.ReadDir(filepath.Join(m.data, "peer-cache"))
				for _, de := range des {
					require.NoError(t, os.Remove(filepath.Join(m.data, "peer-cache", de.Name())))
					cached++
				}
			}
			load := loadAvg()
			packs0 := packBytes(t, ms)
			var cpu0 float64
			for _, m := range ms {
				cpu0 += cpuOf(t, m.cmd.Process.Pid)
			}
			self0 := selfCPU()
			start := time.Now()
			var wg sync.WaitGroup
			errs := make([]error, len(readers))
			for i, m := range readers {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = readAll(m) }()
			}
			wg.Wait()
			took := time.Since(start)
			cpu := selfCPU() - self0 // the readers (this process's goroutines)
			for _, m := range ms {
				cpu += cpuOf(t, m.cmd.Process.Pid)
			}
			cpu -= cpu0
			for _, err := range errs {
				require.NoError(t, err)
			}
			ratio := float64(packBytes(t, ms)-packs0) / float64(size)
			if os.Getenv("KYLIX_BENCH_DEBUG") != "" {
				for _, m := range ms {
					t.Logf("%s: %s", m.addr, mustKylix(t, "/", "peers", "--data", m.data))
				}
			}
			// CPU seconds per GB delivered to the readers, all members and
			// readers together: cores per GB/s of loading.
			perGB := cpu / (float64(size*int64(len(readers))) / 1e9)
			results[mode] = append(results[mode], run{ratio, took, perGB})
			t.Logf("%s #%d: model %d MiB, bytes leaving the holders' packs / model %.2f, all read in %v, %.2f cores/(GB/s) delivered; %d chunks emptied from peer caches before; load %s",
				mode, rep+1, size>>20, ratio, took.Round(time.Millisecond), perGB, cached, load)
			stopAll(t, ms)
			for _, m := range ms {
				os.RemoveAll(filepath.Dir(m.data))
			}
		}
	}
	medians := map[string]float64{}
	for _, mode := range []string{"8 at once", "1 alone"} {
		var rs, ts, cs []float64
		var rall, tall, call []string
		for _, r := range results[mode] {
			rs, ts, cs = append(rs, r.ratio), append(ts, r.took.Seconds()), append(cs, r.perGB)
			rall, tall = append(rall, fmt.Sprintf("%.2f", r.ratio)), append(tall, fmt.Sprintf("%.2f", r.took.Seconds()))
			call = append(call, fmt.Sprintf("%.2f", r.perGB))
		}
		t.Logf("| %s | %.2f (%s) | %.2f s (%s) | %.2f (%s) |", mode, median(rs), strings.Join(rall, ", "), median(ts), strings.Join(tall, ", "),
			median(cs), strings.Join(call, ", "))
		medians[mode] = median(ts)
	}
	t.Logf("time for eight at once / one alone: %.2f", medians["8 at once"]/medians["1 alone"])
}
