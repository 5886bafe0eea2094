package peers

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestOwnersSkipReaders: a reader (Config.Reader) owns no chunk, whatever
// its rank; the owners are the first R of the others.
func TestOwnersSkipReaders(t *testing.T) {
	ms := []peer{{name: "a", capacity: 1}, {name: "r", capacity: 1 << 40, reader: true}, {name: "b", capacity: 1}, {name: "c", capacity: 1}}
	for i := range 200 {
		id := chunkstore.Sum([]byte{byte(i), byte(i >> 8)})
		own := owners(id, ms, 2)
		require.Len(t, own, 2)
		for _, o := range own {
			require.NotEqual(t, "r", o.name)
		}
		require.Equal(t, owners(id, []peer{ms[0], ms[2], ms[3]}, 2), own, "a reader changed the owners of the others")
	}
	require.Empty(t, owners(chunkstore.Sum([]byte("x")), []peer{{name: "r", reader: true}}, 2))
}

// TestReaderOwnsNothing: two nodes and a reader, R = 2. The nodes hold
// every chunk of a file imported on one of them; the reader pulls none for
// placement, reads the file whole (fetched, into its peer cache) and shows
// its role.
func TestReaderOwnsNothing(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b := mustStart(t, "b", key, false, a.cfg.Listen)
	r, err := startNodeCfg(t, Config{Name: "r", Key: key, Join: []string{a.cfg.Listen}, Reader: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	eventually(t, "three alive members", func() bool { return len(r.livePeers()) == 2 && len(a.livePeers()) == 2 && len(b.livePeers()) == 2 })

	data := randBytes(8 << 20)
	importBytes(t, a, "f", data)
	f, _, err := a.s.OpenPath("f")
	require.NoError(t, err)
	chunks := int64(len(f.M.Chunks))
	eventually(t, "b holds every chunk (the reader is no owner)", func() bool {
		p := b.Placement()
		return p.Members == 3 && p.OwnedChunks == chunks && p.OwnedMissing == 0
	})
	eventually(t, "f on the reader", func() bool { _, err := r.s.Lookup("f"); return err == nil })
	eventually(t, "a placement pass on the reader over three members", func() bool { return r.Placement().Members == 3 })
	p := r.Placement()
	require.Zero(t, p.OwnedChunks, "the reader owns chunks")
	require.Zero(t, p.PulledChunks, "the reader pulled chunks for placement")

	got, err := readAll(r, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data), "the reader read wrong bytes")
	require.Positive(t, r.cache.statsOf().Chunks, "what the reader fetched is not in its peer cache")
	roles := map[string]string{}
	for _, m := range a.Members() {
		roles[m.Name] = m.Role
	}
	require.Equal(t, map[string]string{"a": "node", "b": "node", "r": "reader"}, roles)
}
