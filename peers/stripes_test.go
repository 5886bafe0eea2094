package peers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// cluster makes members: n untagged, then for each zone size a zone of
// that many, then readers.
func cluster(untagged int, zones []int, readers int) []peer {
	var ms []peer
	for i := range untagged {
		ms = append(ms, peer{name: fmt.Sprintf("u%d", i), capacity: 1 << 40})
	}
	for z, n := range zones {
		for i := range n {
			ms = append(ms, peer{name: fmt.Sprintf("z%d-%d", z, i), zone: fmt.Sprintf("zone%d", z), capacity: 1 << 40})
		}
	}
	for i := range readers {
		ms = append(ms, peer{name: fmt.Sprintf("r%d", i), capacity: 1 << 40, reader: true})
	}
	return ms
}

// TestStripeShape: m = 2 and the widest k up to 10 the members allow,
// counting at most 2 members of one zone and no reader; below 7 such
// members (k = 4 would cost 1.5x) the typed error says why and that
// replicas are kept.
func TestStripeShape(t *testing.T) {
	cases := []struct {
		name    string
		ms      []peer
		want    StripeShape
		members int // for the error
	}{
		{"7 members", cluster(7, nil, 0), StripeShape{5, 2}, 0},
		{"8 members", cluster(8, nil, 0), StripeShape{6, 2}, 0},
		{"12 members", cluster(12, nil, 0), StripeShape{10, 2}, 0},
		{"40 members", cluster(40, nil, 0), StripeShape{10, 2}, 0},
		{"7 and a reader", cluster(7, nil, 1), StripeShape{5, 2}, 0},
		{"4 zones of 3", cluster(0, []int{3, 3, 3, 3}, 0), StripeShape{6, 2}, 0},
		{"one big zone and 5 alone", cluster(5, []int{9}, 0), StripeShape{5, 2}, 0},
		{"6 members", cluster(6, nil, 0), StripeShape{}, 6},
		{"6 and 2 readers", cluster(6, nil, 2), StripeShape{}, 6},
		{"3 zones of 4", cluster(0, []int{4, 4, 4}, 0), StripeShape{}, 12},
		{"one zone of 20", cluster(0, []int{20}, 0), StripeShape{}, 20},
		{"alone", cluster(1, nil, 0), StripeShape{}, 1},
	}
	for _, c := range cases {
		sh, err := stripeShapeFor(c.ms)
		if c.members == 0 {
			require.NoError(t, err, c.name)
			require.Equal(t, c.want, sh, c.name)
			require.Less(t, sh.Overhead(), MaxStripeOverhead, c.name)
			continue
		}
		require.ErrorIs(t, err, ErrClusterTooSmall, c.name)
		var tooSmall *ClusterTooSmallError
		require.True(t, errors.As(err, &tooSmall), c.name)
		require.Equal(t, c.members, tooSmall.Members, c.name)
		require.Less(t, tooSmall.Width, MinStripeWidth, c.name)
		require.Contains(t, err.Error(), "keeping replicas", c.name)
		require.Contains(t, err.Error(), "needs k >= 5, so 7 members", c.name)
	}
	_, err := stripeShapeFor(cluster(0, []int{4, 4, 4}, 0))
	require.EqualError(t, err, "cluster too small for erasure coding: a stripe of k+2 shards with (k+2)/k below 1.5 needs k >= 5, so 7 members (at most 2 of them in one zone); 12 members in 3 zones hold a stripe of at most 6 shards: keeping replicas")
}

// TestStripeHolders: the k+m holders of a stripe are distinct members,
// never a reader, at most m in one zone; the stripe's first member in
// rendezvous order (rank, as replicas) is one; the same whatever order
// the members are listed in. Rendezvous stability of the set: a member
// holding none of a stripe's shards leaving changes nothing; a holder
// leaving is replaced by one member (two only where the replacement fills
// its zone); a member joining enters about (k+m)/N of the sets (more
// where zones are full and it has none). Stability of the shards' homes:
// a holder leaving moves under 3 shards of the stripe on average (its
// own, and those assignShards deals anew), against every shard after its
// position when dealt in set order; a join about as few.
func TestStripeHolders(t *testing.T) {
	for _, c := range []struct {
		name string
		ms   []peer
	}{
		{"zones of 6, 4, 3 and 7 alone", cluster(7, []int{6, 4, 3}, 1)},
		{"20 alone", cluster(20, nil, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ms := c.ms
			sh, err := stripeShapeFor(ms)
			require.NoError(t, err)
			require.Equal(t, StripeShape{10, 2}, sh)
			rng := rand.New(rand.NewPCG(1, 2))
			const stripes = 300
			var idleChanged, extra, joined, movedLeave, movedLeaveSetOrder, movedJoin int
			moved := func(before, after []peer) (n int) {
				for i := range before {
					if before[i].name != after[i].name {
						n++
					}
				}
				return n
			}
			for i := range stripes {
				id := chunkstore.Sum([]byte(fmt.Sprint("stripe", i)))
				hs, err := stripeHolders(id, ms, sh)
				require.NoError(t, err)
				require.Len(t, hs, 12)
				names := map[string]bool{}
				perZone := map[string]int{}
				for _, p := range hs {
					require.False(t, p.reader)
					require.False(t, names[p.name], "member %s holds two shards", p.name)
					names[p.name] = true
					if p.zone != "" {
						perZone[p.zone]++
					}
				}
				for z, n := range perZone {
					require.LessOrEqual(t, n, 2, "zone %s", z)
				}
				require.True(t, slices.ContainsFunc(hs, func(p peer) bool { return p.name == rank(id, storers(ms))[0].name }),
					"the stripe's first member in rendezvous order holds none of its shards")

				shuffled := slices.Clone(ms)
				rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
				again, err := stripeHolders(id, shuffled, sh)
				require.NoError(t, err)
				require.Equal(t, hs, again)

				without := func(name string) []peer {
					return slices.DeleteFunc(slices.Clone(ms), func(p peer) bool { return p.name == name })
				}
				// added: members in after and not in hs.
				added := func(after []peer) (n int) {
					for _, p := range after {
						if !names[p.name] {
							n++
						}
					}
					return n
				}
				for _, p := range storers(ms) {
					if !names[p.name] {
						after, err := stripeHolders(id, without(p.name), sh)
						require.NoError(t, err)
						if !slices.Equal(hs, after) {
							idleChanged++
						}
						break
					}
				}
				leaver := hs[rng.IntN(len(hs))]
				after, err := stripeHolders(id, without(leaver.name), sh)
				require.NoError(t, err)
				n := added(after)
				require.GreaterOrEqual(t, n, 1)
				extra += n - 1
				// Shards whose home changed: the leaver's, and few others
				// (dealt in set order, every shard after its position).
				movedLeave += moved(hs, after)
				movedLeaveSetOrder += moved(rank(id, hs), rank(id, after)) // the set in rank order
				after, err = stripeHolders(id, append(slices.Clone(ms), peer{name: "new", capacity: 1 << 40}), sh)
				require.NoError(t, err)
				if slices.ContainsFunc(after, func(p peer) bool { return p.name == "new" }) {
					joined++
					require.Equal(t, 1, added(after))
					movedJoin += moved(hs, after)
				}
			}
			require.Zero(t, idleChanged, "sets changed when a member holding none of their shards left")
			require.LessOrEqual(t, extra, stripes/5, "a holder's leaving replaced more than it")
			n := len(storers(ms)) + 1
			expect := stripes * 12 / n
			require.InDelta(t, expect, joined, float64(expect)/2, "a join entered %d sets of %d, expected about %d", joined, stripes, expect)
			t.Logf("%d stripes: a holder leaving brought %d extra changes; a join entered %d sets (expected about %d)", stripes, extra, joined, expect)
			t.Logf("shards moved: %.2f per stripe a holder left (dealt in set order: %.2f), %.2f per set a join entered",
				float64(movedLeave)/stripes, float64(movedLeaveSetOrder)/stripes, float64(movedJoin)/float64(max(joined, 1)))
			require.Less(t, float64(movedLeave)/stripes, 3.0, "a holder leaving moved too many shards")
			require.Less(t, float64(movedLeave), 0.6*float64(movedLeaveSetOrder), "no better than dealing shards in set order")
			require.Less(t, float64(movedJoin)/float64(max(joined, 1)), 3.0, "a join moved too many shards")
		})
	}

	_, err := stripeHolders(chunkstore.Sum([]byte("x")), cluster(7, nil, 0), StripeShape{6, 2})
	require.ErrorIs(t, err, ErrClusterTooSmall)
	_, err = stripeHolders(chunkstore.Sum([]byte("x")), cluster(0, []int{3, 3, 3}, 0), StripeShape{5, 2})
	require.ErrorIs(t, err, ErrClusterTooSmall, "9 members in 3 zones of at most 2 shards each hold 6")
}
