package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
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

// runningNode is the node this process serves, for in-node commands.
var runningNode struct {
	fsys    *kfs.FS
	mount   string
	start   time.Time
	client  *clientServer
	metrics *nodeMetrics
	pins    *nodePins
}

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[--config FILE] [--data DIR] [--mount DIR] [--client-socket PATH|none] [--gpu-idle D] [--reserve SIZE|PERCENT] [--no-passthrough] [--scrub-rate BYTES] [--pin-budget SIZE|PERCENT] [--metrics ADDR] [--debug] [--stop-timeout D] [--listen HOST:PORT --cluster-key FILE [--join HOST:PORT,...]]", `
Runs a node: opens the store, mounts its namespace at the mount point, and
serves the admin socket DATA/kylix.sock. While the node runs, the other
commands (import, export, ls, stat, df, verify, gc, rm) given the same data
directory are forwarded to it through the socket and run against its open
store; the mount shows their changes.

Files in the mount are read-mostly: each file is an immutable version; a
file written in the mount becomes a new version when its last writer closes
it (or on fsync). Large files with a pack of their own are served by FUSE
passthrough, the rest by the node (see docs/design/fs.md). A pack is hashed
whole before its first passthrough open after each boot or change of the
pack, and a background scrub re-hashes those packs at --scrub-rate
(default 64 MiB/s; docs/design/verification.md).

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
are pinned again when the node restarts (docs/design/pin.md).

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
	debug := f.Bool("debug", false, "log every FUSE request")
	stopTimeout := f.Duration("stop-timeout", defaultStopTimeout, "on SIGTERM, exit after this long even if open writes or requests have not finished")
	scrubRate := f.Int64("scrub-rate", chunkstore.DefaultScrubRate,
		"bytes per second the background scrub re-reads packs served by passthrough (0: no scrub; docs/design/verification.md)")
	clientSock := f.String("client-socket", "", "path of the client socket any local user may connect to (docs/design/client.md); default /run/kylix/MOUNT.sock as root, else under $XDG_RUNTIME_DIR/kylix or /tmp/kylix-UID; \"none\": no client socket")
	gpuIdle := f.Duration("gpu-idle", defaultGPUIdle, "give a GPU's CUDA context back after this long without a client's GPU fill")
	reserveFlag := f.String("reserve", fmt.Sprintf("%d%%", kfs.DefaultReservePercent),
		"free space kept from writers through the mount whose uid is not 0: a size (2GiB) or a share of the data file system (5%)")
	pinBudget := pinBudgetFlag(f)
	metricsAddr := metricsFlag(f)
	pf := addPeerFlags(f)
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
	if e.store != nil {
		return fmt.Errorf("serve: a node already runs for this data directory")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
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
	mountDir, err := filepath.Abs(*mnt)
	if err != nil {
		return err
	}
	if err := checkMountOutsideData(f.data, mountDir); err != nil {
		return err
	}
	fetcher, err := pf.fetcher(f.data, log)
	if err != nil {
		return err
	}
	s, err := chunkstore.Open(chunkstore.Options{Dir: f.data, Logger: log, Fetcher: fetcher, ReadAheadChunks: pf.readAheadChunks()})
	if errors.Is(err, chunkstore.ErrLocked) {
		return fmt.Errorf("serve: %w (is a node already running? see %s)", err, filepath.Join(f.data, socketName))
	}
	if err != nil {
		return err
	}
	// stopped ends the stop watchdog; closed after the store (defers run
	// last-in first-out), so the watchdog covers closing the store too.
	stopped := make(chan struct{})
	defer close(stopped)
	defer s.Close()
	if runningNode.pins, err = startPins(s, *pinBudget, log); err != nil {
		return err
	}
	defer runningNode.pins.close()
	sockPath := *clientSock
	switch sockPath {
	case "":
		sockPath = e.defaultClientSocket(mountDir)
	case "none":
		sockPath = ""
	default:
		if sockPath, err = filepath.Abs(sockPath); err != nil {
			return err
		}
	}
	// The client socket listens before the mount exists, so the path the
	// mount reports (KYLIX_IOC_PROBE) is one where a node listens; requests
	// are served once the mount is up.
	var client *clientServer
	clientLine := "  client socket: none\n"
	if sockPath != "" {
		client, err = listenClient(sockPath, f.data, log)
		switch {
		case err != nil && *clientSock != "":
			return err
		case err != nil:
			// The default place may be unusable (a read-only /run): a node
			// without a client socket still serves its mount.
			log.Warn("no client socket; choose a path with --client-socket", "err", err)
			clientLine = fmt.Sprintf("  client socket: none (%v)\n", err)
			sockPath = ""
		default:
			defer client.close() // on early returns; idempotent
			clientLine = "  client socket: " + client.path + "\n"
		}
	}
	var keepLocal func(string) error
	if pf.node != nil { // a cluster member: MAKE_LOCAL's chunks are kept from rebalance (pin.go)
		keepLocal = runningNode.pins.keepLocal
	}
	fsys, err := kfs.New(s, kfs.Options{Logger: log, NoPassthrough: *noPT, Debug: *debug, ScrubRate: max(0, *scrubRate), Reserve: &reserve, ClientSocket: sockPath,
		KeepLocal: keepLocal})
	if err != nil {
		return err
	}
	if runningNode.metrics, err = startMetrics(*metricsAddr, s, fsys, client, log); err != nil {
		return err
	}
	defer runningNode.metrics.close()
	clientLine += runningNode.metrics.line()
	if cleared, err := kfs.ClearStaleMount(mountDir); err != nil {
		return err
	} else if cleared {
		log.Warn("cleared a stale mount left by a node that did not stop cleanly", "mount", mountDir)
	}
	if err := fsys.Mount(mountDir); err != nil {
		return err
	}
	runningNode.fsys, runningNode.mount, runningNode.start = fsys, mountDir, time.Now()
	// The scrub re-hashes the packs handed out for passthrough; it stops
	// with the node.
	scrubCtx, stopScrub := context.WithCancel(ctx)
	scrubDone := make(chan struct{})
	go func() { s.RunScrub(scrubCtx, *scrubRate); close(scrubDone) }()
	recheckDone := make(chan struct{}) // pinned memory, at the same rate (pin.go)
	go func() { runningNode.pins.recheckLoop(scrubCtx, *scrubRate); close(recheckDone) }()
	defer func() { stopScrub(); <-scrubDone; <-recheckDone }() // before the store closes
	stopPeers, err := pf.start(s, fsys)
	if err != nil {
		fsys.Unmount()
		return err
	}
	defer stopPeers()
	if pf.node != nil {
		// Recorded pins missing chunks here are fetched from the members
		// (pin.go); it stops before the membership does.
		fetchCtx, stopFetch := context.WithCancel(ctx)
		fetched := make(chan struct{})
		go func() { runningNode.pins.fetchMissing(fetchCtx, pf.node); close(fetched) }()
		defer func() { stopFetch(); <-fetched }()
	}
	admin, err := listenAdmin(s, fsys, log)
	if err != nil {
		fsys.Unmount()
		return err
	}
	if client != nil {
		fill := newFillService(s, *gpuIdle, log)
		// The connections end first: no FILL runs when the loaders close.
		defer func() { client.close(); fill.close() }()
		client.serve(s, fsys, fill)
		runningNode.client = client
	}
	unmounted := make(chan struct{})
	go func() { fsys.Wait(); close(unmounted) }()
	fmt.Fprintf(e.stdout, "kylix: node %d serving %s at %s\n  admin socket: %s\n%s  stop: Ctrl-C or kill %d\n",
		os.Getpid(), s.Dir(), mountDir, admin.path, clientLine, os.Getpid())
	notifyReady(log, s.Dir(), mountDir) // systemd Type=notify (notify.go)
	select {
	case <-ctx.Done():
		log.Info("stopping", "mount", mountDir)
	case <-unmounted:
		log.Warn("the mount went away (unmounted from outside); stopping", "mount", mountDir)
	}
	notifyStopping(log, mountDir)
	go stopWatchdog(log, mountDir, *stopTimeout, stopped)
	admin.close()
	if runningNode.client != nil {
		runningNode.client.close()
	}
	if err := fsys.Unmount(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "kylix: unmounted %s\n", mountDir)
	return nil
}

type nodeOut struct {
	PID      int       `json:"pid"`
	DataDir  string    `json:"data_dir"`
	Mount    string    `json:"mount"`
	Started  time.Time `json:"started"`
	RSSBytes int64     `json:"rss_bytes"`
	// HeapBytes is the Go heap in use (runtime.MemStats.HeapInuse).
	HeapBytes int64     `json:"heap_bytes"`
	FS        kfs.Stats `json:"fs"`
	// PackChecks counts the pack checks before passthrough and the scrub
	// (docs/design/verification.md).
	PackChecks chunkstore.PackVerifyStats `json:"pack_checks"`
	// Clients is the client socket's activity (nil without one).
	Clients *clientStats `json:"clients,omitempty"`
	// Pins is the node's pins (docs/design/pin.md).
	Pins *pinsStatus `json:"pins,omitempty"`
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
	s, err := f.open()
	if err != nil {
		return err
	}
	defer s.Close()
	if e.store == nil || runningNode.fsys == nil {
		return fmt.Errorf("node: no node serves %s", s.Dir())
	}
	if *gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	out := nodeOut{PID: os.Getpid(), DataDir: s.Dir(), Mount: runningNode.mount, Started: runningNode.start,
		RSSBytes: rss(), HeapBytes: int64(ms.HeapInuse), FS: runningNode.fsys.Stats()}
	out.PackChecks = s.PackVerifyStats()
	if runningNode.client != nil {
		out.Clients = runningNode.client.stats()
	}
	out.Pins = runningNode.pins.status()
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
	return nil
}

// rss returns the process's resident set size from /proc/self/statm.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// defaultStopTimeout bounds a node's shutdown: committing what is being
// written and unmounting normally take well under a second.
const defaultStopTimeout = 10 * time.Second

// stopWatchdog ends the process if the shutdown has not finished (stopped
// closed) within timeout, or at once on a second SIGINT/SIGTERM. The orderly
// shutdown waits for commits, admin requests and the kernel; none of them
// may keep a node that was told to stop alive (issue 7: a read that never
// ended kept the process forever). Exiting is safe: the store is crash-safe
// (what is committed stays, working copies are dropped at the next start),
// and the mount is detached first so no dead mount stays behind.
func stopWatchdog(log *slog.Logger, mountDir string, timeout time.Duration, stopped <-chan struct{}) {
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-stopped:
		return
	case <-t.C:
		log.Error("stopping took too long; exiting without waiting for the rest (the store is crash-safe)", "timeout", timeout, "mount", mountDir)
	case <-again:
		log.Error("second signal; exiting now (the store is crash-safe)", "mount", mountDir)
	}
	if err := syscall.Unmount(mountDir, unix.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
		log.Warn("detaching the mount", "mount", mountDir, "err", err)
	}
	os.Exit(1)
}

// checkMountOutsideData refuses a mount point inside the data directory, or
// a data directory inside the mount point: the node would then read and
// write its own store through its own mount, and deadlocked doing so.
// Symbolic links are resolved as far as the paths exist.
func checkMountOutsideData(data, mount string) error {
	d, err := resolvePath(data)
	if err != nil {
		return fmt.Errorf("serve: data directory %s: %w", data, err)
	}
	m, err := resolvePath(mount)
	if err != nil {
		return fmt.Errorf("serve: mount point %s: %w", mount, err)
	}
	switch {
	case within(m, d):
		return fmt.Errorf("serve: the mount point %s is inside the data directory %s; the node would serve its own store through itself: choose a mount point outside it (--mount or KYLIX_MOUNT)", mount, data)
	case within(d, m):
		return fmt.Errorf("serve: the data directory %s is inside the mount point %s; the node would keep its store in its own mount: choose a data directory outside it (--data or KYLIX_DATA)", data, mount)
	}
	return nil
}

// resolvePath makes p absolute and resolves symbolic links in the longest
// part of it that exists (a mount point or data directory may not exist
// yet; a stale mount point cannot be resolved, its parent can).
func resolvePath(p string) (string, error) {
	p, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for cur := p; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p, nil
		}
		rest = append([]string{filepath.Base(cur)}, rest...)
		cur = parent
	}
}

// within reports whether path p is dir or below it.
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
