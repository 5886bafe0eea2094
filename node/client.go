package node

// The client socket (docs/design/client.md, protocol in package
// clientproto): any local process may connect; every request carries one fd
// the caller opened on a file of the mount, and that fd is the only
// credential. The node answers STAT, hands out read-only fds of verified
// whole-file packs (PACKS) and fills the caller's GPU memory (FILL).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/internal/connlimit"
	"github.com/kylix/kylix/internal/unixsock"
	"github.com/kylix/kylix/node/kvstore"
)

// maxClientConnsPerUID caps the client socket's connections of one
// unprivileged uid (docs/design/client.md, "Limits"): a loader holds one
// per process (libkylix, kylix.torch), a tensor-parallel job one per rank,
// so 256 is far above use. Lowered to a sixteenth of RLIMIT_NOFILE where
// that is smaller; unprivileged uids together hold at most a quarter of
// it, and root and the node's own uid another quarter of their own, so
// one user's flood neither reaches root's clients nor takes the
// descriptors the mount and the admin socket need. A connection over a
// cap is closed at once and counted (ClientStats.RefusedConns).
const maxClientConnsPerUID = 256

// clientCaps are the caps for unprivileged uids (per uid, all together);
// privilegedCaps those of root and the node's uid, together.
func clientCaps() (perUID, total int) {
	n := connlimit.NoFile()
	return connlimit.PerPeer(n, maxClientConnsPerUID), connlimit.Share(n)
}

func privilegedCaps() (perUID, total int) {
	s := connlimit.Share(connlimit.NoFile())
	return s, s
}

// DefaultClientSocket is where a node serving mount listens by default:
// under /run/kylix as root, else the user's runtime directory
// ($XDG_RUNTIME_DIR/kylix, or /tmp/kylix-UID), named after the mount path
// with '/' turned into '_'. getenv reads the environment.
func DefaultClientSocket(mount string, getenv func(string) string) string {
	dir := "/run/kylix"
	if os.Geteuid() != 0 {
		if d := getenv("XDG_RUNTIME_DIR"); d != "" {
			dir = filepath.Join(d, "kylix")
		} else {
			dir = fmt.Sprintf("/tmp/kylix-%d", os.Geteuid())
		}
	}
	name := strings.ReplaceAll(mount, "/", "_") + ".sock"
	// sockaddr_un holds 108 bytes; a deep mount path gets a hashed name.
	if len(dir)+1+len(name) > 100 {
		h := sha256.Sum256([]byte(mount))
		name = "m-" + hex.EncodeToString(h[:12]) + ".sock"
	}
	return filepath.Join(dir, name)
}

// ClientStats are what `kylix node` reports about clients.
type ClientStats struct {
	Socket    string `json:"socket"`
	Connected int64  `json:"connected"`
	Accepted  int64  `json:"accepted"`
	Requests  int64  `json:"requests"`
	Refused   int64  `json:"refused"`
	// RefusedConns: connections closed at once, over a cap
	// (maxClientConnsPerUID).
	RefusedConns int64     `json:"refused_connections"`
	PackFds      int64     `json:"pack_fds"`
	Fills        int64     `json:"fills"`
	FillBytes    int64     `json:"fill_bytes"`
	GPU          []GPUHeld `json:"gpu,omitempty"`
	// ByProcess is the fills of the latest client processes (at most
	// maxFillProcs), oldest first: the ranks of a tensor-parallel job
	// each show the bytes they were given and the bytes read for them.
	ByProcess []ProcFills `json:"by_process,omitempty"`
}

type clientServer struct {
	path string
	ln   *unixsock.Listener
	s    *chunkstore.Store
	fsys *kfs.FS
	log  *slog.Logger
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	fill *fillService
	// kvMapped: the IPC mappings of KV requests, shared by the
	// connections that keep them (kv_ipc.go); nil without fill.
	kvMapped *kvMapped
	kv       *kvstore.Store // nil: KV requests refused (kv.go)
	kvm      *kvMembers     // nil: not in a cluster (kv_members.go)
	mu       sync.Mutex
	conns    map[*net.UnixConn]struct{}
	// users caps unprivileged uids' connections, privileged root's and
	// the node's uid's (maxClientConnsPerUID).
	users, privileged *connlimit.Limiter
	refusedLog        connlimit.Every

	closeOnce sync.Once

	connected, accepted, requests, refused, packFds, fills, fillBytes atomic.Int64
	refusedConns                                                      atomic.Int64
	packFdBytes                                                       atomic.Int64
	fillPaths                                                         labeledCounts // GPU fills by I/O path (metrics.go)
	fillFailures                                                      labeledCounts // failed GPU fills by the chunk failure met (metrics.go)
	procs                                                             fillProcs
	layouts                                                           layoutIndexes // rank layouts of files filled (fill.go)
}

// listenClient makes the client socket at path: its directory is made
// 0755 (and must not be writable by others, who could swap the socket), a
// stale socket of a killed node is replaced, and a live one is an error.
func listenClient(path, dataDir string, log *slog.Logger) (*clientServer, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if rd, err1 := resolvePath(dir); err1 == nil {
		if rdata, err2 := resolvePath(dataDir); err2 == nil && Within(rd, rdata) {
			return nil, fmt.Errorf("serve: client socket %s is inside the data directory %s, which only the node's user may enter: choose another --client-socket", path, dataDir)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("serve: client socket directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("serve: client socket directory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("serve: client socket directory %s must be a directory of uid %d that others cannot write (it is mode %o, uid %d): another user could replace the socket", dir, os.Geteuid(), st.Mode&0o7777, st.Uid)
	}
	if st.Mode&0o755 != 0o755 {
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, fmt.Errorf("serve: client socket directory: %w", err)
		}
	}
	stale := false
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		stale = true // or live: Listen tells
	}
	// Any local user may connect: the fd each request carries is the
	// credential, checked per request.
	ln, err := unixsock.Listen("unixpacket", path, 0o666)
	switch {
	case errors.Is(err, unixsock.ErrInUse):
		return nil, fmt.Errorf("serve: another node listens on the client socket %s", path)
	case err != nil:
		return nil, fmt.Errorf("serve: client socket: %w (remove it or choose another --client-socket)", err)
	case stale:
		log.Warn("replacing a stale client socket left by a node that did not stop cleanly", "socket", path)
	}
	ctx, stop := context.WithCancel(context.Background())
	return &clientServer{path: path, ln: ln, log: log, ctx: ctx, stop: stop, conns: map[*net.UnixConn]struct{}{},
		users: connlimit.New(clientCaps), privileged: connlimit.New(privilegedCaps), refusedLog: connlimit.Every{Period: 10 * time.Second}}, nil
}

// serve starts answering on the socket (connections made before wait in
// the listen backlog).
func (c *clientServer) serve(s *chunkstore.Store, fsys *kfs.FS, fill *fillService) {
	c.s, c.fsys, c.fill = s, fsys, fill
	if fill != nil {
		c.kvMapped = newKVMapped(fill)
	}
	c.wg.Add(1)
	go c.acceptLoop()
}

// acceptLoop accepts until close. Accept errors for want of descriptors
// back off and retry: a connection flood must not end it for good. A
// connection over its uid's cap is closed at once.
func (c *clientServer) acceptLoop() {
	defer c.wg.Done()
	err := unixsock.Serve(c.ln, func(conn *net.UnixConn) {
		p := peerOf(conn)
		release, ok := c.admit(p)
		if !ok {
			c.refusedConns.Add(1)
			if c.refusedLog.Allow() {
				perUID, total := clientCaps()
				c.log.Warn("client socket: too many connections; closing new ones at once", "client_uid", p.uid, "client_pid", p.pid,
					"per_uid", perUID, "total", total, "refused_since_start", c.refusedConns.Load())
			}
			conn.Close()
			return
		}
		c.mu.Lock()
		if c.conns == nil { // closing
			c.mu.Unlock()
			conn.Close()
			release()
			return
		}
		c.conns[conn] = struct{}{}
		c.mu.Unlock()
		c.accepted.Add(1)
		c.connected.Add(1)
		c.wg.Add(1)
		go c.serveConn(conn, p, release)
	}, c.log)
	if err != nil {
		c.log.Error("client socket: no longer accepting", "err", err)
	}
}

// admit takes a slot for a connection of p: root's and the node's own
// uid's from their quarter, anyone else's from the others' within the
// per-uid cap. A connection whose credentials could not be read counts as
// uid -1, an unprivileged one.
func (c *clientServer) admit(p peer) (release func(), ok bool) {
	if p.ok && (p.uid == 0 || int(p.uid) == os.Geteuid()) {
		return c.privileged.Acquire(strconv.FormatUint(uint64(p.uid), 10))
	}
	key := "-1"
	if p.ok {
		key = strconv.FormatUint(uint64(p.uid), 10)
	}
	return c.users.Acquire(key)
}

// close stops accepting, ends every connection, waits for their
// goroutines and removes the socket.
func (c *clientServer) close() {
	c.closeOnce.Do(c.doClose)
}

func (c *clientServer) doClose() {
	c.stop()
	c.ln.Close() // removes the socket file
	c.mu.Lock()
	for conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *clientServer) stats() *ClientStats {
	st := &ClientStats{Socket: c.path, Connected: c.connected.Load(), Accepted: c.accepted.Load(), Requests: c.requests.Load(),
		Refused: c.refused.Load(), RefusedConns: c.refusedConns.Load(), PackFds: c.packFds.Load(), Fills: c.fills.Load(), FillBytes: c.fillBytes.Load()}
	if c.fill != nil {
		st.GPU = c.fill.held()
	}
	st.ByProcess = c.procs.list()
	return st
}

// peer is a connected client, as SO_PEERCRED saw it at connect time (for
// logs and fairness only: the fd, not the uid, decides what it may read).
type peer struct {
	pid      int32
	uid, gid uint32
	ok       bool // SO_PEERCRED answered
	// kvMaps: the CUDA allocations this connection's KV requests keep
	// mapped (kv_ipc.go); nil on a node without a GPU service.
	kvMaps *kvMaps
}

func peerOf(conn *net.UnixConn) peer {
	var p peer
	if rc, err := conn.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				p = peer{pid: cr.Pid, uid: cr.Uid, gid: cr.Gid, ok: true}
			}
		})
	}
	return p
}

// reply is one answer: status 0 or an errno, fields, and fds to pass.
type reply struct {
	errno  syscall.Errno
	msg    string
	fields []byte
	fds    []*os.File
}

func refuse(err error) reply {
	return reply{errno: clientproto.Errno(err), msg: err.Error()}
}

func (c *clientServer) serveConn(conn *net.UnixConn, p peer, release func()) {
	defer c.wg.Done()
	defer c.connected.Add(-1)
	defer func() {
		c.mu.Lock()
		if c.conns != nil {
			delete(c.conns, conn)
		}
		c.mu.Unlock()
		conn.Close()
		release()
	}()
	if c.fill != nil {
		p.kvMaps = newKVMaps(c.kvMapped)
		defer p.kvMaps.close()
	}
	log := c.log.With("client_pid", p.pid, "client_uid", p.uid)
	// One byte more than the largest request, to tell an oversize datagram
	// even where the kernel does not flag MSG_TRUNC.
	buf := make([]byte, clientproto.MaxRequest+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil || (n == 0 && oobn == 0) {
			return // closed by the client, or by close()
		}
		fds := receivedFds(oob[:oobn])
		c.requests.Add(1)
		h, rep := c.handle(buf[:n], flags, fds, p)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if rep.errno != 0 {
			c.refused.Add(1)
			log.Debug("client request refused", "op", h.Op, "errno", rep.errno, "msg", rep.msg)
		}
		msg := clientproto.Reply(h.Op, h.Seq, -int32(rep.errno), rep.msg, rep.fields)
		var rights []byte
		if len(rep.fds) > 0 {
			ints := make([]int, len(rep.fds))
			for i, f := range rep.fds {
				ints[i] = int(f.Fd())
			}
			rights = unix.UnixRights(ints...)
		}
		_, _, werr := conn.WriteMsgUnix(msg, rights, nil)
		for _, f := range rep.fds {
			f.Close()
		}
		if werr != nil {
			return
		}
	}
}

// receivedFds returns the descriptors passed with a datagram (all of them,
// so that every one is closed whatever the request's fate).
func receivedFds(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_RIGHTS {
			if r, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	return fds
}

// handle checks the datagram and runs its op. The header is returned for
// the reply (op and seq echoed as far as they could be read).
func (c *clientServer) handle(b []byte, flags int, fds []int, p peer) (clientproto.Header, reply) {
	h, body, err := clientproto.ParseHeader(b)
	if len(b) > clientproto.MaxRequest || flags&unix.MSG_TRUNC != 0 {
		return h, refuse(fmt.Errorf("request larger than %d bytes: %w", clientproto.MaxRequest, syscall.EMSGSIZE))
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return h, refuse(fmt.Errorf("too many descriptors passed; a request carries one: %w", syscall.EINVAL))
	}
	if err != nil {
		return h, refuse(err)
	}
	if clientproto.IsKV(h.Op) { // no fd of the mount: the caller's uid names its blocks (kv.go)
		return h, c.kvRequest(h.Op, body, fds, p)
	}
	switch h.Op {
	case clientproto.OpPacks, clientproto.OpStat, clientproto.OpFill:
	default:
		return h, refuse(fmt.Errorf("unknown op %d: %w", h.Op, syscall.EOPNOTSUPP))
	}
	if len(fds) != 1 {
		return h, refuse(fmt.Errorf("a request carries exactly one fd (SCM_RIGHTS) opened for reading on a file of the mount, got %d: %w", len(fds), syscall.EBADF))
	}
	if h.Op == clientproto.OpStat && len(body) != 0 {
		return h, refuse(fmt.Errorf("op %d takes an empty body: %w", h.Op, syscall.EINVAL))
	}
	sf, err := c.fsys.FileOfFd(fds[0])
	if err != nil {
		return h, refuse(err)
	}
	switch h.Op {
	case clientproto.OpStat:
		return h, c.opStat(sf)
	case clientproto.OpPacks:
		return h, c.opPacksFlags(sf, body, p)
	default:
		return h, c.opFill(sf, fds[0], body, p)
	}
}
