package chunkstore

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportSmallFilesAllocates: importing a directory of small files
// allocates on the order of their bytes, not a chunk window, a pack write
// buffer and a chunk buffer of several MiB each per file (what made an
// import of 10 000 files of 4-64 KiB take 46 s, the runtime zeroing
// 28 MiB a file: docs/bench.md, "Importing many small files"). The files
// read back byte-equal.
func TestImportSmallFilesAllocates(t *testing.T) {
	const n = 300
	src := t.TempDir()
	files := map[string][]byte{}
	for i := range n {
		b := make([]byte, 4096+i*37)
		for j := range b {
			b[j] = byte(i*7 + j*13)
		}
		name := fmt.Sprintf("d%d/f%03d", i%3, i)
		require.NoError(t, os.MkdirAll(filepath.Join(src, filepath.Dir(name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o644))
		files[name] = b
	}
	s, err := Open(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = s.Import(context.Background(), src, "ds", ImportOptions{})
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	perFile := (after.TotalAlloc - before.TotalAlloc) / n
	require.Less(t, perFile, uint64(1<<20), "import allocated %d bytes per small file", perFile)
	for name, want := range files {
		f, _, err := s.OpenPath("ds/" + name)
		require.NoError(t, err)
		got := make([]byte, len(want)+1)
		k, err := f.ReadAt(got, 0)
		require.ErrorIs(t, err, io.EOF)
		require.Equal(t, want, got[:k], name)
	}
}
