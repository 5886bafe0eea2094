package fs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/kylix/kylix/chunkstore"
)

// The extended attributes every file shows (read-only).
const (
	// xattrPath: "passthrough" when opens are served by FUSE passthrough
	// from a pack holding exactly the file, else "daemon".
	xattrPath = "user.kylix.path"
	// xattrID: the manifest ID (files) or directory manifest ID.
	xattrID = "user.kylix.id"
	// xattrChunks: the number of chunks.
	xattrChunks = "user.kylix.chunks"
	// xattrResidency: "local", "partial" or "not local".
	xattrResidency = "user.kylix.residency"
	// xattrState: "committed" or "writing" (a working copy not yet
	// committed).
	xattrState = "user.kylix.state"
	// xattrVerify: what checks the bytes a reader of this file gets
	// (docs/design/verification.md).
	xattrVerify = "user.kylix.verify"
)

var fileXattrs = []string{xattrPath, xattrID, xattrChunks, xattrResidency, xattrState, xattrVerify}

// xattrValue answers a getxattr with v: its size when dest is empty,
// ERANGE when dest is too small.
func xattrValue(dest []byte, v string) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func xattrList(dest []byte, names []string) (uint32, syscall.Errno) {
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(0)
	}
	return xattrValue(dest, b.String())
}

// xattrAbsent is the answer to a getxattr or removexattr of an attribute
// a file does not have, by namespace. Kylix stores no extended attributes
// (Setxattr) and only computes its own user.kylix.* ones: in user.* an
// attribute is absent (ENODATA); the other namespaces (security.*,
// trusted.*, system.* with its POSIX ACLs, which the mount leaves off)
// are not supported at all (ENOTSUP: to the kernel, no file
// capabilities). That is also what a tool may cache: `ls -l` asks every
// entry for security.selinux and system.posix_acl_access and, told
// ENOTSUP once, stops asking on that mount, where ENODATA would cost two
// round trips to the node per entry (docs/design/fs.md, "FUSE settings
// for many small files").
func xattrAbsent(attr string) syscall.Errno {
	if strings.HasPrefix(attr, "user.") {
		return syscall.ENODATA
	}
	return syscall.ENOTSUP
}

func (n *fileNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	n.fsys.stats.xattrAsks.Add(1)
	if !strings.HasPrefix(attr, "user.kylix.") {
		return 0, xattrAbsent(attr)
	}
	n.mu.Lock()
	local := n.hasLocalLocked()
	var sf *chunkstore.File
	var err error
	if !local && !n.id.IsZero() {
		sf, err = n.storeFileLocked()
		n.idleLocked()
	}
	id := n.id
	n.mu.Unlock()
	if err != nil {
		return 0, toErrno(err)
	}
	var v string
	switch attr {
	case xattrState:
		v = "committed"
		if local {
			v = "writing"
		}
	case xattrPath:
		v = n.fsys.servedByText(sf) // ptstate.go
	case xattrVerify:
		v = n.fsys.verifyText(sf)
	case xattrID:
		if local || id.IsZero() {
			return 0, syscall.ENODATA
		}
		v = id.String()
	case xattrChunks:
		if sf == nil {
			return 0, syscall.ENODATA
		}
		v = strconv.Itoa(len(sf.M.Chunks))
	case xattrResidency:
		v = "local"
		if sf != nil {
			v = residency(sf)
		}
	default:
		return 0, syscall.ENODATA
	}
	return xattrValue(dest, v)
}

func residency(sf *chunkstore.File) string {
	local, remote := false, false
	for _, e := range sf.Extents() {
		if e.Pack == 0 {
			remote = true
		} else {
			local = true
		}
	}
	switch {
	case remote && local:
		return "partial"
	case remote:
		return "not local"
	}
	return "local"
}

func (n *fileNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return xattrList(dest, fileXattrs)
}

// Setxattr and Removexattr of every kind of node, and Getxattr of those
// that have no attributes of their own (symlinks, FIFOs, sockets, device
// nodes; files and directories compute their user.kylix.* ones): one
// rule for all. Kylix stores no extended attributes of its own; its
// user.kylix.* attributes are computed and read-only. Every node answers:
// a directory that said "no such attribute" (go-fuse's answer for a node
// without the method) to setxattr of system.posix_acl_access made
// `cp -a` of a tree into the mount fail ("preserving permissions: No data
// available"), where ENOTSUP makes it fall back to chmod.
func (b *base) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if strings.HasPrefix(attr, "user.kylix.") {
		return syscall.EPERM
	}
	return syscall.ENOTSUP
}

func (b *base) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if strings.HasPrefix(attr, "user.kylix.") {
		return syscall.EPERM
	}
	return xattrAbsent(attr)
}

func (b *base) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	b.fsys.stats.xattrAsks.Add(1)
	return 0, xattrAbsent(attr)
}

// verifyText says what guarantee holds for reads of sf on this node.
func (f *FS) verifyText(sf *chunkstore.File) string {
	const daemon = "daemon: every chunk is hashed when the node reads it"
	if sf == nil || !f.passthrough {
		return daemon
	}
	_, c, ok := f.s.PackState(sf)
	switch {
	case !ok:
		return daemon
	case c == nil && sf.Size() > chunkstore.InlineCheckMax:
		return "daemon until the pack check finishes (every chunk hashed as the node reads it; the pack is hashed in the background, or proven by the node reading every chunk), then passthrough"
	case c == nil:
		return "passthrough after a check: the pack is hashed whole at the next open"
	case !c.OK():
		return "daemon: the pack failed its check (" + c.Err().Error() + "); every chunk is hashed when the node reads it"
	case c.Verity:
		return "passthrough, fs-verity: the kernel checks every read"
	}
	return "passthrough, " + PassthroughGuarantee(f.opts.ScrubRate)
}

// PassthroughGuarantee words what holds for passthrough reads without
// fs-verity, given the scrub rate in bytes per second (0: off).
func PassthroughGuarantee(scrubRate int64) string {
	g := "verified at first open (hashed whole at its first open after each boot or change of the pack file)"
	if scrubRate > 0 {
		return g + fmt.Sprintf(" + scrub at %.4g MiB/s; a later flip on disk is caught by the scrub or the next change, not by every read", float64(scrubRate)/(1<<20))
	}
	return g + "; scrub off: a later flip on disk is caught only at the next boot or change of the pack"
}
