package kvstore

// Fair shares between namespaces (uids). The tiers are shared, and plain
// LRU let one uid that puts fast evict every other uid's blocks. So when a
// tier is full, a put of namespace ns makes room by this rule, the same
// for the host tier (slots) and the disk tier (files):
//
//   - ns's fair share is the tier's places over the namespaces holding
//     blocks there, ns counted;
//   - a namespace at or over its share makes room only by evicting its
//     own blocks (least recently used first);
//   - one under its share evicts first the blocks of namespaces over
//     theirs, then any, least recently used first.
//
// One namespace alone has the whole tier (the rule is then plain LRU);
// with several, a namespace that keeps using its blocks keeps at least its
// share of them however fast another puts. Blocks waiting for their disk
// write and blocks lent to a reader are never evicted, so a namespace
// whose own blocks are all such is refused (ErrFull) rather than taking
// another's (docs/design/kv.md, "Who may read whose blocks").

// nsCount counts blocks per namespace in one tier.
type nsCount map[uint32]int

func (c nsCount) add(ns uint32, d int) {
	if c[ns] += d; c[ns] <= 0 {
		delete(c, ns)
	}
}

// fair is ns's share of a tier of n places.
func (c nsCount) fair(n int, ns uint32) int {
	users := len(c)
	if c[ns] == 0 {
		users++
	}
	return max(1, n/users)
}

// victims returns, in the order they are tried, which blocks may be
// evicted to make room for one more of ns in a tier of n places. The
// counts are read as eviction goes.
func (c nsCount) victims(n int, ns uint32) []func(Key) bool {
	fair := c.fair(n, ns)
	if c[ns] >= fair {
		return []func(Key) bool{func(k Key) bool { return k.NS == ns }}
	}
	return []func(Key) bool{
		func(k Key) bool { return c[k.NS] > fair },
		func(Key) bool { return true },
	}
}
