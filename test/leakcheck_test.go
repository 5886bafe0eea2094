package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leakCheck runs scripts/leak-check.sh compare against the state in file,
// returning what it printed and its exit status.
func leakCheck(t *testing.T, file string) (string, int) {
	t.Helper()
	b, err := exec.Command("bash", "../scripts/leak-check.sh", "compare", file).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(b), ee.ExitCode()
	}
	require.NoError(t, err, "%s", b)
	return string(b), 0
}

// TestLeakCheckSeesKilledNode: a node killed with SIGKILL leaves a stale
// mount (ENOTCONN: mountpoint -q and stat see no mount there) and its
// client socket in /run/kylix; the leak check CI runs after make test names
// both (issue 23, C.8), and the node helpers' cleanup (clearLeftovers)
// removes both.
func TestLeakCheckSeesKilledNode(t *testing.T) {
	requireFUSE(t)
	state := filepath.Join(t.TempDir(), "state")
	data, mnt := dirs(t)
	require.NoError(t, os.MkdirAll(mnt, 0o755))
	before, err := exec.Command("bash", "../scripts/leak-check.sh", "state").Output()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(state, before, 0o600))

	n := startNode(t, data, mnt)
	// The start-up message may follow the mount's first answer.
	waitFor(t, 10*time.Second, "the node's start-up message naming its client socket", func() bool { return n.clientSocket() != "" })
	sock := n.clientSocket()
	n.kill9()
	var st syscall.Statfs_t
	require.ErrorIs(t, syscall.Statfs(mnt, &st), syscall.ENOTCONN, "statfs of the mount of a node killed with SIGKILL")
	assert.True(t, isMounted(mnt), "/proc/self/mountinfo lists the stale mount")
	if b, err := exec.Command("mountpoint", "-q", mnt).CombinedOutput(); err == nil {
		t.Logf("mountpoint -q now sees the stale mount too (%s)", b)
	}

	out, code := leakCheck(t, state)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "mount   "+mnt+" (fuse.kylix, stale: Transport endpoint is not connected; umount -l it)")
	assert.Contains(t, out, "socket  "+sock)

	n.clearLeftovers()
	assert.False(t, isMounted(mnt))
	_, err = os.Lstat(sock)
	assert.True(t, os.IsNotExist(err), "client socket after the cleanup: %v", err)
	out, _ = leakCheck(t, state)
	assert.NotContains(t, out, mnt)
	assert.NotContains(t, out, sock)
	if strings.Contains(out, "FAIL") {
		t.Logf("left by others running now (not this test):\n%s", out)
	}
}
