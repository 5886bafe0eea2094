package chunkstore

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRootFollowsCommits: Root, which the mount asks at every lookup and
// caches between commits, gives the head of the index after each
// namespace change, also while other goroutines ask it during the
// changes (a head cached from before a commit would show a lost tree).
func TestRootFollowsCommits(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()
	head := func() ID {
		h, err := s.GetHead(NamespaceHead)
		require.NoError(t, err)
		return h.Root
	}
	empty, _, err := s.Root()
	require.NoError(t, err)
	require.Equal(t, Sum(emptyDir), empty)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					if _, _, err := s.Root(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for i := range 50 {
		name := fmt.Sprintf("d%02d", i)
		require.NoError(t, s.Update(func(tx *NSTx) error {
			return tx.Put(name, Entry{Kind: KindDir, Mode: 0o755, ID: tx.PutDir(&DirManifest{})})
		}))
		root, _, err := s.Root()
		require.NoError(t, err)
		require.Equal(t, head(), root, "after commit %d", i)
		_, err = s.Lookup(name)
		require.NoError(t, err, "a name just committed is not found")
	}
	close(stop)
	wg.Wait()
	root, _, err := s.Root()
	require.NoError(t, err)
	require.Equal(t, head(), root)
}
