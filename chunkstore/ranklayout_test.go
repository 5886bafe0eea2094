package chunkstore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRankLayoutStore: a layout is hidden and reserved in the namespace
// root, kept by GC while its source version is live (its bytes read back
// the same), counted, and removed with its chunks by the first GC after
// the source is written over; verify reads it like any file.
func TestRankLayoutStore(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	src, f := importModel(t, s, rnd(6<<20, 1))

	layout := rnd(5<<20, 2)
	_, err = s.PutRankLayout(ctx, f.ID, 2, 2, bytes.NewReader(layout), int64(len(layout)), nil, nil)
	require.Error(t, err, "rank 2 of 2")
	_, err = s.PutRankLayout(ctx, ID{1}, 2, 0, bytes.NewReader(layout), int64(len(layout)), nil, nil)
	require.ErrorIs(t, err, ErrNotFound, "a source the store does not have")
	res, err := s.PutRankLayout(ctx, f.ID, 2, 1, bytes.NewReader(layout), int64(len(layout)), nil, nil)
	require.NoError(t, err)
	require.Equal(t, int64(len(layout)), res.NewBytes)

	// Hidden and reserved.
	_, err = s.Lookup(LayoutDir)
	require.ErrorIs(t, err, ErrNotFound)
	root, err := s.List("")
	require.NoError(t, err)
	for _, e := range root {
		require.NotEqual(t, LayoutDir, e.Name)
	}
	err = s.Update(func(tx *NSTx) error { return tx.Put(LayoutDir+"/x", Entry{Kind: KindDir}) })
	require.ErrorIs(t, err, ErrInvalidPath)
	err = s.Update(func(tx *NSTx) error { return tx.Remove(LayoutDir, true) })
	require.ErrorIs(t, err, ErrNotFound)
	err = s.Update(func(tx *NSTx) error { return tx.Rename("m", LayoutDir) })
	require.ErrorIs(t, err, ErrInvalidPath)

	gc, err := s.GC(ctx)
	require.NoError(t, err)
	require.Zero(t, gc.RankLayoutsRemoved)
	lf, err := s.OpenRankLayout(f.ID, 2, 1)
	require.NoError(t, err)
	got := make([]byte, len(layout))
	_, err = lf.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, layout, got)
	_, err = s.OpenRankLayout(f.ID, 2, 0)
	require.ErrorIs(t, err, ErrNotFound)
	files, n, extra, err := s.RankLayoutUsage()
	require.NoError(t, err)
	require.Equal(t, 1, files)
	require.Equal(t, int64(len(layout)), n)
	require.Equal(t, int64(len(layout)), extra)
	rep, err := s.Verify(ctx, "", nil)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	require.Equal(t, 2, rep.Files, "the file and its layout")

	// The file written over: its old version's layout goes at the next GC.
	st0, err := s.Stats()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(src, rnd(6<<20, 3), 0o644))
	_, err = s.Import(ctx, src, "m/model", ImportOptions{})
	require.NoError(t, err)
	gc, err = s.GC(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, gc.RankLayoutsRemoved)
	ls, err := s.RankLayouts(ID{})
	require.NoError(t, err)
	require.Empty(t, ls)
	st1, err := s.Stats()
	require.NoError(t, err)
	require.Less(t, st1.Chunks, st0.Chunks, "the layout's chunks went with it (and the old version's)")
	_, err = s.OpenRankLayout(f.ID, 2, 1)
	require.ErrorIs(t, err, ErrNotFound)
}

// TestRankLayoutMadeHere: a layout entry that arrived without being made
// here (as a namespace merge brings one from another member) is listed
// but not made here; one made here is, across a reopen of the store; a
// record that cannot be read trusts none.
func TestRankLayoutMadeHere(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	require.NoError(t, err)
	_, f := importModel(t, s, rnd(2<<20, 1))
	other := putBytes(t, s, rnd(1<<20, 5))
	// "Merged": an entry naming content the store has, not made here.
	require.NoError(t, s.Update(func(tx *NSTx) error {
		d, err := tx.dir([]string{LayoutDir, f.ID.String()}, true, true)
		if err != nil {
			return err
		}
		d.m.Put(Entry{Name: rankLayoutName(2, 0), Kind: KindFile, Mode: 0o644, ID: other.ID, Size: other.Size(), HLC: tx.hlc})
		return nil
	}))
	layout := rnd(1<<20, 2)
	made, err := s.PutRankLayout(ctx, f.ID, 2, 1, bytes.NewReader(layout), int64(len(layout)), nil, nil)
	require.NoError(t, err)
	ls, err := s.RankLayouts(f.ID)
	require.NoError(t, err)
	require.Len(t, ls, 2)
	for _, l := range ls {
		require.Equal(t, l.Rank == 1, l.MadeHere, "%+v", l)
	}
	require.False(t, s.RankLayoutMadeHere(other.ID))
	require.NoError(t, s.Close())

	s, err = Open(Options{Dir: dir})
	require.NoError(t, err)
	require.True(t, s.RankLayoutMadeHere(made.ID), "the record survives a reopen")
	require.False(t, s.RankLayoutMadeHere(other.ID))
	require.NoError(t, s.Close())

	require.NoError(t, os.WriteFile(layoutsMadePath(dir), []byte("{not json"), 0o600))
	s, err = Open(Options{Dir: dir})
	require.NoError(t, err)
	defer s.Close()
	require.False(t, s.RankLayoutMadeHere(made.ID), "a record that cannot be read trusts none")
}

// importModel imports b as m/model and returns the source file's path and
// the stored file.
func importModel(t *testing.T, s *Store, b []byte) (string, *File) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "model")
	require.NoError(t, os.WriteFile(src, b, 0o644))
	_, err := s.Import(context.Background(), src, "m/model", ImportOptions{})
	require.NoError(t, err)
	f, _, err := s.OpenPath("m/model")
	require.NoError(t, err)
	return src, f
}
