package fs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// Defaults for Options.
const (
	// DefaultFileTimeout is how long the kernel may cache a file's or
	// symlink's name and attributes. Files are immutable per version, and
	// every change not made through the mount is followed by Reconcile,
	// which invalidates what changed.
	DefaultFileTimeout = time.Hour
	// DefaultDirAttrTimeout is how long the kernel caches a directory's
	// attributes (its mtime and link count change with its entries).
	DefaultDirAttrTimeout = time.Second
	// DefaultCacheEntries bounds the decoded directory manifests kept in
	// memory, counted in entries.
	DefaultCacheEntries = 1 << 18
	// DefaultMaxIO is the largest read or write request (and readahead).
	DefaultMaxIO = 1 << 20
)

// Options configure New. The zero value of each field means its default.
type Options struct {
	Logger *slog.Logger
	// TempDir holds working copies of files being written. Default
	// DATA/tmp. It must be on a file system that supports unlinked open
	// files (any local one).
	TempDir        string
	FileTimeout    time.Duration
	DirAttrTimeout time.Duration
	CacheEntries   int
	// NoPassthrough serves every file through the daemon.
	NoPassthrough bool
	// ReadOnly mounts read-only, with no OPEN, RELEASE or FLUSH round trips
	// (readonly.go): the fastest mount for many small files a job only
	// reads. No passthrough and no writes there.
	ReadOnly bool
	// Debug logs every FUSE request.
	Debug bool
	// ScrubRate is the rate (bytes/s) of the store's pack scrub that the
	// caller runs (chunkstore.Store.RunScrub), 0 when it runs none; the
	// user.kylix.verify attribute reports it.
	ScrubRate int64
	// Reserve is free space on the data directory's file system that
	// writers through the mount whose uid is not 0 cannot use. nil means
	// DefaultReservePercent of the file system (docs/design/space.md).
	Reserve *Reserve
	// LowSpace: while less than this is free above the reserve, the last
	// close of a written file waits for its commit and reports its outcome.
	// 0 means DefaultLowSpace; negative: close never waits.
	LowSpace int64
	// ClientSocket is the absolute path of the node's client socket
	// (docs/design/client.md), which KYLIX_IOC_PROBE reports
	// (docs/design/ioctl.md); "" when there is none. At most
	// layout.ClientSocketMax-1 bytes.
	ClientSocket string
	// MakeRoom, when set, is asked to free need bytes of the data
	// directory's file system, held by data that can be fetched again (a
	// cluster member's peer cache), when a write through the mount would
	// not fit; it returns the bytes it freed (docs/design/space.md).
	MakeRoom func(need int64) int64
	// KeepLocal, when set, is called with a file's namespace path before
	// KYLIX_IOC_MAKE_LOCAL stores chunks of it here, so that the caller
	// can keep them (a cluster member's rebalance would drop chunks it
	// does not own; docs/design/pin.md). An error fails the ioctl (EIO).
	KeepLocal func(path string) error
	// OpenedForRead, when set, is called (without locks held) with the
	// committed version and size of a file opened for reading by
	// passthrough, or served by the node because no pack holds exactly
	// its bytes: the node may give the latter a whole copy
	// (chunkstore.Store.MakeWhole; docs/design/whole.md).
	OpenedForRead func(id chunkstore.ID, size int64, passthrough bool)
}

// FS is a mounted (or mountable) view of a store's namespace.
type FS struct {
	s     *chunkstore.Store
	opts  Options
	log   *slog.Logger
	root  *dirNode
	cache *dirCache
	com   *committer
	space *space
	uid   uint32
	gid   uint32

	// nsMu orders namespace changes: it guards every node's position
	// (parent, name) and is held while a change is written to the store
	// and the nodes are moved, so that a path computed under it is the
	// path the store has. Lookups take it shared.
	nsMu sync.RWMutex

	passthrough bool
	server      *fuse.Server
	mountDir    string

	closes  closeTracker // files closed whose RELEASE is pending
	readers packReaders  // who may read each shared pack (clientperm.go)
	dirtyMu sync.Mutex
	dirty   map[*fileNode]struct{} // nodes with a working copy

	// links is the node of each link set the kernel may know, so that
	// every name of a set is one inode (hardlink.go). Guarded by linksMu
	// (not nsMu: go-fuse calls OnForget holding its own locks).
	linksMu sync.Mutex
	links   map[uint64]*gofs.Inode

	// ro is the request handler's read-only wrapper (Options.ReadOnly).
	ro *readOnlyRaw

	// beforeCommit, when set (tests), runs before each commit batch.
	beforeCommit func()
	// beforeRelease, when set (tests), runs at the start of each RELEASE;
	// what it returns (if not nil) runs at its end.
	beforeRelease func(write bool) func()

	stats struct {
		ptOpens, daemonOpens, reads, readBytes, commits, commitBatches atomic.Int64
		ptRefused, ptOpenBytes, openFiles                              atomic.Int64
		prefetched, prefetchedBytes                                    atomic.Int64
		xattrAsks                                                      atomic.Int64
	}
	// pf runs the directory prefetch of a read-only mount (prefetch.go).
	pf prefetcher
}

// Stats counts what the file system served since it was made.
type Stats struct {
	PassthroughOpens int64 `json:"passthrough_opens"`
	DaemonOpens      int64 `json:"daemon_opens"`
	// PassthroughRefused counts opens of a file with a whole-file pack
	// that the daemon served instead: the pack failed its check (or is not
	// exactly the file).
	PassthroughRefused int64 `json:"passthrough_refused"`
	// PassthroughOpenBytes adds up the sizes of the files opened by
	// passthrough: the kernel reads them from their packs without the
	// node, so the bytes actually read are not seen here.
	PassthroughOpenBytes int64 `json:"passthrough_open_bytes"`
	// DaemonReads and DaemonReadBytes count reads the daemon served and
	// the bytes it returned (passthrough reads never reach it).
	DaemonReads     int64 `json:"daemon_reads"`
	DaemonReadBytes int64 `json:"daemon_read_bytes"`
	// OpenFiles is the number of files open in the mount now (handles
	// the kernel has not released), passthrough and daemon.
	OpenFiles     int64 `json:"open_files"`
	Commits       int64 `json:"commits"`
	CommitBatches int64 `json:"commit_batches"`
	// Prefetched and PrefetchedBytes count the small files (and their
	// bytes) a read-only mount's directory prefetch stored in the
	// kernel's page cache (prefetch.go).
	Prefetched      int64 `json:"prefetched_files"`
	PrefetchedBytes int64 `json:"prefetched_bytes"`
	// XattrRequests counts the GETXATTR requests that reached the node
	// (xattr.go: namespaces Kylix has no attributes in are refused with
	// ENOTSUP, so tools such as ls ask once per mount, not per file).
	XattrRequests int64 `json:"xattr_requests"`
}

// ScrubRate is Options.ScrubRate: the pack scrub's rate in bytes/s, 0
// when none runs.
func (f *FS) ScrubRate() int64 { return f.opts.ScrubRate }

// Stats returns the counters.
func (f *FS) Stats() Stats {
	return Stats{
		PassthroughOpens: f.stats.ptOpens.Load(),
		DaemonOpens:      f.stats.daemonOpens.Load(),
		DaemonReads:      f.stats.reads.Load(),
		DaemonReadBytes:  f.stats.readBytes.Load(),
		Commits:          f.stats.commits.Load(),
		CommitBatches:    f.stats.commitBatches.Load(),

		PassthroughRefused:   f.stats.ptRefused.Load(),
		PassthroughOpenBytes: f.stats.ptOpenBytes.Load(),
		OpenFiles:            f.stats.openFiles.Load(),
		Prefetched:           f.stats.prefetched.Load(),
		PrefetchedBytes:      f.stats.prefetchedBytes.Load(),
		XattrRequests:        f.stats.xattrAsks.Load(),
	}
}

// New makes a file system over s. Mount it with Mount; tests may mount
// Root themselves.
func New(s *chunkstore.Store, opts Options) (*FS, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.TempDir == "" {
		opts.TempDir = filepath.Join(s.Dir(), "tmp")
	}
	if opts.FileTimeout <= 0 {
		opts.FileTimeout = DefaultFileTimeout
	}
	if opts.DirAttrTimeout <= 0 {
		opts.DirAttrTimeout = DefaultDirAttrTimeout
	}
	if opts.CacheEntries <= 0 {
		opts.CacheEntries = DefaultCacheEntries
	}
	if err := os.MkdirAll(opts.TempDir, 0o700); err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	// Working copies left by a crash were never committed: drop them.
	if ents, err := os.ReadDir(opts.TempDir); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(opts.TempDir, e.Name()))
		}
	}
	f := &FS{
		s:           s,
		opts:        opts,
		log:         opts.Logger,
		cache:       newDirCache(s, opts.CacheEntries),
		uid:         uint32(os.Getuid()),
		gid:         uint32(os.Getgid()),
		passthrough: !opts.NoPassthrough && !opts.ReadOnly && os.Geteuid() == 0,
		dirty:       map[*fileNode]struct{}{},
		links:       map[uint64]*gofs.Inode{},
	}
	f.closes.cond = sync.NewCond(&f.closes.mu)
	reserve := Reserve{Percent: DefaultReservePercent}
	if opts.Reserve != nil {
		reserve = *opts.Reserve
	}
	if opts.LowSpace == 0 {
		opts.LowSpace = DefaultLowSpace
	}
	f.space = &space{dir: s.Dir(), reserve: reserve, low: opts.LowSpace, root: os.Geteuid() == 0, makeRoom: opts.MakeRoom}
	f.opts.LowSpace = opts.LowSpace
	if _, err := f.space.stat(); err != nil {
		return nil, err
	}
	f.root = &dirNode{}
	f.root.fsys = f
	f.com = newCommitter(f)
	return f, nil
}

// Root is the root node, for gofs.Mount.
func (f *FS) Root() gofs.InodeEmbedder { return f.root }

// MountOptions returns the go-fuse options Mount uses.
func (f *FS) MountOptions() *gofs.Options {
	zero := time.Duration(0)
	mo := fuse.MountOptions{
		FsName:       "kylix",
		Name:         "kylix",
		MaxWrite:     DefaultMaxIO,
		MaxReadAhead: DefaultMaxIO,
		DirectMount:  true,
		Debug:        f.opts.Debug,
		// The kernel checks permissions from the attributes we return.
		Options: []string{"default_permissions"},
		// POSIX ACLs off, and every xattr request answered by the file
		// system (not go-fuse's IgnoreSecurityLabels, which answers
		// "no such attribute" for the ACL and capability names):
		// Kylix stores no ACL, so getxattr of system.posix_acl_* says
		// ENOTSUP, which `ls -l` caches for the mount after its first
		// entry (fs/xattr.go, xattrAbsent). With ACLs on, the kernel
		// asked for each inode's ACL once, a round trip per entry the
		// first time a tree was listed (docs/design/fs.md, "FUSE
		// settings for many small files"). Permissions are checked from
		// the mode (default_permissions), as they were.
		MaxBackground: 64,
		// Replies are byte slices; splicing them only adds a pipe copy.
		DisableSplice: true,
	}
	if os.Geteuid() == 0 {
		mo.AllowOther = true
	}
	return &gofs.Options{
		MountOptions: mo,
		// Timeouts are set per node; zero here means "as the node says".
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		// A mode of 0000 is a mode (open(O_CREAT, 0), chmod 0): without
		// this go-fuse shows it as 0644.
		NullPermissions: true,
		UID:             f.uid,
		GID:             f.gid,
	}
}

// Mount mounts the file system on dir, clearing a stale mount a crashed
// node left there first.
func (f *FS) Mount(dir string) error {
	if _, err := ClearStaleMount(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mount point: %w", err)
	}
	srv, err := f.mount(dir)
	if err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	f.server, f.mountDir = srv, dir
	f.setReadAhead(dir)
	return nil
}

// mount is gofs.Mount, with the read-only wrapper around the request
// handler where the mount is read-only.
func (f *FS) mount(dir string) (*fuse.Server, error) {
	opts := f.MountOptions()
	var raw fuse.RawFileSystem = gofs.NewNodeFS(f.root, opts)
	if f.opts.ReadOnly {
		f.ro = &readOnlyRaw{RawFileSystem: raw}
		raw = f.ro
		opts.MountOptions.DirectMountFlags = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_RDONLY
	}
	srv, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, err
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, err
	}
	return srv, nil
}

// ReadAheadKB is the kernel readahead set on the mount's backing device
// (the kernel's default for FUSE is 128 KiB): sequential readers of files
// the node serves then keep several 1 MiB requests in flight.
const ReadAheadKB = 8192

func (f *FS) setReadAhead(dir string) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(fmt.Sprint(ReadAheadKB)), 0o644); err != nil {
		f.log.Debug("readahead not set", "path", p, "err", err)
	}
}

// Wait blocks until the file system is unmounted.
func (f *FS) Wait() {
	if f.server != nil {
		f.server.Wait()
	}
}

// Unmount commits every file still being written, then unmounts. If
// programs still hold files open, the mount is detached (MNT_DETACH): it
// disappears from the namespace at once and goes away when they close.
func (f *FS) Unmount() error {
	f.pf.stop()
	f.CommitAll()
	if f.server == nil {
		return f.com.close()
	}
	var err error
	for range 3 {
		if err = f.server.Unmount(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		f.log.Warn("unmount busy; detaching", "dir", f.mountDir, "err", err)
		if derr := syscall.Unmount(f.mountDir, unix.MNT_DETACH); derr != nil {
			return fmt.Errorf("unmount %s: %w", f.mountDir, derr)
		}
		done := make(chan struct{})
		go func() { f.server.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
	}
	return f.com.close()
}

// CommitAll hands every working copy to the committer, as if its writers
// had closed it, and waits until everything is committed. Writers still
// open keep writing into a fresh copy.
func (f *FS) CommitAll() error {
	f.dirtyMu.Lock()
	nodes := make([]*fileNode, 0, len(f.dirty))
	for n := range f.dirty {
		nodes = append(nodes, n)
	}
	f.dirtyMu.Unlock()
	for _, n := range nodes {
		n.handoff()
	}
	return f.Sync()
}

// Sync waits until every file closed so far is committed to the store,
// including files whose last close has been flushed but whose RELEASE is
// still on its way (up to closeGrace; closer.go).
func (f *FS) Sync() error {
	f.closes.wait(closeGrace)
	return f.com.wait(f.com.barrier())
}

func (f *FS) markDirty(n *fileNode, dirty bool) {
	f.dirtyMu.Lock()
	if dirty {
		f.dirty[n] = struct{}{}
	} else {
		delete(f.dirty, n)
	}
	f.dirtyMu.Unlock()
}

// resolve returns the store's entry at a namespace path, through the
// manifest cache.
func (f *FS) resolve(path string) (chunkstore.Entry, error) {
	rootID, hlc, err := f.s.Root()
	if err != nil {
		return chunkstore.Entry{}, err
	}
	// The root has no entry of its own: it is the node user's 0755.
	e := chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o755, UID: chunkstore.OwnerUnknown, GID: chunkstore.OwnerUnknown, ID: rootID, HLC: hlc, MTime: hlc.Wall().UnixNano()}
	if path == "" {
		return e, nil
	}
	var rootM *chunkstore.DirManifest
	for name := range strings.SplitSeq(path, "/") {
		if e.Kind != chunkstore.KindDir {
			return chunkstore.Entry{}, fmt.Errorf("%s: %w", path, chunkstore.ErrNotDir)
		}
		m, err := f.cache.get(e.ID)
		if err != nil {
			return chunkstore.Entry{}, err
		}
		hidden := false
		if rootM == nil {
			rootM, hidden = m, chunkstore.ReservedRoot(name)
		}
		i, ok := m.Find(name)
		if !ok || m.Entries[i].Deleted || hidden {
			return chunkstore.Entry{}, fmt.Errorf("%s: %w", path, chunkstore.ErrNotFound)
		}
		e = m.Entries[i]
	}
	return f.resolveLink(rootM, e)
}

// resolveLink returns what entry e stands for: e, or for a hard-link name
// its link set's entry (chunkstore/links.go), from the link table named
// in the root manifest rootM.
func (f *FS) resolveLink(rootM *chunkstore.DirManifest, e chunkstore.Entry) (chunkstore.Entry, error) {
	if e.Kind != chunkstore.KindHardlink {
		return e, nil
	}
	var table *chunkstore.DirManifest
	if te, ok := chunkstore.TableEntry(rootM); ok {
		t, err := f.cache.get(te.ID)
		if err != nil {
			return chunkstore.Entry{}, err
		}
		table = t
	}
	return chunkstore.ResolveIn(e, table)
}

// list returns the live entries of the directory at path.
func (f *FS) list(path string) ([]chunkstore.Entry, error) {
	e, err := f.resolve(path)
	if err != nil {
		return nil, err
	}
	if e.Kind != chunkstore.KindDir {
		return nil, fmt.Errorf("list %s: %w", path, chunkstore.ErrNotDir)
	}
	m, err := f.cache.get(e.ID)
	if err != nil {
		return nil, err
	}
	live := m.Live()
	var rootM *chunkstore.DirManifest
	for i := 0; i < len(live); i++ {
		c := live[i]
		if path == "" && chunkstore.ReservedRoot(c.Name) {
			live = append(live[:i], live[i+1:]...)
			i--
			continue
		}
		if c.Kind != chunkstore.KindHardlink {
			continue
		}
		if rootM == nil {
			root, _ := f.resolve("")
			if rootM, err = f.cache.get(root.ID); err != nil {
				return nil, err
			}
		}
		if live[i], err = f.resolveLink(rootM, c); err != nil {
			return nil, err
		}
	}
	return live, nil
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// update runs a namespace transaction. Callers hold nsMu.
func (f *FS) update(fn func(tx *chunkstore.NSTx) error) error {
	return f.s.Update(fn)
}

// Reconcile makes the kernel drop what it caches about names whose entries
// changed in the store behind the mount's back (an import or rm through
// the admin socket, later a peer). Directories whose manifest did not
// change are skipped whole: the namespace is a Merkle tree. A directory
// whose manifest changed also has its cached listing dropped.
func (f *FS) Reconcile() {
	type inval struct {
		parent *gofs.Inode
		name   string
	}
	var todo []inval
	var dirs []*gofs.Inode
	f.nsMu.RLock()
	var walk func(d *dirNode, path string)
	walk = func(d *dirNode, path string) {
		e, err := f.resolve(path)
		if err != nil || e.Kind != chunkstore.KindDir {
			return
		}
		d.mu.Lock()
		same := d.seen == e.ID
		d.seen = e.ID
		d.mu.Unlock()
		if same {
			return
		}
		// Its listing changed: the kernel may keep the old one
		// (FOPEN_CACHE_DIR, dir.go) while the directory's attributes,
		// which would reset it, are cached.
		dirs = append(dirs, &d.Inode)
		m, err := f.cache.get(e.ID)
		if err != nil {
			return
		}
		for name, ch := range d.Children() {
			i, ok := m.Find(name)
			var se *chunkstore.Entry
			if ok && !m.Entries[i].Deleted {
				se = &m.Entries[i]
				if se.Kind == chunkstore.KindHardlink {
					// Its set's entry (a changed set is also
					// caught by its number, below).
					if r, err := f.resolve(joinPath(path, name)); err == nil {
						se = &r
					} else {
						se = nil
					}
				}
			}
			switch c := ch.Operations().(type) {
			case *dirNode:
				if se == nil || se.Kind != chunkstore.KindDir {
					todo = append(todo, inval{&d.Inode, name})
					continue
				}
				walk(c, joinPath(path, name))
			case *fileNode:
				if !c.stale(se) {
					continue
				}
				todo = append(todo, inval{&d.Inode, name})
			case *linkNode:
				if se == nil || se.Kind != chunkstore.KindSymlink || c.changed(*se) {
					todo = append(todo, inval{&d.Inode, name})
				}
			case *specialNode:
				if se == nil || c.changed(*se) {
					todo = append(todo, inval{&d.Inode, name})
				}
			}
		}
	}
	walk(f.root, "")
	// A link set changed behind the mount changes the link table, not
	// the directories of its names: its node is brought up to date by
	// the set's number, and the kernel's attributes and pages of the
	// inode are dropped.
	inodes := f.reconcileLinks()
	f.nsMu.RUnlock()
	// Notify without locks held: the kernel takes the directory's lock,
	// which a lookup waiting for nsMu may hold.
	for _, t := range todo {
		t.parent.NotifyEntry(t.name)
	}
	for _, in := range inodes {
		in.NotifyContent(0, 0)
	}
	for _, d := range dirs {
		d.NotifyContent(0, 0)
	}
}

// dirCache keeps decoded directory manifests by ID. Manifests are
// content-addressed, so an entry never goes stale; the cache is bounded by
// the number of entries it holds and emptied when full.
type dirCache struct {
	s       *chunkstore.Store
	max     int
	emptyID chunkstore.ID
	mu      sync.Mutex
	m       map[chunkstore.ID]*chunkstore.DirManifest
	n       int
	nsub    map[chunkstore.ID]uint32 // subdirectories of the manifests in m
}

// subdirs returns the number of live subdirectories of the directory
// manifest id (the root's link table not counted), for its link count; 0
// when it cannot be read (the directory is then shown with 2).
func (c *dirCache) subdirs(id chunkstore.ID, root bool) uint32 {
	c.mu.Lock()
	n, ok := c.nsub[id]
	c.mu.Unlock()
	if ok {
		return n
	}
	m, err := c.get(id)
	if err != nil {
		return 0
	}
	for _, e := range m.Entries {
		if e.Kind == chunkstore.KindDir && !e.Deleted && !(root && chunkstore.ReservedRoot(e.Name)) {
			n++
		}
	}
	c.mu.Lock()
	if c.nsub == nil || len(c.nsub) > c.max {
		c.nsub = map[chunkstore.ID]uint32{}
	}
	c.nsub[id] = n
	c.mu.Unlock()
	return n
}

func newDirCache(s *chunkstore.Store, max int) *dirCache {
	return &dirCache{s: s, max: max, emptyID: chunkstore.Sum((&chunkstore.DirManifest{}).Encode()), m: map[chunkstore.ID]*chunkstore.DirManifest{}}
}

func (c *dirCache) get(id chunkstore.ID) (*chunkstore.DirManifest, error) {
	if id == c.emptyID {
		return &chunkstore.DirManifest{}, nil
	}
	c.mu.Lock()
	m, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		return m, nil
	}
	m, err := c.s.DirManifest(id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.n+len(m.Entries) > c.max {
		clear(c.m)
		c.n = 0
	}
	c.m[id] = m
	c.n += len(m.Entries)
	c.mu.Unlock()
	return m, nil
}
