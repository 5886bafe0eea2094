package peers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLimiter: pulls of 10 × 100 KiB at 1 MiB/s take about a second, not
// less; a limit of 0 does not wait.
func TestLimiter(t *testing.T) {
	l := limiter{rate: 1 << 20}
	start := time.Now()
	for range 11 {
		if err := l.wait(context.Background(), 100<<10); err != nil {
			t.Fatal(err)
		}
	}
	// The first goes at once; the ten after it wait 100 KiB / 1 MiB each.
	if d := time.Since(start); d < 950*time.Millisecond || d > 3*time.Second {
		t.Errorf("11 waits of 100 KiB at 1 MiB/s took %v, want about 1 s", d)
	}
	var none limiter
	start = time.Now()
	for range 1000 {
		none.wait(context.Background(), 1<<30)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("no limit waited %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	slow := limiter{rate: 1}
	slow.wait(context.Background(), 10) // the next may go in 10 s
	if err := slow.wait(ctx, 1); err == nil {
		t.Error("a cancelled wait returned no error")
	}
}

// TestPush: three members that never pull (NoPlacement), so only a push
// can put chunks on them. After Push on the importer returns, every chunk
// is on its two owners; Replication says so; a second Push sends nothing.
func TestPush(t *testing.T) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, NoPlacement: true})
	require.NoError(t, err)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	c, err := startNodeCfg(t, Config{Name: "c", Key: key, NoPlacement: true, Join: []string{a.cfg.Listen}})
	require.NoError(t, err)
	eventually(t, "three alive members", func() bool { return len(a.livePeers()) == 2 })
	data := randBytes(64 << 20)
	importBytes(t, a, "d/f", data)
	start := time.Now()
	res, err := a.Push(context.Background(), "d")
	took := time.Since(start)
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	f, _, err := a.s.OpenPath("d/f")
	require.NoError(t, err)
	var owned int64
	for _, ch := range f.M.Chunks {
		for _, o := range owners(ch.ID, a.members(), DefaultReplicas) {
			x := map[string]*testNode{"a": a, "b": b, "c": c}[o.name]
			require.True(t, x.s.HasChunk(ch.ID), "chunk %s not on its owner %s", ch.ID.Short(), o.name)
			if o.name != "a" {
				owned++
			}
		}
	}
	require.Equal(t, owned, res.Chunks, "chunks pushed")
	require.Equal(t, res.Chunks, b.Placement().ReceivedChunks+c.Placement().ReceivedChunks)
	t.Logf("pushed %d chunks (%d MiB) to %d members in %v: %.0f MB/s", res.Chunks, res.Bytes>>20, res.Members, took, float64(res.Bytes)/took.Seconds()/1e6)
	rep, err := a.Replication(context.Background(), "d/f")
	require.NoError(t, err)
	require.Equal(t, 2, rep.MinCopies)
	require.Zero(t, rep.UnderBytes)
	require.Equal(t, int64(len(data)), rep.LocalBytes)
	again, err := a.Push(context.Background(), "d")
	require.NoError(t, err)
	require.Zero(t, again.Chunks, "a second push sent chunks the owners hold")
}
