package peers

import (
	"context"
	mrand "math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestFetchToStore: two members, one copy of each chunk. B fetches the
// chunks of a file of A's that it does not own with FetchToStore: the
// right bytes, and nothing kept in its peer cache (PeerCached says so);
// with Fetch the same chunks land in the peer cache, and FetchToStore then
// reads them from there. A chunk nobody holds is ErrNotLocal.
func TestFetchToStore(t *testing.T) {
	key, _ := NewKey()
	a, err := startNodeCfg(t, Config{Name: "a", Key: key, Replicas: 1})
	require.NoError(t, err)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, Replicas: 1, Join: []string{a.cfg.Listen}, NoPlacement: true,
		CacheDir: t.TempDir(), CacheBytes: 1 << 30})
	require.NoError(t, err)
	eventually(t, "two alive members", func() bool { return len(a.members()) == 2 && len(b.members()) == 2 })
	// Seeded: which chunks b owns is then the same every run (random
	// bytes once gave b every chunk: a CI failure below).
	data := make([]byte, 8<<20)
	mrand.NewChaCha8([32]byte{23}).Read(data)
	importBytes(t, a, "f", data)
	eventually(t, "f on b", func() bool { _, err := b.s.Lookup("f"); return err == nil })
	f, _, err := b.s.OpenPath("f")
	require.NoError(t, err)
	var refs []chunkstore.ChunkRef
	for _, c := range f.M.Chunks {
		if !owns(c.ID, b.members(), "b", 1) {
			refs = append(refs, c)
		}
	}
	require.NotEmpty(t, refs, "b owns every chunk of an 8 MiB file")
	ctx := context.Background()
	for _, c := range refs {
		got, err := b.FetchToStore(ctx, c.ID, c.Len)
		require.NoError(t, err)
		require.Equal(t, c.ID, chunkstore.Sum(got))
	}
	n, bytesCached := b.PeerCached(refs)
	require.Zero(t, n, "FetchToStore kept chunks in the peer cache")
	require.Zero(t, bytesCached)
	var want int64
	for _, c := range refs {
		got, err := b.Fetch(ctx, c.ID, c.Len)
		require.NoError(t, err)
		require.Equal(t, c.ID, chunkstore.Sum(got))
		want += int64(c.Len)
	}
	n, bytesCached = b.PeerCached(refs)
	require.Equal(t, len(refs), n)
	require.Equal(t, want, bytesCached)
	hits := b.Swarm().Cache.Hits
	got, err := b.FetchToStore(ctx, refs[0].ID, refs[0].Len)
	require.NoError(t, err)
	require.Equal(t, refs[0].ID, chunkstore.Sum(got))
	require.Equal(t, hits+1, b.Swarm().Cache.Hits, "FetchToStore did not read a cached chunk from the peer cache")

	missing := randBytes(1000)
	_, err = b.FetchToStore(ctx, chunkstore.Sum(missing), 1000)
	require.ErrorIs(t, err, chunkstore.ErrNotLocal)
}
