package fs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// fullStat is what the POSIX cases compare of an lstat: type and mode,
// owner, group, device number, link count and size, or the errno.
func fullStat(p string) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "lstat: " + errnoOf(err).Error()
	}
	return fmt.Sprintf("mode %07o uid %d gid %d rdev %d:%d nlink %d size %d", st.Mode, st.Uid, st.Gid,
		unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Nlink, st.Size)
}

// posixCase is a scenario run the same way on ext4 and on the mount, in a
// fresh directory "d" (root's, 0777 so that other users can create in it).
type posixCase struct {
	name string
	ops  []op
	stat []string // paths compared with fullStat
}

func bindSocket(p string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: p})
}

// socketTalk binds a socket at p, listens, connects to it by the path (a
// fresh lookup), and sends a byte through: the kernel finds the bound
// socket by the inode the path leads to.
func socketTalk(p string) error {
	l, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(l)
	if err := unix.Bind(l, &unix.SockaddrUnix{Name: p}); err != nil {
		return err
	}
	if err := unix.Listen(l, 1); err != nil {
		return err
	}
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: p}); err != nil {
		return err
	}
	a, _, err := unix.Accept(l)
	if err != nil {
		return err
	}
	defer unix.Close(a)
	if _, err := unix.Write(c, []byte("k")); err != nil {
		return err
	}
	b := make([]byte, 1)
	if n, err := unix.Read(a, b); err != nil || n != 1 || b[0] != 'k' {
		return fmt.Errorf("read %d %q: %v", n, b, err)
	}
	return nil
}

// fifoTalk opens the fifo at p for reading and writing (the kernel's
// pipe, not the file system) and sends bytes through it.
func fifoTalk(p string) error {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte("pipe")); err != nil {
		return err
	}
	b := make([]byte, 8)
	n, err := unix.Read(fd, b)
	if err != nil || string(b[:n]) != "pipe" {
		return fmt.Errorf("read %q: %v", b[:n], err)
	}
	return nil
}

func specialCases() []posixCase {
	j := filepath.Join
	mknod := func(name string, mode uint32, major, minor uint32) func(string) error {
		return func(d string) error { return unix.Mknod(j(d, name), mode, int(unix.Mkdev(major, minor))) }
	}
	return []posixCase{
		{
			name: "every special file as root; chmod, chown and utimes of them",
			ops: []op{
				{name: "mkfifo f 0640", fn: func(d string) error { return unix.Mkfifo(j(d, "f"), 0o640) }, want: ok()},
				{name: "mknod c char 1:3", fn: mknod("c", unix.S_IFCHR|0o666, 1, 3), want: ok()},
				{name: "mknod b block 7:200", fn: mknod("b", unix.S_IFBLK|0o660, 7, 200), want: ok()},
				{name: "mknod big char 4095:1048575", fn: mknod("big", unix.S_IFCHR|0o600, 4095, 1048575), want: ok()},
				{name: "bind socket s", fn: func(d string) error { return bindSocket(j(d, "s")) }, want: ok()},
				{name: "mknod r regular", fn: mknod("r", unix.S_IFREG|0o640, 0, 0), want: ok()},
				{name: "mknod f again", fn: mknod("f", unix.S_IFIFO|0o600, 0, 0), want: fails(syscall.EEXIST)},
				{name: "mknod in a missing dir", fn: mknod("no/x", unix.S_IFIFO|0o600, 0, 0), want: fails(syscall.ENOENT)},
				{name: "chmod f 4755", fn: func(d string) error { return unix.Chmod(j(d, "f"), 0o4755) }, want: ok()},
				{name: "chown c 1000:2000", fn: func(d string) error { return os.Chown(j(d, "c"), 1000, 2000) }, want: ok()},
				{name: "chown s 65534", fn: func(d string) error { return os.Chown(j(d, "s"), 65534, 65534) }, want: ok()},
				{name: "truncate b", fn: func(d string) error { return unix.Truncate(j(d, "b"), 0) }},
				{name: "truncate f", fn: func(d string) error { return unix.Truncate(j(d, "f"), 0) }},
			},
			stat: []string{"f", "c", "b", "big", "s", "r"},
		},
		{
			name: "as 65534: fifo, socket and regular file yes, devices EPERM",
			ops: []op{
				{who: nobody, name: "mkfifo f", fn: func(d string) error { return unix.Mkfifo(j(d, "f"), 0o644) }, want: ok()},
				{who: nobody, name: "bind socket s", fn: func(d string) error { return bindSocket(j(d, "s")) }, want: ok()},
				{who: nobody, name: "mknod r regular", fn: mknod("r", unix.S_IFREG|0o600, 0, 0), want: ok()},
				{who: nobody, name: "mknod c char", fn: mknod("c", unix.S_IFCHR|0o666, 1, 3), want: fails(syscall.EPERM)},
				{who: nobody, name: "mknod b block", fn: mknod("b", unix.S_IFBLK|0o666, 7, 0), want: fails(syscall.EPERM)},
				{who: nobody, name: "chmod f 0600 by its owner", fn: func(d string) error { return unix.Chmod(j(d, "f"), 0o600) }, want: ok()},
				{who: user1000, name: "chmod f by another", fn: func(d string) error { return unix.Chmod(j(d, "f"), 0o666) }, want: fails(syscall.EPERM)},
				{who: user1000, name: "open f by another (0600)", fn: func(d string) error { return fifoTalk(j(d, "f")) }, want: fails(syscall.EACCES)},
			},
			stat: []string{"f", "s", "r", "c", "b"},
		},
		{
			name: "the kernel does the I/O: a fifo's pipe, a socket found by its path",
			ops: []op{
				{name: "mkfifo f", fn: func(d string) error { return unix.Mkfifo(j(d, "f"), 0o600) }, want: ok()},
				{name: "write and read f", fn: func(d string) error { return fifoTalk(j(d, "f")) }, want: ok()},
				{name: "socket s: bind, connect, send", fn: func(d string) error { return socketTalk(j(d, "s")) }, want: ok()},
				{who: nobody, name: "socket as 65534", fn: func(d string) error { return socketTalk(j(d, "s2")) }, want: ok()},
			},
			stat: []string{"f", "s", "s2"},
		},
		{
			name: "mode 0000 is kept; a directory with a file still being written is not empty",
			ops: []op{
				{name: "creat z 0000", fn: func(d string) error { return create(j(d, "z"), 0) }, want: ok()},
				{name: "mkdir a", fn: func(d string) error { return unix.Mkdir(j(d, "a"), 0o755) }, want: ok()},
				{name: "mkdir b", fn: func(d string) error { return unix.Mkdir(j(d, "b"), 0o755) }, want: ok()},
				{name: "rename a over b while b/f is open for writing", fn: func(d string) error {
					fd, err := unix.Open(j(d, "b/f"), unix.O_CREAT|unix.O_WRONLY, 0o644)
					if err != nil {
						return err
					}
					defer unix.Close(fd)
					return unix.Rename(j(d, "a"), j(d, "b"))
				}, want: fails(syscall.ENOTEMPTY)},
				{name: "chmod a 0", fn: func(d string) error { return unix.Chmod(j(d, "a"), 0) }, want: ok()},
			},
			stat: []string{"z", "a", "b", "b/f"},
		},
		{
			name: "rename and unlink of special files",
			ops: []op{
				{name: "mkfifo f", fn: func(d string) error { return unix.Mkfifo(j(d, "f"), 0o600) }, want: ok()},
				{name: "mknod c", fn: mknod("c", unix.S_IFCHR|0o600, 5, 1), want: ok()},
				{name: "creat x", fn: func(d string) error { return create(j(d, "x"), 0o644) }, want: ok()},
				{name: "mkdir sub", fn: func(d string) error { return unix.Mkdir(j(d, "sub"), 0o755) }, want: ok()},
				{name: "rename f sub/g", fn: func(d string) error { return unix.Rename(j(d, "f"), j(d, "sub/g")) }, want: ok()},
				{name: "rename c over x", fn: func(d string) error { return unix.Rename(j(d, "c"), j(d, "x")) }, want: ok()},
				{name: "rename sub/g over sub", fn: func(d string) error { return unix.Rename(j(d, "sub/g"), j(d, "sub")) }, want: fails(syscall.ENOTEMPTY)},
				{name: "rename x over sub", fn: func(d string) error { return unix.Rename(j(d, "x"), j(d, "sub")) }, want: fails(syscall.EISDIR)},
				{name: "rmdir x", fn: func(d string) error { return unix.Rmdir(j(d, "x")) }, want: fails(syscall.ENOTDIR)},
				{name: "mkfifo y", fn: func(d string) error { return unix.Mkfifo(j(d, "y"), 0o600) }, want: ok()},
				{name: "unlink y", fn: func(d string) error { return unix.Unlink(j(d, "y")) }, want: ok()},
			},
			stat: []string{"f", "c", "x", "sub/g", "y"},
		},
	}
}

func runPosixCase(t *testing.T, root string, c posixCase, statFn func(string) string) []string {
	t.Helper()
	d := filepath.Join(root, fmt.Sprintf("case-%x", len(c.name)*7919+int(c.name[0])))
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range c.ops {
		err := as(o.who, func() error { return o.fn(d) })
		got := errnoOf(err)
		out = append(out, fmt.Sprintf("%s as %v: errno %d (%v)", o.name, o.who, int(got), got))
		if o.want != nil && got != *o.want {
			t.Errorf("%s: %s as %v: errno %v (%v), want %v", root, o.name, o.who, got, err, *o.want)
		}
	}
	for _, p := range c.stat {
		out = append(out, p+": "+statFn(filepath.Join(d, p)))
	}
	return out
}

// likeExt4 runs each case on ext4 and on a fresh mount and compares them;
// it returns the mount.
func likeExt4(t *testing.T, cases []posixCase) *fstest.Mounted {
	t.Helper()
	fstest.RequireFUSE(t)
	ref := ext4Dir(t)
	openUp(t, ref)
	m := fstest.Mount(t, kfs.Options{})
	openUp(t, filepath.Dir(m.Dir))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			compareLines(t, runPosixCase(t, ref, c, fullStat), runPosixCase(t, m.Dir, c, fullStat))
		})
	}
	return m
}

func compareLines(t *testing.T, want, got []string) {
	t.Helper()
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			g := "(none)"
			if i < len(got) {
				g = got[i]
			}
			t.Errorf("mount differs from ext4:\n  ext4:  %s\n  mount: %s", want[i], g)
		}
	}
}

// TestSpecialFilesLikeExt4 runs each special-file case on ext4 and on the
// mount, as root and as other users, and compares every errno and the
// resulting type, mode, owner, device number and link count; then it
// checks that the store recorded what stat showed.
func TestSpecialFilesLikeExt4(t *testing.T) {
	m := likeExt4(t, specialCases())
	// What the store holds is what stat showed.
	c := specialCases()[0]
	rel := fmt.Sprintf("case-%x", len(c.name)*7919+int(c.name[0]))
	for _, p := range []string{"f", "c", "b", "big", "s"} {
		e, err := m.Store.Lookup(rel + "/" + p)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("mode %07o uid %d gid %d rdev %d:%d nlink 1 size 0", kindType(e.Kind)|chunkstore.UnixMode(e.Mode), e.UID, e.GID, unix.Major(e.Rdev), unix.Minor(e.Rdev))
		if want := fullStat(filepath.Join(m.Dir, rel, p)); got != want {
			t.Errorf("%s: the store has %q, stat shows %q", p, got, want)
		}
	}
}

func kindType(k chunkstore.Kind) uint32 {
	return map[chunkstore.Kind]uint32{chunkstore.KindFile: unix.S_IFREG, chunkstore.KindDir: unix.S_IFDIR, chunkstore.KindSymlink: unix.S_IFLNK,
		chunkstore.KindFifo: unix.S_IFIFO, chunkstore.KindSocket: unix.S_IFSOCK, chunkstore.KindCharDev: unix.S_IFCHR, chunkstore.KindBlockDev: unix.S_IFBLK}[k]
}

// TestSpecialFilesNodev: the mount is nodev, so a device node in it shows
// its number but is not opened as the device (ext4 mounted without nodev
// would open /dev/null's 1:3 here).
func TestSpecialFilesNodev(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	p := filepath.Join(m.Dir, "null")
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(p, os.O_WRONLY, 0); errnoOf(err) != syscall.EACCES {
		t.Fatalf("open of a device node in the mount: %v, want EACCES (nodev)", err)
	}
}

// mountToRestart opens a fresh store and mounts it, for a test that
// unmounts and closes it itself and mounts the data directory again.
func mountToRestart(t *testing.T) (string, *chunkstore.Store, *kfs.FS, string) {
	t.Helper()
	fstest.RequireFUSE(t)
	data := t.TempDir()
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := kfs.New(s, kfs.Options{})
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := fsys.Mount(mnt); err != nil {
		s.Close()
		t.Fatal(err)
	}
	return data, s, fsys, mnt
}

// TestSpecialFilesBehindTheMount: special files survive a remount of the
// same store (they are in the namespace, not in the node's memory), and
// one removed behind the mount's back is gone after Reconcile.
func TestSpecialFilesBehindTheMount(t *testing.T) {
	data, s, fsys, mnt := mountToRestart(t)
	if err := unix.Mkfifo(filepath.Join(mnt, "f"), 0o610); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(mnt, "b"), unix.S_IFBLK|0o640, int(unix.Mkdev(259, 7))); err != nil {
		t.Fatal(err)
	}
	want := fullStat(filepath.Join(mnt, "f")) + fullStat(filepath.Join(mnt, "b"))
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	m := fstest.MountStore(t, data, kfs.Options{})
	if got := fullStat(filepath.Join(m.Dir, "f")) + fullStat(filepath.Join(m.Dir, "b")); got != want {
		t.Fatalf("after remount: %s, want %s", got, want)
	}
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error { return tx.Remove("f", false) }); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	if _, err := os.Lstat(filepath.Join(m.Dir, "f")); !os.IsNotExist(err) {
		t.Fatalf("removed behind the mount, still there after Reconcile: %v", err)
	}
}
