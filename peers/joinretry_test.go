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
	// newNode makes a member and its store here; only Start runs elsewhere.
	newNode := func(cfg Config) (*Node, *chunkstore.Store) {
		cfg.Key, cfg.Capacity, cfg.FetchTimeout = key, 1<<30, 5*time.Second
		n, err := New(cfg)
		require.NoError(t, err)
		s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir(), Fetcher: n, CacheBytes: cacheBytes})
		require.NoError(t, err)
		t.Cleanup(func() { n.Close(); s.Close() })
		return n, s
	}
	var log syncLog
	b, bs := newNode(Config{Name: "b", Listen: freeAddr(t), Join: []string{seedAddr}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	done := make(chan error, 1)
	go func() { done <- b.Start(bs, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "no member to join answered yet") {
		require.True(t, time.Now().Before(deadline), "b never said it waits for its seed: %s", log.String())
		select {
		case err := <-done:
			t.Fatalf("b's start ended before its seed was up: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	a, as := newNode(Config{Name: "a", Listen: seedAddr})
	require.NoError(t, a.Start(as, nil))
	require.NoError(t, <-done, "b's start once its seed was up")
	eventually(t, "two alive members", func() bool { return len(a.members()) == 2 && len(b.members()) == 2 })
}
