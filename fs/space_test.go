package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"

	"github.com/kylix/kylix/internal/testneeds"
)

// smallDisk mounts a tmpfs of size bytes and returns its root; the
// cleanup unmounts it.
func smallDisk(t *testing.T, size int64) string {
	t.Helper()
	fstest.RequireFUSE(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		t.Skipf("cannot mount a tmpfs for the data directory: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount tmpfs: %v", err)
		}
	})
	return dir
}

// smallExt4 makes a loop-mounted ext4 file system of size bytes (no root
// reserve of its own) and returns its root; the cleanup unmounts it.
func smallExt4(t *testing.T, size int64) string {
	t.Helper()
	fstest.RequireFUSE(t)
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	testneeds.Command(t, "mkfs.ext4", "e2fsprogs")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v %s", err, out)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount an ext4 image: %v %s", err, out)
	}
	t.Cleanup(func() {
		// Detach: the loop device goes (autoclear) when the last file
		// on it is closed, even if a failed test left one open.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount ext4: %v", err)
		}
	})
	return dir
}

// spaceNode is a node over a data directory, stoppable and restartable
// within a test.
type spaceNode struct {
	t     *testing.T
	s     *chunkstore.Store
	fs    *kfs.FS
	mnt   string
	once  sync.Once
	logMu sync.Mutex
	log   bytes.Buffer
}

func (n *spaceNode) Write(p []byte) (int, error) {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return n.log.Write(p)
}

func (n *spaceNode) logText() string {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return n.log.String()
}

// startNode opens the store in data and mounts it on a directory that
// other users may reach (setpriv tests).
func startNode(t *testing.T, data string, opts kfs.Options, beforeCommit func()) *spaceNode {
	t.Helper()
	n := &spaceNode{t: t}
	opts.Logger = slog.New(slog.NewTextHandler(n, nil))
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := kfs.New(s, opts)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	if beforeCommit != nil {
		kfs.SetBeforeCommit(fsys, beforeCommit)
	}
	mnt, err := os.MkdirTemp("", "kylix-space-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(mnt, 0o755)
	if err := fsys.Mount(mnt); err != nil {
		s.Close()
		os.Remove(mnt)
		t.Fatal(err)
	}
	n.s, n.fs, n.mnt = s, fsys, mnt
	t.Cleanup(n.stop)
	return n
}

func (n *spaceNode) stop() {
	n.once.Do(func() {
		if err := n.fs.Unmount(); err != nil {
			n.t.Errorf("unmount: %v", err)
		}
		n.s.Close()
		os.Remove(n.mnt)
	})
}

func (n *spaceNode) path(name string) string { return filepath.Join(n.mnt, name) }

// freeBytes is statfs(2)'s free space of dir for root (f_bfree).
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bfree) * st.Frsize
}

// writeClose writes data to a new (or truncated) file in one write and
// closes it, returning the first error and where it happened.
func writeClose(p string, data []byte, sync bool) (string, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "open", err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "write", err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return "fsync", err
		}
	}
	if err := f.Close(); err != nil {
		return "close", err
	}
	return "", nil
}

// fillFile writes zeros to p until the file system is full.
func fillFile(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	// tmpfs may still have part of a page free.
	for {
		if _, err := f.Write(buf[:512]); err != nil {
			return
		}
	}
}

// TestDiskFullManySmallFiles writes small files through the mount until
// the data directory's file system is full, overwriting committed files
// on the way: every file whose close returned 0 is there with exactly its
// bytes after a clean restart, every file whose write or close failed is
// its previous version or absent, never empty or torn. With close waiting
// for the commit (the default when space is low) and without (space
// accounting alone).
func TestDiskFullManySmallFiles(t *testing.T) {
	tmpfs := func(t *testing.T) string { return smallDisk(t, 24<<20) }
	ext4 := func(t *testing.T) string { return smallExt4(t, 32<<20) }
	t.Run("tmpfs, close waits", func(t *testing.T) { diskFullManySmallFiles(t, tmpfs(t), 0) })
	t.Run("tmpfs, close never waits", func(t *testing.T) { diskFullManySmallFiles(t, tmpfs(t), -1) })
	t.Run("ext4, close waits", func(t *testing.T) { diskFullManySmallFiles(t, ext4(t), 0) })
}

func diskFullManySmallFiles(t *testing.T, disk string, lowSpace int64) {
	data := filepath.Join(disk, "data")
	n := startNode(t, data, kfs.Options{LowSpace: lowSpace}, nil)

	want := map[string][]byte{}   // what each name must hold (nil: absent)
	before := map[string][]byte{} // committed content of the overwritten files
	const keeps = 8
	for i := range keeps {
		name := fmt.Sprintf("keep%d", i)
		b := pattern(uint64(1000+i), 20<<10)
		if where, err := writeClose(n.path(name), b, true); err != nil {
			t.Fatalf("%s %s: %v", where, name, err)
		}
		want[name], before[name] = b, b
	}
	ok, failed, streak := 0, 0, 0
	where := map[string]int{}
	for i := 0; streak < 20 && i < 3000; i++ {
		name := fmt.Sprintf("f%04d", i)
		if i%25 == 24 {
			name = fmt.Sprintf("keep%d", (i/25)%keeps)
		}
		b := pattern(uint64(i), 40<<10+i*13)
		at, err := writeClose(n.path(name), b, false)
		switch {
		case err == nil:
			want[name] = b
			ok++
			streak = 0
		case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO):
			failed++
			where[at]++
			streak++
			if _, wasKept := before[name]; !wasKept {
				want[name] = nil
			} else if want[name] == nil {
				t.Fatalf("internal: %s", name)
			}
		default:
			t.Fatalf("%s %s: %v", at, name, err)
		}
	}
	t.Logf("%d closes returned 0, %d failed with ENOSPC/EIO (%v); %d bytes free", ok, failed, where, freeBytes(t, disk))
	if fi, err := os.Stat(filepath.Join(data, "index.db")); err == nil {
		t.Logf("index.db %d bytes; commit batches %d", fi.Size(), n.fs.Stats().CommitBatches)
	}

	if ok < 50 || failed < 20 {
		t.Fatalf("the disk did not fill as planned: %d ok, %d failed", ok, failed)
	}
	// Overwriting a committed file now fails at write and at close, and
	// the file keeps its content.
	for i := range keeps {
		p := n.path(fmt.Sprintf("keep%d", i))
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, werr := f.Write(pattern(uint64(5000+i), 300<<10))
		serr := f.Sync()
		cerr := f.Close()
		if !errors.Is(werr, syscall.ENOSPC) || !errors.Is(serr, syscall.ENOSPC) || !errors.Is(cerr, syscall.ENOSPC) {
			t.Errorf("overwrite keep%d on a full disk: write %v, fsync %v, close %v; want ENOSPC from each", i, werr, serr, cerr)
		}
	}
	check := func(when string, read func(string) ([]byte, error)) {
		t.Helper()
		bad := 0
		for name, w := range want {
			got, err := read(name)
			switch {
			case w == nil && err == nil:
				t.Errorf("%s: %s failed to close but exists (%d bytes)", when, name, len(got))
				bad++
			case w == nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, chunkstore.ErrNotFound):
				t.Errorf("%s: %s: %v, want not found", when, name, err)
				bad++
			case w != nil && err != nil:
				t.Errorf("%s: %s: %v", when, name, err)
				bad++
			case w != nil && !bytes.Equal(got, w):
				t.Errorf("%s: %s holds %d bytes, not the %d its last successful close wrote", when, name, len(got), len(w))
				bad++
			}
			if bad > 10 {
				t.Fatalf("%s: giving up", when)
			}
		}
	}
	check("through the mount", func(name string) ([]byte, error) { return os.ReadFile(n.path(name)) })
	n.stop()

	n2 := startNode(t, data, kfs.Options{LowSpace: lowSpace}, nil)
	check("after a restart", func(name string) ([]byte, error) {
		f, _, err := n2.s.OpenPath(name)
		if err != nil {
			return nil, err
		}
		b := make([]byte, f.Size())
		_, err = f.ReadAt(b, 0)
		return b, err
	})
	check("through the mount after a restart", func(name string) ([]byte, error) { return os.ReadFile(n2.path(name)) })
}

// TestDiskFullAtCommit fills the disk from outside the node after a
// file's bytes were written and before its commit: close reports ENOSPC,
// the working copy's space is freed at once, and the file is its previous
// version (the kernel's cached pages of the lost bytes are dropped) or,
// if it had none, gone. The RELEASE of model.bin's first writer is held
// back until its second writer closed, as a loaded machine delivers it
// (CI once did): that writer's close must still count as the last.
func TestDiskFullAtCommit(t *testing.T) {
	disk := smallDisk(t, 24<<20)
	data := filepath.Join(disk, "data")
	n := startNode(t, data, kfs.Options{}, nil)
	held, gate := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	kfs.SetBeforeRelease(n.fs, func(write bool) func() {
		if write && first.CompareAndSwap(false, true) {
			close(held)
			<-gate
		}
		return nil
	})
	var openGate sync.Once
	letGo := func() { openGate.Do(func() { close(gate) }) }
	t.Cleanup(letGo)
	old := pattern(1, 2<<20)
	if where, err := writeClose(n.path("model.bin"), old, true); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	<-held // model.bin's first writer is closed, its RELEASE waits

	for _, tc := range []struct {
		name string
		prev []byte
	}{{"model.bin", old}, {"new.bin", nil}} {
		free0 := freeBytes(t, disk)
		st0, _ := os.Stat(n.path(tc.name))
		f, err := os.OpenFile(n.path(tc.name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		// As long as the old version, so that only an invalidation (not
		// a size change) can drop the kernel's pages of the new bytes,
		// which a reader loads now.
		newBytes := pattern(2, 2<<20)
		if _, err := f.Write(newBytes); err != nil {
			t.Fatalf("%s: write with room to spare: %v", tc.name, err)
		}
		if got, err := os.ReadFile(n.path(tc.name)); err != nil || !bytes.Equal(got, newBytes) {
			t.Fatalf("%s: read while writing: %d bytes, %v", tc.name, len(got), err)
		}
		filler := filepath.Join(disk, "filler")
		fillFile(t, filler)
		err = f.Close()
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: close after the disk filled: %v, want ENOSPC", tc.name, err)
		}
		// The working copy (2 MiB) is freed: only the filler holds space.
		fst, _ := os.Stat(filler)
		if free := freeBytes(t, disk); free < free0-fst.Size()-256<<10 {
			t.Errorf("%s: %d bytes free after the failed close, want about %d (working copy still held?)", tc.name, free, free0-fst.Size())
		}
		got, err := os.ReadFile(n.path(tc.name))
		if tc.prev == nil {
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: after its only version failed: %d bytes, %v; want ENOENT", tc.name, len(got), err)
			}
		} else if err != nil || !bytes.Equal(got, tc.prev) {
			t.Errorf("%s: reads %d bytes (%v), want its previous %d bytes", tc.name, len(got), err, len(tc.prev))
		} else if st, err := os.Stat(n.path(tc.name)); err != nil || !st.ModTime().Equal(st0.ModTime()) || st.Size() != int64(len(tc.prev)) {
			t.Errorf("%s: stat after the failure: %v %v, want the previous version's mtime %v and size", tc.name, st, err, st0.ModTime())
		}
		os.Remove(filler)
		letGo()
	}
	if c := strings.Count(n.logText(), "commit failed"); c != 2 {
		t.Errorf("log has %d 'commit failed' lines, want 2:\n%s", c, n.logText())
	}
	n.stop()
	n2 := startNode(t, data, kfs.Options{}, nil)
	if got, err := os.ReadFile(n2.path("model.bin")); err != nil || !bytes.Equal(got, old) {
		t.Errorf("model.bin after restart: %d bytes, %v", len(got), err)
	}
	if _, err := os.Stat(n2.path("new.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("new.bin after restart: %v, want ENOENT", err)
	}
}

// TestCommitFailsAfterClose: when space is not low, close does not wait
// for the commit; a commit that then fails is reported at the file's next
// fsync (once) and in the log (one line), the file reads as its previous
// version at once (no phantom bytes from the kernel's cache), and the
// working copy's space is back.
func TestCommitFailsAfterClose(t *testing.T) {
	disk := smallDisk(t, 24<<20)
	data := filepath.Join(disk, "data")
	filler := filepath.Join(disk, "filler")
	// The test arms the hook; the next batch then waits until the test
	// has read the new bytes (so the kernel caches them) and fills the
	// disk before it writes.
	var armed bool
	var fillMu sync.Mutex
	proceed := make(chan struct{})
	n := startNode(t, data, kfs.Options{LowSpace: -1}, func() {
		fillMu.Lock()
		defer fillMu.Unlock()
		if armed {
			armed = false
			<-proceed
			fillFile(t, filler)
		}
	})
	old := pattern(1, 100<<10)
	if where, err := writeClose(n.path("a.bin"), old, true); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if got, _ := os.ReadFile(n.path("a.bin")); !bytes.Equal(got, old) {
		t.Fatal("a.bin differs before the test")
	}
	free0 := freeBytes(t, disk)
	fillMu.Lock()
	armed = true
	fillMu.Unlock()
	newBytes := pattern(2, len(old)) // same size: only invalidation drops the cached pages
	if where, err := writeClose(n.path("a.bin"), newBytes, false); err != nil {
		close(proceed)
		t.Fatalf("%s: %v (close must not wait when space is not low)", where, err)
	}
	got, err := os.ReadFile(n.path("a.bin"))
	close(proceed)
	if err != nil || !bytes.Equal(got, newBytes) {
		t.Fatalf("a.bin before its commit: %d bytes, %v; want the new bytes", len(got), err)
	}
	if err := n.fs.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(n.path("a.bin")); err != nil || !bytes.Equal(got, old) {
		t.Errorf("a.bin after its commit failed: %d bytes, %v; want the previous %d bytes", len(got), err, len(old))
	}
	fst, err := os.Stat(filler)
	if err != nil {
		t.Fatalf("the commit ran without the test's hook filling the disk: %v", err)
	}
	if free := freeBytes(t, disk); free < free0-fst.Size()-32<<10 {
		t.Errorf("%d bytes free after the failed commit, want about %d (working copy still held?)", free, free0-fst.Size())
	}
	f, err := os.Open(n.path("a.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("first fsync after the failed commit: %v, want ENOSPC", err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("second fsync: %v, want 0 (reported once)", err)
	}
	f.Close()
	if c := strings.Count(n.logText(), "commit failed"); c != 1 {
		t.Errorf("log has %d 'commit failed' lines, want 1:\n%s", c, n.logText())
	}
	os.Remove(filler)
	if where, err := writeClose(n.path("a.bin"), pattern(3, 1<<20), true); err != nil {
		t.Errorf("write after space came back: %s: %v", where, err)
	}
}

// setprivRun runs a shell command as uid/gid 65534.
func setprivRun(t *testing.T, script string, args ...string) (string, error) {
	t.Helper()
	testneeds.Command(t, "setpriv", "util-linux") // runs a writer as another user
	cmd := exec.Command("setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups", "sh", "-c", script}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestReserve: a writer whose uid is not 0 gets ENOSPC where free space
// would go below the reserve (writes and fallocate), root can still write,
// fallocate beyond free space fails for root too and allocates nothing, a
// sparse truncate takes no space, and statfs through the mount excludes
// the reserve from f_bavail.
func TestReserve(t *testing.T) {
	t.Run("tmpfs", func(t *testing.T) { testReserve(t, smallDisk(t, 24<<20)) })
	t.Run("ext4", func(t *testing.T) { testReserve(t, smallExt4(t, 32<<20)) })
}

func testReserve(t *testing.T, disk string) {
	data := filepath.Join(disk, "data")
	const reserve = 6 << 20
	n := startNode(t, data, kfs.Options{Reserve: &kfs.Reserve{Bytes: reserve}}, nil)
	pub := n.path("pub")
	if err := os.Mkdir(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pub, 0o777); err != nil {
		t.Fatal(err)
	}

	// fallocate as the user, of more than the space above the reserve.
	free0 := freeBytes(t, disk)
	out, err := setprivRun(t, `fallocate -l "$0" "$1"`, fmt.Sprint(free0-reserve/2), filepath.Join(pub, "fa"))
	if err == nil || !strings.Contains(out, "No space left") {
		t.Errorf("unprivileged fallocate into the reserve: %v %s; want ENOSPC", err, out)
	}
	// fallocate beyond free space, as root.
	f, err := os.Create(n.path("big"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, 1<<40); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fallocate 1 TiB as root: %v, want ENOSPC", err)
	}
	if free := freeBytes(t, disk); free < free0-64<<10 {
		t.Errorf("free space went from %d to %d after refused fallocates", free0, free)
	}
	// A sparse truncate past free space takes none.
	if err := f.Truncate(4 * free0); err != nil {
		t.Errorf("sparse truncate: %v", err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// The user writes 256 KiB files until refused. (Not with a shell
	// redirect: the shell's close of its copy of the fd commits the empty
	// file before the writer runs, as a local file system would keep it.)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testneeds.Missing(t, "/usr/bin/python3 (the unprivileged writer): %v (apt-get install -y python3)", err)
	}
	out, err = setprivRun(t, `exec /usr/bin/python3 -c "$0" "$1"`, spaceWriter, pub)
	t.Logf("unprivileged writer: %s (%v)", strings.TrimSpace(out), err)
	if !strings.Contains(out, "No space left") {
		t.Errorf("the unprivileged writer did not stop with ENOSPC: %s", out)
	}
	if err := n.fs.Sync(); err != nil {
		t.Fatal(err)
	}
	free := freeBytes(t, disk)
	if free < reserve {
		t.Errorf("the unprivileged writer left %d bytes free, less than the %d reserve", free, reserve)
	}
	if free > reserve+4<<20 {
		t.Errorf("the unprivileged writer stopped early: %d bytes free, reserve %d", free, reserve)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(n.mnt, &sf); err != nil {
		t.Fatal(err)
	}
	if avail := int64(sf.Bavail) * sf.Frsize; avail > 1<<20 {
		t.Errorf("statfs through the mount: f_bavail %d bytes after the user filled it, want about 0", avail)
	}
	if bfree := int64(sf.Bfree) * sf.Frsize; bfree > free || bfree < reserve-2<<20 {
		t.Errorf("statfs through the mount: f_bfree %d bytes, want about the reserve (%d; raw %d)", bfree, reserve, free)
	}
	// Root still writes into the reserve.
	b := pattern(7, 1<<20)
	if where, err := writeClose(n.path("root.bin"), b, true); err != nil {
		t.Errorf("root write into the reserve: %s: %v", where, err)
	}
	if got, err := os.ReadFile(n.path("root.bin")); err != nil || !bytes.Equal(got, b) {
		t.Errorf("root.bin: %d bytes, %v", len(got), err)
	}
	// Every file the user wrote is whole or absent.
	ents, _ := os.ReadDir(pub)
	for _, e := range ents {
		if e.Name() == "fa" {
			continue // made empty by fallocate(1) before its refused fallocate
		}
		if fi, err := e.Info(); err != nil || fi.Size() != 262144 {
			t.Errorf("pub/%s: %v %v, want 262144 bytes", e.Name(), fi, err)
		}
	}
}

// spaceWriter writes 256 KiB files into argv[1] until a write or close
// fails, each with one open, write and close.
const spaceWriter = `
import os, sys
d, i = sys.argv[1], 0
while True:
    fd = os.open("%s/f%d" % (d, i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.write(fd, os.urandom(262144))
        finally:
            os.close(fd)
    except OSError as e:
        print("stopped after %d files: %s" % (i, e.strerror))
        break
    i += 1
`

func TestParseReserve(t *testing.T) {
	for in, want := range map[string]kfs.Reserve{
		"5%": {Percent: 5}, "0.5%": {Percent: 0.5}, "0": {}, "2GiB": {Bytes: 2 << 30},
		"512M": {Bytes: 512 << 20}, "100000": {Bytes: 100000}, " 1g ": {Bytes: 1 << 30},
	} {
		got, err := kfs.ParseReserve(in)
		if err != nil || got != want {
			t.Errorf("ParseReserve(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "101%", "-3%", "5%%", "1Q"} {
		if _, err := kfs.ParseReserve(in); err == nil {
			t.Errorf("ParseReserve(%q): no error", in)
		}
	}
}
