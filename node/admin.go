package node

// The admin socket's server (protocol: adminproto.go). It listens before
// the node opens its store, so that a command which finds the store locked
// and no node answering knows that another command, not a node, holds it;
// requests that arrive while the node starts wait until it serves.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/internal/unixsock"
)

// adminServer serves the admin socket of a node.
type adminServer struct {
	n    *Node
	ln   *unixsock.Listener
	path string

	readyCh   chan struct{} // closed once the node serves
	readyOnce sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// listenAdmin creates DATA/kylix.sock. A socket a live node answers on is
// an error (that node serves the data directory); one a dead node left is
// replaced.
func listenAdmin(n *Node, dir string) (*adminServer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("serve: data directory: %w", err)
	}
	real := filepath.Join(dir, SocketName)
	ln, err := unixsock.Listen("unix", real, 0o600)
	if errors.Is(err, unixsock.ErrInUse) {
		return nil, fmt.Errorf("serve: a node already serves %s (its admin socket %s answers)", dir, real)
	}
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	a := &adminServer{n: n, ln: ln, path: real, readyCh: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.wg.Add(1)
	go a.serve()
	return a, nil
}

// ready lets requests run (the node serves).
func (a *adminServer) ready() { a.readyOnce.Do(func() { close(a.readyCh) }) }

// close stops accepting, cancels running requests and waits for them.
func (a *adminServer) close() {
	a.closeOnce.Do(func() {
		a.ln.Close() // removes the socket
		a.cancel()
		a.wg.Wait()
	})
}

func (a *adminServer) serve() {
	defer a.wg.Done()
	// Accept errors for want of descriptors back off and retry: a
	// connection flood must not end the loop for good.
	err := unixsock.Serve(a.ln, func(conn *net.UnixConn) {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer conn.Close()
			a.handle(conn)
		}()
	}, a.n.log)
	if err != nil {
		a.n.log.Error("admin socket: no longer accepting", "err", err)
	}
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

// conn is one admin connection's writer: frames of all kinds serialised.
type adminConn struct {
	mu   sync.Mutex
	conn net.Conn
}

func (c *adminConn) frame(kind byte, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		n := min(len(p), maxFrame)
		if err := writeFrame(c.conn, kind, p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

func (c *adminConn) reply(body any, err error) {
	var rep Reply
	if err != nil {
		rep.Error = err.Error()
	} else if body != nil {
		b, merr := json.Marshal(body)
		if merr != nil {
			rep.Error = merr.Error()
		}
		rep.Body = b
	}
	b, _ := json.Marshal(rep)
	c.frame(frameReply, b)
}

func (c *adminConn) event(ev Event) {
	b, _ := json.Marshal(ev)
	c.frame(frameEvent, b)
}

// progress is a Progress that sends events.
func (c *adminConn) progress() Progress {
	return func(label string, done, total int64) { c.event(Event{Label: label, Done: done, Total: total}) }
}

// streamWriter sends one output stream of an exec'd command as frames.
type streamWriter struct {
	c    *adminConn
	kind byte
}

func (w streamWriter) Write(p []byte) (int, error) {
	if err := w.c.frame(w.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (a *adminServer) handle(conn *net.UnixConn) {
	c := &adminConn{conn: conn}
	if uid, ok := peerAllowed(conn); !ok {
		a.n.log.Warn("admin socket: refused peer", "uid", uid)
		c.reply(nil, fmt.Errorf("permission denied: the node runs as uid %d", os.Geteuid()))
		return
	}
	r := bufio.NewReader(io.LimitReader(conn, maxRequest))
	line, err := r.ReadBytes('\n')
	var req Request
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err == nil && req.V != AdminVersion {
		err = fmt.Errorf("this node speaks admin protocol version %d, the command sent version %d: use the kylix that started the node (kylix node --data DIR names it)", AdminVersion, req.V)
	}
	if err != nil {
		c.reply(nil, fmt.Errorf("bad request: %w", err))
		return
	}
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	// The client closing its end (Ctrl-C) cancels the request.
	go func() {
		io.Copy(io.Discard, conn)
		cancel()
	}()
	// A node that is starting answers once it serves.
	select {
	case <-a.readyCh:
	case <-ctx.Done():
		c.reply(nil, errors.New("the node is stopping"))
		return
	}
	if req.Op == OpExec {
		var er ExecRequest
		if err := json.Unmarshal(req.Body, &er); err != nil || len(er.Args) == 0 || !filepath.IsAbs(er.Cwd) {
			c.reply(nil, errors.New("bad request: an exec needs a command line and an absolute working directory"))
			return
		}
		code := a.exec(ctx, er, streamWriter{c, frameStdout}, streamWriter{c, frameStderr})
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
		c.frame(frameExit, b[:])
		return
	}
	body, err := a.n.dispatch(ctx, req, c)
	c.reply(body, err)
}

// decode unmarshals a request body (an empty body is the zero request).
func decode(body json.RawMessage, v any) error {
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("bad request: %w", err)
	}
	return nil
}

// dispatch runs one typed op.
func (n *Node) dispatch(ctx context.Context, req Request, c *adminConn) (any, error) {
	switch req.Op {
	case OpNode:
		var r NodeRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Status(r.GC), nil
	case OpPeers:
		return n.PeersStatus()
	case OpPin:
		var r PathRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Pin(ctx, r.Path, c.progress())
	case OpUnpin:
		var r PathRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Unpin(r.Path)
	case OpWarm:
		var r PathRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Warm(ctx, r.Path, c.progress())
	case OpEvict:
		var r EvictRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Evict(ctx, r)
	case OpMetrics:
		text, err := n.MetricsText()
		return MetricsReply{Text: text}, err
	case OpImport:
		var r ImportRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Import(ctx, r, c.progress())
	case OpTier:
		var r TierRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.Tier(ctx, r, c.progress())
	case OpTierShards:
		var r TierShardsRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.TierShards(r)
	case OpKVStats:
		return n.KVStats(), nil
	case OpKVClear:
		var r KVClearRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return n.KVClear(r)
	case OpLoad:
		var r LoadRequest
		if err := decode(req.Body, &r); err != nil {
			return nil, err
		}
		return nil, n.Load(ctx, r, func(p LoadPass) {
			b, _ := json.Marshal(p)
			c.event(Event{Data: b})
		})
	}
	return nil, fmt.Errorf("unknown request %q: this node (admin protocol %d) does not know it", req.Op, AdminVersion)
}

// exec runs one command line in the node (Config.Exec). It runs on an OS
// thread of its own whose working directory is the client's
// (unshare(CLONE_FS) + chdir), so relative paths in the command resolve as
// they would have in the client; the thread ends with the command.
func (a *adminServer) exec(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) int {
	if a.n.cfg.Exec == nil {
		fmt.Fprintf(stderr, "kylix: this node runs no store commands\n")
		return 1
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
		done <- a.n.cfg.Exec(ctx, a.n, req, stdout, stderr)
	}()
	return <-done
}
