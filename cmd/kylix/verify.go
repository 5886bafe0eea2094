package main

import (
	"context"
	"fmt"
	"strings"
)

func init() {
	register(&command{name: "verify", summary: "re-hash stored data and list what is corrupt", run: runVerify})
}

func runVerify(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "verify", "[--data DIR] [--json] [PATH]", `
Re-reads every chunk under namespace path PATH (default: the whole store) from
disk, re-hashes it and checks every manifest on the way. Lists what is corrupt
or missing and which files it affects. Exit status: 0 when all is well, 1 when
something is corrupt or missing.`).withJSON()
	if err := f.parse(args, 0, 1); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	p := newProgress(e, "verify")
	rep, err := s.Verify(ctx, f.Arg(0), p.update)
	p.finish()
	if err != nil {
		return err
	}
	if f.jsonOut {
		if err := f.printJSON(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "verified %d files, %d chunks, %s\n", rep.Files, rep.Chunks, human(rep.Bytes))
		for _, pr := range rep.Problems {
			fmt.Fprintf(e.stdout, "CORRUPT %s %s: %s", pr.Kind, pr.ID, pr.Err)
			if pr.Pack != "" {
				fmt.Fprintf(e.stdout, " (at %s)", pr.Pack)
			}
			fmt.Fprintln(e.stdout)
			if len(pr.Paths) > 0 {
				fmt.Fprintf(e.stdout, "  affects: %s\n", strings.Join(pr.Paths, ", "))
			}
		}
		if rep.OK() {
			fmt.Fprintln(e.stdout, "ok")
		} else {
			fmt.Fprintf(e.stdout, "%d problems found\n", len(rep.Problems))
		}
	}
	if !rep.OK() {
		return exitError(1)
	}
	return nil
}
