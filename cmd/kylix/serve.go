package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "serve", summary: "run a node: mount the namespace and serve the admin socket", run: runServe})
	register(&command{name: "node", summary: "show the running node: mount point, what the mount served, memory", run: runNode})
}

const defaultMountDoc = `$KYLIX_MOUNT if set; else /mnt/kylix when run as root; else
$XDG_RUNTIME_DIR/kylix (/tmp/kylix-UID without XDG_RUNTIME_DIR)`

func (e *env) defaultMountDir() string {
	if d := e.getenv("KYLIX_MOUNT"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/mnt/kylix"
	}
	if d := e.getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kylix")
	}
	return fmt.Sprintf("/tmp/kylix-%d", os.Geteuid())
}

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[--config FILE] [--data DIR] [--mount DIR] [--client-socket PATH|none] [--gpu-idle D] [--reserve SIZE|PERCENT] [--no-passthrough] [--read-only] [--scrub-rate BYTES] [--pin-budget SIZE|PERCENT] [--hot-budget SIZE|PERCENT] [--whole-budget SIZE|PERCENT] [--metrics ADDR] [--debug] [--stop-timeout D] [--listen HOST:PORT --cluster-key FILE [--join HOST:PORT,...]]", `
Runs a node: opens the store, mounts its namespace at the mount point, and
serves the admin socket DATA/kylix.sock. While the node runs, the other
commands (import, export, ls, stat, df, verify, gc, rm) given the same data
directory are forwarded to it through the socket and run against its open
store; the mount shows their changes.

Files in the mount are read-mostly: each file is an immutable version; a
file written in the mount becomes a new version when its last writer closes
it (or on fsync). Large files with a pack of their own are served by FUSE
passthrough, the rest by the node (see docs/design/fs.md). A pack is proven
before its first passthrough open after each boot or change of the pack:
hashed whole in the background (a file's first opens are served by the
node meanwhile, which hashes every chunk it reads; a read of every chunk
counts as the check), and a background scrub re-hashes those packs at
--scrub-rate (default 64 MiB/s; docs/design/verification.md).

Writers through the mount whose uid is not 0 cannot use the last
--reserve of the data directory's file system (default 5%, as ext4 keeps
for root); a write, close or fsync whose version cannot be committed fails
with ENOSPC (or EIO) and the file keeps its last committed version (see
docs/design/space.md).

Any local process may connect to the client socket (--client-socket):
given an fd it opened on a file of the mount, the node hands it read-only
fds of the file's verified whole-file pack, or reads the file into the
process's GPU memory (CUDA IPC); the GPU context is given back after
--gpu-idle without such a fill (docs/design/client.md).

Paths pinned with kylix pin stay locked in memory, within --pin-budget
(default 50% of physical memory), registered with the node's GPU loaders, and
are pinned again when the node restarts (docs/design/pin.md). A file a GPU
load read from the page cache is made hot: its pages are locked and
registered the same way, so the next load copies it straight from them,
within --hot-budget (default 25% of physical memory, counted in the pin
budget too), released least recently loaded first, when a pin needs the
memory, when less than 10% of memory is available, or after 30 minutes
without a load.

A file of 16 MiB or more that the mount serves through the node because no
pack holds exactly its bytes (a fine-tune deduplicated against its base)
is given a pack of its own after its second such open, so its later opens
are passthrough, within --whole-budget of bytes stored twice (default 10%
of the data file system); the least recently opened copies are dropped
to make room (docs/design/whole.md).

Default mount point: `+strings.ReplaceAll(defaultMountDoc, "\n", " ")+`.
Stop the node with Ctrl-C or SIGTERM: it commits open writes and unmounts.
If that takes longer than --stop-timeout (a commit or a request that does not
end), the node detaches the mount and exits anyway; a second signal exits at
once. The store is crash-safe, so nothing committed is lost either way.
A mount left by a node killed with kill -9 is cleared at the next start.
The mount point may not be inside the data directory, nor the data directory
inside the mount point.

Every flag below may instead be set in a TOML file given by --config FILE
(or $KYLIX_CONFIG; by default none is read): each key is a flag's name
without the dashes (listen = "10.0.0.2:7946", join = ["10.0.0.1:7946"],
cluster-key = "/etc/kylix/cluster.key", replicas = 2, failure-grace = "30s").
A flag on the command line wins over the file, the file over environment
variables and defaults. A key that is no flag is an error, and so is a
value of the wrong type. Relative paths in the file are taken from the
file's directory. The file must not be writable by every user (as root:
owned by root); the cluster key stays in its own file, which the file
names. Example and details: docs/examples/kylix.toml, docs/design/peers.md.`)
	configFlag := f.String("config", "", "read settings from this TOML `FILE` (keys: these flags' names; the command line wins; default $"+configEnv+", else none)")
	mnt := f.String("mount", e.defaultMountDir(), "mount point (env KYLIX_MOUNT)")
	noPT := f.Bool("no-passthrough", false, "serve every file through the node, never FUSE passthrough")
	readOnly := f.Bool("read-only", false, "mount read-only, with no round trip to the node to open or close a file: fastest for many small files (no writes, no passthrough; docs/design/fs.md)")
	debug := f.Bool("debug", false, "log every FUSE request")
	logLevel := f.String("log-level", "info", "least severe log messages written: debug, info, warn or error (debug adds timings of GPU copies)")
	stopTimeout := f.Duration("stop-timeout", node.DefaultStopTimeout, "on SIGTERM, exit after this long even if open writes or requests have not finished")
	scrubRate := f.Int64("scrub-rate", chunkstore.DefaultScrubRate,
		"bytes per second the background scrub re-reads packs served by passthrough (0: no scrub; docs/design/verification.md)")
	clientSock := f.String("client-socket", "", "path of the client socket any local user may connect to (docs/design/client.md); default /run/kylix/MOUNT.sock as root, else under $XDG_RUNTIME_DIR/kylix or /tmp/kylix-UID; \"none\": no client socket")
	gpuIdle := f.Duration("gpu-idle", node.DefaultGPUIdle, "give a GPU's CUDA context back after this long without a client's GPU fill")
	reserveFlag := f.String("reserve", fmt.Sprintf("%d%%", kfs.DefaultReservePercent),
		"free space kept from writers through the mount whose uid is not 0: a size (2GiB) or a share of the data file system (5%)")
	pinBudget := f.String("pin-budget", node.DefaultPinBudget, "most memory pins may lock (kylix pin): a size (64GiB) or a share of physical memory (50%); 0: no pins")
	hotBudget := f.String("hot-budget", node.DefaultHotBudget, "most memory the node may lock by itself for files GPU loads read from the page cache (hot files, registered for the next load): a size or a share of physical memory; 0: none")
	wholeBudget := f.String("whole-budget", node.DefaultWholeBudget, "most disk whole copies of deduplicated files may store a second time, so the mount serves them by passthrough: a size or a share of the data file system; 0: none")
	metricsAddr := f.String("metrics", "", "serve Prometheus metrics over HTTP at this address, e.g. 127.0.0.1:9477 (port 0: any free port; default: off). They name no paths, but anyone who can reach the address can read them")
	pf := addPeerFlags(f)
	kvf := addKVFlags(f)
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	var fromConfig []string
	if p := configPath(f, *configFlag); p != "" {
		var err error
		if fromConfig, err = applyConfig(f, p); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	reserve, err := kfs.ParseReserve(*reserveFlag)
	if err != nil {
		return fmt.Errorf("serve: --%w", err)
	}
	budget, err := node.ParsePinBudget(*pinBudget)
	if err != nil {
		return fmt.Errorf("serve: --%w", err)
	}
	hot, err := node.ParseHotBudget(*hotBudget)
	if err != nil {
		return fmt.Errorf("serve: --%w", err)
	}
	whole, err := node.ParseWholeBudget(*wholeBudget, f.data)
	if err != nil {
		return fmt.Errorf("serve: --%w", err)
	}
	kv, err := kvf.config()
	if err != nil {
		return err
	}
	if e.node != nil {
		return fmt.Errorf("serve: a node already runs for this data directory")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("serve: --log-level %q: use debug, info, warn or error", *logLevel)
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	if len(fromConfig) > 0 {
		log.Info("settings from the config file", "file", configPath(f, *configFlag), "keys", strings.Join(fromConfig, ","))
	}
	// KYLIX_CPUPROFILE=FILE writes a CPU profile of the node (benchmarks).
	if p := e.getenv("KYLIX_CPUPROFILE"); p != "" {
		if pf, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(pf)
			defer func() { pprof.StopCPUProfile(); pf.Close() }()
		}
	}
	cluster, err := pf.config(f.data, log)
	if err != nil {
		return err
	}
	cfg := node.Config{
		DataDir: f.data, Mount: *mnt, ClientSocket: *clientSock, GPUIdle: *gpuIdle,
		NoPassthrough: *noPT, ReadOnly: *readOnly, Debug: *debug, Reserve: &reserve, ScrubRate: orNone(*scrubRate),
		PinBudget: orNone(budget), HotBudget: orNone(hot), WholeBudget: orNone(whole), Metrics: *metricsAddr, StopTimeout: *stopTimeout,
		Cluster: cluster, ReadAheadChunks: pf.readAheadChunks(), Exec: execInNode, KV: kv, ColdAfter: *pf.coldAfter, HighWatermark: int(orNone(int64(*pf.highWatermark))),
		Logger: log, Version: buildVersion().String(),
	}
	n, err := node.New(cfg)
	if err != nil {
		return err
	}
	var mounted string
	err = n.Run(ctx, func(r node.Ready) {
		mounted = r.Mount
		client := "  client socket: " + r.ClientSocket + "\n"
		if r.ClientSocket == "" {
			client = "  client socket: " + r.ClientNote + "\n"
		}
		metrics := "  metrics: off (--metrics ADDR)\n"
		if r.MetricsURL != "" {
			metrics = "  metrics: " + r.MetricsURL + "\n"
		}
		fmt.Fprintf(e.stdout, "kylix: node %d serving %s at %s\n  admin socket: %s\n%s%s  stop: Ctrl-C or kill %d\n",
			r.PID, r.DataDir, r.Mount, r.AdminSocket, client, metrics, r.PID)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "kylix: unmounted %s\n", mounted)
	return nil
}

func runNode(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "node", "[--data DIR] [--json] [--gc]", `
Shows the node serving the data directory: its pid, mount point, memory
(resident set and Go heap), and how many opens the mount served by
passthrough and by the node. Fails when no node runs.`).withJSON()
	gc := f.Bool("gc", false, "run the Go garbage collector first (for memory measurements)")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	var out node.NodeStatus
	if err := f.call(ctx, node.OpNode, node.NodeRequest{GC: *gc}, &out, nil); err != nil {
		if errors.Is(err, node.ErrNoNode) {
			return fmt.Errorf("no node serves %s (start one with kylix serve)", f.data)
		}
		return err
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	st := out.FS
	fmt.Fprintf(e.stdout, "node:     pid %d, up %s\ndata dir: %s\nmount:    %s\nmemory:   %s resident, %s Go heap\nopens:    %d by passthrough, %d by the node (%d reads, %s)\ncommits:  %d files in %d batches\n",
		out.PID, time.Since(out.Started).Round(time.Second), out.DataDir, out.Mount, human(out.RSSBytes), human(out.HeapBytes),
		st.PassthroughOpens, st.DaemonOpens, st.DaemonReads, human(st.DaemonReadBytes), st.Commits, st.CommitBatches)
	pc := out.PackChecks
	fmt.Fprintf(e.stdout, "checks:   %d packs passed, %d failed before passthrough (%s hashed); %d opens refused; scrub: %d passes, %s, %d packs failed\n",
		pc.Verified, pc.Failed, human(pc.Bytes), st.PassthroughRefused, pc.ScrubPasses, human(pc.ScrubBytes), pc.ScrubFailed)
	if cs := out.Clients; cs != nil {
		fmt.Fprintf(e.stdout, "clients:  %s: %d connected (%d since start), %d requests, %d refused, %d pack fds handed out, %d GPU fills (%s)\n",
			cs.Socket, cs.Connected, cs.Accepted, cs.Requests, cs.Refused, cs.PackFds, cs.Fills, human(cs.FillBytes))
		if len(cs.GPU) == 0 {
			fmt.Fprintf(e.stdout, "gpu:      no CUDA context held\n")
		}
		for _, g := range cs.GPU {
			fmt.Fprintf(e.stdout, "gpu:      cuda:%d: CUDA context held (path %s), loader %s of GPU memory, device %s free of %s, %d fills, %d in flight\n",
				g.Device, g.Path, human(g.LoaderBytes), human(g.DeviceFree), human(g.DeviceTotal), g.Fills, g.Active)
		}
		for _, p := range cs.ByProcess {
			var devs []string
			for _, d := range p.Devices {
				devs = append(devs, fmt.Sprintf("cuda:%d", d))
			}
			fmt.Fprintf(e.stdout, "filled:   pid %d (uid %d) on %s: %d fills, %s placed, %s read from packs\n",
				p.PID, p.UID, strings.Join(devs, ","), p.Fills, human(p.Bytes), human(p.ReadBytes))
		}
	}
	printPins(e.stdout, out.Pins)
	if w := out.Whole; w != nil {
		if w.BudgetBytes == 0 {
			fmt.Fprintf(e.stdout, "whole:    off (%s)\n", cmp.Or(w.Off, "--whole-budget 0"))
		} else {
			fmt.Fprintf(e.stdout, "whole:    %d copies, %s stored twice of a %s budget (%d made, %d not made, %d dropped since start)\n",
				w.Copies, human(w.StoredBytes), human(w.BudgetBytes), w.Made, w.NotMade, w.Dropped)
		}
		if w.LastNotMade != "" {
			fmt.Fprintf(e.stdout, "  last not made: %s\n", w.LastNotMade)
		}
	}
	if w := out.Watermark; w != nil {
		fmt.Fprintf(e.stdout, "watermark: %d%% (disk %.1f%% used); released %d kept files (%s of copies owned elsewhere), %d gc runs freed %s\n",
			w.HighPercent, w.UsedPercent, w.Released, human(w.ReleasedBytes), w.GCs, human(w.GCFreed))
		if len(w.Recent) > 0 {
			fmt.Fprintf(e.stdout, "  released lately: %s\n", strings.Join(w.Recent, ", "))
		}
		if w.LastError != "" {
			fmt.Fprintf(e.stdout, "  last error: %s\n", w.LastError)
		}
	}
	return nil
}
