package main

import (
	"context"
	"fmt"
	"io"

	"github.com/kylix/kylix/peers"
)

// Cluster parts of import, stat and df (docs/design/peers.md, "Push" and
// "Replication"): nothing happens without a running cluster member.

// clusterReplication is the replication of path ("" the namespace) as the
// alive members answer, or nil outside a cluster (or outside a node).
func clusterReplication(ctx context.Context, e *env, path string) (*peers.Replication, error) {
	return e.node.Replication(ctx, path)
}

// printReplication writes the lines stat and df show for a cluster.
func printReplication(w io.Writer, r *peers.Replication) {
	fmt.Fprintf(w, "replicas: %d wanted, %d alive members; fewest copies of a chunk: %d\n", r.Replicas, r.Alive, r.MinCopies)
	fmt.Fprintf(w, "local:    %s of %s (distinct chunks) on this node\n", human(r.LocalBytes), human(r.Bytes))
	fmt.Fprintf(w, "under-replicated: %d chunks, %d bytes (%s); held by no alive member: %d chunks (%s)\n",
		r.UnderChunks, r.UnderBytes, human(r.UnderBytes), r.UnheldChunks, human(r.UnheldBytes))
	fmt.Fprintf(w, "tiers:    %-6s %12s %12s %16s %9s\n", "", "logical", "raw here", "raw in cluster", "overhead")
	for _, t := range r.Tiers {
		if t.Chunks == 0 {
			continue
		}
		fmt.Fprintf(w, "          %-6s %12s %12s %16s %8.2fx\n", t.Tier, human(t.Logical), human(t.RawHere), human(t.RawCluster), ratio(t.RawCluster, t.Logical))
	}
	if r.Stripes > 0 {
		fmt.Fprintf(w, "cold:     %d chunks (%s) coded in %d stripes, one copy each wanted; %s of parity held; stripes missing shards: %d (past repair: %d)\n",
			r.ColdChunks, human(r.ColdBytes), r.Stripes, human(r.ParityBytes), r.DegradedStripes, r.UnreadableStripes)
	}
	for _, h := range r.Holders {
		fmt.Fprintf(w, "  held by %s: %d chunks (%s)\n", h.Member, h.Chunks, human(h.Bytes))
	}
	for _, u := range r.Unanswered {
		fmt.Fprintf(w, "  not answering (counted as holding nothing): %s\n", u)
	}
}
