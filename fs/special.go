package fs

import (
	"context"
	iofs "io/fs"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// Special files (docs/design/fs.md, "Special files"): fifos, Unix
// sockets and device nodes are namespace entries with metadata only
// (mode, owner, group, mtime, and a device number). The node answers
// their lookups and attributes; the kernel does their I/O (a fifo's pipe,
// a socket bound to the inode), and never asks the node to open them.
// The mount is nodev (go-fuse's default, as fusermount's), so a device
// node in it shows its type and number but cannot be opened as the
// device.

// specialNode is a fifo, socket or device node.
type specialNode struct {
	gofs.Inode
	base
	mu  sync.Mutex
	ent chunkstore.Entry
}

var (
	_ = (gofs.NodeGetattrer)((*specialNode)(nil))
	_ = (gofs.NodeSetattrer)((*specialNode)(nil))
	_ = (gofs.NodeMknoder)((*dirNode)(nil))
)

// specialType is the S_IFMT bits of a special kind.
func specialType(k chunkstore.Kind) uint32 {
	switch k {
	case chunkstore.KindFifo:
		return syscall.S_IFIFO
	case chunkstore.KindSocket:
		return syscall.S_IFSOCK
	case chunkstore.KindCharDev:
		return syscall.S_IFCHR
	case chunkstore.KindBlockDev:
		return syscall.S_IFBLK
	}
	return 0
}

// specialKind is the kind of an S_IFMT type mknod(2) may create; false
// for a regular file, a directory or a symlink.
func specialKind(mode uint32) (chunkstore.Kind, bool) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		return chunkstore.KindFifo, true
	case syscall.S_IFSOCK:
		return chunkstore.KindSocket, true
	case syscall.S_IFCHR:
		return chunkstore.KindCharDev, true
	case syscall.S_IFBLK:
		return chunkstore.KindBlockDev, true
	}
	return 0, false
}

// fuseDev and storeDev convert between the kernel's 32-bit device
// encoding in FUSE messages (new_encode_dev) and the dev_t the store
// keeps (unix.Mkdev, the one stat(2) and mknod(2) use).
func fuseDev(rdev uint64) uint32 {
	return uint32(unix.Minor(rdev)&0xff | unix.Major(rdev)<<8 | (unix.Minor(rdev)&^0xff)<<12)
}

func storeDev(dev uint32) uint64 {
	return unix.Mkdev((dev&0xfff00)>>8, dev&0xff|(dev>>12)&0xfff00)
}

func (s *specialNode) same(e chunkstore.Entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.Kind == s.ent.Kind && e.Rdev == s.ent.Rdev && e.Link == s.link.Load()
}

// changed reports whether store entry e differs from what the kernel was
// told about this node.
func (s *specialNode) changed(e chunkstore.Entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.ent
	return e.Kind != o.Kind || e.Rdev != o.Rdev || e.Mode != o.Mode || e.UID != o.UID || e.GID != o.GID || e.MTime != o.MTime ||
		e.Link != s.link.Load() || e.Nlink != s.nlink.Load()
}

func (s *specialNode) setEntry(e chunkstore.Entry) {
	s.mu.Lock()
	s.ent = e
	s.mu.Unlock()
	s.setLinks(e)
}

func (s *specialNode) attr(out *fuse.Attr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out.Mode = specialType(s.ent.Kind) | chunkstore.UnixMode(s.ent.Mode)
	out.Rdev = fuseDev(s.ent.Rdev)
	out.Blksize = 4096
	out.Nlink = s.nlinks()
	setTimes(out, s.ent.MTime, s.ent.CTime, s.ent.ATime)
	out.Uid, out.Gid = s.fsys.owner(s.ent.UID, s.ent.GID)
}

func (s *specialNode) fillEntry(out *fuse.EntryOut) {
	s.attr(&out.Attr)
	out.SetEntryTimeout(s.fsys.opts.FileTimeout)
	out.SetAttrTimeout(s.fsys.opts.FileTimeout)
}

func (s *specialNode) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	s.attr(&out.Attr)
	out.SetTimeout(s.fsys.opts.FileTimeout)
	return 0
}

// Setattr records chmod, chown and utimes. A size is refused as ext4
// refuses truncate(2) of what is not a regular file (the kernel answers
// that itself before asking; this is for a request that gets here
// anyway).
func (s *specialNode) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer func() { out.Ino = s.StableAttr().Ino }() // as in fileNode.Setattr
	if _, ok := in.GetSize(); ok {
		return syscall.EINVAL
	}
	f := s.fsys
	s.mu.Lock()
	ent := s.ent
	s.mu.Unlock()
	if setMeta(f, in, &ent.Mode, &ent.UID, &ent.GID, &ent.MTime, &ent.CTime, &ent.ATime) {
		f.nsMu.Lock()
		err := s.putMeta(func(e *chunkstore.Entry) {
			e.Mode, e.UID, e.GID, e.MTime, e.CTime, e.ATime = ent.Mode, ent.UID, ent.GID, ent.MTime, ent.CTime, ent.ATime
		})
		if err != nil {
			f.nsMu.Unlock()
			return toErrno(err)
		}
		s.mu.Lock()
		s.ent = ent
		s.mu.Unlock()
		f.nsMu.Unlock()
	}
	s.attr(&out.Attr)
	out.SetTimeout(f.opts.FileTimeout)
	return 0
}

// Mknod creates a fifo, socket (bind(2) of a Unix socket) or device node,
// or an empty regular file (mknod(2) with S_IFREG). The kernel checks
// CAP_MKNOD for devices before it asks (vfs_mknod), as it does for ext4.
func (d *dirNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	if err := checkName(name); err != 0 {
		return nil, err
	}
	kind, ok := specialKind(mode)
	if !ok {
		if mode&syscall.S_IFMT != syscall.S_IFREG && mode&syscall.S_IFMT != 0 {
			return nil, syscall.EINVAL
		}
		return d.mknodFile(ctx, name, mode, out)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, uid, gid, m, errno := d.newName(ctx, name, mode)
	if errno != 0 {
		return nil, errno
	}
	e := chunkstore.Entry{Kind: kind, Mode: m, UID: uid, GID: gid, MTime: time.Now().UnixNano()}
	if kind.IsDevice() {
		e.Rdev = storeDev(dev)
	}
	if err := f.update(func(tx *chunkstore.NSTx) error { return tx.Put(joinPath(p, name), e) }); err != nil {
		return nil, toErrno(err)
	}
	e.Name = name
	c := &specialNode{ent: e}
	c.place(f, d, name)
	c.fillEntry(out)
	return d.NewInode(ctx, c, gofs.StableAttr{Mode: specialType(kind)}), 0
}

// newName checks that name is free in d for a new entry (not a
// directory) of the caller's with mode, and returns d's path and the new
// entry's owner, group and mode. Callers hold nsMu exclusively.
func (d *dirNode) newName(ctx context.Context, name string, mode uint32) (string, uint32, uint32, iofs.FileMode, syscall.Errno) {
	f := d.fsys
	p, ok := d.path()
	if !ok {
		return "", 0, 0, 0, syscall.ENOENT
	}
	if d.exists(p, name) {
		return "", 0, 0, 0, syscall.EEXIST
	}
	pe, err := f.resolve(p)
	if err != nil {
		return "", 0, 0, 0, toErrno(err)
	}
	d.forget(name)
	uid, gid, m := f.newOwner(ctx, pe, mode, false)
	return p, uid, gid, m, 0
}

// mknodFile is mknod(2) of a regular file: an empty file, in the store at
// once (there is no open handle whose release would commit it).
func (d *dirNode) mknodFile(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fsys
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	p, uid, gid, m, errno := d.newName(ctx, name, mode)
	if errno != 0 {
		return nil, errno
	}
	e := chunkstore.Entry{Kind: chunkstore.KindFile, Mode: m, UID: uid, GID: gid, MTime: time.Now().UnixNano()}
	err := f.update(func(tx *chunkstore.NSTx) error {
		e.ID = tx.PutFile(&chunkstore.FileManifest{})
		return tx.Put(joinPath(p, name), e)
	})
	if err != nil {
		return nil, toErrno(err)
	}
	e, _ = f.resolve(joinPath(p, name))
	c := newFileNode(f, d, name, e, true)
	c.fillEntry(out)
	return d.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}
