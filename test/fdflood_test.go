package test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
)

// TestAcceptLoopsSurviveFdFlood: a flood of connections that runs the node
// out of file descriptors (its RLIMIT_NOFILE lowered, so a few hundred
// connections do what 21 000 did at the default limit: issue 18, item 4)
// must not end the client and admin sockets' accept loops for good. Once
// the flood's connections close, kylix node (admin socket) and a STAT on
// the client socket answer again, and the node's log says it backed off.
// Before, both loops returned at the first EMFILE and every later command
// hung in the listen backlog.
func TestAcceptLoopsSurviveFdFlood(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"f": randomBytes(1<<20, 7)})
	n, sock := startClientNode(t, data, mnt)
	pid := n.cmd.Process.Pid

	open, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := unix.Rlimit{Cur: uint64(len(open) + 24), Max: uint64(len(open) + 24)}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	t.Cleanup(func() { unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil) })

	// The flood: more connections to each socket than the node has
	// descriptors left. They are accepted until EMFILE; the rest wait in
	// the backlog.
	var flood []net.Conn
	for range 150 {
		if c, err := net.Dial("unixpacket", sock); err == nil {
			flood = append(flood, c)
		}
		if c, err := net.Dial("unix", filepath.Join(data, "kylix.sock")); err == nil {
			flood = append(flood, c)
		}
	}
	if len(flood) < 100 {
		t.Fatalf("only %d flood connections made", len(flood))
	}
	// The node has run out: its log says so (polled, not slept on).
	waitFor(t, 10*time.Second, "the node to back off on EMFILE", func() bool {
		return strings.Contains(n.log.String(), "accepting a connection failed; trying again")
	})
	for _, c := range flood {
		c.Close()
	}
	// Raise the limit back, as an operator would, so that what the node
	// holds open is no obstacle; the loops must accept again by themselves.
	unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil)

	waitFor(t, 20*time.Second, "kylix node to answer after the flood", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, kylixBin, "node", "--data", data).Run() == nil
	})
	f := openRO(t, filepath.Join(mnt, "m/f"))
	c := dialClient(t, sock)
	r := c.req(clientproto.OpStat, nil, int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("STAT after the flood: %d %s", r.status, r.msg)
	}
}
