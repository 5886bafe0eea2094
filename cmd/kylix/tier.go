package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kylix/kylix/node"
	"github.com/kylix/kylix/peers"
)

func init() {
	register(&command{name: "tier", summary: "move a path to the cold tier (erasure-coded across the cluster) or back to warm (replicas)", run: runTier})
}

func runTier(ctx context.Context, e *env, args []string) error {
	if i := tierWord(args); i >= 0 && args[i] == "shards" {
		return runTierShards(ctx, e, append(slices.Clone(args[:i]), args[i+1:]...))
	}
	f := newFlags(e, "tier", "[--data DIR] [--json] [--data-shards K] cold|warm PATH", `
Moves the files at and below the namespace path PATH between tiers, on the
cluster the node serving --data belongs to (docs/design/erasure.md), and
returns when it is done, with a progress bar on a terminal:

  cold  codes the chunks into Reed-Solomon stripes of k data and m = 2
        parity shards across k+m members (k: --data-shards, else the
        rule of k by path for the file (kylix tier shards --help), else
        the widest up to 10 the cluster allows with (k+2)/k below 1.5;
        files of several k are coded apart), stores every shard on its member,
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
itself. Fails when no node runs, or when it was started without --listen.

kylix tier shards [PATH K | PATH --clear] sets, clears or lists the
cluster's rules of k by path (kylix tier shards --help).`).withJSON()
	k := f.Int("data-shards", 0, "cold: stripes of K data shards and 2 parity for every file (5 to 10, and at most the members less 2; 0: the rule of k for each file's path (kylix tier shards), else the widest the cluster allows). Narrower stripes cost more ((K+2)/K) and leave members to repair onto")
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

// tierWord returns the index in args of kylix tier's first word (cold,
// warm, shards): the first argument that is neither a flag nor the value
// of a flag that takes one; -1 when there is none.
func tierWord(args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return i + 1
			}
			return -1
		case a == "--data" || a == "--data-shards":
			i++ // its value
		case !strings.HasPrefix(a, "-") || a == "-":
			return i
		}
	}
	return -1
}

func runTierShards(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "tier shards", "[--data DIR] [--json] [PATH K | PATH --clear]", `
The cluster's rules of k by path: stripes of K data shards (and 2 parity)
for the files at and below the namespace path PATH ("/" for the whole
namespace) when they go cold, by kylix tier cold or serve --cold-after on
any member (docs/design/erasure.md, "Tiers").

  kylix tier shards PATH K       sets the rule at PATH (replacing one there)
  kylix tier shards PATH --clear removes it
  kylix tier shards              lists the rules this member applies

A rule is kept in the namespace itself: it reaches every member with the
namespace merge, as a file does (a second or two), and applies to every
conversion there after. Two members setting different paths at once both
keep theirs; for the same path the later wins. PATH need not exist yet: the
rule waits for the files put there. K is 5 to 10 (narrower stripes cost
(K+2)/K of the bytes: 1.5x or more is refused); a K wider than the members
alive now can hold is kept, and its files stay warm (said in the error of
the conversion) until enough members are there.

Which k a file gets, first that applies:
  1. kylix tier cold --data-shards K, for every file it converts;
  2. the rule of the longest path at or above the file, across the
     cluster's rules and the converting member's own serve --cold-shards
     PATH=K; for the same path the member's own wins (on that member);
  3. the widest stripe the cluster allows (kylix peers says which).
A file under a cluster rule whose K is not allowed (a namespace edited by
hand) stays warm, said in the error; set the rule again or clear it.
Needs a running cluster member (kylix serve --listen).`).withJSON()
	clearRule := f.Bool("clear", false, "remove the rule at PATH")
	if err := f.parse(args, 0, 2); err != nil {
		return err
	}
	req := node.TierShardsRequest{Clear: *clearRule}
	switch {
	case *clearRule && f.NArg() != 1:
		fmt.Fprintf(e.stderr, "kylix tier shards: --clear takes PATH alone (kylix tier shards PATH --clear)\n")
		f.helpPointer()
		return errUsage
	case !*clearRule && f.NArg() == 1:
		fmt.Fprintf(e.stderr, "kylix tier shards: give K, the data shards for the files at and below %s (5 to 10), or --clear\n", f.Arg(0))
		f.helpPointer()
		return errUsage
	case f.NArg() == 2:
		k, err := strconv.Atoi(f.Arg(1))
		if err != nil {
			fmt.Fprintf(e.stderr, "kylix tier shards: K %q is not a number: give the data shards of the stripes, 5 to 10\n", f.Arg(1))
			f.helpPointer()
			return errUsage
		}
		if k == 0 {
			fmt.Fprintf(e.stderr, "kylix tier shards: K 0: give the data shards of the stripes, 5 to 10 (to remove a rule: kylix tier shards PATH --clear)\n")
			f.helpPointer()
			return errUsage
		}
		req.K = k
	}
	if f.NArg() > 0 {
		req.Path = f.Arg(0)
	}
	var out node.TierShardsReply
	if err := f.call(ctx, node.OpTierShards, req, &out, nil); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s: the rules of k are kept by a cluster's members (start one with kylix serve --listen)", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	w := e.stdout
	switch {
	case req.K != 0:
		fmt.Fprintf(w, "shards %s: stripes of %d+2 for the files at and below it, on every member once the namespace reaches it\n", out.Path, out.K)
		if out.Missing {
			fmt.Fprintf(w, "note: nothing is at %s yet; the rule applies to the files put there\n", out.Path)
		}
		if out.Note != "" {
			fmt.Fprintf(w, "note: %s; its files stay warm until the cluster has them\n", out.Note)
		}
		return nil
	case req.Clear && out.Cleared:
		fmt.Fprintf(w, "shards %s: rule removed; its files get the rule of a path above, else the cluster's default\n", out.Path)
		return nil
	case req.Clear:
		fmt.Fprintf(w, "shards %s: no cluster rule was there; nothing changed\n", out.Path)
		return nil
	}
	def := out.Default
	if def == "" {
		def = "none: the members alive now are too few for stripes"
	}
	if len(out.Rules) == 0 {
		fmt.Fprintf(w, "no rules of k by path: every file gets the cluster's default (%s)\n", def)
		return nil
	}
	for _, r := range out.Rules {
		shape := fmt.Sprintf("%d+2", r.K)
		from := "cluster"
		switch {
		case r.From == peers.RuleFromMember:
			from = "this member's serve --cold-shards"
		case r.Error != "":
			shape, from = "bad", r.Error
		case r.Overridden:
			from = "cluster (replaced here by this member's --cold-shards)"
		}
		fmt.Fprintf(w, "%-24s %-5s %s\n", r.Path, shape, from)
	}
	fmt.Fprintf(w, "files under no rule: the cluster's default (%s)\n", def)
	return nil
}
