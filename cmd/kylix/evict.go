package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "evict", summary: "drop a path's fetched chunks from the node's peer cache (the inverse of warm)", run: runEvict})
}

type evictOut struct {
	Path   string `json:"path"` // "" with --all
	Chunks int    `json:"chunks"`
	Bytes  int64  `json:"bytes"`
	// CacheBytes and CacheChunks: what the peer cache holds afterwards.
	CacheBytes  int64 `json:"cache_bytes"`
	CacheChunks int   `json:"cache_chunks"`
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
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	if e.store == nil {
		return fmt.Errorf("no node serves %s, so there is no peer cache to empty (it lives in the running kylix serve --listen)", s.Dir())
	}
	if runningPeers == nil {
		return fmt.Errorf("the node serving %s is not in a cluster (started without --listen): it has no peer cache", s.Dir())
	}
	var out evictOut
	if *all {
		out.Chunks, out.Bytes = runningPeers.DropPeerCached(nil, true)
	} else {
		clean, err := chunkstore.CleanPath(f.Arg(0))
		if err != nil {
			return fmt.Errorf("evict %s: %w", f.Arg(0), err)
		}
		out.Path = shownPath(clean)
		ids, err := pathChunks(ctx, s, clean)
		if errors.Is(err, chunkstore.ErrNotFound) {
			return fmt.Errorf("evict %s: no such path in the namespace (kylix ls shows what is there)", out.Path)
		}
		if err != nil {
			return fmt.Errorf("evict %s: %w", out.Path, err)
		}
		out.Chunks, out.Bytes = runningPeers.DropPeerCached(ids, false)
	}
	c := runningPeers.Swarm().Cache
	out.CacheBytes, out.CacheChunks = c.Bytes, c.Chunks
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

// pathChunks lists the distinct chunks of the files at and under path.
func pathChunks(ctx context.Context, s *chunkstore.Store, path string) ([]chunkstore.ID, error) {
	seen := map[chunkstore.ID]bool{}
	var ids []chunkstore.ID
	err := s.Walk(path, func(p string, ent chunkstore.Entry) error {
		if ent.Kind != chunkstore.KindFile {
			return ctx.Err()
		}
		m, err := s.FileManifest(ent.ID)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, c := range m.Chunks {
			if !seen[c.ID] {
				seen[c.ID] = true
				ids = append(ids, c.ID)
			}
		}
		return ctx.Err()
	})
	return ids, err
}
