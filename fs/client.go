package fs

// The node's client socket (docs/design/client.md) authenticates every
// request by a file descriptor the caller opened in the mount: the kernel
// checked the caller's permission at that open (default_permissions), so
// holding a readable fd of a file proves the caller may read it. This file
// maps such a received fd back to the file's node and stored version.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// FileOfFd returns the committed version of the file that fd (a descriptor
// received from a client) is open on. It refuses, with an error wrapping
// the errno the client is told:
//   - EXDEV: fd is not on this mount (another file system, or another mount)
//   - EISDIR / EINVAL: a directory / not a regular file
//   - EBADF: fd is an O_PATH descriptor (no permission was checked to
//     make it) or open for writing only
//   - ESTALE: the file is no longer reachable in the mount (unlinked)
//   - EBUSY: the file is being written (its bytes are in a working copy)
//     or was never committed
func (f *FS) FileOfFd(fd int) (*chunkstore.File, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("client fd: %w", err)
	}
	// An O_PATH fd is made without any permission check: it proves nothing.
	if fl&unix.O_PATH != 0 {
		return nil, fmt.Errorf("client fd is an O_PATH descriptor; open the file for reading: %w", syscall.EBADF)
	}
	if fl&unix.O_ACCMODE == unix.O_WRONLY {
		return nil, fmt.Errorf("client fd is open for writing only; open the file for reading: %w", syscall.EBADF)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("client fd: %w", err)
	}
	dev, err := f.mountDev()
	if err != nil {
		return nil, err
	}
	if st.Dev != dev {
		return nil, fmt.Errorf("client fd is not a file in this node's mount %s: %w", f.mountDir, syscall.EXDEV)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return nil, fmt.Errorf("client fd is a directory: %w", syscall.EISDIR)
	default:
		return nil, fmt.Errorf("client fd is not a regular file: %w", syscall.EINVAL)
	}
	n := f.fileNodeByIno(st.Ino)
	if n == nil {
		return nil, fmt.Errorf("the file of the client fd (inode %d) is no longer in the mount: %w", st.Ino, syscall.ESTALE)
	}
	sf, errno := n.committedFile()
	if errno != 0 {
		return nil, fmt.Errorf("the file of the client fd is being written or was never committed: %w", errno)
	}
	return sf, nil
}

// PathOfFd is the namespace path of the file of the mount a client's fd
// is open on, as the kernel names it now ("" if it cannot say: renamed
// away, or not on this mount). For reports only: FileOfFd says which
// file it is.
func (f *FS) PathOfFd(fd int) string {
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || f.mountDir == "" {
		return ""
	}
	rel, ok := strings.CutPrefix(p, filepath.Clean(f.mountDir)+"/")
	if !ok || strings.HasSuffix(rel, " (deleted)") {
		return ""
	}
	return rel
}

// mountDev returns the device number of the mount (the FUSE connection's
// anonymous device), which every file in it reports as st_dev. A stat of
// the mount's root is answered from the kernel's attribute cache mostly.
func (f *FS) mountDev() (uint64, error) {
	if f.mountDir == "" {
		return 0, fmt.Errorf("not mounted: %w", syscall.ENODEV)
	}
	var st unix.Stat_t
	if err := unix.Stat(f.mountDir, &st); err != nil {
		return 0, fmt.Errorf("mount %s: %w", f.mountDir, err)
	}
	return st.Dev, nil
}

// fileNodeByIno finds the file node with inode number ino among the nodes
// go-fuse knows (a file a client holds open is known: the kernel's open
// keeps its inode referenced, so go-fuse cannot have forgotten it). The
// walk visits the loaded tree once; it costs microseconds per thousand
// loaded nodes, and keeps fs free of a second registry of inodes that
// would have to follow go-fuse's forgets.
func (f *FS) fileNodeByIno(ino uint64) *fileNode {
	var found *fileNode
	f.eachLoaded(func(c *gofs.Inode) bool {
		if c.StableAttr().Ino == ino {
			if fn, ok := c.Operations().(*fileNode); ok {
				found = fn
				return false
			}
		}
		return true
	})
	return found
}

// eachLoaded calls fn with every node below the root go-fuse knows, each
// once, until fn returns false.
func (f *FS) eachLoaded(fn func(*gofs.Inode) bool) {
	root := f.root.EmbeddedInode()
	seen := map[*gofs.Inode]bool{root: true}
	stack := []*gofs.Inode{root}
	for len(stack) > 0 {
		in := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range in.Children() {
			if seen[c] {
				continue
			}
			seen[c] = true
			if !fn(c) {
				return
			}
			if c.IsDir() {
				stack = append(stack, c)
			}
		}
	}
}

// PassthroughChanged tells the mount that file version id may now have a
// pack that holds exactly its bytes (a whole copy was made: docs/design/
// whole.md), so its next open asks the store again instead of going to
// the node as the last one did.
func (f *FS) PassthroughChanged(id chunkstore.ID) {
	f.eachLoaded(func(c *gofs.Inode) bool {
		if fn, ok := c.Operations().(*fileNode); ok {
			fn.mu.Lock()
			if fn.id == id {
				fn.notPT = false
			}
			fn.mu.Unlock()
		}
		return true
	})
}
