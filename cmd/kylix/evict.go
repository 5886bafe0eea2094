package main

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "evict", summary: "drop a path's fetched chunks from the node's peer cache (the inverse of warm)", run: runEvict})
}

func runEvict(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "evict", "[--data DIR] [--json] PATH | --all", `
Drops the chunks of the namespace path PATH (a file, or a directory and
everything under it) from the running node's peer cache: the chunks this
member fetched from others and keeps on its disk, up to its budget
(serve --peer-cache; kylix peers shows how full it is). The disk space is
freed now, not when the budget evicts them; the next read of PATH fetches
them again, verified. --all empties the whole cache, also chunks that no
path names any more. Chunks in this node's packs (those it owns, and those
kylix pin made local) stay. Reports the chunks and bytes dropped. Fails when
no node runs, or when it was started without --listen.`).withJSON()
	all := f.Bool("all", false, "empty the whole peer cache (no PATH)")
	if err := f.parse(args, 0, 1); err != nil {
		return err
	}
	if *all == (f.NArg() == 1) {
		fmt.Fprintf(e.stderr, "kylix evict: give a PATH or --all, not both (kylix evict --help)\n")
		return errUsage
	}
	var out node.EvictReply
	req := node.EvictRequest{All: *all}
	if !*all {
		req.Path = f.Arg(0)
	}
	if err := f.call(ctx, node.OpEvict, req, &out, nil); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s, so there is no peer cache to empty (it lives in the running kylix serve --listen)", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	what := out.Path
	if *all {
		what = "the peer cache"
	}
	fmt.Fprintf(e.stdout, "evicted %s: %d chunks (%s) dropped from the peer cache; it now holds %d chunks (%s)\n",
		what, out.Chunks, human(out.Bytes), out.CacheChunks, human(out.CacheBytes))
	return nil
}
