package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestStatSpecialFiles: `kylix stat` of an imported fifo names no object
// (special files are metadata only) and of a device node its major:minor.
func TestStatSpecialFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mknod of a device node; CI runs this as root")
	}
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.MkdirAll(src, 0o755))
	require.NoError(t, unix.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	require.NoError(t, unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	data := filepath.Join(t.TempDir(), "data")
	mustKylix(t, "/", "import", "--data", data, src, "d")
	var st struct {
		Kind   string `json:"kind"`
		ID     string `json:"id"`
		Device string `json:"device"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "stat", "--data", data, "--json", "d/fifo")), &st))
	assert.Equal(t, "fifo", st.Kind)
	assert.Empty(t, st.ID, "a fifo names no object")
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "stat", "--data", data, "--json", "d/null")), &st))
	assert.Equal(t, "1:3", st.Device)
	assert.Empty(t, st.ID)
	assert.Contains(t, mustKylix(t, "/", "stat", "--data", data, "d/null"), "device:   1:3\n")
}
