package gpuio

import (
	"regexp"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// The Python package reads the same table from a generated module, so that
// kylix load --tp-size and kylix.torch.load_file(tp_size=) cannot give a rank
// different shares; TestGeneratedPythonIsCurrent (internal/tprulesgen) fails
// when the module is stale.
//go:generate go run -ldflags=-checklinkname=0 ./internal/tprulesgen -o ../contrib/python/kylix/_tp_rules.py

// Replicate as a TPRule's Dim: every rank keeps the whole tensor.
const Replicate = -1

// TPRule says how the tensors whose names match Pattern are shared among
// tensor-parallel ranks: split along dimension Dim into the pieces
// torch.chunk makes (Share), or kept whole by every rank (Replicate).
type TPRule struct {
	// Layer names the vLLM layer kind the tensors belong to, and why the
	// rule is what it is; it is documentation, copied into the Python table.
	Layer string
	// Pattern is searched for in the tensor's name. It must mean the same in
	// Go's regexp (RE2) and Python's re, since both sides use it as is: the
	// rules anchor it on the name's last components ((^|\.)q_proj\.weight$),
	// so a name that merely contains "q_proj." (q_proj.weight_scale) does
	// not match.
	Pattern string
	// Dim is the dimension split, or Replicate.
	Dim int
}

// tpRules is the one table of tensor-parallel split rules, in the order
// they are tried (the first whose Pattern matches decides). It follows how
// vLLM shards each layer kind (model_executor/layers/linear.py and
// vocab_parallel_embedding.py): a rank keeps exactly the piece vLLM's weight
// loader narrows out of the checkpoint tensor, where that piece is a plain
// chunk.
var tpRules = []TPRule{
	// vLLM loads a tensor that is already fused on disk (Phi-3's qkv_proj
	// and gate_up_proj, ChatGLM's dense_h_to_4h) by cutting it into its
	// parts (q, k, v; gate, up) and narrowing each part: a rank's share is
	// a piece of each part, not one chunk of the whole. GPT-2's Conv1D
	// c_attn and GPT-NeoX/Falcon/Bloom's query_key_value interleave heads
	// and are permuted by their model code. dense_h_to_4h is a plain column
	// layer in GPT-NeoX and Falcon but fused gate/up in ChatGLM, and the
	// name cannot tell which. No plain chunk is right for all of them, so
	// every rank keeps them whole and the model's loader cuts.
	{"fused on disk: vLLM cuts each fused part, no single chunk is a rank's share", `(^|\.)(qkv_proj|gate_up_proj|query_key_value|c_attn|dense_h_to_4h)\.(weight|bias)$`, Replicate},
	// ColumnParallelLinear (QKVParallelLinear, MergedColumnParallelLinear
	// for the unfused checkpoint parts, Mixtral's expert w1/w3): output
	// features are split, so the bias is split with the weight.
	{"ColumnParallelLinear: weight and bias by output features", `(^|\.)(q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3)\.(weight|bias)$`, 0},
	// RowParallelLinear: input features are split; the bias is added once
	// after the all-reduce, so it is not split (the catch-all below).
	{"RowParallelLinear: weight by input features, bias replicated", `(^|\.)(o_proj|down_proj|w2|out_proj|dense_4h_to_h)\.weight$`, 1},
	// VocabParallelEmbedding and ParallelLMHead: the vocabulary is split.
	// vLLM pads the vocabulary to a multiple of 64 before dividing it, so
	// its pieces equal torch.chunk's only when the vocabulary is a multiple
	// of 64 and of the size (true of common models: 32000, 128256, 151936
	// for sizes up to 8); kylix.vllm hands these to the model's own loader.
	{"VocabParallelEmbedding, ParallelLMHead: by vocabulary", `(^|\.)(embed_tokens|lm_head)\.weight$`, 0},
	// Everything else (norms, row-parallel biases, rotary tables, routers)
	// matches nothing and is replicated.
}

var tpRulesRE = func() []*regexp.Regexp {
	res := make([]*regexp.Regexp, len(tpRules))
	for i, r := range tpRules {
		res[i] = regexp.MustCompile(r.Pattern)
	}
	return res
}()

// TPRules returns the split rules in the order they are tried; the
// generator of the Python table reads them here.
func TPRules() []TPRule {
	return append([]TPRule(nil), tpRules...)
}

// TPDim returns the dimension along which the tensor called name, of ndim
// dimensions, is split across tensor-parallel ranks, and false when every
// rank keeps it whole: no rule matches, the rule says Replicate, or the
// rule's dimension does not exist in this tensor (a 1-D tensor under a rule
// for dim 1), which kylix.split also replicates rather than refuses.
func TPDim(name string, ndim int) (int, bool) {
	for i, re := range tpRulesRE {
		if !re.MatchString(name) {
			continue
		}
		d := tpRules[i].Dim
		if d == Replicate || d >= ndim {
			return 0, false
		}
		return d, true
	}
	return 0, false
}

// TPShare returns the share of tensor t that tensor-parallel rank rank of
// size keeps under the split rules (TPRules), or nil for the whole tensor.
// kylix load --tp-size places these shares; kylix.torch.load_file(tp_size=)
// cuts the same ones.
func TPShare(t safetensors.Tensor, rank, size int) *Share {
	if size <= 1 {
		return nil
	}
	d, ok := TPDim(t.Name, len(t.Shape))
	if !ok {
		return nil
	}
	return &Share{Dim: d, Rank: rank, Size: size}
}

// chunkRange returns [start, end) of rank's piece of a dimension of length
// n cut as torch.chunk(size) cuts it: pieces of ceil(n/size), the last
// shorter. torch.chunk returns fewer than size pieces when n is small; the
// ranks past the last piece get an empty range (start == end == n), as
// kylix.split.chunk_range gives them.
func chunkRange(n int64, rank, size int) (int64, int64) {
	cs := (n + int64(size) - 1) / int64(size)
	start := min(int64(rank)*cs, n)
	return start, min(start+cs, n)
}
