package main

// The admin socket: while a node (kylix serve) runs, it holds the store's
// lock, so the other commands cannot open the store themselves. Instead they
// forward their command line to the node, which runs the very same command
// function (run) in-process against its open store and streams the output
// back. One code path serves both cases.
//
// Wire format, over the Unix socket DATA/kylix.sock (mode 0600; the node
// also checks the peer's uid with SO_PEERCRED):
//
//	client -> node: one JSON line: {"args": [...], "cwd": "/abs", "tty": bool}
//	node -> client: frames: 1 byte kind ('o' stdout, 'e' stderr, 'x' exit),
//	                4 bytes big-endian length, payload (exit: 4-byte status).
//
// When the client goes away (Ctrl-C), the node cancels the command.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
)

const socketName = "kylix.sock"

type adminRequest struct {
	Args []string `json:"args"`
	Cwd  string   `json:"cwd"`
	TTY  bool     `json:"tty"`
}

const (
	frameStdout = 'o'
	frameStderr = 'e'
	frameExit   = 'x'
	maxFrame    = 1 << 20
	maxRequest  = 1 << 20
)

// shortSocketPath returns a path for dir/kylix.sock that fits in a
// sockaddr_un (108 bytes) however long dir is, by going through an open
// descriptor of dir; release closes it.
func shortSocketPath(dir string) (path string, release func(), err error) {
	p := filepath.Join(dir, socketName)
	if len(p) < 100 {
		return p, func() {}, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("admin socket %s: %w", p, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, socketName), func() { unix.Close(fd) }, nil
}

// forwardToNode runs the command line in a node serving dataDir, if one
// answers on its socket, and returns the node's exit status.
func forwardToNode(e *env, dataDir string) (int, bool) {
	if e.args == nil {
		return 0, false
	}
	path, release, err := shortSocketPath(dataDir)
	if err != nil {
		return 0, false
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	release()
	if err != nil {
		return 0, false // no node (or a stale socket): open the store here
	}
	defer conn.Close()
	cwd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(e.stderr, "kylix: %v\n", err)
		return 1, true
	}
	req, _ := json.Marshal(adminRequest{Args: e.args, Cwd: cwd, TTY: e.tty})
	// A node that refuses the peer answers and closes without reading the
	// request: a failed write still leaves its answer to read.
	_, werr := conn.Write(append(req, '\n'))
	if e.ctx != nil {
		stop := context.AfterFunc(e.ctx, func() { conn.Close() })
		defer stop()
	}
	r := bufio.NewReader(conn)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if e.ctx != nil && e.ctx.Err() != nil {
				fmt.Fprintf(e.stderr, "kylix: interrupted\n")
				return 130, true
			}
			if werr != nil {
				err = werr
			}
			fmt.Fprintf(e.stderr, "kylix: node at %s went away: %v\n", dataDir, err)
			return 1, true
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxFrame {
			fmt.Fprintf(e.stderr, "kylix: node at %s: bad frame of %d bytes\n", dataDir, n)
			return 1, true
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			fmt.Fprintf(e.stderr, "kylix: node at %s went away: %v\n", dataDir, err)
			return 1, true
		}
		switch hdr[0] {
		case frameStdout:
			e.stdout.Write(payload)
		case frameStderr:
			e.stderr.Write(payload)
		case frameExit:
			if n != 4 {
				return 1, true
			}
			return int(int32(binary.BigEndian.Uint32(payload))), true
		}
	}
}

// lockedByNode reports whether the process holding the store's lock (its
// pid is in DATA/LOCK) is a node (kylix serve), which will answer on its
// socket once it has mounted.
func lockedByNode(dataDir string) bool {
	b, err := os.ReadFile(filepath.Join(dataDir, "LOCK"))
	if err != nil {
		return false
	}
	pid := strings.TrimSpace(string(b))
	cmd, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	if err != nil || pid == "" {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	return len(args) > 1 && commandName(args[1:]) == "serve"
}

// adminServer serves the admin socket of a node.
type adminServer struct {
	s    *chunkstore.Store
	fsys *kfs.FS
	log  *slog.Logger
	ln   *net.UnixListener
	path string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// listenAdmin creates DATA/kylix.sock (replacing one a dead node left: the
// caller holds the store's lock, so no live node owns it).
func listenAdmin(s *chunkstore.Store, fsys *kfs.FS, log *slog.Logger) (*adminServer, error) {
	real := filepath.Join(s.Dir(), socketName)
	os.Remove(real)
	path, release, err := shortSocketPath(s.Dir())
	if err != nil {
		return nil, err
	}
	defer release()
	old := unix.Umask(0o177) // the socket is created 0600
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", real, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(real, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin socket %s: %w", real, err)
	}
	a := &adminServer{s: s, fsys: fsys, log: log, ln: ln, path: real}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.wg.Add(1)
	go a.serve()
	return a, nil
}

// close stops accepting, cancels running commands and waits for them.
func (a *adminServer) close() {
	a.ln.Close()
	os.Remove(a.path)
	a.cancel()
	a.wg.Wait()
}

func (a *adminServer) serve() {
	defer a.wg.Done()
	for {
		conn, err := a.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				a.log.Error("admin socket", "err", err)
			}
			return
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer conn.Close()
			a.handle(conn)
		}()
	}
}

// frameWriter sends one stream as frames; writes of all streams of a
// connection are serialised.
type frameWriter struct {
	mu   *sync.Mutex
	conn net.Conn
	kind byte
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rest := p; len(rest) > 0; {
		n := min(len(rest), maxFrame)
		if err := writeFrame(w.conn, w.kind, rest[:n]); err != nil {
			return len(p) - len(rest), err
		}
		rest = rest[n:]
	}
	return len(p), nil
}

func writeFrame(w io.Writer, kind byte, p []byte) error {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

// peerAllowed checks the peer's credentials: the node's own user or root.
func peerAllowed(conn *net.UnixConn) (int, bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, false
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil || cred == nil {
		return -1, false
	}
	return int(cred.Uid), int(cred.Uid) == os.Geteuid() || cred.Uid == 0
}

func (a *adminServer) handle(conn *net.UnixConn) {
	var mu sync.Mutex
	stdout := &frameWriter{mu: &mu, conn: conn, kind: frameStdout}
	stderr := &frameWriter{mu: &mu, conn: conn, kind: frameStderr}
	exit := func(code int) {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
		mu.Lock()
		writeFrame(conn, frameExit, b[:])
		mu.Unlock()
	}
	if uid, ok := peerAllowed(conn); !ok {
		a.log.Warn("admin socket: refused peer", "uid", uid)
		fmt.Fprintf(stderr, "kylix: permission denied: the node runs as uid %d\n", os.Geteuid())
		exit(1)
		return
	}
	r := bufio.NewReader(io.LimitReader(conn, maxRequest))
	line, err := r.ReadBytes('\n')
	var req adminRequest
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err == nil && (len(req.Args) == 0 || !filepath.IsAbs(req.Cwd)) {
		err = errors.New("empty command line or relative working directory")
	}
	if err == nil && commandName(req.Args) == "serve" {
		err = fmt.Errorf("a node already serves %s", a.s.Dir())
	}
	if err != nil {
		fmt.Fprintf(stderr, "kylix: bad request: %v\n", err)
		exit(2)
		return
	}
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	// The client closing its end (Ctrl-C) cancels the command.
	go func() {
		io.Copy(io.Discard, conn)
		cancel()
	}()
	code := a.runCommand(ctx, req, stdout, stderr)
	exit(code)
}

// runCommand runs one forwarded command line against the node's store. It
// runs on an OS thread of its own whose working directory is the client's
// (unshare(CLONE_FS) + chdir), so relative paths in the command resolve as
// they would have in the client; the thread ends with the command.
func (a *adminServer) runCommand(ctx context.Context, req adminRequest, stdout, stderr io.Writer) int {
	// Files closed in the mount before the command are in the store for it.
	if err := a.fsys.Sync(); err != nil {
		fmt.Fprintf(stderr, "kylix: mount: %v\n", err)
	}
	done := make(chan int, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			fmt.Fprintf(stderr, "kylix: private working directory: %v\n", err)
			done <- 1
			return
		}
		if err := unix.Chdir(req.Cwd); err != nil {
			fmt.Fprintf(stderr, "kylix: working directory %s: %v\n", req.Cwd, err)
			done <- 1
			return
		}
		e := &env{
			stdin:  strings.NewReader(""),
			stdout: stdout,
			stderr: stderr,
			tty:    req.TTY,
			getenv: os.Getenv,
			store:  a.s,
		}
		done <- run(ctx, e, req.Args)
	}()
	code := <-done
	// Show the namespace change (import, rm) in the mount.
	a.fsys.Reconcile()
	return code
}
