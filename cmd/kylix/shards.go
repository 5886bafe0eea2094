package main

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "shards", summary: "view a directory of small files as WebDataset tar shards (no second copy)", run: runShards})
}

func runShards(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "shards", "[--data DIR] [--json] [--shard-size SIZE] SRC DEST", `
Writes the regular files below the namespace directory SRC as tar shards
(WebDataset's layout) into the namespace directory DEST: shard-000000.tar,
shard-000001.tar, ... and index.json, which names each shard with its
bytes, samples and files. Readers then move the data set in long
sequential reads instead of one lookup per file (kylix.data in the Python
package reads them; any tar reader can).

A shard is made of the files' own chunks plus small tar headers, so it
costs no second copy of the bytes: 'kylix du' shows what it added.
Members are in path order; the files of one sample (one key: the path up
to the first dot of the base name, as WebDataset groups them) are never
split across shards. The shards take the files' common owner and group
and are readable only by the classes that may read every member (the
command refuses files of different owners). They are a snapshot: run the
command again after SRC changes. DEST is replaced.
With a running node the command is answered by the node.`).withJSON()
	size := f.String("shard-size", "256MiB", "bytes a shard grows to before the next begins (ends at a sample boundary)")
	if err := f.parse(args, 2, 2); err != nil {
		return err
	}
	n, err := parseSize(*size)
	if err != nil {
		fmt.Fprintf(e.stderr, "kylix shards: --shard-size %q: give a size such as 64MiB or 1GiB\n", *size)
		return errUsage
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	p := newProgress(e, "shards")
	res, err := s.MakeShards(ctx, f.Arg(0), f.Arg(1), chunkstore.ShardOptions{ShardSize: n, Progress: p.update})
	p.finish()
	if err != nil {
		return err
	}
	for _, n := range res.Skipped {
		fmt.Fprintf(e.stderr, "kylix shards: skipped: %s\n", n)
	}
	if f.jsonOut {
		return f.printJSON(res)
	}
	fmt.Fprintf(e.stdout, "%s -> %s: %d shards, %d samples, %d files, %s of members in %s of tar; new bytes stored: %s\n",
		f.Arg(0), f.Arg(1), len(res.Shards), res.Samples, res.Files, human(res.MemberBytes), human(res.TarBytes), human(res.NewBytes))
	return nil
}
