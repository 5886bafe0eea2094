package peers

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kylix/kylix/chunkstore"
)

// k per path for the whole cluster (docs/design/erasure.md, "Tiers"):
// kylix tier shards PATH K keeps a rule in the namespace itself
// (chunkstore.PolicyColdShards), which the merge spreads to every member
// like a file; a member's own serve --cold-shards PATH=K wins over it for
// the same path. A conversion without --data-shards applies the rule of
// the longest path at or above each file, across both (shardRules).

// parseShards parses K, the data shards of a stripe, and checks it is one
// the cold tier allows (shapeOf): the rule for serve --cold-shards and for
// the namespace's rules alike.
func parseShards(text string) (int, error) {
	k, err := strconv.Atoi(strings.TrimSpace(text))
	if err != nil {
		return 0, fmt.Errorf("k %q is not a number (the data shards of a stripe)", text)
	}
	if _, err := shapeOf(k); err != nil {
		return 0, err
	}
	return k, nil
}

// ShardRule is one rule of k by path, as this member applies them.
type ShardRule struct {
	Path string `json:"path"` // namespace path, "/" for the whole namespace
	K    int    `json:"k,omitempty"`
	// From: "cluster", kept in the namespace (kylix tier shards), or
	// "member", this member's serve --cold-shards.
	From string `json:"from"`
	// Overridden: a cluster rule that this member's --cold-shards
	// replaces for the same path (on this member only).
	Overridden bool `json:"overridden,omitempty"`
	// Error: a cluster rule whose K is not one allowed (a namespace
	// damaged or edited by hand): the files under it stay warm.
	Error string `json:"error,omitempty"`
}

// ShardRule's From.
const (
	RuleFromCluster = "cluster"
	RuleFromMember  = "member"
)

// shardRules is the policy of k a conversion applies: the namespace's
// rules with the member's own over them for the same path. bad holds the
// namespace's rules whose K is not allowed, by path (also in k, with 0, so
// that the longest path finds them).
type shardRules struct {
	k   ShardPolicy
	bad map[string]error
}

// mergeShardRules makes the policy of the namespace's rules (path: K as
// stored) and the member's own.
func mergeShardRules(cluster map[string]string, own ShardPolicy) shardRules {
	r := shardRules{k: ShardPolicy{}, bad: map[string]error{}}
	for p, text := range cluster {
		k, err := parseShards(text)
		if err != nil {
			r.bad[p] = fmt.Errorf("the cluster's rule for %s (kylix tier shards) is not one allowed: %w; set it again or clear it (kylix tier shards %s K, or --clear)",
				"/"+p, err, "/"+p)
		}
		r.k[p] = k
	}
	for p, k := range own {
		r.k[p] = k
		delete(r.bad, p)
	}
	return r
}

// forFile returns k for the file at namespace path p: that of the longest
// rule path at or above it, 0 (the cluster's default) when none is, and
// the error of that rule when its K is not allowed (the file stays warm:
// k is never guessed).
func (r shardRules) forFile(p string) (int, error) {
	key, ok := r.k.longest(p)
	if !ok {
		return 0, nil
	}
	if err := r.bad[key]; err != nil {
		return 0, err
	}
	return r.k[key], nil
}

// shardRules reads the namespace's rules and merges this member's own.
func (n *Node) shardRules() (shardRules, error) {
	cluster, err := n.s.PathPolicies(chunkstore.PolicyColdShards)
	if err != nil {
		return shardRules{}, fmt.Errorf("reading the cluster's rules of k by path: %w", err)
	}
	return mergeShardRules(cluster, n.cfg.ColdShards), nil
}

// SetColdShards keeps in the namespace the rule that the files at and
// below p are coded in stripes of k data shards, for every member that
// converts once the merge brought it there. k must be allowed (shapeOf);
// the members alive now need not hold it. p need not exist.
func (n *Node) SetColdShards(p string, k int) error {
	if _, err := shapeOf(k); err != nil {
		return err
	}
	return n.s.SetPathPolicy(chunkstore.PolicyColdShards, p, strconv.Itoa(k))
}

// ClearColdShards removes the namespace's rule at p and reports whether
// there was one. A member's own --cold-shards is not changed.
func (n *Node) ClearColdShards(p string) (bool, error) {
	return n.s.ClearPathPolicy(chunkstore.PolicyColdShards, p)
}

// ShardRules lists the rules of k by path this member applies: the
// cluster's (the namespace's) and its own (serve --cold-shards), by path.
func (n *Node) ShardRules() ([]ShardRule, error) {
	cluster, err := n.s.PathPolicies(chunkstore.PolicyColdShards)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's rules of k by path: %w", err)
	}
	r := mergeShardRules(cluster, nil)
	out := []ShardRule{}
	for p := range cluster {
		sr := ShardRule{Path: "/" + p, K: r.k[p], From: RuleFromCluster}
		if err := r.bad[p]; err != nil {
			sr.Error = err.Error()
		}
		_, sr.Overridden = n.cfg.ColdShards[p]
		out = append(out, sr)
	}
	for p, k := range n.cfg.ColdShards {
		out = append(out, ShardRule{Path: "/" + p, K: k, From: RuleFromMember})
	}
	slices.SortFunc(out, func(a, b ShardRule) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.From, b.From))
	})
	return out, nil
}
