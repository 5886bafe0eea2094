package main

// kylix pin and unpin (docs/design/pin.md): typed requests to the running
// node, which holds the pins (node/pins.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "pin", summary: "keep a path's packs locked in the node's memory and registered with its GPUs", run: runPin})
	register(&command{name: "unpin", summary: "release a pin", run: runUnpin})
}

func printPins(w io.Writer, st *node.PinsStatus) {
	if st == nil {
		return
	}
	fmt.Fprintf(w, "pins:     %d, %s locked of a %s budget\n", len(st.Pins), human(st.LockedBytes), human(st.BudgetBytes))
	for _, p := range st.Pins {
		if p.Held {
			fmt.Fprintf(w, "  %s: %d files, %s, %s locked\n", p.Path, p.Files, human(p.Bytes), human(p.LockedBytes))
		} else {
			fmt.Fprintf(w, "  %s: %s\n", p.Path, p.State)
		}
	}
	fmt.Fprintf(w, "  gpu: %s\n", st.GPUNote)
	if len(st.Kept) > 0 {
		fmt.Fprintf(w, "  kept here (made local, not locked): %s\n", strings.Join(st.Kept, ", "))
	}
	printHot(w, st.Hot)
}

// printHot says what the node made hot by itself (docs/design/pin.md, "Hot
// files").
func printHot(w io.Writer, h *node.HotStatus) {
	if h == nil {
		return
	}
	if h.BudgetBytes == 0 {
		fmt.Fprintf(w, "hot:      off (--hot-budget 0)\n")
		return
	}
	fmt.Fprintf(w, "hot:      %d files, %s locked of a %s budget (%d made", len(h.Files), human(h.LockedBytes), human(h.BudgetBytes), h.Made)
	for _, r := range slices.Sorted(maps.Keys(h.Evicted)) {
		fmt.Fprintf(w, ", %d released (%s)", h.Evicted[r], r)
	}
	fmt.Fprintf(w, ")\n")
	for _, f := range h.Files {
		fmt.Fprintf(w, "  %s: %s, %s locked, last loaded %s\n", f.Path, human(f.Bytes), human(f.LockedBytes), f.LastLoad.Local().Format(time.DateTime))
	}
	if h.LastSkip != "" {
		fmt.Fprintf(w, "  last not made hot: %s\n", h.LastSkip)
	}
}

func runPin(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "pin", "[--data DIR] [--json] PATH", `
Pins the namespace path PATH (a file, or a directory and everything under
it) in the running node: the packs holding its chunks are mapped and locked
in memory, and registered with the GPU of every device loader the node holds
(made by a client's GPU fill), so its fills copy straight from memory.
Locked memory is limited by the node's --pin-budget: a pin past it is
refused, and nothing of it is locked. Pinning again follows the path's
current version. The node records its pins in DATA/pins.json and pins them
again when it restarts. Needs a running node (kylix serve).

On a cluster member a pin also means "kept on this node": the chunks of
PATH not stored here are first fetched from the members (16 at a time,
each verified) into this node's packs, with a progress bar on a terminal,
and rebalance never drops them. If a chunk cannot be fetched, the pin
fails naming the file, and PATH is not pinned.
See docs/design/pin.md.`).withJSON()
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	var out node.PinReply
	if err := f.callProgress(ctx, node.OpPin, node.PathRequest{Path: f.Arg(0)}, &out); err != nil {
		return noNode(err, fmt.Sprintf("pin: no node serves %s: pins are held by a running node (start one with kylix serve)", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	fetched := ""
	if out.Cluster {
		fetched = fmt.Sprintf("; %s fetched from the members into this node's packs first", human(out.FetchedBytes))
	}
	fmt.Fprintf(e.stdout, "pinned %s: %d files, %s, %s locked in memory (node: %s of %s budget used)%s\ngpu: %s\n",
		out.Path, out.Files, human(out.Bytes), human(out.LockedBytes), human(out.UsedBytes), human(out.BudgetBytes), fetched, out.GPUNote)
	return nil
}

func runUnpin(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "unpin", "[--data DIR] PATH", `
Releases the pin of PATH (as given to kylix pin): its memory is unlocked and
unregistered from the GPU, and the record no longer lists it. For a file
made local by KYLIX_IOC_MAKE_LOCAL on a cluster member (kylix node lists
them as kept), it ends the keep: rebalance may drop its chunks again. Without a
running node it only removes PATH from the record DATA/pins.json.`)
	if err := f.parse(args, 1, 1); err != nil {
		return err
	}
	var out node.UnpinReply
	err := f.call(ctx, node.OpUnpin, node.PathRequest{Path: f.Arg(0)}, &out, nil)
	switch {
	case err == nil && out.Kept:
		fmt.Fprintf(e.stdout, "%s is no longer kept on this node: rebalance may drop the chunks KYLIX_IOC_MAKE_LOCAL stored (reads fetch them again)\n", out.Path)
		return nil
	case err == nil:
		fmt.Fprintf(e.stdout, "unpinned %s (node: %s of %s budget used)\n", out.Path, human(out.LockedBytes), human(out.BudgetBytes))
		return nil
	case !errors.Is(err, node.ErrNoNode):
		return err
	}
	// No node: the record is changed under the store's lock, so no node
	// writes it meanwhile.
	s, err := f.openLocal()
	if err != nil {
		return err
	}
	defer s.Close()
	rec, err := node.UnpinRecorded(s.Dir(), f.Arg(0))
	if err != nil {
		return err
	}
	clean, _ := chunkstore.CleanPath(f.Arg(0))
	fmt.Fprintf(e.stdout, "removed the pin of %s from %s (no node runs)\n", node.ShownPath(clean), rec)
	return nil
}

func printPinned(w io.Writer, pinned bool, note, gpu string) {
	switch {
	case pinned:
		fmt.Fprintf(w, "pinned:   yes (%s)\n", note)
		if gpu != "" {
			fmt.Fprintf(w, "          %s\n", gpu)
		}
	case note != "":
		fmt.Fprintf(w, "pinned:   no (%s)\n", note)
	default:
		fmt.Fprintf(w, "pinned:   no\n")
	}
}

// pinDoctor is kylix doctor's line about pins: how much a node run as this
// user could lock (RLIMIT_MEMLOCK, or CAP_IPC_LOCK that lifts it).
func pinDoctor() (string, bool, string) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return "pins", false, fmt.Sprintf("RLIMIT_MEMLOCK unknown: %v", err)
	}
	if gpuio.HasCapIPCLock() || rl.Cur == unix.RLIM_INFINITY {
		return "pins", true, fmt.Sprintf("memory locking is not limited (CAP_IPC_LOCK or RLIMIT_MEMLOCK unlimited): kylix pin can lock up to the node's --pin-budget (default %s of memory), hot files up to its --hot-budget (default %s)", node.DefaultPinBudget, node.DefaultHotBudget)
	}
	return "pins", false, fmt.Sprintf("RLIMIT_MEMLOCK is %s and there is no CAP_IPC_LOCK: a node run like this can pin at most that much, and makes no file hot past it (GPU loads then copy through bounce buffers); raise it (ulimit -l, LimitMEMLOCK=) or run the node as root", human(int64(rl.Cur)))
}
