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

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/internal/damage"
)

// TestReadOnlyMount: a read-only mount serves every byte (another process
// too) with no OPEN reaching the node after the first, refuses every
// change with EROFS, shows an import's new content at once (the pages the
// kernel keeps are dropped by Reconcile), and still answers EIO for a
// corrupt chunk.
func TestReadOnlyMount(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{ReadOnly: true})
	r := rand.New(rand.NewPCG(1, 2))
	files := map[string][]byte{}
	for i := 0; i < 100; i++ {
		b := make([]byte, 1+r.IntN(64<<10))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		files[fmt.Sprintf("d%d/f%03d.bin", i%4, i)] = b
	}
	big := make([]byte, 9<<20)
	for j := range big {
		big[j] = byte(r.Uint32())
	}
	files["big.bin"] = big
	importTree(t, m, "ds", files)
	for pass := 0; pass < 2; pass++ {
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(m.Dir, "ds", name))
			require.NoError(t, err, name)
			require.True(t, bytes.Equal(want, got), "%s: wrong bytes", name)
		}
	}
	assert.Equal(t, string(files["d1/f001.bin"]), catOut(t, filepath.Join(m.Dir, "ds", "d1", "f001.bin")))
	assert.LessOrEqual(t, m.FS.ReadOnlyOpens(), int64(1), "the kernel kept asking OPEN")

	p := filepath.Join(m.Dir, "ds", "d0", "f000.bin")
	for what, err := range map[string]error{
		"create":  os.WriteFile(filepath.Join(m.Dir, "ds", "new"), []byte("x"), 0o644),
		"write":   openWrite(p),
		"mkdir":   os.Mkdir(filepath.Join(m.Dir, "ds", "dir"), 0o755),
		"chmod":   os.Chmod(p, 0o600),
		"rename":  os.Rename(p, p+".x"),
		"unlink":  os.Remove(p),
		"symlink": os.Symlink("x", filepath.Join(m.Dir, "ds", "l")),
		"trunc":   os.Truncate(p, 0),
	} {
		assert.True(t, errors.Is(err, syscall.EROFS), "%s: %v, want EROFS", what, err)
	}

	// An import replaces a file the kernel has pages of: the new bytes.
	newer := bytes.Repeat([]byte("new version "), 1000)
	importTree(t, m, "ds/d0", map[string][]byte{"f000.bin": newer})
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(newer, got), "stale bytes after an import replaced the file (%d bytes)", len(got))

	// A corrupt chunk is still EIO, never wrong bytes (a file nothing has
	// read yet: bytes already verified stay cached).
	importTree(t, m, "other", map[string][]byte{"c.bin": bytes.Repeat([]byte("corrupt me "), 3000)})
	f, _, err := m.Store.OpenPath("other/c.bin")
	require.NoError(t, err)
	ext := f.Extents()
	damage.FlipByte(t, ext[0].PackPath, ext[0].PackOff+ext[0].Len/2)
	_, err = os.ReadFile(filepath.Join(m.Dir, "other", "c.bin"))
	assert.True(t, errors.Is(err, syscall.EIO), "corrupt chunk: %v", err)
}

func openWrite(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err == nil {
		f.Close()
	}
	return err
}
