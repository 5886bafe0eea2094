package node

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/node/kvstore"
)

// TestKVCollector: the KV metrics pass Prometheus' lint and count what the
// store did, per tier, the get latencies as histograms.
func TestKVCollector(t *testing.T) {
	s, err := kvstore.Open(kvstore.Options{BlockSize: 4096, MemBudget: 2 * 4096})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	k := kvstore.Key{NS: 1}
	require.NoError(t, s.Put(k, make([]byte, 4096)))
	for range 3 {
		_, err := s.Get(k, func([]byte) error { return nil })
		require.NoError(t, err)
	}
	s.Get(kvstore.Key{NS: 2}, func([]byte) error { return nil })
	c := &kvCollector{kv: s}
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP kylix_kv_hits_total KV block gets answered, by the tier that held the block.
# TYPE kylix_kv_hits_total counter
kylix_kv_hits_total{tier="disk"} 0
kylix_kv_hits_total{tier="memory"} 3
# HELP kylix_kv_misses_total KV block gets that found no block (or one that failed its check).
# TYPE kylix_kv_misses_total counter
kylix_kv_misses_total 1
`), "kylix_kv_hits_total", "kylix_kv_misses_total"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() == "kylix_kv_get_seconds" {
			for _, m := range f.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	assert.Equal(t, map[string]uint64{"memory": 3, "disk": 0}, counts, "a get-latency histogram per tier, one sample per hit")
}

// TestKVCollectorMembers: on a cluster member, the members tier's figures
// pass the lint and are exported as counted.
func TestKVCollectorMembers(t *testing.T) {
	s, err := kvstore.Open(kvstore.Options{BlockSize: 4096, MemBudget: 4096})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	ms := &KVMemberStats{Hits: 5, Misses: 2, Pushed: 7, PushFailed: 1, PushDropped: 3, PushWaiting: 4}
	c := &kvCollector{kv: s, members: func() *KVMemberStats { return ms }}
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP kylix_kv_member_copies_total KV blocks put here and copied to their home member, by result (ok, failed, dropped: the queue was full).
# TYPE kylix_kv_member_copies_total counter
kylix_kv_member_copies_total{result="dropped"} 3
kylix_kv_member_copies_total{result="failed"} 1
kylix_kv_member_copies_total{result="ok"} 7
# HELP kylix_kv_member_hits_total KV block gets answered by another member of the cluster.
# TYPE kylix_kv_member_hits_total counter
kylix_kv_member_hits_total 5
# HELP kylix_kv_member_copies_waiting KV blocks queued or being copied to their home member.
# TYPE kylix_kv_member_copies_waiting gauge
kylix_kv_member_copies_waiting 4
`), "kylix_kv_member_copies_total", "kylix_kv_member_hits_total", "kylix_kv_member_copies_waiting"))
	// Not a cluster member: none of them.
	ms = nil
	n, err := testutil.GatherAndCount(func() *prometheus.Registry { r := prometheus.NewRegistry(); r.MustRegister(c); return r }(), "kylix_kv_member_hits_total")
	require.NoError(t, err)
	assert.Zero(t, n)
}
