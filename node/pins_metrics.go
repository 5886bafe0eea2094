package node

// Prometheus metrics of the node's locked memory and whole copies
// (docs/design/metrics.md): pins, hot files (docs/design/pin.md) and the
// whole copies made (docs/design/whole.md), read at scrape time.

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	mPinLocked    = desc("pin_locked_bytes", "Bytes of packs the node holds locked in memory: pins and hot files together.")
	mPinBudget    = desc("pin_budget_bytes", "The node's pin budget (--pin-budget), hot files included.")
	mHotLocked    = desc("hot_locked_bytes", "Bytes locked for hot files: files GPU loads read from the page cache, registered for the next load.")
	mHotFiles     = desc("hot_files", "Hot files held.")
	mHotBudget    = desc("hot_budget_bytes", "The hot-file budget (--hot-budget).")
	mHotMade      = desc("hot_made_total", "Files made hot.")
	mHotSkipped   = desc("hot_skipped_total", "Loaded files not made hot (not in the page cache, no room, or a failed lock).")
	mHotReleased  = desc("hot_released_total", "Hot files released, by reason (budget, pin, memory, idle, replaced: a newer version of the path was made hot, gpu-idle: the node gave its GPU contexts back).", "reason")
	mWholeMade    = desc("whole_copies_made_total", "Whole copies of deduplicated files made, so the mount serves them by passthrough.")
	mWholeNotMade = desc("whole_copies_not_made_total", "Files that were due a whole copy and did not get one (budget, disk, or an error).")
	mWholeDropped = desc("whole_copies_dropped_total", "Whole copies dropped to make room in --whole-budget.")
	mWholeBudget  = desc("whole_budget_bytes", "The whole-copy budget (--whole-budget): bytes whole copies may store a second time.")
)

// pinsCollector reads the pins, hot files and whole copies at each scrape.
// It does not count the whole copies' stored bytes (that reads the chunk
// index: kylix node and kylix du do).
type pinsCollector struct {
	pins  *nodePins
	whole *wholeCopies
}

func (c *pinsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mPinLocked, mPinBudget, mHotLocked, mHotFiles, mHotBudget, mHotMade, mHotSkipped, mHotReleased,
		mWholeMade, mWholeNotMade, mWholeDropped, mWholeBudget} {
		ch <- d
	}
}

func (c *pinsCollector) Collect(ch chan<- prometheus.Metric) {
	m := func(d *prometheus.Desc, t prometheus.ValueType, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	if np := c.pins; np != nil {
		m(mPinLocked, prometheus.GaugeValue, np.host.Locked())
		m(mPinBudget, prometheus.GaugeValue, np.budget)
		if h := np.hotStatus(); h != nil {
			m(mHotLocked, prometheus.GaugeValue, h.LockedBytes)
			m(mHotFiles, prometheus.GaugeValue, int64(len(h.Files)))
			m(mHotBudget, prometheus.GaugeValue, h.BudgetBytes)
			m(mHotMade, prometheus.CounterValue, h.Made)
			m(mHotSkipped, prometheus.CounterValue, h.Skipped)
			for _, r := range []string{"budget", "pin", "memory", "idle", "replaced", "gpu-idle"} {
				m(mHotReleased, prometheus.CounterValue, h.Evicted[r], r)
			}
		}
	}
	if w := c.whole; w != nil {
		m(mWholeMade, prometheus.CounterValue, w.made.Load())
		m(mWholeNotMade, prometheus.CounterValue, w.failed.Load())
		m(mWholeDropped, prometheus.CounterValue, w.drops.Load())
		m(mWholeBudget, prometheus.GaugeValue, w.budget)
	}
}
