package gpuio

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
)

// rankLayoutModel stores a safetensors file whose tensors split every way
// the rules split: row-parallel (dim 1, uneven for 3 ranks, a 3-D one),
// column-parallel (dim 0, uneven), a vocabulary too short for 4 ranks (the
// last rank's share is empty), replicated norms, and a column-parallel
// tensor of three chunks whose halves start off the chunk grid.
func rankLayoutModel(t *testing.T) (*chunkstore.Store, []byte) {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 4))
	specs := []safetensors.TensorSpec{
		{Name: "model.embed_tokens.weight", DType: safetensors.BF16, Shape: []int64{3, 700}},
		{Name: "model.layers.0.input_layernorm.weight", DType: safetensors.F32, Shape: []int64{700}},
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: safetensors.BF16, Shape: []int64{1001, 700}},
		{Name: "model.layers.0.self_attn.o_proj.weight", DType: safetensors.BF16, Shape: []int64{700, 1001}},
		{Name: "model.layers.0.mlp.down_proj.weight", DType: safetensors.F32, Shape: []int64{2048, 2050}},
		{Name: "model.layers.0.mlp.experts.w2.weight", DType: safetensors.F16, Shape: []int64{4, 33, 10}},
		{Name: "model.layers.0.self_attn.o_proj.bias", DType: safetensors.BF16, Shape: []int64{700}},
		{Name: "model.layers.0.mlp.gate_proj.weight", DType: safetensors.BF16, Shape: []int64{6000, 1024}}, // 3 chunks, halves off the grid
	}
	var ts []safetensors.WriteTensor
	for _, s := range specs {
		ts = append(ts, safetensors.WriteTensor{Name: s.Name, DType: s.DType, Shape: s.Shape, Data: randBytes(r, int(s.Size()))})
	}
	var buf bytes.Buffer
	require.NoError(t, safetensors.Write(&buf, ts, map[string]string{"format": "pt"}))
	p := filepath.Join(t.TempDir(), "model.safetensors")
	require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
	st, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.Import(context.Background(), p, "m/model.safetensors", chunkstore.ImportOptions{})
	require.NoError(t, err)
	return st, buf.Bytes()
}

// TestRankLayoutGivesTheShares: for sizes 2, 3 and 4, every rank's layout
// loaded whole places exactly the bytes the strided shares of the file
// place, under every loader variant; the layouts are kept, listed,
// counted and dropped by the store.
func TestRankLayoutGivesTheShares(t *testing.T) {
	st, src := rankLayoutModel(t)
	ctx := context.Background()
	h, err := safetensors.ParseBytes(src, int64(len(src)))
	require.NoError(t, err)
	for _, tp := range []int{2, 3, 4} {
		var progressed int64
		res, err := MakeRankLayouts(ctx, st, "m/model.safetensors", tp, func(done, total int64) { progressed = done })
		require.NoError(t, err)
		require.Len(t, res.Ranks, tp)
		require.Equal(t, 3, res.Strided, "o_proj, down_proj and the experts' w2")
		require.Equal(t, res.Bytes, progressed)
		if tp == 2 {
			// Cut on the source's grid, each rank's half of gate_proj
			// holds one of the source's chunks whole: rank 0 the first
			// (4 MiB), rank 1 the last ([8 MiB, 6000 x 2048)), which it
			// would not if cut from its own start.
			require.LessOrEqual(t, res.NewBytes, res.Bytes-4<<20-(6000*2048-8<<20), "%+v", res)
		}
	}
	ls, err := st.RankLayouts(chunkstore.ID{})
	require.NoError(t, err)
	require.Len(t, ls, 2+3+4)
	files, bytesAll, extra, err := st.RankLayoutUsage()
	require.NoError(t, err)
	require.Equal(t, 9, files)
	require.Positive(t, extra)
	require.Less(t, extra, bytesAll, "tensors every rank keeps are the file's own chunks")

	f, _, err := st.OpenPath("m/model.safetensors")
	require.NoError(t, err)
	for vname, mk := range variants() {
		t.Run(vname, func(t *testing.T) {
			dev, opts := mk()
			l, err := New(st, dev, opts)
			require.NoError(t, err)
			defer l.Close()
			for _, tp := range []int{2, 3, 4} {
				for rank := range tp {
					lf, lh, err := OpenRankLayout(st, f, h, rank, tp)
					require.NoError(t, err)
					require.NotNil(t, lf)
					var targets []TensorTarget
					for _, tn := range h.Tensors {
						sl, err := TPShare(tn, rank, tp).Layout(tn)
						require.NoError(t, err)
						mem, err := dev.Alloc(max(sl.Bytes, 1))
						require.NoError(t, err)
						targets = append(targets, TensorTarget{Name: tn.Name, Mem: mem})
						want := cpuShare(src[h.DataStart()+tn.Begin:h.DataStart()+tn.End], sl)
						defer func() {
							got := make([]byte, len(want))
							require.NoError(t, mem.CopyToHost(got, 0))
							require.True(t, bytes.Equal(want, got), "tp %d rank %d tensor %s", tp, rank, tn.Name)
							mem.Free()
						}()
					}
					_, err = l.LoadTensors(ctx, lf, lh, targets)
					require.NoError(t, err)
				}
			}
		})
	}

	n, err := st.DropRankLayouts(f.ID, 3)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	lf, _, err := OpenRankLayout(st, f, h, 0, 3)
	require.NoError(t, err)
	require.Nil(t, lf, "dropped")
	lf, _, err = OpenRankLayout(st, f, h, 1, 4)
	require.NoError(t, err)
	require.NotNil(t, lf, "the other sizes stay")
}

// TestRankLayoutRefusals: a file with no strided share, a file that is
// not safetensors, a bad size; and a layout made under other split rules
// is not used.
func TestRankLayoutRefusals(t *testing.T) {
	fx := newFixture(t)
	ctx := context.Background()
	_, err := MakeRankLayouts(ctx, fx.st, "opaque.bin", 2, nil)
	require.ErrorIs(t, err, ErrNotSafetensors)
	// The fixture's names match no rule: every tensor is replicated.
	_, err = MakeRankLayouts(ctx, fx.st, "a.safetensors", 2, nil)
	require.ErrorIs(t, err, ErrNoRankLayout)
	_, err = MakeRankLayouts(ctx, fx.st, "a.safetensors", 1, nil)
	require.ErrorContains(t, err, "give 2 or more")
	_, err = MakeRankLayouts(ctx, fx.st, "missing", 2, nil)
	require.ErrorIs(t, err, chunkstore.ErrNotFound)

	st, src := rankLayoutModel(t)
	h, err := safetensors.ParseBytes(src, int64(len(src)))
	require.NoError(t, err)
	f, _, err := st.OpenPath("m/model.safetensors")
	require.NoError(t, err)
	saved := tpRulesDigest
	tpRulesDigest = "other-rules"
	_, err = MakeRankLayouts(ctx, st, "m/model.safetensors", 2, nil)
	tpRulesDigest = saved
	require.NoError(t, err)
	_, _, err = OpenRankLayout(st, f, h, 0, 2)
	require.ErrorContains(t, err, "made under other split rules")
}
