package demomodel

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

func TestArchFor(t *testing.T) {
	for _, size := range []int64{MinSize, 3 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 8 << 30, 16 << 30, 140 << 30} {
		a, err := ArchFor(size)
		if err != nil {
			t.Fatalf("ArchFor(%d): %v", size, err)
		}
		got := a.weightBytes()
		if d := float64(got-size) / float64(size); d > 0.001 || d < -0.05 {
			t.Errorf("ArchFor(%d) = %+v: %d weight bytes, %.1f%% off", size, a, got, 100*d)
		}
		if a.NumLayers < 2 || a.Shards < 2 || a.NumHeads*a.HeadDim != a.HiddenSize || a.NumHeads%a.NumKVHeads != 0 {
			t.Errorf("ArchFor(%d) = %+v: implausible", size, a)
		}
		if a.Shards > 2 && got/int64(a.Shards) > MaxShardSize {
			t.Errorf("ArchFor(%d): shards of %d bytes", size, got/int64(a.Shards))
		}
		t.Logf("%6d MiB: %+v", size>>20, a)
	}
	if _, err := ArchFor(MinSize - 1); err == nil {
		t.Error("ArchFor below MinSize: no error")
	}
}

func TestAssignShards(t *testing.T) {
	for n := 2; n <= 6; n++ {
		for _, sizes := range [][]int64{{1, 1, 1, 1, 1, 1}, {100, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 100}, {5, 5, 5, 5, 5, 5, 5, 5, 5}} {
			var ts []*tensor
			var total int64
			for _, s := range sizes {
				ts = append(ts, &tensor{spec: safetensors.TensorSpec{DType: safetensors.U8, Shape: []int64{s}}})
				total += s
			}
			assignShards(ts, n, total)
			seen := make([]int, n)
			prev := 0
			for _, tt := range ts {
				if tt.shard < prev || tt.shard > prev+1 {
					t.Fatalf("n=%d sizes %v: shard sequence jumps at %d", n, sizes, tt.shard)
				}
				prev = tt.shard
				seen[tt.shard]++
			}
			for k, c := range seen {
				if c == 0 && len(sizes) >= n {
					t.Errorf("n=%d sizes %v: shard %d empty", n, sizes, k)
				}
			}
		}
	}
}

func tensorData(t *testing.T, dir string) (map[string][]byte, map[string]int64) {
	t.Helper()
	shards, err := Shards(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) < 2 {
		t.Fatalf("%d shards in %s, want >= 2", len(shards), dir)
	}
	data := map[string][]byte{}
	hdrLens := map[string]int64{}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &index); err != nil {
		t.Fatal(err)
	}
	for _, p := range shards {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := safetensors.Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if holes := h.Holes(int64(len(b))); len(holes) != 0 {
			t.Errorf("%s: holes %v", p, holes)
		}
		hdrLens[filepath.Base(p)] = h.Len
		for _, tn := range h.Tensors {
			if index.WeightMap[tn.Name] != filepath.Base(p) {
				t.Errorf("index maps %s to %q, but it is in %s", tn.Name, index.WeightMap[tn.Name], filepath.Base(p))
			}
			data[tn.Name] = b[h.DataStart()+tn.Begin : h.DataStart()+tn.End]
		}
	}
	if len(data) != len(index.WeightMap) {
		t.Errorf("%d tensors in shards, %d in index", len(data), len(index.WeightMap))
	}
	return data, hdrLens
}

func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	var calls int
	var lastDone, lastTotal int64
	res, err := Generate(dir, Options{Size: 8 << 20, Seed: 7, Progress: func(done, total int64) {
		calls++
		if done < lastDone || done > total {
			t.Errorf("progress %d/%d after %d", done, total, lastDone)
		}
		lastDone, lastTotal = done, total
	}})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || lastDone != lastTotal || lastTotal != 2*res.TensorBytes {
		t.Errorf("progress: %d calls, last %d/%d, want total %d", calls, lastDone, lastTotal, 2*res.TensorBytes)
	}
	var sum int64
	for _, f := range res.Files {
		st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil || st.Size() != f.Size {
			t.Errorf("file %s: %v, size %d want %d", f.Path, err, st.Size(), f.Size)
		}
		sum += f.Size
	}
	if sum != res.Bytes {
		t.Errorf("Bytes = %d, files add up to %d", res.Bytes, sum)
	}
	for _, v := range []string{Base, Finetuned} {
		for _, name := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} {
			b, err := os.ReadFile(filepath.Join(dir, v, name))
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(b) {
				t.Errorf("%s/%s is not valid JSON", v, name)
			}
			if name == "tokenizer.json" && len(b) < 20<<10 {
				t.Errorf("tokenizer.json only %d bytes", len(b))
			}
		}
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, Base, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["hidden_size"].(float64) != float64(res.Arch.HiddenSize) || cfg["num_hidden_layers"].(float64) != float64(res.Arch.NumLayers) {
		t.Errorf("config %v does not match %+v", cfg, res.Arch)
	}

	base, baseHdr := tensorData(t, res.BaseDir)
	ft, ftHdr := tensorData(t, res.FinetunedDir)
	var total, same int64
	changed := map[string]bool{}
	for _, n := range res.ChangedTensors {
		changed[n] = true
	}
	for name, b := range base {
		total += int64(len(b))
		f, ok := ft[name]
		if !ok || len(f) != len(b) {
			t.Fatalf("tensor %s missing or resized in the fine-tune", name)
		}
		if bytes.Equal(b, f) {
			same += int64(len(b))
			if changed[name] {
				t.Errorf("%s reported changed but identical", name)
			}
		} else if !changed[name] {
			t.Errorf("%s differs but is not reported changed", name)
		}
	}
	if total != res.TensorBytes || total-same != res.ChangedBytes {
		t.Errorf("tensor bytes %d (changed %d), result says %d (%d)", total, total-same, res.TensorBytes, res.ChangedBytes)
	}
	if frac := float64(same) / float64(total); frac < 0.89 || frac > 0.93 {
		t.Errorf("base and fine-tune share %.1f%% of tensor bytes, want about 90%%", 100*frac)
	}
	if d := float64(total-8<<20) / float64(8<<20); d > 0.001 || d < -0.05 {
		t.Errorf("tensor bytes %d, %.1f%% off the 8 MiB asked for", total, 100*d)
	}
	for name, n := range baseHdr {
		if ftHdr[name] == n {
			t.Errorf("%s: header length %d in both versions", name, n)
		}
	}
	// Content is neither zeros nor compressible.
	emb := base["model.embed_tokens.weight"]
	var cb bytes.Buffer
	zw, _ := flate.NewWriter(&cb, flate.BestSpeed)
	zw.Write(emb)
	zw.Close()
	if r := float64(cb.Len()) / float64(len(emb)); r < 0.9 {
		t.Errorf("embedding compresses to %.2f of its size", r)
	}
	for i := 0; i+1 < len(emb); i += 2 {
		if emb[i+1]&0x40 != 0 {
			t.Fatalf("bf16 value %#04x at %d has the top exponent bit set", uint16(emb[i])|uint16(emb[i+1])<<8, i)
		}
	}
	for name, b := range base {
		if strings.HasSuffix(name, "norm.weight") {
			for i := 0; i+1 < len(b); i += 2 {
				if v := uint16(b[i]) | uint16(b[i+1])<<8; v < 0x3F78 || v > 0x3F87 {
					t.Fatalf("%s: %#04x is not near 1.0", name, v)
				}
			}
		}
	}
}

func digest(t *testing.T, res *Result) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	for _, f := range res.Files {
		fh, err := os.Open(filepath.Join(res.Dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		io.Copy(h, fh)
		fh.Close()
		m[f.Path] = [32]byte(h.Sum(nil))
	}
	return m
}

func TestDeterministic(t *testing.T) {
	a, err := Generate(t.TempDir(), Options{Size: 2 << 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(t.TempDir(), Options{Size: 2 << 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Generate(t.TempDir(), Options{Size: 2 << 20, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	da, db, dc := digest(t, a), digest(t, b), digest(t, c)
	if len(da) != len(a.Files) || len(da) < 10 {
		t.Fatalf("%d files", len(da))
	}
	for p, h := range da {
		if db[p] != h {
			t.Errorf("%s differs between two runs with one seed", p)
		}
		if strings.HasSuffix(p, ".safetensors") && dc[p] == h {
			t.Errorf("%s identical for seeds 1 and 2", p)
		}
	}
	// Identical files across versions: tokenizer and generation config.
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if da["base/"+name] != da["finetuned/"+name] {
			t.Errorf("%s differs between versions", name)
		}
	}
	if da["base/config.json"] == da["finetuned/config.json"] {
		t.Error("config.json identical between versions")
	}
}

func BenchmarkGenerate(b *testing.B) {
	const size = 64 << 20
	dir := b.TempDir()
	b.SetBytes(2 * size)
	for b.Loop() {
		if _, err := Generate(dir, Options{Size: size, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFillBF16(b *testing.B) {
	buf := make([]byte, 1<<20)
	r := rng{s: 1}
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		r.fillBF16(buf)
	}
}
