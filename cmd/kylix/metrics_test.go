package main

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
	assert.Equal(t, "  metrics: off (--metrics ADDR)\n", m.line())
	fams, err := m.reg.Gather()
	require.NoError(t, err)
	cur := flatten(fams)
	assert.Equal(t, 1031.0, cur.byName["kylix_gpu_fill_bytes_total"])
	assert.Equal(t, 4096.0, cur.series["kylix_client_pack_fd_bytes_total"])
	assert.Contains(t, cur.byName, "process_resident_memory_bytes")
	assert.Contains(t, cur.byName, "go_goroutines")

	// A second of activity, as top shows it.
	prev := sample{series: map[string]float64{}, byName: map[string]float64{}}
	line := topLine(prev, cur, 2)
	assert.Len(t, strings.Fields(line), len(topColumns))
	hdr := strings.Split(topHeader(), "\n")
	require.Len(t, hdr, 2)
	assert.Len(t, strings.Fields(hdr[1]), len(topColumns))
	assert.Equal(t, len(hdr[0]), len(hdr[1]), "groups over their columns")
}

func TestMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:9477":                       "http://127.0.0.1:9477/metrics",
		"http://127.0.0.1:9477":                "http://127.0.0.1:9477/metrics",
		"https://node:9477/metrics":            "https://node:9477/metrics",
		"http://proxy/kylix/node1/metrics?x=1": "http://proxy/kylix/node1/metrics?x=1",
	} {
		assert.Equal(t, want, metricsURL(in), in)
	}
}

func TestShortBytes(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1023: "1023", 1024: "1.0K", 1536: "1.5K", 150 << 20: "150M", 3 << 40: "3.0T"} {
		assert.Equal(t, want, shortBytes(v), "%v", v)
	}
}
