package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

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
	fsys  *kfs.FS
	mount string
	start time.Time
}

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[--data DIR] [--mount DIR] [--reserve SIZE|PERCENT] [--no-passthrough] [--debug]", `
Runs a node: opens the store, mounts its namespace at the mount point, and
serves the admin socket DATA/kylix.sock. While the node runs, the other
commands (import, export, ls, stat, df, verify, gc, rm) given the same data
directory are forwarded to it through the socket and run against its open
store; the mount shows their changes.

Files in the mount are read-mostly: each file is an immutable version; a
file written in the mount becomes a new version when its last writer closes
it (or on fsync). Large files with a pack of their own are served by FUSE
passthrough, the rest by the node (see docs/design/fs.md).

Writers through the mount whose uid is not 0 cannot use the last
--reserve of the data directory's file system (default 5%, as ext4 keeps
for root); a write, close or fsync whose version cannot be committed fails
with ENOSPC (or EIO) and the file keeps its last committed version (see
docs/design/space.md).

Default mount point: `+strings.ReplaceAll(defaultMountDoc, "\n", " ")+`.
Stop the node with Ctrl-C or SIGTERM: it commits open writes and unmounts.
A mount left by a node killed with kill -9 is cleared at the next start.`)
	mnt := f.String("mount", e.defaultMountDir(), "mount point (env KYLIX_MOUNT)")
	noPT := f.Bool("no-passthrough", false, "serve every file through the node, never FUSE passthrough")
	debug := f.Bool("debug", false, "log every FUSE request")
	reserveFlag := f.String("reserve", fmt.Sprintf("%d%%", kfs.DefaultReservePercent),
		"free space kept from writers through the mount whose uid is not 0: a size (2GiB) or a share of the data file system (5%)")
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	reserve, err := kfs.ParseReserve(*reserveFlag)
	if err != nil {
		return fmt.Errorf("serve: --%w", err)
	}
	if e.store != nil {
		return fmt.Errorf("serve: a node already runs for this data directory")
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// KYLIX_CPUPROFILE=FILE writes a CPU profile of the node (benchmarks).
	if p := e.getenv("KYLIX_CPUPROFILE"); p != "" {
		if pf, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(pf)
			defer func() { pprof.StopCPUProfile(); pf.Close() }()
		}
	}
	s, err := chunkstore.Open(chunkstore.Options{Dir: f.data, Logger: log})
	if errors.Is(err, chunkstore.ErrLocked) {
		return fmt.Errorf("serve: %w (is a node already running? see %s)", err, filepath.Join(f.data, socketName))
	}
	if err != nil {
		return err
	}
	defer s.Close()
	fsys, err := kfs.New(s, kfs.Options{Logger: log, NoPassthrough: *noPT, Debug: *debug, Reserve: &reserve})
	if err != nil {
		return err
	}
	mountDir, err := filepath.Abs(*mnt)
	if err != nil {
		return err
	}
	if cleared, err := kfs.ClearStaleMount(mountDir); err != nil {
		return err
	} else if cleared {
		log.Warn("cleared a stale mount left by a node that did not stop cleanly", "mount", mountDir)
	}
	if err := fsys.Mount(mountDir); err != nil {
		return err
	}
	runningNode.fsys, runningNode.mount, runningNode.start = fsys, mountDir, time.Now()
	admin, err := listenAdmin(s, fsys, log)
	if err != nil {
		fsys.Unmount()
		return err
	}
	unmounted := make(chan struct{})
	go func() { fsys.Wait(); close(unmounted) }()
	fmt.Fprintf(e.stdout, "kylix: node %d serving %s at %s\n  admin socket: %s\n  stop: Ctrl-C or kill %d\n",
		os.Getpid(), s.Dir(), mountDir, admin.path, os.Getpid())
	select {
	case <-ctx.Done():
		log.Info("stopping", "mount", mountDir)
	case <-unmounted:
		log.Warn("the mount went away (unmounted from outside); stopping", "mount", mountDir)
	}
	admin.close()
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
	if f.jsonOut {
		return f.printJSON(out)
	}
	st := out.FS
	fmt.Fprintf(e.stdout, "node:     pid %d, up %s\ndata dir: %s\nmount:    %s\nmemory:   %s resident, %s Go heap\nopens:    %d by passthrough, %d by the node (%d reads, %s)\ncommits:  %d files in %d batches\n",
		out.PID, time.Since(out.Started).Round(time.Second), out.DataDir, out.Mount, human(out.RSSBytes), human(out.HeapBytes),
		st.PassthroughOpens, st.DaemonOpens, st.DaemonReads, human(st.DaemonReadBytes), st.Commits, st.CommitBatches)
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
