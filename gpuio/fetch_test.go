package gpuio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
)

// mapFetcher serves chunks from memory, as a cluster's members would; with
// flip set it sends every chunk with one byte changed (a lying member).
type mapFetcher struct {
	chunks map[chunkstore.ID][]byte
	flip   bool
	asked  atomic.Int64
}

func (m *mapFetcher) Fetch(ctx context.Context, id chunkstore.ID, n uint32) ([]byte, error) {
	m.asked.Add(1)
	b, ok := m.chunks[id]
	if !ok {
		return nil, fmt.Errorf("chunk %s: %w", id.Short(), chunkstore.ErrNotLocal)
	}
	b = bytes.Clone(b)
	if m.flip {
		b[len(b)/2] ^= 1
	}
	return b, nil
}

// intoFetcher is mapFetcher as a chunkstore.IntoFetcher (the peer layer's
// kind): it writes each chunk into the caller's memory.
type intoFetcher struct {
	*mapFetcher
	into atomic.Int64
}

func (m *intoFetcher) FetchVerifies() {}

func (m *intoFetcher) FetchInto(ctx context.Context, id chunkstore.ID, dst []byte) error {
	m.into.Add(1)
	b, err := m.Fetch(ctx, id, uint32(len(dst)))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// missingStore returns a store whose files' chunks are all stored elsewhere:
// the fixture's files are imported, every chunk is handed to fe, and the
// packs are deleted before the store is opened again with fetcher (fe, or
// one made of it).
func missingStore(t *testing.T, fx *fixture, fe *mapFetcher, fetcher chunkstore.Fetcher) *chunkstore.Store {
	t.Helper()
	dir, src := t.TempDir(), t.TempDir()
	st, err := chunkstore.Open(chunkstore.Options{Dir: dir})
	require.NoError(t, err)
	fe.chunks = map[chunkstore.ID][]byte{}
	var packs []string
	for name, b := range fx.files {
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o644))
		_, err := st.Import(context.Background(), filepath.Join(src, name), name, chunkstore.ImportOptions{})
		require.NoError(t, err)
		f, _, err := st.OpenPath(name)
		require.NoError(t, err)
		p, err := f.Plan(0, f.Size())
		require.NoError(t, err)
		for _, pc := range p.Pieces {
			fe.chunks[pc.ID] = b[pc.FileOff : pc.FileOff+pc.Len]
			packs = append(packs, st.PackPath(pc.Pack))
		}
		p.Release()
	}
	require.NoError(t, st.Close())
	for _, p := range packs {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	st, err = chunkstore.Open(chunkstore.Options{Dir: dir, Fetcher: fetcher})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// TestLoadFetchesMissingChunks: a load of files whose chunks are not stored
// here (a cluster member's) fetches them inside the pipeline and places every
// byte, on every loader variant, whole files and strided tensor-parallel
// shares; the result counts what was fetched. Wrong bytes from the fetcher
// fail the load and never count as placed; with no one to ask, the load
// fails with ErrNotLocal. A fetcher that writes into the caller's memory
// (chunkstore.IntoFetcher) is used that way.
func TestLoadFetchesMissingChunks(t *testing.T) {
	fx := newFixture(t)
	t.Run("into", func(t *testing.T) {
		fe := &mapFetcher{}
		ife := &intoFetcher{mapFetcher: fe}
		st := missingStore(t, fx, fe, ife)
		testLoadFetches(t, fx, st, fe)
		require.Positive(t, ife.into.Load(), "the IntoFetcher's FetchInto was never used")
	})
	fe := &mapFetcher{}
	st := missingStore(t, fx, fe, fe)
	testLoadFetches(t, fx, st, fe)

	t.Run("wrong bytes", func(t *testing.T) {
		fe.flip = true
		defer func() { fe.flip = false }()
		require.ErrorIs(t, loadWhole(t, st, "opaque.bin"), chunkstore.ErrCorrupt)
	})
	// Another file: the store remembers a failed chunk for a moment
	// (chunkstore.DefaultFailTTL) and would answer with that failure.
	t.Run("no one to ask", func(t *testing.T) {
		saved := fe.chunks
		fe.chunks = nil
		defer func() { fe.chunks = saved }()
		require.ErrorIs(t, loadWhole(t, st, "b.safetensors"), chunkstore.ErrNotLocal)
	})
}

// loadWhole loads all of file name of st into a host device and returns
// the load's error.
func loadWhole(t *testing.T, st *chunkstore.Store, name string) error {
	t.Helper()
	l, err := New(st, &HostDevice{}, Options{})
	require.NoError(t, err)
	defer l.Close()
	f, _, err := st.OpenPath(name)
	require.NoError(t, err)
	mem, err := (&HostDevice{}).Alloc(f.Size())
	require.NoError(t, err)
	defer mem.Free()
	_, err = l.ReadRange(context.Background(), f, 0, f.Size(), mem, 0)
	return err
}

// testLoadFetches loads every file, ranges of it and a strided share from
// st, whose chunks fe serves, on every loader variant.
func testLoadFetches(t *testing.T, fx *fixture, st *chunkstore.Store, fe *mapFetcher) {
	for vname, mk := range variants() {
		t.Run(vname, func(t *testing.T) {
			dev, opts := mk()
			l, err := New(st, dev, opts)
			require.NoError(t, err)
			defer l.Close()
			for name, want := range fx.files {
				f, _, err := st.OpenPath(name)
				require.NoError(t, err)
				size := int64(len(want))
				for _, rg := range [][2]int64{{0, size}, {size / 3, size / 2}, {size - 1, 1}} {
					mem, err := dev.Alloc(rg[1])
					require.NoError(t, err)
					asked := fe.asked.Load()
					res, err := l.ReadRange(context.Background(), f, rg[0], rg[1], mem, 0)
					require.NoError(t, err, "%s [%d, +%d)", name, rg[0], rg[1])
					require.Equal(t, rg[1], res.Bytes)
					require.True(t, bytes.Equal(want[rg[0]:rg[0]+rg[1]], mem.(HostViewer).HostView()[:rg[1]]), "%s [%d, +%d): bytes differ", name, rg[0], rg[1])
					require.Greater(t, res.FetchedChunks, 0, "%s: nothing counted as fetched", name)
					require.GreaterOrEqual(t, res.Fetched, rg[1])
					require.Contains(t, res.IO, "fetched")
					require.Greater(t, fe.asked.Load(), asked, "the fetcher was not asked")
					mem.Free()
				}
			}
			// A column share of o_proj: strided copies out of fetched groups.
			f, _, err := st.OpenPath("a.safetensors")
			require.NoError(t, err)
			h, err := safetensors.Parse(f, f.Size())
			require.NoError(t, err)
			whole, err := safetensors.Parse(bytes.NewReader(fx.files["a.safetensors"]), int64(len(fx.files["a.safetensors"])))
			require.NoError(t, err)
			found := false
			for _, tn := range h.Tensors {
				if tn.Name != "o_proj" {
					continue
				}
				found = true
				sh := &Share{Dim: 1, Rank: 1, Size: 2}
				sl, err := sh.Layout(tn)
				require.NoError(t, err)
				mem, err := dev.Alloc(sl.Bytes)
				require.NoError(t, err)
				_, err = l.LoadTensors(context.Background(), f, h, []TensorTarget{{Name: tn.Name, Share: sh, Mem: mem}})
				require.NoError(t, err)
				src := fx.files["a.safetensors"][whole.DataStart()+tn.Begin:]
				var want []byte
				for r := int64(0); r < sl.Rows; r++ {
					want = append(want, src[r*sl.Pitch+sl.ColOff:][:sl.Width]...)
				}
				require.True(t, bytes.Equal(want, mem.(HostViewer).HostView()[:sl.Bytes]), "o_proj column share differs")
				mem.Free()
			}
			require.True(t, found, "no o_proj tensor in the fixture")
		})
	}
}

// TestHostDeviceReuse: with Reuse, memory freed serves a later allocation
// that fits (at most twice its size), and use after free is still refused
// through the old handle; without it, every allocation is new.
func TestHostDeviceReuse(t *testing.T) {
	d := &HostDevice{Reuse: true}
	a, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	pa := a.Ptr()
	require.NoError(t, a.Free())
	b, err := d.Alloc(800 << 10)
	require.NoError(t, err)
	require.Equal(t, pa, b.Ptr(), "freed memory that fits was not reused")
	require.Equal(t, int64(800<<10), b.Size())
	require.Error(t, a.(*hostMem).hold(), "the freed handle can still be used")
	c, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	require.NotEqual(t, pa, c.Ptr(), "memory in use handed out twice")
	require.NoError(t, b.Free())
	small, err := d.Alloc(100 << 10)
	require.NoError(t, err)
	require.NotEqual(t, pa, small.Ptr(), "a buffer over twice the size asked was reused")

	plain := &HostDevice{}
	x, err := plain.Alloc(1 << 20)
	require.NoError(t, err)
	px := x.Ptr()
	require.NoError(t, x.Free())
	y, err := plain.Alloc(1 << 20)
	require.NoError(t, err)
	require.NotEqual(t, px, y.Ptr())
}
