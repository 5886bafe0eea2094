package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportHoldsGCUntilNamed: between an import's commit and the moment
// the namespace names what it wrote, GC cannot run (it would find the new
// chunks unreachable and delete them); and imports racing a GC loop all
// read back whole.
func TestImportHoldsGCUntilNamed(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	src := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(src, []byte("bytes that must outlive a concurrent gc"), 0o644))

	held := false
	beforeImportNames = func(s *Store) {
		if s.gcMu.TryLock() {
			s.gcMu.Unlock()
			return
		}
		held = true
	}
	defer func() { beforeImportNames = nil }()
	_, err = s.Import(context.Background(), src, "a", ImportOptions{})
	require.NoError(t, err)
	require.True(t, held, "GC could run between the import's commit and its naming")
	beforeImportNames = nil

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.GC(context.Background()); err != nil {
				t.Errorf("gc: %v", err)
				return
			}
		}
	}()
	for i := 0; i < 30; i++ {
		p := filepath.Join(t.TempDir(), "g")
		require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf("file %d, imported while gc runs", i)), 0o644))
		_, err := s.Import(context.Background(), p, fmt.Sprintf("d/%d", i), ImportOptions{})
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()
	for i := 0; i < 30; i++ {
		f, _, err := s.OpenPath(fmt.Sprintf("d/%d", i))
		require.NoError(t, err)
		b := make([]byte, f.Size())
		_, err = f.ReadAt(b, 0)
		require.NoError(t, err, "d/%d after imports raced gc", i)
		require.Equal(t, fmt.Sprintf("file %d, imported while gc runs", i), string(b))
	}
}
