package main

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "gc", summary: "remove what no namespace path uses and compact half-dead packs", run: runGC})
}

func runGC(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "gc", "[--data DIR] [--json] [--compact-threshold F] [--no-compact] [--max-bytes SIZE]", `
Removes every chunk and manifest that no head of the namespace reaches and
deletes pack files left without a live chunk. Then it compacts: a pack in
which at least --compact-threshold of the disk space holds no live chunk
(files removed while others still use the pack) has its live chunks copied,
each verified against its hash, into a new pack, and the old pack is
deleted. A crash or kill at any point leaves the store verifying with
nothing lost (docs/design/gc.md). Packs that hold exactly one live file
(served by FUSE passthrough) are never compacted. A live chunk that does not
verify is never copied: its pack is left as it is and listed (run kylix
verify). bytes_freed is the disk space given back, as du counts it.`).withJSON()
	th := f.Float64("compact-threshold", chunkstore.DefaultCompactThreshold, "compact packs at least this share dead (0 < F <= 1)")
	noCompact := f.Bool("no-compact", false, "only remove what is unreachable; do not rewrite packs")
	maxBytes := f.String("max-bytes", "", "copy at most this many live bytes in this run (e.g. 10GiB; default no bound)")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	if *th <= 0 || *th > 1 {
		fmt.Fprintf(e.stderr, "kylix gc: --compact-threshold %v: give a share of dead space between 0 (exclusive) and 1\n", *th)
		return errUsage
	}
	opts := chunkstore.GCOptions{Compact: !*noCompact, CompactThreshold: *th}
	if *maxBytes != "" {
		n, err := parseSize(*maxBytes)
		if err != nil || n <= 0 {
			fmt.Fprintf(e.stderr, "kylix gc: --max-bytes %q: give a size such as 512MiB or 10GiB\n", *maxBytes)
			return errUsage
		}
		opts.MaxBytes = n
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	p := newProgress(e, "compacting")
	opts.Progress = p.update
	res, err := s.Collect(ctx, opts)
	p.finish()
	if err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(res)
	}
	fmt.Fprintf(e.stdout, "removed %d chunks (%s), %d manifests, %d packs\n",
		res.ChunksRemoved, human(res.BytesRemoved), res.ObjectsRemoved, res.PacksRemoved)
	if opts.Compact {
		fmt.Fprintf(e.stdout, "compacted %d packs into %d: moved %d chunks (%s)\n",
			res.PacksCompacted, res.PacksWritten, res.ChunksMoved, human(res.BytesMoved))
	}
	fmt.Fprintf(e.stdout, "freed %s on disk; %s dead left in live packs\n", human(res.BytesFreed), human(res.DeadBytes))
	if res.RankLayoutsRemoved > 0 {
		fmt.Fprintf(e.stdout, "removed %d rank layouts of file versions no longer stored (kylix layout)\n", res.RankLayoutsRemoved)
	}
	if res.WholeFileKept > 0 {
		fmt.Fprintf(e.stdout, "kept whole: %d packs holding one file each (FUSE passthrough)\n", res.WholeFileKept)
	}
	if res.ReceivedKept > 0 {
		fmt.Fprintf(e.stdout, "kept: %d chunks received from members that no path names yet: in the last hour, or while an import or conversion that sent them runs on a member (the namespace merge names them)\n", res.ReceivedKept)
	}
	if res.Deferred > 0 {
		fmt.Fprintf(e.stdout, "left for a later run (--max-bytes): %d packs\n", res.Deferred)
	}
	if res.Retained > 0 {
		fmt.Fprintf(e.stdout, "still read by open files (deleted when they close): %d packs\n", res.Retained)
	}
	for _, sk := range res.Skipped {
		fmt.Fprintf(e.stdout, "not compacted, a live chunk does not verify (run kylix verify): %s\n", sk)
	}
	return nil
}
