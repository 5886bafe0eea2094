package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/internal/damage"
)

// smallFiles is n files f000, f001, ... of 1 to max random bytes.
func smallFiles(r *rand.Rand, n, max int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		b := make([]byte, 1+r.IntN(max))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		files[fmt.Sprintf("f%03d", i)] = b
	}
	return files
}

// prefetchTree is 40 small files, one file too large to prefetch and one
// whose chunk the test corrupts, in one directory.
func prefetchTree(t *testing.T) map[string][]byte {
	r := rand.New(rand.NewPCG(7, 8))
	files := smallFiles(r, 40, 64<<10)
	big := make([]byte, kfs.PrefetchMaxFile+1)
	for j := range big {
		big[j] = byte(r.Uint32())
	}
	files["zbig"] = big
	files["zbad"] = bytes.Repeat([]byte("corrupt me "), 3000)
	return files
}

// TestReadOnlyPrefetch: on a read-only mount the first read of a file in a
// directory stores its other small files in the kernel's page cache, so
// they are then read with no READ reaching the node, byte-equal to what
// was imported; a file with a corrupt chunk is not stored (it reads EIO,
// never wrong bytes), a large file is left to readahead, and a file
// replaced after its bytes were stored reads its new bytes.
func TestReadOnlyPrefetch(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{ReadOnly: true})
	files := prefetchTree(t)
	importTree(t, m, "ds", files)
	f, _, err := m.Store.OpenPath("ds/zbad")
	require.NoError(t, err)
	ext := f.Extents()
	damage.FlipByte(t, ext[0].PackPath, ext[0].PackOff+ext[0].Len/2)

	dir := filepath.Join(m.Dir, "ds")
	ents, err := os.ReadDir(dir) // the kernel learns the inodes
	require.NoError(t, err)
	require.Len(t, ents, len(files))
	got, err := os.ReadFile(filepath.Join(dir, "f000"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(files["f000"], got))
	m.FS.PrefetchIdle()
	st := m.FS.Stats()
	assert.Equal(t, int64(39), st.Prefetched, "small files stored in the kernel's cache")

	reads := st.DaemonReads
	for i := 1; i < 40; i++ {
		name := fmt.Sprintf("f%03d", i)
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(files[name], got), "%s: wrong bytes", name)
	}
	assert.Equal(t, reads, m.FS.Stats().DaemonReads, "reads of prefetched files reached the node")

	_, err = os.ReadFile(filepath.Join(dir, "zbad"))
	assert.True(t, errors.Is(err, syscall.EIO), "corrupt chunk: %v", err)
	got, err = os.ReadFile(filepath.Join(dir, "zbig"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(files["zbig"], got), "zbig: wrong bytes")

	// Replaced behind the mount after its bytes were stored: the new ones.
	newer := bytes.Repeat([]byte("new version "), 1000)
	importTree(t, m, "ds", map[string][]byte{"f005": newer})
	got, err = os.ReadFile(filepath.Join(dir, "f005"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(newer, got), "stale bytes after an import replaced a prefetched file (%d bytes)", len(got))
}

// TestReadWriteMountNoPrefetch: a read-write mount stores nothing ahead
// (its files' bytes can change under the same inode).
func TestReadWriteMountNoPrefetch(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	files := prefetchTree(t)
	delete(files, "zbig")
	importTree(t, m, "ds", files)
	dir := filepath.Join(m.Dir, "ds")
	_, err := os.ReadDir(dir)
	require.NoError(t, err)
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), name)
	}
	m.FS.PrefetchIdle()
	assert.Zero(t, m.FS.Stats().Prefetched)
}

// TestReadOnlyPrefetchCorruptManifest: a file whose manifest is damaged
// in the index (a byte flipped in index.db under the running node) fails
// alone in its directory's pass, which opens its files in batches: the
// others are stored and read byte-equal with no READ reaching the node,
// and the damaged one reads EIO, never bytes.
func TestReadOnlyPrefetchCorruptManifest(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{ReadOnly: true})
	files := smallFiles(rand.New(rand.NewPCG(9, 10)), 20, 32<<10)
	importTree(t, m, "ds", files)
	e, err := m.Store.Lookup("ds/f003")
	require.NoError(t, err)
	manifest, err := m.Store.GetObject(e.ID)
	require.NoError(t, err)
	db := filepath.Join(m.Store.Dir(), "index.db")
	raw, err := os.ReadFile(db)
	require.NoError(t, err)
	flipped := 0
	for off := 0; ; {
		i := bytes.Index(raw[off:], manifest)
		if i < 0 {
			break
		}
		damage.FlipByte(t, db, int64(off+i+len(manifest)/2))
		off += i + len(manifest)
		flipped++
	}
	require.NotZero(t, flipped, "the manifest's bytes were not found in index.db")
	_, err = m.Store.GetObject(e.ID)
	require.ErrorIs(t, err, chunkstore.ErrCorrupt, "the flip did not reach the index the node reads")

	dir := filepath.Join(m.Dir, "ds")
	_, err = os.ReadDir(dir)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, "f000"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(files["f000"], got))
	m.FS.PrefetchIdle()
	st := m.FS.Stats()
	assert.Equal(t, int64(18), st.Prefetched, "small files stored: all but the first and the damaged one")
	for i := 1; i < 20; i++ {
		name := fmt.Sprintf("f%03d", i)
		if name == "f003" {
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(files[name], got), "%s: wrong bytes", name)
	}
	assert.Equal(t, st.DaemonReads, m.FS.Stats().DaemonReads, "reads of prefetched files reached the node")
	got, err = os.ReadFile(filepath.Join(dir, "f003"))
	assert.True(t, errors.Is(err, syscall.EIO), "damaged manifest: %v (%d bytes)", err, len(got))
}
