package kvstore

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeldBlockOutlivesItsKey: a block lent by Hold keeps its bytes while
// its key is replaced and cleared (a copy engine may still be reading
// it), eviction passes it by, and its slot is reused only after Release.
func TestHeldBlockOutlivesItsKey(t *testing.T) {
	s := open(t, "", 2, 0)
	a, b, c, d := key(1, 0), key(1, 1), key(1, 2), key(1, 3)
	put(t, s, a)
	put(t, s, b)
	h := s.Hold(b)
	t.Cleanup(h.Release) // before the store's Close, also when a check fails
	require.Equal(t, Memory, h.Tier)
	off, ok := s.ArenaOffset(h.Bytes)
	require.True(t, ok, "a memory hit is a slot of the arena")
	require.Zero(t, off%bs)
	require.NoError(t, s.Put(a, block(a))) // a is now the most recently used
	put(t, s, c)                           // evicts a: b is held
	assert.Equal(t, Miss, s.Contains(a))
	assert.Equal(t, Memory, s.Contains(b))

	// Replacing and clearing a held block leave its bytes alone.
	require.NoError(t, s.Put(b, block(d))) // into c's slot (c evicted): b's old slot is still lent
	assert.True(t, bytes.Equal(h.Bytes, block(b)), "the held block kept its bytes after its key was put again")
	s.Clear(1, false)
	assert.True(t, bytes.Equal(h.Bytes, block(b)), "the held block kept its bytes after a clear")
	assert.Equal(t, Miss, s.Contains(b))

	// One slot lent, the other free after the clear: one put fits, the
	// next finds no slot it may take.
	put(t, s, d)
	h2 := s.Hold(d)
	t.Cleanup(h2.Release)
	fills := 0
	err := s.PutFrom(a, func([]byte) error { fills++; return nil })
	assert.ErrorIs(t, err, ErrFull, "both slots are lent")
	assert.Zero(t, fills, "a refused put reads nothing")
	h.Release()
	h2.Release()
	put(t, s, d)
	put(t, s, a)
	assert.Equal(t, Memory, get(t, s, d))
	assert.Equal(t, Memory, get(t, s, a), "the released slots hold new blocks")
	assert.Equal(t, int64(2), s.Stats().Memory.Blocks)
}

// TestPutFromFailureStoresNothing: a put whose fill fails stores nothing
// and gives its slot back.
func TestPutFromFailureStoresNothing(t *testing.T) {
	s := open(t, "", 1, 0)
	boom := errors.New("caller's memory went away")
	err := s.PutFrom(key(1, 0), func(dst []byte) error { copy(dst, block(key(1, 1))); return boom })
	require.ErrorIs(t, err, boom)
	assert.Equal(t, Miss, s.Contains(key(1, 0)))
	put(t, s, key(1, 1)) // the only slot is free again
	assert.Equal(t, Memory, get(t, s, key(1, 1)))
	assert.Equal(t, int64(0), s.Stats().Refused)
}

// TestCloseWaitsForHeldBlocks: Close keeps the arena mapped until every
// lent block is released (unmapping under a copy in flight would fault).
func TestCloseWaitsForHeldBlocks(t *testing.T) {
	s, err := Open(Options{BlockSize: bs, MemBudget: 2 * bs})
	require.NoError(t, err)
	k := key(1, 0)
	require.NoError(t, s.Put(k, block(k)))
	h := s.Hold(k)
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	// Once puts are refused as closed, Close is past its mark and waits.
	for !errors.Is(s.Put(key(1, 1), block(key(1, 1))), ErrClosed) {
		runtime.Gosched()
	}
	assert.True(t, bytes.Equal(h.Bytes, block(k)), "still mapped and unchanged")
	select {
	case <-closed:
		t.Fatal("Close returned while a block was lent")
	default:
	}
	h.Release()
	<-closed
	assert.Nil(t, s.Arena(), "unmapped after the last release")
}

// TestDiskHitIntoSlot: a disk hit is read into a slot of the arena (so a
// GPU copy can take it in place) when one is free without dropping a
// block still waiting for the disk, and into plain memory otherwise.
func TestDiskHitIntoSlot(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1, 4)
	a, b := key(1, 0), key(1, 1)
	put(t, s, a)
	put(t, s, b) // a leaves memory; both are on disk
	require.Equal(t, Disk, s.Contains(a))
	h := s.Hold(a)
	require.Equal(t, Disk, h.Tier)
	_, ok := s.ArenaOffset(h.Bytes)
	assert.True(t, ok, "read into the slot b's eviction freed")
	assert.True(t, bytes.Equal(h.Bytes, block(a)))
	// The only slot is lent now: another disk hit reads into plain memory.
	h2 := s.Hold(b)
	require.Equal(t, Disk, h2.Tier)
	_, ok = s.ArenaOffset(h2.Bytes)
	assert.False(t, ok, "no slot to be had")
	assert.True(t, bytes.Equal(h2.Bytes, block(b)))
	h.Release()
	h2.Release()
	assert.Equal(t, Memory, s.Contains(a), "the first disk hit stays in memory")
	assert.Equal(t, Disk, s.Contains(b), "the second had no slot to stay in")
}

// TestPeekIsNoGet: Peek lends a block in memory without counting a get
// or moving it in the LRU order; a block on disk only is a miss for it.
func TestPeekIsNoGet(t *testing.T) {
	s := open(t, t.TempDir(), 2, 4)
	a, b, c := key(1, 0), key(1, 1), key(1, 2)
	put(t, s, a)
	put(t, s, b)
	h := s.Peek(a)
	require.Equal(t, Memory, h.Tier)
	assert.True(t, bytes.Equal(h.Bytes, block(a)))
	h.Release()
	assert.Zero(t, s.Stats().Memory.Hits, "not a get")
	put(t, s, c) // evicts a: Peek did not make it the most recent
	assert.Equal(t, Disk, s.Contains(a))
	assert.Equal(t, Miss, s.Peek(a).Tier, "on disk only")
}

// TestBatchLandsInAdjacentSlots: the blocks of a batch put one after the
// other take adjacent slots, in a fresh tier and where eviction freed a
// run of them or a clear freed them in any order, so a get of the batch
// is one copy (node's kvRuns).
func TestBatchLandsInAdjacentSlots(t *testing.T) {
	s := open(t, "", 8, 0)
	offsets := func(keys ...Key) []int64 {
		var out []int64
		for _, k := range keys {
			h := s.Peek(k)
			require.NotNil(t, h, "key %v is in memory", k)
			off, ok := s.ArenaOffset(h.Bytes)
			h.Release()
			require.True(t, ok)
			out = append(out, off/bs)
		}
		return out
	}
	var first, second, third []Key
	for i := range 4 {
		first, second, third = append(first, key(1, i)), append(second, key(2, i)), append(third, key(1, 20+i))
	}
	for _, k := range append(append([]Key{}, first...), second...) {
		put(t, s, k)
	}
	assert.Equal(t, []int64{0, 1, 2, 3}, offsets(first...))
	assert.Equal(t, []int64{4, 5, 6, 7}, offsets(second...))
	// The tier is full: the third batch evicts the first, least recently
	// used, and takes its slots in order.
	for _, k := range third {
		put(t, s, k)
	}
	assert.Equal(t, []int64{0, 1, 2, 3}, offsets(third...))
	// A clear frees the slots in the order of a map; a new batch still
	// takes them lowest first.
	s.Clear(2, false)
	for _, k := range second {
		put(t, s, k)
	}
	assert.Equal(t, []int64{4, 5, 6, 7}, offsets(second...))
}
