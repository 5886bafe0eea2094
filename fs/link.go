package fs

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kylix/kylix/chunkstore"
)

// linkNode is a symbolic link.
type linkNode struct {
	gofs.Inode
	base
	mu  sync.Mutex
	ent chunkstore.Entry
}

var (
	_ = (gofs.NodeReadlinker)((*linkNode)(nil))
	_ = (gofs.NodeGetattrer)((*linkNode)(nil))
	_ = (gofs.NodeSetattrer)((*linkNode)(nil))
)

func (l *linkNode) target() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ent.Target
}

// changed reports whether store entry e differs from what the kernel was
// told about this link (target, owner or group).
func (l *linkNode) changed(e chunkstore.Entry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return e.Target != l.ent.Target || e.UID != l.ent.UID || e.GID != l.ent.GID || e.Link != l.link.Load() || e.Nlink != l.nlink.Load()
}

func (l *linkNode) setEntry(e chunkstore.Entry) {
	l.mu.Lock()
	l.ent = e
	l.mu.Unlock()
	l.setLinks(e)
}

func (l *linkNode) attr(out *fuse.Attr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out.Mode = syscall.S_IFLNK | 0o777
	out.Size = uint64(len(l.ent.Target))
	out.Nlink = l.nlinks()
	setTimes(out, l.ent.MTime, l.ent.CTime, l.ent.ATime)
	out.Uid, out.Gid = l.fsys.owner(l.ent.UID, l.ent.GID)
}

func (l *linkNode) fillEntry(out *fuse.EntryOut) {
	l.attr(&out.Attr)
	out.SetEntryTimeout(l.fsys.opts.FileTimeout)
	out.SetAttrTimeout(l.fsys.opts.FileTimeout)
}

func (l *linkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return []byte(l.target()), 0
}

func (l *linkNode) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	l.attr(&out.Attr)
	out.SetTimeout(l.fsys.opts.FileTimeout)
	return 0
}

// Setattr changes a symlink's owner and group (lchown) and mtime
// (lutimes); its mode is always 0777 (Linux has no lchmod: the kernel
// answers EOPNOTSUPP before asking us).
func (l *linkNode) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer func() { out.Ino = l.StableAttr().Ino }() // as in fileNode.Setattr
	f := l.fsys
	l.mu.Lock()
	ent := l.ent
	l.mu.Unlock()
	ent.Mode = 0o777
	if setMeta(f, in, &ent.Mode, &ent.UID, &ent.GID, &ent.MTime, &ent.CTime, &ent.ATime) {
		ent.Mode = 0o777
		f.nsMu.Lock()
		err := l.putMeta(func(e *chunkstore.Entry) {
			e.UID, e.GID, e.MTime, e.CTime, e.ATime = ent.UID, ent.GID, ent.MTime, ent.CTime, ent.ATime
		})
		if err != nil {
			f.nsMu.Unlock()
			return toErrno(err)
		}
		l.mu.Lock()
		l.ent.UID, l.ent.GID, l.ent.MTime, l.ent.CTime, l.ent.ATime = ent.UID, ent.GID, ent.MTime, ent.CTime, ent.ATime
		l.mu.Unlock()
		f.nsMu.Unlock()
	}
	l.attr(&out.Attr)
	out.SetTimeout(f.opts.FileTimeout)
	return 0
}
