package gpuio

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// TestTPDim pins the table on the names of the families it covers, and its
// anchoring: a name only containing a layer's name is not that layer.
func TestTPDim(t *testing.T) {
	const replicated = -1
	for _, tc := range []struct {
		name string
		ndim int
		want int
	}{
		// Llama, Qwen2 (q/k/v biases split with their weights).
		{"model.layers.0.self_attn.q_proj.weight", 2, 0},
		{"model.layers.0.self_attn.q_proj.bias", 1, 0},
		{"model.layers.0.self_attn.k_proj.bias", 1, 0},
		{"model.layers.0.self_attn.v_proj.weight", 2, 0},
		{"model.layers.0.mlp.gate_proj.weight", 2, 0},
		{"model.layers.0.mlp.up_proj.bias", 1, 0},
		{"model.layers.0.self_attn.o_proj.weight", 2, 1},
		{"model.layers.0.self_attn.o_proj.bias", 1, replicated},
		{"model.layers.0.mlp.down_proj.weight", 2, 1},
		{"model.layers.0.mlp.down_proj.bias", 1, replicated},
		{"model.embed_tokens.weight", 2, 0},
		{"lm_head.weight", 2, 0},
		{"model.norm.weight", 1, replicated},
		{"model.layers.0.input_layernorm.weight", 1, replicated},
		{"model.layers.0.self_attn.rotary_emb.inv_freq", 1, replicated},
		// Mixtral experts; OPT/BART out_proj; GPT-NeoX dense_4h_to_h.
		{"model.layers.0.block_sparse_moe.experts.7.w1.weight", 2, 0},
		{"model.layers.0.block_sparse_moe.experts.7.w3.weight", 2, 0},
		{"model.layers.0.block_sparse_moe.experts.7.w2.weight", 2, 1},
		{"model.layers.0.block_sparse_moe.gate.weight", 2, replicated},
		{"model.decoder.layers.0.self_attn.out_proj.weight", 2, 1},
		{"model.decoder.layers.0.self_attn.out_proj.bias", 1, replicated},
		{"gpt_neox.layers.0.mlp.dense_4h_to_h.weight", 2, 1},
		{"gpt_neox.layers.0.mlp.dense_4h_to_h.bias", 1, replicated},
		// Fused on disk: no plain chunk is a rank's share.
		{"model.layers.0.self_attn.qkv_proj.weight", 2, replicated},
		{"model.layers.0.self_attn.qkv_proj.bias", 1, replicated},
		{"model.layers.0.mlp.gate_up_proj.weight", 2, replicated},
		{"transformer.h.0.attn.c_attn.weight", 2, replicated},
		{"transformer.h.0.self_attention.query_key_value.weight", 2, replicated},
		{"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", 2, replicated},
		// Anchoring on the last components.
		{"q_proj.weight", 2, 0},
		{"model.layers.0.self_attn.q_proj.weight_scale", 2, replicated},
		{"model.layers.0.self_attn.xq_proj.weight", 2, replicated},
		{"model.layers.0.self_attn.o_proj.lora_A.weight", 2, replicated},
		{"model.layers.0.mlp.w22.weight", 2, replicated},
		// A rule's dimension the tensor lacks: replicated, not refused.
		{"model.layers.0.self_attn.o_proj.weight", 1, replicated},
		{"model.embed_tokens.weight", 0, replicated},
	} {
		got, ok := TPDim(tc.name, tc.ndim)
		if !ok {
			got = replicated
		}
		assert.Equal(t, tc.want, got, "%s (%d-d)", tc.name, tc.ndim)
	}
}

// TestTPShare: size 1 and replicated tensors get no share (the whole
// tensor); split ones get the rule's dimension and the caller's rank.
func TestTPShare(t *testing.T) {
	q := safetensors.Tensor{Name: "m.q_proj.bias", DType: safetensors.BF16, Shape: []int64{6}, End: 12}
	n := safetensors.Tensor{Name: "m.norm.weight", DType: safetensors.BF16, Shape: []int64{6}, End: 12}
	assert.Nil(t, TPShare(q, 0, 1))
	assert.Nil(t, TPShare(n, 1, 2))
	assert.Equal(t, &Share{Dim: 0, Rank: 1, Size: 2}, TPShare(q, 1, 2))
}

// TestShareChunksLikeTorch: a share is piece Rank of torch.chunk(Size,
// Dim), built here as torch builds it (pieces of ceil(n/size) while
// elements remain; ranks past the last piece empty), for every length up to
// 13 and size up to 5, along each dimension of a 3-d tensor.
func TestShareChunksLikeTorch(t *testing.T) {
	for n := int64(0); n <= 13; n++ {
		for size := 1; size <= 5; size++ {
			cs := (n + int64(size) - 1) / int64(size)
			var pieces [][2]int64
			for s := int64(0); s < n; s += cs {
				pieces = append(pieces, [2]int64{s, min(s+cs, n)})
			}
			for dim := range 3 {
				shape := []int64{3, 2, 4}
				shape[dim] = n
				tn := safetensors.Tensor{Name: "w", DType: safetensors.F16, Shape: shape}
				tn.End = tn.DType.ElemSize() * shape[0] * shape[1] * shape[2]
				full := make([]byte, tn.End)
				for i := range full {
					full[i] = byte(i)
				}
				for rank := range size {
					at := fmt.Sprintf("n %d size %d dim %d rank %d", n, size, dim, rank)
					want := [2]int64{n, n}
					if rank < len(pieces) {
						want = pieces[rank]
					}
					s, e := chunkRange(n, rank, size)
					require.Equal(t, want, [2]int64{s, e}, at)
					sl, err := (&Share{Dim: dim, Rank: rank, Size: size}).Layout(tn)
					require.NoError(t, err, at)
					require.Equal(t, want[1]-want[0], sl.Shape[dim], at)
					require.True(t, bytes.Equal(torchChunk(full, shape, 2, dim, want[0], want[1]), cpuShare(full, sl)), "%s: bytes differ", at)
				}
			}
		}
	}
}

// torchChunk returns elements [s, e) along dim of a row-major tensor of
// shape with es-byte elements, walking every element: the slow, obvious
// slice, to check Share.Layout's rows, pitch and offsets against.
func torchChunk(full []byte, shape []int64, es int64, dim int, s, e int64) []byte {
	var out []byte
	idx := make([]int64, len(shape))
	total := int64(1)
	for _, d := range shape {
		total *= d
	}
	for i := int64(0); i < total; i++ {
		if idx[dim] >= s && idx[dim] < e {
			out = append(out, full[i*es:(i+1)*es]...)
		}
		for k := len(shape) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
	}
	return out
}
