package chunkstore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/damage"
)

// fineTuneStore imports a 24 MiB base and a fine-tune of it (a 100-byte
// longer header, so every shared chunk sits at another offset, and three
// changed regions) into the namespace as "base" and "ft".
func fineTuneStore(t *testing.T) (*Store, string, []byte, []byte) {
	t.Helper()
	dir := t.TempDir()
	s := openTest(t, dir)
	r := rand.New(rand.NewPCG(21, 22))
	base := randBytes(r, 24<<20)
	ft := append(randBytes(r, 100), base...)
	for _, at := range []int{3 << 20, 11 << 20, 19 << 20} {
		copy(ft[at:], randBytes(r, 256<<10))
	}
	src := t.TempDir()
	for _, name := range []string{"base", "ft"} { // in this order: the fine-tune is the deduplicated one
		b := map[string][]byte{"base": base, "ft": ft}[name]
		p := filepath.Join(src, name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		_, err := s.Import(context.Background(), p, name, ImportOptions{})
		require.NoError(t, err)
	}
	return s, dir, base, ft
}

func readAll(t *testing.T, s *Store, path string) []byte {
	t.Helper()
	f, _, err := s.OpenPath(path)
	require.NoError(t, err)
	b := make([]byte, f.Size())
	n, err := f.ReadAt(b, 0)
	require.NoError(t, err)
	require.Equal(t, len(b), n)
	return b
}

// TestMakeWhole: a fine-tune deduplicated against its base has no
// passthrough candidate; MakeWhole gives it one holding every byte at its
// own offset, recorded as checked (passthrough opens at once), without
// taking the base's pack from the base; GC with compaction keeps it whole
// and frees the fine-tune's old pack; the store reopened reads the same;
// DropWhole takes it back; removing the fine-tune lets GC delete it.
func TestMakeWhole(t *testing.T) {
	s, dir, base, ft := fineTuneStore(t)
	ctx := context.Background()
	f, _, err := s.OpenPath("ft")
	require.NoError(t, err)
	_, _, ok := f.PassthroughCandidate()
	require.False(t, ok, "the fine-tune has a whole pack before MakeWhole: extents %+v", f.Extents())
	fb, _, err := s.OpenPath("base")
	require.NoError(t, err)
	basePack, _, ok := fb.PassthroughCandidate()
	require.True(t, ok)

	epoch := s.relocs.Load()
	var last int64
	res, err := s.MakeWhole(ctx, f.ID, func(done, total int64) { last = done; require.Equal(t, int64(len(ft)), total) })
	require.NoError(t, err)
	require.Equal(t, int64(len(ft)), last)
	require.NotEqual(t, epoch, s.relocs.Load(), "open Files must re-read their locations (File.Fresh)")
	t.Logf("%+v", res)
	require.Equal(t, int64(len(ft)), res.Bytes)
	require.Positive(t, res.Moved)
	require.Greater(t, res.CopyBytes, int64(len(ft))/2, "most of a fine-tune is a second copy")
	got, err := os.ReadFile(res.Path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, ft), "the whole copy is not exactly the file")

	f, _, err = s.OpenPath("ft")
	require.NoError(t, err)
	pack, _, ok := f.PassthroughCandidate()
	require.True(t, ok)
	require.Equal(t, res.Pack, pack)
	state, check, _ := s.PackState(f)
	require.Equal(t, res.Pack, state)
	require.NotNil(t, check, "the copy's writing counts as its check")
	pf, err := s.OpenPassthrough(ctx, f)
	require.NoError(t, err)
	pf.Close()
	fb, _, err = s.OpenPath("base")
	require.NoError(t, err)
	p, _, ok := fb.PassthroughCandidate()
	require.True(t, ok)
	require.Equal(t, basePack, p, "the base keeps its pack")
	_, err = s.MakeWhole(ctx, f.ID, nil)
	require.ErrorIs(t, err, ErrAlreadyWhole)

	// GC with compaction: the copy stays whole (its second copies look
	// dead), the fine-tune's old pack, now empty, goes.
	gc, err := s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Positive(t, gc.PacksRemoved, "%+v", gc)
	require.Zero(t, gc.Compaction.PacksCompacted, "%+v", gc.Compaction)
	require.Equal(t, ft, readAll(t, s, "ft"))
	require.Equal(t, base, readAll(t, s, "base"))
	wc, err := s.WholeCopies()
	require.NoError(t, err)
	require.Len(t, wc, 1)
	require.Equal(t, res.MovedBytes, wc[0].LiveBytes)

	// Reopened: the log gives the same layout.
	require.NoError(t, s.Close())
	s = openTest(t, dir)
	f, _, err = s.OpenPath("ft")
	require.NoError(t, err)
	pack, _, ok = f.PassthroughCandidate()
	require.True(t, ok)
	require.Equal(t, res.Pack, pack)
	require.Equal(t, ft, readAll(t, s, "ft"))

	// Dropped: no longer the file's pack; compaction gives its second
	// copies back, the bytes stay right.
	require.NoError(t, s.DropWhole(res.Pack))
	f, _, err = s.OpenPath("ft")
	require.NoError(t, err)
	_, _, ok = f.PassthroughCandidate()
	require.False(t, ok)
	gc, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, gc.Compaction.PacksCompacted, "%+v", gc.Compaction)
	require.Equal(t, ft, readAll(t, s, "ft"))
	wc, err = s.WholeCopies()
	require.NoError(t, err)
	require.Empty(t, wc)

	// Made again, then the fine-tune removed: GC deletes the copy.
	f, _, err = s.OpenPath("ft")
	require.NoError(t, err)
	res, err = s.MakeWhole(ctx, f.ID, nil)
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("ft", false) }))
	_, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	_, err = os.Stat(res.Path)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Equal(t, base, readAll(t, s, "base"))
}

// TestMakeWholeFailsCleanly: a chunk that does not verify, or a cancelled
// context, stops MakeWhole with nothing committed and no pack file left;
// the fine-tune reads as before.
func TestMakeWholeFailsCleanly(t *testing.T) {
	s, dir, _, ft := fineTuneStore(t)
	f, _, err := s.OpenPath("ft")
	require.NoError(t, err)
	packsOnly := func() map[string]string {
		m := packFiles(t, dir)
		for k := range m {
			if filepath.Ext(k) != ".pack" {
				delete(m, k) // the metadata log: it holds the intent
			}
		}
		return m
	}
	before := packsOnly()

	ctx, cancel := context.WithCancel(context.Background())
	_, err = s.MakeWhole(ctx, f.ID, func(done, total int64) {
		if done > total/2 {
			cancel()
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, packsOnly())

	// A flipped byte in a shared chunk, in the base's pack.
	fb, _, err := s.OpenPath("base")
	require.NoError(t, err)
	basePack := fb.Extents()[0].Pack
	var shared *Extent
	for _, x := range f.Extents() {
		if x.Pack == basePack {
			shared = &x
			break
		}
	}
	require.NotNil(t, shared, "no extent of the fine-tune in the base's pack: %+v", f.Extents())
	damage.FlipByte(t, shared.PackPath, shared.PackOff+shared.Len/2)
	before = packsOnly()
	_, err = s.MakeWhole(context.Background(), f.ID, nil)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), "kylix verify")
	require.Equal(t, before, packsOnly())
	f, _, err = s.OpenPath("ft")
	require.NoError(t, err)
	_, _, ok := f.PassthroughCandidate()
	require.False(t, ok)
	_, err = f.ReadAt(make([]byte, len(ft)), 0)
	require.ErrorIs(t, err, ErrCorrupt, "the damaged shared chunk is the fine-tune's too")
}
