package stripe

import (
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// Per-core encode and decode throughput of this codec beside
// reedsolomon's own Encoder on the same shapes, both on one goroutine
// (docs/bench.md, "Erasure coding"). b.SetBytes is the data shards' bytes
// (k x shard size), as reedsolomon's benchmarks count.
//
//	go test ./peers/stripe -run '^$' -bench . -count 5
//
// Shapes: whole 4 MiB chunks at k = 6, 8, 10 (the chosen layout), and the
// shards the split layout would make of a 4 MiB and a 256 KiB chunk at
// k = 6 (4 MiB/6, 256 KiB/6).
var benchShapes = []struct{ k, m, size int }{
	{6, 2, 4 << 20},
	{8, 2, 4 << 20},
	{10, 2, 4 << 20},
	{6, 2, (4<<20 + 5) / 6},
	{6, 2, (256<<10 + 5) / 6},
}

func benchData(k, size int) []Chunk {
	cs := make([]Chunk, k)
	for i := range cs {
		b := make([]byte, size)
		rand.Read(b)
		cs[i] = Chunk{ID: chunkstore.Sum(b), Data: b}
	}
	return cs
}

func BenchmarkEncode(b *testing.B) {
	for _, sh := range benchShapes {
		name := fmt.Sprintf("%dx%dx%dKiB", sh.k, sh.m, sh.size>>10)
		chunks := benchData(sh.k, sh.size)
		b.Run("reedsolomon/"+name, func(b *testing.B) {
			enc, err := reedsolomon.New(sh.k, sh.m, reedsolomon.WithMaxGoroutines(1))
			require.NoError(b, err)
			shards := make([][]byte, sh.k+sh.m)
			for i := range sh.k {
				shards[i] = chunks[i].Data
			}
			for j := range sh.m {
				shards[sh.k+j] = make([]byte, sh.size)
			}
			b.SetBytes(int64(sh.k * sh.size))
			b.ResetTimer()
			for range b.N {
				if err := enc.Encode(shards); err != nil {
					b.Fatal(err)
				}
			}
		})
		// stripe: Encode with the parity buffers reused (as a conversion
		// coding stripe after stripe does): Reed-Solomon and the BLAKE3 of
		// the parity, the ids it is stored under. stripe-no-ids: the same
		// without the ids, the codec's own overhead.
		for _, ids := range []bool{true, false} {
			label := "stripe/"
			if !ids {
				label = "stripe-no-ids/"
			}
			b.Run(label+name, func(b *testing.B) {
				c, err := New(sh.k, sh.m, WithThreads(1))
				require.NoError(b, err)
				parity := make([][]byte, sh.m)
				for j := range parity {
					parity[j] = make([]byte, sh.size)
				}
				encode := c.Encode
				if !ids {
					encode = c.encodeParity
				}
				b.SetBytes(int64(sh.k * sh.size))
				b.ResetTimer()
				for range b.N {
					if _, _, err := encode(chunks, parity); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecode: m data shards lost, rebuilt from the k others (the
// worst a stripe survives). stripe: the shards were verified on arrival
// (AddVerified, as the data plane's fetch does); each rebuilt chunk is
// rebuilt into the reader's buffer (ChunksInto) and hashed against its id. stripe-no-check: the rebuild alone, without that
// hash. stripe+verify: every shard is hashed here too (Add). reedsolomon:
// ReconstructData into the lost shards' buffers.
func BenchmarkDecode(b *testing.B) {
	for _, sh := range benchShapes {
		name := fmt.Sprintf("%dx%dx%dKiB", sh.k, sh.m, sh.size>>10)
		chunks := benchData(sh.k, sh.size)
		c, err := New(sh.k, sh.m, WithThreads(1))
		require.NoError(b, err)
		r, parity, err := c.Encode(chunks, nil)
		require.NoError(b, err)
		lost := []int{0, sh.k / 2}[:sh.m]
		b.Run("reedsolomon/"+name, func(b *testing.B) {
			enc, err := reedsolomon.New(sh.k, sh.m, reedsolomon.WithMaxGoroutines(1))
			require.NoError(b, err)
			shards := make([][]byte, sh.k+sh.m)
			for i := range shards {
				shards[i] = append([]byte(nil), storedShard(r, chunks, parity, i)...)
			}
			b.SetBytes(int64(sh.k * sh.size))
			b.ResetTimer()
			for range b.N {
				for _, i := range lost {
					shards[i] = shards[i][:0]
				}
				if err := enc.ReconstructData(shards); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, mode := range []string{"stripe", "stripe-no-check", "stripe+verify"} {
			verify := mode == "stripe+verify"
			label := mode + "/"
			// The reader's buffers, reused as reedsolomon's are.
			into := make([][]byte, len(lost))
			for j := range into {
				into[j] = make([]byte, sh.size)
			}
			b.Run(label+name, func(b *testing.B) {
				b.SetBytes(int64(sh.k * sh.size))
				b.ResetTimer()
				for range b.N {
					s, err := NewShards(r)
					if err != nil {
						b.Fatal(err)
					}
					for i := range sh.k + sh.m {
						if i == lost[0] || i == lost[1] {
							continue
						}
						add := s.AddVerified
						if verify {
							add = s.Add
						}
						if err := add(i, storedShard(r, chunks, parity, i)); err != nil {
							b.Fatal(err)
						}
					}
					if mode == "stripe-no-check" {
						_, err = c.rebuild(s, lost, map[int][]byte{lost[0]: into[0][:0], lost[1]: into[1][:0]})
					} else {
						err = c.ChunksInto(s, lost, into)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBLAKE3: the store's hash over one 4 MiB chunk on one core, the
// cost the ids of parity and the checks of rebuilt chunks add.
func BenchmarkBLAKE3(b *testing.B) {
	data := benchData(1, 4<<20)[0].Data
	b.SetBytes(int64(len(data)))
	for range b.N {
		chunkstore.Sum(data)
	}
}
