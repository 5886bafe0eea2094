package stripe

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/kylix/kylix/chunkstore"
)

// Group cuts chunks into the member lists of stripes of at most k chunks:
// each distinct chunk once, longest first (ties by id), k at a time. A
// stripe's parity is as long as its longest member, so members of near
// lengths waste the least: tensor-aware chunking makes most chunks of a
// model exactly 4 MiB, and their tails and small tensors end up in
// stripes of their own (docs/design/erasure.md, "Layout"). The result is
// the same on every member for the same set of chunks; only the last
// stripe may be short.
func Group(chunks []chunkstore.ChunkRef, k int) [][]chunkstore.ChunkRef {
	if k < 1 {
		return nil
	}
	cs := slices.Clone(chunks)
	slices.SortFunc(cs, func(a, b chunkstore.ChunkRef) int {
		if c := cmp.Compare(b.Len, a.Len); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
	cs = slices.CompactFunc(cs, func(a, b chunkstore.ChunkRef) bool { return a.ID == b.ID })
	var out [][]chunkstore.ChunkRef
	for len(cs) > 0 {
		n := min(k, len(cs))
		out = append(out, cs[:n:n])
		cs = cs[n:]
	}
	return out
}

// GroupRaw returns the logical bytes of groups (each chunk once) and the
// raw bytes stored once they are coded with m parity shards each: the
// overhead of coding them is raw/logical.
func GroupRaw(groups [][]chunkstore.ChunkRef, m int) (logical, raw int64) {
	for _, g := range groups {
		var longest uint32
		for _, c := range g {
			logical += int64(c.Len)
			longest = max(longest, c.Len)
		}
		raw += int64(m) * int64(longest)
	}
	return logical, logical + raw
}
