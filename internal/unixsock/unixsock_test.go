package unixsock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// echo serves ln: each connection gets its first line back.
func echo(t *testing.T, ln Acceptor) chan error {
	done := make(chan error, 1)
	go func() {
		done <- Serve(ln, func(c *net.UnixConn) {
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte(line))
			}()
		}, nil)
	}()
	return done
}

func roundTrip(t *testing.T, network, path string) {
	t.Helper()
	c, err := Dial(network, path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "hello\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

func TestListenServeClose(t *testing.T) {
	for _, tc := range []struct {
		network string
		mode    os.FileMode
	}{{"unix", 0o600}, {"unixpacket", 0o666}} {
		t.Run(tc.network, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "kylix.sock")
			ln, err := Listen(tc.network, path, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != tc.mode {
				t.Fatalf("socket %s: %v, %v; want a socket of mode %o", path, fi.Mode(), err, tc.mode)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Fatalf("the directory holds %d entries, want the socket alone (the temporary directory is removed)", len(ents))
			}
			done := echo(t, ln)
			roundTrip(t, tc.network, path)
			if ln.Path() != path {
				t.Fatalf("Path %q, want %q", ln.Path(), path)
			}
			if err := ln.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("Serve after Close: %v, want nil", err)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the socket is still there after Close: %v", err)
			}
		})
	}
}

// TestLongPath: a directory whose path is longer than a sockaddr_un holds.
func TestLongPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 150 {
		dir = filepath.Join(dir, strings.Repeat("d", 40))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kylix.sock")
	if _, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
		t.Fatal("binding the long path itself worked: the test does not test the workaround")
	}
	ln, err := Listen("unix", path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	done := echo(t, ln)
	roundTrip(t, "unix", path)
	ln.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	short, release, err := ShortPath(dir, "kylix.sock")
	if err != nil || !strings.HasPrefix(short, "/proc/self/fd/") || len(short) >= maxPath {
		t.Fatalf("ShortPath: %q, %v", short, err)
	}
	release()
}

func TestStaleLiveAndNotASocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s")
	// Stale: a socket file no one listens on.
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen("unix", path, 0o600)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	done := echo(t, ln)
	roundTrip(t, "unix", path)
	// Live: refused, and the live one keeps working.
	if _, err := Listen("unix", path, 0o600); !errors.Is(err, ErrInUse) {
		t.Fatalf("over a live socket: %v, want ErrInUse", err)
	}
	roundTrip(t, "unix", path)
	ln.Close()
	<-done
	// Not a socket: refused and left alone.
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix", path, 0o600); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "x" {
		t.Fatal("the regular file was touched")
	}
}

// TestCloseLeavesAReplacement: Close does not remove a socket that took
// over its path.
func TestCloseLeavesAReplacement(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	a, err := Listen("unix", path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	a.UnixListener.Close() // dead now, file left: the next Listen replaces it
	b, err := Listen("unix", path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("closing the old listener removed the new socket: %v", err)
	}
}

// fakeAcceptor fails with errs in turn, then gives conns, then is closed.
type fakeAcceptor struct {
	mu    sync.Mutex
	errs  []error
	conns []*net.UnixConn
}

func (f *fakeAcceptor) AcceptUnix() (*net.UnixConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	if len(f.conns) > 0 {
		c := f.conns[0]
		f.conns = f.conns[1:]
		return c, nil
	}
	return nil, &net.OpError{Op: "accept", Net: "unix", Err: net.ErrClosed}
}

func acceptErr(e syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", e)}
}

// TestServeBacksOff: EMFILE and ENFILE are waited out with a doubling
// back-off (5 ms to 1 s, reset by a connection) and the loop goes on
// accepting; another error ends it.
func TestServeBacksOff(t *testing.T) {
	var errs []error
	for range 10 {
		errs = append(errs, acceptErr(syscall.EMFILE))
	}
	errs = append(errs, acceptErr(syscall.ENFILE))
	c1, c2 := pipeConn(t)
	f := &fakeAcceptor{errs: errs, conns: []*net.UnixConn{c1, c2}}
	var slept []time.Duration
	var got int
	err := serve(f.AcceptUnix, func(*net.UnixConn) { got++ }, nil, func(d time.Duration) { slept = append(slept, d) })
	if err != nil {
		t.Fatalf("serve: %v, want nil once closed", err)
	}
	if got != 2 {
		t.Fatalf("handled %d connections after the errors, want 2", got)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000}
	if len(slept) != len(want) {
		t.Fatalf("slept %v", slept)
	}
	for i := range want {
		if slept[i] != want[i]*time.Millisecond {
			t.Fatalf("slept %v, want %v ms", slept, want)
		}
	}
	// The back-off starts again after a connection.
	c3, _ := pipeConn(t)
	f = &fakeAcceptor{errs: []error{acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE)}, conns: []*net.UnixConn{c3}}
	slept = nil
	serve(f.AcceptUnix, func(*net.UnixConn) {}, nil, func(d time.Duration) { slept = append(slept, d) })
	f = &fakeAcceptor{errs: []error{acceptErr(syscall.EMFILE)}}
	serve(f.AcceptUnix, func(*net.UnixConn) {}, nil, func(d time.Duration) { slept = append(slept, d) })
	if len(slept) != 3 || slept[2] != 5*time.Millisecond {
		t.Fatalf("slept %v: want 5ms, 10ms, then 5ms again", slept)
	}
	// A permanent error ends Serve with it.
	f = &fakeAcceptor{errs: []error{acceptErr(syscall.EINVAL)}}
	if err := serve(f.AcceptUnix, func(*net.UnixConn) {}, nil, func(time.Duration) { t.Fatal("slept on EINVAL") }); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("serve: %v, want EINVAL", err)
	}
}

func pipeConn(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
	}
	return cs[0], cs[1]
}

// TestServeOutlivesEMFILE runs a server in a child process whose
// descriptor limit lets it hold only a few connections: accepts then fail
// with EMFILE; once the child closes the connections it holds, the same
// Serve accepts the ones that waited in the backlog.
func TestServeOutlivesEMFILE(t *testing.T) {
	if os.Getenv("UNIXSOCK_CHILD") != "" {
		emfileChild()
		return
	}
	path := filepath.Join(t.TempDir(), "s")
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeOutlivesEMFILE$")
	cmd.Env = append(os.Environ(), "UNIXSOCK_CHILD="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	expect := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), prefix) {
				return lines.Text()
			}
		}
		t.Fatalf("the child ended before saying %q: %v", prefix, lines.Err())
		return ""
	}
	expect("listening")
	const clients = 12
	var conns []net.Conn
	for range clients {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	expect("accept failed") // out of descriptors, with connections waiting
	io.WriteString(stdin, "release\n")
	expect(fmt.Sprintf("accepted %d", clients))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

// emfileChild is the server of TestServeOutlivesEMFILE.
func emfileChild() {
	path := os.Getenv("UNIXSOCK_CHILD")
	ln, err := Listen("unix", path, 0o600)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	// A limit that leaves 4 descriptor numbers free below it: room for a
	// few connections only (descriptors are numbered lowest free first).
	ents, _ := os.ReadDir("/proc/self/fd")
	open := map[int]bool{}
	for _, e := range ents {
		var n int
		fmt.Sscan(e.Name(), &n)
		open[n] = true
	}
	top, free := 0, 0
	for ; free < 4; top++ {
		if !open[top] {
			free++
		}
	}
	lim := unix.Rlimit{Cur: uint64(top), Max: uint64(top)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Println("setrlimit:", err)
		os.Exit(1)
	}
	var mu sync.Mutex
	var held []*net.UnixConn
	accepted := 0
	var once sync.Once
	release := make(chan struct{})
	failed := func(err error) {
		once.Do(func() { fmt.Println("accept failed:", err) })
	}
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(release)
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		held = nil
		mu.Unlock()
	}()
	fmt.Println("listening")
	done := make(chan struct{})
	go func() {
		serve(ln.AcceptUnix, func(c *net.UnixConn) {
			mu.Lock()
			defer mu.Unlock()
			accepted++
			select {
			case <-release:
				c.Close()
			default:
				held = append(held, c)
			}
			if accepted == 12 {
				fmt.Println("accepted", accepted)
				close(done)
			}
		}, nil, func(d time.Duration) {
			failed(errors.New("EMFILE"))
			time.Sleep(d)
		})
	}()
	<-done
	ln.Close()
	os.Exit(0)
}
