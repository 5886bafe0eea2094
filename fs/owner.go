package fs

import (
	"context"
	"fmt"
	iofs "io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kylix/kylix/chunkstore"
)

// Ownership (docs/design/ownership.md). The mount runs with
// default_permissions, so the kernel checks every permission from the
// attributes we return, and with go-fuse's init flags (no
// HANDLE_KILLPRIV, no ATOMIC_O_TRUNC, no DONT_MASK) it also applies the
// umask, strips setgid where POSIX says so, and turns "clear setuid and
// setgid" (write, truncate or chown by an unprivileged caller) into an
// ordinary SETATTR of the mode. What it leaves to the file system, and
// what this file does, is: record what SETATTR says (owner, group, the
// full mode), and give a new entry its owner (the caller) and group (the
// caller's, or the directory's when the directory is setgid, which a new
// subdirectory also inherits), as ext4's inode_init_owner does.

// owner returns the uid and gid stat shows for a stored owner: entries
// recorded before owners were stored show the node's own user, as they
// always did.
func (f *FS) owner(uid, gid uint32) (uint32, uint32) {
	if uid == chunkstore.OwnerUnknown {
		uid = f.uid
	}
	if gid == chunkstore.OwnerUnknown {
		gid = f.gid
	}
	return uid, gid
}

// newOwner returns the owner, group and mode of an entry a caller creates
// in the directory whose entry is parent, with the mode the kernel asked
// for (umask already applied). dir: the new entry is a directory.
func (f *FS) newOwner(ctx context.Context, parent chunkstore.Entry, mode uint32, dir bool) (uid, gid uint32, m iofs.FileMode) {
	uid, gid = f.uid, f.gid
	if c, ok := fuse.FromContext(ctx); ok {
		uid, gid = c.Uid, c.Gid
	}
	m = chunkstore.ModeFromUnix(mode & 0o7777)
	if parent.Mode&iofs.ModeSetgid != 0 {
		_, gid = f.owner(parent.UID, parent.GID)
		if dir {
			m |= iofs.ModeSetgid
		}
	}
	return uid, gid, m
}

// setMeta applies the owner, group, mode and mtime a SETATTR carries to
// an entry's fields and reports whether any of them was set. The kernel
// has already checked that the caller may make the change and cleared
// what POSIX says a change clears, so the values are stored as given.
func setMeta(f *FS, in *fuse.SetAttrIn, mode *iofs.FileMode, uid, gid *uint32, mtime, ctime, atime *int64) bool {
	changed := false
	defer func() {
		if changed {
			*ctime = time.Now().UnixNano()
		}
	}()
	newUID, hasUID := in.GetUID()
	newGID, hasGID := in.GetGID()
	if hasUID || hasGID {
		// An owner recorded as unknown becomes the one it was shown as.
		*uid, *gid = f.owner(*uid, *gid)
		if hasUID {
			*uid = newUID
		}
		if hasGID {
			*gid = newGID
		}
		changed = true
	}
	if m, ok := in.GetMode(); ok {
		*mode = chunkstore.ModeFromUnix(m)
		changed = true
	}
	if t, ok := in.GetMTime(); ok {
		*mtime = t.UnixNano()
		changed = true
	}
	if t, ok := in.GetATime(); ok {
		if *atime = t.UnixNano(); *atime == 0 {
			*atime = 1 // 0 is "none recorded"; 1 ns after the epoch is as old
		}
		changed = true
	}
	return changed
}

// dropsSGID reports whether a SETATTR on a regular file with mode and
// group gid must also clear setgid, where the kernel's FUSE code does not
// say so itself. Since Linux 6.2 the VFS clears setgid on a write or
// truncate by a caller without CAP_FSETID who is not in the file's group,
// even without group exec (setattr_should_drop_sgid); fuse_setattr
// recomputes the kill with the older rule (setgid only with group exec)
// and sends an empty SETATTR (write) or one with just the size and times
// (truncate). The node applies the newer rule to those requests. (An
// empty SETATTR is only sent when the VFS decided to kill, so the group
// check only changes the answer for a truncate, which sends its SETATTR
// either way.) Root
// stands for CAP_FSETID; the caller's groups are read from
// /proc/PID/status, and a caller whose groups cannot be read is taken as
// not in the group (the bit is dropped, never wrongly kept).
func (f *FS) dropsSGID(ctx context.Context, in *fuse.SetAttrIn, mode iofs.FileMode, uid, gid uint32) bool {
	const explicit = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID
	if mode&iofs.ModeSetgid == 0 || mode&0o010 != 0 || in.Valid&explicit != 0 {
		return false
	}
	if in.Valid&^(fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) != 0 && in.Valid&fuse.FATTR_SIZE == 0 {
		return false // not a write's or truncate's request
	}
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Uid == 0 {
		return false
	}
	_, g := f.owner(uid, gid)
	return !callerInGroup(c, g)
}

// callerInGroup reports whether the calling task has gid as its group or
// one of its supplementary groups.
func callerInGroup(c *fuse.Caller, gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err != nil {
		return false
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, "Groups:")
		if !ok {
			continue
		}
		for _, g := range strings.Fields(rest) {
			if v, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(v) == gid {
				return true
			}
		}
	}
	return false
}
