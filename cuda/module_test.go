package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/cuda/cudatest"
)

// kernelEntryPoints are the NVRTC, module and launch entry points, called
// as a caller without CUDA could reach them.
func kernelEntryPoints() map[string]func() error {
	var (
		dev  cuda.Device
		ctx  *cuda.Context
		mod  *cuda.Module
		fn   *cuda.Function
		st   *cuda.Stream
		err1 = func(_ any, err error) error { return err }
	)
	return map[string]func() error{
		"NVRTCAvailable":     cuda.NVRTCAvailable,
		"NVRTCPath":          func() error { return err1(cuda.NVRTCPath()) },
		"NVRTCVersion":       func() error { _, _, err := cuda.NVRTCVersion(); return err },
		"Compile":            func() error { _, _, err := cuda.Compile("", "x.cu", cuda.CompileOptions{}); return err },
		"Device.Arch":        func() error { return err1(dev.Arch()) },
		"Context.LoadModule": func() error { return err1(ctx.LoadModule([]byte("x"))) },
		"Module.Function":    func() error { return err1(mod.Function("f")) },
		"Module.Unload":      func() error { return mod.Unload() },
		"Stream.Launch":      func() error { return err1(st.Launch(fn, cuda.LaunchConfig{}, 1)) },
	}
}

func TestKernelUnavailable(t *testing.T) {
	restore := cuda.SetUnavailableForTest("simulated: no libcuda")
	defer restore()
	for name, f := range kernelEntryPoints() {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", name, r)
				}
			}()
			if err := f(); !errors.Is(err, cuda.ErrUnavailable) {
				t.Errorf("%s: got %v, want an error wrapping ErrUnavailable", name, err)
			}
		}()
	}
}

const testKernels = `
typedef unsigned int u32;
typedef unsigned long long u64;
extern "C" __global__ void iota(u32* p, u32 base, u64 n) {
	u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) p[i] = base + (u32)i;
}
extern "C" __global__ void scale(const u32* src, u32* dst, float f, double g, u64 n) {
	u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) dst[i] = (u32)((float)src[i] * f + (float)g);
}
`

// TestCompileLaunch compiles two kernels with NVRTC, launches them on a
// stream and reads the results back after a CopyDtoH on the same stream.
func TestCompileLaunch(t *testing.T) {
	cudatest.RequireGPU(t)
	if os.Getenv("KYLIX_CUDA_STUB") != "" {
		t.Skip("the stub driver has no modules")
	}
	path, err := cuda.NVRTCPath()
	if err != nil {
		t.Fatal(err)
	}
	ma, mi, _ := cuda.NVRTCVersion()
	t.Logf("NVRTC %d.%d from %s", ma, mi, path)
	dev, _ := cuda.GetDevice(0)
	arch, err := dev.Arch()
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()

	if _, _, err := cuda.Compile("this is not C", "bad.cu", cuda.CompileOptions{Arch: arch}); err == nil {
		t.Error("compiling garbage succeeded")
	} else {
		var ne *cuda.NVRTCError
		if !errors.As(err, &ne) || ne.Log == "" {
			t.Errorf("compile error %v: want an *NVRTCError with a log", err)
		}
	}

	for _, o := range []cuda.CompileOptions{
		{Arch: arch, CUBIN: true},
		{Arch: "compute_" + arch[3:]},
	} {
		img, log, err := cuda.Compile(testKernels, "test.cu", o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		t.Logf("%+v: %d bytes, log %q", o, len(img), log)
		mod, err := ctx.LoadModule(img)
		if err != nil {
			t.Fatal(err)
		}
		iota, err := mod.Function("iota")
		if err != nil {
			t.Fatal(err)
		}
		scale, err := mod.Function("scale")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mod.Function("nope"); err == nil {
			t.Error("missing function found")
		}
		const n = 1 << 20
		a, _ := ctx.Alloc(4 * n)
		b, _ := ctx.Alloc(4 * n)
		h, _ := ctx.AllocHost(4 * n)
		s, _ := ctx.NewStream()
		cfg := cuda.LaunchConfig{Grid: cuda.Dim3{X: n / 256}, Block: cuda.Dim3{X: 256}}
		if _, err := s.Launch(iota, cfg, a, uint32(7), uint64(n)); err != nil {
			t.Fatal(err)
		}
		t2, err := s.Launch(scale, cfg, a, b, float32(2), float64(1), uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(); !errors.Is(err, cuda.ErrBusy) && t2.Err() == nil {
			// The kernel may already be done; only a wrong error counts.
			if err != nil {
				t.Errorf("free during launch: %v", err)
			}
		}
		if _, err := s.Launch(iota, cfg, a, "x"); !errors.Is(err, cuda.ErrInvalid) && !errors.Is(err, cuda.ErrFreed) {
			t.Errorf("unsupported argument type: %v", err)
		}
		tr, err := s.CopyDtoH(h, 0, b, 0, 4*n)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := t2.Err(); err != nil {
			t.Fatal(err)
		}
		got := h.Bytes()
		for i := 0; i < n; i += 4099 {
			if v := binary.LittleEndian.Uint32(got[4*i:]); v != uint32(2*(7+i)+1) {
				t.Fatalf("dst[%d] = %d, want %d", i, v, 2*(7+i)+1)
			}
		}
		if mod.Busy() != 0 {
			t.Errorf("module busy after the stream drained")
		}
		a.Free()
		b.Free()
		h.Free()
		s.Close()
		if err := mod.Unload(); err != nil {
			t.Fatal(err)
		}
		if err := mod.Unload(); !errors.Is(err, cuda.ErrFreed) {
			t.Errorf("second Unload: %v", err)
		}
	}
}
