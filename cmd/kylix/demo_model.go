package main

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/internal/demomodel"
	"github.com/kylix/kylix/internal/units"
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

// parseSize reads a positive size such as 64MiB (units.ParseSize; 0 is
// refused: no flag that takes one means "none" by 0 here).
func parseSize(s string) (int64, error) {
	v, err := units.ParseSize(s)
	if err == nil && v <= 0 {
		err = fmt.Errorf("%q is not a size such as 64MiB or 2GiB", s)
	}
	return v, err
}
