package test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestServeReadOnly: `kylix serve --read-only` through real clients: cp
// and sha256sum read what was imported, an import while the node runs
// shows at once, and the shell, mkdir, touch, rm and chmod are refused
// with "Read-only file system".
func TestServeReadOnly(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	src := filepath.Join(t.TempDir(), "src")
	writeSmallFiles(t, src, 300, 5)
	launchNode(t, data, mnt, nil, nil, "--read-only")
	mustKylix(t, "/", "import", "--data", data, src, "ds")
	out := filepath.Join(t.TempDir(), "copy")
	run(t, "/", "cp", "-r", filepath.Join(mnt, "ds"), out)
	assert.True(t, equalSums(treeSums(t, src), treeSums(t, out)), "cp -r out of the read-only mount differs")
	run(t, filepath.Join(mnt, "ds"), "sha256sum", "d000/f00000", "d002/f00299")

	mustKylix(t, "/", "import", "--data", data, src, "ds2")
	run(t, "/", "cmp", filepath.Join(src, "d001", "f00150"), filepath.Join(mnt, "ds2", "d001", "f00150"))

	for _, script := range []string{
		"echo x > " + filepath.Join(mnt, "ds", "new"),
		"mkdir " + filepath.Join(mnt, "ds", "dir"),
		"touch " + filepath.Join(mnt, "ds", "d000", "f00000"),
		"rm " + filepath.Join(mnt, "ds", "d000", "f00000"),
		"chmod 600 " + filepath.Join(mnt, "ds", "d000", "f00000"),
	} {
		msg, err := exec.Command("sh", "-c", script).CombinedOutput()
		assert.Error(t, err, script)
		assert.True(t, strings.Contains(string(msg), "Read-only file system"), "%s: %s", script, msg)
	}
}
