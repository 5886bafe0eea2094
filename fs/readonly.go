package fs

import (
	"context"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// A read-only mount (Options.ReadOnly, `kylix serve --read-only`): for data
// sets of many small files that a job only reads (docs/design/fs.md,
// "Read-only mounts"). The kernel is told the mount is read-only
// (MS_RDONLY: it refuses every write before asking us), and the node
// answers the first OPEN and the first FLUSH with ENOSYS. The kernel then
// stops sending OPEN, RELEASE and FLUSH on this connection for good
// (FUSE's no-open support): opening a file costs no round trip to the
// node, closing it none either, and the kernel keeps the file's cached
// pages (its default for no-open files is FOPEN_KEEP_CACHE). Reads then
// arrive without a file handle and are served from the committed version
// (fileNode.Read). What is given up: FUSE passthrough (it needs an OPEN
// reply), the layout ioctls that need an open handle (libkylix and the
// shim read through the mount instead), and writes.

// readOnlyRaw wraps the file system's raw request handler for a read-only
// mount.
type readOnlyRaw struct {
	fuse.RawFileSystem
	opens  atomic.Int64 // OPEN requests that reached us (the kernel stops after the first)
	writes atomic.Int64 // write requests refused (the kernel refuses them first)
}

func (r *readOnlyRaw) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.opens.Add(1)
	return fuse.ENOSYS
}

func (r *readOnlyRaw) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return fuse.ENOSYS
}

func (r *readOnlyRaw) refuse() fuse.Status {
	r.writes.Add(1)
	return fuse.EROFS
}

func (r *readOnlyRaw) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Unlink(cancel <-chan struct{}, in *fuse.InHeader, name string) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Rmdir(cancel <-chan struct{}, in *fuse.InHeader, name string) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Symlink(cancel <-chan struct{}, in *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) RemoveXAttr(cancel <-chan struct{}, in *fuse.InHeader, attr string) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return 0, r.refuse()
}

func (r *readOnlyRaw) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return r.refuse()
}

func (r *readOnlyRaw) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return 0, r.refuse()
}

var _ = (gofs.NodeReader)((*fileNode)(nil))

// Read serves a read that comes without a file handle: on a read-only
// mount the kernel opens files without asking (no-open), so every read
// comes so, and is served from the committed version as a read-only
// handle's reads are. A read with a handle is the handle's (the bridge
// asks the node first).
func (n *fileNode) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if r, ok := fh.(gofs.FileReader); ok {
		return r.Read(ctx, dest, off)
	}
	// No handle to remember where the last read ended: the kernel's
	// readahead asks in large requests, which is what marks a reader that
	// goes on (the node then reads ahead of it).
	seq := int64(len(dest)) >= DefaultMaxIO/2
	if off == 0 {
		n.prefetchSiblings() // in the background, overlapping this read
	}
	b, err := n.readAt(ctx, dest, off, seq)
	if err != nil {
		logReadError(n.fsys.log, n.id, off, err)
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(b), 0
}
