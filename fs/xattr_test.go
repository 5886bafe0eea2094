package fs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// TestXattrNamespaces: through the mount, getxattr answers by namespace
// (security.*, trusted.* and system.*, POSIX ACLs included, not
// supported: ENOTSUP; an absent user.* attribute: ENODATA; user.kylix.*
// computed), on both mounts; and `ls -lR`, which asks every entry for
// security.selinux and system.posix_acl_access, sends the node a handful
// of GETXATTR requests for a tree of 300 entries instead of two per
// entry, the first listing too, while the kernel's permission check
// (from the mode) still refuses another user a 0600 file.
func TestXattrNamespaces(t *testing.T) {
	if _, err := exec.LookPath("ls"); err != nil {
		t.Skip("no ls here")
	}
	for _, ro := range []bool{false, true} {
		t.Run(fmt.Sprintf("read-only=%v", ro), func(t *testing.T) {
			m := fstest.Mount(t, kfs.Options{ReadOnly: ro})
			if !ro {
				openUp(t, m.Dir)
			}
			files := map[string][]byte{}
			for i := range 300 {
				files[fmt.Sprintf("d%d/f%03d", i%3, i)] = []byte(fmt.Sprint("file ", i))
			}
			importTree(t, m, "ds", files)
			p := filepath.Join(m.Dir, "ds", "d0", "f000")
			buf := make([]byte, 256)
			for attr, want := range map[string]syscall.Errno{
				"security.selinux":         syscall.ENOTSUP,
				"trusted.overlay.opaque":   syscall.ENOTSUP,
				"user.nothing":             syscall.ENODATA,
				"system.posix_acl_access":  syscall.ENOTSUP,
				"system.posix_acl_default": syscall.ENOTSUP,
			} {
				for _, q := range []string{p, filepath.Dir(p)} {
					_, err := unix.Lgetxattr(q, attr, buf)
					assert.Equal(t, want, errnoOf(err), "%s of %s", attr, q)
				}
			}
			n, err := unix.Lgetxattr(p, "user.kylix.state", buf)
			require.NoError(t, err)
			assert.Equal(t, "committed", string(buf[:n]))
			n, err = unix.Lgetxattr(filepath.Dir(p), "user.kylix.id", buf)
			require.NoError(t, err)
			assert.Len(t, string(buf[:n]), 64, "a directory's manifest id")
			if !ro {
				err = unix.Setxattr(p, "security.test", []byte("x"), 0)
				assert.Equal(t, syscall.ENOTSUP, errnoOf(err), "setxattr security.*")
				assert.Equal(t, syscall.ENOTSUP, errnoOf(unix.Removexattr(p, "security.test")), "removexattr security.*")
			}

			for run := range 2 {
				before := m.FS.Stats().XattrRequests
				out, err := exec.Command("ls", "-lR", filepath.Join(m.Dir, "ds")).CombinedOutput()
				require.NoError(t, err, "ls -lR: %s", out)
				assert.Equal(t, 300, strings.Count(string(out), "\n-r"), "ls -lR lists every file")
				asked := m.FS.Stats().XattrRequests - before
				assert.LessOrEqual(t, asked, int64(6), "run %d: ls -lR of 303 entries sent %d GETXATTR requests to the node", run, asked)
			}

			if !ro {
				secret := filepath.Join(m.Dir, "ds", "secret")
				require.NoError(t, os.WriteFile(secret, []byte("root only"), 0o600))
				_, err := exec.Command("ls", "-l", secret).CombinedOutput()
				require.NoError(t, err)
				err = as(nobody, func() error { _, err := os.ReadFile(secret); return err })
				assert.Equal(t, syscall.EACCES, errnoOf(err), "65534 reads a 0600 file of root")
			}
		})
	}
}

// TestUmaskThroughMount: files and directories made through the mount
// get the creator's umask (applied by the kernel: POSIX ACLs are off, so
// no default ACL can stand in for it), by a real shell's touch and mkdir.
func TestUmaskThroughMount(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	cmd := exec.Command("sh", "-c", "umask 027 && touch f && mkdir d && umask 0 && touch g")
	cmd.Dir = m.Dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for name, want := range map[string]os.FileMode{"f": 0o640, "d": 0o750 | os.ModeDir, "g": 0o666} {
		st, err := os.Stat(filepath.Join(m.Dir, name))
		require.NoError(t, err)
		assert.Equal(t, want, st.Mode(), name)
	}
}

// TestCopyTreeIntoMount: `cp -a` (coreutils, which carries permissions,
// ACLs and extended attributes across) of a tree with a subdirectory, a
// file, a symlink and a FIFO into the mount succeeds without a word,
// every kind of node refusing setxattr of an ACL with ENOTSUP; the copy
// reads back equal, and the copy out of the mount too.
func TestCopyTreeIntoMount(t *testing.T) {
	if _, err := exec.LookPath("cp"); err != nil {
		t.Skip("no cp here")
	}
	m := fstest.Mount(t, kfs.Options{})
	src := filepath.Join(t.TempDir(), "tree")
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(src, "sub", "a.bin"), []byte("some bytes"), 0o640))
	require.NoError(t, os.Symlink("sub/a.bin", filepath.Join(src, "link")))
	require.NoError(t, unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	dst := filepath.Join(m.Dir, "tree")
	out, err := exec.Command("cp", "-a", src, dst).CombinedOutput()
	require.NoError(t, err, "cp -a into the mount: %s", out)
	assert.Empty(t, string(out), "cp -a said something")
	for _, p := range []string{"sub", "sub/a.bin", "link", "fifo"} {
		want, err := os.Lstat(filepath.Join(src, p))
		require.NoError(t, err)
		got, err := os.Lstat(filepath.Join(dst, p))
		require.NoError(t, err)
		assert.Equal(t, want.Mode(), got.Mode(), p)
		err = unix.Lsetxattr(filepath.Join(dst, p), "system.posix_acl_access", []byte{2, 0, 0, 0}, 0)
		assert.Contains(t, []syscall.Errno{syscall.ENOTSUP, syscall.EPERM}, errnoOf(err), "setxattr of an ACL on %s: %v", p, err)
	}
	b, err := os.ReadFile(filepath.Join(dst, "sub", "a.bin"))
	require.NoError(t, err)
	assert.Equal(t, "some bytes", string(b))
	back := filepath.Join(t.TempDir(), "back")
	out, err = exec.Command("cp", "-a", dst, back).CombinedOutput()
	require.NoError(t, err, "cp -a out of the mount: %s", out)
	b, err = os.ReadFile(filepath.Join(back, "sub", "a.bin"))
	require.NoError(t, err)
	assert.Equal(t, "some bytes", string(b))
}
