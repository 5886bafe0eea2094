package stripe

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/chunking"
	"github.com/kylix/kylix/chunkstore/safetensors"
)

// modelChunks returns the chunk lengths the store's tensor-aware chunking
// (chunking.TensorSpans, 4 MiB) makes of a Llama-7B-shaped safetensors
// file in bf16: 32 layers of q, k, v, o (4096 x 4096), gate, up, down
// (4096 x 11008) and two norms (4096), the embedding and the output
// (32000 x 4096), a 30 KB header. Ids are made up, distinct.
func modelChunks(t testing.TB) []chunkstore.ChunkRef {
	h := &safetensors.Header{Len: 30000}
	off := int64(0)
	add := func(name string, n int64) {
		h.Tensors = append(h.Tensors, safetensors.Tensor{Name: name, Begin: off, End: off + n})
		off += n
	}
	add("embed", 32000*4096*2)
	for l := range 32 {
		for _, p := range []string{"q", "k", "v", "o"} {
			add(fmt.Sprintf("%d.%s", l, p), 4096*4096*2)
		}
		for _, p := range []string{"gate", "up", "down"} {
			add(fmt.Sprintf("%d.%s", l, p), 4096*11008*2)
		}
		add(fmt.Sprintf("%d.norm1", l), 4096*2)
		add(fmt.Sprintf("%d.norm2", l), 4096*2)
	}
	add("norm", 4096*2)
	add("lm_head", 32000*4096*2)
	spans := chunking.TensorSpans(h, h.DataStart()+off, 0)
	refs := make([]chunkstore.ChunkRef, len(spans))
	for i, s := range spans {
		var seed [8]byte
		binary.BigEndian.PutUint64(seed[:], uint64(i))
		refs[i] = chunkstore.ChunkRef{ID: chunkstore.Sum(seed[:]), Len: uint32(s.Len)}
	}
	return refs
}

// TestGroupModelOverhead: a model's chunks grouped by length cost about
// (k+m)/k, where stripes cut in file order pay for each stripe's longest
// member (a norm of 8 KiB padded to 4 MiB). The figures are erasure.md's.
func TestGroupModelOverhead(t *testing.T) {
	refs := modelChunks(t)
	for _, km := range [][2]int{{6, 2}, {8, 2}, {10, 2}} {
		k, m := km[0], km[1]
		logical, sorted := GroupRaw(Group(refs, k), m)
		var inOrder [][]chunkstore.ChunkRef
		for i := 0; i < len(refs); i += k {
			inOrder = append(inOrder, refs[i:min(i+k, len(refs))])
		}
		_, fileOrder := GroupRaw(inOrder, m)
		ideal := float64(k+m) / float64(k)
		t.Logf("%d+%d over %d chunks (%.2f GiB): by length %.4fx, in file order %.4fx, ideal %.4fx",
			k, m, len(refs), float64(logical)/(1<<30), float64(sorted)/float64(logical), float64(fileOrder)/float64(logical), ideal)
		require.Less(t, float64(sorted)/float64(logical), ideal+0.002)
		require.Greater(t, fileOrder, sorted)
	}
}

// TestGroup: each chunk once, longest first, k at a time, the same for any
// order of the input.
func TestGroup(t *testing.T) {
	id := func(b byte) chunkstore.ID { return chunkstore.Sum([]byte{b}) }
	ref := func(b byte, n uint32) chunkstore.ChunkRef { return chunkstore.ChunkRef{ID: id(b), Len: n} }
	in := []chunkstore.ChunkRef{ref(1, 10), ref(2, 30), ref(3, 20), ref(2, 30), ref(4, 30), ref(5, 5)}
	g := Group(in, 2)
	require.Len(t, g, 3)
	var flat []chunkstore.ChunkRef
	for _, s := range g {
		require.LessOrEqual(t, len(s), 2)
		flat = append(flat, s...)
	}
	require.Len(t, flat, 5)
	for i := 1; i < len(flat); i++ {
		require.GreaterOrEqual(t, flat[i-1].Len, flat[i].Len)
	}
	rev := append([]chunkstore.ChunkRef(nil), in...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	require.Equal(t, g, Group(rev, 2))
	require.Nil(t, Group(in, 0))
	logical, raw := GroupRaw(g, 1)
	require.Equal(t, int64(95), logical)
	require.Equal(t, int64(95+30+20+5), raw)
}
