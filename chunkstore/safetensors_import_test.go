package chunkstore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// writeSafetensors writes a file whose tensors mix tiny and large sizes, so
// that small chunks are buffered between large ones written directly.
func writeSafetensors(t *testing.T, path string, seed uint64, meta map[string]string, sizes []int64) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 9))
	var ts []safetensors.WriteTensor
	for i, n := range sizes {
		ts = append(ts, safetensors.WriteTensor{
			Name: "t" + string(rune('a'+i)), DType: safetensors.U8, Shape: []int64{n}, Data: randBytes(r, int(n)),
		})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, meta); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSafetensorsImportMixedSizes(t *testing.T) {
	dir := t.TempDir()
	sizes := []int64{1000, 6 << 20, 2048, 40 << 20, 3, 5 << 20, 17, 4 << 20}
	a := writeSafetensors(t, filepath.Join(dir, "a.safetensors"), 1, nil, sizes)
	// Same tensors, a longer header: every tensor's chunks must dedup.
	b := writeSafetensors(t, filepath.Join(dir, "b.safetensors"), 1, map[string]string{"note": "finetuned, a longer header"}, sizes)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	ra, err := s.Import(ctx, filepath.Join(dir, "a.safetensors"), "a.safetensors", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := s.Import(ctx, filepath.Join(dir, "b.safetensors"), "b.safetensors", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ra.Notes != nil || rb.Notes != nil {
		t.Fatalf("not cut as safetensors: %v %v", ra.Notes, rb.Notes)
	}
	if hdr := int64(len(b) - len(a)); rb.NewBytes > 64<<10 {
		t.Fatalf("finetuned copy stored %d new bytes; only its header (%d bytes longer) changed", rb.NewBytes, hdr)
	}
	for name, want := range map[string][]byte{"a.safetensors": a, "b.safetensors": b} {
		f, _, err := s.OpenPath(name)
		if err != nil {
			t.Fatal(err)
		}
		if f.M.Format != FormatSafetensors {
			t.Fatalf("%s: format %v", name, f.M.Format)
		}
		var got bytes.Buffer
		if _, err := f.WriteTo(ctx, &got, nil); err != nil || !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("%s: read back differs (%v)", name, err)
		}
	}
	if rep, err := s.Verify(ctx, "", nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep.Problems, err)
	}
}

func TestMalformedSafetensorsStoredWithNote(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.safetensors")
	data := append([]byte{0xff, 0xff, 0, 0, 0, 0, 0, 0}, []byte("{not json")...)
	os.WriteFile(p, data, 0o644)
	s := openTest(t, t.TempDir())
	res, err := s.Import(context.Background(), p, "bad.safetensors", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Notes) != 1 {
		t.Fatalf("no note about the malformed header: %+v", res)
	}
	f, _, _ := s.OpenPath("bad.safetensors")
	got := make([]byte, len(data))
	if n, _ := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatal("malformed file not stored byte for byte")
	}
}
