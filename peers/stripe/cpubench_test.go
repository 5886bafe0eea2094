package stripe

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// TestCodecPerCore (KYLIX_BENCH=1): the per-core figures of docs/bench.md,
// "Erasure coding". Each variant runs on one goroutine locked to its
// thread and is timed by that thread's CPU clock, not the wall clock, so
// other processes on a shared machine slow it down but do not change the
// figure (beyond cache and memory contention); the variants of a shape
// alternate in short rounds so that whatever contention there is falls on
// all of them alike. Reported per shape: medians over the rounds of GB of
// data shards (k x shard size) per CPU-second, and of the ratio of each of
// ours to reedsolomon's own Encoder in the same round.
//
//	KYLIX_BENCH=1 go test ./peers/stripe -run TestCodecPerCore -v
func TestCodecPerCore(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const rounds = 15
	for _, sh := range benchShapes {
		chunks := benchData(sh.k, sh.size)
		c, err := New(sh.k, sh.m, WithThreads(1))
		require.NoError(t, err)
		enc, err := reedsolomon.New(sh.k, sh.m, reedsolomon.WithMaxGoroutines(1))
		require.NoError(t, err)
		r, parity, err := c.Encode(chunks, nil)
		require.NoError(t, err)
		// reedsolomon works on the same data buffers as ours (its rebuild
		// writes the same bytes back into them) and parity of its own.
		rsShards := make([][]byte, sh.k+sh.m)
		for i := range rsShards {
			if i < sh.k {
				rsShards[i] = chunks[i].Data
			} else {
				rsShards[i] = append([]byte(nil), parity[i-sh.k]...)
			}
		}
		pbuf := [][]byte{make([]byte, sh.size), make([]byte, sh.size)}
		into := [][]byte{make([]byte, sh.size), make([]byte, sh.size)}
		lost := []int{0, sh.k / 2}
		gather := func(verify bool) *Shards {
			s, err := NewShards(r)
			require.NoError(t, err)
			for i := range sh.k + sh.m {
				if i == lost[0] || i == lost[1] {
					continue
				}
				if verify {
					require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
				} else {
					require.NoError(t, s.AddVerified(i, storedShard(r, chunks, parity, i)))
				}
			}
			return s
		}
		variants := []struct {
			name string
			f    func()
		}{
			{"encode reedsolomon", func() { require.NoError(t, enc.Encode(rsShards)) }},
			{"encode stripe", func() { _, _, err := c.Encode(chunks, pbuf); require.NoError(t, err) }},
			{"encode stripe-no-ids", func() { _, _, err := c.encodeParity(chunks, pbuf); require.NoError(t, err) }},
			{"decode reedsolomon", func() {
				for _, i := range lost {
					rsShards[i] = rsShards[i][:0]
				}
				require.NoError(t, enc.ReconstructData(rsShards))
			}},
			{"decode stripe", func() { require.NoError(t, c.ChunksInto(gather(false), lost, into)) }},
			{"decode stripe-no-check", func() {
				_, err := c.rebuild(gather(false), lost, map[int][]byte{lost[0]: into[0][:0], lost[1]: into[1][:0]})
				require.NoError(t, err)
			}},
			{"decode stripe+verify", func() { require.NoError(t, c.ChunksInto(gather(true), lost, into)) }},
		}
		bytes := float64(sh.k * sh.size)
		iters := max(1, int(64<<20/bytes))
		rate := make([][]float64, len(variants))
		for range rounds {
			for v, x := range variants {
				x.f() // warm
				start := threadCPU()
				for range iters {
					x.f()
				}
				rate[v] = append(rate[v], bytes*float64(iters)/(threadCPU()-start)/1e9)
			}
		}
		t.Logf("%d+%d, shards of %d KiB (median of %d rounds, GB/s per CPU-second; ratio to reedsolomon in the same round):", sh.k, sh.m, sh.size>>10, rounds)
		for v, x := range variants {
			base := 0
			if v >= 3 {
				base = 3
			}
			ratios := make([]float64, rounds)
			for i := range rounds {
				ratios[i] = rate[v][i] / rate[base][i]
			}
			t.Logf("  %-24s %7.2f GB/s  %5.2fx", x.name, median(rate[v]), median(ratios))
		}
	}
	data := benchData(1, 4<<20)[0]
	var rs []float64
	for range rounds {
		start := threadCPU()
		for range 16 {
			chunkstore.Sum(data.Data)
		}
		rs = append(rs, float64(16*len(data.Data))/(threadCPU()-start)/1e9)
	}
	t.Logf("BLAKE3 of a 4 MiB chunk: %.2f GB/s per CPU-second", median(rs))
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// threadCPU is the calling thread's CPU time in seconds.
func threadCPU() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime: %v", err))
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}
