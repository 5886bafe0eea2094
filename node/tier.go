package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kylix/kylix/peers"
)

// Tiers of a cluster's data (docs/design/erasure.md, "Tiers"): kylix tier
// cold|warm PATH.

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
