package node

// The cluster's Prometheus metrics (docs/design/metrics.md): read from the
// member's peers.Node at scrape time; none outside a cluster.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kylix/kylix/peers"
)

var (
	mClMembers      = desc("cluster_members", "Members of the cluster as this one sees them, by state (alive, leaving, left, failed), this one included.", "state")
	mClFetched      = desc("cluster_fetched_chunks_total", "Chunks this member fetched from other members (each checked against its id).")
	mClFetchedBytes = desc("cluster_fetched_bytes_total", "Bytes of the chunks this member fetched from other members.")
	mClBadChunks    = desc("cluster_bad_chunks_total", "Chunks other members sent that failed their check (each asked again elsewhere).")
	mClFetchErrors  = desc("cluster_fetch_errors_total", "Requests to other members that failed (refused, timed out, broken).")
	mClServed       = desc("cluster_served_chunks_total", "Chunks this member sent to other members.")
	mClServedBytes  = desc("cluster_served_bytes_total", "Bytes of the chunks this member sent to other members.")
	mClPulled       = desc("cluster_repair_pulled_bytes_total", "Bytes placement and repair pulled to this member (chunks it owns and lacked).")
	mClPushed       = desc("cluster_pushed_bytes_total", "Bytes this member pushed to their owners on import.")
	mClReceived     = desc("cluster_received_bytes_total", "Bytes other members pushed to this one.")
	mClDropped      = desc("cluster_dropped_bytes_total", "Bytes of copies this member dropped once their owners confirmed them (rebalance).")
	mClStripeReads  = desc("cluster_stripe_rebuilt_chunks_total", "Chunks this member rebuilt from their erasure-coded stripes (their holder did not send them).")
	mClStripes      = desc("cluster_stripes", "Erasure-coded stripes named by the manifests this member holds (the cold tier's; docs/design/erasure.md).")
	mClCacheHits    = desc("cluster_peer_cache_hits_total", "Chunks fetched lately from other members found in the peer cache.")
	mClCacheMisses  = desc("cluster_peer_cache_misses_total", "Peer cache lookups that found nothing.")
	mClCacheBytes   = desc("cluster_peer_cache_bytes", "Bytes in the peer cache.")
	mClCacheNotKept = desc("cluster_peer_cache_not_kept_total", "Chunks loads fetched and the peer cache did not keep: its writers were a full queue behind, or found no room above the disk's floor.")
)

// peersCollector reads the cluster member's figures at each scrape (cl
// returns nil outside a cluster: then nothing is reported).
type peersCollector struct{ cl func() *peers.Node }

func (c *peersCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mClMembers, mClFetched, mClFetchedBytes, mClBadChunks, mClFetchErrors, mClServed, mClServedBytes,
		mClPulled, mClPushed, mClReceived, mClDropped, mClStripeReads, mClStripes, mClCacheHits, mClCacheMisses, mClCacheBytes, mClCacheNotKept} {
		ch <- d
	}
}

func (c *peersCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.cl()
	if p == nil || !p.Running() {
		return
	}
	m := func(d *prometheus.Desc, t prometheus.ValueType, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	states := map[string]int64{"alive": 0, "leaving": 0, "left": 0, "failed": 0}
	var fetched, fetchedBytes, bad, errs, served, servedBytes int64
	for _, mb := range p.Members() {
		states[mb.State]++
		fetched += mb.Fetched
		fetchedBytes += mb.FetchedBytes
		bad += mb.BadChunks
		errs += mb.Errors
		if mb.Self {
			served, servedBytes = mb.Served, mb.ServedBytes
		}
	}
	for s, n := range states {
		m(mClMembers, prometheus.GaugeValue, n, s)
	}
	m(mClFetched, prometheus.CounterValue, fetched)
	m(mClFetchedBytes, prometheus.CounterValue, fetchedBytes)
	m(mClBadChunks, prometheus.CounterValue, bad)
	m(mClFetchErrors, prometheus.CounterValue, errs)
	m(mClServed, prometheus.CounterValue, served)
	m(mClServedBytes, prometheus.CounterValue, servedBytes)
	pl := p.Placement()
	m(mClPulled, prometheus.CounterValue, pl.PulledBytes)
	m(mClPushed, prometheus.CounterValue, pl.PushedBytes)
	m(mClReceived, prometheus.CounterValue, pl.ReceivedBytes)
	m(mClDropped, prometheus.CounterValue, pl.DroppedBytes)
	m(mClStripeReads, prometheus.CounterValue, p.StripeReads())
	m(mClStripes, prometheus.GaugeValue, int64(p.StripesKnown()))
	sw := p.Swarm()
	m(mClCacheHits, prometheus.CounterValue, sw.Cache.Hits)
	m(mClCacheMisses, prometheus.CounterValue, sw.Cache.Misses)
	m(mClCacheBytes, prometheus.GaugeValue, sw.Cache.Bytes)
	m(mClCacheNotKept, prometheus.CounterValue, sw.Cache.NotKept)
}
