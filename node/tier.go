package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

// Tiers of a cluster's data (docs/design/erasure.md, "Tiers"): kylix tier
// cold|warm PATH, and kylix tier shards, the cluster's rules of k by path.

// TierRequest is the request of OpTier: To is "cold" or "warm".
type TierRequest struct {
	Path string `json:"path"`
	To   string `json:"to"`
	// DataShards is k of the stripes (cold only; 0: the cluster's
	// default, peers' StripeShape).
	DataShards int `json:"data_shards,omitempty"`
}

// TierReply is the reply of OpTier.
type TierReply struct {
	Path string `json:"path"`
	To   string `json:"to"`
	peers.TierResult
}

// Tier moves the files at and below path to the cold tier (erasure-coded
// stripes) or back to the warm one (replicas), blocking until done, with
// progress. It needs a cluster: a single node has no members to code
// across.
func (n *Node) Tier(ctx context.Context, r TierRequest, progress Progress) (TierReply, error) {
	out := TierReply{Path: r.Path, To: r.To}
	if n.peers == nil {
		return out, n.errNotInCluster(": tiers code data across the members")
	}
	prog := func(done, total int64) {
		if progress != nil {
			progress("coding", done, total)
		}
	}
	var err error
	switch r.To {
	case "cold":
		out.TierResult, err = n.peers.MakeColdK(ctx, r.Path, r.DataShards, prog)
	case "warm":
		if r.DataShards != 0 {
			return out, fmt.Errorf("bad request: data shards are for tier cold")
		}
		prog = func(done, total int64) {
			if progress != nil {
				progress("replicating", done, total)
			}
		}
		out.TierResult, err = n.peers.MakeWarm(ctx, r.Path, prog)
	default:
		return out, fmt.Errorf("bad request: tier %q: want cold or warm", r.To)
	}
	if err != nil {
		return out, fmt.Errorf("tier %s %s: %w", r.To, r.Path, err)
	}
	n.log.Info("tier: moved", "path", r.Path, "to", r.To, "files", out.Files, "stripes", out.Stripes, "shape", out.Shape, "coded_bytes", out.Logical, "parity_bytes", out.Parity)
	return out, nil
}

// TierShardsRequest is the request of OpTierShards: with Path and K, set
// the cluster's rule of k at Path; with Path and Clear, remove it; with
// neither, list the rules.
type TierShardsRequest struct {
	Path  string `json:"path,omitempty"`
	K     int    `json:"k,omitempty"`
	Clear bool   `json:"clear,omitempty"`
}

// TierShardsReply is the reply of OpTierShards.
type TierShardsReply struct {
	// Path, K: the rule set or cleared ("" when listing).
	Path string `json:"path,omitempty"`
	K    int    `json:"k,omitempty"`
	// Cleared: a rule was there and is removed (Clear).
	Cleared bool `json:"cleared,omitempty"`
	// Missing: nothing is at Path yet (the rule waits for files put
	// there).
	Missing bool `json:"missing,omitempty"`
	// Note: why the members alive now cannot code the files under Path
	// in stripes of K (set; they stay warm until they can).
	Note string `json:"note,omitempty"`
	// Default is the shape of files under no rule with the members
	// alive now ("" with Note when they allow none).
	Default string `json:"default,omitempty"`
	// Rules are the rules of k by path this member applies, after the
	// change.
	Rules []peers.ShardRule `json:"rules"`
}

// TierShards sets, clears or lists the cluster's rules of k by path
// (kylix tier shards), kept in the namespace so that every member's
// conversions apply them once the merge brought them there.
func (n *Node) TierShards(r TierShardsRequest) (TierShardsReply, error) {
	out := TierShardsReply{}
	if n.peers == nil {
		return out, n.errNotInCluster(": k of the cold tier's stripes is a rule of the cluster's members")
	}
	switch {
	case r.Clear && r.K != 0:
		return out, fmt.Errorf("bad request: set K or clear, not both")
	case r.Clear:
		cleared, err := n.peers.ClearColdShards(r.Path)
		if err != nil {
			return out, fmt.Errorf("clearing the rule of k at %s: %w", r.Path, err)
		}
		out.Path, out.Cleared = displayPath(r.Path), cleared
		n.log.Info("tier: rule of k cleared", "path", r.Path, "was_set", cleared)
	case r.K != 0:
		if err := n.peers.SetColdShards(r.Path, r.K); err != nil {
			return out, fmt.Errorf("setting k at %s: %w", r.Path, err)
		}
		out.Path, out.K = displayPath(r.Path), r.K
		if _, err := n.s.Lookup(r.Path); errors.Is(err, chunkstore.ErrNotFound) {
			out.Missing = true
		}
		if _, err := n.peers.StripeShapeK(r.K); err != nil {
			out.Note = err.Error()
		}
		n.log.Info("tier: rule of k set", "path", r.Path, "k", r.K)
	case r.Path != "":
		return out, fmt.Errorf("bad request: a path needs K or clear")
	}
	if sh, err := n.peers.StripeShape(); err == nil {
		out.Default = sh.String()
	}
	var err error
	out.Rules, err = n.peers.ShardRules()
	return out, err
}

// displayPath is namespace path p as the rules list it ("/models/a",
// "/" for the whole namespace).
func displayPath(p string) string {
	clean, err := chunkstore.CleanPath(p)
	if err != nil {
		return p
	}
	return "/" + clean
}

// coldEvery is how often serve --cold-after looks for idle files: a
// quarter of the idle time, between a second and an hour.
func coldEvery(idle time.Duration) time.Duration {
	return min(max(idle/4, time.Second), time.Hour)
}

// coldLoop moves the files nobody read for idle to the cold tier until
// ctx ends (serve --cold-after). A cluster too small for stripes is said
// once, and looked at again each time.
func (n *Node) coldLoop(ctx context.Context, idle time.Duration) {
	t := time.NewTicker(coldEvery(idle))
	defer t.Stop()
	saidSmall := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := n.peers.MakeColdIdle(ctx, idle)
		switch {
		case errors.Is(err, peers.ErrClusterTooSmall):
			if !saidSmall {
				n.log.Warn("cold-after: the cluster is too small for erasure coding; files stay replicated", "err", err)
				saidSmall = true
			}
		case err != nil && ctx.Err() == nil:
			n.log.Warn("cold-after: moving idle files to the cold tier failed; will retry", "err", err)
		case err == nil && res.Files > 0:
			saidSmall = false
			n.log.Info("cold-after: moved idle files to the cold tier", "files", res.Files, "stripes", res.Stripes, "shape", res.Shape, "coded_bytes", res.Logical, "parity_bytes", res.Parity, "changed", len(res.Changed))
		}
	}
}
