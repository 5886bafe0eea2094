package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	kfs "github.com/kylix/kylix/fs"
)

// TestCloseReopenBeforeRelease: a writer closes a file, opens it again,
// writes and closes, and the kernel delivers the first RELEASE only after
// the second close. Sync (which every forwarded CLI command runs) must
// still wait for the second RELEASE, which commits the new bytes. It once
// did not: the second close was not the only writer's, so nothing marked
// the file as closing, and Sync returned with the new bytes uncommitted
// (CI saw this as TestCommitFailsAfterClose reading the new bytes after
// their commit had "failed"). The test holds RELEASEs in the daemon to
// force that order.
func TestCloseReopenBeforeRelease(t *testing.T) {
	var (
		mu      sync.Mutex
		gates   []chan struct{}
		entered = make(chan int, 4)
		left    = make(chan int, 4)
	)
	// Every RELEASE of a writing handle waits at its own gate.
	hook := func(write bool) func() {
		if !write {
			return nil
		}
		mu.Lock()
		gate := make(chan struct{})
		gates = append(gates, gate)
		i := len(gates) - 1
		mu.Unlock()
		entered <- i
		<-gate
		return func() { left <- i }
	}
	release := func(i int) {
		mu.Lock()
		close(gates[i])
		mu.Unlock()
		require.Equal(t, i, <-left, "RELEASE %d done", i)
	}
	n := startNode(t, filepath.Join(t.TempDir(), "data"), kfs.Options{}, nil)
	kfs.SetBeforeRelease(n.fs, hook)
	t.Cleanup(func() { // on a failure, let held RELEASEs go so the mount can stop
		kfs.SetBeforeRelease(n.fs, nil)
		mu.Lock()
		defer mu.Unlock()
		for _, g := range gates {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	})
	p := n.path("a.bin")
	old := pattern(1, 64<<10)
	if where, err := writeClose(p, old, true); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	require.Equal(t, 0, <-entered)
	release(0)
	require.NoError(t, n.fs.Sync())

	// First writer: its fsync commits, so its close leaves no working copy.
	w1, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w1.WriteAt([]byte("first"), 0)
	require.NoError(t, err)
	require.NoError(t, w1.Sync())
	require.NoError(t, w1.Close())
	require.Equal(t, 1, <-entered, "the first writer's RELEASE reached the daemon")

	// Second writer, opened while the first one's RELEASE is held.
	newBytes := pattern(2, len(old))
	w2, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	require.NoError(t, err)
	_, err = w2.Write(newBytes)
	require.NoError(t, err)
	require.NoError(t, w2.Close())
	require.Equal(t, 2, <-entered, "the second writer's RELEASE reached the daemon")
	// Both closes are pending: the first writer's left nothing to commit
	// (its fsync did) but is closed all the same; the second one's is
	// what Sync must wait for.
	require.Equal(t, 2, kfs.PendingCloses(n.fs), "Sync awaits both writers' RELEASEs")

	release(1) // the first RELEASE goes on, the second is still held
	require.Equal(t, 1, kfs.PendingCloses(n.fs), "after the first RELEASE, Sync still awaits the second writer's")

	synced := make(chan error, 1)
	go func() { synced <- n.fs.Sync() }()
	release(2)
	require.NoError(t, <-synced)
	require.Equal(t, 0, kfs.PendingCloses(n.fs))
	// The store's namespace (not the mount's view) holds the new bytes.
	e, err := n.s.Lookup("a.bin")
	require.NoError(t, err)
	f, err := n.s.OpenFile(e.ID)
	require.NoError(t, err)
	got := make([]byte, e.Size)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, newBytes), "a.bin's committed version is the second writer's bytes")
}
