package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/peers"
)

func init() {
	register(&command{name: "df", summary: "show logical vs stored bytes and the dedup ratio", run: runDf})
}

func runDf(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "df", "[--data DIR] [--json]", `
Shows the store's size: logical_bytes (all files in the namespace added up),
unique_bytes (distinct chunks), stored_bytes (disk taken by pack files,
padding and not yet collected garbage included) and dedup_ratio
(logical / stored); disk_bytes (blocks the packs take, as du counts),
dead_bytes (pack bytes no stored chunk occupies: kylix gc compacts them) and
what the last kylix gc freed. On a cluster member also the replication of
the whole namespace as the alive members answer (docs/design/peers.md):
under-replicated bytes (chunks on fewer than --replicas members), chunks no
alive member holds, and what each member holds.`).withJSON()
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := s.Stats()
	if err != nil {
		return err
	}
	cl, err := clusterReplication(ctx, e, "")
	if err != nil {
		return err
	}
	if f.jsonOut {
		return f.printJSON(struct {
			*chunkstore.Stats
			Cluster *peers.Replication `json:"cluster,omitempty"`
		}{st, cl})
	}
	if cl != nil {
		defer printReplication(e.stdout, cl)
	}
	fmt.Fprintf(e.stdout, "data dir:      %s\nfiles:         %d in %d directories\nlogical_bytes: %d (%s)\nunique_bytes:  %d (%s) in %d chunks\nstored_bytes:  %d (%s) in %d packs\ndisk_bytes:    %d (%s)\ndead_bytes:    %d (%s)\nindex_bytes:   %d (%s)\ndedup_ratio:   %.2f\nio:            %s\n",
		st.Dir, st.Files, st.Dirs, st.LogicalBytes, human(st.LogicalBytes), st.UniqueBytes, human(st.UniqueBytes), st.Chunks,
		st.StoredBytes, human(st.StoredBytes), st.Packs, st.DiskBytes, human(st.DiskBytes), st.DeadBytes, human(st.DeadBytes),
		st.IndexBytes, human(st.IndexBytes), st.DedupRatio, st.IO)
	if g := st.LastGC; g != nil {
		fmt.Fprintf(e.stdout, "last_gc:       %s: freed %d (%s), %d packs removed, %d compacted (%s moved)\n",
			g.At.Format(time.RFC3339), g.BytesFreed, human(g.BytesFreed), g.PacksRemoved, g.PacksCompacted, human(g.BytesMoved))
	}
	return nil
}
