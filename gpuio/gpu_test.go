package gpuio

import (
	"bytes"
	"context"
	"testing"

	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/cuda/cudatest"
)

// TestGPUEveryByte loads ranges and tensor shares into a real GPU over every
// path the machine offers and compares every byte copied back. It skips
// without a GPU (KYLIX_REQUIRE_GPU=1 makes that a failure).
func TestGPUEveryByte(t *testing.T) {
	cudatest.RequireGPU(t)
	fx := newFixture(t)
	dev, err := NewCUDADevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	for _, p := range []Path{PathAuto, PathBounce, PathGDSCompat, PathGDS} {
		for _, io := range []IOMode{IOAuto, IODirect, IOBuffered, IOMapped} {
			l, err := New(fx.st, dev, Options{Path: p, IO: io, Strict: true})
			if err != nil {
				t.Logf("path %s io %s: not available here: %v", p, io, err)
				continue
			}
			got, note := l.Path()
			t.Logf("path %s io %s -> %s (%s)", p, io, got, note)
			for name, want := range fx.files {
				f := fx.open(t, name)
				for _, rg := range [][2]int64{{0, int64(len(want))}, {4097, int64(len(want)) / 3}} {
					mem, err := dev.Alloc(rg[1] + 64)
					if err != nil {
						t.Fatal(err)
					}
					res, err := l.ReadRange(context.Background(), f, rg[0], rg[1], mem, 64)
					if err != nil {
						t.Fatalf("%s %s [%d,+%d): %v", got, name, rg[0], rg[1], err)
					}
					back := make([]byte, rg[1])
					if err := mem.CopyToHost(back, 64); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(back, want[rg[0]:rg[0]+rg[1]]) || res.Bytes != rg[1] {
						t.Fatalf("%s %s [%d,+%d): device bytes differ", got, name, rg[0], rg[1])
					}
					if err := mem.Free(); err != nil {
						t.Fatal(err)
					}
				}
				if name == "opaque.bin" {
					continue
				}
				h, _ := safetensors.ParseBytes(want, int64(len(want)))
				for _, sh := range []*Share{{Dim: 1, Rank: 1, Size: 2}, {Dim: 0, Rank: 0, Size: 2}} {
					var targets []TensorTarget
					var sls []ShareLayout
					var ts []safetensors.Tensor
					for _, tn := range h.Tensors {
						sl, err := sh.Layout(tn)
						if err != nil {
							continue
						}
						mem, _ := dev.Alloc(sl.Bytes)
						targets = append(targets, TensorTarget{Name: tn.Name, Share: sh, Mem: mem})
						sls, ts = append(sls, sl), append(ts, tn)
					}
					if _, err := l.LoadTensors(context.Background(), f, h, targets); err != nil {
						t.Fatalf("%s %s share %+v: %v", got, name, sh, err)
					}
					for i, tt := range targets {
						data := want[h.DataStart()+ts[i].Begin : h.DataStart()+ts[i].End]
						exp := cpuShare(data, sls[i])
						back := make([]byte, len(exp))
						tt.Mem.CopyToHost(back, 0)
						if !bytes.Equal(back, exp) {
							t.Fatalf("%s %s tensor %s share %+v: device bytes differ", got, name, ts[i].Name, sh)
						}
						tt.Mem.Free()
					}
				}
			}
			if err := l.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
		}
	}
}
