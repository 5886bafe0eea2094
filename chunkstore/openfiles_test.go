package chunkstore

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// OpenFiles opens every version of a batch in one index transaction:
// the bytes read through each File are the source's, and a bad ID fails
// alone (its error, the others open).
func TestOpenFilesOneBatch(t *testing.T) {
	src := t.TempDir()
	want := writeTree(t, src, testSizes, 7)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	_, err := s.Import(ctx, src, "m", ImportOptions{})
	require.NoError(t, err)
	var names []string
	var ids []ID
	for name := range want {
		e, err := s.Lookup("m/" + name)
		require.NoError(t, err)
		names, ids = append(names, name), append(ids, e.ID)
	}
	dir, err := s.Lookup("m/sub")
	require.NoError(t, err)
	missing := Sum([]byte("no such manifest"))
	// A missing object and a directory's manifest (not a file's) among
	// the files, twice the same file too.
	ids = append(ids, missing, dir.ID, ids[0])
	files, errs := s.OpenFiles(ids)
	require.Len(t, files, len(ids))
	require.Len(t, errs, len(ids))
	for i, name := range names {
		require.NoError(t, errs[i], name)
		require.Equal(t, int64(len(want[name])), files[i].Size(), name)
		got := make([]byte, len(want[name]))
		n, err := files[i].ReadAtContext(ctx, got, 0)
		if len(got) > 0 {
			require.NoError(t, err, name)
		}
		require.True(t, bytes.Equal(want[name], got[:n]) && n == len(want[name]), "%s: the bytes read differ", name)
	}
	k := len(names)
	require.ErrorIs(t, errs[k], ErrNotFound)
	require.Nil(t, files[k])
	require.ErrorIs(t, errs[k+1], ErrCorrupt, "a directory manifest opened as a file")
	require.Nil(t, files[k+1])
	require.NoError(t, errs[k+2])
	require.Equal(t, files[0].M, files[k+2].M)
	require.NotSame(t, files[0], files[k+2])
	// Nothing to open: no transaction, nothing returned.
	files, errs = s.OpenFiles(nil)
	require.Empty(t, files)
	require.Empty(t, errs)
}
