package gpuio

import (
	"bytes"
	"context"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReadRangesEveryByte places many ranges at once (adjacent, overlapping,
// far apart, in any order; with gaps in the destination) and checks every
// byte placed and every byte between them left alone, on every loader
// variant.
func TestReadRangesEveryByte(t *testing.T) {
	fx := newFixture(t)
	// -short (make test's race run, where this test took 250 s of 420 on
	// two cores): back to back, strided and random, one trial each.
	trials := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
	if testing.Short() {
		trials = []int{0, 3, 4}
	}
	for vname, mk := range variants() {
		t.Run(vname, func(t *testing.T) {
			dev, opts := mk()
			l, err := New(fx.st, dev, opts)
			require.NoError(t, err)
			r := rand.New(rand.NewPCG(3, 4))
			for name, want := range fx.files {
				f := fx.open(t, name)
				size := int64(len(want))
				for _, trial := range trials {
					var rs []Range
					var dstEnd int64
					add := func(off, n int64) {
						dstEnd += r.Int64N(300) // a gap, like the Python package's 256-byte alignment
						rg := Range{Off: off, N: n, DstOff: dstEnd}
						if trial >= 3 && r.IntN(2) == 0 && n > 1 {
							// Strided: rows of a share split along a later dimension.
							rg.N = 1 + r.Int64N(min(n, 70000))
							rg.Pitch = rg.N + r.Int64N(3*rg.N)
							rg.Rows = 1 + (size-off-rg.N)/rg.Pitch
							rg.Rows = 1 + r.Int64N(min(rg.Rows, 200))
						}
						rs = append(rs, rg)
						dstEnd += rg.Bytes()
					}
					switch trial {
					case 0: // back to back, like the tensors of a file
						for off := int64(0); off < size; {
							n := min(size-off, 1+r.Int64N(3<<20))
							add(off, n)
							off += n
						}
					default: // random, overlapping, any order
						for range 1 + r.IntN(40) {
							off := r.Int64N(size)
							add(off, 1+r.Int64N(min(size-off, 5<<20)))
						}
					}
					rand.New(rand.NewPCG(uint64(trial), 9)).Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
					mem, err := dev.Alloc(dstEnd + 64)
					require.NoError(t, err)
					view := mem.(HostViewer).HostView()
					for i := range view {
						view[i] = 0xAB
					}
					res, err := l.ReadRanges(context.Background(), f, rs, mem)
					require.NoError(t, err, "%s trial %d", name, trial)
					var total int64
					expect := bytes.Repeat([]byte{0xAB}, int(dstEnd+64))
					for _, rg := range rs {
						total += rg.Bytes()
						for i := range rg.rows() {
							o := rg.Off + i*rg.Pitch
							copy(expect[rg.DstOff+i*rg.N:], want[o:o+rg.N])
						}
					}
					require.Equal(t, total, res.Bytes)
					require.True(t, res.Verified)
					got := make([]byte, dstEnd+64)
					mem.CopyToHost(got, 0)
					if !bytes.Equal(got, expect) {
						t.Fatalf("%s trial %d: bytes differ (path %s)", name, trial, res.Path)
					}
					mem.Free()
				}
			}
			require.NoError(t, l.Close())
			require.Zero(t, dev.(*HostDevice).Live(), "allocations leaked")
		})
	}
}

// TestReadRangesOneReadPerChunk: ranges that lie back to back read each
// chunk once, not once per range that touches it.
func TestReadRangesOneReadPerChunk(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.st, &HostDevice{}, Options{IO: IOBuffered})
	require.NoError(t, err)
	defer l.Close()
	for name, want := range fx.files {
		f := fx.open(t, name)
		size := int64(len(want))
		var rs []Range
		for off := int64(0); off < size; off += 100 << 10 {
			rs = append(rs, Range{Off: off, N: min(100<<10, size-off), DstOff: off})
		}
		mem, err := (&HostDevice{}).Alloc(size)
		require.NoError(t, err)
		res, err := l.ReadRanges(context.Background(), f, rs, mem)
		require.NoError(t, err)
		require.Equal(t, size, res.Bytes)
		// Whole chunks plus alignment at each group's ends, never twice.
		require.Less(t, res.Read, size+int64(len(rs))*4096, "%s: read %d for %d", name, res.Read, size)
		mem.Free()
	}
}

func TestReadRangesRefusesBadRanges(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.st, &HostDevice{}, Options{})
	require.NoError(t, err)
	defer l.Close()
	for name, want := range fx.files {
		f := fx.open(t, name)
		size := int64(len(want))
		mem, err := (&HostDevice{}).Alloc(100)
		require.NoError(t, err)
		for _, rg := range []Range{{Off: -1, N: 1}, {Off: size, N: 1}, {Off: 1, N: size}, {Off: 0, N: 101}, {Off: 0, N: 1, DstOff: 100}, {Off: 0, N: 1, DstOff: -1}, {Off: 1 << 62, N: 1 << 62},
			{Off: 0, N: 10, Rows: 2, Pitch: 5},                  // rows overlap
			{Off: 0, N: 10, Rows: 2, Pitch: 0},                  // no pitch
			{Off: 0, N: 10, Rows: 11, Pitch: 10},                // 110 bytes into 100
			{Off: 0, N: 1, Rows: size + 1, Pitch: 1},            // past the file's end
			{Off: 0, N: 1, Rows: 1 << 62, Pitch: 1 << 62},       // overflowing product
			{Off: 0, N: 1 << 40, Rows: 1 << 30, Pitch: 1 << 40}, // overflowing size
			{Off: 0, N: 5, Rows: -1, Pitch: 5}} {
			_, err := l.ReadRanges(context.Background(), f, []Range{{Off: 0, N: 10}, rg}, mem)
			require.Error(t, err, "%s %+v", name, rg)
		}
		mem.Free()
	}
}

// evictPacks drops the store's packs from the page cache.
func evictPacks(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(filepath.Join(dir, "packs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return err
		}
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	require.NoError(t, err)
}

// TestReadRangesShared: bytes not in the page cache are read with O_DIRECT,
// unless others read them at the same time (ReadOptions.Shared): then
// through the page cache, so the disk is read once for all.
func TestReadRangesShared(t *testing.T) {
	fx := newFixture(t)
	l, err := New(fx.st, &HostDevice{}, Options{})
	require.NoError(t, err)
	defer l.Close()
	f := fx.open(t, "opaque.bin")
	mem, err := (&HostDevice{}).Alloc(f.Size())
	require.NoError(t, err)
	defer mem.Free()
	rs := []Range{{Off: 0, N: f.Size()}}
	asked := 0
	for _, tc := range []struct {
		shared func() bool
		io     string
	}{
		{nil, "O_DIRECT"},
		{func() bool { asked++; return false }, "O_DIRECT"},
		{func() bool { asked++; return true }, "page cache"},
	} {
		evictPacks(t, fx.st.Dir())
		res, err := l.ReadRangesWith(context.Background(), f, rs, mem, ReadOptions{Shared: tc.shared})
		require.NoError(t, err)
		require.Equal(t, tc.io, res.IO)
		require.Equal(t, f.Size(), res.Bytes)
	}
	require.Positive(t, asked)
}
