package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// dropPageCache writes back dirty pages and drops the page cache (root).
func dropPageCache(t *testing.T) {
	t.Helper()
	exec.Command("sync").Run()
	require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200))
}

// TestBenchLoadKeepNetns: the first start of a model on a member that
// lacks it, and the next start there (issue 22, item 6). Four members in
// network namespaces: three holders (R = 3, TLS data plane), a reader in
// n3 that owns nothing. Each round, side by side:
//
//   - first start, keep: a fresh reader's `kylix load` of the model
//     (every chunk fetched from the holders, a copy kept behind the load);
//   - first start, --no-keep: the same on another fresh reader, keeping
//     nothing;
//   - the ceiling: test/ceiling's TLS 1.3 + BLAKE3 receiver of the same
//     files from three servers in the holders' namespaces;
//   - next start: the first reader stopped, the page cache dropped, the
//     reader started again on its store, and the model loaded again (every
//     chunk from its copy, cold);
//   - the disk: `kylix bench-read` (O_DIRECT) of the copy's files after a
//     page cache drop.
//
// Loads go into the host test device (--verify-on cpu). On this machine
// (a VM that hands freed memory back to its host) the first touch of a
// page costs about 14 us, so the node's first load into fresh memory is
// dominated by it, by an amount that depends on what ran just before: the
// two first-start loads are each the node's second, after a --no-keep
// load of the same model that grows its memory (and keeps nothing), as a
// GPU allocator would have its memory already. The next start's load is
// a fresh process's first and pays those touches (its CPU is reported).
// Medians of KYLIX_BENCH_REPS rounds (default 3) of a KYLIX_BENCH_MIB
// model (default 1024) in 8 files. Root; behind KYLIX_BENCH=1. With
// KYLIX_BENCH_JSONL=FILE each measurement is appended to FILE as a JSON
// line (docs/bench-data/cpu-netns-keep.jsonl; scripts/plots.py).
func TestBenchLoadKeepNetns(t *testing.T) {
	benchGate(t)
	size := int64(envInt("KYLIX_BENCH_MIB", 1024)) << 20
	reps := envInt("KYLIX_BENCH_REPS", 3)
	const nfiles, conns = 8, 4
	work := t.TempDir()
	ceiling := buildCeiling(t, work)
	cert, ckey := selfSigned(t, work)
	c := newNetnsCluster(t, 4)
	key := clusterKey(t)
	src := modelFiles(t, filepath.Join(work, "model"), nfiles, size)
	var names []string
	for _, p := range src {
		names = append(names, "model/"+filepath.Base(p))
	}
	extra := []string{"--replicas", "3"}
	var ms []*member
	for i := range 3 {
		var join []int
		if i > 0 {
			join = []int{0}
		}
		ms = append(ms, c.start(i, key, extra, join...))
	}
	for _, m := range ms {
		waitFor(t, membershipWait, "three alive holders", func() bool { return aliveCount(t, m) == 3 })
	}
	for i, p := range src {
		mustKylix(t, "/", "import", "--data", ms[0].data, p, names[i])
	}
	waitFor(t, 30*time.Minute, "the model on all three holders", func() bool {
		for _, m := range ms {
			if _, pl := peersJSON(t, m); pl.Passes == 0 || pl.OwnedMissing != 0 || pl.Members != 3 || pl.OwnedChunks == 0 {
				return false
			}
		}
		return true
	})
	readerArgs := append(slices.Clone(extra), "--role", "reader")
	startReader := func(data, mnt string) *member {
		rd := c.startAt(3, data, mnt, key, readerArgs, 0)
		waitFor(t, membershipWait, "four alive members", func() bool { return aliveCount(t, rd) == 4 })
		waitFor(t, time.Minute, "the model in the reader's namespace", func() bool {
			_, err := os.Stat(filepath.Join(rd.mnt, names[len(names)-1]))
			return err == nil
		})
		return rd
	}
	type loadRep struct {
		Bytes     int64   `json:"bytes"`
		Seconds   float64 `json:"seconds"`
		Fetched   int     `json:"fetched_chunks"`
		Local     int     `json:"local_copy_chunks"`
		Kept      int     `json:"kept_chunks"`
		NotKept   int     `json:"not_kept_chunks"`
		CPUSecond float64 `json:"cpu_seconds"`
	}
	load := func(rd *member, flags ...string) loadRep {
		args := append([]string{"load", "--data", rd.data, "--device", "host", "--verify-on", "cpu", "--files", strconv.Itoa(nfiles), "--json"}, flags...)
		out, err := exec.Command(kylixBin, append(args, names...)...).Output()
		require.NoError(t, err, "kylix load: %s", out)
		var r loadRep
		require.NoError(t, json.Unmarshal(out, &r), "%s", out)
		require.Equal(t, size/nfiles*nfiles, r.Bytes)
		return r
	}
	mbps := func(b int64, s float64) float64 { return float64(b) / 1e6 / s }
	res := map[string][]float64{}
	for rep := range reps {
		// First start, keep.
		d1, m1 := dirs(t)
		var rd *member
		// KYLIX_BENCH_PROFILE: CPU profiles of the readers.
		profiled(fmt.Sprintf("keep-first-%d", rep+1), func() { rd = startReader(d1, m1) })
		load(rd, "--no-keep") // the warm-up (above)
		first := load(rd)
		require.Positive(t, first.Fetched)
		require.Zero(t, first.Local)
		res["first start, keep"] = append(res["first start, keep"], mbps(first.Bytes, first.Seconds))
		waitFor(t, 5*time.Minute, "the copy written", func() bool { return peerCacheChunks(t, rd) >= first.Kept })
		rd.stop()

		// First start, --no-keep.
		d2, m2 := dirs(t)
		var rd2 *member
		profiled(fmt.Sprintf("nokeep-first-%d", rep+1), func() { rd2 = startReader(d2, m2) })
		load(rd2, "--no-keep")
		nk := load(rd2, "--no-keep")
		require.Zero(t, nk.Kept)
		res["first start, --no-keep"] = append(res["first start, --no-keep"], mbps(nk.Bytes, nk.Seconds))
		rd2.stop()
		os.RemoveAll(filepath.Dir(d2))

		// The ceiling.
		tlsArgs := []string{"-tls", "-cert", cert, "-key", ckey}
		_, addrs, stop := ceilingServers(t, c, ceiling, 3, tlsArgs)
		r := runCeiling(t, exec.Command(c.nsent, append([]string{"--net=/var/run/netns/" + c.nodes[3], ceiling, "recv",
			"-servers", strings.Join(addrs, ","), "-conns", strconv.Itoa(conns), "-files", strings.Join(src, ",")}, tlsArgs...)...))
		stop()
		res["ceiling (TLS + BLAKE3)"] = append(res["ceiling (TLS + BLAKE3)"], mbps(r.Bytes, r.Seconds))

		// Next start: the first reader again, cold.
		dropPageCache(t)
		rd = startReader(d1, m1)
		next := load(rd)
		require.Equal(t, first.Kept, next.Local, "the next start reads what the first kept")
		res["next start (its copy, cold)"] = append(res["next start (its copy, cold)"], mbps(next.Bytes, next.Seconds))
		rd.stop()

		// The disk: the copy's files, O_DIRECT.
		des, err := os.ReadDir(filepath.Join(d1, "peer-cache"))
		require.NoError(t, err)
		var files []string
		for _, de := range des {
			files = append(files, filepath.Join(d1, "peer-cache", de.Name()))
		}
		dropPageCache(t)
		var br struct {
			Bytes   int64   `json:"bytes"`
			Seconds float64 `json:"seconds"`
		}
		out := mustKylix(t, "/", append([]string{"bench-read", "--json"}, files...)...)
		require.NoError(t, json.Unmarshal([]byte(out), &br), "%s", out)
		res["disk (O_DIRECT of the copy)"] = append(res["disk (O_DIRECT of the copy)"], mbps(br.Bytes, br.Seconds))
		os.RemoveAll(filepath.Dir(d1))
		t.Logf("round %d: first %.0f MB/s (kept %d, not kept %d of %d chunks; node CPU %.2f s), --no-keep %.0f (CPU %.2f s), ceiling %.0f, next start %.0f (%d chunks local; CPU %.2f s), disk %.0f; load %s",
			rep+1, mbps(first.Bytes, first.Seconds), first.Kept, first.NotKept, first.Fetched, first.CPUSecond, mbps(nk.Bytes, nk.Seconds), nk.CPUSecond, mbps(r.Bytes, r.Seconds),
			mbps(next.Bytes, next.Seconds), next.Local, next.CPUSecond, mbps(br.Bytes, br.Seconds), loadAvg())
	}
	if out := os.Getenv("KYLIX_BENCH_JSONL"); out != "" {
		// One line per measurement, for scripts/plots.py.
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		require.NoError(t, err)
		enc := json.NewEncoder(f)
		require.NoError(t, enc.Encode(map[string]any{"setup": map[string]any{"mib": size >> 20, "files": nfiles, "rounds": reps,
			"command": "KYLIX_BENCH=1 go test ./test -run 'TestBenchLoadKeepNetns$' -count=1 -v", "machine": "CPU (2 cores), network namespaces"}}))
		for k, vs := range res {
			for i, v := range vs {
				require.NoError(t, enc.Encode(map[string]any{"what": k, "round": i + 1, "mb_per_s": v}))
			}
		}
		require.NoError(t, f.Close())
	}
	med := func(k string) float64 { return median(res[k]) }
	for _, k := range []string{"first start, keep", "first start, --no-keep", "ceiling (TLS + BLAKE3)", "next start (its copy, cold)", "disk (O_DIRECT of the copy)"} {
		var xs []string
		for _, v := range res[k] {
			xs = append(xs, fmt.Sprintf("%.0f", v))
		}
		t.Logf("| %s | %.0f MB/s (%s) |", k, med(k), strings.Join(xs, ", "))
	}
	t.Logf("first start / min(ceiling, disk) = %.2fx; keep / --no-keep = %.2fx; next start / disk = %.2fx",
		med("first start, keep")/min(med("ceiling (TLS + BLAKE3)"), med("disk (O_DIRECT of the copy)")),
		med("first start, keep")/med("first start, --no-keep"), med("next start (its copy, cold)")/med("disk (O_DIRECT of the copy)"))
}
