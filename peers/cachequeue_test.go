package peers

import (
	"container/list"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// TestPutBehindQueuesAChunkOnce: a chunk two loads fetch at once is queued
// (copied and written) once; once written it can be queued again only
// after it left the cache.
func TestPutBehindQueuesAChunkOnce(t *testing.T) {
	c := &peerCache{dir: t.TempDir(), budget: 1 << 30, ll: list.New(), idx: map[chunkstore.ID]*list.Element{},
		behind: make(chan behindChunk, 8), behindMax: 1 << 20} // no writer yet: what is queued stays queued
	d := randBytes(5000)
	id := chunkstore.Sum(d)
	require.True(t, c.putBehind(id, d))
	require.True(t, c.putBehind(id, d), "already queued: kept")
	require.Equal(t, 1, c.queued)
	require.Len(t, c.behind, 1)
	require.EqualValues(t, len(d), c.behindBytes.Load())
	require.Zero(t, c.statsOf().NotKept)

	c.behindWG.Add(1)
	go c.writeBehind()
	c.close()
	got, ok := c.get(id, uint32(len(d)))
	require.True(t, ok)
	require.Equal(t, d, got)
	require.Empty(t, c.inQueue)
	require.Zero(t, c.behindBytes.Load())
}
