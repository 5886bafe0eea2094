package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

func init() {
	register(&command{name: "verify", summary: "re-hash stored data and list what is corrupt", run: runVerify})
}

func runVerify(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "verify", "[--data DIR] [--json] [PATH]", `
Re-reads every chunk under namespace path PATH (default: the whole store) from
disk, re-hashes it and checks every manifest on the way. Lists what is corrupt
or missing and which files it affects. On a cluster member (the command runs
in its node), a chunk not stored here that another member stores is not a
problem: it is counted as "not stored here, held by the cluster"; one that no
member that answered stores is LOST. Exit status: 0 when all is well, 1 when
something is corrupt, missing or lost.`).withJSON()
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
	cluster := e.node.Peers() != nil
	var unanswered []string
	if cluster {
		unanswered = askCluster(ctx, e.node.Peers(), rep)
	}
	if f.jsonOut {
		if err := f.printJSON(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "verified %d files, %d chunks, %s\n", rep.Files, rep.Chunks, human(rep.Bytes))
		if cluster {
			fmt.Fprintf(e.stdout, "not stored here: %d chunks, held by the cluster\n", rep.NotHere)
		}
		for _, pr := range rep.Problems {
			label := "CORRUPT"
			if cluster && pr.Kind == "missing-chunk" {
				label = "LOST"
			}
			fmt.Fprintf(e.stdout, "%s %s %s: %s", label, pr.Kind, pr.ID, pr.Err)
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
	for _, u := range unanswered {
		fmt.Fprintf(e.stderr, "kylix: verify: member not answering: %s\n", u)
	}
	if !rep.OK() {
		return exitError(1)
	}
	return nil
}

// askCluster asks the other members which of the chunks Verify found
// missing here they store: those are moved out of the problems into
// rep.NotHere (a member stores only its share: R copies over the members).
// The rest stay problems, said to be lost: no member that answered stores
// them. A member that does not answer may hold some of them, so they are
// not cleared on its behalf: verify then exits 1 until it can tell
// (decided: "cannot tell" is not "healthy"). It returns the members that
// did not answer.
func askCluster(ctx context.Context, pn *peers.Node, rep *chunkstore.VerifyReport) []string {
	var ids []chunkstore.ID
	var at []int
	for i, pr := range rep.Problems {
		if pr.Kind != "missing-chunk" {
			continue
		}
		id, err := chunkstore.ParseID(pr.ID)
		if err != nil {
			continue
		}
		ids, at = append(ids, id), append(at, i)
	}
	if len(ids) == 0 {
		return nil
	}
	held, unanswered := pn.Held(ctx, ids)
	drop := map[int]bool{}
	for k, i := range at {
		if held[k] {
			drop[i] = true
			rep.NotHere++
			continue
		}
		why := "not stored here, and no other member stores it: lost"
		if len(unanswered) > 0 {
			why = fmt.Sprintf("not stored here, and no member that answered stores it (%d did not answer): lost unless one of them holds it", len(unanswered))
		}
		rep.Problems[i].Err = why
	}
	kept := rep.Problems[:0]
	for i, pr := range rep.Problems {
		if !drop[i] {
			kept = append(kept, pr)
		}
	}
	rep.Problems = kept
	return unanswered
}
