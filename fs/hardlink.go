package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kylix/kylix/chunkstore"
)

// Hard links (docs/design/hardlinks.md). The names of a link set are one
// kernel inode: one fileNode, found by the set's number in FS.links, which
// every lookup of a name of the set returns (go-fuse then records the
// name as another parent of the inode). The node's base keeps one of its
// names, any; when that name goes while others stay, it keeps none until a
// lookup through another name gives it that one. Its content and
// metadata are committed to the set's entry by number (NSTx.PutLinked),
// never through a path, so every name sees them.

var _ = (gofs.NodeLinker)((*dirNode)(nil))

// linkedNode returns the live node of link set l, nil when the kernel
// holds none. Callers hold nsMu.
func (f *FS) linkedNode(l uint64) *fileNode {
	n := f.links[l]
	if n == nil {
		return nil
	}
	if n.gone.Load() || n.Forgotten() {
		delete(f.links, l)
		return nil
	}
	return n
}

// nodeForLink returns the node for the store entry e of a link set at
// name in d, reusing the set's node. Callers hold nsMu.
func (d *dirNode) nodeForLink(ctx context.Context, name string, e chunkstore.Entry, out *fuse.EntryOut) *gofs.Inode {
	f := d.fsys
	if n := f.linkedNode(e.Link); n != nil && n.adopt(e) {
		if n.parent == nil {
			n.parent, n.name = d, name
		}
		n.fillEntry(out)
		return n.EmbeddedInode()
	}
	n := newFileNode(f, d, name, e, true)
	f.links[e.Link] = n
	n.fillEntry(out)
	return d.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFREG})
}

// linkSet returns the node's link set, 0 for a file with one name.
func (n *fileNode) linkSet() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.link
}

// unname records that (d, name) no longer leads to the node in: a node of
// a link set with other names keeps them (one fewer); any other becomes
// an orphan. Callers hold nsMu exclusively (or as orphan says).
func unname(in *gofs.Inode, d *dirNode, name string) {
	if n, ok := in.Operations().(*fileNode); ok {
		n.mu.Lock()
		kept := n.link != 0 && n.nlink > 1
		if kept {
			n.nlink--
		}
		n.mu.Unlock()
		if kept {
			if n.parent == d && n.name == name {
				n.parent = nil
			}
			return
		}
	}
	orphan(in)
}

// Link is link(2): name in d becomes another name of target. Only regular
// files are linked here; the kernel refuses directories itself (EPERM)
// before asking, and a symlink, fifo, socket or device is refused with
// EPERM too (what ext4 does for a file system that does not support
// linking them; docs/design/hardlinks.md says why).
func (d *dirNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	n, ok := target.(*fileNode)
	if !ok {
		return nil, syscall.EPERM
	}
	if n.pending() {
		// Not in the store yet: commit it first, so that there is an
		// entry to share.
		n.handoff()
		if err := f.Sync(); err != nil {
			return nil, toErrno(err)
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
	if n.gone.Load() || n.pending() {
		return nil, syscall.ENOENT
	}
	to := joinPath(p, name)
	n.mu.Lock()
	l := n.link
	n.mu.Unlock()
	from, named := n.path()
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
	n.mu.Lock()
	n.link, n.nlink = e.Link, e.Nlink
	n.mu.Unlock()
	f.links[e.Link] = n
	n.fillEntry(out)
	return n.EmbeddedInode(), 0
}
