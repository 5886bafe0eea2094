package peers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// BenchmarkStripeLayout measures the healthy read of the two erasure-coding
// layouts of docs/design/erasure.md over the real data plane (mutual TLS,
// verified answers), one reader and layoutK holders in this process:
//
//   - whole: coding across k whole chunks; a chunk is one request to the
//     one member holding it (chunk i on member i mod k).
//   - split: each chunk cut into k shards, shard j on member j; a chunk is
//     k requests, one to each member, all of which must arrive.
//
// The same bytes move either way (the chunks' data, no parity: a healthy
// read fetches none in both layouts). Reported: throughput (b.SetBytes),
// cores per GB/s of both ends, requests per chunk and the median and 99th
// percentile time to have one whole chunk.
func BenchmarkStripeLayout(b *testing.B) {
	for _, size := range []int{4 << 20, 256 << 10} {
		for _, split := range []bool{false, true} {
			name := "whole"
			if split {
				name = "split"
			}
			b.Run(fmt.Sprintf("%s/chunk=%dKiB", name, size>>10), func(b *testing.B) { benchStripeLayout(b, size, split) })
		}
	}
}

// layoutK is the stripe width of the layout benchmark (k of a 6+2 stripe).
const layoutK = 6

func benchStripeLayout(b *testing.B, size int, split bool) {
	key, _ := NewKey()
	total := 96 << 20
	nchunks := total / size
	var hs []*testNode
	for i := range layoutK {
		var join []string
		if i > 0 {
			join = []string{hs[0].cfg.Listen}
		}
		hs = append(hs, benchNodeCfg(b, Config{Name: fmt.Sprintf("holder%d", i), Key: key, Join: join, NoPlacement: true, NoRelay: true}))
	}
	reader := benchNodeCfg(b, Config{Name: "reader", Key: key, Join: []string{hs[0].cfg.Listen}, NoPlacement: true, NoRelay: true})
	for deadline := time.Now().Add(20 * time.Second); len(reader.livePeers()) != layoutK; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the members did not see each other")
		}
	}
	peerOfHolder := map[string]peer{}
	for _, p := range reader.livePeers() {
		peerOfHolder[p.name] = p
	}
	// pieces[c] lists chunk c's requests: (holder, id, length).
	type piece struct {
		p   peer
		id  chunkstore.ID
		len uint32
	}
	pieces := make([][]piece, nchunks)
	ims := make([]*chunkstore.Importer, layoutK)
	for i, h := range hs {
		ims[i] = h.s.NewImporter()
	}
	for c := range nchunks {
		data := randBytes(size)
		if !split {
			h := c % layoutK
			id := chunkstore.Sum(data)
			require.NoError(b, ims[h].PutChunk(id, data))
			pieces[c] = []piece{{peerOfHolder[hs[h].self], id, uint32(size)}}
			continue
		}
		per := (size + layoutK - 1) / layoutK
		for j := range layoutK {
			part := data[min(j*per, size):min((j+1)*per, size)]
			id := chunkstore.Sum(part)
			require.NoError(b, ims[j].PutChunk(id, part))
			pieces[c] = append(pieces[c], piece{peerOfHolder[hs[j].self], id, uint32(len(part))})
		}
	}
	for _, im := range ims {
		require.NoError(b, im.Close())
	}
	ctx := context.Background()
	fetchChunk := func(c int) error {
		ps := pieces[c]
		if len(ps) == 1 {
			_, err := reader.ask(ctx, ps[0].p, opChunk, ps[0].id, ps[0].len, nil)
			return err
		}
		errs := make(chan error, len(ps))
		for _, p := range ps {
			go func() {
				_, err := reader.ask(ctx, p.p, opChunk, p.id, p.len, nil)
				errs <- err
			}()
		}
		var first error
		for range ps {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	// Warm up: dial every connection.
	for c := range min(nchunks, 4*layoutK*connsPerPeer) {
		require.NoError(b, fetchChunk(c))
	}
	var mu sync.Mutex
	var lat []time.Duration
	b.SetBytes(int64(total))
	cpu := startCPU(b)
	for range b.N {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := next.Add(1) - 1; c < int64(nchunks); c = next.Add(1) - 1 {
					t := time.Now()
					if err := fetchChunk(int(c)); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(t)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	cpu.report(int64(total))
	slices.Sort(lat)
	b.ReportMetric(float64(len(pieces[0])), "requests/chunk")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
