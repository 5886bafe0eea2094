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
	for _, x := range sf.ExtentsIn(int64(req.Offset), int64(end-req.Offset)) {
		if len(rep.Extents) == layout.MaxExtents {
			rep.NextOffset = uint64(x.FileOff)
			break
		}
		e := layout.Extent{FileOffset: uint64(x.FileOff), Length: uint64(x.Len)}
		if x.Pack != 0 {
			e.PackID, e.PackOffset, e.Flags = x.Pack, uint64(x.PackOff), layout.ExtentLocal
			if whole {
				e.Flags |= layout.ExtentWholeFile
			}
		}
		rep.Extents = append(rep.Extents, e)
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
	for _, x := range sf.Extents() {
		if x.Pack == id {
			copy(output, input)
			if layout.EncodePackPathReply(output, x.PackPath) != nil {
				return syscall.EINVAL
			}
			return 0
		}
	}
	return syscall.EINVAL
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
