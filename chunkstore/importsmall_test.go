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

// TestProduceChunksSizeChanged: a file longer or shorter than the size
// its import planned for (it grew or shrank after the stat) is an error,
// whatever its length against the chunker's window, never a loop or a
// silent cut.
func TestProduceChunksSizeChanged(t *testing.T) {
	for _, size := range []int{100, 5000, 3 << 20, 9 << 20} {
		p := filepath.Join(t.TempDir(), "f")
		require.NoError(t, os.WriteFile(p, make([]byte, size), 0o644))
		f, err := os.Open(p)
		require.NoError(t, err)
		defer f.Close()
		for _, planned := range []int64{int64(size) - 1, int64(size) + 1} {
			n := 0
			err := produceChunks(context.Background(), f, planned, chunkPlan{}, func(j *chunkJob) bool { n += len(j.data); return true })
			require.Error(t, err, "a file of %d bytes imported as %d", size, planned)
			require.Contains(t, err.Error(), "size", "a file of %d bytes imported as %d", size, planned)
		}
		n := 0
		require.NoError(t, produceChunks(context.Background(), f, int64(size), chunkPlan{}, func(j *chunkJob) bool { n += len(j.data); return true }))
		require.Equal(t, size, n)
	}
}
