package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestServeReserve: `kylix serve --reserve` reaches the mount: statfs
// through it leaves the reserve out of f_bavail, and a bad value is
// refused with a message.
func TestServeReserve(t *testing.T) {
	requireFUSE(t)
	disk := t.TempDir()
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=32m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(disk, unix.MNT_DETACH) })
	data, mnt := filepath.Join(disk, "data"), filepath.Join(t.TempDir(), "mnt")

	if _, errs, code := kylix(t, "/", "serve", "--data", data, "--mount", mnt, "--reserve", "lots"); code == 0 || !strings.Contains(errs, "--reserve") {
		t.Errorf("serve --reserve lots: exit %d, stderr %q; want a failure naming --reserve", code, errs)
	}

	n := &node{t: t, data: data, mnt: mnt, log: &lockedBuffer{}}
	n.cmd = exec.Command(kylixBin, "serve", "--data", data, "--mount", mnt, "--reserve", "50%")
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n.cmd.ProcessState == nil {
			n.stop()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !isMounted(mnt) || !answers(filepath.Join(data, "kylix.sock")) {
		if time.Now().After(deadline) {
			n.cmd.Process.Kill()
			t.Fatalf("node did not come up: %s", n.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var raw, st unix.Statfs_t
	if err := unix.Statfs(disk, &raw); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	diff, want := int64(st.Bfree-st.Bavail), int64(raw.Blocks)/2
	if st.Blocks != raw.Blocks || st.Bfree > raw.Bfree || diff < want-1 || diff > want+1 {
		t.Errorf("statfs through the mount with --reserve 50%%: blocks %d (raw %d), f_bfree %d (raw %d), f_bavail %d; want f_bavail = f_bfree - %d",
			st.Blocks, raw.Blocks, st.Bfree, raw.Bfree, st.Bavail, want)
	}
	t.Logf("through the mount: f_blocks %d f_bfree %d f_bavail %d (raw f_bfree %d)", st.Blocks, st.Bfree, st.Bavail, raw.Bfree)
	b := bytes.Repeat([]byte("kylix"), 200000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), b, 0o644); err != nil {
		t.Errorf("root write: %v", err)
	}
	n.stop()
}
