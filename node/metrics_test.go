package node

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
)

// TestNodeCollector: the node's metrics pass Prometheus' naming lint, the
// registry with the Go and process collectors is consistent, and top reads
// the figures back from it.
func TestNodeCollector(t *testing.T) {
	s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	fsys, err := kfs.New(s, kfs.Options{})
	require.NoError(t, err)
	cl := &clientServer{}
	cl.fillPaths.add("bounce", 1000)
	cl.fillPaths.add("bounce", 24)
	cl.fillPaths.add("gds", 7)
	cl.packFdBytes.Add(4096)
	c := &nodeCollector{s: s, fsys: fsys, client: cl}

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP kylix_gpu_fill_bytes_total Bytes written into clients' GPU memory, by the I/O path taken.
# TYPE kylix_gpu_fill_bytes_total counter
kylix_gpu_fill_bytes_total{io_path="bounce"} 1024
kylix_gpu_fill_bytes_total{io_path="gds"} 7
# HELP kylix_gpu_fills_total GPU fills for clients, by the I/O path they took.
# TYPE kylix_gpu_fills_total counter
kylix_gpu_fills_total{io_path="bounce"} 2
kylix_gpu_fills_total{io_path="gds"} 1
`), "kylix_gpu_fill_bytes_total", "kylix_gpu_fills_total"))

	m, err := startMetrics("", s, fsys, cl, nil)
	require.NoError(t, err)
	assert.Empty(t, m.url(), "no --metrics: no endpoint")
	text, err := m.text()
	require.NoError(t, err)
	assert.Contains(t, text, "kylix_gpu_fill_bytes_total{io_path=\"bounce\"} 1024\n")
	assert.Contains(t, text, "kylix_client_pack_fd_bytes_total 4096\n")
	assert.Contains(t, text, "process_resident_memory_bytes ")
	assert.Contains(t, text, "go_goroutines ")
}
