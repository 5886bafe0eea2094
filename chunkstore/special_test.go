package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// specialTree makes a fifo, a socket, a character and a block device
// under dir (as root), each with its own owner, mode and mtime, and
// returns what lstat says of each.
func specialTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root; CI runs as root")
	}
	j := filepath.Join
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(j(dir, "d"), 0o755))
	must(unix.Mkfifo(j(dir, "d/fifo"), 0o640))
	must(unix.Mknod(j(dir, "d/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(j(dir, "blk"), unix.S_IFBLK|0o660, int(unix.Mkdev(259, 4100))))
	sfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	must(err)
	must(unix.Bind(sfd, &unix.SockaddrUnix{Name: j(dir, "sock")}))
	unix.Close(sfd)
	must(os.Chown(j(dir, "d/fifo"), 1000, 2000))
	must(unix.Chmod(j(dir, "d/fifo"), 0o2640))
	must(os.Chown(j(dir, "blk"), 0, 6))
	must(os.Chown(j(dir, "sock"), 65534, 65534))
	mt := time.Unix(1_700_000_000, 123456789)
	for _, p := range []string{"d/fifo", "d/null", "blk", "sock"} {
		must(os.Chtimes(j(dir, p), mt, mt))
	}
	return specialStats(t, dir)
}

func specialStats(t *testing.T, dir string) map[string]string {
	out := map[string]string{}
	for _, p := range []string{"d/fifo", "d/null", "blk", "sock"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			out[p] = err.Error()
			continue
		}
		out[p] = fmt.Sprintf("mode %07o uid %d gid %d rdev %d:%d mtime %d", st.Mode, st.Uid, st.Gid, unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mtim.Nano())
	}
	return out
}

// TestImportExportSpecialFiles: import stores fifos, sockets and device
// nodes as metadata (never opening them: a fifo would block the import),
// export makes them again with the same type, number, owner, mode and
// mtime; an export onto what exists fails unless Overwrite, which
// replaces a symlink planted there without touching its target.
func TestImportExportSpecialFiles(t *testing.T) {
	src := t.TempDir()
	want := specialTree(t, src)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	res, err := s.Import(ctx, src, "m", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Special != 4 || len(res.Skipped) != 0 {
		t.Fatalf("import: %+v", res)
	}
	for p, k := range map[string]Kind{"d/fifo": KindFifo, "d/null": KindCharDev, "blk": KindBlockDev, "sock": KindSocket} {
		e, err := s.Lookup("m/" + p)
		if err != nil || e.Kind != k {
			t.Fatalf("%s: %+v %v, want %v", p, e, err, k)
		}
	}
	if e, _ := s.Lookup("m/blk"); e.Rdev != unix.Mkdev(259, 4100) {
		t.Fatalf("blk rdev %#x", e.Rdev)
	}
	dest := filepath.Join(t.TempDir(), "x")
	if _, _, err := s.Export(ctx, "m", dest, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	got := specialStats(t, dest)
	for p := range want {
		if got[p] != want[p] {
			t.Errorf("%s exported: %s, want %s", p, got[p], want[p])
		}
	}
	// Again onto itself: refused; with Overwrite, a symlink at the name
	// is replaced, its target left alone.
	if _, _, err := s.Export(ctx, "m/d/fifo", filepath.Join(dest, "d/fifo"), ExportOptions{}); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("export onto an existing fifo: %v, want EEXIST", err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dest, "blk"))
	if err := os.Symlink(victim, filepath.Join(dest, "blk")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Export(ctx, "m/blk", filepath.Join(dest, "blk"), ExportOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if got := specialStats(t, dest)["blk"]; got != want["blk"] {
		t.Errorf("blk over a symlink: %s, want %s", got, want["blk"])
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("the symlink's target changed: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(victim, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o600 || st.Uid != 0 {
		t.Fatalf("the symlink's target: %+v %v", st, err)
	}

	// Not as root: fifos and sockets are made (without setgid, as files
	// are), devices are not, and each thing left out is said.
	nr := filepath.Join(t.TempDir(), "nr")
	for _, d := range []string{filepath.Dir(filepath.Dir(nr)), filepath.Dir(nr)} {
		if err := os.Chmod(d, 0o777); err != nil { // t.TempDir's are 0700
			t.Fatal(err)
		}
	}
	var notes []string
	err = asUser(65534, func() error {
		_, _, err := s.Export(ctx, "m", nr, ExportOptions{Note: func(m string) { notes = append(notes, m) }})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got = specialStats(t, nr)
	if !strings.HasPrefix(got["d/fifo"], "mode 0010640 uid 65534") || !strings.HasPrefix(got["sock"], "mode 0140755 uid 65534") {
		t.Errorf("not as root: fifo %s, socket %s", got["d/fifo"], got["sock"])
	}
	if !strings.Contains(got["blk"], "no such file") || !strings.Contains(got["d/null"], "no such file") {
		t.Errorf("not as root, devices were made: %v", got)
	}
	if n := strings.Join(notes, "\n"); !strings.Contains(n, "blk: block-device 259:4100 not created") || !strings.Contains(n, "null: char-device 1:3 not created") ||
		!strings.Contains(n, "fifo: setuid/setgid not restored") {
		t.Errorf("notes: %q", notes)
	}
}

// asUser runs fn on one locked OS thread with uid and gid changed (Linux
// credentials are per thread; the thread dies with its goroutine).
func asUser(id int, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(id), uintptr(id), uintptr(id)); e != 0 {
			done <- e
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(id), uintptr(id), uintptr(id)); e != 0 {
			done <- e
			return
		}
		done <- fn()
	}()
	return <-done
}

// TestSpecialFilesThroughMaintenance: gc, verify, fsck and stats walk a
// namespace with special files (which name no object) without error, and
// gc keeps what the tree's files need.
func TestSpecialFilesThroughMaintenance(t *testing.T) {
	src := t.TempDir()
	specialTree(t, src)
	if err := os.WriteFile(filepath.Join(src, "d", "file"), []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "m", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatalf("gc: %v", err)
	}
	rep, err := s.Verify(ctx, "", nil)
	if err != nil || len(rep.Problems) != 0 || rep.Files != 1 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	fr, err := s.Fsck(ctx)
	if err != nil || !fr.OK() {
		t.Fatalf("fsck: %+v %v", fr, err)
	}
	if _, err := s.Stats(); err != nil {
		t.Fatalf("stats: %v", err)
	}
	dest := filepath.Join(t.TempDir(), "x")
	if _, _, err := s.Export(ctx, "m", dest, ExportOptions{}); err != nil {
		t.Fatalf("export after gc: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "d", "file")); err != nil || string(b) != "content" {
		t.Fatalf("file after gc: %q %v", b, err)
	}
}
