package peers

import (
	"errors"
	"fmt"

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

// StripeShapeK is the stripe of k data shards and StripeParity parity
// shards, if its overhead is below MaxStripeOverhead, k is at most
// MaxStripeData and the members alive now hold it; k = 0 is StripeShape.
func (n *Node) StripeShapeK(k int) (StripeShape, error) {
	if k == 0 {
		return n.StripeShape()
	}
	sh := StripeShape{K: k, M: StripeParity}
	if k < 1 || k > MaxStripeData || sh.Overhead() >= MaxStripeOverhead {
		return StripeShape{}, fmt.Errorf("stripes of %s cost %.2fx: want %d to %d data shards with %d parity, below %.1fx", sh, sh.Overhead(),
			MinStripeWidth-StripeParity, MaxStripeData, StripeParity, MaxStripeOverhead)
	}
	ss := storers(n.members())
	if width, zones := stripeWidth(ss, StripeParity); width < sh.K+sh.M {
		return StripeShape{}, fmt.Errorf("stripes of %s need %d members (at most %d in one zone): %w", sh, sh.K+sh.M, StripeParity,
			&ClusterTooSmallError{Members: len(ss), Zones: zones, Width: width})
	}
	return sh, nil
}

// stripeHolders returns the k+m members that hold the shards of stripe
// id: the first members in rendezvous order for the stripe's id (rank, the
// order replicas are placed by), skipping a member whose zone already has
// m of them, so that losing a zone loses no more shards than the stripe
// survives. Shard i's home is the i-th (homes, stripestore.go): a member
// leaving shifts the homes of the shards after its position, so a repair
// moves up to k+m-1 shards of a stripe it was in (docs/design/erasure.md,
// "Placement and repair of shards"). Fewer members than that is a
// *ClusterTooSmallError.
func stripeHolders(id chunkstore.ID, members []peer, sh StripeShape) ([]peer, error) {
	ss := storers(members)
	width, zones := stripeWidth(ss, sh.M)
	if sh.K < 1 || sh.M < 1 || width < sh.K+sh.M {
		return nil, &ClusterTooSmallError{Members: len(ss), Zones: zones, Width: width}
	}
	out := make([]peer, 0, sh.K+sh.M)
	perZone := map[string]int{}
	for _, p := range rank(id, ss) {
		if len(out) == sh.K+sh.M {
			break
		}
		if p.zone != "" && perZone[p.zone] >= sh.M {
			continue
		}
		if p.zone != "" {
			perZone[p.zone]++
		}
		out = append(out, p)
	}
	return out, nil
}
