package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "du", summary: "show logical, unique and stored bytes of a namespace subtree", run: runDu})
}

type duOut struct {
	chunkstore.Usage
	Children []chunkstore.Usage `json:"children,omitempty"`
	// Whole: the whole copies of the store (all of it, not only PATH):
	// deduplicated files given a pack of their own for passthrough
	// (docs/design/whole.md); their second copies are not in STORED.
	Whole wholeUsage `json:"whole_copies"`
	// RankLayouts: the store's rank layouts (kylix layout; all of the
	// store): not in STORED either.
	RankLayouts layoutUsage `json:"rank_layouts"`
}

type layoutUsage struct {
	Files      int   `json:"files"`
	Bytes      int64 `json:"bytes"`
	ExtraBytes int64 `json:"extra_bytes"`
}

type wholeUsage struct {
	Copies      int   `json:"copies"`
	StoredBytes int64 `json:"stored_twice_bytes"`
}

func runDu(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "du", "[--data DIR] [--json] [-s] [PATH]", `
Shows what the namespace subtree PATH (default: the root) takes, for each
entry directly below it and in total (the last line):

  logical  the files' sizes added up, each name counted
  unique   the distinct chunks the files use, each counted once within
           the line's subtree (what deduplication leaves)
  stored   the pack bytes those chunks occupy, in whole 4 KiB blocks;
           chunks shared with files outside the subtree count too, so
           removing the subtree frees at most this much (after kylix gc)

A last line counts the store's whole copies, if any: deduplicated files
given a pack of their own so the mount serves them by passthrough, and the
bytes they store a second time (docs/design/whole.md), and one its rank
layouts (kylix layout): their bytes and what they add beyond their files.

Figures of the lines do not add up to the total where entries share chunks.
With a running node the command is answered by the node.`).withJSON()
	var sum bool
	f.BoolVarP(&sum, "summarize", "s", false, "only the total")
	if err := f.parse(args, 0, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	total, kids, err := s.DiskUsage(ctx, f.Arg(0), !sum)
	if err != nil {
		return err
	}
	var whole wholeUsage
	if whole.Copies, whole.StoredBytes, err = s.WholeUsage(); err != nil {
		return err
	}
	var lu layoutUsage
	if lu.Files, lu.Bytes, lu.ExtraBytes, err = s.RankLayoutUsage(); err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(duOut{Usage: total, Children: kids, Whole: whole, RankLayouts: lu})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "LOGICAL\tUNIQUE\tSTORED\t\tPATH")
	line := func(u chunkstore.Usage) {
		p := "/" + u.Path
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t%s\n", human(u.LogicalBytes), human(u.UniqueBytes), human(u.StoredBytes), p)
	}
	for _, k := range kids {
		line(k)
	}
	line(total)
	if err := tw.Flush(); err != nil {
		return err
	}
	if total.NotLocalBytes > 0 {
		fmt.Fprintf(e.stdout, "%s of the chunks are not stored on this node\n", human(total.NotLocalBytes))
	}
	if whole.Copies > 0 {
		fmt.Fprintf(e.stdout, "whole copies (the whole store, not in STORED): %d files, %s stored a second time so the mount serves them by passthrough (docs/design/whole.md)\n",
			whole.Copies, human(whole.StoredBytes))
	}
	if lu.Files > 0 {
		fmt.Fprintf(e.stdout, "rank layouts (the whole store, not in STORED): %d files, %s, %s of chunks their files do not hold (docs/design/ranklayout.md)\n",
			lu.Files, human(lu.Bytes), human(lu.ExtraBytes))
	}
	return nil
}
