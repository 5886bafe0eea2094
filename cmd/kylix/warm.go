package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "warm", summary: "read a path's chunks into the page cache, verified, with a progress bar", run: runWarm})
}

func runWarm(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "warm", "[--data DIR] [--json] PATH", `
Reads every chunk of the namespace path PATH (a file, or a directory and
everything under it) from its pack, verifying each against its ID, so that
the packs are in the page cache: later loads and GPU fills of PATH read from
memory. Shows a progress bar on a terminal; reports the bytes read, the rate
and how much of PATH is resident afterwards (the kernel may evict pages
again under memory pressure; kylix pin keeps them). Works with and without
a running node. On a cluster member, the chunks not stored here are fetched
from the members (16 at a time, verified) into the node's peer cache, which
may evict them again (kylix pin keeps them); the report says how many bytes
came from the packs and how many were fetched. Exit status 1 if a chunk is
corrupt, or not stored here and no member can send it.`).withJSON()
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	var out node.WarmReply
	err := f.callProgress(ctx, node.OpWarm, node.PathRequest{Path: f.Arg(0)}, &out)
	if errors.Is(err, node.ErrNoNode) { // no node: warm here
		var s *chunkstore.Store
		if s, err = f.open(); err != nil {
			return err
		}
		defer s.Close()
		prog, finish := e.progressBar()
		out, err = node.Warm(ctx, s, nil, f.Arg(0), prog)
		finish()
	}
	if err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	fetchedLine := ""
	if out.FetchedChunks > 0 {
		fetchedLine = fmt.Sprintf(": %s from this node's packs, %s (%d chunks) fetched from the members into the peer cache", human(out.LocalBytes), human(out.FetchedBytes), out.FetchedChunks)
		if out.PeerCachedBytes > 0 {
			fetchedLine += fmt.Sprintf(" (%s of it was there already)", human(out.PeerCachedBytes))
		}
	}
	fmt.Fprintf(e.stdout, "warmed %s: %d files, %s verified in %.2fs (%.2f GB/s)%s; %s resident in the page cache\n",
		out.Path, out.Files, human(out.Bytes), out.Seconds, out.GBps, fetchedLine, human(out.ResidentBytes))
	return nil
}
