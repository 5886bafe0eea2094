package peers

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// KV-cache blocks on the members (docs/design/kv.md, "The members tier").
// A block (namespace, key) has one home among the alive members that
// store data (readers hold nothing): the first in rendezvous order of
// kvID(ns, key), the same weighted HRW that places chunks. A member that
// stores a block whose home is another member pushes a copy there
// (PushKV); a member that misses a block asks its home, then the next
// member in that order (a member joining since the put moves the home),
// with the fetch time limit (FetchKV). The block travels with its BLAKE3
// and is checked against it on arrival: bytes that fail are counted
// against their sender (BadChunks) and are a miss, never data. Blocks
// live in each member's KV store (KVBlocks), never in the packs.

// KVBlocks is a member's KV store as the data plane serves it (the node
// gives its kvstore, SetKV).
type KVBlocks interface {
	// PutBlock stores a copy of b under (ns, key); its BLAKE3 was checked.
	PutBlock(ns uint32, key [32]byte, b []byte) error
	// GetBlock returns (ns, key)'s block and its BLAKE3, valid until
	// release is called; ok is false when the store does not hold it.
	GetBlock(ns uint32, key [32]byte) (b []byte, sum chunkstore.ID, release func(), ok bool)
	// HasBlock reports whether the store holds (ns, key)'s block (not
	// verified: a get may still miss).
	HasBlock(ns uint32, key [32]byte) bool
}

// MaxKVBlock bounds a block on the data plane (an opKVPut payload with
// its header fits maxPut). Larger blocks stay on the member that has them.
const MaxKVBlock = maxPut - kvPutHeader

const (
	kvGetLen    = 4 + 32          // ns, key
	kvPutHeader = 4 + 32 + 32 + 4 // ns, key, sum, length
	kvAnswerMax = 32 + MaxKVBlock // sum, block
	// kvAsked is how many other members a miss asks: the home and the
	// next (the home when a member joined since the put).
	kvAsked = 2
)

// SetKV makes this member keep and serve KV blocks (nil: none; a push is
// then refused and a fetch answered "not held"). Call it after Start.
func (n *Node) SetKV(kv KVBlocks) error {
	if n.srv == nil {
		return errors.New("the data plane does not serve yet: SetKV is called after Start")
	}
	if kv == nil {
		n.srv.kv.Store(nil)
		return nil
	}
	n.srv.kv.Store(&kv)
	return nil
}

// kvID is the rendezvous id of a block: a hash apart from chunk ids.
func kvID(ns uint32, key [32]byte) chunkstore.ID {
	h := blake3.New()
	h.Write([]byte("kylix kv block\x00"))
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], ns)
	h.Write(b[:])
	h.Write(key[:])
	var id chunkstore.ID
	h.Sum(id[:0])
	return id
}

// kvHomes are the alive storing members in (ns, key)'s rendezvous order,
// this member included.
func (n *Node) kvHomes(ns uint32, key [32]byte) []peer {
	var ps []peer
	for _, p := range n.members() {
		if !p.reader {
			ps = append(ps, p)
		}
	}
	return rank(kvID(ns, key), ps)
}

// KVHomeIsSelf reports whether this member is (ns, key)'s home: a block
// put here is then not copied anywhere.
func (n *Node) KVHomeIsSelf(ns uint32, key [32]byte) bool {
	hs := n.kvHomes(ns, key)
	return len(hs) > 0 && hs[0].name == n.self
}

// PushKV copies a block this member stores to its home, unless that is
// this member (then it returns "" and nil). It returns the home's name.
func (n *Node) PushKV(ctx context.Context, ns uint32, key [32]byte, sum chunkstore.ID, b []byte) (string, error) {
	if !n.started.Load() {
		return "", fmt.Errorf("KV block: not in a cluster: %w", chunkstore.ErrNotLocal)
	}
	if len(b) == 0 || len(b) > MaxKVBlock {
		return "", fmt.Errorf("KV block of %d bytes: members take 1 to %d", len(b), MaxKVBlock)
	}
	hs := n.kvHomes(ns, key)
	if len(hs) == 0 || hs[0].name == n.self {
		return "", nil
	}
	home := hs[0]
	p := make([]byte, 0, kvPutHeader+len(b))
	p = binary.BigEndian.AppendUint32(p, ns)
	p = append(p, key[:]...)
	p = append(p, sum[:]...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(b)))
	p = append(p, b...)
	actx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
	defer cancel()
	if _, err := n.request(actx, home, request{op: opKVPut, raw: p}, maxErrorLen); err != nil {
		return home.name, fmt.Errorf("KV block to %s: %w", home.name, err)
	}
	return home.name, nil
}

// FetchKV asks the members that may hold (ns, key)'s block (the first two
// other members in its rendezvous order: its home, unless that is this
// member, and the next) and returns the first
// block that matches the BLAKE3 it came with, and that BLAKE3. found is
// false when none had it, none answered in time, or every answer failed
// its check (counted against the member that sent it): a miss.
func (n *Node) FetchKV(ctx context.Context, ns uint32, key [32]byte) (b []byte, sum chunkstore.ID, found bool) {
	if !n.started.Load() {
		return nil, sum, false
	}
	q := make([]byte, 0, kvGetLen)
	q = binary.BigEndian.AppendUint32(q, ns)
	q = append(q, key[:]...)
	asked := 0
	for _, p := range n.kvHomes(ns, key) {
		if p.name == n.self || p.addr == "" {
			continue // this member's own store was looked in first
		}
		if asked == kvAsked {
			break
		}
		asked++
		actx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
		data, err := n.request(actx, p, request{op: opKVGet, raw: q}, kvAnswerMax)
		cancel()
		st := n.statsFor(p.name)
		switch {
		case err != nil:
			st.Errors.Add(1)
			n.log.Warn("kv: a member failed to answer for a block; asking the next", "member", p.name, "err", err)
			continue
		case data == nil:
			continue // not held there
		case len(data) <= 32:
			st.BadChunks.Add(1)
			continue
		}
		copy(sum[:], data[:32])
		b = data[32:]
		if chunkstore.Sum(b) != sum {
			st.BadChunks.Add(1)
			n.log.Error("kv: a member sent a block that fails its BLAKE3: a miss", "member", p.name)
			continue
		}
		st.Fetched.Add(1)
		st.FetchedBytes.Add(int64(len(b)))
		return b, sum, true
	}
	return nil, chunkstore.ID{}, false
}

// kvAnswer serves the KV ops from the member's KV store.
func (sv *server) kvAnswer(rq request) answer {
	kvp := sv.kv.Load()
	if rq.op == opKVHas {
		ns := binary.BigEndian.Uint32(rq.raw)
		keys := rq.raw[4:]
		out := make([]byte, len(keys)/32)
		for i := range out {
			if kvp != nil && (*kvp).HasBlock(ns, [32]byte(keys[32*i:32*i+32])) {
				out[i] = 1
			}
		}
		return answer{st: stOK, payload: out}
	}
	if rq.op == opKVGet {
		if kvp == nil {
			return answer{st: stNotFound}
		}
		ns := binary.BigEndian.Uint32(rq.raw)
		var key [32]byte
		copy(key[:], rq.raw[4:])
		b, sum, release, ok := (*kvp).GetBlock(ns, key)
		if !ok {
			return answer{st: stNotFound}
		}
		p := make([]byte, 32+len(b))
		copy(p, sum[:])
		copy(p[32:], b)
		release()
		if sv.corrupt.Load() {
			p[32] ^= 0xff
		}
		sv.stats.served(int64(len(b)))
		return answer{st: stOK, payload: p}
	}
	if kvp == nil {
		return answer{st: stError, payload: errMsg(errors.New("this member keeps no KV blocks (kylix serve --kv-mem)"))}
	}
	ns := binary.BigEndian.Uint32(rq.raw)
	var key [32]byte
	var sum chunkstore.ID
	copy(key[:], rq.raw[4:36])
	copy(sum[:], rq.raw[36:68])
	b := rq.raw[kvPutHeader:]
	if chunkstore.Sum(b) != sum {
		return answer{st: stError, payload: errMsg(errors.New("KV block fails its BLAKE3"))}
	}
	if err := (*kvp).PutBlock(ns, key, b); err != nil {
		return answer{st: stError, payload: errMsg(err)}
	}
	return answer{st: stOK}
}

// decodeKV checks a KV op's payload.
func decodeKV(op byte, p []byte) error {
	if op == opKVHas {
		if len(p) < 4+32 || (len(p)-4)%32 != 0 || len(p) > 4+maxHasIDs*32 {
			return fmt.Errorf("KV has of %d bytes: %w", len(p), errProtocol)
		}
		return nil
	}
	if op == opKVGet {
		if len(p) != kvGetLen {
			return fmt.Errorf("KV get of %d bytes: %w", len(p), errProtocol)
		}
		return nil
	}
	if len(p) <= kvPutHeader || len(p) > maxPut {
		return fmt.Errorf("KV put of %d bytes: %w", len(p), errProtocol)
	}
	if n := binary.BigEndian.Uint32(p[68:72]); uint64(n) != uint64(len(p)-kvPutHeader) {
		return fmt.Errorf("KV put of %d bytes naming a block of %d: %w", len(p), n, errProtocol)
	}
	return nil
}

// KVHas says which of keys' blocks (namespace ns) the members keep: each
// key is asked of the first other member in its rendezvous order (its
// home, or the next when the home is this member), one request per member
// for all its keys, the members at once, within the fetch time limit. A
// member that fails to answer counts as keeping none. The answer is a
// hint (not verified): a get may still miss.
func (n *Node) KVHas(ctx context.Context, ns uint32, keys [][32]byte) []bool {
	out := make([]bool, len(keys))
	if !n.started.Load() || len(keys) == 0 {
		return out
	}
	type ask struct {
		p   peer
		idx []int
	}
	byMember := map[string]*ask{}
	for i, k := range keys {
		for _, p := range n.kvHomes(ns, k) {
			if p.name == n.self || p.addr == "" {
				continue
			}
			a := byMember[p.name]
			if a == nil {
				a = &ask{p: p}
				byMember[p.name] = a
			}
			a.idx = append(a.idx, i)
			break
		}
	}
	var wg sync.WaitGroup
	for _, a := range byMember {
		for start := 0; start < len(a.idx); start += maxHasIDs {
			idx := a.idx[start:min(start+maxHasIDs, len(a.idx))]
			wg.Go(func() {
				q := binary.BigEndian.AppendUint32(make([]byte, 0, 4+32*len(idx)), ns)
				for _, i := range idx {
					q = append(q, keys[i][:]...)
				}
				actx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
				ans, err := n.request(actx, a.p, request{op: opKVHas, raw: q}, uint32(len(idx)))
				cancel()
				if err != nil || len(ans) != len(idx) {
					n.statsFor(a.p.name).Errors.Add(1)
					return
				}
				for j, i := range idx {
					out[i] = ans[j] == 1 // distinct i per goroutine
				}
			})
		}
	}
	wg.Wait()
	return out
}
