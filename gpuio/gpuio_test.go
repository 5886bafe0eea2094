package gpuio

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/internal/damage"
)

type fixture struct {
	st    *chunkstore.Store
	files map[string][]byte // namespace path -> content
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8 && i+k < n; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// newFixture stores: a safetensors file with tensors of mixed shapes, a second
// version sharing most tensors (multi-extent), and an opaque file.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	r := rand.New(rand.NewPCG(11, 12))
	dir := t.TempDir()
	specs := []struct {
		name  string
		dt    safetensors.DType
		shape []int64
	}{
		{"embed", safetensors.BF16, []int64{1000, 512}},
		{"norm", safetensors.F32, []int64{512}},
		{"q_proj", safetensors.BF16, []int64{1024, 2048}},
		{"o_proj", safetensors.BF16, []int64{2048, 1024}},
		{"conv", safetensors.F16, []int64{64, 32, 6, 4}},
		{"odd", safetensors.U8, []int64{12345}},
	}
	mk := func(changed string) []byte {
		r := rand.New(rand.NewPCG(5, 6))
		var ts []safetensors.WriteTensor
		for _, s := range specs {
			n := s.dt.ElemSize()
			for _, d := range s.shape {
				n *= d
			}
			data := randBytes(r, int(n))
			if s.name == changed {
				data = randBytes(rand.New(rand.NewPCG(99, 99)), int(n))
			}
			ts = append(ts, safetensors.WriteTensor{Name: s.name, DType: s.dt, Shape: s.shape, Data: data})
		}
		var buf bytes.Buffer
		meta := map[string]string{}
		if changed != "" {
			meta["v"] = "finetuned with a longer header"
		}
		if err := safetensors.Write(&buf, ts, meta); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	files := map[string][]byte{
		"a.safetensors":    mk(""),
		"b.safetensors":    mk("q_proj"),
		"opaque.bin":       randBytes(r, 9<<20+777),
		"tiny.safetensors": nil,
	}
	delete(files, "tiny.safetensors")
	for name, b := range files {
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	st, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, name := range []string{"a.safetensors", "b.safetensors", "opaque.bin"} {
		if _, err := st.Import(context.Background(), filepath.Join(dir, name), name, chunkstore.ImportOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return &fixture{st: st, files: files}
}

func (fx *fixture) open(t *testing.T, name string) *chunkstore.File {
	f, _, err := fx.st.OpenPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// variants are the loader configurations every test runs over.
func variants() map[string]func() (Device, Options) {
	return map[string]func() (Device, Options){
		"bounce-auto":       func() (Device, Options) { return &HostDevice{}, Options{} },
		"bounce-direct-cpu": func() (Device, Options) { return &HostDevice{}, Options{IO: IODirect, Buffers: 3, VerifyOn: VerifyCPU} },
		"bounce-buffered":   func() (Device, Options) { return &HostDevice{}, Options{IO: IOBuffered, BufferSize: 5 << 20} },
		"unified":           func() (Device, Options) { return &HostDevice{Unified: true}, Options{} },
		"mapped-device":     func() (Device, Options) { return &HostDevice{}, Options{IO: IOMapped, VerifyOn: VerifyDevice} },
		"mapped-cpu":        func() (Device, Options) { return &HostDevice{}, Options{IO: IOMapped, VerifyOn: VerifyCPU} },
	}
}

func TestReadRangeEveryByte(t *testing.T) {
	fx := newFixture(t)
	for vname, mk := range variants() {
		t.Run(vname, func(t *testing.T) {
			dev, opts := mk()
			l, err := New(fx.st, dev, opts)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for name, want := range fx.files {
				f := fx.open(t, name)
				ranges := [][2]int64{{0, int64(len(want))}, {1, int64(len(want)) - 2}}
				random := 12
				if testing.Short() {
					random = 4 // the race run (make test) on two cores
				}
				for range random {
					off := r.Int64N(int64(len(want)))
					ranges = append(ranges, [2]int64{off, r.Int64N(int64(len(want))-off) + 1})
				}
				for _, rg := range ranges {
					mem, _ := dev.Alloc(rg[1] + 100)
					view := mem.(HostViewer).HostView()
					for i := range view {
						view[i] = 0xAB // poison: every byte must be written
					}
					res, err := l.ReadRange(context.Background(), f, rg[0], rg[1], mem, 50)
					if err != nil {
						t.Fatalf("%s [%d,+%d): %v", name, rg[0], rg[1], err)
					}
					if res.Bytes != rg[1] || !res.Verified {
						t.Fatalf("%s: result %+v", name, res)
					}
					got := make([]byte, rg[1])
					mem.CopyToHost(got, 50)
					if !bytes.Equal(got, want[rg[0]:rg[0]+rg[1]]) {
						t.Fatalf("%s [%d,+%d): bytes differ (path %s)", name, rg[0], rg[1], res.Path)
					}
					if view[49] != 0xAB || view[50+rg[1]] != 0xAB {
						t.Fatalf("%s: wrote outside the range", name)
					}
					mem.Free()
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if hd := dev.(*HostDevice); hd.Live() != 0 {
				t.Fatalf("%d allocations leaked", hd.Live())
			}
		})
	}
}

// cpuShare cuts a share out of a tensor's bytes the slow, obvious way.
func cpuShare(data []byte, sl ShareLayout) []byte {
	var out []byte
	for r := int64(0); r < sl.Rows; r++ {
		out = append(out, data[r*sl.Pitch+sl.ColOff:r*sl.Pitch+sl.ColOff+sl.Width]...)
	}
	return out
}

func TestLoadTensorShares(t *testing.T) {
	fx := newFixture(t)
	for vname, mk := range variants() {
		t.Run(vname, func(t *testing.T) {
			dev, opts := mk()
			l, err := New(fx.st, dev, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for _, name := range []string{"a.safetensors", "b.safetensors"} {
				src := fx.files[name]
				h, err := safetensors.ParseBytes(src, int64(len(src)))
				if err != nil {
					t.Fatal(err)
				}
				f := fx.open(t, name)
				for _, sh := range []*Share{nil, {Dim: 0, Rank: 1, Size: 2}, {Dim: 1, Rank: 0, Size: 4}, {Dim: 1, Rank: 3, Size: 4}, {Dim: 2, Rank: 1, Size: 3}} {
					var targets []TensorTarget
					var layouts []ShareLayout
					var tensors []safetensors.Tensor
					for _, tn := range h.Tensors {
						sl, err := sh.Layout(tn)
						if err != nil {
							continue // not splittable that way: skip this tensor
						}
						mem, _ := dev.Alloc(sl.Bytes)
						targets = append(targets, TensorTarget{Name: tn.Name, Share: sh, Mem: mem})
						layouts = append(layouts, sl)
						tensors = append(tensors, tn)
					}
					res, err := l.LoadTensors(context.Background(), f, h, targets)
					if err != nil {
						t.Fatalf("%s share %+v: %v", name, sh, err)
					}
					var total int64
					for i, tt := range targets {
						tn := tensors[i]
						data := src[h.DataStart()+tn.Begin : h.DataStart()+tn.End]
						want := cpuShare(data, layouts[i])
						got := make([]byte, len(want))
						tt.Mem.CopyToHost(got, 0)
						if !bytes.Equal(got, want) {
							t.Fatalf("%s tensor %s share %+v: bytes differ", name, tn.Name, sh)
						}
						total += int64(len(want))
						tt.Mem.Free()
					}
					if res.Bytes != total {
						t.Fatalf("%s share %+v: placed %d, want %d", name, sh, res.Bytes, total)
					}
				}
			}
		})
	}
}

func TestShareLayoutErrors(t *testing.T) {
	tn := safetensors.Tensor{Name: "w", DType: safetensors.BF16, Shape: []int64{6, 10}, Begin: 0, End: 120}
	// A dimension that does not divide evenly is no error: it is cut as
	// torch.chunk cuts it (TestShareChunksLikeTorch).
	for _, sh := range []Share{{Dim: 2, Size: 2}, {Dim: 0, Rank: 2, Size: 2}, {Dim: -1, Size: 2}, {Dim: 0, Rank: -1, Size: 2}} {
		if _, err := sh.Layout(tn); err == nil {
			t.Errorf("share %+v accepted", sh)
		}
	}
	sl, err := (&Share{Dim: 1, Rank: 1, Size: 2}).Layout(tn)
	if err != nil || sl.Rows != 6 || sl.Width != 10 || sl.ColOff != 10 || sl.Pitch != 20 || sl.Shape[1] != 5 {
		t.Fatalf("layout %+v %v", sl, err)
	}
}

func TestCorruptChunkFailsLoad(t *testing.T) {
	fx := newFixture(t)
	f := fx.open(t, "opaque.bin")
	ex := f.Extents()[0]
	damage.FlipByte(t, ex.PackPath, ex.PackOff+4<<20)
	for vname, mk := range variants() {
		dev, opts := mk()
		l, _ := New(fx.st, dev, opts)
		mem, _ := dev.Alloc(f.Size())
		_, err := l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0)
		if !errors.Is(err, chunkstore.ErrCorrupt) {
			t.Fatalf("%s: load of corrupt data: %v", vname, err)
		}
		mem.Free()
		if err := l.Close(); err != nil {
			t.Fatalf("%s: close after failed load: %v", vname, err)
		}
	}
}

func TestStrictAndFallback(t *testing.T) {
	fx := newFixture(t)
	dev := &HostDevice{}
	for _, p := range []Path{PathGDS, PathGDSCompat, PathUnified} {
		if _, err := New(fx.st, dev, Options{Path: p, Strict: true}); !errors.Is(err, ErrStrict) {
			t.Errorf("strict %s on a host device: %v", p, err)
		}
		l, err := New(fx.st, dev, Options{Path: p})
		if err != nil {
			t.Fatal(err)
		}
		got, note := l.Path()
		if got != PathBounce || note == "" {
			t.Errorf("%s fallback: %s (%q)", p, got, note)
		}
		l.Close()
	}
	if _, err := New(fx.st, dev, Options{Path: "warp"}); err == nil {
		t.Error("unknown path accepted")
	}
	l, _ := New(fx.st, &HostDevice{Unified: true}, Options{})
	if p, _ := l.Path(); p != PathUnified {
		t.Errorf("auto on an integrated device chose %s", p)
	}
	l.Close()
}

func TestCancelReturnsBuffers(t *testing.T) {
	fx := newFixture(t)
	dev := &HostDevice{}
	l, _ := New(fx.st, dev, Options{Buffers: 2, BufferSize: 5 << 20})
	f := fx.open(t, "opaque.bin")
	mem, _ := dev.Alloc(f.Size())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.ReadRange(ctx, f, 0, f.Size(), mem, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled load: %v", err)
	}
	mem.Free()
	if err := l.Close(); err != nil || dev.Live() != 0 {
		t.Fatalf("close: %v, %d live", err, dev.Live())
	}
}

func TestBadRanges(t *testing.T) {
	fx := newFixture(t)
	dev := &HostDevice{}
	l, _ := New(fx.st, dev, Options{})
	defer l.Close()
	f := fx.open(t, "opaque.bin")
	mem, _ := dev.Alloc(100)
	defer mem.Free()
	const huge = math.MaxInt64 - 20 // off+n overflows to a negative number
	for _, rg := range [][3]int64{{-1, 10, 0}, {0, f.Size() + 1, 0}, {0, 200, 0}, {0, 50, 60},
		{0, 50, huge}, {huge, 50, 0}, {10, huge, 0}, {0, 50, -1}} {
		if _, err := l.ReadRange(context.Background(), f, rg[0], rg[1], mem, rg[2]); err == nil {
			t.Errorf("range %v accepted", rg)
		}
	}
}
