package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// errDiffer is what sameInode answers for two names of different inodes,
// so that the case compares it like an errno.
const errDiffer = syscall.EBADE

// sameInode checks that the names are one inode (st_ino and st_dev), as
// every name of a hard-link set is.
func sameInode(names ...string) func(string) error {
	return func(d string) error {
		var first unix.Stat_t
		for i, n := range names {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(d, n), &st); err != nil {
				return err
			}
			if i == 0 {
				first = st
			} else if st.Ino != first.Ino || st.Dev != first.Dev {
				return errDiffer
			}
		}
		return nil
	}
}

// holds checks that the file at name holds want.
func holds(name, want string) func(string) error {
	return func(d string) error {
		b, err := os.ReadFile(filepath.Join(d, name))
		if err != nil {
			return err
		}
		if string(b) != want {
			return errDiffer
		}
		return nil
	}
}

func appendFile(name, s string) func(string) error {
	return func(d string) error {
		f, err := os.OpenFile(filepath.Join(d, name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		if _, err := f.WriteString(s); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

func writeFile(name, s string, mode os.FileMode) func(string) error {
	return func(d string) error { return os.WriteFile(filepath.Join(d, name), []byte(s), mode) }
}

func link(from, to string) func(string) error {
	return func(d string) error { return unix.Link(filepath.Join(d, from), filepath.Join(d, to)) }
}

func rename(from, to string) func(string) error {
	return func(d string) error { return unix.Rename(filepath.Join(d, from), filepath.Join(d, to)) }
}

func unlink(name string) func(string) error {
	return func(d string) error { return unix.Unlink(filepath.Join(d, name)) }
}

func hardlinkCases() []posixCase {
	j := filepath.Join
	return []posixCase{
		{
			name: "one inode: nlink, content and metadata shared",
			ops: []op{
				{name: "write f", fn: writeFile("f", "abc", 0o644), want: ok()},
				{name: "link f g", fn: link("f", "g"), want: ok()},
				{name: "f and g one inode", fn: sameInode("f", "g"), want: ok()},
				{name: "append through g", fn: appendFile("g", "xyz"), want: ok()},
				{name: "f holds abcxyz", fn: holds("f", "abcxyz"), want: ok()},
				{name: "chmod g 0600", fn: func(d string) error { return unix.Chmod(j(d, "g"), 0o600) }, want: ok()},
				{name: "chown f 1000:2000", fn: func(d string) error { return os.Chown(j(d, "f"), 1000, 2000) }, want: ok()},
				{name: "utimes g", fn: func(d string) error {
					t := time.Unix(1_600_000_000, 0)
					return os.Chtimes(j(d, "g"), t, t)
				}, want: ok()},
				{name: "link g h", fn: link("g", "h"), want: ok()},
				{name: "f, g and h one inode", fn: sameInode("f", "g", "h"), want: ok()},
				{name: "truncate h", fn: func(d string) error { return os.Truncate(j(d, "h"), 2) }, want: ok()},
				{name: "f holds ab", fn: holds("f", "ab"), want: ok()},
			},
			stat: []string{"f", "g", "h"},
		},
		{
			name: "unlink keeps the other names; cross-directory links",
			ops: []op{
				{name: "mkdir a", fn: func(d string) error { return unix.Mkdir(j(d, "a"), 0o755) }, want: ok()},
				{name: "mkdir b", fn: func(d string) error { return unix.Mkdir(j(d, "b"), 0o755) }, want: ok()},
				{name: "write a/f", fn: writeFile("a/f", "data", 0o640), want: ok()},
				{name: "link a/f b/g", fn: link("a/f", "b/g"), want: ok()},
				{name: "link b/g h", fn: link("b/g", "h"), want: ok()},
				{name: "unlink a/f", fn: unlink("a/f"), want: ok()},
				{name: "b/g holds data", fn: holds("b/g", "data"), want: ok()},
				{name: "b/g and h one inode", fn: sameInode("b/g", "h"), want: ok()},
				{name: "rmdir a", fn: func(d string) error { return unix.Rmdir(j(d, "a")) }, want: ok()},
				{name: "unlink h", fn: unlink("h"), want: ok()},
			},
			stat: []string{"a/f", "b/g", "h"},
		},
		{
			name: "refused: a directory, an existing name, a missing source or directory, another's file",
			ops: []op{
				{name: "mkdir d", fn: func(d string) error { return unix.Mkdir(j(d, "d"), 0o755) }, want: ok()},
				{name: "link d e", fn: link("d", "e"), want: fails(syscall.EPERM)},
				{name: "write f", fn: writeFile("f", "x", 0o600), want: ok()},
				{name: "write g", fn: writeFile("g", "y", 0o644), want: ok()},
				{name: "link f g", fn: link("f", "g"), want: fails(syscall.EEXIST)},
				{name: "link f d", fn: link("f", "d"), want: fails(syscall.EEXIST)},
				{name: "link nope x", fn: link("nope", "x"), want: fails(syscall.ENOENT)},
				{name: "link f nodir/x", fn: link("f", "nodir/x"), want: fails(syscall.ENOENT)},
				{name: "link f g/x", fn: link("f", "g/x"), want: fails(syscall.ENOTDIR)},
				{who: nobody, name: "link root's 0600 f (protected_hardlinks)", fn: link("f", "mine"), want: fails(syscall.EPERM)},
				{who: nobody, name: "write n", fn: writeFile("n", "z", 0o644), want: ok()},
				{who: nobody, name: "link own n", fn: link("n", "n2"), want: ok()},
			},
			stat: []string{"f", "g", "n", "n2", "mine"},
		},
		{
			name: "rename onto and among the names of a link set",
			ops: []op{
				{name: "write f", fn: writeFile("f", "set", 0o644), want: ok()},
				{name: "link f g", fn: link("f", "g"), want: ok()},
				{name: "rename f g (same inode: nothing)", fn: rename("f", "g"), want: ok()},
				{name: "f and g one inode", fn: sameInode("f", "g"), want: ok()},
				{name: "write x", fn: writeFile("x", "other", 0o644), want: ok()},
				{name: "rename g over x", fn: rename("g", "x"), want: ok()},
				{name: "f and x one inode", fn: sameInode("f", "x"), want: ok()},
				{name: "write y", fn: writeFile("y", "plain", 0o644), want: ok()},
				{name: "rename y over f", fn: rename("y", "f"), want: ok()},
				{name: "f holds plain", fn: holds("f", "plain"), want: ok()},
				{name: "x holds set", fn: holds("x", "set"), want: ok()},
				{name: "mkdir sub", fn: func(d string) error { return unix.Mkdir(j(d, "sub"), 0o755) }, want: ok()},
				{name: "link x sub/z", fn: link("x", "sub/z"), want: ok()},
				{name: "rename sub sub2", fn: rename("sub", "sub2"), want: ok()},
				{name: "x and sub2/z one inode", fn: sameInode("x", "sub2/z"), want: ok()},
			},
			stat: []string{"f", "g", "x", "y", "sub2/z"},
		},
		{
			name: "links of a fifo, a socket, a device and a symlink",
			ops: []op{
				{name: "mkfifo p", fn: func(d string) error { return unix.Mkfifo(j(d, "p"), 0o640) }, want: ok()},
				{name: "link p p2", fn: link("p", "p2"), want: ok()},
				{name: "bind socket s", fn: func(d string) error { return bindSocket(j(d, "s")) }, want: ok()},
				{name: "link s s2", fn: link("s", "s2"), want: ok()},
				{name: "mknod c", fn: func(d string) error { return unix.Mknod(j(d, "c"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))) }, want: ok()},
				{name: "link c c2", fn: link("c", "c2"), want: ok()},
				{name: "symlink l", fn: func(d string) error { return unix.Symlink("p", j(d, "l")) }, want: ok()},
				{name: "link l l2 (the symlink itself)", fn: link("l", "l2"), want: ok()},
				{name: "p and p2 one inode", fn: sameInode("p", "p2"), want: ok()},
				{name: "c and c2 one inode", fn: sameInode("c", "c2"), want: ok()},
				{name: "l and l2 one inode", fn: sameInode("l", "l2"), want: ok()},
				{name: "chmod p2 0600", fn: func(d string) error { return unix.Chmod(j(d, "p2"), 0o600) }, want: ok()},
				{name: "lchown l2 1000:1000", fn: func(d string) error { return os.Lchown(j(d, "l2"), 1000, 1000) }, want: ok()},
				{name: "unlink s", fn: unlink("s"), want: ok()},
				{name: "fifo I/O through p2", fn: func(d string) error { return fifoTalk(j(d, "p2")) }, want: ok()},
			},
			stat: []string{"p", "p2", "s", "s2", "c", "c2", "l", "l2"},
		},
		{
			name: "deeper than PATH_MAX below the mount, each call's path short (openat)",
			ops: []op{
				{name: "mkdirat 24 levels of 250 bytes, a file and a link at the bottom", fn: func(d string) error {
					fd, err := unix.Open(d, unix.O_DIRECTORY|unix.O_RDONLY, 0)
					if err != nil {
						return err
					}
					for i := range 24 {
						name := fmt.Sprintf("%03d%s", i, strings.Repeat("d", 247))
						if err := unix.Mkdirat(fd, name, 0o755); err != nil {
							unix.Close(fd)
							return err
						}
						nfd, err := unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
						unix.Close(fd)
						if err != nil {
							return err
						}
						fd = nfd
					}
					defer unix.Close(fd)
					ffd, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY, 0o644)
					if err != nil {
						return err
					}
					unix.Write(ffd, []byte("deep"))
					unix.Close(ffd)
					if err := unix.Linkat(fd, "f", fd, "g", 0); err != nil {
						return err
					}
					var st unix.Stat_t
					if err := unix.Fstatat(fd, "g", &st, 0); err != nil {
						return err
					}
					if st.Size != 4 || st.Nlink != 2 {
						return errDiffer
					}
					return nil
				}, want: ok()},
			},
		},
		{
			name: "a directory's link count: 2 and one per subdirectory",
			ops: []op{
				{name: "mkdir a, a/b, a/c, and a file a/f", fn: func(d string) error {
					for _, p := range []string{"a", "a/b", "a/c"} {
						if err := unix.Mkdir(j(d, p), 0o755); err != nil {
							return err
						}
					}
					return create(j(d, "a/f"), 0o644)
				}, want: ok()},
				{name: "rename a/b e", fn: rename("a/b", "e"), want: ok()},
				{name: "rmdir a/c", fn: func(d string) error { return unix.Rmdir(j(d, "a/c")) }, want: ok()},
				{name: "mkdir e/x", fn: func(d string) error { return unix.Mkdir(j(d, "e/x"), 0o755) }, want: ok()},
			},
			stat: []string{"a", "e", "e/x", "."},
		},
		{
			name: "an open file linked and unlinked: the descriptor writes the inode",
			ops: []op{
				{name: "write, link, unlink, write through the fd", fn: func(d string) error {
					f, err := os.OpenFile(j(d, "f"), os.O_CREATE|os.O_RDWR, 0o644)
					if err != nil {
						return err
					}
					defer f.Close()
					if _, err := f.WriteString("before"); err != nil {
						return err
					}
					if err := unix.Link(j(d, "f"), j(d, "g")); err != nil {
						return err
					}
					if err := unix.Unlink(j(d, "f")); err != nil {
						return err
					}
					if _, err := f.WriteString("+after"); err != nil {
						return err
					}
					var st unix.Stat_t
					if err := unix.Fstat(int(f.Fd()), &st); err != nil {
						return err
					}
					if st.Nlink != 1 {
						return errDiffer
					}
					return nil
				}, want: ok()},
				{name: "g holds before+after", fn: holds("g", "before+after"), want: ok()},
			},
			stat: []string{"f", "g"},
		},
	}
}

// TestHardLinksLikeExt4 runs each hard-link case on ext4 and on the mount
// and compares every errno and the resulting type, mode, owner, link count
// and size; inode identity is checked by the cases (sameInode).
func TestHardLinksLikeExt4(t *testing.T) {
	likeExt4(t, hardlinkCases())
}

// TestHardLinksSurviveRestart: a link set made through the mount is one
// inode with the right link count and content after the store is closed
// and mounted again, and after the names were looked up cold.
func TestHardLinksSurviveRestart(t *testing.T) {
	data, s, fsys, mnt := mountToRestart(t)
	if err := os.MkdirAll(filepath.Join(mnt, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "a", "f"), []byte("linked"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a/b/g", "h"} {
		if err := os.Link(filepath.Join(mnt, "a", "f"), filepath.Join(mnt, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	m := fstest.MountStore(t, data, kfs.Options{})
	var ino uint64
	for i, n := range []string{"h", "a/b/g", "a/f"} {
		p := filepath.Join(m.Dir, n)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			ino = st.Ino
		}
		if st.Ino != ino || st.Nlink != 3 || st.Mode != unix.S_IFREG|0o640 {
			t.Errorf("%s after restart: ino %d (want %d) nlink %d mode %o", n, st.Ino, ino, st.Nlink, st.Mode)
		}
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, []byte("linked")) {
			t.Errorf("%s after restart: %q %v", n, b, err)
		}
	}
	// The link table is not seen, and its name is taken.
	ents, err := os.ReadDir(m.Dir)
	if err != nil || len(ents) != 2 {
		t.Errorf("root lists %v %v, want a and h", ents, err)
	}
	if _, err := os.Lstat(filepath.Join(m.Dir, chunkstore.LinkTable)); !os.IsNotExist(err) {
		t.Errorf("lstat of the link table: %v", err)
	}
	if err := os.Mkdir(filepath.Join(m.Dir, chunkstore.LinkTable), 0o755); !os.IsExist(err) {
		t.Errorf("mkdir of the link table's name: %v, want EEXIST", err)
	}
	// A write through one name after the restart is seen through the
	// others, in the mount and in the store.
	if err := os.WriteFile(filepath.Join(m.Dir, "h"), []byte("rewritten"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a/f", "a/b/g"} {
		if b, _ := os.ReadFile(filepath.Join(m.Dir, n)); string(b) != "rewritten" {
			t.Errorf("%s: %q", n, b)
		}
		e, err := m.Store.Lookup(n)
		if err != nil || e.Size != 9 || e.Nlink != 3 {
			t.Errorf("%s in the store: %+v %v", n, e, err)
		}
	}
}

// TestChangeTime: st_atime is what utimensat set, and st_ctime moves with every change of an inode's metadata
// or names — chmod, chown, utimes, a write, link, unlink of another name,
// rename — for a file, a fifo and a symlink, and not with a refused chmod;
// the store keeps it across a remount's lookups (Entry.CTime). (ext4 stamps
// ctime from a coarse clock, so two changes within a tick look the same
// there; the mount's clock is the node's, in nanoseconds.)
func TestChangeTime(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	openUp(t, filepath.Dir(m.Dir))
	j := func(n string) string { return filepath.Join(m.Dir, n) }
	ctime := func(n string) int64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(j(n), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ctim.Nano()
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(j("f"), []byte("x"), 0o644))
	must(unix.Mkfifo(j("p"), 0o644))
	must(os.Symlink("f", j("l")))
	steps := []struct {
		name, path string
		fn         func() error
	}{
		{"chmod f", "f", func() error { return unix.Chmod(j("f"), 0o600) }},
		{"chown f", "f", func() error { return os.Chown(j("f"), 1000, 1000) }},
		{"utimes f", "f", func() error { tm := time.Unix(1e9, 0); return os.Chtimes(j("f"), tm, tm) }},
		{"write f", "f", func() error { return os.WriteFile(j("f"), []byte("yy"), 0o600) }},
		{"link f g", "f", func() error { return os.Link(j("f"), j("g")) }},
		{"unlink g", "f", func() error { return os.Remove(j("g")) }},
		{"rename f f2", "f2", func() error { return os.Rename(j("f"), j("f2")) }},
		{"chmod p", "p", func() error { return unix.Chmod(j("p"), 0o600) }},
		{"link p p2", "p", func() error { return os.Link(j("p"), j("p2")) }},
		{"lchown l", "l", func() error { return os.Lchown(j("l"), 1000, 1000) }},
		{"rename l l2", "l2", func() error { return os.Rename(j("l"), j("l2")) }},
	}
	last := map[string]int64{"f": ctime("f"), "p": ctime("p"), "l": ctime("l")}
	last["f2"], last["l2"] = last["f"], last["l"]
	for _, s := range steps {
		must(s.fn())
		must(m.FS.Sync())
		c := ctime(s.path)
		prev := last[s.path]
		if c <= prev {
			t.Errorf("%s: ctime %d did not move past %d", s.name, c, prev)
		}
		for k := range last {
			if k == s.path || (k == "f" && s.path == "f2") || (k == "l" && s.path == "l2") {
				last[k] = c
			}
		}
		if s.path == "f" {
			last["f2"] = c
		}
		if s.path == "l" {
			last["l2"] = c
		}
	}
	before := ctime("f2")
	if err := as(nobody, func() error { return unix.Chmod(j("f2"), 0o777) }); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("chmod by another user: %v", err)
	}
	if c := ctime("f2"); c != before {
		t.Errorf("a refused chmod moved ctime from %d to %d", before, c)
	}
	e, err := m.Store.Lookup("f2")
	if err != nil || e.CTime != before {
		t.Errorf("the store's ctime %d (%v), stat shows %d", e.CTime, err, before)
	}
	// utimensat sets atime and mtime apart, before 1970 too, for a file
	// and a fifo; the store keeps both.
	for _, n := range []string{"f2", "p"} {
		at, mt := time.Unix(1_900_000_000, 5), time.Unix(-1, 0)
		must(os.Chtimes(j(n), at, mt))
		must(m.FS.Sync())
		var st unix.Stat_t
		must(unix.Lstat(j(n), &st))
		if st.Atim.Nano() != at.UnixNano() || st.Mtim.Nano() != mt.UnixNano() {
			t.Errorf("%s: atime %d mtime %d, want %d %d", n, st.Atim.Nano(), st.Mtim.Nano(), at.UnixNano(), mt.UnixNano())
		}
		e, err := m.Store.Lookup(n)
		if err != nil || e.ATime != at.UnixNano() || e.MTime != mt.UnixNano() {
			t.Errorf("%s in the store: %+v %v", n, e, err)
		}
	}
}

// TestHardLinkChangedBehindTheMount: a link set whose content and mode
// change in the store behind the mount (as a merge or FixLinks changes
// only the link table, not the directories of its names, here a and b) is
// seen through every name after Reconcile, though the kernel had cached
// the inode.
func TestHardLinkChangedBehindTheMount(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	j := func(n string) string { return filepath.Join(m.Dir, n) }
	if err := os.MkdirAll(j("b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(j("a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(j("a/f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(j("a/f"), j("b/g")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(j("new"), []byte("brand new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.FS.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a/f", "b/g"} {
		if b, _ := os.ReadFile(j(n)); string(b) != "old" {
			t.Fatalf("%s: %q", n, b)
		}
	}
	nw, err := m.Store.Lookup("new")
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.Store.Lookup("b/g")
	if err := m.Store.Update(func(tx *chunkstore.NSTx) error {
		f.ID, f.Size, f.Mode = nw.ID, nw.Size, 0o640
		return tx.PutLinked(f.Link, f)
	}); err != nil {
		t.Fatal(err)
	}
	m.FS.Reconcile()
	for _, n := range []string{"a/f", "b/g"} {
		if b, err := os.ReadFile(j(n)); err != nil || string(b) != "brand new" {
			t.Errorf("%s after the set changed behind the mount: %q %v", n, b, err)
		}
		if st, err := os.Stat(j(n)); err != nil || st.Mode().Perm() != 0o640 {
			t.Errorf("%s: %v %v", n, st.Mode(), err)
		}
	}
}
