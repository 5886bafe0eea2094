package test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Floods through the real interfaces (issue 18, item 4; docs/design/
// client.md and peers.md, "Limits"): no one who can connect may cost the
// node its descriptors or its accept loops.

// lowerNoFile lowers pid's RLIMIT_NOFILE to what it holds open now plus
// spare, restored at the end of the test: a few thousand connections then
// do what 20 000 do at the default limit.
func lowerNoFile(t *testing.T, pid, spare int) int {
	t.Helper()
	open, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := len(open) + spare
	lim := unix.Rlimit{Cur: uint64(n), Max: uint64(n)}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	t.Cleanup(func() { unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil) })
	return n
}

// nodeAnswers runs kylix node on data within 5 s.
func nodeAnswers(data string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kylixBin, "node", "--data", data).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kylix node: %w: %s", err, out)
	}
	return nil
}

type clientCounts struct {
	Accepted     int64 `json:"accepted"`
	RefusedConns int64 `json:"refused_connections"`
}

// clientCountsOf is kylix node's client counts, within 5 s.
func clientCountsOf(t *testing.T, data string) clientCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, kylixBin, "node", "--data", data, "--json").Output()
	if err != nil {
		t.Fatalf("kylix node: %v", err)
	}
	var out struct {
		Clients clientCounts `json:"clients"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.Clients
}

// TestNetFloodAttacker is the attacker of TestClientSocketFloodByOtherUser,
// run as another uid in a child process (it skips otherwise): it opens
// KYLIX_TEST_FLOOD_N connections to the client socket, says how many, and
// when told counts those the node has not closed.
func TestNetFloodAttacker(t *testing.T) {
	sock := os.Getenv("KYLIX_TEST_FLOOD_SOCKET")
	if sock == "" {
		t.Skip("the attacker of TestClientSocketFloodByOtherUser")
	}
	n, _ := strconv.Atoi(os.Getenv("KYLIX_TEST_FLOOD_N"))
	var fds []int
	for range n {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			break
		}
		if unix.Connect(fd, &unix.SockaddrUnix{Name: sock}) != nil {
			unix.Close(fd)
			continue
		}
		fds = append(fds, fd)
	}
	fmt.Printf("opened %d\n", len(fds))
	in := bufio.NewScanner(os.Stdin)
	in.Scan()
	live := 0
	for _, fd := range fds {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		if n, _ := unix.Poll(p, 0); n == 0 {
			live++ // nothing to read and no hang-up: the node holds it
		}
	}
	fmt.Printf("live %d\n", live)
	in.Scan() // until the parent closes stdin
}

// TestClientSocketFloodByOtherUser: uid 65534 opens 2000 connections to the
// client socket of a node whose RLIMIT_NOFILE leaves it 200 descriptors.
// Root can still write a file in the mount and kylix node answers, during
// the flood; the attacker keeps at most its uid's cap, the rest are closed
// at once and counted. Before, the attacker's connections took every
// descriptor: root's write failed with EMFILE and kylix node hung.
func TestClientSocketFloodByOtherUser(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"f": randomBytes(1<<20, 7)})
	// The socket and the test binary where uid 65534 may reach them
	// (t.TempDir's parent is 0700).
	binDir, err := os.MkdirTemp("", "kylix-attacker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	os.Chmod(binDir, 0o755)
	sock := filepath.Join(binDir, "client.sock")
	n := launchNode(t, data, mnt, nil, func() bool { return clientAnswers(sock) }, "--client-socket", sock)
	limit := lowerNoFile(t, n.cmd.Process.Pid, 200)
	attacker := selfForOtherUser(t, binDir)
	const flood = 2000
	cmd := exec.Command(attacker, "-test.run=^TestNetFloodAttacker$", "-test.v")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "KYLIX_TEST_FLOOD_SOCKET="+sock, "KYLIX_TEST_FLOOD_N="+strconv.Itoa(flood), "KYLIX_BIN="+kylixBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	readInt := func(prefix string) int {
		t.Helper()
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatalf("the attacker said no %q", prefix)
		return 0
	}
	opened := readInt("opened ")
	if opened < flood/2 {
		t.Fatalf("the attacker opened %d connections", opened)
	}
	base := clientCountsOf(t, data)
	t.Logf("uid 65534 opened %d connections; the node's limit is %d descriptors; %+v", opened, limit, base)

	// During the flood: root writes a file in the mount and reads it
	// back; the admin socket answers.
	want := randomBytes(256<<10, 9)
	p := filepath.Join(mnt, "root-wrote")
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatalf("root's write in the mount during the flood: %v\n%s", err, n.log)
	}
	if got, err := os.ReadFile(p); err != nil || sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatalf("root's file read back during the flood: %v", err)
	}
	if err := nodeAnswers(data); err != nil {
		t.Fatalf("during the flood: %v", err)
	}

	// Every attacker connection seen by the node: admitted or refused.
	var cc clientCounts
	waitFor(t, 20*time.Second, "the node to have seen every attacker connection", func() bool {
		cc = clientCountsOf(t, data)
		return cc.Accepted+cc.RefusedConns >= int64(opened)
	})
	fmt.Fprintln(stdin)
	live := readInt("live ")
	t.Logf("attacker: %d of %d connections held by the node; node: %+v", live, opened, cc)
	if live == 0 || live > 256 || live > limit/4 {
		t.Errorf("the node holds %d of uid 65534's connections (cap: 256, at most a sixteenth of %d)", live, limit)
	}
	if cc.RefusedConns < int64(opened-live) {
		t.Errorf("%d connections refused, want at least %d", cc.RefusedConns, opened-live)
	}
	if err := nodeAnswers(data); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
}

// freeTCPAddr is ip:port with the port free now.
func freeTCPAddr(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// tcpFlood opens n TCP connections to addr from the address from (no
// handshake, nothing sent), 16 at a time, each dial within a second, and
// returns those made; they are closed at the end of the test.
func tcpFlood(t *testing.T, from, addr string, n int) []net.Conn {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Second}
			for next.Add(1) <= int64(n) {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return conns
}

// establishedTo counts the established TCP connections whose local port
// is port (/proc/net/tcp: the data plane's side of them).
func establishedTo(port int) int {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] != "01" {
			continue
		}
		if i := strings.LastIndexByte(f[1], ':'); i >= 0 {
			if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
				n++
			}
		}
	}
	return n
}

// TestDataPlaneFloodWithoutKey: 3000 bare TCP connections, with no key,
// to a member's data plane port, its RLIMIT_NOFILE leaving it 300
// descriptors. A member that joins afterwards reads a file imported on the
// flooded one through its mount, and kylix peers answers on both. The
// member's idle connections are closed at the idle deadline (2 s here,
// KYLIX_TEST_PEER_IDLE) and a later read dials again. Before, the flood
// ended the data plane's accept loop (EMFILE) and held its descriptors:
// nothing could connect again.
func TestDataPlaneFloodWithoutKey(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	dl := freeTCPAddr(t, "127.0.0.2")
	_, ps, _ := net.SplitHostPort(dl)
	port, _ := strconv.Atoi(ps)
	env := []string{"KYLIX_TEST_PEER_IDLE=2s"}
	a := startMemberArgs(t, "127.0.0.2", key, env, []string{"--data-listen", dl})
	lowerNoFile(t, a.cmd.Process.Pid, 300)

	conns := tcpFlood(t, "127.0.0.66", dl, 3000)
	t.Logf("%d bare connections made to %s", len(conns), dl)
	if len(conns) < 1000 {
		t.Fatalf("only %d flood connections made", len(conns))
	}

	b := startMember(t, "127.0.0.3", key, nil, a.addr)
	waitFor(t, membershipWait, "two alive members seen by B", func() bool { return aliveCount(t, b) == 2 })
	read := func(name string, size int) {
		t.Helper()
		src, sum := randomFile(t, size)
		mustKylix(t, "/", "import", "--data", a.data, src, name)
		onB := filepath.Join(b.mnt, name)
		waitFor(t, nsWait, name+" in B's mount", visible(onB))
		if got := shaOn(t, b, onB); got != sum {
			t.Fatalf("%s read through B's mount differs from the source", name)
		}
	}
	read("during-flood.bin", 8<<20+3)
	for _, m := range []*member{a, b} {
		if out := mustKylix(t, "/", "peers", "--data", m.data); !strings.Contains(out, "127.0.0.2") || !strings.Contains(out, "127.0.0.3") {
			t.Errorf("kylix peers on %s:\n%s", m.addr, out)
		}
	}
	if strings.Contains(a.log.String(), "no longer accepting") {
		t.Errorf("an accept loop ended:\n%s", a.log)
	}

	// B's connections, idle, are closed by A within its idle deadline;
	// the flood's, within the handshake deadline (10 s: not awaited).
	for _, c := range conns {
		c.Close()
	}
	start := time.Now()
	waitFor(t, 10*time.Second, "A to close B's idle data plane connections", func() bool { return establishedTo(port) == 0 })
	t.Logf("idle connections closed %v after the flood's", time.Since(start).Round(time.Millisecond))
	read("after-idle.bin", 2<<20+5)
}

// TestIdleConnectionsClosed: a connection to the data plane that never
// starts the handshake is closed at the handshake deadline (1 s here,
// KYLIX_TEST_PEER_HANDSHAKE), and an idle keep-alive of the metrics server
// within its idle timeout (5 s). Before, both were held for minutes.
func TestIdleConnectionsClosed(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	dl := freeTCPAddr(t, "127.0.0.4")
	ma := freeTCPAddr(t, "127.0.0.4")
	a := startMemberArgs(t, "127.0.0.4", key, []string{"KYLIX_TEST_PEER_HANDSHAKE=1s"}, []string{"--data-listen", dl, "--metrics", ma})

	var wg sync.WaitGroup
	check := func(what string, c net.Conn, within time.Duration) {
		defer wg.Done()
		defer c.Close()
		start := time.Now()
		c.SetReadDeadline(start.Add(within + 3*time.Second))
		_, err := io.Copy(io.Discard, c)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: still open after %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		t.Logf("%s: closed by the node after %v", what, time.Since(start).Round(time.Millisecond))
	}
	// The data plane listens once the membership starts, after the mount
	// that launching waits for.
	var bare net.Conn
	waitFor(t, 20*time.Second, "the data plane to listen", func() bool {
		c, err := net.Dial("tcp", dl)
		bare = c
		return err == nil
	})
	wg.Add(1)
	go check("a data plane connection without a handshake", bare, time.Second)

	hc, err := net.Dial("tcp", ma)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(hc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", ma); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(hc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("metrics: %s, close %v", resp.Status, resp.Close)
	}
	wg.Add(1)
	go check("an idle metrics keep-alive", hc, 5*time.Second)
	wg.Wait()
	_ = a
}
