package peers

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// Stripe shape and placement of erasure-coded (cold) data
// (docs/design/erasure.md, "Shape" and "Placement"); the codec is
// peers/stripe.

// Stripe parameters: m parity shards, at most MaxStripeData data shards,
// and a stripe's overhead (k+m)/k strictly below MaxStripeOverhead (three
// full replicas cost 3.0, two 2.0). With m = 2 that needs k >= 5, so
// MinStripeWidth members.
const (
	StripeParity      = 2
	MaxStripeData     = 10
	MaxStripeOverhead = 1.5
	MinStripeWidth    = 7
)

// ErrClusterTooSmall: the cluster cannot hold a stripe below
// MaxStripeOverhead; its data stays in replicas. Returned as a
// *ClusterTooSmallError, which says why.
var ErrClusterTooSmall = errors.New("cluster too small for erasure coding")

// ClusterTooSmallError says how far a cluster is from a stripe below
// MaxStripeOverhead.
type ClusterTooSmallError struct {
	Members int // members that store chunks (readers excluded)
	Zones   int // distinct zones among them (an untagged member counts as one)
	Width   int // the widest stripe they hold: at most StripeParity shards in one zone
}

func (e *ClusterTooSmallError) Error() string {
	need := fmt.Sprintf("a stripe of k+%d shards with (k+%d)/k below %.1f needs k >= %d, so %d members (at most %d of them in one zone)",
		StripeParity, StripeParity, MaxStripeOverhead, MinStripeWidth-StripeParity, MinStripeWidth, StripeParity)
	return fmt.Sprintf("cluster too small for erasure coding: %s; %d members in %d zones hold a stripe of at most %d shards: keeping replicas",
		need, e.Members, e.Zones, e.Width)
}

// Unwrap makes errors.Is(err, ErrClusterTooSmall) hold.
func (e *ClusterTooSmallError) Unwrap() error { return ErrClusterTooSmall }

// StripeShape is k data and m parity shards.
type StripeShape struct{ K, M int }

// Overhead is (k+m)/k, the raw bytes per logical byte of a full stripe of
// equal chunks.
func (s StripeShape) Overhead() float64 { return float64(s.K+s.M) / float64(s.K) }

func (s StripeShape) String() string { return fmt.Sprintf("%d+%d", s.K, s.M) }

// stripeWidth is the most shards members hold, one per member, with at
// most m in one zone (so losing a whole zone loses no more shards than the
// stripe survives), and the number of zones.
func stripeWidth(members []peer, m int) (width, zones int) {
	perZone := map[string]int{}
	for _, p := range members {
		if p.zone == "" {
			width++
			zones++
			continue
		}
		if perZone[p.zone] == 0 {
			zones++
		}
		if perZone[p.zone] < m {
			perZone[p.zone]++
			width++
		}
	}
	return width, zones
}

// stripeShapeFor is the default stripe over members: m = StripeParity and
// the widest k up to MaxStripeData that stripeWidth allows; a
// *ClusterTooSmallError when that k does not bring the overhead below
// MaxStripeOverhead.
func stripeShapeFor(members []peer) (StripeShape, error) {
	ss := storers(members)
	width, zones := stripeWidth(ss, StripeParity)
	sh := StripeShape{K: min(MaxStripeData, width-StripeParity), M: StripeParity}
	if sh.K < 1 || sh.Overhead() >= MaxStripeOverhead {
		return StripeShape{}, &ClusterTooSmallError{Members: len(ss), Zones: zones, Width: width}
	}
	return sh, nil
}

// StripeShape is the default stripe over the members alive now (readers
// excluded): see stripeShapeFor.
func (n *Node) StripeShape() (StripeShape, error) { return stripeShapeFor(n.members()) }

// shapeOf is the shape of stripes of k data shards, refused when they
// would cost 1.5x or more or k is past MaxStripeData, whatever the cluster.
func shapeOf(k int) (StripeShape, error) {
	sh := StripeShape{K: k, M: StripeParity}
	if k < 1 || k > MaxStripeData || sh.Overhead() >= MaxStripeOverhead {
		return StripeShape{}, fmt.Errorf("stripes of %s cost %.2fx: want %d to %d data shards with %d parity, below %.1fx", sh, sh.Overhead(),
			MinStripeWidth-StripeParity, MaxStripeData, StripeParity, MaxStripeOverhead)
	}
	return sh, nil
}

// StripeShapeK is the stripe of k data shards and StripeParity parity
// shards, if its overhead is below MaxStripeOverhead, k is at most
// MaxStripeData and the members alive now hold it; k = 0 is StripeShape.
func (n *Node) StripeShapeK(k int) (StripeShape, error) {
	if k == 0 {
		return n.StripeShape()
	}
	sh, err := shapeOf(k)
	if err != nil {
		return StripeShape{}, err
	}
	ss := storers(n.members())
	if width, zones := stripeWidth(ss, StripeParity); width < sh.K+sh.M {
		return StripeShape{}, fmt.Errorf("stripes of %s need %d members (at most %d in one zone): %w", sh, sh.K+sh.M, StripeParity,
			&ClusterTooSmallError{Members: len(ss), Zones: zones, Width: width})
	}
	return sh, nil
}

// stripeHolders returns the k+m members that hold the shards of stripe
// id, shard i's home at index i. The set is the first members in
// rendezvous order for the stripe's id (rank, the order replicas are
// placed by), skipping a member whose zone already has m of them, so that
// losing a zone loses no more shards than the stripe survives. Within the
// set, shards are dealt by rendezvous too (assignShards), so a member
// leaving moves its own shard and one or two more on average, not every
// shard after its position as dealing them in set order would
// (docs/design/erasure.md, "Placement and repair of shards"). Fewer
// members than that is a *ClusterTooSmallError.
func stripeHolders(id chunkstore.ID, members []peer, sh StripeShape) ([]peer, error) {
	ss := storers(members)
	width, zones := stripeWidth(ss, sh.M)
	if sh.K < 1 || sh.M < 1 || width < sh.K+sh.M {
		return nil, &ClusterTooSmallError{Members: len(ss), Zones: zones, Width: width}
	}
	set := make([]peer, 0, sh.K+sh.M)
	perZone := map[string]int{}
	for _, p := range rank(id, ss) {
		if len(set) == sh.K+sh.M {
			break
		}
		if p.zone != "" && perZone[p.zone] >= sh.M {
			continue
		}
		if p.zone != "" {
			perZone[p.zone]++
		}
		set = append(set, p)
	}
	return assignShards(id, set), nil
}

// assignShards deals the shards of stripe id to the members of its set
// (in rank order): each member in turn takes, of the shards not taken
// yet, the one it scores highest (a hash of the stripe, the member and
// the shard's index). The set changing by one member (X leaves, Y enters)
// moves X's shard, and another only where a member after X prefers a
// shard freed before it: 2.4 shards a change on average for stripes 12
// wide, where dealing the shards in set order moved every shard after X's
// position, 5.3 to 6.5 (TestStripeHolders). Only a record of where each
// shard is would move X's alone (erasure.md, "Not built yet").
func assignShards(id chunkstore.ID, set []peer) []peer {
	base := make([]uint64, len(set))
	for j, p := range set {
		h := blake3.New()
		h.Write([]byte("kylix shard homes\x00"))
		h.Write(id[:])
		h.Write([]byte(p.name))
		var sum [32]byte
		h.Sum(sum[:0])
		base[j] = binary.BigEndian.Uint64(sum[:8])
	}
	// Members in set order (rank) each take, of the shards not taken
	// yet, the one they score highest.
	out := make([]peer, len(set))
	taken := make([]bool, len(set))
	for j, p := range set {
		best, bestScore := -1, uint64(0)
		for i := range set {
			if taken[i] {
				continue
			}
			if sc := mix64(base[j] ^ (uint64(i+1) * 0x9e3779b97f4a7c15)); best < 0 || sc > bestScore {
				best, bestScore = i, sc
			}
		}
		taken[best] = true
		out[best] = p
	}
	return out
}

// mix64 is splitmix64's finalizer: a bijection of 64 bits that spreads
// every input bit over the output.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
