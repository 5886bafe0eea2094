package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "tier", summary: "move a path to the cold tier (erasure-coded across the cluster) or back to warm (replicas)", run: runTier})
}

func runTier(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "tier", "[--data DIR] [--json] [--data-shards K] cold|warm PATH", `
Moves the files at and below the namespace path PATH between tiers, on the
cluster the node serving --data belongs to (docs/design/erasure.md), and
returns when it is done, with a progress bar on a terminal:

  cold  codes the chunks into Reed-Solomon stripes of k data and m = 2
        parity shards across k+m members (k: --data-shards, else the one
        serve --cold-shards PATH=K gives the file's path, else the widest
        up to 10 the cluster allows with (k+2)/k below 1.5; files of
        several k are coded apart), stores every shard on its member,
        then names the stripes in the files' manifests; each member then
        keeps one copy of each shard and drops the replicas beyond it. The
        files read as before, and keep reading with any 2 members gone.
        The chunks are grouped by length; the last, short stripe costs
        more than (k+2)/k, never more than the 3 replicas that would
        survive as much.
  warm  stores each chunk on its replica owners again (--replicas of
        serve), then removes the stripes from the manifests; their parity
        is garbage (kylix gc takes it on each member, an hour after it
        was received).

Files under a pinned path never move (reported). A file written during the
move is left as it was (reported: run it again). A cluster too small for a
stripe below 1.5x (7 members, at most 2 in one zone) says so and changes
nothing (kylix doctor and kylix peers say which shape the cluster allows).
serve --cold-after DURATION moves the files nobody read for that long by
itself. Fails when no node runs, or when it was started without --listen.`).withJSON()
	k := f.Int("data-shards", 0, "cold: stripes of K data shards and 2 parity for every file (5 to 10, and at most the members less 2; 0: the node's --cold-shards for each file's path, else the widest the cluster allows). Narrower stripes cost more ((K+2)/K) and leave members to repair onto")
	if err := f.parse(args, 2, 2); err != nil {
		return err
	}
	to := f.Arg(0)
	if to != "cold" && to != "warm" {
		fmt.Fprintf(e.stderr, "kylix tier: the tier is cold or warm, not %q (kylix tier --help)\n", to)
		return errUsage
	}
	if *k != 0 && to != "cold" {
		fmt.Fprintf(e.stderr, "kylix tier: --data-shards is for tier cold (kylix tier --help)\n")
		return errUsage
	}
	var out node.TierReply
	if err := f.callProgress(ctx, node.OpTier, node.TierRequest{Path: f.Arg(1), To: to, DataShards: *k}, &out); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s (start one with kylix serve --listen)", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	w := e.stdout
	if to == "cold" {
		fmt.Fprintf(w, "cold %s: %d files; coded %s in %d stripes of %s (%d chunks), %s of parity stored (%.2fx)\n",
			out.Path, out.Files, human(out.Logical), out.Stripes, out.Shape, out.Chunks, human(out.Parity), ratio(out.Logical+out.Parity, out.Logical))
	} else {
		fmt.Fprintf(w, "warm %s: %d files; stored %d chunks (%s) on their replica owners\n", out.Path, out.Files, out.Pushed, human(out.PushedBytes))
	}
	if len(out.Pinned) > 0 {
		fmt.Fprintf(w, "left alone, pinned: %s\n", strings.Join(out.Pinned, ", "))
	}
	if len(out.Changed) > 0 {
		fmt.Fprintf(w, "left alone, written during the move (run it again): %s\n", strings.Join(out.Changed, ", "))
	}
	return nil
}

// ratio is a/b, 0 when b is.
func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
