package gpuio

import (
	"strings"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// LlamaShare returns the share of tensor t that tensor-parallel rank rank of
// size gets under the Megatron/vLLM convention for Llama-style models:
// column-parallel weights (q/k/v/gate/up projections, embeddings, lm_head)
// split along dimension 0, row-parallel weights (o/down projections) along
// dimension 1, and everything else (norms, 1-D tensors) replicated (nil).
func LlamaShare(t safetensors.Tensor, rank, size int) *Share {
	if size <= 1 || len(t.Shape) < 2 {
		return nil
	}
	name := t.Name
	for _, s := range []string{"o_proj.", "down_proj.", "out_proj.", "dense_4h_to_h."} {
		if strings.Contains(name, s) {
			return &Share{Dim: 1, Rank: rank, Size: size}
		}
	}
	for _, s := range []string{"q_proj.", "k_proj.", "v_proj.", "gate_proj.", "up_proj.", "embed_tokens.", "lm_head.", "qkv_proj.", "gate_up_proj."} {
		if strings.Contains(name, s) {
			return &Share{Dim: 0, Rank: rank, Size: size}
		}
	}
	return nil
}
