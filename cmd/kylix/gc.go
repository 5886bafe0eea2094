package main

import (
	"context"
	"fmt"
)

func init() {
	register(&command{name: "gc", summary: "remove chunks and packs no namespace path uses", run: runGC})
}

func runGC(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "gc", "[--data DIR] [--json]", `
Removes every chunk and manifest that no head of the namespace reaches and
deletes pack files left without a live chunk. Bytes no longer used inside packs
that still hold live chunks are reported as dead bytes.`).withJSON()
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	res, err := s.GC(ctx)
	if err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(res)
	}
	fmt.Fprintf(e.stdout, "removed %d chunks (%s), %d manifests, %d packs; %s dead in live packs\n",
		res.ChunksRemoved, human(res.BytesRemoved), res.ObjectsRemoved, res.PacksRemoved, human(res.DeadBytes))
	return nil
}
