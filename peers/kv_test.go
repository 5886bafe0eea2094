package peers

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// mapKV is a member's KV store for these tests: blocks in a map.
type mapKV struct {
	mu sync.Mutex
	m  map[string][]byte
}

func kvName(ns uint32, key [32]byte) string { return fmt.Sprintf("%d/%x", ns, key) }

func (k *mapKV) PutBlock(ns uint32, key [32]byte, b []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.m[kvName(ns, key)] = bytes.Clone(b)
	return nil
}

func (k *mapKV) GetBlock(ns uint32, key [32]byte) ([]byte, chunkstore.ID, func(), bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	b, ok := k.m[kvName(ns, key)]
	return b, chunkstore.Sum(b), func() {}, ok
}

func (k *mapKV) HasBlock(ns uint32, key [32]byte) bool { return k.has(ns, key) }

func (k *mapKV) has(ns uint32, key [32]byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.m[kvName(ns, key)]
	return ok
}

// TestKVBlocksOnMembers: three members with KV stores. A block pushed by
// one lands on its home only; any other member fetches it from there,
// byte for byte; a namespace is part of the block's name; a lying home's
// block is a miss counted against it; a home gone is a miss, quickly.
func TestKVBlocksOnMembers(t *testing.T) {
	key, _ := NewKey()
	var ms []*testNode
	kvs := map[string]*mapKV{}
	var join []string
	for i := range 3 {
		n, err := startNodeCfg(t, Config{Name: fmt.Sprintf("k%d", i), Key: key, NoPlacement: true, Join: join})
		require.NoError(t, err)
		kv := &mapKV{m: map[string][]byte{}}
		require.NoError(t, n.SetKV(kv))
		kvs[n.self] = kv
		ms = append(ms, n)
		join = append(join, n.cfg.Listen)
	}
	for _, n := range ms {
		waitFor(t, "3 members alive on "+n.self, func() bool { return len(n.livePeers()) == 2 })
	}
	ctx := context.Background()
	// A key whose home is not ms[0], pushed by ms[0].
	var k [32]byte
	for i := 0; ; i++ {
		copy(k[:], fmt.Sprintf("prefix-%d", i))
		if !ms[0].KVHomeIsSelf(7, k) {
			break
		}
	}
	block := randBytes(256 << 10)
	sum := chunkstore.Sum(block)
	home, err := ms[0].PushKV(ctx, 7, k, sum, block)
	require.NoError(t, err)
	require.NotEmpty(t, home)
	for name, kv := range kvs {
		assert.Equal(t, name == home, kv.has(7, k), "the block is on its home %s only (checked %s)", home, name)
	}
	for _, n := range ms {
		if n.self == home {
			continue
		}
		b, s, ok := n.FetchKV(ctx, 7, k)
		require.True(t, ok, "%s fetches the block from its home", n.self)
		assert.Equal(t, sum, s)
		assert.True(t, bytes.Equal(block, b), "%s: the block's bytes", n.self)
		_, _, ok = n.FetchKV(ctx, 8, k)
		assert.False(t, ok, "another namespace's key is another block")
	}
	// A push whose home is the pusher copies nothing.
	var mine [32]byte
	for i := 0; ; i++ {
		copy(mine[:], fmt.Sprintf("mine-%d", i))
		if ms[0].KVHomeIsSelf(7, mine) {
			break
		}
	}
	h, err := ms[0].PushKV(ctx, 7, mine, sum, block)
	require.NoError(t, err)
	assert.Empty(t, h)

	// KVHas: the pushed key is kept by a member, the others are not.
	for _, n := range ms {
		if n.self == home {
			continue
		}
		assert.Equal(t, []bool{true, false, false}, n.KVHas(ctx, 7, [][32]byte{k, mine, {9}}), "asked on %s", n.self)
	}

	// The home turns liar: its block fails the BLAKE3 it sends, a miss.
	liar := nodeNamed(ms, home)
	asker := ms[0]
	liar.srv.corrupt.Store(true)
	before := asker.statsFor(home).BadChunks.Load()
	_, _, ok := asker.FetchKV(ctx, 7, k)
	assert.False(t, ok, "a lying member's block is a miss")
	assert.Equal(t, before+1, asker.statsFor(home).BadChunks.Load(), "counted against the liar")
	liar.srv.corrupt.Store(false)

	// The home gone: a miss, well within the fetch time limit.
	require.NoError(t, liar.Close())
	waitFor(t, "the home's leave seen", func() bool { return len(asker.livePeers()) == 1 })
	start := time.Now()
	_, _, ok = asker.FetchKV(ctx, 7, k)
	assert.False(t, ok)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestKVWireRefuses: malformed KV requests are protocol errors.
func TestKVWireRefuses(t *testing.T) {
	good := make([]byte, kvPutHeader+3)
	good[71] = 3
	for _, c := range []struct {
		name string
		op   byte
		p    []byte
		ok   bool
	}{
		{"get", opKVGet, make([]byte, kvGetLen), true},
		{"get short", opKVGet, make([]byte, kvGetLen-1), false},
		{"get long", opKVGet, make([]byte, kvGetLen+1), false},
		{"put", opKVPut, good, true},
		{"put without a block", opKVPut, make([]byte, kvPutHeader), false},
		{"put naming more bytes than it has", opKVPut, append(bytes.Clone(good[:kvPutHeader]), 1), false},
		{"has", opKVHas, make([]byte, 4+64), true},
		{"has without keys", opKVHas, make([]byte, 4), false},
		{"has cut inside a key", opKVHas, make([]byte, 4+33), false},
	} {
		_, err := decodeRequest(frame{kind: c.op, payload: c.p})
		if c.ok {
			assert.NoError(t, err, c.name)
		} else {
			assert.ErrorIs(t, err, errProtocol, c.name)
		}
	}
}
