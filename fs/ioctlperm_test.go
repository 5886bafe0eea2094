package fs_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/fs/layout"
	"github.com/kylix/kylix/internal/testneeds"
)

// contentIoctls calls every layout ioctl that tells something about a
// file's content on fd and returns "NAME=errno" for each (errno 0: it
// answered), then PROBE's, which tells nothing about the file.
func contentIoctls(fd int) string {
	var out []string
	add := func(name string, err error) {
		var e syscall.Errno
		switch {
		case err == nil:
			e = 0
		case errors.As(err, &e):
		default:
			e = syscall.EIO
		}
		out = append(out, fmt.Sprintf("%s=%d", name, int(e)))
	}
	_, err := layout.Chunks(fd, 0, 4)
	add("CHUNKS", err)
	_, err = layout.Pack(fd, 0)
	add("PACK", err)
	_, err = layout.Query(fd, 0, 0)
	add("LAYOUT", err)
	_, err = layout.PackPath(fd, 1)
	add("PACK_PATH", err)
	add("MAKE_LOCAL", layout.MakeLocal(fd, 0, 0))
	_, err = layout.ProbeFD(fd)
	add("PROBE", err)
	return strings.Join(out, " ")
}

// TestIoctlNeedsReadableFd: the layout ioctls that describe a file's
// content (CHUNKS, PACK, LAYOUT, PACK_PATH, MAKE_LOCAL) answer only an fd
// open for reading, as read(2) does: on an O_WRONLY fd they are EBADF.
// Chunk ids would otherwise let a user who may write a file but not read
// it confirm a guess of its content. Run as root and, through the mount,
// as uid 65534 on a file of mode 0622 (writable by it, not readable).
// PROBE answers any fd.
func TestIoctlNeedsReadableFd(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	testneeds.Command(t, "setpriv", "util-linux")
	importTree(t, m, "d", map[string][]byte{"secret.bin": pattern(41, 3<<20+5)})
	path := filepath.Join(m.Dir, "d/secret.bin")
	if err := os.Chmod(path, 0o622); err != nil {
		t.Fatal(err)
	}
	ebadf := fmt.Sprintf("CHUNKS=%[1]d PACK=%[1]d LAYOUT=%[1]d PACK_PATH=%[1]d MAKE_LOCAL=%[1]d PROBE=0", int(syscall.EBADF))

	// Root: O_RDWR answers (the file's bytes are in pack 1, the store's
	// first), O_WRONLY does not.
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := contentIoctls(int(rw.Fd())), "CHUNKS=0 PACK=0 LAYOUT=0 PACK_PATH=0 MAKE_LOCAL=0 PROBE=0"; got != want {
		t.Errorf("root, O_RDWR: %s, want %s", got, want)
	}
	rw.Close()
	wo, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := contentIoctls(int(wo.Fd())); got != ebadf {
		t.Errorf("root, O_WRONLY: %s, want %s", got, ebadf)
	}
	wo.Close()

	// uid 65534, which may write the file but not read it.
	for d := filepath.Dir(m.Dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	if err := os.Chmod(m.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(m.Dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := copySelf(t)
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		bin, "-test.run", "^TestIoctlPermHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "KYLIX_IOCTL_HELPER="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	for _, want := range []string{"O_RDONLY: permission denied", "O_WRONLY: " + ebadf} {
		if !strings.Contains(string(out), want) {
			t.Errorf("helper output lacks %q:\n%s", want, out)
		}
	}
}

// TestIoctlPermHelper is the process TestIoctlNeedsReadableFd runs as uid
// 65534 (skipped otherwise).
func TestIoctlPermHelper(t *testing.T) {
	path := os.Getenv("KYLIX_IOCTL_HELPER")
	if path == "" {
		t.Skip("helper process")
	}
	if _, err := os.Open(path); err != nil {
		fmt.Printf("O_RDONLY: %v\n", errors.Unwrap(err))
	} else {
		fmt.Printf("O_RDONLY: opened\n")
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("O_WRONLY open: %v", err)
	}
	defer unix.Close(fd)
	fmt.Printf("O_WRONLY: %s\n", contentIoctls(fd))
}

// copySelf copies the test binary where another user can run it.
func copySelf(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "fs.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
