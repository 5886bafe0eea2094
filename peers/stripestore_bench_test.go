package peers

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// benchFileSize is a benchmark file's size: KYLIX_PEERS_BENCH_MIB MiB,
// default 48.
func benchFileSize() int {
	if v, err := strconv.Atoi(os.Getenv("KYLIX_PEERS_BENCH_MIB")); err == nil && v > 0 {
		return v << 20
	}
	return 48 << 20
}

// benchMember starts benchmark members: a store with a small chunk cache
// (every pass fetches again), closed with b.
func benchMember(b *testing.B) func(Config) *testNode {
	return func(cfg Config) *testNode {
		cfg.Listen, cfg.Capacity, cfg.FetchTimeout = freeAddr(b), 1<<30, 5*time.Second
		n, err := New(cfg)
		require.NoError(b, err)
		s, err := chunkstore.Open(chunkstore.Options{Dir: b.TempDir(), Fetcher: n, CacheBytes: 1 << 20})
		require.NoError(b, err)
		b.Cleanup(func() { s.Close() })
		require.NoError(b, n.Start(s, nil))
		b.Cleanup(func() { n.Close() })
		return &testNode{n, s}
	}
}

// BenchmarkStripedRead: a reader reads a file through its store (the
// path the mount takes: ReadAt, 8 pieces and the read-ahead in flight)
// from 8 members in this process over mutual TLS, the file either
// replicated (each chunk on its 2 owners) or coded 6+2 (each chunk on its
// stripe holder), then coded with the two members holding stripe 0's
// first chunks closed (every stripe loses the chunks those two held and
// rebuilds them). The goals: coded >= 0.8x replicated healthy,
// >= 0.5x with 2 gone (docs/design/erasure.md). KYLIX_PEERS_BENCH_MIB sets
// the file size (default 48).
//
//	go test ./peers -run '^$' -bench BenchmarkStripedRead -benchtime 3x -count 5
func BenchmarkStripedRead(b *testing.B) {
	size := benchFileSize()
	ms, reader, cold, recs := codedClusterWith(b, benchMember(b), size)
	ctx := context.Background()

	// The same size replicated: each chunk on its 2 owners only.
	warm := randBytes(size)
	src := filepath.Join(b.TempDir(), "warm")
	require.NoError(b, os.WriteFile(src, warm, 0o644))
	_, err := ms[0].s.Import(ctx, src, "warm/model.bin", chunkstore.ImportOptions{})
	require.NoError(b, err)
	f, _, err := ms[0].s.OpenPath("warm/model.bin")
	require.NoError(b, err)
	var drop []chunkstore.ID
	for _, c := range f.M.Chunks {
		data, err := ms[0].s.ReadChunk(ctx, c.ID)
		require.NoError(b, err)
		mine := false
		for _, p := range owners(c.ID, ms[0].placementMembers(), DefaultReplicas) {
			mine = mine || p.name == ms[0].self
			require.NoError(b, ms[0].storeShard(ctx, p, c.ID, data))
		}
		if !mine {
			drop = append(drop, c.ID)
		}
	}
	_, _, err = ms[0].s.DropChunks(ctx, drop)
	require.NoError(b, err)
	waitFor(b, "the replicated file on the reader", func() bool {
		_, err := reader.s.Lookup("warm/model.bin")
		return err == nil
	})

	read := func(path string, want []byte) func(b *testing.B) {
		return func(b *testing.B) {
			b.SetBytes(int64(len(want)))
			before := reader.StripeReads()
			for range b.N {
				// Each pass rebuilds again: the stripes kept from the last
				// one would hold the whole file.
				b.StopTimer()
				reader.forgetRecent()
				b.StartTimer()
				got, err := readAll(reader, path)
				require.NoError(b, err)
				if !bytes.Equal(want, got) {
					b.Fatal("read differs")
				}
			}
			b.ReportMetric(float64(reader.StripeReads()-before)/float64(b.N), "rebuilt/op")
		}
	}
	b.Run("replicated", read("warm/model.bin", warm))
	b.Run("coded", read("cold/model.bin", cold))
	holders := stripeHoldersOf(b, reader, recs[0])
	closeAll(b, nodeNamed(ms, holders[0].name), nodeNamed(ms, holders[1].name))
	b.Run("coded-2-gone", read("cold/model.bin", cold))
}
