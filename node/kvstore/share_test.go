package kvstore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFairShareMemory: a uid that puts fast cannot take another uid's
// share of the host tier: once at its share it evicts its own blocks.
// Alone, a uid has the whole tier (plain LRU).
func TestFairShareMemory(t *testing.T) {
	s := open(t, "", 4, 0)
	for i := range 4 {
		put(t, s, key(1, i)) // uid 1 alone: the whole tier
	}
	assert.Equal(t, int64(4), s.Stats().Memory.Blocks)
	put(t, s, key(2, 0)) // uid 2 under its share (2 of 4): evicts uid 1's LRU
	put(t, s, key(2, 1))
	assert.Equal(t, Miss, s.Contains(key(1, 0)))
	assert.Equal(t, Miss, s.Contains(key(1, 1)))
	for i := range 50 { // uid 1 floods: only its own blocks go
		put(t, s, key(1, 100+i))
	}
	assert.Equal(t, Memory, get(t, s, key(2, 0)), "uid 2 keeps its share")
	assert.Equal(t, Memory, get(t, s, key(2, 1)), "uid 2 keeps its share")
	assert.Equal(t, Memory, s.Contains(key(1, 149)), "uid 1's newest block is in")
	// And the other way round: uid 2 at its share evicts its own.
	put(t, s, key(2, 2))
	assert.Equal(t, Memory, s.Contains(key(2, 2)))
	assert.Equal(t, Miss, s.Contains(key(2, 0)), "uid 2's least recently used went, not uid 1's")
	assert.Equal(t, Memory, s.Contains(key(1, 149)))
}

// TestFairShareDisk: the disk tier shares the same way.
func TestFairShareDisk(t *testing.T) {
	s := open(t, t.TempDir(), 1, 4)
	put(t, s, key(2, 0))
	put(t, s, key(2, 1))
	for i := range 20 {
		put(t, s, key(1, i)) // s.Flush in put: each written before the next
	}
	st := s.Stats()
	require.Equal(t, int64(4), st.Disk.Blocks)
	assert.Equal(t, Disk, s.Contains(key(2, 0)), "uid 2's blocks stay on disk")
	assert.Equal(t, Disk, s.Contains(key(2, 1)))
	assert.Equal(t, Disk, get(t, s, key(2, 0)))
}

func TestNSCountVictims(t *testing.T) {
	c := nsCount{}
	c.add(1, 3)
	c.add(2, 1)
	assert.Equal(t, 2, c.fair(4, 1))
	assert.Len(t, c.victims(4, 1), 1, "uid 1 is over its share: its own only")
	v := c.victims(4, 2)
	require.Len(t, v, 2, "uid 2 is under: the over-share first, then any")
	assert.True(t, v[0](Key{NS: 1}))
	assert.False(t, v[0](Key{NS: 2}))
	assert.Equal(t, 1, c.fair(4, 3), "a third uid counts itself")
	c.add(2, -1)
	_, ok := c[2]
	assert.False(t, ok, "a namespace holding nothing is forgotten")
}
