package kvstore

import (
	"sync/atomic"
	"time"
)

// LatencyBuckets are the upper bounds, in seconds, of the get-latency
// histograms (a Prometheus histogram's buckets; +Inf is implied).
var LatencyBuckets = [...]float64{10e-6, 50e-6, 100e-6, 500e-6, 1e-3, 5e-3, 10e-3, 50e-3, 100e-3, 1}

// latency is a histogram of durations, safe for concurrent use.
type latency struct {
	counts [len(LatencyBuckets) + 1]atomic.Int64 // one per bucket, the last for +Inf
	nanos  atomic.Int64
}

func (l *latency) since(start time.Time) {
	d := time.Since(start)
	l.nanos.Add(int64(d))
	sec := d.Seconds()
	i := 0
	for i < len(LatencyBuckets) && sec > LatencyBuckets[i] {
		i++
	}
	l.counts[i].Add(1)
}

// Latency is a histogram's state: Counts[i] durations in bucket i (not
// cumulative; the last is above every bound), and their sum.
type Latency struct {
	Counts  []int64 `json:"counts"`
	Seconds float64 `json:"seconds"`
}

func (l *latency) snapshot() Latency {
	out := Latency{Counts: make([]int64, len(l.counts)), Seconds: time.Duration(l.nanos.Load()).Seconds()}
	for i := range l.counts {
		out.Counts[i] = l.counts[i].Load()
	}
	return out
}
