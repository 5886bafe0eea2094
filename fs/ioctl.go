package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/fs/layout"
)

// Ioctl answers the layout ioctls (package layout). Anything else is
// ENOTTY; a malformed request is EINVAL.
func (n *fileNode) Ioctl(ctx context.Context, fh gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	switch cmd {
	case layout.CmdLayout:
		return 0, n.ioctlLayout(input, output)
	case layout.CmdPackPath:
		return 0, n.ioctlPackPath(input, output)
	}
	return 0, syscall.ENOTTY
}

func (n *fileNode) ioctlLayout(input, output []byte) syscall.Errno {
	if len(output) != layout.LayoutSize {
		return syscall.EINVAL
	}
	req, err := layout.DecodeRequest(input)
	if err != nil {
		return syscall.EINVAL
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	size := uint64(sf.Size())
	if req.Offset > size {
		return syscall.EINVAL
	}
	end := size
	if req.Length != 0 && req.Offset+req.Length < size {
		end = req.Offset + req.Length
	}
	_, whole := sf.WholeFilePack()
	rep := layout.Reply{FileSize: size, NextOffset: end, FileID: sf.ID}
	exts, err := planExtents(sf, int64(req.Offset), int64(end))
	if err != nil {
		return toErrno(err)
	}
	for _, x := range exts {
		if len(rep.Extents) == layout.MaxExtents {
			rep.NextOffset = x.FileOffset
			break
		}
		if x.Flags&layout.ExtentLocal != 0 && whole {
			x.Flags |= layout.ExtentWholeFile
		}
		rep.Extents = append(rep.Extents, x)
	}
	copy(output, input)
	if err := layout.EncodeReply(output, rep); err != nil {
		return syscall.EINVAL
	}
	return 0
}

func (n *fileNode) ioctlPackPath(input, output []byte) syscall.Errno {
	if len(output) != layout.PackPathSize {
		return syscall.EINVAL
	}
	id, err := layout.DecodePackPathRequest(input)
	if err != nil {
		return syscall.EINVAL
	}
	// Only packs that hold part of this file: the ioctl does not reveal
	// the rest of the store.
	sf, errno := n.committedFile()
	if errno != 0 {
		return errno
	}
	plan, err := sf.Plan(0, sf.Size())
	if err != nil {
		return toErrno(err)
	}
	defer plan.Release()
	for _, pc := range plan.Pieces {
		if pc.Local() && pc.Pack == id {
			copy(output, input)
			if layout.EncodePackPathReply(output, pc.Lease.Path()) != nil {
				return syscall.EINVAL
			}
			return 0
		}
	}
	return syscall.EINVAL
}

// planExtents plans [off, end) of sf through the chunk-access seam and
// merges its pieces into extents: runs of chunks back to back in one pack,
// or runs of chunks not stored here. A chunk whose pack is missing from
// disk is reported as not local. The plan's leases are released on return:
// the layout is a snapshot, and a bypass reader that uses it verifies the
// chunks it reads (and falls back to the mount on a failure).
func planExtents(sf *chunkstore.File, off, end int64) ([]layout.Extent, error) {
	plan, err := sf.Plan(off, end-off)
	if err != nil {
		return nil, err
	}
	defer plan.Release()
	var out []layout.Extent
	for _, pc := range plan.Pieces {
		s, t := max(pc.FileOff, off), min(pc.FileOff+pc.Len, end)
		if s >= t {
			continue
		}
		e := layout.Extent{FileOffset: uint64(s), Length: uint64(t - s)}
		if pc.Local() {
			e.PackID, e.PackOffset, e.Flags = pc.Pack, uint64(pc.PackOff+s-pc.FileOff), layout.ExtentLocal
		}
		if k := len(out) - 1; k >= 0 {
			p := &out[k]
			if p.Flags == e.Flags && p.PackID == e.PackID && p.FileOffset+p.Length == e.FileOffset &&
				(e.Flags&layout.ExtentLocal == 0 || p.PackOffset+p.Length == e.PackOffset) {
				p.Length += e.Length
				continue
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// committedFile returns the stored version of the file for the layout
// ioctls: EBUSY while the file is being written (its bytes are in a working
// copy, not in packs) or was never committed.
func (n *fileNode) committedFile() (*chunkstore.File, syscall.Errno) {
	n.mu.Lock()
	if n.hasLocalLocked() || n.id.IsZero() {
		n.mu.Unlock()
		return nil, syscall.EBUSY
	}
	sf, err := n.storeFileLocked()
	n.mu.Unlock()
	if err != nil {
		return nil, toErrno(err)
	}
	return sf, 0
}
