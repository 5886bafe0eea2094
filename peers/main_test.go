package peers

import (
	"os"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
)

// TestMain shortens the wait of a graceful leave for this package's
// tests, and gossips more often: each test starts and stops several
// members, and serf's 1 s leave propagation delay with the broadcasts of
// a 200 ms gossip interval cost about 2 s a member (TestServesFromMemory:
// 5.8 s, 1.1 s with these). What the members do is unchanged; only serf's
// timers are shorter.
func TestMain(m *testing.M) {
	testGossip = func(c *serf.Config) {
		c.LeavePropagateDelay = 10 * time.Millisecond
		c.MemberlistConfig.GossipInterval = 50 * time.Millisecond
	}
	os.Exit(m.Run())
}
