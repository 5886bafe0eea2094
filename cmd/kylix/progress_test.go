package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestProgressNoETAUntilRateKnown: the bar shows no rate and no ETA while
// the rate is mostly start-up time (under a second and 5% of the bytes),
// then an ETA from the rate so far. Before, the first frame of a
// half-second import said ETA 21m.
func TestProgressNoETAUntilRateKnown(t *testing.T) {
	var errw strings.Builder
	e := &env{stderr: &errw, tty: true}
	p := newProgress(e, "import")
	start := p.start
	at := start
	p.now = func() time.Time { return at }
	frame := func(d time.Duration, done, total int64) string {
		errw.Reset()
		at = start.Add(d)
		p.last = time.Time{} // not rate-limited
		p.update(done, total)
		return errw.String()
	}
	const total = 1 << 30
	f := frame(300*time.Millisecond, 256<<10, total) // 0.02% in 0.3 s: start-up time
	assert.Contains(t, f, "256.0 KiB/1.0 GiB")
	assert.NotContains(t, f, "ETA")
	assert.NotContains(t, f, "/s")
	f = frame(400*time.Millisecond, total/10, total) // 10% in 0.4 s
	assert.Contains(t, f, " 256.0 MiB/s ETA 4s")
	f = frame(2*time.Second, 1<<20, total) // slow, but a second has passed
	assert.Contains(t, f, "512.0 KiB/s ETA 34m")
	f = frame(3*time.Second, total, total)
	assert.NotContains(t, f, "ETA")

	assert.False(t, rateKnown(0, 0, time.Hour))
	assert.True(t, rateKnown(1, 0, time.Second))
	assert.False(t, rateKnown(1, 0, time.Second-1))
}
