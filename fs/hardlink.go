package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kylix/kylix/chunkstore"
)

// Hard links (docs/design/hardlinks.md). The names of a link set are one
// kernel inode: one node (a fileNode, a linkNode for a symlink, a
// specialNode), found by the set's number in FS.links, which every lookup
// of a name of the set returns (go-fuse then records the name as another
// parent of the inode). The node's base keeps one of its names, any; when
// that name goes while others stay, it keeps none until a lookup through
// another name gives it that one. Its content and metadata are written to
// the set's entry (NSTx.PutLinked, Put of an entry with Link), so every
// name sees them; a node without a name writes by the set's number.

var _ = (gofs.NodeLinker)((*dirNode)(nil))

// setLinks records the link set of store entry e (0 and 0 for an entry
// with one name).
func (b *base) setLinks(e chunkstore.Entry) {
	b.link.Store(e.Link)
	b.nlink.Store(e.Nlink)
}

// putMeta changes the node's store entry with fn: through its name, or,
// for a node of a link set whose name is gone, through the set. A node
// with neither changes nothing in the store. Callers hold nsMu.
func (b *base) putMeta(fn func(*chunkstore.Entry)) error {
	p, named := b.path()
	l := b.link.Load()
	if !named && l == 0 {
		return nil
	}
	return b.fsys.update(func(tx *chunkstore.NSTx) error {
		var e chunkstore.Entry
		var err error
		if named {
			e, err = tx.Lookup(p)
		} else {
			e, err = tx.LookupLinked(l)
		}
		if err != nil {
			return err
		}
		fn(&e)
		if named {
			return tx.Put(p, e)
		}
		return tx.PutLinked(l, e)
	})
}

// linkedNode returns the live node of link set l, nil when the kernel
// holds none.
func (f *FS) linkedNode(l uint64) *gofs.Inode {
	f.linksMu.Lock()
	defer f.linksMu.Unlock()
	in := f.links[l]
	if in == nil {
		return nil
	}
	if b := baseOf(in); b == nil || b.gone.Load() {
		delete(f.links, l)
		return nil
	}
	return in
}

// setLinked makes in the node of link set l.
func (f *FS) setLinked(l uint64, in *gofs.Inode) {
	f.linksMu.Lock()
	f.links[l] = in
	f.linksMu.Unlock()
}

var (
	_ = (gofs.NodeOnForgetter)((*fileNode)(nil))
	_ = (gofs.NodeOnForgetter)((*linkNode)(nil))
	_ = (gofs.NodeOnForgetter)((*specialNode)(nil))
)

// forgotten drops the node in from the link sets once the kernel forgot
// it: the next lookup of a name of its set makes a new one.
func (b *base) forgotten(in *gofs.Inode) {
	l := b.link.Load()
	if l == 0 || b.fsys == nil {
		return
	}
	f := b.fsys
	f.linksMu.Lock()
	if f.links[l] == in {
		delete(f.links, l)
	}
	f.linksMu.Unlock()
}

func (n *fileNode) OnForget()    { n.forgotten(&n.Inode) }
func (l *linkNode) OnForget()    { l.forgotten(&l.Inode) }
func (s *specialNode) OnForget() { s.forgotten(&s.Inode) }

// nodeForLink returns the node for the store entry e of a link set at
// name in d, reusing the set's node. Callers hold nsMu.
func (d *dirNode) nodeForLink(ctx context.Context, name string, e chunkstore.Entry, out *fuse.EntryOut) *gofs.Inode {
	f := d.fsys
	if in := f.linkedNode(e.Link); in != nil {
		reuse := false
		switch c := in.Operations().(type) {
		case *fileNode:
			if reuse = e.Kind == chunkstore.KindFile && c.adopt(e); reuse {
				c.fillEntry(out)
			}
		case *linkNode:
			if reuse = e.Kind == chunkstore.KindSymlink && c.target() == e.Target; reuse {
				c.setEntry(e)
				c.fillEntry(out)
			}
		case *specialNode:
			if reuse = c.same(e); reuse {
				c.setEntry(e)
				c.fillEntry(out)
			}
		}
		if reuse {
			if b := baseOf(in); b.parent == nil {
				b.parent, b.name = d, name
			}
			return in
		}
	}
	var in *gofs.Inode
	switch {
	case e.Kind == chunkstore.KindSymlink:
		c := &linkNode{ent: e}
		c.place(f, d, name)
		c.setLinks(e)
		c.fillEntry(out)
		in = d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFLNK})
	case e.Kind.Special():
		c := &specialNode{ent: e}
		c.place(f, d, name)
		c.setLinks(e)
		c.fillEntry(out)
		in = d.NewInode(ctx, c, gofs.StableAttr{Mode: specialType(e.Kind)})
	default:
		c := newFileNode(f, d, name, e, true)
		c.fillEntry(out)
		in = d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFREG})
	}
	f.setLinked(e.Link, in)
	return in
}

// touch sets the change time the node shows to ns (a link, unlink or
// rename changed the inode; the store recorded the same).
func touch(in *gofs.Inode, ns int64) {
	switch c := in.Operations().(type) {
	case *fileNode:
		c.mu.Lock()
		c.setTimesLocked(c.mtime, ns, c.atimeLocked())
		c.mu.Unlock()
	case *linkNode:
		c.mu.Lock()
		c.ent.CTime = ns
		c.mu.Unlock()
	case *specialNode:
		c.mu.Lock()
		c.ent.CTime = ns
		c.mu.Unlock()
	}
}

// unname records that (d, name) no longer leads to the node in: a node of
// a link set with other names keeps them (one fewer); any other becomes
// an orphan; now is the change time a kept node shows. Callers hold nsMu
// exclusively (or as orphan says).
func unname(in *gofs.Inode, d *dirNode, name string, now int64) {
	if b := baseOf(in); b != nil && b.link.Load() != 0 {
		if n := b.nlink.Load(); n > 1 {
			b.nlink.Store(n - 1)
			touch(in, now)
			if b.parent == d && b.name == name {
				b.parent = nil
			}
			return
		}
	}
	orphan(in)
}

// Link is link(2): name in d becomes another name of target, a regular
// file, symlink, fifo, socket or device node (the kernel refuses
// directories itself, EPERM, before asking).
func (d *dirNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	in := target.EmbeddedInode()
	b := baseOf(in)
	if b == nil || b.isRoot() {
		return nil, syscall.EPERM
	}
	if _, isDir := target.(*dirNode); isDir {
		return nil, syscall.EPERM
	}
	if n, ok := target.(*fileNode); ok && n.pending() {
		// Not in the store yet: commit it first, so that there is an
		// entry to share.
		n.handoff()
		if err := f.Sync(); err != nil {
			return nil, toErrno(err)
		}
		if n.pending() {
			return nil, syscall.EIO
		}
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
	if b.gone.Load() {
		return nil, syscall.ENOENT
	}
	to := joinPath(p, name)
	l := b.link.Load()
	from, named := b.path()
	if !named && l == 0 {
		return nil, syscall.ENOENT
	}
	d.forget(name)
	err := f.update(func(tx *chunkstore.NSTx) error {
		if named {
			return tx.Link(from, to)
		}
		return tx.LinkSet(l, to)
	})
	if err != nil {
		return nil, toErrno(err)
	}
	e, err := f.resolve(to)
	if err != nil {
		return nil, toErrno(err)
	}
	b.setLinks(e)
	f.setLinked(e.Link, in)
	switch c := target.(type) {
	case *fileNode:
		touch(in, e.CTime)
		c.fillEntry(out)
	case *linkNode:
		c.setEntry(e)
		c.fillEntry(out)
	case *specialNode:
		c.setEntry(e)
		c.fillEntry(out)
	}
	return in, 0
}

// reconcileLinks updates the nodes of link sets whose entry in the link
// table differs from what they show (a merge or an import changed the set
// behind the mount) and returns their inodes, for the caller to drop from
// the kernel's caches. A file open or being written here keeps its
// version, as any open file does when replaced behind the mount. Callers
// hold nsMu (shared).
func (f *FS) reconcileLinks() []*gofs.Inode {
	f.linksMu.Lock()
	links := make(map[uint64]*gofs.Inode, len(f.links))
	for l, in := range f.links {
		links[l] = in
	}
	f.linksMu.Unlock()
	if len(links) == 0 {
		return nil
	}
	root, err := f.resolve("")
	if err != nil {
		return nil
	}
	rootM, err := f.cache.get(root.ID)
	if err != nil {
		return nil
	}
	var out []*gofs.Inode
	for l, in := range links {
		e, err := f.resolveLink(rootM, chunkstore.Entry{Kind: chunkstore.KindHardlink, Link: l})
		if err != nil {
			continue // no set any more: its names went, and the walk saw that
		}
		changed := false
		switch c := in.Operations().(type) {
		case *fileNode:
			changed = c.refresh(e)
		case *linkNode:
			if changed = c.changed(e); changed {
				c.setEntry(e)
			}
		case *specialNode:
			if changed = c.changed(e); changed {
				c.setEntry(e)
			}
		}
		if changed {
			out = append(out, in)
		}
	}
	return out
}

// refresh takes the link set's entry e as the node's committed version and
// metadata, unless the node is open or has bytes of its own; it reports
// whether anything changed.
func (n *fileNode) refresh(e chunkstore.Entry) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state() != nil || !n.inStore || n.metaPendingLocked() {
		return false
	}
	if e.ID == n.id && e.Mode&chunkstore.EntryModeMask == n.mode && e.UID == n.uid && e.GID == n.gid &&
		e.MTime == n.mtime && e.CTime == n.ctimeLocked() && e.ATime == n.atimeLocked() && e.Nlink == n.nlink.Load() {
		return false
	}
	if e.ID != n.id {
		n.notPT = false
	}
	n.id, n.size, n.mode, n.uid, n.gid = e.ID, e.Size, e.Mode&chunkstore.EntryModeMask, e.UID, e.GID
	n.setTimesLocked(e.MTime, e.CTime, e.ATime)
	n.nlink.Store(e.Nlink)
	return true
}
