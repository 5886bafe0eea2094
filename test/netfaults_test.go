package test

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/testneeds"
)

// Network faults on one member's link of a netns cluster (netns_test.go,
// docs/design/peers.md "Tests"): random loss by nftables in the member's
// namespace, a bandwidth limit by tc tbf on both ends of its veth, and
// delay by tc netem where the kernel has it (nowhere else: a missing netem
// is logged, never imitated).

// linkFaults are what is done to one member's link.
type linkFaults struct {
	lossPercent int    // packets dropped at random, each direction
	rate        string // tbf rate each direction (tc's units: "100mbit"); "" none
	delay       string // netem delay on the member's egress ("20ms"); "" none
	burst       string // tbf burst; "" 64kb (too small past about 1gbit: give rate/250)
}

// nftTable is the nftables table holding the loss rules.
const nftTable = "kylixfault"

// setFaults makes f the faults of member i's link, replacing earlier ones:
// on its eth0 in its namespace (its egress) and its port on the switch
// (its ingress). Everything goes with the namespaces at the end of the
// test.
func (c *netnsCluster) setFaults(i int, f linkFaults) {
	t := c.t
	t.Helper()
	ns, port := c.nodes[i], fmt.Sprintf("p%d", i)
	tc := testneeds.Command(t, "tc", "iproute2")
	// nft only for loss; a table of earlier faults goes wherever nft is.
	if nft, err := exec.LookPath("nft"); err == nil {
		exec.Command(c.ip, "netns", "exec", ns, nft, "delete", "table", "inet", nftTable).Run() // none yet: fine
	}
	// One segment per packet on both ends of the veth under loss: else TCP
	// hands the veth 64 KiB packets (GSO) that cross it whole, and one drop
	// would lose some 44 wire packets at once. 65535 is veth's default.
	segs := "65535"
	if f.lossPercent > 0 {
		segs = "1"
	}
	c.run("-n", ns, "link", "set", "eth0", "gso_max_segs", segs)
	c.run("-n", c.sw, "link", "set", port, "gso_max_segs", segs)
	if f.lossPercent > 0 {
		nft := testneeds.Command(t, "nft", "nftables")
		// numgen random mod 100 is uniform over 0..99: < N drops N%. The
		// first counter of each chain counts every packet, the second the
		// dropped.
		rules := fmt.Sprintf(`table inet %[1]s {
  chain input { type filter hook input priority 0; policy accept; iifname "eth0" counter numgen random mod 100 < %[2]d counter drop; }
  chain output { type filter hook output priority 0; policy accept; oifname "eth0" counter numgen random mod 100 < %[2]d counter drop; }
}
`, nftTable, f.lossPercent)
		cmd := exec.Command(c.ip, "netns", "exec", ns, nft, "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft in %s: %v\n%s\n%s", ns, err, out, rules)
		}
	}
	// Queueing: none left from before, then tbf (rate) or netem (delay,
	// and rate with it) on eth0, tbf on the switch port.
	exec.Command(tc, "-n", ns, "qdisc", "del", "dev", "eth0", "root").Run() // none yet: fine
	exec.Command(tc, "-n", c.sw, "qdisc", "del", "dev", port, "root").Run()
	tbf := []string{"tbf", "rate", f.rate, "burst", cmp.Or(f.burst, "64kb"), "latency", "100ms"}
	egressDone := false
	if f.delay != "" {
		netem := []string{"-n", ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f.delay}
		if f.rate != "" {
			netem = append(netem, "rate", f.rate)
		}
		out, err := exec.Command(tc, netem...).CombinedOutput()
		switch {
		case err != nil && strings.Contains(string(out), "qdisc kind is unknown"):
			t.Logf("no delay added: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): tc: %s", strings.TrimSpace(string(out)))
		case err != nil:
			t.Fatalf("tc %s: %v\n%s", strings.Join(netem, " "), err, out)
		default:
			egressDone = true // netem delays, and limits with rate
		}
	}
	if f.rate != "" {
		if !egressDone {
			c.tc(tc, append([]string{"-n", ns, "qdisc", "add", "dev", "eth0", "root"}, tbf...)...)
		}
		c.tc(tc, append([]string{"-n", c.sw, "qdisc", "add", "dev", port, "root"}, tbf...)...)
	}
}

func (c *netnsCluster) tc(tc string, args ...string) {
	c.t.Helper()
	if out, err := exec.Command(tc, args...).CombinedOutput(); err != nil {
		c.t.Fatalf("tc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// lossCount is what a loss rule saw: packets in all, and dropped.
type lossCount struct{ all, dropped int64 }

func (l lossCount) String() string {
	return fmt.Sprintf("%d of %d packets (%.1f%%)", l.dropped, l.all, 100*float64(l.dropped)/float64(max(l.all, 1)))
}

// lossCounts returns what the loss rules of member i saw, coming in and
// going out.
func (c *netnsCluster) lossCounts(i int) (in, out lossCount) {
	t := c.t
	t.Helper()
	nft := testneeds.Command(t, "nft", "nftables")
	count := func(chain string) lossCount {
		b, err := exec.Command(c.ip, "netns", "exec", c.nodes[i], nft, "list", "chain", "inet", nftTable, chain).CombinedOutput()
		require.NoError(t, err, "%s", b)
		m := regexp.MustCompile(`counter packets (\d+)`).FindAllSubmatch(b, -1)
		require.Len(t, m, 2, "want two counters in %s", b)
		all, _ := strconv.ParseInt(string(m[0][1]), 10, 64)
		dropped, _ := strconv.ParseInt(string(m[1][1]), 10, 64)
		return lossCount{all, dropped}
	}
	return count("input"), count("output")
}

// timedRead reads p through m's mount (in a child process, within d) and
// returns how long it took, failing unless the bytes' SHA-256 is want.
func timedRead(t *testing.T, m *member, p string, want [32]byte, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	b, stderr, err, timedOut := catWithin(t, p, d)
	took := time.Since(start)
	if timedOut {
		t.Fatalf("reading %s took more than %v\nnode log:\n%s", p, d, m.log)
	}
	require.NoError(t, err, "reading %s: %s\nnode log:\n%s", p, stderr, m.log)
	require.Equal(t, want, sha256.Sum256(b), "bytes read through the mount differ from the source")
	return took
}

// TestNetnsLossyLink: three members in network namespaces. The reader n2
// joins, through a link dropping 5% of packets each way, after five files
// were imported on n0 (n0 and n1 hold them), with placement pulls
// throttled to nothing (--repair-rate 1), so that its reads fetch the
// chunks from the others. A 1 MiB file is read first (the data plane's
// connections come up); then one 32 MiB file over a clean link, one with
// n2's link limited to 100 Mbit/s each way (tbf), one with 5% of packets
// dropped each way (nftables) and 5 ms of delay where the kernel has
// netem, and one with all of these. Each reads byte-equal within its
// deadline; the read times are logged. Under the faults gossip still
// converges (files imported on n1 and on n2 reach the others) and every
// member still sees all three alive; the loss rules dropped about 5% of
// the packets each way.
func TestNetnsLossyLink(t *testing.T) {
	c := newNetnsCluster(t, 3)
	testneeds.Command(t, "nft", "nftables") // before anything starts
	testneeds.Command(t, "tc", "iproute2")
	key := clusterKey(t)
	n0 := c.start(0, key, nil)
	n1 := c.start(1, key, nil, 0)
	waitFor(t, membershipWait, "n0 and n1 alive", func() bool { return aliveCount(t, n1) == 2 })
	const size = 32<<20 + 99
	names := []string{"warm.bin", "clean.bin", "limited.bin", "lossy.bin", "both.bin"}
	sums := map[string][32]byte{}
	for _, name := range names {
		n := size
		if name == "warm.bin" {
			n = 1 << 20
		}
		src, sum := randomFile(t, n)
		mustKylix(t, "/", "import", "--data", n0.data, src, name)
		sums[name] = sum
	}

	// n2 joins through a lossy link: the join and the gossip that spreads
	// it cross the loss.
	c.setFaults(2, linkFaults{lossPercent: 5})
	n2 := c.start(2, key, []string{"--repair-rate", "1"}, 0)
	ms := []*member{n0, n1, n2}
	for i, m := range ms {
		waitFor(t, membershipWait, fmt.Sprintf("n%d to see three alive (n2 joined under 5%% loss)", i), func() bool { return aliveCount(t, m) == 3 })
	}
	joinIn, joinOut := c.lossCounts(2)
	t.Logf("n2's loss rules dropped, while it joined: %v coming in, %v going out", joinIn, joinOut)
	// The join crossed the rules; whether one of its few dozen packets
	// was dropped is chance (none, at 5% of 46: 9%, which failed CI
	// runs): the rate is checked below, over thousands of packets.
	require.Positive(t, joinIn.all, "no packet of the join came in through the loss rules")
	require.Positive(t, joinOut.all, "no packet of the join went out through the loss rules")
	c.setFaults(2, linkFaults{})
	for _, name := range names {
		waitFor(t, 30*time.Second, name+" in n2's mount", visible(filepath.Join(n2.mnt, name)))
	}
	fetched := func() int64 { ps := peersOf(t, n2); return ps["n0"].Fetched + ps["n1"].Fetched }
	read := func(name string, d time.Duration) time.Duration {
		t.Helper()
		before := fetched()
		took := timedRead(t, n2, filepath.Join(n2.mnt, name), sums[name], d)
		require.Greater(t, fetched(), before, "n2 fetched nothing for %s: the read did not cross the link", name)
		return took
	}

	// The data plane's connections are up before the clean read. Not
	// required to fetch: rebalance's pacer lets its first pull go at once
	// (internal/pace), and that pull may be this 1 MiB file's chunk (a CI
	// run: "n2 fetched nothing for warm.bin").
	timedRead(t, n2, filepath.Join(n2.mnt, "warm.bin"), sums["warm.bin"], time.Minute)
	tClean := read("clean.bin", time.Minute)
	limit := linkFaults{rate: "100mbit"}
	c.setFaults(2, limit)
	tLimited := read("limited.bin", 2*time.Minute)
	loss := linkFaults{lossPercent: 5, delay: "5ms"}
	c.setFaults(2, loss)
	tLossy := read("lossy.bin", 3*time.Minute)
	lossIn, lossOut := c.lossCounts(2)
	both := linkFaults{lossPercent: loss.lossPercent, rate: limit.rate, delay: loss.delay}
	c.setFaults(2, both)
	tBoth := read("both.bin", 3*time.Minute)
	t.Logf("read of %.0f MiB through n2's mount, fetched from n0 and n1 (one run each): %v on a clean link, %v with tbf %s each way, %v with %d%% loss each way, %v with both",
		float64(size)/(1<<20), tClean.Round(time.Millisecond), tLimited.Round(time.Millisecond), limit.rate,
		tLossy.Round(time.Millisecond), loss.lossPercent, tBoth.Round(time.Millisecond))

	// Gossip and the namespace still converge through the lossy link, both
	// ways.
	write := func(m *member, name string, b []byte) {
		p := filepath.Join(t.TempDir(), "w")
		require.NoError(t, os.WriteFile(p, b, 0o644))
		mustKylix(t, "/", "import", "--data", m.data, p, name)
	}
	write(n1, "from-n1.txt", []byte("written on n1\n"))
	write(n2, "from-n2.txt", []byte("written on n2\n"))
	waitFor(t, 60*time.Second, "from-n1.txt on n2", fileIs(filepath.Join(n2.mnt, "from-n1.txt"), []byte("written on n1\n")))
	waitFor(t, 60*time.Second, "from-n2.txt on n0", fileIs(filepath.Join(n0.mnt, "from-n2.txt"), []byte("written on n2\n")))
	for i, m := range ms {
		waitFor(t, membershipWait, fmt.Sprintf("n%d to see three alive under loss", i), func() bool { return aliveCount(t, m) == 3 })
	}
	// The rules dropped about 5% each way (binomial: with thousands of
	// packets, 2.5% to 7.5% is far outside chance), in both runs with loss.
	in, out := c.lossCounts(2)
	t.Logf("n2's loss rules dropped, reading lossy.bin: %v coming in, %v going out; reading both.bin: %v coming in, %v going out", lossIn, lossOut, in, out)
	for _, l := range []lossCount{lossIn, lossOut, in, out} {
		require.Greater(t, l.all, int64(2000), "too few packets crossed n2's link: %v", l)
		require.InDelta(t, 0.05, float64(l.dropped)/float64(l.all), 0.025, "loss rule: %v", l)
	}
}
