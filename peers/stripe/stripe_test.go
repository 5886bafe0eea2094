package stripe

import (
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

func randChunks(rng *mrand.Rand, lens []int) []Chunk {
	cs := make([]Chunk, len(lens))
	for i, n := range lens {
		b := make([]byte, n)
		rand.Read(b)
		cs[i] = Chunk{ID: chunkstore.Sum(b), Data: b}
	}
	return cs
}

// storedShard returns shard i's stored bytes: chunk i's (unpadded) or
// parity i-k.
func storedShard(r *Record, chunks []Chunk, parity [][]byte, i int) []byte {
	if i < len(chunks) {
		return chunks[i].Data
	}
	return parity[i-r.K]
}

// storedIndexes lists the shards of r that are stored (not known zeros).
func storedIndexes(r *Record) []int {
	var out []int
	for i := range r.Shards() {
		if _, _, ok := r.ShardID(i); ok {
			out = append(out, i)
		}
	}
	return out
}

// shapes is the matrix of the codec tests: k, m and chunk lengths (equal,
// unequal, one byte, fewer chunks than k).
func shapes() []struct {
	k, m int
	lens []int
} {
	var out []struct {
		k, m int
		lens []int
	}
	rng := mrand.New(mrand.NewPCG(1, 2))
	for _, k := range []int{1, 2, 4, 6, 10} {
		for _, m := range []int{1, 2, 3} {
			add := func(lens []int) {
				out = append(out, struct {
					k, m int
					lens []int
				}{k, m, lens})
			}
			equal := make([]int, k)
			unequal := make([]int, k)
			for i := range k {
				equal[i] = 4096
				unequal[i] = 1 + rng.IntN(70000)
			}
			add(equal)
			add(unequal)
			add([]int{1})
			if k > 2 {
				add(unequal[:k/2])
				add([]int{65536, 3, 65535}[:min(3, k-1)])
			}
		}
	}
	return out
}

// TestCodecMatrix: over the shapes, every chunk reads back byte-equal from
// the shards with every pattern of up to m stored shards missing (all of
// them for small stripes, a sample for wide ones), and with m+1 missing the
// answer is ErrTooFewShards (and ErrNotLocal), never bytes.
func TestCodecMatrix(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(3, 4))
	for _, sh := range shapes() {
		t.Run(fmt.Sprintf("k=%d,m=%d,lens=%v", sh.k, sh.m, sh.lens), func(t *testing.T) {
			c, err := New(sh.k, sh.m)
			require.NoError(t, err)
			chunks := randChunks(rng, sh.lens)
			r, parity, err := c.Encode(chunks, nil)
			require.NoError(t, err)
			require.Len(t, parity, sh.m)
			require.Equal(t, len(sh.lens)+sh.m, r.Stored())
			stored := storedIndexes(r)
			all := make([]int, len(chunks))
			for i := range all {
				all[i] = i
			}
			// try reads every chunk with the stored shards in lost
			// missing: by Chunks, or by ChunksInto (iteration odd) into
			// buffers of the chunk's length and of the shard size,
			// alternately.
			iter := 0
			try := func(lost map[int]bool) ([][]byte, error) {
				s, err := NewShards(r)
				require.NoError(t, err)
				for _, i := range stored {
					if !lost[i] {
						require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
					}
				}
				iter++
				if iter%2 == 0 {
					return c.Chunks(s, all)
				}
				dst := make([][]byte, len(all))
				for j, i := range all {
					dst[j] = make([]byte, r.Chunks[i].Len, int(r.Chunks[i].Len)+(j%2)*int(r.ShardSize))
				}
				if err := c.ChunksInto(s, all, dst); err != nil {
					return nil, err
				}
				return dst, nil
			}
			for range 40 {
				lost := map[int]bool{}
				for _, j := range rng.Perm(len(stored))[:rng.IntN(sh.m+1)] {
					lost[stored[j]] = true
				}
				got, err := try(lost)
				require.NoError(t, err, "lost %v", lost)
				for i, ch := range chunks {
					require.Equal(t, ch.Data, got[i], "chunk %d, lost %v", i, lost)
				}
			}
			lost := map[int]bool{}
			for _, j := range rng.Perm(len(stored))[:sh.m+1] {
				lost[stored[j]] = true
			}
			got, err := try(lost)
			require.ErrorIs(t, err, ErrTooFewShards)
			require.ErrorIs(t, err, chunkstore.ErrNotLocal)
			require.Nil(t, got)
		})
	}
}

// TestLyingShards: a shard with a flipped byte, a shard of another stripe
// in its place, and a shard cut short are each refused by Add
// (ErrBadShard); with up to m of them the chunks still read right from the
// others, with m+1 the answer is ErrTooFewShards and no bytes. A lying
// shard slipped past the check (AddVerified, misused) gives
// chunkstore.ErrCorrupt from the rebuilt chunk's hash, not wrong bytes.
func TestLyingShards(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(5, 6))
	const k, m = 6, 2
	c, err := New(k, m)
	require.NoError(t, err)
	lens := []int{40000, 40000, 39000, 40000, 12345, 40000}
	chunks := randChunks(rng, lens)
	r, parity, err := c.Encode(chunks, nil)
	require.NoError(t, err)
	otherChunks := randChunks(rng, lens)
	or, oparity, err := c.Encode(otherChunks, nil)
	require.NoError(t, err)

	lies := map[string]func(i int) []byte{
		"flipped": func(i int) []byte {
			b := append([]byte(nil), storedShard(r, chunks, parity, i)...)
			b[rng.IntN(len(b))] ^= 0x40
			return b
		},
		"other stripe": func(i int) []byte { return storedShard(or, otherChunks, oparity, i) },
		"truncated": func(i int) []byte {
			b := storedShard(r, chunks, parity, i)
			return b[:len(b)-1]
		},
	}
	for name, lie := range lies {
		t.Run(name, func(t *testing.T) {
			for bad := 1; bad <= m+1; bad++ {
				s, err := NewShards(r)
				require.NoError(t, err)
				liars := map[int]bool{}
				for _, i := range rng.Perm(k + m)[:bad] {
					liars[i] = true
				}
				for i := range k + m {
					if liars[i] {
						require.ErrorIs(t, s.Add(i, lie(i)), ErrBadShard, "shard %d", i)
						continue
					}
					require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
				}
				for i, ch := range chunks {
					got, err := c.Chunk(s, i)
					if bad > m && liars[i] {
						require.ErrorIs(t, err, ErrTooFewShards, "%d liars %v, chunk %d", bad, liars, i)
						require.Nil(t, got)
						continue
					}
					require.NoError(t, err, "%d liars %v, chunk %d", bad, liars, i)
					require.Equal(t, ch.Data, got)
				}
			}
		})
	}

	t.Run("verified by the caller, wrongly", func(t *testing.T) {
		s, err := NewShards(r)
		require.NoError(t, err)
		for i := range k + m {
			switch i {
			case 0: // lost: to be rebuilt
			case 1:
				require.NoError(t, s.AddVerified(i, lies["flipped"](i)))
			default:
				require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
			}
		}
		got, err := c.Chunk(s, 0)
		require.ErrorIs(t, err, chunkstore.ErrCorrupt)
		require.Nil(t, got)
	})

	t.Run("no such shard", func(t *testing.T) {
		short, sp, err := c.Encode(chunks[:2], nil)
		require.NoError(t, err)
		s, err := NewShards(short)
		require.NoError(t, err)
		require.ErrorIs(t, s.Add(3, make([]byte, short.ShardSize)), ErrBadShard) // a known zero shard
		require.ErrorIs(t, s.Add(k+m, sp[0]), ErrBadShard)
		require.ErrorIs(t, s.Add(-1, sp[0]), ErrBadShard)
		_, err = c.Chunk(s, 2)
		require.ErrorIs(t, err, ErrBadRecord)
	})
}

// TestChunksInto: a rebuilt chunk lands in the caller's buffer, in place
// when it has room for the padding and copied when not, also when one chunk
// is asked for twice; a buffer of the wrong length is refused.
func TestChunksInto(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(11, 12))
	c, err := New(4, 2)
	require.NoError(t, err)
	chunks := randChunks(rng, []int{5000, 3000, 4000, 5000})
	r, parity, err := c.Encode(chunks, nil)
	require.NoError(t, err)
	s, err := NewShards(r)
	require.NoError(t, err)
	for _, i := range []int{0, 3, 4, 5} {
		require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
	}
	roomy := make([]byte, 3000, r.ShardSize)
	tight := make([]byte, 3000)
	again := make([]byte, 4000)
	given := make([]byte, 5000)
	require.NoError(t, c.ChunksInto(s, []int{1, 1, 2, 0}, [][]byte{roomy, tight, again, given}))
	require.Equal(t, chunks[1].Data, roomy)
	require.Equal(t, chunks[1].Data, tight)
	require.Equal(t, chunks[2].Data, again)
	require.Equal(t, chunks[0].Data, given)
	require.ErrorIs(t, c.ChunksInto(s, []int{1}, [][]byte{make([]byte, 2999)}), ErrBadRecord)
	require.ErrorIs(t, c.ChunksInto(s, []int{1}, nil), ErrBadRecord)
}

// TestShortStripeKnownZeros: a stripe of 2 chunks with k = 6 rebuilds
// either chunk from any 2 of its 4 stored shards: the 4 zero data shards
// are known, never fetched.
func TestShortStripeKnownZeros(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(7, 8))
	c, err := New(6, 2)
	require.NoError(t, err)
	chunks := randChunks(rng, []int{1000, 777})
	r, parity, err := c.Encode(chunks, nil)
	require.NoError(t, err)
	require.Equal(t, 4, r.Stored())
	for _, pair := range [][2]int{{1, 6}, {1, 7}, {0, 6}, {0, 7}, {6, 7}} {
		s, err := NewShards(r)
		require.NoError(t, err)
		for _, i := range pair {
			require.NoError(t, s.Add(i, storedShard(r, chunks, parity, i)))
		}
		require.True(t, s.Enough())
		got, err := c.Chunks(s, []int{0, 1})
		require.NoError(t, err, "from %v", pair)
		require.Equal(t, chunks[0].Data, got[0])
		require.Equal(t, chunks[1].Data, got[1])
	}
}

// TestCodecRefuses: shapes and inputs no stripe may have.
func TestCodecRefuses(t *testing.T) {
	for _, km := range [][2]int{{0, 2}, {MaxData + 1, 2}, {6, 0}, {6, MaxParity + 1}} {
		_, err := New(km[0], km[1])
		require.ErrorIs(t, err, ErrBadRecord, "%v", km)
	}
	c, err := New(2, 1)
	require.NoError(t, err)
	_, _, err = c.Encode(nil, nil)
	require.ErrorIs(t, err, ErrBadRecord)
	_, _, err = c.Encode(make([]Chunk, 3), nil)
	require.ErrorIs(t, err, ErrBadRecord)
	_, _, err = c.Encode([]Chunk{{Data: nil}}, nil)
	require.ErrorIs(t, err, ErrBadRecord)
	// A record of another shape.
	c3, err := New(3, 1)
	require.NoError(t, err)
	r, _, err := c3.Encode([]Chunk{{ID: chunkstore.Sum([]byte("x")), Data: []byte("x")}}, nil)
	require.NoError(t, err)
	s, err := NewShards(r)
	require.NoError(t, err)
	_, err = c.Chunk(s, 0)
	require.ErrorIs(t, err, ErrBadRecord)
}
