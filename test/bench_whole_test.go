package test

import (
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBenchWholeCopy: a fine-tune deduplicated against its base (a
// KYLIX_BENCH_MIB MiB base, default 1024; the fine-tune's head 100 bytes
// longer and a tenth of it changed in eight places), read warm through the
// mount in 1 MiB reads, against the same bytes read from its source file
// on the data directory's disk (the backing file), side by side: first
// with --whole-budget 0 (served by the node, as before whole copies), then
// with a whole copy (passthrough). Medians of KYLIX_BENCH_REPS alternating
// pairs (default 5), warm, then cold (the page cache dropped before each
// read). Root (FUSE, drop_caches); behind KYLIX_BENCH=1.
func TestBenchWholeCopy(t *testing.T) {
	benchGate(t)
	requireFUSE(t)
	size := envInt("KYLIX_BENCH_MIB", 1024) << 20
	reps := envInt("KYLIX_BENCH_REPS", 5)
	data, mnt := dirs(t)
	work := t.TempDir()
	r := rand.New(rand.NewChaCha8([32]byte{32}))
	fill := func(b []byte) {
		for i := 0; i+8 <= len(b); i += 8 {
			v := r.Uint64()
			for k := range 8 {
				b[i+k] = byte(v >> (8 * k))
			}
		}
	}
	base := make([]byte, size)
	fill(base)
	ft := make([]byte, 100, size+100)
	fill(ft)
	ft = append(ft, base...)
	for i := range 8 {
		at := i * (size / 8)
		fill(ft[at : at+size/80])
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{{"base", base}, {"ft", ft}} {
		require.NoError(t, os.WriteFile(filepath.Join(work, f.name), f.b, 0o644))
		mustKylix(t, work, "import", "--data", data, f.name, "m/"+f.name)
	}
	base, ft = nil, nil
	backing, through := filepath.Join(work, "ft"), filepath.Join(mnt, "m", "ft")
	buf := make([]byte, 1<<20)
	read := func(p string) float64 {
		t.Helper()
		f, err := os.Open(p)
		require.NoError(t, err)
		defer f.Close()
		start := time.Now()
		var n int64
		for {
			k, err := f.Read(buf)
			n += int64(k)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		require.Equal(t, int64(size+100), n)
		return float64(n) / time.Since(start).Seconds() / 1e9
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	drop := func() {
		t.Helper()
		require.NoError(t, exec.Command("sync").Run())
		require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0))
	}
	pairs := func(label string) (float64, float64) {
		read(backing)
		read(through) // warm both
		var b, m []float64
		for range reps {
			b = append(b, read(backing))
			m = append(m, read(through))
		}
		t.Logf("%s, warm: mount %.2f GB/s %.2f, backing %.2f GB/s %.2f: %.2fx", label, med(m), m, med(b), b, med(m)/med(b))
		var cb, cm []float64
		for range reps {
			drop()
			cb = append(cb, read(backing))
			drop()
			cm = append(cm, read(through))
		}
		t.Logf("%s, cold: mount %.2f GB/s %.2f, backing %.2f GB/s %.2f: %.2fx", label, med(cm), cm, med(cb), cb, med(cm)/med(cb))
		return med(m), med(b)
	}

	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--whole-budget", "0")
	m0, b0 := pairs("served by the node (--whole-budget 0)")
	require.Zero(t, nodeWhole(t, data).Whole.Made)
	n.stop()

	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	read(through)
	read(through)
	start := time.Now()
	waitFor(t, 5*time.Minute, "the whole copy", func() bool { return nodeWhole(t, data).Whole.Made == 1 })
	t.Logf("whole copy made within %v of the second open; %+v", time.Since(start).Round(time.Millisecond), nodeWhole(t, data).Whole)
	pt := nodeWhole(t, data).FS.PassthroughOpens
	m1, b1 := pairs("whole copy (passthrough)")
	require.Greater(t, nodeWhole(t, data).FS.PassthroughOpens, pt, "the reads were not passthrough")
	t.Logf("RESULT size %d MiB: before %.2fx (%.2f / %.2f GB/s), whole copy %.2fx (%.2f / %.2f GB/s)", size>>20, m0/b0, m0, b0, m1/b1, m1, b1)
}
