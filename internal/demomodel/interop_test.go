package demomodel

import (
	"os/exec"
	"testing"

	"github.com/kylix/kylix/internal/testneeds"
)

// transformersPy loads a generated version with Hugging Face transformers
// and its tokenizer, runs one forward pass, and checks every weight is
// finite.
const transformersPy = `
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, AutoConfig
path = sys.argv[1]
cfg = AutoConfig.from_pretrained(path)
m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
n = sum(p.numel() for p in m.parameters())
bad = [k for k, v in m.state_dict().items() if not torch.isfinite(v.float()).all()]
assert not bad, bad
tok = AutoTokenizer.from_pretrained(path)
ids = tok("the quick brown fox", return_tensors="pt").input_ids
out = m(ids).logits
print(type(m).__name__, cfg.hidden_size, cfg.num_hidden_layers, n, "params", "ids", ids.tolist(), "logits", tuple(out.shape))
`

// TestInteropTransformers checks that both generated versions load in
// transformers. It runs wherever a python3 imports torch and transformers
// ($KYLIX_TEST_PYTHON, python3 on PATH, /usr/bin/python3): the GPU machine,
// where scripts/gpu-test.sh runs it. Debian 12 packages no transformers, so
// CI machines skip it, saying so.
func TestInteropTransformers(t *testing.T) {
	py, err := testneeds.Python("transformers", "torch")
	if err != nil {
		t.Skipf("the reference implementation is not here: %v", err)
	}
	res, err := Generate(t.TempDir(), Options{Size: 8 << 20, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{res.BaseDir, res.FinetunedDir} {
		cmd := exec.Command(py, "-c", transformersPy, dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", dir, err, out)
		}
		t.Logf("%s: %s", dir, out)
	}
}
