package fs_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"

	"github.com/kylix/kylix/internal/testneeds"
)

// cred is who runs an operation; nil is root (the test itself).
type cred struct {
	uid, gid uint32
	groups   []uint32
}

var (
	nobody = &cred{uid: 65534, gid: 65534}
	// user1000 is in groups 1000 and 2000, not 3000.
	user1000 = &cred{uid: 1000, gid: 1000, groups: []uint32{1000, 2000}}
)

func (c *cred) String() string {
	if c == nil {
		return "root"
	}
	return fmt.Sprintf("uid %d groups %v", c.uid, c.groups)
}

// as runs fn with c's credentials. It does what `setpriv --reuid --regid
// --groups` does for a child process, on one OS thread: Linux credentials
// are per thread and the raw syscalls change only the calling one (Go's
// syscall.Setuid would change every thread of the test). The thread is
// locked and never unlocked, so it dies with the goroutine and no other
// code ever runs on it with those credentials. FUSE requests carry the
// calling thread's fsuid/fsgid, and the kernel checks permissions with
// its credentials, exactly as for a separate process.
func as(c *cred, fn func() error) error {
	if c == nil {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		groups := c.groups
		if len(groups) == 0 {
			groups = []uint32{c.gid}
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
			done <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(c.gid), uintptr(c.gid), uintptr(c.gid)); e != 0 {
			done <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(c.uid), uintptr(c.uid), uintptr(c.uid)); e != 0 {
			done <- fmt.Errorf("setresuid: %w", e)
			return
		}
		done <- fn()
	}()
	return <-done
}

// op is one system call made by who; want, when set, is the errno ext4
// gives (checked on both, so the test cannot drift from what it claims).
type op struct {
	who  *cred
	name string
	fn   func(dir string) error
	want *syscall.Errno
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.Errno(9999)
}

func ok() *syscall.Errno { e := syscall.Errno(0); return &e }
func fails(e syscall.Errno) *syscall.Errno {
	return &e
}

func create(p string, mode uint32) error {
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, mode)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func appendTo(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte("x")); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ownerCase is a scenario run the same way on ext4 and on the mount, each
// in a fresh directory "d" (root's, 0755) prepared by setup (as root).
type ownerCase struct {
	name  string
	setup []op
	ops   []op
	stat  []string // paths (relative to the case dir) whose lstat is compared
}

func rootOp(name string, fn func(string) error) op { return op{name: name, fn: fn} }

func ownerCases() []ownerCase {
	j := filepath.Join
	long := func(n int) string { return strings.Repeat("n", n) }
	return []ownerCase{
		{
			name:  "create as 65534 takes the caller's owner",
			setup: []op{rootOp("chmod 0777", func(d string) error { return os.Chmod(d, 0o777) })},
			ops: []op{
				{who: nobody, name: "creat f 0644", fn: func(d string) error { return create(j(d, "f"), 0o644) }, want: ok()},
				{who: nobody, name: "mkdir sub 0755", fn: func(d string) error { return unix.Mkdir(j(d, "sub"), 0o755) }, want: ok()},
				{who: nobody, name: "symlink l", fn: func(d string) error { return unix.Symlink("f", j(d, "l")) }, want: ok()},
				{who: nobody, name: "creat with setuid", fn: func(d string) error { return create(j(d, "suid"), 0o4755) }, want: ok()},
			},
			stat: []string{"f", "sub", "l", "suid"},
		},
		{
			name: "chown by root, by non-root (EPERM), to oneself",
			setup: []op{
				rootOp("creat f", func(d string) error { return create(j(d, "f"), 0o644) }),
				rootOp("creat g", func(d string) error { return create(j(d, "g"), 0o644) }),
				rootOp("chown g 65534", func(d string) error { return os.Chown(j(d, "g"), 65534, 65534) }),
				rootOp("symlink l", func(d string) error { return unix.Symlink("f", j(d, "l")) }),
				rootOp("mkdir dd", func(d string) error { return unix.Mkdir(j(d, "dd"), 0o755) }),
			},
			ops: []op{
				{name: "chown f 65534:65534", fn: func(d string) error { return os.Chown(j(d, "f"), 65534, 65534) }, want: ok()},
				{name: "chown dd 65534:65534", fn: func(d string) error { return os.Chown(j(d, "dd"), 65534, 65534) }, want: ok()},
				{who: nobody, name: "chmod dd 1700 by its new owner", fn: func(d string) error { return unix.Chmod(j(d, "dd"), 0o1700) }, want: ok()},
				{who: user1000, name: "chown dd by another", fn: func(d string) error { return os.Chown(j(d, "dd"), 1000, 1000) }, want: fails(syscall.EPERM)},
				{who: nobody, name: "chown g 0", fn: func(d string) error { return os.Chown(j(d, "g"), 0, -1) }, want: fails(syscall.EPERM)},
				{who: nobody, name: "chown g 65534 (no change)", fn: func(d string) error { return os.Chown(j(d, "g"), 65534, 65534) }, want: ok()},
				{name: "lchown l 1000:2000", fn: func(d string) error { return os.Lchown(j(d, "l"), 1000, 2000) }, want: ok()},
				{who: nobody, name: "chown f by owner to 1000", fn: func(d string) error { return os.Chown(j(d, "f"), 1000, -1) }, want: fails(syscall.EPERM)},
			},
			stat: []string{"f", "g", "l", "dd"},
		},
		{
			name: "chgrp to a group the caller is in, not to another",
			setup: []op{
				rootOp("creat f", func(d string) error { return create(j(d, "f"), 0o644) }),
				rootOp("chown f 1000:1000", func(d string) error { return os.Chown(j(d, "f"), 1000, 1000) }),
			},
			ops: []op{
				{who: user1000, name: "chgrp f 2000", fn: func(d string) error { return os.Chown(j(d, "f"), -1, 2000) }, want: ok()},
				{who: user1000, name: "chgrp f 3000", fn: func(d string) error { return os.Chown(j(d, "f"), -1, 3000) }, want: fails(syscall.EPERM)},
			},
			stat: []string{"f"},
		},
		{
			name: "chmod keeps setuid, setgid and sticky; non-owner EPERM",
			setup: []op{
				rootOp("creat u", func(d string) error { return create(j(d, "u"), 0o644) }),
				rootOp("creat g", func(d string) error { return create(j(d, "g"), 0o644) }),
				rootOp("mkdir t", func(d string) error { return unix.Mkdir(j(d, "t"), 0o755) }),
			},
			ops: []op{
				{name: "chmod u 4755", fn: func(d string) error { return os.Chmod(j(d, "u"), 0o755|os.ModeSetuid) }, want: ok()},
				{name: "chmod g 2755", fn: func(d string) error { return unix.Chmod(j(d, "g"), 0o2755) }, want: ok()},
				{name: "chmod t 1777", fn: func(d string) error { return unix.Chmod(j(d, "t"), 0o1777) }, want: ok()},
				{who: nobody, name: "chmod u 0777 by non-owner", fn: func(d string) error { return unix.Chmod(j(d, "u"), 0o777) }, want: fails(syscall.EPERM)},
			},
			stat: []string{"u", "g", "t"},
		},
		{
			name: "setgid on a file of a group the owner is not in is cleared",
			setup: []op{
				rootOp("creat f", func(d string) error { return create(j(d, "f"), 0o644) }),
				rootOp("chown f 1000:3000", func(d string) error { return os.Chown(j(d, "f"), 1000, 3000) }),
				rootOp("creat g", func(d string) error { return create(j(d, "g"), 0o644) }),
				rootOp("chown g 1000:2000", func(d string) error { return os.Chown(j(d, "g"), 1000, 2000) }),
			},
			ops: []op{
				{who: user1000, name: "chmod f 2755", fn: func(d string) error { return unix.Chmod(j(d, "f"), 0o2755) }, want: ok()},
				{who: user1000, name: "chmod g 2755", fn: func(d string) error { return unix.Chmod(j(d, "g"), 0o2755) }, want: ok()},
			},
			stat: []string{"f", "g"},
		},
		{
			name: "write by a non-owner clears setuid (and setgid with group exec); root's write does not",
			setup: []op{
				rootOp("creat a 6777", func(d string) error { return create(j(d, "a"), 0o777) }),
				rootOp("chmod a 6777", func(d string) error { return unix.Chmod(j(d, "a"), 0o6777) }),
				rootOp("creat b 2767", func(d string) error { return create(j(d, "b"), 0o777) }),
				rootOp("chmod b 2767", func(d string) error { return unix.Chmod(j(d, "b"), 0o2767) }),
				rootOp("creat c 4777", func(d string) error { return create(j(d, "c"), 0o777) }),
				rootOp("chmod c 4777", func(d string) error { return unix.Chmod(j(d, "c"), 0o4777) }),
				rootOp("creat m", func(d string) error { return create(j(d, "m"), 0o777) }),
				rootOp("chown m 0:65534", func(d string) error { return os.Chown(j(d, "m"), 0, 65534) }),
				rootOp("chmod m 2767", func(d string) error { return unix.Chmod(j(d, "m"), 0o2767) }),
				rootOp("creat s", func(d string) error { return create(j(d, "s"), 0o777) }),
				rootOp("chown s 0:2000", func(d string) error { return os.Chown(j(d, "s"), 0, 2000) }),
				rootOp("chmod s 2767", func(d string) error { return unix.Chmod(j(d, "s"), 0o2767) }),
			},
			ops: []op{
				{who: nobody, name: "append a", fn: func(d string) error { return appendTo(j(d, "a")) }, want: ok()},
				{who: nobody, name: "append m", fn: func(d string) error { return appendTo(j(d, "m")) }, want: ok()},
				{who: user1000, name: "append s (group 2000 is supplementary)", fn: func(d string) error { return appendTo(j(d, "s")) }, want: ok()},
				{who: nobody, name: "append b", fn: func(d string) error { return appendTo(j(d, "b")) }, want: ok()},
				{name: "append c as root", fn: func(d string) error { return appendTo(j(d, "c")) }, want: ok()},
			},
			// b: since 6.2 the VFS also clears setgid without group exec
			// when the writer is not in the file's group; FUSE's kernel
			// side does not (fs/owner.go dropsSGID), m: the writer is in
			// the group, so it stays; s: the writer is in it through a
			// supplementary group.
			stat: []string{"a", "b", "c", "m", "s"},
		},
		{
			name: "truncate by a non-owner clears setuid; by a non-writer EACCES",
			setup: []op{
				rootOp("creat a", func(d string) error { return create(j(d, "a"), 0o777) }),
				rootOp("chmod a 4777", func(d string) error { return unix.Chmod(j(d, "a"), 0o4777) }),
				rootOp("creat r", func(d string) error { return create(j(d, "r"), 0o644) }),
				rootOp("creat b", func(d string) error { return create(j(d, "b"), 0o777) }),
				rootOp("chmod b 2767", func(d string) error { return unix.Chmod(j(d, "b"), 0o2767) }),
				rootOp("creat s", func(d string) error { return create(j(d, "s"), 0o777) }),
				rootOp("chown s 0:2000", func(d string) error { return os.Chown(j(d, "s"), 0, 2000) }),
				rootOp("chmod s 2767", func(d string) error { return unix.Chmod(j(d, "s"), 0o2767) }),
				rootOp("creat c", func(d string) error { return create(j(d, "c"), 0o777) }),
				rootOp("chmod c 6777", func(d string) error { return unix.Chmod(j(d, "c"), 0o6777) }),
				rootOp("creat o", func(d string) error { return create(j(d, "o"), 0o777) }),
				rootOp("chmod o 6777", func(d string) error { return unix.Chmod(j(d, "o"), 0o6777) }),
			},
			ops: []op{
				{who: nobody, name: "truncate a 0", fn: func(d string) error { return unix.Truncate(j(d, "a"), 0) }, want: ok()},
				{who: nobody, name: "truncate b 0", fn: func(d string) error { return unix.Truncate(j(d, "b"), 0) }, want: ok()},
				{who: user1000, name: "truncate s 0 (in group 2000 as a supplementary group)", fn: func(d string) error { return unix.Truncate(j(d, "s"), 0) }, want: ok()},
				{who: nobody, name: "open o O_TRUNC", fn: func(d string) error {
					f, err := os.OpenFile(j(d, "o"), os.O_WRONLY|os.O_TRUNC, 0)
					if err != nil {
						return err
					}
					return f.Close()
				}, want: ok()},
				{name: "truncate c as root", fn: func(d string) error { return unix.Truncate(j(d, "c"), 1) }, want: ok()},
				{who: nobody, name: "truncate r 0", fn: func(d string) error { return unix.Truncate(j(d, "r"), 0) }, want: fails(syscall.EACCES)},
			},
			stat: []string{"a", "r", "b", "s", "c", "o"},
		},
		{
			name: "non-root chown clears setuid and setgid",
			setup: []op{
				rootOp("creat f", func(d string) error { return create(j(d, "f"), 0o755) }),
				rootOp("chown f 1000:1000", func(d string) error { return os.Chown(j(d, "f"), 1000, 1000) }),
				rootOp("chmod f 6755", func(d string) error { return unix.Chmod(j(d, "f"), 0o6755) }),
				rootOp("creat g", func(d string) error { return create(j(d, "g"), 0o755) }),
				rootOp("chmod g 6755", func(d string) error { return unix.Chmod(j(d, "g"), 0o6755) }),
			},
			ops: []op{
				{who: user1000, name: "chgrp f 2000", fn: func(d string) error { return os.Chown(j(d, "f"), -1, 2000) }, want: ok()},
				{name: "chown g 1000 as root", fn: func(d string) error { return os.Chown(j(d, "g"), 1000, -1) }, want: ok()},
			},
			stat: []string{"f", "g"},
		},
		{
			name: "a setgid directory passes its group on, and setgid to subdirectories",
			setup: []op{
				rootOp("mkdir s", func(d string) error { return unix.Mkdir(j(d, "s"), 0o777) }),
				rootOp("chown s 0:3000", func(d string) error { return os.Chown(j(d, "s"), 0, 3000) }),
				rootOp("chmod s 2777", func(d string) error { return unix.Chmod(j(d, "s"), 0o2777) }),
			},
			ops: []op{
				{who: user1000, name: "creat s/f", fn: func(d string) error { return create(j(d, "s", "f"), 0o644) }, want: ok()},
				{who: user1000, name: "mkdir s/sub", fn: func(d string) error { return unix.Mkdir(j(d, "s", "sub"), 0o755) }, want: ok()},
				{who: user1000, name: "symlink s/l", fn: func(d string) error { return unix.Symlink("f", j(d, "s", "l")) }, want: ok()},
				{who: user1000, name: "creat s/x 2755 (not in group 3000)", fn: func(d string) error { return create(j(d, "s", "x"), 0o2755) }, want: ok()},
				{who: user1000, name: "mkdir s/sub/deeper", fn: func(d string) error { return unix.Mkdir(j(d, "s", "sub", "deeper"), 0o700) }, want: ok()},
			},
			stat: []string{"s", "s/f", "s/sub", "s/l", "s/x", "s/sub/deeper"},
		},
		{
			name: "sticky directory: others' entries cannot be removed or renamed",
			setup: []op{
				rootOp("mkdir t 1777", func(d string) error { return unix.Mkdir(j(d, "t"), 0o777) }),
				rootOp("chmod t 1777", func(d string) error { return unix.Chmod(j(d, "t"), 0o1777) }),
				rootOp("creat t/f", func(d string) error { return create(j(d, "t", "f"), 0o666) }),
				rootOp("chown t/f 1000", func(d string) error { return os.Chown(j(d, "t", "f"), 1000, 1000) }),
				rootOp("creat t/mine", func(d string) error { return create(j(d, "t", "mine"), 0o644) }),
				rootOp("chown t/mine 65534", func(d string) error { return os.Chown(j(d, "t", "mine"), 65534, 65534) }),
			},
			ops: []op{
				{who: nobody, name: "unlink t/f", fn: func(d string) error { return unix.Unlink(j(d, "t", "f")) }, want: fails(syscall.EPERM)},
				{who: nobody, name: "rename t/f t/g", fn: func(d string) error { return unix.Rename(j(d, "t", "f"), j(d, "t", "g")) }, want: fails(syscall.EPERM)},
				{who: nobody, name: "rename t/mine over t/f", fn: func(d string) error { return unix.Rename(j(d, "t", "mine"), j(d, "t", "f")) }, want: fails(syscall.EPERM)},
				{who: nobody, name: "unlink own t/mine", fn: func(d string) error { return unix.Unlink(j(d, "t", "mine")) }, want: ok()},
				{who: user1000, name: "owner renames t/f t/g", fn: func(d string) error { return unix.Rename(j(d, "t", "f"), j(d, "t", "g")) }, want: ok()},
			},
			stat: []string{"t", "t/g"},
		},
		{
			name: "utimensat: NOW needs write permission, explicit times need ownership",
			setup: []op{
				rootOp("creat w 0666", func(d string) error { return create(j(d, "w"), 0o666) }),
				rootOp("chmod w 0666", func(d string) error { return unix.Chmod(j(d, "w"), 0o666) }),
				rootOp("creat r 0644", func(d string) error { return create(j(d, "r"), 0o644) }),
			},
			ops: []op{
				{who: nobody, name: "utimensat w NOW", fn: func(d string) error { return unix.UtimesNanoAt(unix.AT_FDCWD, j(d, "w"), nil, 0) }, want: ok()},
				{who: nobody, name: "utimensat w explicit", fn: func(d string) error {
					ts := []unix.Timespec{{Sec: 1000}, {Sec: 1000}}
					return unix.UtimesNanoAt(unix.AT_FDCWD, j(d, "w"), ts, 0)
				}, want: fails(syscall.EPERM)},
				{who: nobody, name: "utimensat r NOW", fn: func(d string) error { return unix.UtimesNanoAt(unix.AT_FDCWD, j(d, "r"), nil, 0) }, want: fails(syscall.EACCES)},
			},
			stat: []string{"w", "r"},
		},
		{
			name: "rename and unlink in a directory without write permission: EACCES",
			setup: []op{
				rootOp("creat f", func(d string) error { return create(j(d, "f"), 0o666) }),
				rootOp("chown f 65534", func(d string) error { return os.Chown(j(d, "f"), 65534, 65534) }),
			},
			ops: []op{
				{who: nobody, name: "unlink f", fn: func(d string) error { return unix.Unlink(j(d, "f")) }, want: fails(syscall.EACCES)},
				{who: nobody, name: "rename f g", fn: func(d string) error { return unix.Rename(j(d, "f"), j(d, "g")) }, want: fails(syscall.EACCES)},
				{who: nobody, name: "creat h", fn: func(d string) error { return create(j(d, "h"), 0o644) }, want: fails(syscall.EACCES)},
			},
			stat: []string{"f"},
		},
		{
			name: "names: 255 bytes ok, 256 ENAMETOOLONG",
			ops: []op{
				{name: "creat 255", fn: func(d string) error { return create(j(d, long(255)), 0o644) }, want: ok()},
				{name: "creat 256", fn: func(d string) error { return create(j(d, long(256)), 0o644) }, want: fails(syscall.ENAMETOOLONG)},
				{name: "mkdir 256", fn: func(d string) error { return unix.Mkdir(j(d, "m"+long(255)), 0o755) }, want: fails(syscall.ENAMETOOLONG)},
				{name: "stat 256", fn: func(d string) error { _, err := os.Lstat(j(d, long(256))); return err }, want: fails(syscall.ENAMETOOLONG)},
				{name: "rename to 256", fn: func(d string) error { return unix.Rename(j(d, long(255)), j(d, long(256))) }, want: fails(syscall.ENAMETOOLONG)},
				{name: "symlink 256", fn: func(d string) error { return unix.Symlink("x", j(d, long(256))) }, want: fails(syscall.ENAMETOOLONG)},
			},
			stat: []string{long(255)},
		},
	}
}

// statLine is what the test compares of an lstat: type and mode (special
// bits included), owner and group, or the errno.
func statLine(p string) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "lstat: " + errnoOf(err).Error()
	}
	return fmt.Sprintf("mode %07o uid %d gid %d", st.Mode, st.Uid, st.Gid)
}

// runCase runs c in a fresh directory under root and returns one line per
// operation (errno) and per stat. For the mount, m is set: what the store
// recorded (after the committer is done) must be what stat showed.
func runCase(t *testing.T, root string, c ownerCase, m *fstest.Mounted) []string {
	t.Helper()
	d := filepath.Join(root, fmt.Sprintf("case-%x", len(c.name)*7919+int(c.name[0])))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, o := range c.setup {
		if err := o.fn(d); err != nil {
			t.Fatalf("%s: setup %s: %v", root, o.name, err)
		}
	}
	var out []string
	for _, o := range c.ops {
		err := as(o.who, func() error { return o.fn(d) })
		got := errnoOf(err)
		out = append(out, fmt.Sprintf("%s as %v: errno %d (%v)", o.name, o.who, int(got), got))
		if o.want != nil && got != *o.want {
			t.Errorf("%s: %s as %v: errno %v, want %v", root, o.name, o.who, got, *o.want)
		}
	}
	for _, p := range c.stat {
		out = append(out, p+": "+statLine(filepath.Join(d, p)))
	}
	if m != nil {
		if err := m.FS.Sync(); err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(m.Dir, d)
		for i, p := range c.stat {
			if got, want := storeLine(m.Store, filepath.Join(rel, p)), out[len(c.ops)+i]; got != want {
				t.Errorf("the store has %q where stat showed %q", got, want)
			}
		}
	}
	return out
}

// storeLine is statLine for the store's entry at a namespace path.
func storeLine(s *chunkstore.Store, p string) string {
	e, err := s.Lookup(p)
	if err != nil {
		return fmt.Sprintf("%s: lookup: %v", filepath.Base(p), err)
	}
	typ := kindType(e.Kind)
	rel := p[strings.Index(p, "/")+1:]
	return fmt.Sprintf("%s: mode %07o uid %d gid %d", rel, typ|chunkstore.UnixMode(e.Mode), e.UID, e.GID)
}

// ext4Dir returns a directory on ext4 for the reference runs: the test's
// temporary directory when it is on ext4 (as on our machines and CI),
// else a small loop-mounted ext4 image.
func ext4Dir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if isExt4(dir) {
		return dir
	}
	img := filepath.Join(dir, "ext4.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testneeds.Command(t, "mkfs.ext4", "e2fsprogs")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img, "16M").CombinedOutput(); err != nil {
		t.Skipf("the temp dir is not ext4 and mkfs.ext4 failed: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("the temp dir is not ext4 and a loop mount failed: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	if !isExt4(mnt) {
		t.Skip("no ext4 to compare with")
	}
	return mnt
}

// isExt4 reports whether dir's file system is ext4 (statfs says ext2/3/4;
// /proc/self/mountinfo names the driver).
func isExt4(dir string) bool {
	var sfs unix.Statfs_t
	if unix.Statfs(dir, &sfs) != nil || sfs.Type != unix.EXT4_SUPER_MAGIC {
		return false
	}
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return false
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[2] != dev {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				return f[i+1] == "ext4"
			}
		}
	}
	return false
}

// openUp lets the test users reach dir: t.TempDir makes 0700 directories.
func openUp(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOwnershipLikeExt4 runs every case on ext4 and on the mount, as root
// and as other users, and compares each errno and the resulting owners
// and modes.
func TestOwnershipLikeExt4(t *testing.T) {
	fstest.RequireFUSE(t)
	ref := ext4Dir(t)
	openUp(t, ref)
	m := fstest.Mount(t, kfs.Options{})
	openUp(t, filepath.Dir(m.Dir))
	for _, c := range ownerCases() {
		t.Run(c.name, func(t *testing.T) {
			compareLines(t, runCase(t, ref, c, nil), runCase(t, m.Dir, c, m))
		})
	}
}

// TestOwnershipStored checks what the store records: the caller's owner
// for a file created through the mount, chown and chmod committed into
// the directory entry without new file content, and the same after the
// mount's manifests are read back from the store.
func TestOwnershipStored(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	openUp(t, filepath.Dir(m.Dir))
	if err := os.Chmod(m.Dir, 0o755); err != nil {
		t.Fatalf("chmod of the root to what it is: %v", err)
	}
	if err := os.Chmod(m.Dir, 0o1777); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("chmod of the mount root (not stored) = %v, want EPERM", err)
	}
	// A fifo is stored with its owner (fs/special_test.go has the rest).
	if err := as(nobody, func() error { return unix.Mkfifo(filepath.Join(m.Dir, "fifo"), 0o644) }); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("mkfifo by 65534 in the root (0755) = %v, want EACCES", err)
	}
	if err := unix.Mkfifo(filepath.Join(m.Dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Store.Lookup("fifo"); err != nil || e.Kind != chunkstore.KindFifo || e.UID != 0 {
		t.Fatalf("stored fifo %+v, %v", e, err)
	}
	d := filepath.Join(m.Dir, "shared")
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(d, 0o1777); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(d, "f")
	err := as(nobody, func() error { return os.WriteFile(f, []byte("hello"), 0o755) })
	if err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	e, err := m.Store.Lookup("shared/f")
	if err != nil || e.UID != 65534 || e.GID != 65534 || e.Mode != 0o755 {
		t.Fatalf("stored entry %+v, %v; want uid/gid 65534, mode 0755", e, err)
	}
	de, err := m.Store.Lookup("shared")
	if err != nil || chunkstore.UnixMode(de.Mode) != 0o1777 || de.UID != 0 {
		t.Fatalf("stored dir %+v, %v; want 01777 owned by root", de, err)
	}
	before := e.ID
	if err := os.Chown(f, 1000, 2000); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(f, 0o4750); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	e, err = m.Store.Lookup("shared/f")
	if err != nil || e.UID != 1000 || e.GID != 2000 || chunkstore.UnixMode(e.Mode) != 0o4750 {
		t.Fatalf("after chown/chmod: %+v, %v", e, err)
	}
	if e.ID != before {
		t.Fatalf("chown/chmod made a new version %s (was %s): owners live in the directory entry", e.ID.Short(), before.Short())
	}
	// A rewrite keeps owner and mode (as root: setuid stays).
	if err := os.WriteFile(f, []byte("hello again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	e, err = m.Store.Lookup("shared/f")
	if err != nil || e.UID != 1000 || e.GID != 2000 || chunkstore.UnixMode(e.Mode) != 0o4750 || e.ID == before {
		t.Fatalf("after a rewrite: %+v, %v", e, err)
	}
}

// TestOwnerChangedBehindTheMount: an owner changed in the store (an import
// or, later, a peer) shows in the mount after Reconcile, for files and
// symlinks whose content did not change.
func TestOwnerChangedBehindTheMount(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	if err := os.WriteFile(filepath.Join(m.Dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(m.Dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"f", "l"} {
		if got := statLine(filepath.Join(m.Dir, p)); !strings.HasSuffix(got, "uid 0 gid 0") {
			t.Fatalf("%s: %s", p, got)
		}
	}
	err := m.Store.Update(func(tx *chunkstore.NSTx) error {
		for _, p := range []string{"f", "l"} {
			e, err := tx.Lookup(p)
			if err != nil {
				return err
			}
			e.UID, e.GID = 1000, 2000
			if err := tx.Put(p, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	for _, p := range []string{"f", "l"} {
		if got := statLine(filepath.Join(m.Dir, p)); !strings.HasSuffix(got, "uid 1000 gid 2000") {
			t.Errorf("%s after Reconcile: %s", p, got)
		}
	}
}

// TestLegacyKXD1Store: a directory written before owners were stored
// (KXD1) still mounts; its entries show as the node's user, and a chgrp
// through the mount stores a real owner (the node's uid) and group.
func TestLegacyKXD1Store(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	src := filepath.Join(t.TempDir(), "a")
	if err := os.WriteFile(src, []byte("legacy"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	im := m.Store.NewImporter()
	r, err := im.PutFile(context.Background(), f, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	// KXD1: one file "a", mode 0640 (Go FileMode), size 6, mtime 0, HLC 1.
	v1 := append([]byte("KXD1\x01\x01a\x01\x00"), binary.AppendUvarint(nil, 0o640)...)
	v1 = append(v1, 6, 0, 1)
	v1 = append(v1, r.ID[:]...)
	dirID := im.PutObject(v1)
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	err = m.Store.Update(func(tx *chunkstore.NSTx) error {
		return tx.Put("legacy", chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o755, UID: chunkstore.OwnerUnknown, GID: chunkstore.OwnerUnknown, ID: dirID})
	})
	if err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	p := filepath.Join(m.Dir, "legacy", "a")
	uid, gid := os.Getuid(), os.Getgid()
	if got, want := statLine(p), fmt.Sprintf("mode 0100640 uid %d gid %d", uid, gid); got != want {
		t.Fatalf("legacy entry: %s, want %s", got, want)
	}
	if e, err := m.Store.Lookup("legacy/a"); err != nil || e.UID != chunkstore.OwnerUnknown {
		t.Fatalf("legacy entry in the store: %+v %v", e, err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "legacy" {
		t.Fatalf("read: %q %v", b, err)
	}
	if err := os.Chown(p, -1, 2000); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Store.Lookup("legacy/a"); err != nil || e.UID != uint32(uid) || e.GID != 2000 || e.Mode != 0o640 {
		t.Fatalf("after chgrp: %+v %v", e, err)
	}
}
