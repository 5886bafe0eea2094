// Package demomodel writes a synthetic but realistic pair of model versions
// — a Llama-style base checkpoint and a fine-tune of it — for tests, demos
// and benchmarks, since nothing can be downloaded on our machines.
//
// Generate writes dir/base/ and dir/finetuned/, each laid out like a Hugging
// Face model repository: config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json, safetensors shards model-0000K-of-0000N.safetensors
// (at least 2, each at most about 2 GiB) and model.safetensors.index.json.
// The dimensions are chosen from Options.Size so that the weights total close
// to it, from a few MiB to many GiB.
//
// Tensor contents are pseudo-random and deterministic for a seed: each tensor
// has its own stream, keyed by the seed and its name, so a tensor's bytes do
// not depend on which shard or offset it lands in. The bf16 matrices are
// random bits with the top exponent bit cleared — every value finite and
// within (-2, 2), and the bytes essentially incompressible (15 random bits in
// 16), so compression cannot flatter a measurement. Norm weights are close to
// 1.0, as in a trained model.
//
// The fine-tune changes about 10% of the tensor bytes — every attention and
// MLP matrix of the last few layers, as partial fine-tuning does — and leaves
// every other tensor byte-identical. Its safetensors headers carry extra
// __metadata__ entries, so their length differs and every tensor sits at a
// different file offset than in the base; its config.json differs slightly.
// tokenizer files and generation_config.json are identical.
//
// Files are streamed to disk through a 1 MiB buffer; no shard is ever held
// in memory.
package demomodel

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// MinSize is the smallest Options.Size Generate accepts.
const MinSize = 1 << 20

// MaxShardSize is the size above which weights are split into more shards.
const MaxShardSize = 2 << 30

// ChangedFraction is the share of tensor bytes the fine-tune changes, at most.
const ChangedFraction = 0.10

// Options configures Generate.
type Options struct {
	// Size is the target total bytes of weights of one version (at least
	// MinSize). The result is within a few percent of it.
	Size int64
	// Seed selects the content; the same Size and Seed give the same bytes.
	Seed int64
	// Progress, if set, is called as tensor data is written with the bytes
	// written so far and the total for both versions (2 * TensorBytes).
	Progress func(done, total int64)
}

// Arch is the shape of the generated model.
type Arch struct {
	HiddenSize       int
	IntermediateSize int
	NumLayers        int
	NumHeads         int
	NumKVHeads       int
	HeadDim          int
	VocabSize        int
	Shards           int
}

// File is one file Generate wrote.
type File struct {
	Path string // relative to the output dir, slash-separated: "base/config.json"
	Size int64
}

// Result describes what Generate wrote.
type Result struct {
	Dir            string // the output dir
	BaseDir        string // Dir/base
	FinetunedDir   string // Dir/finetuned
	Arch           Arch
	Files          []File // every file written, base first, in write order
	Bytes          int64  // total size of Files
	TensorBytes    int64  // tensor data bytes of one version
	ChangedTensors []string
	ChangedBytes   int64 // tensor data bytes that differ between the versions
}

// Version names, also the subdirectory names.
const (
	Base      = "base"
	Finetuned = "finetuned"
)

// tensor is one weight of the model in module order.
type tensor struct {
	spec    safetensors.TensorSpec
	norm    bool // a norm weight (values near 1.0)
	changed bool // differs in the fine-tune
	shard   int
}

// Generate writes the base and fine-tuned model into dir (created if needed;
// files already there are overwritten) and returns what it wrote.
func Generate(dir string, opts Options) (*Result, error) {
	arch, err := ArchFor(opts.Size)
	if err != nil {
		return nil, err
	}
	ts := tensors(arch)
	res := &Result{
		Dir:          dir,
		BaseDir:      filepath.Join(dir, Base),
		FinetunedDir: filepath.Join(dir, Finetuned),
		Arch:         arch,
	}
	for _, t := range ts {
		res.TensorBytes += t.spec.Size()
	}
	markChanged(ts, arch, int64(ChangedFraction*float64(res.TensorBytes)))
	for _, t := range ts {
		if t.changed {
			res.ChangedTensors = append(res.ChangedTensors, t.spec.Name)
			res.ChangedBytes += t.spec.Size()
		}
	}
	assignShards(ts, arch.Shards, res.TensorBytes)

	g := &gen{opts: opts, res: res, total: 2 * res.TensorBytes, buf: make([]byte, 1<<20)}
	for _, v := range []string{Base, Finetuned} {
		if err := g.version(v, ts); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// ArchFor returns the model shape Generate uses for size bytes of weights:
// the widest Llama-like shape whose layer count is at least hidden/128 (as
// in Llama 7B to 70B), with the vocabulary absorbing the remainder so the
// total comes close to size.
func ArchFor(size int64) (Arch, error) {
	if size < MinSize {
		return Arch{}, fmt.Errorf("model size %d is below the %d-byte minimum", size, MinSize)
	}
	var best Arch
	for _, h := range []int{64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192} {
		a := shapeFor(h)
		v0 := min(32000, int(size/5/int64(4*h))/64*64)
		if v0 < 256 {
			continue
		}
		l := (size - int64(4*h*v0) - int64(2*h)) / a.layerBytes()
		if l < int64(max(2, h/128)) {
			break
		}
		a.NumLayers = int(l)
		best = a
	}
	if best.HiddenSize == 0 {
		return Arch{}, fmt.Errorf("model size %d too small for any shape", size)
	}
	h := int64(best.HiddenSize)
	best.VocabSize = int(min((size-int64(best.NumLayers)*best.layerBytes()-2*h)/(4*h)/64*64, 152064))
	best.Shards = int(max(2, (best.weightBytes()+MaxShardSize-1)/MaxShardSize))
	return best, nil
}

func shapeFor(h int) Arch {
	a := Arch{HiddenSize: h, HeadDim: 128}
	if h < 1024 {
		a.HeadDim = 64
	}
	a.NumHeads = h / a.HeadDim
	a.NumKVHeads = a.NumHeads
	if a.NumHeads >= 8 && a.NumHeads%4 == 0 {
		a.NumKVHeads = a.NumHeads / 4 // grouped-query attention
	}
	a.IntermediateSize = (h*43/16 + 63) / 64 * 64 // 11008 for 4096, as Llama
	return a
}

func (a Arch) layerBytes() int64 {
	h, kv, i := int64(a.HiddenSize), int64(a.NumKVHeads*a.HeadDim), int64(a.IntermediateSize)
	return 2 * (2*h*h + 2*h*kv + 3*h*i + 2*h)
}

func (a Arch) weightBytes() int64 {
	h := int64(a.HiddenSize)
	return int64(a.NumLayers)*a.layerBytes() + 4*h*int64(a.VocabSize) + 2*h
}

// tensors lists the model's weights in module order, as Hugging Face
// shards them.
func tensors(a Arch) []*tensor {
	h, kv, i, v := int64(a.HiddenSize), int64(a.NumKVHeads*a.HeadDim), int64(a.IntermediateSize), int64(a.VocabSize)
	var ts []*tensor
	add := func(name string, norm bool, shape ...int64) {
		ts = append(ts, &tensor{spec: safetensors.TensorSpec{Name: name, DType: safetensors.BF16, Shape: shape}, norm: norm})
	}
	add("model.embed_tokens.weight", false, v, h)
	for l := 0; l < a.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", true, h)
		add(p+"self_attn.q_proj.weight", false, h, h)
		add(p+"self_attn.k_proj.weight", false, kv, h)
		add(p+"self_attn.v_proj.weight", false, kv, h)
		add(p+"self_attn.o_proj.weight", false, h, h)
		add(p+"post_attention_layernorm.weight", true, h)
		add(p+"mlp.gate_proj.weight", false, i, h)
		add(p+"mlp.up_proj.weight", false, i, h)
		add(p+"mlp.down_proj.weight", false, h, i)
	}
	add("model.norm.weight", true, h)
	add("lm_head.weight", false, v, h)
	return ts
}

// markChanged picks the fine-tune's changes: the weights of the last layers,
// from the top down, while they fit in budget bytes.
func markChanged(ts []*tensor, a Arch, budget int64) {
	var used int64
	for l := a.NumLayers - 1; l >= 0; l-- {
		p := fmt.Sprintf("model.layers.%d.", l)
		for _, t := range ts {
			if len(t.spec.Name) > len(p) && t.spec.Name[:len(p)] == p && used+t.spec.Size() <= budget {
				t.changed = true
				used += t.spec.Size()
			}
		}
	}
}

// assignShards cuts the module-order list into n shards of about equal
// bytes, none empty.
func assignShards(ts []*tensor, n int, total int64) {
	var cum int64
	shard := 0
	for i, t := range ts {
		if want := int(min(int64(n-1), cum*int64(n)/max(total, 1))); want > shard {
			shard++ // at most one shard per tensor, so none is skipped
		}
		if rem := len(ts) - i; rem <= n-1-shard {
			shard = n - rem // one tensor for each shard still to come
		}
		t.shard = shard
		cum += t.spec.Size()
	}
}

type gen struct {
	opts  Options
	res   *Result
	done  int64
	total int64
	buf   []byte
}

func (g *gen) version(v string, ts []*tensor) error {
	vdir := filepath.Join(g.res.Dir, v)
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	a := g.res.Arch
	weightMap := make(map[string]string, len(ts))
	for k := 0; k < a.Shards; k++ {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, a.Shards)
		var shard []*tensor
		for _, t := range ts {
			if t.shard == k {
				shard = append(shard, t)
				weightMap[t.spec.Name] = name
			}
		}
		// Within a file, tensors are sorted by name, as the reference writer
		// does for tensors of one dtype.
		sort.Slice(shard, func(i, j int) bool { return shard[i].spec.Name < shard[j].spec.Name })
		if err := g.shard(v, name, shard); err != nil {
			return err
		}
	}
	index := map[string]any{
		"metadata":   map[string]any{"total_size": g.res.TensorBytes},
		"weight_map": weightMap,
	}
	files := []struct {
		name string
		val  any
	}{
		{"config.json", config(a, v)},
		{"generation_config.json", map[string]any{"_from_model_config": true, "do_sample": true, "bos_token_id": 1, "eos_token_id": 2, "temperature": 0.6, "top_p": 0.9, "max_length": 4096, "transformers_version": "4.44.0"}},
		{"tokenizer_config.json", map[string]any{"add_bos_token": true, "add_eos_token": false, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": nil, "model_max_length": 4096, "tokenizer_class": "LlamaTokenizer", "clean_up_tokenization_spaces": false}},
		{"model.safetensors.index.json", index},
	}
	for _, f := range files {
		b, err := json.MarshalIndent(f.val, "", "  ")
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if err := g.writeSmall(v, f.name, append(b, '\n')); err != nil {
			return err
		}
	}
	return g.writeSmall(v, "tokenizer.json", tokenizerJSON(a.VocabSize, g.opts.Seed))
}

func config(a Arch, v string) map[string]any {
	c := map[string]any{
		"_name_or_path":           "kylix-demo-" + v,
		"architectures":           []string{"LlamaForCausalLM"},
		"attention_bias":          false,
		"bos_token_id":            1,
		"eos_token_id":            2,
		"hidden_act":              "silu",
		"hidden_size":             a.HiddenSize,
		"head_dim":                a.HeadDim,
		"initializer_range":       0.02,
		"intermediate_size":       a.IntermediateSize,
		"max_position_embeddings": 4096,
		"model_type":              "llama",
		"num_attention_heads":     a.NumHeads,
		"num_hidden_layers":       a.NumLayers,
		"num_key_value_heads":     a.NumKVHeads,
		"rms_norm_eps":            1e-05,
		"rope_theta":              10000.0,
		"tie_word_embeddings":     false,
		"torch_dtype":             "bfloat16",
		"transformers_version":    "4.44.0",
		"use_cache":               true,
		"vocab_size":              a.VocabSize,
	}
	if v == Finetuned {
		c["finetuned_from"] = "kylix-demo-" + Base
		c["use_cache"] = false
		c["max_position_embeddings"] = 8192
	}
	return c
}

func metadata(v string) map[string]string {
	md := map[string]string{"format": "pt"}
	if v == Finetuned {
		md["finetuned_from"] = "kylix-demo-" + Base
		md["training_steps"] = "1200"
		md["dataset"] = "kylix-demo-instruct"
	}
	return md
}

func (g *gen) writeSmall(v, name string, b []byte) error {
	rel := v + "/" + name
	if err := os.WriteFile(filepath.Join(g.res.Dir, v, name), b, 0o644); err != nil {
		return err
	}
	g.addFile(rel, int64(len(b)))
	return nil
}

func (g *gen) addFile(rel string, size int64) {
	g.res.Files = append(g.res.Files, File{Path: rel, Size: size})
	g.res.Bytes += size
}

func (g *gen) shard(v, name string, shard []*tensor) (err error) {
	path := filepath.Join(g.res.Dir, v, name)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	bw := bufio.NewWriterSize(f, 64<<10)
	cw := &countWriter{w: bw}
	specs := make([]safetensors.TensorSpec, len(shard))
	for i, t := range shard {
		specs[i] = t.spec
	}
	err = safetensors.WriteStream(cw, specs, metadata(v), func(i int, w io.Writer) error {
		t := shard[i]
		variant := uint64(0)
		if v == Finetuned && t.changed {
			variant = 1
		}
		return g.fill(w, t, variant)
	})
	if err != nil {
		return fmt.Errorf("%s/%s: %w", v, name, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("%s/%s: %w", v, name, err)
	}
	g.addFile(v+"/"+name, cw.n)
	return nil
}

// fill writes tensor t's bytes for the given variant (0: base; 1: changed by
// the fine-tune) to w.
func (g *gen) fill(w io.Writer, t *tensor, variant uint64) error {
	hf := fnv.New64a()
	hf.Write([]byte(t.spec.Name))
	r := rng{s: mix(uint64(g.opts.Seed)) ^ mix(hf.Sum64()) ^ mix(variant+0x1234)}
	left := t.spec.Size()
	for left > 0 {
		b := g.buf[:min(int64(len(g.buf)), left)]
		if t.norm {
			r.fillNorm(b)
		} else {
			r.fillBF16(b)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		left -= int64(len(b))
		g.done += int64(len(b))
		if g.opts.Progress != nil {
			g.opts.Progress(g.done, g.total)
		}
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// rng is wyrand: one multiply per 8 bytes, good enough statistically and
// fast enough to generate many GiB per second.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

func mix(z uint64) uint64 { // splitmix64's finalizer
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// fillBF16 fills b with little-endian bf16 values: random bits with bit 14
// (the exponent's top bit) clear, so every value is finite and in (-2, 2).
func (r *rng) fillBF16(b []byte) {
	const keep = 0xBFFF_BFFF_BFFF_BFFF
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.next()&keep)
	}
	if i < len(b) {
		var t [8]byte
		binary.LittleEndian.PutUint64(t[:], r.next()&keep)
		copy(b[i:], t[:])
	}
}

// fillNorm fills b with bf16 values near 1.0 (0x3F80), the shape of trained
// RMSNorm weights.
func (r *rng) fillNorm(b []byte) {
	for i := 0; i+1 < len(b); i += 2 {
		binary.LittleEndian.PutUint16(b[i:], uint16(0x3F78+r.next()%16))
	}
}

// ErrNotGenerated is returned by Shards for a directory with no generated shards.
var ErrNotGenerated = errors.New("no generated model")

// Shards lists the safetensors shards of one version directory, sorted.
func Shards(versionDir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(versionDir, "model-*-of-*.safetensors"))
	if err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNotGenerated, versionDir)
	}
	slices.Sort(m)
	return m, nil
}
