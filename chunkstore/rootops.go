package chunkstore

// Descriptor-relative file operations for import and export. Root imports
// trees that other users own and exports into directories they own; those
// users can rename and symlink under our feet. So a path is resolved once,
// to a directory descriptor, and everything below it is reached one
// component at a time relative to its parent's descriptor, never following
// a symlink it did not mean to follow; what an entry is (file, directory,
// link), its owner and its mode come from fstat of the very descriptor its
// bytes are read from or written to (docs/design/rootops.md).

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// noOpenat2 is set once openat2(2) answered ENOSYS (kernels before 5.6, or
// a seccomp filter that does not know it): the fallbacks are used from then
// on.
var noOpenat2 atomic.Bool

// openat2 calls openat2(2) with how, retrying on EINTR; ok is false when the
// kernel does not have it.
func openat2(dirfd int, name string, how *unix.OpenHow) (fd int, ok bool, err error) {
	if noOpenat2.Load() {
		return -1, false, nil
	}
	for {
		fd, err = unix.Openat2(dirfd, name, how)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ENOSYS {
			noOpenat2.Store(true)
			return -1, false, nil
		}
		return fd, true, err
	}
}

func openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openBeneath opens name, one component, in the directory dirfd without
// following a symlink: a link at name is opened as itself with
// O_PATH|O_NOFOLLOW and refused (ELOOP) otherwise. openat2's
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS holds it inside
// dirfd even if a name with a slash got this far; without openat2 such a
// name is refused here, and O_NOFOLLOW does the rest.
func openBeneath(dirfd int, name string, flags int, mode uint32) (int, error) {
	how := &unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) == 0 {
		how.Mode = 0 // openat2 refuses a mode without O_CREAT
	}
	if fd, ok, err := openat2(dirfd, name, how); ok {
		return fd, err
	}
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return -1, unix.EINVAL
	}
	return openat(dirfd, name, flags|unix.O_NOFOLLOW, mode)
}

// openFollow opens name in dirfd following symlinks (a followed import
// link), but never a "magic" link such as /proc/self/fd/N, which would
// reach this process's own open files rather than a path anyone named.
func openFollow(dirfd int, name string, flags int) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: unix.RESOLVE_NO_MAGICLINKS}
	if fd, ok, err := openat2(dirfd, name, how); ok {
		return fd, err
	}
	return openat(dirfd, name, flags, 0)
}

// procSelfFD is where this process's descriptors are named (a test points
// it elsewhere to exercise the fallback).
var procSelfFD = "/proc/self/fd/"

// reopen opens the inode the O_PATH descriptor pathfd refers to for
// reading, without resolving any name again: through /proc/self/fd, so
// that whatever was renamed meanwhile, the bytes read are those of the file
// that was fstat'ed (and a device or FIFO put in its place is never opened).
// Where /proc is not mounted it opens name in dirfd again (following only
// when follow is set) and checks that it reached the same inode; a
// mismatch is ErrSourceChanged.
func reopen(pathfd int, st *unix.Stat_t, dirfd int, name string, follow bool) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := openat(unix.AT_FDCWD, procSelfFD+strconv.Itoa(pathfd), flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if dirfd == unix.AT_FDCWD { // SRC itself, a path
			nf := flags | unix.O_NONBLOCK
			if !follow {
				nf |= unix.O_NOFOLLOW
			}
			fd, err = openat(dirfd, name, nf, 0)
		} else if follow {
			fd, err = openFollow(dirfd, name, flags|unix.O_NONBLOCK)
		} else {
			fd, err = openBeneath(dirfd, name, flags|unix.O_NONBLOCK, 0)
		}
		if err == nil {
			var got unix.Stat_t
			if err = unix.Fstat(fd, &got); err == nil && (got.Dev != st.Dev || got.Ino != st.Ino) {
				err = ErrSourceChanged
			}
			if err == nil {
				err = unix.SetNonblock(fd, false)
			}
			if err != nil {
				unix.Close(fd)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readlinkFd reads the target of the symlink the O_PATH|O_NOFOLLOW
// descriptor fd refers to.
func readlinkFd(fd int) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// fileMode is the FileMode of a stat(2) mode: type, permission and special
// bits.
func fileMode(m uint32) fs.FileMode {
	mode := ModeFromUnix(m)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	return mode
}

// maxLinks bounds the symlinks followed while resolving one path, as the
// kernel's MAXSYMLINKS does.
const maxLinks = 40

// openDestDir opens the directory at path (export's destination's parent)
// as an O_PATH descriptor, one component at a time. Run as root, a symlink
// on the way is followed only when root owns it: a link another user owns
// is one they can repoint at any moment (at /etc, say), so it is refused
// with ErrUnsafeSymlink, naming it. Not run as root, every link is followed:
// the kernel's permission checks then bound where the export can write.
// ".." is resolved against the directory actually reached, never by
// trimming the string.
func openDestDir(path string) (int, error) {
	start := "."
	if strings.HasPrefix(path, "/") {
		start = "/"
	}
	fd, err := openat(unix.AT_FDCWD, start, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(path, "/")
	walked := strings.TrimSuffix(start, ".")
	links := 0
	for len(comps) > 0 {
		c := comps[0]
		comps = comps[1:]
		if c == "" || c == "." {
			continue
		}
		next, err := openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW, 0)
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", walked+c, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			unix.Close(fd)
			return -1, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			unix.Close(fd)
			fd = next
			walked += c + "/"
		case unix.S_IFLNK:
			target, err := readlinkFd(next)
			unix.Close(next)
			switch {
			case err != nil:
			case os.Geteuid() == 0 && st.Uid != 0:
				err = fmt.Errorf("%s is a symlink owned by uid %d, and export run as root follows only root's symlinks on the way to its destination (name the directory it leads to instead): %w", walked+c, st.Uid, ErrUnsafeSymlink)
			case links >= maxLinks:
				err = fmt.Errorf("%s: %w", walked+c, unix.ELOOP)
			}
			if err != nil {
				unix.Close(fd)
				return -1, err
			}
			links++
			if strings.HasPrefix(target, "/") {
				root, err := openat(unix.AT_FDCWD, "/", unix.O_PATH|unix.O_DIRECTORY, 0)
				if err != nil {
					unix.Close(fd)
					return -1, err
				}
				unix.Close(fd)
				fd = root
			}
			comps = append(strings.Split(target, "/"), comps...)
			walked += c + "/" // as named; the target's components follow
		default:
			unix.Close(next)
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", walked+c, unix.ENOTDIR)
		}
	}
	return fd, nil
}

// fileType is the S_IFMT bits of a special kind.
func fileType(k Kind) uint32 {
	switch k {
	case KindFifo:
		return unix.S_IFIFO
	case KindSocket:
		return unix.S_IFSOCK
	case KindCharDev:
		return unix.S_IFCHR
	case KindBlockDev:
		return unix.S_IFBLK
	}
	return 0
}

// mknodBeneath creates the special file e (a fifo, socket or device node)
// as name in the directory dirfd and gives it e's owner (as root), mode
// (as exportMode says) and mtime. mknodat(2) never follows a symlink at name (it fails with
// EEXIST); the node is then opened as itself (O_PATH|O_NOFOLLOW, never
// opened for I/O: a fifo would block, a device would be the device), and
// checked to be what was just made (its type, one link, our owner), so a
// user who swaps it for something else meanwhile makes the export fail
// rather than change another file's owner or mode. The mode is set
// through /proc/self/fd, which reaches that very inode.
func mknodBeneath(dirfd int, name string, e Entry, mode fs.FileMode) error {
	typ := fileType(e.Kind)
	if err := unix.Mknodat(dirfd, name, typ|0o600, int(e.Rdev)); err != nil {
		return err
	}
	fd, err := openBeneath(dirfd, name, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != typ || st.Nlink != 1 || st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("replaced while being exported: %w", fs.ErrExist)
	}
	if os.Geteuid() == 0 && e.UID != OwnerUnknown {
		if err := unix.Fchownat(fd, "", int(e.UID), int(e.GID), unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
	}
	proc := procSelfFD + strconv.Itoa(fd)
	if err := unix.Chmod(proc, UnixMode(mode)); err != nil {
		return fmt.Errorf("mode (through %s, which needs /proc): %w", proc, err)
	}
	if e.MTime != 0 {
		ts := unix.NsecToTimespec(e.MTime)
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, proc, []unix.Timespec{ts, ts}, 0); err != nil {
			return fmt.Errorf("mtime: %w", err)
		}
	}
	return nil
}

// exportLinks is what an export keeps of the link sets it wrote: an
// O_PATH descriptor of the first name of each (never a path, which could
// be swapped for a symlink), from which its other names are hard-linked.
type exportLinks struct {
	table *DirManifest
	first map[uint64]int
}

// remember keeps the file just exported as name in dirfd as link set
// e.Link's first name, if it is what was written (a regular file, or the
// special file or symlink e is).
func (x *exportLinks) remember(e Entry, dirfd int, name string) {
	fd, err := openBeneath(dirfd, name, unix.O_PATH, 0)
	if err != nil {
		return // not made (a device when not root): its names are not either
	}
	x.first[e.Link] = fd
}

func (x *exportLinks) close() {
	for _, fd := range x.first {
		unix.Close(fd)
	}
}

// linkFd makes name in dirfd a hard link to the inode the O_PATH
// descriptor fd refers to: through /proc/self/fd (AT_SYMLINK_FOLLOW
// follows that magic link to the inode itself, for any user), else with
// AT_EMPTY_PATH (which needs CAP_DAC_READ_SEARCH).
func linkFd(fd, dirfd int, name string) error {
	err := unix.Linkat(unix.AT_FDCWD, procSelfFD+strconv.Itoa(fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.ENOENT) {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Nlink > 0 {
			err = unix.Linkat(fd, "", dirfd, name, unix.AT_EMPTY_PATH)
		}
	}
	return err
}
