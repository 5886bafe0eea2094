package gpuio

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/internal/testneeds"
)

// parityPy prints, for every tensor-parallel size in argv[2] (comma
// separated) and every rank, each tensor's share of the safetensors file
// argv[1] as kylix.split cuts it (split_dim, chunk_range), slicing the raw
// bytes with numpy: {"size/rank": {name: {"shape": [...], "hex": "..."}}}.
// Where torch is importable it also checks that the share is
// full.chunk(size, dim)[rank], the definition split.py documents.
const parityPy = `
import json, sys
import numpy as np
from kylix import split
from kylix.safetensors import parse_file
try:
    import torch
except ImportError:
    torch = None

path, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
h = parse_file(path)
raw = np.fromfile(path, dtype=np.uint8)
out = {}
for size in sizes:
    for rank in range(size):
        shares = {}
        for name, t in h.tensors.items():
            full = raw[t.offset:t.offset + t.nbytes].reshape(tuple(t.shape) + (t.itemsize,))
            part = full
            dim = split.split_dim(name, len(t.shape))
            if dim is not None:
                s, e = split.chunk_range(t.shape[dim], rank, size)
                idx = [slice(None)] * full.ndim
                idx[dim] = slice(s, e)
                part = full[tuple(idx)]
                if torch is not None:
                    chunks = torch.from_numpy(full.copy()).chunk(size, dim)
                    want = chunks[rank].numpy().tobytes() if rank < len(chunks) else b""
                    if part.tobytes() != want:
                        sys.exit(f"{name} rank {rank}/{size}: chunk_range differs from torch.chunk")
            shares[name] = {"shape": list(part.shape[:-1]), "hex": np.ascontiguousarray(part).tobytes().hex()}
        out[f"{size}/{rank}"] = shares
json.dump(out, sys.stdout)
`

// parityShare is one tensor's share for one rank: its shape and bytes.
type parityShare struct {
	Shape []int64 `json:"shape"`
	Hex   string  `json:"hex"`
}

// qwen2Checkpoint writes a small Qwen2-style checkpoint (q/k/v with biases,
// o_proj, gate/up/down, embeddings, lm_head, norms) plus the names other
// families use (fused qkv_proj/gate_up_proj as Phi-3 stores them, Mixtral's
// experts w1/w2/w3, GPT-NeoX's dense_4h_to_h with its bias, a row-parallel
// bias): sizes that do not divide by 2 or 3, and a dimension too short for
// every rank of 3 to get a piece, so the uneven rule is exercised too.
func qwen2Checkpoint(t *testing.T, path string) {
	t.Helper()
	const hidden, kv, inter, vocab = 6, 3, 11, 13
	specs := []struct {
		name  string
		dt    safetensors.DType
		shape []int64
	}{
		{"model.embed_tokens.weight", safetensors.BF16, []int64{vocab, hidden}},
		{"model.layers.0.input_layernorm.weight", safetensors.BF16, []int64{hidden}},
		{"model.layers.0.self_attn.q_proj.weight", safetensors.BF16, []int64{hidden, hidden}},
		{"model.layers.0.self_attn.q_proj.bias", safetensors.BF16, []int64{hidden}},
		{"model.layers.0.self_attn.k_proj.weight", safetensors.BF16, []int64{kv, hidden}},
		{"model.layers.0.self_attn.k_proj.bias", safetensors.BF16, []int64{kv}},
		{"model.layers.0.self_attn.v_proj.weight", safetensors.F32, []int64{kv, hidden}},
		{"model.layers.0.self_attn.v_proj.bias", safetensors.F32, []int64{kv}},
		{"model.layers.0.self_attn.o_proj.weight", safetensors.BF16, []int64{hidden, hidden}},
		{"model.layers.0.self_attn.rotary_emb.inv_freq", safetensors.F32, []int64{hidden / 2}},
		{"model.layers.0.post_attention_layernorm.weight", safetensors.BF16, []int64{hidden}},
		{"model.layers.0.mlp.gate_proj.weight", safetensors.BF16, []int64{inter, hidden}},
		{"model.layers.0.mlp.up_proj.weight", safetensors.BF16, []int64{inter, hidden}},
		{"model.layers.0.mlp.down_proj.weight", safetensors.BF16, []int64{hidden, inter}},
		{"model.layers.1.self_attn.qkv_proj.weight", safetensors.F16, []int64{hidden + 2*kv, hidden}},
		{"model.layers.1.self_attn.o_proj.weight", safetensors.F16, []int64{hidden, hidden}},
		{"model.layers.1.self_attn.o_proj.bias", safetensors.F16, []int64{hidden}},
		{"model.layers.1.mlp.gate_up_proj.weight", safetensors.F16, []int64{2 * inter, hidden}},
		{"model.layers.1.block_sparse_moe.gate.weight", safetensors.F32, []int64{2, hidden}},
		{"model.layers.1.block_sparse_moe.experts.0.w1.weight", safetensors.U8, []int64{4, hidden}},
		{"model.layers.1.block_sparse_moe.experts.0.w2.weight", safetensors.U8, []int64{hidden, 4}},
		{"model.layers.1.block_sparse_moe.experts.0.w3.weight", safetensors.U8, []int64{4, hidden}},
		{"model.layers.1.mlp.dense_4h_to_h.weight", safetensors.F32, []int64{hidden, 5}},
		{"model.layers.1.mlp.dense_4h_to_h.bias", safetensors.F32, []int64{hidden}},
		{"model.norm.weight", safetensors.BF16, []int64{hidden}},
		{"lm_head.weight", safetensors.BF16, []int64{vocab, hidden}},
	}
	r := rand.New(rand.NewPCG(17, 4))
	var ts []safetensors.WriteTensor
	for _, s := range specs {
		n := s.dt.ElemSize()
		for _, d := range s.shape {
			n *= d
		}
		ts = append(ts, safetensors.WriteTensor{Name: s.name, DType: s.dt, Shape: s.shape, Data: randBytes(r, int(n))})
	}
	var buf bytes.Buffer
	require.NoError(t, safetensors.Write(&buf, ts, nil))
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
}

// goRankShares places rank's share of every tensor of the stored file f
// the way kylix load --tp-size does (cmd/kylix/load.go loadOne: the share
// rules (TPShare), Share.Layout, one allocation with each tensor at a 256-byte
// boundary, one LoadTensors) into a HostDevice, and copies each share back.
// A tensor the rules cannot plan is reported in errs.
func goRankShares(t *testing.T, l *Loader, dev Device, f *chunkstore.File, h *safetensors.Header, rank, size int) (map[string]parityShare, []string) {
	t.Helper()
	var (
		targets []TensorTarget
		layouts []ShareLayout
		errs    []string
		total   int64
	)
	for _, tn := range h.Tensors {
		sh := TPShare(tn, rank, size)
		sl, err := sh.Layout(tn)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s rank %d of %d: Go cannot plan the share: %v", tn.Name, rank, size, err))
			continue
		}
		targets = append(targets, TensorTarget{Name: tn.Name, Share: sh, Off: total})
		layouts = append(layouts, sl)
		total += (sl.Bytes + 255) &^ 255
	}
	mem, err := dev.Alloc(max(total, 1))
	require.NoError(t, err)
	defer mem.Free()
	for i := range targets {
		targets[i].Mem = mem
	}
	_, err = l.LoadTensors(context.Background(), f, h, targets)
	require.NoError(t, err)
	out := map[string]parityShare{}
	for i, tt := range targets {
		b := make([]byte, layouts[i].Bytes)
		require.NoError(t, mem.CopyToHost(b, tt.Off))
		out[tt.Name] = parityShare{Shape: layouts[i].Shape, Hex: hex.EncodeToString(b)}
	}
	return out, errs
}

// TestTPRulesParityWithPython: kylix load --tp-size (Go) and
// kylix.torch.load_file(tp_size=) (Python, kylix.split) must give every rank
// the same bytes of every tensor, or ranks loaded by the two disagree about
// the model. Both cut the same Qwen2-style checkpoint for sizes 2 and 3 and
// every rank; every share's shape and bytes are compared.
func TestTPRulesParityWithPython(t *testing.T) {
	py, err := testneeds.Python("numpy")
	if err != nil {
		testneeds.Missing(t, "%v (apt-get install -y python3-numpy)", err)
	}
	_, self, _, _ := runtime.Caller(0)
	pyPath := filepath.Join(filepath.Dir(self), "..", "contrib", "python")

	dir := t.TempDir()
	ckpt := filepath.Join(dir, "model.safetensors")
	qwen2Checkpoint(t, ckpt)
	sizes := []int{2, 3}

	cmd := exec.Command(py, "-c", parityPy, ckpt, "2,3")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "python (%s) with kylix.split: %s", py, stderr.String())
	var pyShares map[string]map[string]parityShare
	require.NoError(t, json.Unmarshal(out, &pyShares))

	st, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Import(context.Background(), ckpt, "model.safetensors", chunkstore.ImportOptions{})
	require.NoError(t, err)
	f, _, err := st.OpenPath("model.safetensors")
	require.NoError(t, err)
	h, err := safetensors.Parse(f, f.Size())
	require.NoError(t, err)
	dev := &HostDevice{}
	l, err := New(st, dev, Options{})
	require.NoError(t, err)
	defer l.Close()

	var diffs []string
	for _, size := range sizes {
		for rank := range size {
			want, ok := pyShares[fmt.Sprintf("%d/%d", size, rank)]
			require.True(t, ok, "python printed no shares for rank %d of %d", rank, size)
			at := fmt.Sprintf("rank %d of %d", rank, size)
			got, errs := goRankShares(t, l, dev, f, h, rank, size)
			diffs = append(diffs, errs...)
			for _, tn := range h.Tensors {
				g, gok := got[tn.Name]
				w, wok := want[tn.Name]
				switch {
				case !wok:
					diffs = append(diffs, fmt.Sprintf("%s %s: python printed no share", tn.Name, at))
				case !gok:
					// reported by goRankShares
				case !slices.Equal(g.Shape, w.Shape):
					diffs = append(diffs, fmt.Sprintf("%s %s: Go share %v, Python share %v", tn.Name, at, g.Shape, w.Shape))
				case g.Hex != w.Hex:
					diffs = append(diffs, fmt.Sprintf("%s %s: same shape %v, different bytes", tn.Name, at, g.Shape))
				}
			}
		}
	}
	if len(diffs) > 0 {
		t.Fatalf("Go (kylix load --tp-size) and Python (kylix.split) give ranks different shares, %d differences:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
}
