package main

import (
	"context"
	"fmt"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "rm", summary: "remove a namespace path (data goes at the next gc)", run: runRm})
}

func runRm(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "rm", "[--data DIR] [-r] PATH", `
Removes PATH from the namespace. A directory needs -r unless it is empty. The
chunks stay until 'kylix gc' finds nothing else uses them.`)
	rec := f.BoolP("recursive", "r", false, "remove a directory and everything under it")
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Update(func(tx *chunkstore.NSTx) error { return tx.Remove(f.Arg(0), *rec) }); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "removed %s\n", f.Arg(0))
	return nil
}
