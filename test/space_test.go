package test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

	n := launchNode(t, data, mnt, nil, nil, "--reserve", "50%")
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
