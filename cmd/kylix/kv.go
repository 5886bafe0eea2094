package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/kylix/kylix/internal/units"
	"github.com/kylix/kylix/node"
	"github.com/kylix/kylix/node/kvstore"
)

func init() {
	register(&command{name: "kv", summary: "the node's KV-cache store: kv stats, kv clear", run: runKV})
}

const kvUsage = `kylix kv stats [--json] | kylix kv clear [--uid N]`

func runKV(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "stats":
			return runKVStats(ctx, e, args[1:])
		case "clear":
			return runKVClear(ctx, e, args[1:])
		case "--help", "-h", "help":
			fmt.Fprintf(e.stdout, "Usage: %s\n\nThe running node's KV-cache store (docs/design/kv.md): its tiers' use and hits (stats), or drop its blocks (clear). Each has --help.\n", kvUsage)
			return nil
		}
	}
	if len(args) == 0 {
		fmt.Fprintf(e.stderr, "kylix kv: name what to do: stats or clear\n")
	} else {
		fmt.Fprintf(e.stderr, "kylix kv: unknown subcommand %q: it is stats or clear\n", args[0])
	}
	fmt.Fprintf(e.stderr, "Run 'kylix kv --help' for its usage.\n")
	return errUsage
}

func runKVStats(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "kv stats", "[--data DIR] [--json]", `
Shows the running node's KV-cache store (serve --kv-mem, --kv-disk,
--kv-block): the block size, per tier (host memory, disk) the blocks and
bytes held against the budget, hits, bytes read and evictions; puts taken
and refused (no room eviction could make), misses, blocks waiting for the
disk, disk write errors (those blocks stayed in memory only) and blocks
that failed their check on disk (each a miss); on a member of a cluster,
the members tier: gets answered by another member, gets that asked and
found nothing, and blocks copied to their home members. Fails when no
node runs.`).withJSON()
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	var out node.KVStatsReply
	if err := f.call(ctx, node.OpKVStats, struct{}{}, &out, nil); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s; the KV store lives in the running kylix serve --kv-mem SIZE", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	if !out.Enabled {
		fmt.Fprintf(e.stdout, "kv: none: %s\n", out.Note)
		return nil
	}
	st := out.Stats
	w := e.stdout
	fmt.Fprintf(w, "kv: blocks of %s; host memory %s\n", human(int64(st.BlockSize)), st.HostMemory)
	tier := func(name string, t kvstore.TierStats) {
		if t.Budget == 0 {
			fmt.Fprintf(w, "  %-7s none\n", name)
			return
		}
		fmt.Fprintf(w, "  %-7s %d blocks, %s of %s; %d hits (%s read); %d evicted\n", name, t.Blocks, human(t.Bytes), human(t.Budget), t.Hits, human(t.ReadBytes), t.Evictions)
	}
	tier("memory", st.Memory)
	tier("disk", st.Disk)
	if st.DiskReads != "" {
		fmt.Fprintf(w, "  disk reads %s\n", st.DiskReads)
	}
	fmt.Fprintf(w, "  puts %d, refused %d; misses %d; waiting for disk %d\n", st.Puts, st.Refused, st.Misses, st.Dirty)
	fmt.Fprintf(w, "  disk writes %d, failed %d (kept in memory only: %d); failed checks %d\n", st.DiskWrites, st.DiskWriteErrors, st.MemoryOnly, st.VerifyFailures)
	if st.DiskLastError != "" {
		fmt.Fprintf(w, "  last disk error: %s\n", st.DiskLastError)
	}
	if m := out.Members; m != nil {
		fmt.Fprintf(w, "  members %d hits, %d misses; copied to their homes %d, failed %d, dropped %d, waiting %d\n", m.Hits, m.Misses, m.Pushed, m.PushFailed, m.PushDropped, m.PushWaiting)
	}
	return nil
}

func runKVClear(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "kv clear", "[--data DIR] [--json] [--uid N]", `
Drops blocks from the running node's KV-cache store, from memory and disk:
every block, or with --uid only those of uid N (each local user's blocks
are apart: docs/design/kv.md). A client drops its own with KV_CLEAR on the
client socket (kylix.kv's clear()). Fails when no node runs.`).withJSON()
	uid := f.Int64("uid", -1, "drop only the blocks of this uid")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	if *uid < -1 || *uid > 1<<32-1 {
		fmt.Fprintf(e.stderr, "kylix kv clear: --uid %d is no uid\n", *uid)
		return errUsage
	}
	req := node.KVClearRequest{All: *uid < 0}
	if *uid >= 0 {
		req.UID = uint32(*uid)
	}
	var out node.KVClearReply
	if err := f.call(ctx, node.OpKVClear, req, &out, nil); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s; the KV store lives in the running kylix serve --kv-mem SIZE", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	whose := "all uids"
	if !req.All {
		whose = fmt.Sprintf("uid %d", req.UID)
	}
	fmt.Fprintf(e.stdout, "kv: dropped %d blocks of %s\n", out.Blocks, whose)
	return nil
}

// kvFlags are serve's KV-cache flags (config keys kv-mem, kv-disk,
// kv-block).
type kvFlags struct{ mem, disk, block *string }

func addKVFlags(f *flags) kvFlags {
	return kvFlags{
		mem:   f.String("kv-mem", "0", "host memory for the KV-cache store's blocks (docs/design/kv.md), e.g. 16GiB; 0: no KV store"),
		disk:  f.String("kv-disk", "0", "disk for the KV-cache store's blocks, in DATA/kv (written behind the puts), e.g. 200GiB; 0: memory only"),
		block: f.String("kv-block", "2MiB", "the KV-cache store's block size: every block put is exactly this long"),
	}
}

func (k kvFlags) config() (node.KVConfig, error) {
	var c node.KVConfig
	for _, v := range []struct {
		name string
		s    *string
		to   *int64
	}{{"kv-mem", k.mem, &c.MemBudget}, {"kv-disk", k.disk, &c.DiskBudget}} {
		n, err := units.ParseSize(strings.TrimSpace(*v.s))
		if err != nil {
			return c, fmt.Errorf("serve: --%s: %w", v.name, err)
		}
		*v.to = n
	}
	bs, err := units.ParseSize(strings.TrimSpace(*k.block))
	if err != nil || bs <= 0 || bs > node.MaxKVBlockSize {
		return c, fmt.Errorf("serve: --kv-block %q: a size from 1 byte to %s", *k.block, human(node.MaxKVBlockSize))
	}
	c.BlockSize = int(bs)
	return c, nil
}
