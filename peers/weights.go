package peers

import (
	"context"
	"errors"
	"math"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// Holders chosen by measured throughput (docs/design/peers.md, "Fetching").
// Every chunk this node fetches from a member is timed: an exponentially
// weighted moving average of the member's bytes a second over its recent
// chunks, of its answer time, and of its failures. Among the members asked
// for a chunk (its owners first, as before, since only they are known to
// hold it; then the rest), the one expected to deliver soonest is asked
// first: the fewest requests in flight to it per measured byte a second,
// so concurrent fetches spread over the holders in proportion to their
// throughput (Dragonfly weights parents by idle bandwidth in the same
// way). A member not measured yet gets the mean of the measured ones (a
// neutral prior: it gets tried); a member that failed lately sinks, less
// as the failure ages.

const (
	// weightAlpha is the weight of a new sample in the moving averages.
	weightAlpha = 0.25
	// failHalfLife: a failure's weight halves every failHalfLife, so a
	// member that failed once is tried again later.
	failHalfLife = 30 * time.Second
	// failPenalty scales a member's expected time by 1 + failPenalty *
	// its recent failure rate (0 to 1).
	failPenalty = 64
)

// weight is the measured throughput of one member as this node fetched
// from it.
type weight struct {
	inflight atomic.Int64 // chunk requests to the member now

	mu       sync.Mutex
	bps      float64 // moving average of bytes a second; 0: not measured
	latency  float64 // moving average of seconds per answered chunk
	fail     float64 // moving average of failures (1) and answers (0)
	lastFail time.Time
	samples  int64
}

// weightView is a weight at one moment.
type weightView struct {
	bps, latency, fail float64
	lastFail           time.Time
	samples, inflight  int64
}

func (w *weight) view() weightView {
	w.mu.Lock()
	defer w.mu.Unlock()
	return weightView{bps: w.bps, latency: w.latency, fail: w.fail, lastFail: w.lastFail, samples: w.samples, inflight: w.inflight.Load()}
}

func ewma(old, sample float64, first bool) float64 {
	if first {
		return sample
	}
	return old + weightAlpha*(sample-old)
}

// answered records a chunk of n bytes that took d to arrive.
func (w *weight) answered(n int, d time.Duration) {
	sec := max(d.Seconds(), 1e-6)
	w.mu.Lock()
	defer w.mu.Unlock()
	first := w.samples == 0
	w.bps = ewma(w.bps, float64(n)/sec, first)
	w.latency = ewma(w.latency, sec, first)
	w.fail = ewma(w.fail, 0, false)
	w.samples++
}

// failed records a request that failed (connection, error answer, wrong
// bytes, time limit) at now.
func (w *weight) failed(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail = ewma(w.fail, 1, false)
	w.lastFail = now
}

// recentFail is v's failure rate, halved every failHalfLife since its last
// failure.
func (v weightView) recentFail(now time.Time) float64 {
	if v.fail == 0 {
		return 0
	}
	age := max(now.Sub(v.lastFail), 0)
	return v.fail * math.Exp2(-age.Seconds()/failHalfLife.Seconds())
}

// byWeight orders ps (stable: ties keep their order) by the time each is
// expected to take for one more chunk: (requests in flight + 1) / bytes a
// second, times the failure penalty. Unmeasured members count at prior,
// the mean of every member this node measured (weigh), not only of those
// in ps: with one slow member measured among unmeasured ones, the mean of
// ps would be the slow one's and it would tie with the rest. A prior of 0:
// the mean of the measured ones in ps (all unmeasured: equal).
func byWeight(ps []peer, views []weightView, prior float64, now time.Time) []peer {
	if prior <= 0 {
		prior = meanBps(views)
	}
	cost := make([]float64, len(ps))
	for i, v := range views {
		bps := v.bps
		if bps <= 0 {
			bps = prior
		}
		cost[i] = float64(v.inflight+1) / bps * (1 + failPenalty*v.recentFail(now))
	}
	idx := make([]int, len(ps))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return cost[idx[a]] < cost[idx[b]] })
	out := make([]peer, len(ps))
	for i, k := range idx {
		out[i] = ps[k]
	}
	return out
}

// fixedOrder: holders are asked in the fixed order (owners, then the rest,
// by rendezvous), not by weight. Benchmarks only.
var fixedOrder atomic.Bool

// weigh orders ps by measured throughput (byWeight).
func (n *Node) weigh(ps []peer) []peer {
	if len(ps) < 2 || fixedOrder.Load() {
		return ps
	}
	views := make([]weightView, len(ps))
	for i, p := range ps {
		views[i] = n.statsFor(p.name).weight.view()
	}
	n.mu.Lock()
	all := make([]weightView, 0, len(n.stats))
	for _, st := range n.stats {
		all = append(all, st.weight.view())
	}
	n.mu.Unlock()
	return byWeight(ps, views, meanBps(all), time.Now())
}

// meanBps is the mean throughput of the measured views; 1 when none is
// measured (any positive value: all then cost the same).
func meanBps(views []weightView) float64 {
	var sum float64
	measured := 0
	for _, v := range views {
		if v.bps > 0 {
			sum += v.bps
			measured++
		}
	}
	if measured == 0 {
		return 1
	}
	return sum / float64(measured)
}

// pickHolder returns the member to ask next for chunk id among those not
// in tried: of the first group of holders (owners, then the rest) with
// any left, the one byWeight puts first; and counts a request in flight
// to it (askTimed ends it).
// Weighing and counting are one step, so fetches that start together
// spread over the holders instead of all choosing the same one.
func (n *Node) pickHolder(id chunkstore.ID, tried map[string]bool, ownOnly bool) (peer, bool) {
	own, rest := n.holders(id)
	if ownOnly {
		rest = nil
	}
	n.pick.Lock()
	defer n.pick.Unlock()
	for _, group := range [][]peer{own, rest} {
		var left []peer
		for _, p := range group {
			if !tried[p.name] {
				left = append(left, p)
			}
		}
		if len(left) > 0 {
			p := n.weigh(left)[0]
			n.statsFor(p.name).weight.inflight.Add(1)
			return p, true
		}
	}
	return peer{}, false
}

// askTimed is ask (op chunk) to a member pickHolder chose: the request,
// counted in flight by pickHolder, ends here, and its time, bytes or
// failure are measured. A
// member that does not hold the chunk, or a request the caller gave up
// (its context ended), is not measured.
func (n *Node) askTimed(ctx context.Context, p peer, id chunkstore.ID, size uint32, into []byte) ([]byte, error) {
	w := &n.statsFor(p.name).weight
	start := time.Now()
	data, err := n.ask(ctx, p, opChunk, id, size, into)
	d := time.Since(start)
	w.inflight.Add(-1)
	switch {
	case err == nil:
		w.answered(len(data), d)
	case errors.Is(err, errNotHeld), ctx.Err() != nil:
	default:
		w.failed(time.Now())
	}
	return data, err
}

// Throughput is a member's measured fetch throughput as `kylix peers`
// shows it.
type Throughput struct {
	// BytesPerSec is the moving average of bytes a second of the chunks
	// fetched from the member (0: none fetched yet).
	BytesPerSec int64 `json:"bytes_per_sec"`
	// LatencyMs is the moving average of one chunk's time to arrive.
	LatencyMs float64 `json:"latency_ms"`
	// FailRate is the recent failure rate, 0 to 1, halved every 30 s
	// since the last failure (a member that failed sinks in the order).
	FailRate float64 `json:"fail_rate"`
	// Samples counts the chunks measured; InFlight the requests now.
	Samples  int64 `json:"samples"`
	InFlight int64 `json:"in_flight"`
}

func (w *weight) throughput() Throughput {
	v := w.view()
	return Throughput{BytesPerSec: int64(v.bps), LatencyMs: math.Round(v.latency*1e6) / 1e3,
		FailRate: math.Round(v.recentFail(time.Now())*1e3) / 1e3, Samples: v.samples, InFlight: v.inflight}
}

// slowListener is a test hook for a member with little bandwidth or far
// away: what the connections it accepts write leaves at most rate bytes a
// second, all connections together (Config.ServeRate, 0: no limit), and
// delay later (Config.ServeDelay: the writer does not wait for it, as
// with a long link).
type slowListener struct {
	net.Listener
	rate  float64
	delay time.Duration
	mu    sync.Mutex
	next  time.Time // when the bytes written so far have left
}

func (l *slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &slowConn{Conn: c, l: l, q: make(chan delayed, 1024), done: make(chan struct{})}
	if l.delay > 0 {
		go sc.pump()
	}
	return sc, nil
}

type slowConn struct {
	net.Conn
	l     *slowListener
	q     chan delayed
	done  chan struct{}
	close sync.Once
	err   atomic.Pointer[error]
}

type delayed struct {
	at time.Time
	b  []byte
}

func (c *slowConn) Write(p []byte) (int, error) {
	l := c.l
	if l.rate > 0 {
		l.mu.Lock()
		now := time.Now()
		if l.next.Before(now) {
			l.next = now
		}
		l.next = l.next.Add(time.Duration(float64(len(p)) / l.rate * float64(time.Second)))
		until := l.next
		l.mu.Unlock()
		time.Sleep(time.Until(until))
	}
	if l.delay <= 0 {
		return c.Conn.Write(p)
	}
	if e := c.err.Load(); e != nil {
		return 0, *e
	}
	select {
	case c.q <- delayed{time.Now().Add(l.delay), append([]byte(nil), p...)}:
		return len(p), nil
	case <-c.done:
		return 0, net.ErrClosed
	}
}

// pump writes what Write queued, each when its delay has passed, and
// closes the connection when it meets Close's mark (nil bytes).
func (c *slowConn) pump() {
	for {
		select {
		case d := <-c.q:
			time.Sleep(time.Until(d.at))
			if d.b == nil {
				c.shut()
				return
			}
			if _, err := c.Conn.Write(d.b); err != nil {
				c.err.Store(&err)
				c.shut()
				return
			}
		case <-c.done:
			return
		}
	}
}

// Close closes the connection once what was written before has left (a
// delayed connection), else at once.
func (c *slowConn) Close() error {
	if c.l.delay > 0 {
		select {
		case c.q <- delayed{at: time.Now().Add(c.l.delay)}:
			return nil
		case <-c.done:
			return nil
		default: // queue full: close now
		}
	}
	c.shut()
	return nil
}

func (c *slowConn) shut() {
	c.close.Do(func() { close(c.done); c.Conn.Close() })
}
