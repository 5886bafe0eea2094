package peers

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// BenchmarkTierThreeVersions: three versions of a model (a base and two
// fine-tunes, each rewriting an eighth of the one before) on 8 members
// with R = 2. It times kylix tier cold of the three (MakeCold: chunks
// coded 6+2, every shard stored on its holder over mutual TLS), made warm
// again between passes, untimed, and reports the raw bytes the cluster
// stores for them (distinct chunks, each version's shared chunks once):
// replicated, cold once the copies beyond each shard's home are gone, and
// what three full replicas would hold.
//
//	go test ./peers -run '^$' -bench BenchmarkTierThreeVersions -benchtime 3x -count 3
func BenchmarkTierThreeVersions(b *testing.B) {
	size := benchFileSize()
	ms, reader := tierMembers(b, benchMember(b))
	ctx := context.Background()
	base := randBytes(size)
	v2 := append([]byte(nil), base...)
	copy(v2[size/4:], randBytes(size/8))
	v3 := append([]byte(nil), v2...)
	copy(v3[size/2:], randBytes(size/8))
	var refs []chunkstore.ChunkRef
	seen := map[chunkstore.ID]bool{}
	for i, v := range [][]byte{base, v2, v3} {
		m := importPlaced(b, ms, reader, "models/v"+strconv.Itoa(i+1)+".bin", v)
		for _, c := range m.Chunks {
			if !seen[c.ID] {
				seen[c.ID] = true
				refs = append(refs, c)
			}
		}
	}
	var distinct int64
	for _, c := range refs {
		distinct += int64(c.Len)
	}
	// raw sums the bytes every member holds of the versions' chunks and of
	// the parity of the stripes named now.
	raw := func() int64 {
		all, _, err := ms[0].namedChunks(ctx)
		require.NoError(b, err)
		var sum int64
		for _, n := range ms {
			for _, c := range all {
				if n.s.HasChunk(c.ID) {
					sum += int64(c.Len)
				}
			}
		}
		return sum
	}
	// Replicated: each chunk on its two owners alone (the importer's
	// extra copies dropped by rebalance).
	waitFor(b, "each chunk on its two owners alone", func() bool { return raw() == 2*distinct })
	replicated := raw()
	var cold int64
	var res TierResult
	b.SetBytes(distinct)
	b.ResetTimer()
	for i := range b.N {
		if i > 0 {
			b.StopTimer()
			_, err := ms[i%8].MakeWarm(ctx, "models", nil)
			require.NoError(b, err)
			for _, n := range ms {
				waitFor(b, "no stripe known on "+n.self, func() bool { return n.StripesKnown() == 0 })
			}
			b.StartTimer()
		}
		var err error
		res, err = ms[i%8].MakeCold(ctx, "models", nil)
		require.NoError(b, err)
		b.StopTimer()
		want := res.Logical + res.Parity
		waitFor(b, "each shard on its home alone", func() bool { return raw() == want })
		cold = raw()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(distinct)/float64(3*size), "distinct/logical")
	b.ReportMetric(float64(replicated)/float64(distinct), "replicated-raw/distinct")
	b.ReportMetric(float64(cold)/float64(distinct), "cold-raw/distinct")
	b.ReportMetric(float64(cold)/float64(3*distinct), "cold/3-replicas")
	b.Logf("three versions of %d MiB: %d distinct bytes (%d stripes of %s); raw replicated %d, cold %d, three replicas %d",
		size>>20, distinct, res.Stripes, res.Shape, replicated, cold, 3*distinct)
}
