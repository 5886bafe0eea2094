package peers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// BenchmarkPushOnImport (docs/bench.md, "Push on import (peers)"): the
// time until an import of benchSize() random bytes returns, on a member of
// three (R = 2, NoPlacement: only the push copies), streaming while it
// reads (PushStream), and on a store alone for reference. (The push after
// the commit it replaced, Node.Push, is gone; bench.md keeps its figures.)
// The two are interleaved, a fresh
// file each time (nothing deduplicates), three rounds; medians reported.
// Run with -benchtime=1x: one call does every round.
func BenchmarkPushOnImport(b *testing.B) {
	key, _ := NewKey()
	a := benchNodeCfg(b, Config{Name: "a", Key: key, NoPlacement: true})
	benchNodeCfg(b, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	benchNodeCfg(b, Config{Name: "c", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	for deadline := time.Now().Add(20 * time.Second); len(a.livePeers()) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the members did not see each other")
		}
	}
	alone, err := chunkstore.Open(chunkstore.Options{Dir: b.TempDir()})
	require.NoError(b, err)
	b.Cleanup(func() { alone.Close() })
	ctx := context.Background()
	src := filepath.Join(b.TempDir(), "src")
	modes := []string{"alone", "streaming"}
	times, cpus := map[string][]time.Duration{}, map[string][]time.Duration{}
	var pushed int64
	for round := range 3 {
		for i := range modes {
			mode := modes[(i+round)%len(modes)] // each mode first once
			require.NoError(b, os.WriteFile(src, randBytes(benchSize()), 0o644))
			dest := fmt.Sprintf("%s-%d", mode, round)
			pushed = 0
			start, cpu0 := time.Now(), cpuTime()
			switch mode {
			case "alone":
				_, err = alone.Import(ctx, src, dest, chunkstore.ImportOptions{})
				require.NoError(b, err)
			case "streaming":
				ps := a.NewPushStream(ctx)
				_, err = a.s.Import(ctx, src, dest, chunkstore.ImportOptions{OnChunk: ps.Add})
				require.NoError(b, err)
				res, err := ps.Close()
				require.NoError(b, err)
				require.Empty(b, res.Failed)
				pushed = res.Bytes
			}
			d, cpu := time.Since(start), cpuTime()-cpu0
			times[mode] = append(times[mode], d)
			cpus[mode] = append(cpus[mode], cpu)
			b.Logf("round %d %-12s %6.2f s, CPU %6.2f s (pushed %d MiB)", round+1, mode, d.Seconds(), cpu.Seconds(), pushed>>20)
		}
	}
	median := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	sum := "medians:"
	for _, mode := range modes {
		med, cpu := median(times[mode]), median(cpus[mode])
		b.ReportMetric(med.Seconds(), mode+"-s")
		b.ReportMetric(cpu.Seconds(), mode+"-cpu-s")
		sum += fmt.Sprintf(" %s %.2f s (CPU %.2f s);", mode, med.Seconds(), cpu.Seconds())
	}
	b.Log(sum) // one line: the benchmark's log shows ten
}
