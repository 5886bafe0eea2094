package demomodel

import (
	"os"
	"os/exec"
	"testing"
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
// transformers. It needs a Python with torch and transformers, named by
// KYLIX_TEST_PYTHON (the GPU machine has one).
func TestInteropTransformers(t *testing.T) {
	py := os.Getenv("KYLIX_TEST_PYTHON")
	if py == "" {
		t.Skip("set KYLIX_TEST_PYTHON to a python3 with torch and transformers")
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
