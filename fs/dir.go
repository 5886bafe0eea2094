package fs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kylix/kylix/chunkstore"
)

// base is what every node has: its place in the namespace. parent and name
// are guarded by FS.nsMu; a node that was unlinked or replaced has no
// parent (orphan) and no path.
type base struct {
	fsys *FS
	// gone: orphaned, no name any more (nlink 0). link is the link set
	// the node is (0: one name), nlink its number of names
	// (hardlink.go). gone and nlink share 8 bytes, and no field says
	// "the root" (isRoot): a file node is then 288 bytes, a size class
	// below 296 (docs/bench.md, "Node memory per known file").
	gone   atomic.Bool
	nlink  atomic.Uint32
	parent *dirNode
	name   string
	link   atomic.Uint64
}

// nlinks is the link count stat shows.
func (b *base) nlinks() uint32 {
	if b.gone.Load() {
		return 0
	}
	return max(1, b.nlink.Load())
}

// place sets a new node's file system and position.
func (b *base) place(f *FS, parent *dirNode, name string) {
	b.fsys, b.parent, b.name = f, parent, name
}

// isRoot reports whether b is the file system's root.
func (b *base) isRoot() bool {
	return b.fsys != nil && b == &b.fsys.root.base
}

// path returns the node's namespace path; false for an orphan. Callers
// hold nsMu (shared is enough).
func (b *base) path() (string, bool) {
	if b.isRoot() {
		return "", true
	}
	if b.parent == nil {
		return "", false
	}
	pp, ok := b.parent.path()
	if !ok {
		return "", false
	}
	return joinPath(pp, b.name), true
}

// dirNode is a directory. Its entries are read from the store on every
// lookup and readdir (through the manifest cache), so it holds no copy.
type dirNode struct {
	gofs.Inode
	base
	mu   sync.Mutex
	seen chunkstore.ID    // manifest ID at the last Reconcile
	last chunkstore.Entry // last entry seen, for fstat after the name is gone
	// prefetched: a read of one of its files started the directory's
	// prefetch in this node run (prefetch.go).
	prefetched atomic.Bool
}

func (d *dirNode) remember(e chunkstore.Entry) {
	d.mu.Lock()
	d.last = chunkstore.Entry{Kind: e.Kind, Mode: e.Mode, UID: e.UID, GID: e.GID, MTime: e.MTime, HLC: e.HLC}
	d.mu.Unlock()
}

var (
	_ = (gofs.NodeLookuper)((*dirNode)(nil))
	_ = (gofs.NodeReaddirer)((*dirNode)(nil))
	_ = (gofs.NodeGetattrer)((*dirNode)(nil))
	_ = (gofs.NodeSetattrer)((*dirNode)(nil))
	_ = (gofs.NodeCreater)((*dirNode)(nil))
	_ = (gofs.NodeMkdirer)((*dirNode)(nil))
	_ = (gofs.NodeSymlinker)((*dirNode)(nil))
	_ = (gofs.NodeUnlinker)((*dirNode)(nil))
	_ = (gofs.NodeRmdirer)((*dirNode)(nil))
	_ = (gofs.NodeRenamer)((*dirNode)(nil))
	_ = (gofs.NodeStatfser)((*dirNode)(nil))
	_ = (gofs.NodeGetxattrer)((*dirNode)(nil))
	_ = (gofs.NodeListxattrer)((*dirNode)(nil))
	_ = (gofs.NodeFsyncer)((*dirNode)(nil))
)

func dirAttr(f *FS, e chunkstore.Entry, out *fuse.Attr) {
	out.Mode = syscall.S_IFDIR | chunkstore.UnixMode(e.Mode)
	// As on ext4: its name, its ".", and each subdirectory's "..".
	out.Nlink = 2 + f.cache.subdirs(e.ID, e.Name == "")
	out.Size = 4096
	out.Blksize = 4096
	t := e.MTime
	if w := e.HLC.Wall().UnixNano(); w > t {
		t = w
	}
	setTimes(out, t, max(t, e.CTime), e.ATime)
	out.Uid, out.Gid = f.owner(e.UID, e.GID)
}

// setTimes sets mtime to ns, ctime to cns and atime to ans, each of the
// last two being ns when the entry recorded none (0).
func setTimes(out *fuse.Attr, ns, cns, ans int64) {
	if cns == 0 {
		cns = ns
	}
	if ans == 0 {
		ans = ns
	}
	out.Mtime, out.Mtimensec = splitTime(ns)
	out.Ctime, out.Ctimensec = splitTime(cns)
	out.Atime, out.Atimensec = splitTime(ans)
}

// splitTime is Unix nanoseconds as FUSE's seconds and nanoseconds (for a
// time before 1970 too: the nanoseconds are never negative).
func splitTime(ns int64) (uint64, uint32) {
	sec, nsec := ns/1e9, ns%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	return uint64(sec), uint32(nsec)
}

// entry returns the directory's store entry.
func (d *dirNode) entry() (chunkstore.Entry, error) {
	p, ok := d.path()
	if !ok {
		return chunkstore.Entry{}, chunkstore.ErrNotFound
	}
	return d.fsys.resolve(p)
}

func (d *dirNode) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fsys.nsMu.RLock()
	e, err := d.entry()
	d.fsys.nsMu.RUnlock()
	if err != nil {
		// An orphaned directory still answers fstat.
		d.mu.Lock()
		e = d.last
		d.mu.Unlock()
	} else {
		d.remember(e)
	}
	dirAttr(d.fsys, e, &out.Attr)
	out.SetTimeout(d.fsys.opts.DirAttrTimeout)
	return 0
}

func (d *dirNode) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer func() { out.Ino = d.StableAttr().Ino }() // as in fileNode.Setattr
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	f := d.fsys
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, ok := d.path()
	if !ok {
		return syscall.ENOENT
	}
	var e chunkstore.Entry
	err := f.update(func(tx *chunkstore.NSTx) error {
		var err error
		if e, err = tx.Lookup(p); err != nil {
			return err
		}
		if p == "" {
			// The root's metadata is not stored (it has no entry): it is
			// always the node user's 0755. Saying yes to a change of its
			// owner or mode would be a lie.
			old := e
			setMeta(f, in, &e.Mode, &e.UID, &e.GID, &e.MTime, &e.CTime, &e.ATime)
			ou, og := f.owner(old.UID, old.GID)
			nu, ng := f.owner(e.UID, e.GID)
			if e.Mode != old.Mode || ou != nu || og != ng {
				return syscall.EPERM
			}
			return nil
		}
		setMeta(f, in, &e.Mode, &e.UID, &e.GID, &e.MTime, &e.CTime, &e.ATime)
		return tx.Put(p, e)
	})
	if err != nil {
		return toErrno(err)
	}
	if p == "" {
		e, _ = f.resolve("")
	}
	dirAttr(f, e, &out.Attr)
	out.SetTimeout(f.opts.DirAttrTimeout)
	return 0
}

// Lookup finds name in the store (or among files created here and not yet
// committed) and returns its node, reusing the kernel's node when it still
// stands for the same thing.
func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	f.nsMu.RLock()
	defer f.nsMu.RUnlock()
	existing := d.GetChild(name)
	if existing != nil {
		if fn, ok := existing.Operations().(*fileNode); ok && fn.pending() && fn.parent == d {
			fn.fillEntry(out)
			return existing, 0
		}
	}
	p, ok := d.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	e, err := f.resolve(joinPath(p, name))
	if err != nil {
		return nil, toErrno(err)
	}
	return d.childFor(ctx, name, e, existing, out), 0
}

// childFor returns the node for store entry e at name. Callers hold nsMu.
func (d *dirNode) childFor(ctx context.Context, name string, e chunkstore.Entry, existing *gofs.Inode, out *fuse.EntryOut) *gofs.Inode {
	f := d.fsys
	if e.Link != 0 && e.Kind != chunkstore.KindDir {
		if existing != nil {
			if b := baseOf(existing); b == nil || b.link.Load() != e.Link {
				unname(existing, d, name, time.Now().UnixNano())
			}
		}
		return d.nodeForLink(ctx, name, e, out)
	}
	if existing != nil {
		switch c := existing.Operations().(type) {
		case *dirNode:
			if e.Kind == chunkstore.KindDir {
				c.remember(e)
				dirAttr(f, e, &out.Attr)
				out.SetEntryTimeout(f.opts.FileTimeout)
				out.SetAttrTimeout(f.opts.DirAttrTimeout)
				return existing
			}
		case *fileNode:
			if e.Kind == chunkstore.KindFile && c.adopt(e) {
				c.fillEntry(out)
				return existing
			}
		case *linkNode:
			if e.Kind == chunkstore.KindSymlink && c.target() == e.Target {
				c.setEntry(e)
				c.fillEntry(out)
				return existing
			}
		case *specialNode:
			// The same kernel inode: a socket bound to it stays
			// reachable by connect(2).
			if c.same(e) {
				c.setEntry(e)
				c.fillEntry(out)
				return existing
			}
		}
		// The name now stands for something else: the old node keeps
		// serving its open handles, without this name.
		unname(existing, d, name, time.Now().UnixNano())
	}
	switch e.Kind {
	case chunkstore.KindDir:
		c := &dirNode{}
		c.place(f, d, name)
		c.remember(e)
		dirAttr(f, e, &out.Attr)
		out.SetEntryTimeout(f.opts.FileTimeout)
		out.SetAttrTimeout(f.opts.DirAttrTimeout)
		return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFDIR})
	case chunkstore.KindSymlink:
		c := &linkNode{ent: e}
		c.place(f, d, name)
		c.fillEntry(out)
		return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFLNK})
	case chunkstore.KindFifo, chunkstore.KindSocket, chunkstore.KindCharDev, chunkstore.KindBlockDev:
		c := &specialNode{ent: e}
		c.place(f, d, name)
		c.fillEntry(out)
		return d.NewInode(ctx, c, gofs.StableAttr{Mode: specialType(e.Kind)})
	default:
		c := newFileNode(f, d, name, e, true)
		c.fillEntry(out)
		return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFREG})
	}
}

// orphan detaches a node from its name in our bookkeeping. Callers hold
// nsMu exclusively, or shared when the node is being replaced by lookup
// (the kernel serialises that with every other use of the name).
func orphan(in *gofs.Inode) {
	if b := baseOf(in); b != nil {
		b.parent = nil
		b.gone.Store(true)
	}
}

func baseOf(in *gofs.Inode) *base {
	switch c := in.Operations().(type) {
	case *dirNode:
		return &c.base
	case *fileNode:
		return &c.base
	case *linkNode:
		return &c.base
	case *specialNode:
		return &c.base
	}
	return nil
}

func kindMode(k chunkstore.Kind) uint32 {
	switch k {
	case chunkstore.KindDir:
		return syscall.S_IFDIR
	case chunkstore.KindSymlink:
		return syscall.S_IFLNK
	}
	if k.Special() {
		return specialType(k)
	}
	return syscall.S_IFREG
}

// OpendirHandle lets the kernel keep the listing it read (FOPEN_CACHE_DIR)
// across opens of the directory (FOPEN_KEEP_CACHE), so a second walk of a
// tree sends no READDIR(PLUS) and no lookups: without it every opendir at
// offset 0 asked for a READDIRPLUS, which runs a Lookup per entry in the
// node (docs/bench.md, "Small files and listings through the mount"). The
// kernel drops the listing itself when the directory changes through the
// mount (create, unlink, rename, mkdir, rmdir bump its version) or its
// mtime changes; a change behind the mount's back (import, rm, a cluster
// merge) is dropped by Reconcile (NotifyContent on the directory), and a
// name lost with its failed first commit by finishFailure.
func (d *dirNode) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{d: d}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is an open directory: the listing is read at the first
// READDIR (as go-fuse's own handle for a NodeReaddirer does).
type dirHandle struct {
	d  *dirNode
	ds gofs.DirStream
}

var (
	_ = (gofs.NodeOpendirHandler)((*dirNode)(nil))
	_ = (gofs.FileReaddirenter)((*dirHandle)(nil))
	_ = (gofs.FileSeekdirer)((*dirHandle)(nil))
	_ = (gofs.FileReleasedirer)((*dirHandle)(nil))
)

func (h *dirHandle) stream(ctx context.Context) syscall.Errno {
	if h.ds != nil {
		return 0
	}
	ds, errno := h.d.Readdir(ctx)
	if errno != 0 {
		return errno
	}
	h.ds = ds
	return 0
}

func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if errno := h.stream(ctx); errno != 0 {
		return nil, errno
	}
	if !h.ds.HasNext() {
		return nil, 0
	}
	e, errno := h.ds.Next()
	return &e, errno
}

func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if errno := h.stream(ctx); errno != 0 {
		return errno
	}
	if sd, ok := h.ds.(gofs.FileSeekdirer); ok {
		return sd.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (h *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if h.ds != nil {
		h.ds.Close()
	}
}

func (d *dirNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fsys
	f.nsMu.RLock()
	defer f.nsMu.RUnlock()
	p, ok := d.path()
	if !ok {
		return gofs.NewListDirStream(nil), 0
	}
	ents, err := f.list(p)
	if err != nil {
		return nil, toErrno(err)
	}
	out := make([]fuse.DirEntry, 0, len(ents))
	seen := make(map[string]bool, len(ents))
	for _, e := range ents {
		out = append(out, fuse.DirEntry{Name: e.Name, Mode: kindMode(e.Kind)})
		seen[e.Name] = true
	}
	// Files created here and not yet committed.
	for name, ch := range d.Children() {
		if fn, ok := ch.Operations().(*fileNode); ok && !seen[name] && fn.pending() && fn.parent == d {
			out = append(out, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG})
		}
	}
	return gofs.NewListDirStream(out), 0
}

// forget detaches the node the kernel may still have under name after the
// store stopped naming it (an rm through the admin socket), before a new
// node takes the name. Callers hold nsMu exclusively.
func (d *dirNode) forget(name string) {
	if ch := d.GetChild(name); ch != nil {
		orphan(ch)
	}
}

// exists reports whether name is taken in d (store or pending). Callers
// hold nsMu.
func (d *dirNode) exists(p, name string) bool {
	if p == "" && chunkstore.ReservedRoot(name) {
		return true // reserved: the link table (docs/design/hardlinks.md), rank layouts
	}
	if ch := d.GetChild(name); ch != nil {
		if fn, ok := ch.Operations().(*fileNode); ok && fn.pending() && fn.parent == d {
			return true
		}
	}
	_, err := d.fsys.resolve(joinPath(p, name))
	return err == nil
}

func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, nil, 0, err
	}
	tf, err := f.newTemp()
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, ok := d.path()
	if !ok {
		tf.release()
		return nil, nil, 0, syscall.ENOENT
	}
	if d.exists(p, name) {
		tf.release()
		return nil, nil, 0, syscall.EEXIST
	}
	pe, err := f.resolve(p)
	if err != nil {
		tf.release()
		return nil, nil, 0, toErrno(err)
	}
	d.forget(name)
	uid, gid, m := f.newOwner(ctx, pe, mode, false)
	n := newFileNode(f, d, name, chunkstore.Entry{Mode: m, UID: uid, GID: gid, MTime: time.Now().UnixNano()}, false)
	n.stateLocked().tmp = tf
	f.markDirty(n, true)
	h := n.openLocked(true)
	h.read = flags&syscall.O_ACCMODE != syscall.O_WRONLY
	n.fillEntry(out)
	return d.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFREG}), h, 0, 0
}

func checkName(name string) syscall.Errno {
	if len(name) > chunkstore.MaxNameLen {
		return syscall.ENAMETOOLONG
	}
	return 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, ok := d.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	if d.exists(p, name) {
		return nil, syscall.EEXIST
	}
	pe, err := f.resolve(p)
	if err != nil {
		return nil, toErrno(err)
	}
	d.forget(name)
	uid, gid, m := f.newOwner(ctx, pe, mode, true)
	e := chunkstore.Entry{Kind: chunkstore.KindDir, Mode: m, UID: uid, GID: gid, MTime: time.Now().UnixNano(), ID: f.cache.emptyID}
	if err := f.update(func(tx *chunkstore.NSTx) error { return tx.Put(joinPath(p, name), e) }); err != nil {
		return nil, toErrno(err)
	}
	e, _ = f.resolve(joinPath(p, name))
	c := &dirNode{}
	c.place(f, d, name)
	c.remember(e)
	dirAttr(f, e, &out.Attr)
	out.SetEntryTimeout(f.opts.FileTimeout)
	out.SetAttrTimeout(f.opts.DirAttrTimeout)
	return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFDIR}), 0
}

func (d *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	if len(target) == 0 || len(target) > chunkstore.MaxSymlinkLen {
		return nil, syscall.ENAMETOOLONG
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, ok := d.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	if d.exists(p, name) {
		return nil, syscall.EEXIST
	}
	pe, err := f.resolve(p)
	if err != nil {
		return nil, toErrno(err)
	}
	d.forget(name)
	uid, gid, _ := f.newOwner(ctx, pe, 0o777, false)
	e := chunkstore.Entry{Kind: chunkstore.KindSymlink, Mode: 0o777, UID: uid, GID: gid, MTime: time.Now().UnixNano(), Target: target}
	if err := f.update(func(tx *chunkstore.NSTx) error { return tx.Put(joinPath(p, name), e) }); err != nil {
		return nil, toErrno(err)
	}
	e.Name, e.Size = name, int64(len(target))
	c := &linkNode{ent: e}
	c.place(f, d, name)
	c.fillEntry(out)
	return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFLNK}), 0
}

func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	return d.remove(name, false)
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	return d.remove(name, true)
}

func (d *dirNode) remove(name string, dir bool) syscall.Errno {
	f := d.fsys
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, ok := d.path()
	if !ok {
		return syscall.ENOENT
	}
	ch := d.GetChild(name)
	if ch != nil {
		if fn, ok := ch.Operations().(*fileNode); ok && fn.pending() && fn.parent == d {
			if dir {
				return syscall.ENOTDIR
			}
			orphan(ch)
			return 0
		}
		if cd, ok := ch.Operations().(*dirNode); ok && dir && cd.hasPending() {
			return syscall.ENOTEMPTY
		}
	}
	cp := joinPath(p, name)
	var now int64
	err := f.update(func(tx *chunkstore.NSTx) error {
		now = tx.Now()
		e, err := tx.Lookup(cp)
		if err != nil {
			return err
		}
		switch {
		case dir && e.Kind != chunkstore.KindDir:
			return syscall.ENOTDIR
		case !dir && e.Kind == chunkstore.KindDir:
			return syscall.EISDIR
		}
		return tx.Remove(cp, false)
	})
	if err != nil {
		return toErrno(err)
	}
	if ch != nil {
		unname(ch, d, name, now)
	}
	return 0
}

// hasPending reports whether files created in d wait to be committed.
func (d *dirNode) hasPending() bool {
	for _, ch := range d.Children() {
		if fn, ok := ch.Operations().(*fileNode); ok && fn.pending() && fn.parent == d {
			return true
		}
	}
	return false
}

const (
	renameNoReplace = 0x1
	renameExchange  = 0x2
)

func (d *dirNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := d.fsys
	if flags&renameExchange != 0 {
		return syscall.EINVAL
	}
	np, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EXDEV
	}
	if err := checkName(newName); err != 0 {
		return err
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	from, ok1 := d.path()
	toDir, ok2 := np.path()
	if !ok1 || !ok2 {
		return syscall.ENOENT
	}
	to := joinPath(toDir, newName)
	from = joinPath(from, name)
	src, dst := d.GetChild(name), np.GetChild(newName)
	if src != nil && dst == src {
		return 0
	}
	var srcFile *fileNode
	if src != nil {
		if fn, ok := src.Operations().(*fileNode); ok && fn.pending() && fn.parent == d {
			srcFile = fn
		}
	}
	dstPending := false
	if dst != nil {
		if fn, ok := dst.Operations().(*fileNode); ok && fn.pending() && fn.parent == np {
			dstPending = true
		}
	}
	if flags&renameNoReplace != 0 && (dstPending || np.exists(toDir, newName)) {
		return syscall.EEXIST
	}
	if dstPending && srcFile == nil {
		if e, err := f.resolve(from); err == nil && e.Kind == chunkstore.KindDir {
			return syscall.ENOTDIR
		}
	}
	if dst != nil {
		// Files created in the directory replaced and not committed yet
		// make it not empty, as rmdir says.
		if dd, ok := dst.Operations().(*dirNode); ok && dd.hasPending() {
			if e, err := f.resolve(from); err == nil && e.Kind == chunkstore.KindDir {
				return syscall.ENOTEMPTY
			}
			return syscall.EISDIR
		}
	}
	var now int64
	err := f.update(func(tx *chunkstore.NSTx) error {
		now = tx.Now()
		old, oerr := tx.Lookup(to)
		if srcFile != nil {
			// Not in the store yet: only what it replaces changes now.
			if oerr != nil {
				return nil
			}
			if old.Kind == chunkstore.KindDir {
				return chunkstore.ErrIsDir
			}
			return tx.Remove(to, false)
		}
		e, err := tx.Lookup(from)
		if err != nil {
			return err
		}
		if oerr == nil && e.Kind == chunkstore.KindDir && old.Kind != chunkstore.KindDir {
			return chunkstore.ErrNotDir
		}
		return tx.Rename(from, to)
	})
	if err != nil {
		return toErrno(err)
	}
	if dst != nil {
		unname(dst, np, newName, now)
	}
	if src != nil {
		if b := baseOf(src); b != nil {
			b.parent, b.name = np, newName
		}
		if _, isDir := src.Operations().(*dirNode); !isDir {
			touch(src, now) // as the store's entry (NSTx.Rename)
		}
	}
	return 0
}

func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.fsys.statfs(out) // fs/space.go
}

func (d *dirNode) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return toErrno(d.fsys.Sync())
}

func (d *dirNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	d.fsys.stats.xattrAsks.Add(1)
	if attr != xattrID {
		return 0, xattrAbsent(attr)
	}
	d.fsys.nsMu.RLock()
	e, err := d.entry()
	d.fsys.nsMu.RUnlock()
	if err != nil {
		return 0, syscall.ENODATA
	}
	return xattrValue(dest, e.ID.String())
}

func (d *dirNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return xattrList(dest, []string{xattrID})
}
