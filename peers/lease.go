package peers

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/serf/serf"
)

// GC leases (docs/design/gc.md, "Leases: imports and conversions longer
// than the grace"). A member that pushes chunks or stores shards on other
// members before its namespace names them (an import's PushStream, a
// conversion to or from the cold tier) holds a lease while it runs: its
// start, announced in the gcl tag. Every member watches the tags and gives
// its store a chunkstore.ReceivedHold: GC keeps the chunks received after
// the oldest lease it saw start, while that lease runs and for
// chunkstore.DefaultReceivedGrace after it ends (the namespace merge that names
// them follows its end), instead of for the grace after each chunk
// arrived, which an import of more than an hour outlived.

// tagLease carries the start (Unix nanoseconds, the member's clock) of the
// oldest push or conversion running on the member; absent when none runs.
const tagLease = "gcl"

// leaseSkew is taken off a lease's start before comparing it with the
// times chunks were received here: the members' clocks differ.
const leaseSkew = 10 * time.Minute

// leases is a member's own leases and those it saw in others' tags.
type leases struct {
	mu     sync.Mutex
	own    map[uint64]int64 // running here: id -> start (Unix nanoseconds)
	nextID uint64
	// seen: members' leases as observed; an ended one stays for the
	// grace after it was seen to end.
	seen []seenLease
	// watched: the member has joined and looked at the tags (before that
	// a GC keeps every received chunk: ReceivedHold's known).
	watched bool
}

// seenLease is a member's lease: since (its tag), first (this member's
// clock when it first saw the tag), ended (this member's clock when the
// tag changed or went, or the member stopped being alive; zero while it
// runs).
type seenLease struct {
	member string
	since  int64
	first  time.Time
	ended  time.Time
}

// start is when the lease holds from, in this member's clock: its
// announced start, but no earlier than the grace before it was first seen
// here, so that a member's clock far behind, or a tag naming a start long
// past, cannot hold every chunk received since then.
func (l seenLease) start(grace time.Duration) int64 {
	return max(l.since, l.first.Add(-grace).UnixNano())
}

// holdGC starts a lease here and returns its end. The tag changes only
// when the oldest running lease does.
func (n *Node) holdGC() (release func()) {
	now := n.s.Now().UnixNano()
	n.lease.mu.Lock()
	if n.lease.own == nil {
		n.lease.own = map[uint64]int64{}
	}
	n.lease.nextID++
	id := n.lease.nextID
	n.lease.own[id] = now
	n.lease.mu.Unlock()
	n.announceLease()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.lease.mu.Lock()
			delete(n.lease.own, id)
			n.lease.mu.Unlock()
			n.announceLease()
		})
	}
}

// ownLease returns the start of the oldest lease running here, 0 if none.
func (n *Node) ownLease() int64 {
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	var oldest int64
	for _, t := range n.lease.own {
		if oldest == 0 || t < oldest {
			oldest = t
		}
	}
	return oldest
}

// announceLease puts the oldest running lease in this member's tags.
func (n *Node) announceLease() {
	v := ""
	if t := n.ownLease(); t != 0 {
		v = strconv.FormatInt(t, 10)
	}
	if err := n.setTag(tagLease, v); err != nil {
		n.log.Warn("cluster: could not announce the gc lease; members keep received chunks for the grace only", "err", err)
	}
}

// watchLeases records the leases in the members' tags (called with every
// namespace pass, at least every nsRetry): a lease whose tag changed or
// went, or whose member is no longer alive, is marked ended now.
func (n *Node) watchLeases() {
	now := n.s.Now()
	grace := n.s.ReceivedGrace()
	cur := map[string]int64{}
	for _, m := range n.serf.Members() {
		if m.Name == n.self || m.Status != serf.StatusAlive {
			continue
		}
		if t, err := strconv.ParseInt(m.Tags[tagLease], 10, 64); err == nil && t > 0 {
			cur[m.Name] = t
		}
	}
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	running := map[string]bool{}
	n.lease.seen = slices.DeleteFunc(n.lease.seen, func(l seenLease) bool {
		return !l.ended.IsZero() && now.Sub(l.ended) > grace
	})
	for i := range n.lease.seen {
		l := &n.lease.seen[i]
		if !l.ended.IsZero() {
			continue
		}
		if cur[l.member] == l.since {
			running[l.member] = true
		} else {
			l.ended = now
		}
	}
	for name, t := range cur {
		if !running[name] {
			n.lease.seen = append(n.lease.seen, seenLease{member: name, since: t, first: now})
		}
	}
}

// receivedHold is the store's chunkstore.ReceivedHold: the start, less
// leaseSkew, of the oldest lease running on a member or ended within the
// grace; this member's own leases count too (its conversion stores
// shards on itself as received).
func (n *Node) receivedHold() (int64, bool) {
	now := n.s.Now()
	own := n.ownLease()
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	if !n.lease.watched {
		return 0, false
	}
	oldest := own
	grace := n.s.ReceivedGrace()
	for _, l := range n.lease.seen {
		if !l.ended.IsZero() && now.Sub(l.ended) > grace {
			continue
		}
		if st := l.start(grace); oldest == 0 || st < oldest {
			oldest = st
		}
	}
	if oldest == 0 {
		return 0, true
	}
	return oldest - int64(leaseSkew), true
}
