package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/kylix/kylix/internal/demomodel"
)

func init() {
	register(&command{name: "demo-model", summary: "write a synthetic Llama-style model (base + finetuned) for tests and demos", run: runDemoModel})
}

func runDemoModel(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "demo-model", "[--size SIZE] [--seed N] OUT", `
Writes a realistic synthetic model under OUT/base: config.json,
tokenizer.json, generation_config.json, safetensors shards of bf16 tensors
shaped like a small Llama model, and model.safetensors.index.json. Under
OUT/finetuned it writes a variant that shares most tensors, changes about 10%
of the tensor bytes, and has safetensors headers of a different length.
Nothing is downloaded; the content is pseudo-random from --seed.`)
	size := f.String("size", "64MiB", "total tensor bytes of one version (e.g. 64MiB, 2GiB)")
	seed := f.Int64("seed", 1, "seed for the tensor contents")
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	n, err := parseSize(*size)
	if err != nil {
		return fmt.Errorf("demo-model: --size: %w", err)
	}
	p := newProgress(e, "demo-model")
	res, err := demomodel.Generate(f.Arg(0), demomodel.Options{Size: n, Seed: *seed, Progress: p.update})
	p.finish()
	if err != nil {
		return err
	}
	a := res.Arch
	fmt.Fprintf(e.stdout, "wrote %s: %d files, %s (layers %d, hidden %d, vocab %d, %d shards)\n",
		res.Dir, len(res.Files), human(res.Bytes), a.NumLayers, a.HiddenSize, a.VocabSize, a.Shards)
	fmt.Fprintf(e.stdout, "  base:      %s\n  finetuned: %s (%d tensors changed, %s)\n",
		res.BaseDir, res.FinetunedDir, len(res.ChangedTensors), human(res.ChangedBytes))
	return nil
}

// parseSize parses "123", "64MiB", "2GiB", "512M", "1G", "10k".
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(rest), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a size such as 64MiB or 2GiB", s)
	}
	return int64(v * float64(mult)), nil
}
