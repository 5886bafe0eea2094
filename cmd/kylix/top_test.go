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

// TestTopKVColumns: the KV store's gets per tier, its misses and bytes,
// as rates of the node's kylix_kv_* counters between two scrapes, and
// the mean time of a get from its histogram.
func TestTopKVColumns(t *testing.T) {
	scrape := func(mem, disk, miss, member int, secs float64) sample {
		fams, err := parseMetrics(strings.NewReader(fmt.Sprintf(`# TYPE kylix_kv_hits_total counter
kylix_kv_hits_total{tier="memory"} %d
kylix_kv_hits_total{tier="disk"} %d
# TYPE kylix_kv_misses_total counter
kylix_kv_misses_total %d
# TYPE kylix_kv_member_hits_total counter
kylix_kv_member_hits_total %d
# TYPE kylix_kv_get_seconds histogram
kylix_kv_get_seconds_bucket{tier="memory",le="+Inf"} %d
kylix_kv_get_seconds_sum{tier="memory"} %g
kylix_kv_get_seconds_count{tier="memory"} %d
kylix_kv_get_seconds_bucket{tier="disk",le="+Inf"} %d
kylix_kv_get_seconds_sum{tier="disk"} %g
kylix_kv_get_seconds_count{tier="disk"} %d
# TYPE kylix_kv_read_bytes_total counter
kylix_kv_read_bytes_total{tier="memory"} %d
kylix_kv_read_bytes_total{tier="disk"} %d
`, mem, disk, miss, member, mem, secs, mem, disk, secs, disk, mem<<20, disk<<20)))
		require.NoError(t, err)
		return flattenMap(fams)
	}
	prev, cur := scrape(10, 4, 1, 3, 0.5), scrape(70, 24, 9, 7, 1.3)
	got := map[string]float64{}
	for _, c := range topColumns {
		got[c.key] = c.value(prev, cur, 2)
	}
	assert.Equal(t, 30.0, got["kv_memory_hits_per_second"])
	assert.Equal(t, 10.0, got["kv_disk_hits_per_second"])
	assert.Equal(t, 4.0, got["kv_misses_per_second"])
	assert.Equal(t, 2.0, got["kv_member_hits_per_second"])
	assert.Equal(t, float64(40<<20), got["kv_read_bytes_per_second"], "60 + 20 blocks of 1 MiB in 2 s")
	assert.InDelta(t, 20.0, got["kv_get_mean_ms"], 1e-9, "(0.8 + 0.8) s over 80 gets")
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
	assert.Equal(t, []string{"30", "10", "4", "2"}, fields[len(fields)-6:len(fields)-2])
	assert.Equal(t, "20", fields[len(fields)-1], "mean get ms")
}
