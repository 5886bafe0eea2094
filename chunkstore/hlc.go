package chunkstore

import (
	"fmt"
	"sync"
	"time"
)

// HLC is a hybrid logical clock timestamp: the high 48 bits are wall-clock
// milliseconds since the Unix epoch, the low 16 bits a logical counter. Ordering
// HLCs as integers orders events causally across nodes whose clocks drift.
type HLC uint64

const hlcLogicalBits = 16

// Wall returns the wall-clock part.
func (h HLC) Wall() time.Time { return time.UnixMilli(int64(h >> hlcLogicalBits)) }

// Logical returns the logical counter.
func (h HLC) Logical() uint16 { return uint16(h) }

func (h HLC) String() string {
	return fmt.Sprintf("%s+%d", h.Wall().UTC().Format(time.RFC3339Nano), h.Logical())
}

// Clock issues HLC timestamps. It is safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	last HLC
	now  func() time.Time
}

// NewClock returns a clock reading now (time.Now when nil).
func NewClock(now func() time.Time) *Clock {
	if now == nil {
		now = time.Now
	}
	return &Clock{now: now}
}

// Now returns a timestamp greater than every one issued or observed before.
func (c *Clock) Now() HLC {
	c.mu.Lock()
	defer c.mu.Unlock()
	wall := HLC(c.now().UnixMilli()) << hlcLogicalBits
	if wall > c.last {
		c.last = wall
	} else {
		c.last++
	}
	return c.last
}

// Observe merges a timestamp seen from another node, so that later local
// timestamps order after it.
func (c *Clock) Observe(remote HLC) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if remote > c.last {
		c.last = remote
	}
}
