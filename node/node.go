package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/internal/connlimit"
	"github.com/kylix/kylix/internal/units"
	"github.com/kylix/kylix/node/kvstore"
	"github.com/kylix/kylix/peers"
)

// Defaults of Config's fields (a zero field means its default).
const (
	// DefaultStopTimeout bounds a node's shutdown: committing what is
	// being written and unmounting normally take well under a second.
	DefaultStopTimeout = 10 * time.Second
	// DefaultGPUIdle is how long the node keeps a device's context and
	// loader after its last client GPU fill.
	DefaultGPUIdle = 60 * time.Second
	// DefaultPinBudget is the share of physical memory pins may lock.
	DefaultPinBudget = "50%"
)

// Config is what a node serves and how. The zero value of every field
// means its documented default; where "none" must be said apart from the
// default, a negative value (or the word the field names) says it.
type Config struct {
	// DataDir is the store's directory (required). It is created, 0700,
	// if it does not exist.
	DataDir string
	// Mount is the mount point (required); it may not be inside DataDir,
	// nor DataDir inside it.
	Mount string
	// ClientSocket is the path of the client socket any local user may
	// connect to (docs/design/client.md). "" means DefaultClientSocket
	// (and a node that cannot listen there serves without one, saying
	// so); "none" means no client socket.
	ClientSocket string
	// GPUIdle: a GPU's CUDA context is given back after this long without
	// a client's GPU fill. Default DefaultGPUIdle.
	GPUIdle time.Duration
	// NoPassthrough serves every file through the node, never by FUSE
	// passthrough.
	NoPassthrough bool
	// ReadOnly mounts read-only with no OPEN, RELEASE or FLUSH round trips
	// (fs.Options.ReadOnly): for data sets of many small files a job only
	// reads. Imports and other store commands still change the namespace.
	ReadOnly bool
	// Debug logs every FUSE request.
	Debug bool
	// Reserve is the free space kept from writers through the mount whose
	// uid is not 0. nil means fs.DefaultReservePercent of the file system.
	Reserve *kfs.Reserve
	// ScrubRate is the bytes a second the background scrub re-reads packs
	// served by passthrough, and the pin recheck re-hashes pinned memory.
	// 0 means chunkstore.DefaultScrubRate; negative: no scrub.
	ScrubRate int64
	// PinBudget is the most memory pins may lock, in bytes. 0 means
	// DefaultPinBudget of physical memory; negative: no pins.
	PinBudget int64
	// HotBudget is the most memory the node may lock by itself for files
	// GPU loads read from the page cache (hot files, docs/design/pin.md),
	// in bytes, counted within PinBudget too. 0 means DefaultHotBudget of
	// physical memory; negative: none.
	HotBudget int64
	// WholeBudget is the most disk whole copies of deduplicated files may
	// store a second time (docs/design/whole.md), in bytes. 0 means
	// DefaultWholeBudget of the data file system; negative: none.
	WholeBudget int64
	// Metrics is the address to serve Prometheus metrics at over HTTP
	// ("": none; port 0: any free port). The registry exists either way:
	// kylix top reads it through the admin socket.
	Metrics string
	// StopTimeout bounds the shutdown after Run's context ends: past it
	// (or at a second SIGINT/SIGTERM) the mount is detached and the
	// process exits with status 1. Default DefaultStopTimeout; negative:
	// no watchdog (tests that run a node in-process).
	StopTimeout time.Duration
	// Cluster makes the node a cluster member (nil: a single node). The
	// node creates the member with it; Keep, if nil, is the pinned and
	// kept paths of the node's pin record.
	Cluster *peers.Config
	// ColdAfter moves the files nobody read for this long to the cold
	// tier (peers' MakeColdIdle; docs/design/erasure.md, "Tiers"), in a
	// cluster; 0: never.
	ColdAfter time.Duration
	// HighWatermark is the percent of the data file system in use past
	// which a cluster member releases the files made local here, least
	// recently read first (watermark.go); 0 means DefaultHighWatermark,
	// negative: never.
	HighWatermark int
	// ReadAheadChunks is chunkstore.Options.ReadAheadChunks (0: default,
	// negative: none).
	ReadAheadChunks int
	// KV is the KV-cache store (docs/design/kv.md; zero: none).
	KV KVConfig
	// Exec runs a store command (kylix import, ls, ...) forwarded through
	// the admin socket as a command line (ExecRequest), against this node;
	// nil: such requests are refused. cmd/kylix sets it.
	Exec ExecFunc
	// Logger receives what the node does (default: discard).
	Logger *slog.Logger
	// Version is the software version the node reports.
	Version string
}

// Ready is what a node says once it serves (Run's onReady).
type Ready struct {
	PID          int
	DataDir      string
	Mount        string
	AdminSocket  string
	ClientSocket string // "" without one
	// ClientNote says why there is no client socket ("" when there is).
	ClientNote string
	MetricsURL string // "" without --metrics
}

// Node is a running Kylix node: the store, its mount, the admin and
// client sockets, pins, GPU fills, metrics and, in a cluster, the
// membership. New prepares it, Run serves until its context ends, Close
// releases what is left.
type Node struct {
	cfg  Config
	log  *slog.Logger
	s    *chunkstore.Store
	fsys *kfs.FS
	// claimedBy is fsys once made: the peer cache, made before it, asks
	// it for the space writes have set aside (peers.Config.CacheClaimed).
	claimedBy atomic.Pointer[kfs.FS]
	pins      *nodePins
	whole     *wholeCopies
	wm        watermark // the high watermark (watermark.go)
	peers     *peers.Node
	admin     *adminServer
	// client is nil without a client socket.
	client     *clientServer
	clientNote string
	fill       *fillService
	kv         *kvstore.Store            // nil without Config.KV
	kvm        atomic.Pointer[kvMembers] // the KV store's members tier, once serving in a cluster
	metrics    *nodeMetrics
	mount      string
	start      time.Time

	closeOnce sync.Once
	closers   []func() // run in reverse by Close
}

// New opens the store of cfg.DataDir, starts listening on the admin
// socket (requests wait until Run has mounted), and prepares the rest. A
// node already serving DataDir is an error.
func New(cfg Config) (*Node, error) {
	var err error
	if cfg.DataDir == "" || cfg.Mount == "" {
		return nil, errors.New("serve: a data directory and a mount point are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.GPUIdle <= 0 {
		cfg.GPUIdle = DefaultGPUIdle
	}
	switch {
	case cfg.ScrubRate == 0:
		cfg.ScrubRate = chunkstore.DefaultScrubRate
	case cfg.ScrubRate < 0:
		cfg.ScrubRate = 0
	}
	if cfg.PinBudget == 0 {
		if cfg.PinBudget, err = ParsePinBudget(DefaultPinBudget); err != nil {
			return nil, err
		}
	} else if cfg.PinBudget < 0 {
		cfg.PinBudget = 0
	}
	if cfg.HotBudget == 0 {
		if cfg.HotBudget, err = ParseHotBudget(DefaultHotBudget); err != nil {
			return nil, err
		}
	} else if cfg.HotBudget < 0 {
		cfg.HotBudget = 0
	}
	if cfg.Reserve == nil {
		r, err := kfs.ParseReserve(fmt.Sprintf("%d%%", kfs.DefaultReservePercent))
		if err != nil {
			return nil, err
		}
		cfg.Reserve = &r
	}
	data, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	mountDir, err := filepath.Abs(cfg.Mount)
	if err != nil {
		return nil, err
	}
	cfg.DataDir, cfg.Mount = data, mountDir
	if err := checkMountOutsideData(data, mountDir); err != nil {
		return nil, err
	}
	// Every descriptor the limit allows, so that the caps on what others
	// may hold (a quarter each: connlimit.Share) leave a reserve for the
	// mount and the admin socket (docs/design/client.md, "Limits").
	if lim, err := connlimit.RaiseNoFile(); err != nil {
		cfg.Logger.Warn("raising RLIMIT_NOFILE to its hard limit failed", "soft", lim, "err", err)
	} else {
		cfg.Logger.Debug("descriptors", "rlimit_nofile", lim)
	}
	n := &Node{cfg: cfg, log: cfg.Logger, mount: mountDir}
	ok := false
	defer func() {
		if !ok {
			n.Close()
		}
	}()
	// The admin socket listens before the store is opened (and locked):
	// a command that finds the store locked and no socket answering knows
	// it is not a node that holds it (admin.go).
	if n.admin, err = listenAdmin(n, data); err != nil {
		return nil, err
	}
	n.onClose(n.admin.close)
	var fetcher chunkstore.Fetcher = chunkstore.LocalOnly{}
	if cfg.Cluster != nil {
		pc := *cfg.Cluster
		pc.CacheMinFree = units.SizeOrPercent(*cfg.Reserve) // the peer cache leaves the mount's reserve free (peers/cache.go)
		// ...and what writes through the mount have set aside (its
		// writers must not take room a commit was promised).
		pc.CacheClaimed = func() int64 {
			if f := n.claimedBy.Load(); f != nil {
				return f.SpaceClaimed()
			}
			return 0
		}
		if pc.Keep == nil {
			pc.Keep = func() ([]string, error) { return recordedPaths(data) }
		}
		if pc.Logger == nil {
			pc.Logger = cfg.Logger
		}
		if n.peers, err = peers.New(pc); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		fetcher = n.peers
	}
	n.s, err = chunkstore.Open(chunkstore.Options{Dir: data, Logger: cfg.Logger, Fetcher: fetcher, ReadAheadChunks: cfg.ReadAheadChunks})
	if errors.Is(err, chunkstore.ErrLocked) {
		return nil, fmt.Errorf("serve: %w (is another kylix command using it?)", err)
	}
	if err != nil {
		return nil, err
	}
	n.onClose(func() { n.s.Close() })
	if n.pins, err = startPins(n.s, cfg.PinBudget, cfg.HotBudget, cfg.Logger); err != nil {
		return nil, err
	}
	n.onClose(n.pins.close)
	// A GC that moved pinned chunks (kylix gc, the high watermark's)
	// removed packs the pins still map: they follow (pins.go).
	n.s.SetAfterGC(func(ctx context.Context) {
		if moved := n.pins.followMoved(ctx); len(moved) > 0 {
			n.log.Info("pins locked again where gc moved their chunks (the removed packs' room given back)", "pins", moved)
		}
	})
	n.onClose(func() { n.s.SetAfterGC(nil) })
	if n.kv, err = openKV(cfg.KV, data, cfg.Logger); err != nil {
		return nil, err
	}
	if n.kv != nil {
		n.onClose(n.kv.Close)
	}
	if err := n.listenClient(); err != nil {
		return nil, err
	}
	var keepLocal func(string) error
	var makeRoom func(int64) int64
	if n.peers != nil { // a cluster member: MAKE_LOCAL's chunks are kept from rebalance (pins.go)
		keepLocal = n.pins.keepLocal
		makeRoom = n.peers.FreePeerCache // writes through the mount before copies of others' chunks
	}
	sockPath := ""
	if n.client != nil {
		sockPath = n.client.path
	}
	if cfg.WholeBudget == 0 {
		if cfg.WholeBudget, err = ParseWholeBudget(DefaultWholeBudget, n.s.Dir()); err != nil {
			return nil, err
		}
	}
	wholeCtx, stopWhole := context.WithCancel(context.Background())
	wholeOff := ""
	switch {
	case cfg.NoPassthrough:
		// A whole copy is made so that the mount can serve the file by
		// passthrough: with passthrough off it would only cost disk.
		cfg.WholeBudget, wholeOff = -1, "--no-passthrough: a whole copy is only good for passthrough opens"
	case cfg.WholeBudget < 0:
		wholeOff = "--whole-budget 0"
	}
	n.whole = startWhole(wholeCtx, n.s, max(0, cfg.WholeBudget), wholeOff, cfg.Logger)
	n.onClose(func() { stopWhole(); n.whole.close() })
	n.fsys, err = kfs.New(n.s, kfs.Options{Logger: cfg.Logger, NoPassthrough: cfg.NoPassthrough, ReadOnly: cfg.ReadOnly, Debug: cfg.Debug,
		ScrubRate: cfg.ScrubRate, Reserve: cfg.Reserve, ClientSocket: sockPath, KeepLocal: keepLocal, MakeRoom: makeRoom,
		OpenedForRead: n.whole.opened})
	if err != nil {
		return nil, err
	}
	n.whole.changed = n.fsys.PassthroughChanged
	n.claimedBy.Store(n.fsys)
	if n.metrics, err = startMetrics(cfg.Metrics, n.s, n.fsys, n.client, cfg.Logger); err != nil {
		return nil, err
	}
	n.onClose(n.metrics.close)
	n.metrics.reg.MustRegister(&peersCollector{n.Peers})
	n.metrics.reg.MustRegister(&pinsCollector{n.pins, n.whole})
	if n.kv != nil {
		n.metrics.reg.MustRegister(&kvCollector{n.kv, func() *KVMemberStats { return n.kvm.Load().stats() }})
	}
	ok = true
	return n, nil
}

// listenClient makes the client socket of cfg.ClientSocket. The client
// socket listens before the mount exists, so the path the mount reports
// (KYLIX_IOC_PROBE) is one where a node listens; requests are served once
// the mount is up.
func (n *Node) listenClient() error {
	path := n.cfg.ClientSocket
	switch path {
	case "none":
		n.clientNote = "none"
		return nil
	case "":
		path = DefaultClientSocket(n.mount, os.Getenv)
	}
	c, err := listenClient(path, n.cfg.DataDir, n.log)
	switch {
	case err != nil && n.cfg.ClientSocket != "":
		return err
	case err != nil:
		// The default place may be unusable (a read-only /run): a node
		// without a client socket still serves its mount.
		n.log.Warn("no client socket; choose a path with --client-socket", "err", err)
		n.clientNote = fmt.Sprintf("none (%v)", err)
		return nil
	}
	n.client = c
	n.onClose(c.close) // idempotent
	return nil
}

func (n *Node) onClose(f func()) { n.closers = append(n.closers, f) }

// Close releases everything New and Run left: sockets, pins, the store.
// It is idempotent; Run calls it when it returns.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		for i := len(n.closers) - 1; i >= 0; i-- {
			n.closers[i]()
		}
	})
}

// Store is the node's open store.
func (n *Node) Store() *chunkstore.Store { return n.s }

// Peers is the node's cluster membership (nil outside a cluster).
func (n *Node) Peers() *peers.Node {
	if n == nil {
		return nil
	}
	return n.peers
}

// FS is the node's file system (mounted while Run serves).
func (n *Node) FS() *kfs.FS { return n.fsys }

// Sync commits the files closed in the mount, so that a command run in the
// node sees them.
func (n *Node) Sync() error { return n.fsys.Sync() }

// Reconcile shows a namespace change made outside the mount (import, rm)
// in the mount.
func (n *Node) Reconcile() { n.fsys.Reconcile() }

// Run mounts the namespace and serves until ctx ends or the mount goes
// away; then it stops the services, commits open writes, unmounts and
// closes the node. onReady, if not nil, is called once it serves.
func (n *Node) Run(ctx context.Context, onReady func(Ready)) error {
	defer n.Close()
	// stopped ends the stop watchdog once Close is done: the watchdog
	// covers closing the store too.
	stopped := make(chan struct{})
	defer close(stopped)
	if cleared, err := kfs.ClearStaleMount(n.mount); err != nil {
		return err
	} else if cleared {
		n.log.Warn("cleared a stale mount left by a node that did not stop cleanly", "mount", n.mount)
	}
	if err := n.fsys.Mount(n.mount); err != nil {
		return err
	}
	n.start = time.Now()
	// The scrub re-hashes the packs handed out for passthrough; the pin
	// recheck the pinned memory, at the same rate. They stop with the
	// node, before the store closes.
	scrubCtx, stopScrub := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { n.s.RunScrub(scrubCtx, n.cfg.ScrubRate) })
	bg.Go(func() { n.pins.recheckLoop(scrubCtx, n.cfg.ScrubRate) })
	n.onClose(func() { stopScrub(); bg.Wait() })
	if n.peers != nil {
		if err := n.peers.Start(n.s, n.fsys.Reconcile); err != nil {
			n.fsys.Unmount()
			return err
		}
		n.onClose(func() { n.peers.Close() })
		// Recorded pins missing chunks here are fetched from the members
		// (pins.go); it stops before the membership does.
		fetchCtx, stopFetch := context.WithCancel(ctx)
		fetched := make(chan struct{})
		go func() { n.pins.fetchMissing(fetchCtx); close(fetched) }()
		n.onClose(func() { stopFetch(); <-fetched })
		if n.wm.high = cmp.Or(n.cfg.HighWatermark, DefaultHighWatermark); n.wm.high > 0 {
			wmCtx, stopWM := context.WithCancel(ctx)
			wmDone := make(chan struct{})
			go func() { n.watermarkLoop(wmCtx); close(wmDone) }()
			n.onClose(func() { stopWM(); <-wmDone })
		} else {
			n.wm.high = 0
		}
		if n.cfg.ColdAfter > 0 {
			coldCtx, stopCold := context.WithCancel(ctx)
			cold := make(chan struct{})
			go func() { n.coldLoop(coldCtx, n.cfg.ColdAfter); close(cold) }()
			n.onClose(func() { stopCold(); <-cold })
		}
	}
	if n.client != nil {
		if n.kv != nil && n.peers != nil {
			km, err := startKVMembers(n.kv, n.peers, n.log)
			if err != nil {
				n.fsys.Unmount()
				return err
			}
			n.client.kvm = km
			n.kvm.Store(km)
			// After the connections (below: they queue copies), before
			// the membership and the KV store.
			n.onClose(km.close)
		}
		n.fill = newFillService(n.s, n.pins.hostOrNil(), n.cfg.GPUIdle, n.log)
		n.fill.loaded = n.pins.noteLoaded
		n.fill.inMemory = n.pins.inMemory
		n.fill.allIdle = n.pins.releaseAllHot
		// The connections end first: no FILL runs when the loaders close.
		n.onClose(func() { n.client.close(); n.fill.close() })
		n.client.kv = n.kv
		n.client.serve(n.s, n.fsys, n.fill)
	}
	unmounted := make(chan struct{})
	go func() { n.fsys.Wait(); close(unmounted) }()
	n.admin.ready()
	if onReady != nil {
		r := Ready{PID: os.Getpid(), DataDir: n.s.Dir(), Mount: n.mount, AdminSocket: n.admin.path, ClientNote: n.clientNote, MetricsURL: n.metrics.url()}
		if n.client != nil {
			r.ClientSocket = n.client.path
		}
		onReady(r)
	}
	notifyReady(n.log, n.s.Dir(), n.mount) // systemd Type=notify (notify.go)
	select {
	case <-ctx.Done():
		n.log.Info("stopping", "mount", n.mount)
	case <-unmounted:
		n.log.Warn("the mount went away (unmounted from outside); stopping", "mount", n.mount)
	}
	notifyStopping(n.log, n.mount)
	if n.cfg.StopTimeout > 0 {
		go stopWatchdog(n.log, n.mount, n.cfg.StopTimeout, stopped)
	}
	n.admin.close()
	if n.client != nil {
		n.client.close()
	}
	return n.fsys.Unmount()
}

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
	case Within(m, d):
		return fmt.Errorf("serve: the mount point %s is inside the data directory %s; the node would serve its own store through itself: choose a mount point outside it (--mount or KYLIX_MOUNT)", mount, data)
	case Within(d, m):
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

// Within reports whether path p is dir or below it.
func Within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// human formats a byte count with binary units, for messages.
func human(n int64) string { return units.Human(n) }
