package fs

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestFileNodeSize: a mount may know millions of files, so a file node
// stays in the 256-byte size class (docs/bench.md, "Node memory per known
// file, 2026-12-07"); a field added must make room for itself, or go in
// fileExtra, which a file the kernel merely knows does not have.
func TestFileNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(fileNode{}); n > 256 {
		t.Fatalf("fileNode is %d bytes, over the 256-byte size class it was kept in", n)
	}
	if n := unsafe.Sizeof(fileExtra{}); n > 48 {
		t.Fatalf("fileExtra is %d bytes, over the 48-byte size class it was kept in", n)
	}
}

// TestFileNodeExtra: a file the kernel merely knows, or one written here
// (change time = mtime), has no fileExtra; other times and metadata
// changed here keep one, and the times read back as they were set.
func TestFileNodeExtra(t *testing.T) {
	n := newFileNode(nil, nil, "f", chunkstore.Entry{MTime: 10}, true)
	require.Nil(t, n.x)
	require.Equal(t, [3]int64{10, 0, 0}, [3]int64{n.mtime, n.ctimeLocked(), n.atimeLocked()})

	n.setTimesLocked(20, 20, 0) // a write
	require.Nil(t, n.x)
	require.Equal(t, [3]int64{20, 20, 0}, [3]int64{n.mtime, n.ctimeLocked(), n.atimeLocked()})

	n.setTimesLocked(20, 30, 0) // a rename
	require.NotNil(t, n.x)
	require.Equal(t, [3]int64{20, 30, 0}, [3]int64{n.mtime, n.ctimeLocked(), n.atimeLocked()})

	n.setTimesLocked(5, n.ctimeLocked(), 7) // utimes of mtime and atime: the ctime stays
	require.Equal(t, [3]int64{5, 30, 7}, [3]int64{n.mtime, n.ctimeLocked(), n.atimeLocked()})

	n.setTimesLocked(40, 40, 0)
	require.Nil(t, n.x, "nothing left to hold")

	n.stateLocked()
	n.extraLocked().metaSeq++
	n.idleLocked()
	require.NotNil(t, n.x, "a metadata change keeps its count")
	require.Nil(t, n.state())
	require.True(t, n.metaPendingLocked())
	n.x.metaDone = n.metaSeqLocked()
	n.idleLocked()
	require.False(t, n.metaPendingLocked())
	require.NotNil(t, n.x)
}
