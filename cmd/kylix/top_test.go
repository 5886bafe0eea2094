package main

import (
	"fmt"
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

// TestTopKVColumns: the KV store's gets per tier and its misses, as rates
// of the node's kylix_kv_* counters between two scrapes.
func TestTopKVColumns(t *testing.T) {
	scrape := func(mem, disk, miss, member int) sample {
		fams, err := parseMetrics(strings.NewReader(fmt.Sprintf(`# TYPE kylix_kv_hits_total counter
kylix_kv_hits_total{tier="memory"} %d
kylix_kv_hits_total{tier="disk"} %d
# TYPE kylix_kv_misses_total counter
kylix_kv_misses_total %d
# TYPE kylix_kv_member_hits_total counter
kylix_kv_member_hits_total %d
# TYPE kylix_kv_get_seconds histogram
kylix_kv_get_seconds_bucket{tier="memory",le="+Inf"} %d
kylix_kv_get_seconds_sum{tier="memory"} 0.5
kylix_kv_get_seconds_count{tier="memory"} %d
`, mem, disk, miss, member, mem, mem)))
		require.NoError(t, err)
		return flattenMap(fams)
	}
	prev, cur := scrape(10, 4, 1, 3), scrape(70, 24, 9, 7)
	got := map[string]float64{}
	for _, c := range topColumns {
		got[c.key] = c.value(prev, cur, 2)
	}
	assert.Equal(t, 30.0, got["kv_memory_hits_per_second"])
	assert.Equal(t, 10.0, got["kv_disk_hits_per_second"])
	assert.Equal(t, 4.0, got["kv_misses_per_second"])
	assert.Equal(t, 2.0, got["kv_member_hits_per_second"])
	// A node restarted between scrapes (counters lower) shows 0, not a negative rate.
	got = map[string]float64{}
	for _, c := range topColumns {
		got[c.key] = c.value(cur, prev, 2)
	}
	assert.Zero(t, got["kv_memory_hits_per_second"])
	assert.Zero(t, got["kv_misses_per_second"])
	hdr := strings.Split(topHeader(), "\n")
	assert.Contains(t, hdr[0], "kv")
	assert.Contains(t, hdr[1], "disk/s")
	assert.Contains(t, hdr[1], "memb/s")
	fields := strings.Fields(topLine(prev, cur, 2))
	assert.Equal(t, []string{"30", "10", "4", "2"}, fields[len(fields)-4:])
}
