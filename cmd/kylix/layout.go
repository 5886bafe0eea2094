package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
)

func init() {
	register(&command{name: "layout", summary: "store per-rank layouts of safetensors files for tensor-parallel loads", run: runLayout})
}

// layoutOut is kylix layout's JSON: one entry per file.
type layoutOut struct {
	Path    string                   `json:"path"`
	Made    *gpuio.RankLayoutsResult `json:"made,omitempty"`
	Skipped string                   `json:"skipped,omitempty"`
	Dropped int                      `json:"dropped,omitempty"`
	Stored  []chunkstore.RankLayout  `json:"stored,omitempty"`
}

func runLayout(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "layout", "[--data DIR] [--json] [--tp-size N [--drop] | --drop] PATH...", `
With --tp-size N, stores for each safetensors file at or below PATH one
rank layout per rank 0..N-1: a safetensors file holding that rank's share of
every tensor (the shares kylix load --tp-size and kylix.torch.load_file
give), back to back. A row-parallel share (o_proj, down_proj, ...) is
strided rows of its tensor, so without a layout a rank reads most of each
such tensor; with one, 'kylix load --tp-size N --tp-rank R' reads the
rank's shares as one run (its report names the layout).

The layouts are cut at tensors like any safetensors file, so what every
rank keeps whole, and shares that start where the file's chunks do, cost
nothing twice; the command reports the new bytes stored (the extra disk),
and kylix du counts them. Layouts belong to the file's content: a file
written or replaced since does not use them, and the next kylix gc removes
layouts whose file version no longer exists. Files with no strided share
are skipped and said so.

--drop removes the layouts of the files (of size N only, with --tp-size).
Without --tp-size or --drop, lists the layouts stored for the files.
With a running node the command is answered by the node.`).withJSON()
	tp := f.Int("tp-size", 0, "tensor-parallel size to make layouts for (2 or more)")
	drop := f.Bool("drop", false, "remove the files' layouts instead")
	if err := f.parse(args, 1, -1); err != nil {
		return err
	}
	if *tp == 1 || *tp < 0 {
		fmt.Fprintf(e.stderr, "kylix layout: --tp-size %d: give 2 or more (one rank reads the file as it is)\n", *tp)
		return errUsage
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	var outs []layoutOut
	var made, newBytes int64
	others := 0 // files not safetensors, left alone
	for _, root := range f.Args() {
		if *tp > 1 && !*drop {
			var p *progress
			files, n, err := gpuio.MakeRankLayoutsBelow(ctx, s, root, *tp, func(file string, done, total int64) {
				if p == nil || p.label != "layout "+file {
					if p != nil {
						p.finish()
					}
					p = newProgress(e, "layout "+file)
				}
				p.update(done, total)
			})
			if p != nil {
				p.finish()
			}
			if err != nil {
				return err
			}
			others += n
			for _, lf := range files {
				outs = append(outs, layoutOut{Path: lf.Path, Made: lf.Made, Skipped: lf.Skipped})
				if lf.Made != nil {
					made += lf.Made.Bytes
					newBytes += lf.Made.NewBytes
				}
			}
			continue
		}
		var files []chunkstore.PathRankLayouts
		if *drop {
			files, err = s.DropRankLayoutsBelow(ctx, root, *tp)
		} else {
			files, err = s.RankLayoutsBelow(ctx, root)
		}
		if err != nil {
			return err
		}
		for _, pf := range files {
			outs = append(outs, layoutOut{Path: pf.Path, Dropped: pf.Dropped, Stored: pf.Stored})
		}
	}
	if f.jsonOut {
		return f.printJSON(outs)
	}
	for _, o := range outs {
		switch {
		case o.Skipped != "":
			fmt.Fprintf(e.stdout, "%s: skipped: %s\n", o.Path, o.Skipped)
		case o.Dropped > 0:
			fmt.Fprintf(e.stdout, "%s: %d rank layouts dropped (kylix gc frees their bytes)\n", o.Path, o.Dropped)
		case o.Made != nil:
			fmt.Fprintf(e.stdout, "%s: tp %d, %d ranks, %d strided tensors; layouts %s, new bytes stored %s\n",
				o.Path, o.Made.TPSize, len(o.Made.Ranks), o.Made.Strided, human(o.Made.Bytes), human(o.Made.NewBytes))
		default:
			for _, l := range o.Stored {
				where := "made here"
				if !l.MadeHere {
					where = "made on another member, not used here until made here too (kylix layout --tp-size " + strconv.Itoa(l.TPSize) + ")"
				}
				fmt.Fprintf(e.stdout, "%s: tp%d-rank%d %s %s, %s\n", o.Path, l.TPSize, l.Rank, human(l.Bytes), l.ID.Short(), where)
			}
		}
	}
	if *tp > 1 && !*drop {
		fmt.Fprintf(e.stdout, "total: layouts %s, new bytes stored %s; %d files not safetensors left alone\n", human(made), human(newBytes), others)
	} else if len(outs) == 0 {
		fmt.Fprintf(e.stdout, "no rank layouts stored for %v\n", f.Args())
	}
	return nil
}
