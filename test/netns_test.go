package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/testneeds"
)

// Clusters of real `kylix serve` processes, each in its own network
// namespace, joined by veth pairs to a bridge in a namespace acting as the
// switch (docs/design/peers.md). A partition moves some members' switch
// ports to a second bridge; healing moves them back. The processes keep
// the test's mount namespace (nsenter --net), so their FUSE mounts and
// admin sockets are the test's.

var netnsSeq atomic.Int32

// netnsCluster is the switch namespace and the members' namespaces.
type netnsCluster struct {
	t      *testing.T
	ip     string // path of ip(8)
	nsent  string // path of nsenter(1)
	prefix string // unique per cluster: names of namespaces
	sw     string // the switch namespace
	nodes  []string
}

func (c *netnsCluster) run(args ...string) {
	c.t.Helper()
	out, err := exec.Command(c.ip, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetnsCluster makes the switch namespace with bridges br0 and br1 and n
// member namespaces, member i on 10.77.0.(i+1)/24 with its port p<i> on
// br0. Everything is removed at the end of the test, failed or not (after
// the members' processes stop: cleanups run last-registered first).
func newNetnsCluster(t *testing.T, n int) *netnsCluster {
	requireFUSE(t)
	c := &netnsCluster{t: t, ip: testneeds.Command(t, "ip", "iproute2"), nsent: testneeds.Command(t, "nsenter", "util-linux")}
	removeStaleNetns(c.ip)
	c.prefix = fmt.Sprintf("kx%d-%d", os.Getpid(), netnsSeq.Add(1))
	c.sw = c.prefix + "-sw"
	t.Cleanup(func() {
		for _, ns := range append(c.nodes, c.sw) {
			// Deleting a namespace removes its interfaces, veth peers too.
			if out, err := exec.Command(c.ip, "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v %s", ns, err, out)
			}
		}
	})
	c.run("netns", "add", c.sw)
	for _, br := range []string{"br0", "br1"} {
		c.run("-n", c.sw, "link", "add", br, "type", "bridge")
		c.run("-n", c.sw, "link", "set", br, "up")
	}
	for i := range n {
		ns := fmt.Sprintf("%s-n%d", c.prefix, i)
		c.run("netns", "add", ns)
		c.nodes = append(c.nodes, ns)
		port := fmt.Sprintf("p%d", i)
		c.run("-n", c.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		c.run("-n", c.sw, "link", "set", port, "master", "br0", "up")
		c.run("-n", ns, "addr", "add", c.addr(i)+"/24", "dev", "eth0")
		c.run("-n", ns, "link", "set", "eth0", "up")
		c.run("-n", ns, "link", "set", "lo", "up")
	}
	return c
}

// removeStaleNetns deletes the namespaces of earlier test processes that
// were killed before their cleanups ran (names kx<PID>-..., PID gone).
func removeStaleNetns(ip string) {
	out, _ := exec.Command(ip, "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		var pid, seq int
		if _, err := fmt.Sscanf(name, "kx%d-%d", &pid, &seq); err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			exec.Command(ip, "netns", "del", name).Run()
		}
	}
}

func (c *netnsCluster) addr(i int) string { return fmt.Sprintf("10.77.0.%d", i+1) }

// setBridge moves member i's switch port to bridge br (br1: cut off from
// the members on br0).
func (c *netnsCluster) setBridge(i int, br string) {
	c.t.Helper()
	c.run("-n", c.sw, "link", "set", fmt.Sprintf("p%d", i), "master", br)
}

// start runs `kylix serve` in member i's namespace, gossip on port 7946,
// joining the members given by index.
func (c *netnsCluster) start(i int, key string, extra []string, join ...int) *member {
	c.t.Helper()
	data, mnt := dirs(c.t)
	return c.startAt(i, data, mnt, key, extra, join...)
}

// startAt is start on the given data directory and mount point (a member
// restarted on its store).
func (c *netnsCluster) startAt(i int, data, mnt, key string, extra []string, join ...int) *member {
	t := c.t
	t.Helper()
	addr := c.addr(i) + ":7946"
	args := []string{"--net=/var/run/netns/" + c.nodes[i], kylixBin, "serve", "--data", data, "--mount", mnt,
		"--listen", addr, "--cluster-key", key, "--node-name", fmt.Sprintf("n%d", i), "--log-gossip", "--leave-delay", "10ms"}
	var js []string
	for _, j := range join {
		js = append(js, c.addr(j)+":7946")
	}
	if len(js) > 0 {
		args = append(args, "--join", strings.Join(js, ","))
	}
	args = append(args, extra...)
	n := &node{t: t, data: data, mnt: mnt, log: &lockedBuffer{}}
	n.cmd = exec.Command(c.nsent, args...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	require.NoError(t, n.cmd.Start())
	t.Cleanup(func() {
		if n.cmd.ProcessState == nil {
			n.stop()
		}
		n.clearLeftovers() // a failed stop, a kill9: the mount and client socket
	})
	deadline := time.Now().Add(30 * time.Second)
	for !isMounted(mnt) || !answers(filepath.Join(data, "kylix.sock")) {
		if n.cmd.ProcessState != nil || time.Now().After(deadline) {
			n.cmd.Process.Kill()
			t.Fatalf("member n%d did not come up: %s", i, n.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &member{node: n, addr: addr}
}

// aliveNames lists the members m sees alive.
func aliveNames(t *testing.T, m *member) []string {
	var names []string
	for name, p := range peersOf(t, m) {
		if p.State == "alive" {
			names = append(names, name)
		}
	}
	return names
}

func fileIs(p string, want []byte) func() bool {
	return func() bool { b, err := os.ReadFile(p); return err == nil && bytes.Equal(b, want) }
}

// conflictOf returns the content of the one NAME.conflict-* beside p, or
// nil when there is none.
func conflictOf(p string) []byte {
	ms, _ := filepath.Glob(p + ".conflict-*")
	if len(ms) != 1 {
		return nil
	}
	b, _ := os.ReadFile(ms[0])
	return b
}

// TestNetnsPartitionHealed: four members in four network namespaces on one
// bridge. A file imported on n0 reads byte-equal through n3's mount. Then
// n2 and n3 are cut off (their ports on another bridge): each side sees
// only its own two members; each side imports a file of its own, and both
// import one path, n0's side first. Healed (ports back): every member
// shows both files, and the path both wrote holds the newer write (n2's)
// with n0's kept beside it as NAME.conflict-HLC, on both sides.
func TestNetnsPartitionHealed(t *testing.T) {
	c := newNetnsCluster(t, 4)
	key := clusterKey(t)
	ms := []*member{c.start(0, key, nil)}
	for i := 1; i < 4; i++ {
		ms = append(ms, c.start(i, key, nil, 0))
	}
	for _, m := range ms {
		waitFor(t, membershipWait, "four alive members", func() bool { return aliveCount(t, m) == 4 })
	}

	// Large enough that n3 owns only some of its chunks (R = 2 of 4: a
	// file of 3 chunks had all its chunks owned by n3 one time in 8, and
	// n3 then fetched nothing).
	src, sum := randomFile(t, 48<<20+77)
	mustKylix(t, "/", "import", "--data", ms[0].data, src, "models/m.bin")
	on3 := filepath.Join(ms[3].mnt, "models", "m.bin")
	waitFor(t, 30*time.Second, "models/m.bin in n3's mount", visible(on3))
	require.Equal(t, sum, shaOn(t, ms[3], on3), "bytes read through n3's mount differ from the source")
	require.Positive(t, peersOf(t, ms[3])["n0"].Fetched+peersOf(t, ms[3])["n1"].Fetched+peersOf(t, ms[3])["n2"].Fetched,
		"n3 fetched nothing")

	// Partition: {n0, n1} | {n2, n3}.
	c.setBridge(2, "br1")
	c.setBridge(3, "br1")
	for i, m := range ms {
		side := []string{"n0", "n1"}
		if i >= 2 {
			side = []string{"n2", "n3"}
		}
		waitFor(t, 60*time.Second, fmt.Sprintf("n%d to see only %v alive", i, side), func() bool {
			return strings.Join(sortStrings(aliveNames(t, m)), ",") == strings.Join(side, ",")
		})
	}
	left, right, older, newer := []byte("left side\n"), []byte("right side\n"), []byte("older write\n"), []byte("newer write, longer\n")
	write := func(m *member, name string, b []byte) {
		p := filepath.Join(t.TempDir(), "w")
		require.NoError(t, os.WriteFile(p, b, 0o644))
		mustKylix(t, "/", "import", "--data", m.data, p, name)
	}
	write(ms[0], "left.txt", left)
	write(ms[0], "both.txt", older)
	// n2's write of both.txt is the newer: its HLC is read after n0's
	// import returned (one clock on this machine).
	write(ms[2], "right.txt", right)
	write(ms[2], "both.txt", newer)
	// Within a side, the side's files spread; across, nothing does.
	waitFor(t, 30*time.Second, "left.txt on n1", fileIs(filepath.Join(ms[1].mnt, "left.txt"), left))
	waitFor(t, 30*time.Second, "right.txt on n3", fileIs(filepath.Join(ms[3].mnt, "right.txt"), right))
	_, err := os.Stat(filepath.Join(ms[3].mnt, "left.txt"))
	require.True(t, os.IsNotExist(err), "left.txt crossed the partition: %v", err)

	// Heal.
	c.setBridge(2, "br0")
	c.setBridge(3, "br0")
	for i, m := range ms {
		// serf retries failed members every 30 s: the heal takes up to that.
		waitFor(t, 120*time.Second, fmt.Sprintf("n%d: all files merged", i), func() bool {
			return fileIs(filepath.Join(m.mnt, "left.txt"), left)() && fileIs(filepath.Join(m.mnt, "right.txt"), right)() &&
				fileIs(filepath.Join(m.mnt, "both.txt"), newer)() && bytes.Equal(conflictOf(filepath.Join(m.mnt, "both.txt")), older)
		})
	}
	require.Equal(t, sum, shaOn(t, ms[2], filepath.Join(ms[2].mnt, "models", "m.bin")))
}

func sortStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// TestNetnsPlaintext: two members in their own network namespaces on the
// plaintext data plane (`--data-plane plaintext`): a file imported on n0
// reads byte-equal through n1's mount, its chunks carried by the data
// plane.
func TestNetnsPlaintext(t *testing.T) {
	c := newNetnsCluster(t, 2)
	key := clusterKey(t)
	pt := []string{"--data-plane", "plaintext"}
	a := c.start(0, key, pt)
	b := c.start(1, key, pt, 0)
	waitFor(t, membershipWait, "two alive members", func() bool { return aliveCount(t, b) == 2 })
	src, sum := randomFile(t, 8<<20+5)
	mustKylix(t, "/", "import", "--data", a.data, src, "p.bin")
	onB := filepath.Join(b.mnt, "p.bin")
	waitFor(t, 30*time.Second, "p.bin in n1's mount", visible(onB))
	require.Equal(t, sum, shaOn(t, b, onB))
	// The chunks crossed the plaintext data plane: pushed by n0's import
	// (n1 owns every chunk with R = 2), else fetched by the read.
	var out struct {
		Placement struct {
			Received int64 `json:"received_chunks"`
		} `json:"placement"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", b.data, "--json")), &out))
	require.Positive(t, out.Placement.Received+peersOf(t, b)["n0"].Fetched, "no chunk reached n1 over the data plane")
}

// TestServeDataPlaneFlag: an unknown --data-plane is refused before the
// node starts, naming the two that exist.
func TestServeDataPlaneFlag(t *testing.T) {
	data, mnt := dirs(t)
	_, errs, code := kylix(t, "/", "serve", "--data", data, "--mount", mnt, "--listen", "127.0.0.1:0",
		"--cluster-key", clusterKey(t), "--data-plane", "udp")
	require.NotZero(t, code)
	require.Contains(t, errs, `--data-plane "udp": use tls or plaintext`)
	require.False(t, isMounted(mnt))
}
