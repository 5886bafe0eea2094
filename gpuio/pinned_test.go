package gpuio

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/damage"
)

func spansOf(t *testing.T, fx *fixture, name string) []PackSpan {
	t.Helper()
	var out []PackSpan
	for _, x := range fx.open(t, name).Extents() {
		require.NotZero(t, x.Pack)
		out = append(out, PackSpan{Pack: x.Pack, Path: x.PackPath, Off: x.PackOff, Len: x.Len})
	}
	return out
}

// lockAll locks every span in h, failing the test on an error.
func lockAll(t *testing.T, h *PinnedHost, spans []PackSpan) []*PinnedRange {
	t.Helper()
	var locked []*PinnedRange
	for _, s := range spans {
		r, err := h.Lock(s)
		require.NoError(t, err)
		locked = append(locked, r)
	}
	return locked
}

// TestPinnedLoadsCopyFromPinnedPages: a loader made with Options.Pinned
// copies the bytes of pinned ranges straight from their registration (IO
// "page cache (pinned)"), every byte right, verified on the device or the
// CPU; files not pinned take the usual path; unpinning and closing free
// every registration.
func TestPinnedLoadsCopyFromPinnedPages(t *testing.T) {
	fx := newFixture(t)
	for _, vo := range []VerifyOn{VerifyDevice, VerifyCPU} {
		t.Run(string(vo), func(t *testing.T) {
			h := NewPinnedHost()
			locked := lockAll(t, h, spansOf(t, fx, "opaque.bin"))
			want := fx.files["opaque.bin"]
			require.GreaterOrEqual(t, h.Locked(), int64(len(want)))
			require.Zero(t, h.Added(spansOf(t, fx, "opaque.bin")), "locking the same spans again adds nothing")
			res, err := ResidentBytes(spansOf(t, fx, "opaque.bin")[0].Path, 0, int64(len(want)))
			require.NoError(t, err)
			require.Equal(t, int64(len(want)), res, "locked pages are resident")

			dev := &HostDevice{}
			l, err := New(fx.st, dev, Options{Pinned: h, VerifyOn: vo})
			require.NoError(t, err)
			regs := h.Registrations()
			require.Len(t, regs, 1)
			require.Equal(t, h.Locked(), regs[0].Bytes)

			load := func(name string) Result {
				want := fx.files[name]
				mem, _ := dev.Alloc(int64(len(want)))
				defer mem.Free()
				res, err := l.ReadRange(context.Background(), fx.open(t, name), 0, int64(len(want)), mem, 0)
				require.NoError(t, err)
				got := make([]byte, len(want))
				mem.CopyToHost(got, 0)
				require.True(t, bytes.Equal(got, want), "%s: bytes differ", name)
				return res
			}
			require.Equal(t, "page cache (pinned)", load("opaque.bin").IO)
			require.NotContains(t, load("a.safetensors").IO, "pinned")

			// A range locked while the loader exists is registered at once.
			locked = append(locked, lockAll(t, h, spansOf(t, fx, "a.safetensors"))...)
			require.Equal(t, h.Locked(), h.Registrations()[0].Bytes)
			require.Contains(t, load("a.safetensors").IO, "pinned")

			for _, r := range locked {
				require.NoError(t, r.Release())
			}
			require.Zero(t, h.Locked())
			require.NotContains(t, load("opaque.bin").IO, "pinned")
			require.NoError(t, l.Close())
			require.Empty(t, h.Registrations())
			require.Zero(t, dev.Live(), "allocations or registrations leaked")
		})
	}
}

// TestPinnedReleaseWaitsForLoads: a range released while loads copy from it
// is unmapped only after they finish (no fault, right bytes).
func TestPinnedReleaseWaitsForLoads(t *testing.T) {
	fx := newFixture(t)
	h := NewPinnedHost()
	locked := lockAll(t, h, spansOf(t, fx, "opaque.bin"))
	dev := &HostDevice{}
	l, err := New(fx.st, dev, Options{Pinned: h, Buffers: 4})
	require.NoError(t, err)
	defer l.Close()
	want := fx.files["opaque.bin"]
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			mem, _ := dev.Alloc(int64(len(want)))
			defer mem.Free()
			_, err := l.ReadRange(context.Background(), fx.open(t, "opaque.bin"), 0, int64(len(want)), mem, 0)
			got := make([]byte, len(want))
			mem.CopyToHost(got, 0)
			if err == nil && !bytes.Equal(got, want) {
				err = context.Canceled
			}
			errs <- err
		}()
	}
	for _, r := range locked {
		require.NoError(t, r.Release())
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

func TestPinnedLockErrors(t *testing.T) {
	h := NewPinnedHost()
	_, err := h.Lock(PackSpan{Pack: 1, Path: "/nonexistent/pack", Off: 0, Len: 10})
	require.Error(t, err)
	require.Contains(t, MemlockLimit(), "RLIMIT_MEMLOCK")
	fx := newFixture(t)
	s := spansOf(t, fx, "opaque.bin")[0]
	s.Len += 1 << 30
	_, err = h.Lock(s)
	require.ErrorContains(t, err, "damaged")
	require.True(t, strings.Contains(err.Error(), s.Path))
}

// TestPinnedSharedByLoaders: two loaders (two devices) share one
// registration of each range; when the loader that registered it closes,
// the range is registered again with the other's device, whose loads stay
// on the pinned path; nothing leaks on either device.
func TestPinnedSharedByLoaders(t *testing.T) {
	fx := newFixture(t)
	h := NewPinnedHost()
	locked := lockAll(t, h, spansOf(t, fx, "opaque.bin"))
	d0, d1 := &HostDevice{}, &HostDevice{}
	l0, err := New(fx.st, d0, Options{Pinned: h})
	require.NoError(t, err)
	l1, err := New(fx.st, d1, Options{Pinned: h})
	require.NoError(t, err)
	base1 := d1.Live()
	want := fx.files["opaque.bin"]
	load := func(l *Loader, dev *HostDevice) string {
		mem, _ := dev.Alloc(int64(len(want)))
		defer mem.Free()
		res, err := l.ReadRange(context.Background(), fx.open(t, "opaque.bin"), 0, int64(len(want)), mem, 0)
		require.NoError(t, err)
		got := make([]byte, len(want))
		mem.CopyToHost(got, 0)
		require.True(t, bytes.Equal(got, want))
		return res.IO
	}
	require.Equal(t, "page cache (pinned)", load(l0, d0))
	require.Equal(t, "page cache (pinned)", load(l1, d1))
	for _, r := range h.Registrations() {
		require.Equal(t, h.Locked(), r.Bytes, r.Device)
	}
	require.NoError(t, l0.Close())
	require.Zero(t, d0.Live())
	require.Greater(t, d1.Live(), base1, "registered again with the remaining device")
	require.Equal(t, "page cache (pinned)", load(l1, d1))
	for _, r := range locked {
		require.NoError(t, r.Release())
	}
	require.NoError(t, l1.Close())
	require.Zero(t, d1.Live())
}

// spansWithChunks are the file's spans with their chunks, as the node pins
// them (cmd/kylix/pin.go).
func spansWithChunks(t *testing.T, fx *fixture, name string) []PackSpan {
	t.Helper()
	f := fx.open(t, name)
	plan, err := f.Plan(0, f.Size())
	require.NoError(t, err)
	defer plan.Release()
	spans := spansOf(t, fx, name)
	for i := range spans {
		for _, pc := range plan.Pieces {
			if pc.Pack == spans[i].Pack && pc.PackOff >= spans[i].Off && pc.PackOff+pc.Len <= spans[i].Off+spans[i].Len {
				pc.Lease = nil
				spans[i].Chunks = append(spans[i].Chunks, pc)
			}
		}
		require.NotEmpty(t, spans[i].Chunks)
	}
	return spans
}

// TestPinnedVerifiedWhenPinned: spans pinned with their chunks are hashed
// once, when locked; loads then place their bytes as they are (VerifyOn
// "pin"), shares too, unless a load asks to verify every time; a span
// whose pack holds a wrong byte is refused when pinned, nothing locked.
func TestPinnedVerifiedWhenPinned(t *testing.T) {
	fx := newFixture(t)
	h := NewPinnedHost()
	locked := lockAll(t, h, spansWithChunks(t, fx, "b.safetensors"))
	dev := &HostDevice{}
	l, err := New(fx.st, dev, Options{Pinned: h, VerifyOn: VerifyDevice})
	require.NoError(t, err)
	want := fx.files["b.safetensors"]
	f := fx.open(t, "b.safetensors")
	size := int64(len(want))
	for _, every := range []bool{false, true} {
		// The whole file, and a strided share: rows of 1000 bytes 3000 apart.
		rows := (size - 1000) / 3000
		rs := []Range{{Off: 0, N: size}, {Off: 7, N: 1000, DstOff: size, Rows: rows, Pitch: 3000}}
		mem, err := dev.Alloc(size + rows*1000)
		require.NoError(t, err)
		res, err := l.ReadRangesWith(context.Background(), f, rs, mem, ReadOptions{VerifyEveryLoad: every})
		require.NoError(t, err)
		got := make([]byte, size+rows*1000)
		mem.CopyToHost(got, 0)
		require.True(t, bytes.Equal(got[:size], want))
		for i := range rows {
			require.True(t, bytes.Equal(got[size+i*1000:size+(i+1)*1000], want[7+i*3000:7+i*3000+1000]), "row %d", i)
		}
		mem.Free()
		require.True(t, res.Verified)
		if every {
			require.Equal(t, "device", res.VerifyOn)
			require.Equal(t, "page cache (pinned)", res.IO)
		} else {
			require.Equal(t, "pin", res.VerifyOn)
			require.Equal(t, "page cache (pinned, verified)", res.IO)
		}
	}
	for _, r := range locked {
		require.NoError(t, r.Release())
	}
	require.NoError(t, l.Close())
	require.Zero(t, dev.Live())

	// A wrong byte in the pack: the pin is refused and nothing stays locked.
	spans := spansWithChunks(t, fx, "opaque.bin")
	damage.FlipByte(t, spans[0].Path, spans[0].Chunks[0].PackOff+5)
	_, err = h.Lock(spans[0])
	var ce *chunkstore.CorruptError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, spans[0].Chunks[0].ID, ce.Chunk)
	require.Zero(t, h.Locked())
}

// TestPinnedRecheck: a byte changed under a pinned, verified range (here
// written into the pack file, whose pages the range maps) is found by
// Recheck; the range loses its verified mark, and loads hash its chunks
// again and fail on the bad one instead of placing it.
func TestPinnedRecheck(t *testing.T) {
	fx := newFixture(t)
	h := NewPinnedHost()
	spans := spansWithChunks(t, fx, "opaque.bin")
	locked := lockAll(t, h, spans)
	defer func() {
		for _, r := range locked {
			require.NoError(t, r.Release())
		}
	}()
	var paced int64
	n, bad := h.Recheck(func(k int64) error { paced += k; return nil })
	require.Equal(t, len(spans), n)
	require.Empty(t, bad)
	require.Positive(t, paced)

	dev := &HostDevice{}
	l, err := New(fx.st, dev, Options{Pinned: h, VerifyOn: VerifyDevice})
	require.NoError(t, err)
	defer l.Close()
	f := fx.open(t, "opaque.bin")
	mem, err := dev.Alloc(f.Size())
	require.NoError(t, err)
	defer mem.Free()
	res, err := l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0)
	require.NoError(t, err)
	require.Equal(t, "pin", res.VerifyOn)

	damage.FlipByte(t, spans[0].Path, spans[0].Chunks[0].PackOff+9)
	_, bad = h.Recheck(nil)
	require.Len(t, bad, 1)
	var ce *chunkstore.CorruptError
	require.ErrorAs(t, bad[0], &ce)
	_, err = l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0)
	require.ErrorAs(t, err, &ce, "the changed chunk is hashed again and refused")
}

// TestPinnedWriteFoundAtNextLoad: a byte written into the pack under a
// pinned, verified range is found by the very next load, not only by the
// next recheck pass: the write changes the pack file's times, so the load
// no longer trusts the range's verified mark, hashes its chunks and fails
// on the bad one. A write of the same byte (the content right, the times
// changed) costs the loads their shortcut, not their bytes.
func TestPinnedWriteFoundAtNextLoad(t *testing.T) {
	fx := newFixture(t)
	h := NewPinnedHost()
	spans := spansWithChunks(t, fx, "opaque.bin")
	// An old modification time first, so the write below changes it
	// whatever the clock's granularity (ext4 stamps in jiffies).
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(spans[0].Path, old, old))
	locked := lockAll(t, h, spans)
	defer func() {
		for _, r := range locked {
			require.NoError(t, r.Release())
		}
	}()
	dev := &HostDevice{}
	l, err := New(fx.st, dev, Options{Pinned: h, VerifyOn: VerifyDevice})
	require.NoError(t, err)
	defer l.Close()
	f := fx.open(t, "opaque.bin")
	mem, err := dev.Alloc(f.Size())
	require.NoError(t, err)
	defer mem.Free()
	load := func() (Result, error) { return l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0) }
	res, err := load()
	require.NoError(t, err)
	require.Equal(t, "pin", res.VerifyOn)

	// The same byte written again: right bytes, new times.
	pf, err := os.OpenFile(spans[0].Path, os.O_RDWR, 0)
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = pf.ReadAt(b, spans[0].Chunks[0].PackOff)
	require.NoError(t, err)
	_, err = pf.WriteAt(b, spans[0].Chunks[0].PackOff)
	require.NoError(t, err)
	require.NoError(t, pf.Close())
	res, err = load()
	require.NoError(t, err)
	require.Equal(t, "device", res.VerifyOn, "hashed again after the write")
	got := make([]byte, f.Size())
	mem.CopyToHost(got, 0)
	require.True(t, bytes.Equal(got, fx.files["opaque.bin"]))

	// A changed byte: the next load fails on it.
	damage.FlipByte(t, spans[0].Path, spans[0].Chunks[0].PackOff+9)
	_, err = load()
	var ce *chunkstore.CorruptError
	require.ErrorAs(t, err, &ce, "the changed chunk is hashed and refused at the next load")
}
