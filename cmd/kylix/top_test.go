package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTopReadsMetrics: top reads the figures back from a node's metrics
// text (what the admin socket's metrics op and --metrics serve) and shows
// a line of every column.
func TestTopReadsMetrics(t *testing.T) {
	fams, err := parseMetrics(strings.NewReader(`# TYPE kylix_gpu_fill_bytes_total counter
kylix_gpu_fill_bytes_total{io_path="bounce"} 1024
kylix_gpu_fill_bytes_total{io_path="gds"} 7
# TYPE kylix_client_pack_fd_bytes_total counter
kylix_client_pack_fd_bytes_total 4096
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1e+08
`))
	require.NoError(t, err)
	cur := flattenMap(fams)
	assert.Equal(t, 1031.0, cur.byName["kylix_gpu_fill_bytes_total"])
	assert.Equal(t, 4096.0, cur.series["kylix_client_pack_fd_bytes_total"])
	assert.Contains(t, cur.byName, "process_resident_memory_bytes")

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
