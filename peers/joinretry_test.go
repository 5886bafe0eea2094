package peers

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// syncLog is a log buffer written by the node's goroutines and read by the
// test.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestJoinWaitsForItsSeed: a member started with --join before the member
// it names listens keeps trying, and joins once that member is up (members
// of a cluster are often started at once); it does not exit.
func TestJoinWaitsForItsSeed(t *testing.T) {
	key, _ := NewKey()
	seedAddr := freeAddr(t)
	start := func(cfg Config) (*Node, error) {
		n, err := New(cfg)
		require.NoError(t, err)
		s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir(), Fetcher: n, CacheBytes: cacheBytes})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		if err := n.Start(s, nil); err != nil {
			return nil, err
		}
		t.Cleanup(func() { n.Close() })
		return n, nil
	}
	var log syncLog
	done := make(chan error, 1)
	var b *Node
	go func() {
		var err error
		b, err = start(Config{Name: "b", Key: key, Listen: freeAddr(t), Capacity: 1 << 30, FetchTimeout: 5 * time.Second,
			Join: []string{seedAddr}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "no member to join answered yet") {
		require.True(t, time.Now().Before(deadline), "b never said it waits for its seed: %s", log.String())
		select {
		case err := <-done:
			t.Fatalf("b's start ended before its seed was up: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	a, err := start(Config{Name: "a", Key: key, Listen: seedAddr, Capacity: 1 << 30, FetchTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, <-done, "b's start once its seed was up")
	eventually(t, "two alive members", func() bool { return len(a.members()) == 2 && len(b.members()) == 2 })
}
