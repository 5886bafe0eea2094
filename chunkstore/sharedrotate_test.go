package chunkstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSharedPackRotationInOneImport: an import whose small files fill more
// than one shared pack must still sync the packs it filled (closing the
// old pack at rotation made its Flush fail with EBADF).
func TestSharedPackRotationInOneImport(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), SharedPackMax: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := t.TempDir()
	for i := range 40 {
		b := make([]byte, 8<<10)
		for k := range b {
			b[k] = byte(i*31 + k*7)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Import(context.Background(), src, "small", ImportOptions{}); err != nil {
		t.Fatalf("import across shared packs: %v", err)
	}
	rep, err := s.Verify(context.Background(), "", nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestGCRetiresDeadOpenSharedPack: when every file in the open shared pack
// is removed, gc frees the pack (before, the open pack was kept with all
// its bytes dead until it filled up); the next import opens a new shared
// pack, and the store reads, verifies and reopens as before.
func TestGCRetiresDeadOpenSharedPack(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	require.NoError(t, err)
	src := t.TempDir()
	for i := range 30 {
		require.NoError(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), bytes.Repeat([]byte{byte(i)}, 20<<10+i), 0o644))
	}
	ctx := context.Background()
	_, err = s.Import(ctx, src, "a", ImportOptions{})
	require.NoError(t, err)
	packBytes := func() (n int64) {
		ents, err := os.ReadDir(filepath.Join(dir, "packs"))
		require.NoError(t, err)
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".pack") {
				fi, err := e.Info()
				require.NoError(t, err)
				n += fi.Size()
			}
		}
		return n
	}
	require.Greater(t, packBytes(), int64(30*20<<10))
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("a", true) }))
	res, err := s.GC(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksRemoved, "the open shared pack, with nothing live in it")
	require.Zero(t, packBytes(), "pack bytes left after every file was removed and gc ran")

	_, err = s.Import(ctx, src, "b", ImportOptions{})
	require.NoError(t, err)
	f, _, err := s.OpenPath("b/f07")
	require.NoError(t, err)
	got := make([]byte, 20<<10+8)
	n, _ := f.ReadAt(got, 0)
	require.Equal(t, bytes.Repeat([]byte{7}, 20<<10+7), got[:n])
	rep, err := s.Verify(ctx, "", nil)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep)
	require.NoError(t, s.Close())
	s, err = Open(Options{Dir: dir})
	require.NoError(t, err)
	defer s.Close()
	rep, err = s.Verify(ctx, "", nil)
	require.NoError(t, err)
	require.True(t, rep.OK(), "after a reopen: %+v", rep)
}
