package safetensors

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kylix/kylix/internal/testneeds"
)

// interopPy reads (argv[1] == "read") or writes ("write") argv[2] with the
// reference implementation and prints each tensor's dtype, shape and the
// SHA-256 of its bytes as JSON.
const interopPy = `
import sys, json, hashlib, torch
from safetensors import safe_open
from safetensors.torch import save_file
mode, path = sys.argv[1], sys.argv[2]
names = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
         torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.float32: "F32", torch.float64: "F64", torch.uint16: "U16", torch.uint32: "U32",
         torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
def digest(t):
    b = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": names[t.dtype], "shape": list(t.shape), "sha256": hashlib.sha256(b).hexdigest()}
if mode == "write":
    g = torch.Generator().manual_seed(0)
    ts = {
        "model.embed.weight": torch.randn(33, 16, generator=g).to(torch.bfloat16),
        "a.f32": torch.randn(7, generator=g),
        "a.f64": torch.randn(2, 3, generator=g, dtype=torch.float64),
        "b.f16": torch.randn(5, 1, 3, generator=g).half(),
        "c.i64": torch.arange(11, dtype=torch.int64),
        "c.i32": torch.arange(3, dtype=torch.int32),
        "d.u8": torch.arange(13, dtype=torch.uint8),
        "d.bool": torch.tensor([True, False, True]),
        "e.scalar": torch.tensor(3.5),
        "e.empty": torch.zeros(0, 4),
        "f.f8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
    }
    # One metadata key: the reference keeps metadata in a hash map, so the
    # order of several keys in its header is arbitrary.
    save_file(ts, path, metadata={"format": "pt"})
out = {}
with safe_open(path, "pt") as f:
    out["__metadata__"] = f.metadata()
    for k in f.keys():
        out[k] = digest(f.get_tensor(k))
print(json.dumps(out))
`

type pyDigest struct {
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	SHA256 string  `json:"sha256"`
}

func runPy(t *testing.T, py, mode, path string) (map[string]pyDigest, map[string]string) {
	t.Helper()
	cmd := exec.Command(py, "-c", interopPy, mode, path)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python %s: %v", mode, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	var md map[string]string
	json.Unmarshal(raw[MetadataKey], &md)
	delete(raw, MetadataKey)
	ds := map[string]pyDigest{}
	for k, v := range raw {
		var d pyDigest
		if err := json.Unmarshal(v, &d); err != nil {
			t.Fatal(err)
		}
		ds[k] = d
	}
	return ds, md
}

func digestOf(dt DType, shape []int64, data []byte) pyDigest {
	s := sha256.Sum256(data)
	if shape == nil {
		shape = []int64{}
	}
	return pyDigest{string(dt), shape, hex.EncodeToString(s[:])}
}

// TestInteropPython checks this package against the reference
// implementation both ways. It runs wherever a python3 imports torch and
// safetensors ($KYLIX_TEST_PYTHON, python3 on PATH, /usr/bin/python3): the
// GPU machine, where scripts/gpu-test.sh runs it. Debian 12 packages no
// safetensors, so CI machines skip it, saying so.
func TestInteropPython(t *testing.T) {
	py, err := testneeds.Python("safetensors", "torch")
	if err != nil {
		t.Skipf("the reference implementation is not here: %v", err)
	}
	dir := t.TempDir()

	// Go writes, the reference reads.
	r := rand.New(rand.NewPCG(1, 1))
	var ts []WriteTensor
	for i, dt := range []DType{BOOL, U8, I8, F8E5M2, F8E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64} {
		shape := []int64{int64(1 + i%3), int64(2 + i%5)}
		if i == 3 {
			shape = nil // scalar
		}
		if i == 4 {
			shape = []int64{0, 3}
		}
		n, _ := byteLen(dt, shape)
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(r.Uint32())
			if dt == BOOL {
				data[j] &= 1
			}
		}
		ts = append(ts, WriteTensor{Name: "layer." + string(dt), DType: dt, Shape: shape, Data: data})
	}
	goPath := filepath.Join(dir, "go.safetensors")
	var buf bytes.Buffer
	md := map[string]string{"format": "pt", "written_by": "kylix"}
	if err := Write(&buf, ts, md); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goPath, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, gotMD := runPy(t, py, "read", goPath)
	if !reflect.DeepEqual(gotMD, md) {
		t.Errorf("reference reads metadata %v, want %v", gotMD, md)
	}
	if len(got) != len(ts) {
		t.Errorf("reference reads %d tensors, want %d", len(got), len(ts))
	}
	for _, w := range ts {
		if want := digestOf(w.DType, w.Shape, w.Data); !reflect.DeepEqual(got[w.Name], want) {
			t.Errorf("reference reads %s as %+v, want %+v", w.Name, got[w.Name], want)
		}
	}

	// The reference writes, Go reads; then Go rewrites the same tensors in
	// the same order and must produce the same bytes.
	pyPath := filepath.Join(dir, "py.safetensors")
	want, wantMD := runPy(t, py, "write", pyPath)
	b, err := os.ReadFile(pyPath)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseBytes(b, int64(len(b)))
	if err != nil {
		t.Fatalf("Parse of the reference's file: %v", err)
	}
	if !reflect.DeepEqual(h.Metadata, wantMD) || len(h.Tensors) != len(want) || len(h.Holes(int64(len(b)))) != 0 {
		t.Errorf("parsed %+v, want metadata %v and %d tensors", h, wantMD, len(want))
	}
	var again []WriteTensor
	for _, tn := range h.Tensors {
		data := b[h.DataStart()+tn.Begin : h.DataStart()+tn.End]
		if d := digestOf(tn.DType, tn.Shape, data); !reflect.DeepEqual(d, want[tn.Name]) {
			t.Errorf("tensor %s: parsed %+v, reference says %+v", tn.Name, d, want[tn.Name])
		}
		again = append(again, WriteTensor{tn.Name, tn.DType, tn.Shape, data})
	}
	buf.Reset()
	if err := Write(&buf, again, h.Metadata); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), b) {
		t.Logf("reference header: %q", b[8:h.DataStart()])
		t.Logf("our header:       %q", buf.Bytes()[8:8+binaryLen(buf.Bytes())])
		t.Errorf("rewriting the reference's file does not give the same bytes")
	}
}

func binaryLen(b []byte) int {
	n, _ := HeaderLen(b, int64(len(b)))
	return int(n)
}
