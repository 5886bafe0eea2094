package main

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/kylix/kylix/chunkstore"
)

func init() {
	register(&command{name: "fsck", summary: "check the index against the packs, or rebuild it from them", run: runFsck})
}

func runFsck(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "fsck", "[--data DIR] [--json] [--rebuild-index]", `
Without flags, compares the index (index.db) with the metadata log kept in the
packs directory, record by record, and checks that every pack the index lists
exists at its committed size and that every pack file is known. Changes
nothing. Exit status 1 when they disagree.

With --rebuild-index, recreates the index from the packs' metadata log alone
(the old index.db is not read), re-hashing every chunk: chunks whose bytes do
not verify are left out and listed. Run it when a command says the index is
missing or damaged. The node must not be running.`).withJSON()
	rebuild := f.Bool("rebuild-index", false, "recreate index.db from the packs' metadata log")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	if *rebuild {
		return runRebuild(ctx, e, f)
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	rep, err := s.Fsck(ctx)
	if err != nil {
		return err
	}
	if f.jsonOut {
		if err := f.printJSON(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "checked the index against %d records of %s\n", rep.Records, rep.Log)
		for _, m := range []struct {
			what string
			n    map[string]int
		}{{"missing from the index", rep.Missing}, {"in the index but not in the log", rep.Extra}, {"different in the index", rep.Different}} {
			for _, b := range sortedKeys(m.n) {
				fmt.Fprintf(e.stdout, "PROBLEM %d %s records %s\n", m.n[b], b, m.what)
			}
		}
		if rep.LogDamage != "" {
			fmt.Fprintf(e.stdout, "PROBLEM metadata log: %s\n", rep.LogDamage)
		}
		for _, p := range rep.MissingPacks {
			fmt.Fprintf(e.stdout, "PROBLEM pack missing: %s\n", p)
		}
		for _, p := range rep.ShortPacks {
			fmt.Fprintf(e.stdout, "PROBLEM pack shorter than committed: %s\n", p)
		}
		for _, p := range rep.Unreferenced {
			fmt.Fprintf(e.stdout, "PROBLEM pack no record mentions (left in place): %s\n", p)
		}
		if rep.OK() {
			fmt.Fprintln(e.stdout, "ok")
		} else {
			fmt.Fprintln(e.stdout, "index and packs disagree: `kylix fsck --rebuild-index` recreates the index from the packs; `kylix verify` names the files affected")
		}
	}
	if !rep.OK() {
		return exitError(1)
	}
	return nil
}

// runRebuild does not go through f.open: the store cannot be opened while its
// index is damaged, and a running node must not have its index replaced
// under it (RebuildIndex takes the store's lock and fails if it is held).
func runRebuild(ctx context.Context, e *env, f *flags) error {
	rep, err := chunkstore.RebuildIndex(ctx, chunkstore.Options{
		Dir:    f.data,
		Logger: slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(rep)
	}
	fmt.Fprintf(e.stdout, "rebuilt the index from %d records of %s: %d chunks, %d manifests, %d packs, %d heads\n",
		rep.Records, rep.Log, rep.Chunks, rep.Objects, rep.Packs, rep.Heads)
	if rep.LogDamage != "" {
		fmt.Fprintf(e.stdout, "WARNING the metadata log is damaged (%s); records after the damage are lost, a copy is at %s\n", rep.LogDamage, rep.SavedLog)
	}
	if len(rep.Dropped) > 0 {
		fmt.Fprintf(e.stdout, "WARNING %d chunks did not verify and were left out: %s\n", len(rep.Dropped), strings.Join(rep.Dropped[:min(len(rep.Dropped), 10)], ", "))
		fmt.Fprintln(e.stdout, "run `kylix verify` to list the files that lose data")
	}
	for _, p := range rep.Unreferenced {
		fmt.Fprintf(e.stdout, "note: pack no record mentions (left in place): %s\n", p)
	}
	return nil
}

func sortedKeys(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
