package chunking_test

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore/chunking"
	"github.com/kylix/kylix/internal/demomodel"
)

// The measurement behind the default chunk sizes (docs/design/chunking.md):
//
//	go test ./chunkstore/chunking -run TestMeasureDedup -v -demosize 256
//	go test ./chunkstore/chunking -run XXX -bench BenchmarkSplit -benchtime 2x -demosize 256

var demoSize = flag.Int64("demosize", 256, "size in MiB of the demo model pair used by TestMeasureDedup and BenchmarkSplit")

var demo struct {
	once sync.Once
	dir  string
	res  *demomodel.Result
	err  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if demo.dir != "" {
		os.RemoveAll(demo.dir)
	}
	os.Exit(code)
}

// demoModel generates the pair once per test binary.
func demoModel(tb testing.TB) *demomodel.Result {
	demo.once.Do(func() {
		demo.dir, demo.err = os.MkdirTemp("", "kylix-chunking-")
		if demo.err == nil {
			demo.res, demo.err = demomodel.Generate(demo.dir, demomodel.Options{Size: *demoSize << 20, Seed: 1})
		}
	})
	if demo.err != nil {
		tb.Fatal(demo.err)
	}
	return demo.res
}

type strategy struct {
	name     string
	maxChunk int64         // > 0: tensor-aware for .safetensors, DefaultCDC for the rest
	cdc      *chunking.CDC // else: CDC for every file
}

func strategies() []strategy {
	return []strategy{
		{name: "tensor-aware, max 1 MiB", maxChunk: 1 << 20},
		{name: "tensor-aware, max 4 MiB", maxChunk: 4 << 20},
		{name: "tensor-aware, max 16 MiB", maxChunk: 16 << 20},
		{name: "CDC avg 64 KiB (Xet)", cdc: chunking.XetCDC()},
		{name: "CDC avg 1 MiB (default)", cdc: chunking.DefaultCDC()},
	}
}

// spans chunks one file the way strategy s says.
func (s strategy) spans(path string, f *os.File, size int64) ([]chunking.Span, error) {
	if s.maxChunk > 0 {
		format, h, err := chunking.Detect(path, f, size)
		if err != nil {
			return nil, err
		}
		if format == chunking.FormatSafetensors {
			return chunking.TensorSpans(h, size, s.maxChunk), nil
		}
		return chunking.DefaultCDC().SpansReaderAt(f, size)
	}
	return s.cdc.SpansReaderAt(f, size)
}

func versionFiles(res *demomodel.Result, v string) []demomodel.File {
	var fs []demomodel.File
	for _, f := range res.Files {
		if strings.HasPrefix(f.Path, v+"/") {
			fs = append(fs, f)
		}
	}
	return fs
}

type tally struct {
	bytes, chunks int64
	ids           map[[32]byte]int64
	split, hash   time.Duration
}

func (t *tally) unique() int64 {
	var n int64
	for _, l := range t.ids {
		n += l
	}
	return n
}

// chunkVersion splits and hashes every file of one version into t.
func chunkVersion(tb testing.TB, res *demomodel.Result, s strategy, v string, t *tally, pair map[[32]byte]int64) {
	buf := make([]byte, 16<<20)
	for _, file := range versionFiles(res, v) {
		path := filepath.Join(res.Dir, filepath.FromSlash(file.Path))
		f, err := os.Open(path)
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Now()
		spans, err := s.spans(path, f, file.Size)
		if err != nil {
			tb.Fatal(err)
		}
		t.split += time.Since(start)
		start = time.Now()
		for _, sp := range spans {
			b := buf[:sp.Len]
			if _, err := f.ReadAt(b, sp.Off); err != nil && err != io.EOF {
				tb.Fatal(err)
			}
			id := blake3.Sum256(b)
			t.ids[id] = sp.Len
			pair[id] = sp.Len
		}
		t.hash += time.Since(start)
		t.bytes += file.Size
		t.chunks += int64(len(spans))
		f.Close()
	}
}

// TestMeasureDedup prints, for each chunking strategy, what the demo model
// pair costs to store: unique chunk bytes of each version and of both
// together, relative to one version.
func TestMeasureDedup(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement: generates a model pair; skipped with -short")
	}
	res := demoModel(t)
	var out strings.Builder
	fmt.Fprintf(&out, "demo pair: %d MiB of weights per version, %d tensors changed (%.1f%% of tensor bytes), arch %+v\n\n",
		res.TensorBytes>>20, len(res.ChangedTensors), 100*float64(res.ChangedBytes)/float64(res.TensorBytes), res.Arch)
	fmt.Fprintf(&out, "| strategy | chunks base | chunks pair (unique) | mean chunk | unique base MiB | unique finetuned MiB | stored pair MiB | pair / one version | split MB/s | split+hash MB/s |\n")
	fmt.Fprintf(&out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range strategies() {
		pair := map[[32]byte]int64{}
		var base, ft tally
		base.ids, ft.ids = map[[32]byte]int64{}, map[[32]byte]int64{}
		chunkVersion(t, res, s, demomodel.Base, &base, pair)
		chunkVersion(t, res, s, demomodel.Finetuned, &ft, pair)
		var stored int64
		for _, l := range pair {
			stored += l
		}
		total := base.bytes + ft.bytes
		split := base.split + ft.split
		mbps := func(d time.Duration) string {
			if d <= 0 {
				return "n/a"
			}
			v := float64(total) / d.Seconds() / 1e6
			if v > 100000 {
				return fmt.Sprintf(">%.0f", 100000.0)
			}
			return fmt.Sprintf("%.0f", v)
		}
		ratio := float64(stored) / float64(base.bytes)
		fmt.Fprintf(&out, "| %s | %d | %d | %.2f MiB | %.1f | %.1f | %.1f | %.4fx | %s | %s |\n",
			s.name, base.chunks, len(pair), float64(base.bytes)/float64(base.chunks)/(1<<20),
			float64(base.unique())/(1<<20), float64(ft.unique())/(1<<20), float64(stored)/(1<<20), ratio,
			mbps(split), mbps(split+base.hash+ft.hash))
		if s.maxChunk > 0 && ratio > 1.12 {
			t.Errorf("%s stores %.4fx one version for the pair, goal <= 1.12x", s.name, ratio)
		}
	}
	t.Logf("\n%s", out.String())
}

// BenchmarkSplit measures how fast each strategy computes the spans of the
// whole pair (no hashing).
func BenchmarkSplit(b *testing.B) {
	res := demoModel(b)
	for _, s := range strategies() {
		b.Run(strings.NewReplacer(" ", "_", ",", "").Replace(s.name), func(b *testing.B) {
			var total int64
			for _, f := range res.Files {
				total += f.Size
			}
			b.SetBytes(total)
			for b.Loop() {
				for _, file := range res.Files {
					path := filepath.Join(res.Dir, filepath.FromSlash(file.Path))
					f, err := os.Open(path)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := s.spans(path, f, file.Size); err != nil {
						b.Fatal(err)
					}
					f.Close()
				}
			}
		})
	}
}
