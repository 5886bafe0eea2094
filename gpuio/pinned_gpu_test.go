package gpuio

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/cuda/cudatest"
)

// TestGPUPinned: on a real GPU (scripts/gpu-test.sh), loads of pinned
// ranges copy straight from the locked pages registered with
// cuMemHostRegister, every byte right, verified on the device and on the
// CPU; a second loader (a second handle on the same device) shares the one
// registration, and takes it over when the first closes. Skips without a
// GPU.
func TestGPUPinned(t *testing.T) {
	cudatest.RequireGPU(t)
	fx := newFixture(t)
	h := NewPinnedHost()
	var locked []*PinnedRange
	for _, name := range []string{"opaque.bin", "a.safetensors"} {
		for _, s := range spansOf(t, fx, name) {
			r, err := h.Lock(s)
			require.NoError(t, err)
			locked = append(locked, r)
		}
	}
	defer func() {
		for _, r := range locked {
			require.NoError(t, r.Release())
		}
	}()
	dev0, err := NewCUDADevice(0)
	require.NoError(t, err)
	defer dev0.Close()
	dev1, err := NewCUDADevice(0)
	require.NoError(t, err)
	defer dev1.Close()
	load := func(l *Loader, dev *CUDADevice, name string) Result {
		want := fx.files[name]
		mem, err := dev.Alloc(int64(len(want)))
		require.NoError(t, err)
		defer mem.Free()
		res, err := l.ReadRange(context.Background(), fx.open(t, name), 0, int64(len(want)), mem, 0)
		require.NoError(t, err)
		back := make([]byte, len(want))
		require.NoError(t, mem.CopyToHost(back, 0))
		require.True(t, bytes.Equal(back, want), "%s: device bytes differ (%s)", name, res.IO)
		return res
	}
	for _, vo := range []VerifyOn{VerifyAuto, VerifyCPU} {
		l0, err := New(fx.st, dev0, Options{Pinned: h, VerifyOn: vo})
		require.NoError(t, err)
		regs := h.Registrations()
		require.Len(t, regs, 1)
		require.Zero(t, regs[0].Failed, regs[0].FailedWhy)
		require.Equal(t, h.Locked(), regs[0].Bytes)
		for _, name := range []string{"opaque.bin", "a.safetensors"} {
			res := load(l0, dev0, name)
			require.Equal(t, "page cache (pinned)", res.IO, name)
			t.Logf("verify %s: %s %s: %s, verified on %s", vo, name, res.Path, res.IO, res.VerifyOn)
		}
		// b shares most tensors with a (deduplicated into a's pack): those
		// come from a's pinned pages; its own changed tensor does not.
		io := load(l0, dev0, "b.safetensors").IO
		require.Contains(t, io, "page cache (pinned)")
		require.NotEqual(t, "page cache (pinned)", io)
		l1, err := New(fx.st, dev1, Options{Pinned: h, VerifyOn: vo})
		require.NoError(t, err)
		require.Equal(t, "page cache (pinned)", load(l1, dev1, "opaque.bin").IO)
		require.NoError(t, l0.Close())
		require.Equal(t, "page cache (pinned)", load(l1, dev1, "opaque.bin").IO, "registered again by the remaining loader")
		regs = h.Registrations()
		require.Len(t, regs, 1)
		require.Equal(t, h.Locked(), regs[0].Bytes)
		require.NoError(t, l1.Close())
		require.Empty(t, h.Registrations())
	}
}
