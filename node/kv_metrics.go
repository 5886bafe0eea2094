package node

// The KV store's Prometheus metrics (docs/design/kv.md, docs/design/metrics.md
// style): read from kvstore.Stats at scrape time, per tier.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kylix/kylix/node/kvstore"
)

var (
	mKVHits      = desc("kv_hits_total", "KV block gets answered, by the tier that held the block.", "tier")
	mKVMisses    = desc("kv_misses_total", "KV block gets that found no block (or one that failed its check).")
	mKVReadBytes = desc("kv_read_bytes_total", "Bytes of KV blocks returned to clients, by tier.", "tier")
	mKVBytes     = desc("kv_bytes", "Bytes of KV blocks held, by tier.", "tier")
	mKVBudget    = desc("kv_budget_bytes", "The KV store's budget, by tier.", "tier")
	mKVBlocks    = desc("kv_blocks", "KV blocks held, by tier.", "tier")
	mKVEvictions = desc("kv_evictions_total", "KV blocks evicted to make room, by tier.", "tier")
	mKVPuts      = desc("kv_puts_total", "KV block puts taken.")
	mKVRefused   = desc("kv_puts_refused_total", "KV block puts refused: no room that eviction could make.")
	mKVDirty     = desc("kv_dirty_blocks", "KV blocks in memory waiting for their disk write.")
	mKVDiskErrs  = desc("kv_disk_write_errors_total", "KV block disk writes that failed (the block stayed in memory only).")
	mKVGetSecs   = desc("kv_get_seconds", "Time of KV block gets that hit, by tier: lookup, the disk read and check, and the copy to the client.", "tier")
	mKVVerify    = desc("kv_verify_failures_total", "KV blocks read from disk that failed their BLAKE3 check or could not be read (each a miss).")

	mKVMemberHits    = desc("kv_member_hits_total", "KV block gets answered by another member of the cluster.")
	mKVMemberMisses  = desc("kv_member_misses_total", "KV block gets that asked the members and found no good copy.")
	mKVMemberCopies  = desc("kv_member_copies_total", "KV blocks put here and copied to their home member, by result (ok, failed, dropped: the queue was full).", "result")
	mKVMemberWaiting = desc("kv_member_copies_waiting", "KV blocks queued or being copied to their home member.")
)

// kvCollector reads a KV store's figures at each scrape; members, when
// set, the members tier's (nil until the node joined a cluster).
type kvCollector struct {
	kv      *kvstore.Store
	members func() *KVMemberStats
}

func (c *kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mKVHits, mKVMisses, mKVReadBytes, mKVBytes, mKVBudget, mKVBlocks, mKVEvictions,
		mKVPuts, mKVRefused, mKVDirty, mKVDiskErrs, mKVVerify, mKVGetSecs,
		mKVMemberHits, mKVMemberMisses, mKVMemberCopies, mKVMemberWaiting} {
		ch <- d
	}
}

func (c *kvCollector) Collect(ch chan<- prometheus.Metric) {
	m := func(d *prometheus.Desc, t prometheus.ValueType, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	st := c.kv.Stats()
	for _, tier := range []struct {
		name string
		ts   kvstore.TierStats
	}{{"memory", st.Memory}, {"disk", st.Disk}} {
		m(mKVHits, prometheus.CounterValue, tier.ts.Hits, tier.name)
		m(mKVReadBytes, prometheus.CounterValue, tier.ts.ReadBytes, tier.name)
		m(mKVBytes, prometheus.GaugeValue, tier.ts.Bytes, tier.name)
		m(mKVBudget, prometheus.GaugeValue, tier.ts.Budget, tier.name)
		m(mKVBlocks, prometheus.GaugeValue, tier.ts.Blocks, tier.name)
		m(mKVEvictions, prometheus.CounterValue, tier.ts.Evictions, tier.name)
		buckets, n := map[float64]uint64{}, uint64(0)
		for i, ub := range kvstore.LatencyBuckets {
			n += uint64(tier.ts.GetLatency.Counts[i])
			buckets[ub] = n
		}
		n += uint64(tier.ts.GetLatency.Counts[len(kvstore.LatencyBuckets)])
		ch <- prometheus.MustNewConstHistogram(mKVGetSecs, n, tier.ts.GetLatency.Seconds, buckets, tier.name)
	}
	m(mKVMisses, prometheus.CounterValue, st.Misses)
	m(mKVPuts, prometheus.CounterValue, st.Puts)
	m(mKVRefused, prometheus.CounterValue, st.Refused)
	m(mKVDirty, prometheus.GaugeValue, st.Dirty)
	m(mKVDiskErrs, prometheus.CounterValue, st.DiskWriteErrors)
	m(mKVVerify, prometheus.CounterValue, st.VerifyFailures)
	if c.members == nil {
		return
	}
	if ms := c.members(); ms != nil {
		m(mKVMemberHits, prometheus.CounterValue, ms.Hits)
		m(mKVMemberMisses, prometheus.CounterValue, ms.Misses)
		m(mKVMemberCopies, prometheus.CounterValue, ms.Pushed, "ok")
		m(mKVMemberCopies, prometheus.CounterValue, ms.PushFailed, "failed")
		m(mKVMemberCopies, prometheus.CounterValue, ms.PushDropped, "dropped")
		m(mKVMemberWaiting, prometheus.GaugeValue, ms.PushWaiting)
	}
}
