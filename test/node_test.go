package test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/internal/testneeds"
)

var kylixBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if b := os.Getenv("KYLIX_BIN"); b != "" {
		// Absolute: tests run it from other directories.
		abs, err := filepath.Abs(b)
		if err != nil {
			fmt.Fprintln(os.Stderr, "KYLIX_BIN:", err)
			return 1
		}
		kylixBin = abs
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kylix-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755) // other users run it too (TestAdminSocketRefusesOtherUsers)
	kylixBin = filepath.Join(dir, "kylix")
	cmd := exec.Command("go", "build", "-o", kylixBin, "github.com/kylix/kylix/cmd/kylix")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kylix:", err)
		return 1
	}
	return m.Run()
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: kylix serve mounts with FUSE (DirectMount, passthrough); CI runs this as root")
	}
	testneeds.FUSE(t)
}

// node is a running kylix serve.
type node struct {
	t    *testing.T
	data string
	mnt  string
	cmd  *exec.Cmd
	log  *lockedBuffer
}

// lockedBuffer is a node's output: written by exec's copying goroutine
// while the test reads it, so every access takes the lock.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startNode(t *testing.T, data, mnt string) *node {
	t.Helper()
	return launchNode(t, data, mnt, nil, nil)
}

// launchNode starts `kylix serve` on data at mnt with the extra arguments
// and environment, and waits until the mount and the admin socket answer
// (and ready, when given). The node is stopped at the end of the test.
func launchNode(t *testing.T, data, mnt string, env []string, ready func() bool, extra ...string) *node {
	t.Helper()
	return launchServe(t, data, mnt, env, ready, append([]string{"--data", data, "--mount", mnt}, extra...)...)
}

// launchServe runs `kylix serve` with exactly args (data and mnt are where
// the node is expected to keep its data and mount, from args or from a
// config file) and waits as launchNode does.
func launchServe(t *testing.T, data, mnt string, env []string, ready func() bool, args ...string) *node {
	t.Helper()
	n := &node{t: t, data: data, mnt: mnt, log: &lockedBuffer{}}
	n.cmd = exec.Command(kylixBin, append([]string{"serve"}, args...)...)
	if env != nil {
		n.cmd.Env = append(os.Environ(), env...)
	}
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n.cmd.ProcessState == nil {
			n.stop()
		}
		n.clearLeftovers()
	})
	deadline := time.Now().Add(20 * time.Second)
	// The mount must answer, not only be listed: a node killed with
	// kill -9 leaves its mount behind (ENOTCONN), and the new node's
	// admin socket listens before it replaces that mount.
	for !mountAnswers(mnt) || !answers(filepath.Join(data, "kylix.sock")) || (ready != nil && !ready()) {
		if time.Now().After(deadline) {
			n.cmd.Process.Kill()
			t.Fatalf("node did not come up: %s", n.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// stop sends SIGTERM and waits for a clean exit.
func (n *node) stop() {
	n.t.Helper()
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- n.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			n.t.Errorf("node exited with %v: %s", err, n.log)
		}
	case <-time.After(20 * time.Second):
		n.cmd.Process.Kill()
		n.t.Fatalf("node did not stop: %s", n.log)
	}
	if isMounted(n.mnt) {
		n.t.Errorf("%s still mounted after the node stopped", n.mnt)
	}
	if sock := n.clientSocket(); sock != "" {
		if _, err := os.Lstat(sock); err == nil {
			n.t.Errorf("client socket %s left after the node stopped on SIGTERM", sock)
		}
	}
}

// clientSocketLine is where a node's start-up message names its client
// socket.
var clientSocketLine = regexp.MustCompile(`(?m)^\s*client socket: (/\S+)$`)

// clientSocket is the client socket the node said it listens on ("" if
// none, or if it did not get that far).
func (n *node) clientSocket() string {
	if m := clientSocketLine.FindStringSubmatch(n.log.String()); m != nil {
		return m[1]
	}
	return ""
}

// clearLeftovers removes what a node that did not stop cleanly (kill9, a
// crash) leaves behind once it has exited: its mount, stale (ENOTCONN:
// only /proc/self/mountinfo still shows it; mountpoint -q does not), is
// detached, and its client socket (in /run/kylix as root) removed. A node
// stopped by SIGTERM must leave neither (stop checks).
func (n *node) clearLeftovers() {
	clearStaleMount(n.t, n.mnt)
	if sock := n.clientSocket(); sock != "" {
		if err := os.Remove(sock); err == nil {
			n.t.Logf("removed %s, left by the node (exit: %v)", sock, n.cmd.ProcessState)
		}
	}
}

// clearStaleMount detaches what is mounted at dir (a node killed with
// SIGKILL leaves its mount there, answering ENOTCONN), if anything is.
func clearStaleMount(t *testing.T, dir string) {
	t.Helper()
	if !isMounted(dir) {
		return
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		t.Errorf("detaching the mount left at %s: %v", dir, err)
		return
	}
	t.Logf("detached the mount left at %s", dir)
}

// kill9 kills the node with SIGKILL, leaving its mount stale.
func (n *node) kill9() {
	n.cmd.Process.Kill()
	n.cmd.Wait()
}

// kylix runs a kylix command (forwarded to the node when one runs).
func kylix(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(kylixBin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func mustKylix(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, errs, code := kylix(t, dir, args...)
	if code != 0 {
		t.Fatalf("kylix %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// answers reports whether a node listens on the socket (a killed node
// leaves the file behind).
func answers(sock string) bool {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// mountAnswers reports whether a live FUSE file system is mounted at dir
// (statfs answers with FUSE's magic; a dead node's mount fails with
// ENOTCONN, and an empty mount point answers with its parent's type).
func mountAnswers(dir string) bool {
	var st unix.Statfs_t
	return isMounted(dir) && unix.Statfs(dir, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
}

func isMounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

// dirs returns a data directory and a mount point for a test.
func dirs(t *testing.T) (data, mnt string) {
	base := t.TempDir()
	return filepath.Join(base, "data"), filepath.Join(base, "mnt")
}

// waitFor polls cond until it holds, failing the test with what it waited
// for when it does not within d. Tests use it instead of sleeping a fixed
// time for something to have happened.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// selfForOtherUser copies this test binary into dir (made 0755) so that a
// process of another uid (65534) can run it, and returns its path: the
// attacker in the tests that need a second local user.
func selfForOtherUser(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "as-other-user.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
