package peers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/connlimit"
	"github.com/kylix/kylix/internal/unixsock"
)

// maxInFlightPerConn bounds the requests one connection has served at once.
const maxInFlightPerConn = 16

// What anyone who can reach the data plane's port may hold of the node
// (docs/design/peers.md, "Limits"). Only members hold the key, but anyone
// on the network can connect, and every connection is a descriptor.
const (
	// maxConnsPerAddr caps the connections from one address (an IPv6
	// /64): a member process keeps connsPerPeer (4) to each other member
	// and dials a slot again only once its connection died, so 64 leaves
	// room for 16 processes behind one address (several nodes on a host,
	// NAT) and for reconnections. Lowered to a sixteenth of RLIMIT_NOFILE
	// where that is smaller; all addresses together hold at most a
	// quarter of it (connlimit.Share). A connection over either cap is
	// closed at once.
	maxConnsPerAddr = 64
	// DefaultHandshakeTimeout: a connection that has not completed the
	// TLS or plaintext handshake and sent the wire magic by then is
	// closed (Config.HandshakeTimeout).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultIdleTimeout: an established connection on which nothing
	// arrives for this long while no answer is being sent is closed, and
	// one whose reader takes nothing of an answer for this long
	// (Config.IdleTimeout). Clients drop their own connections idle for
	// half of it (pool.get) and dial again once when a connection closed
	// under a request (Node.request).
	DefaultIdleTimeout = 60 * time.Second
)

// dataPlaneCaps are the data plane's connection caps for the descriptor
// limit now (connlimit.NoFile): per address, in all.
func dataPlaneCaps() (perAddr, total int) {
	n := connlimit.NoFile()
	return connlimit.PerPeer(n, maxConnsPerAddr), connlimit.Share(n)
}

// server answers other members' data plane requests from the local store.
type server struct {
	s   *chunkstore.Store
	ln  net.Listener
	log *slog.Logger
	// corrupt flips the first byte of every chunk served: a test hook for
	// a member that serves wrong bytes (docs/design/peers.md); atomic so
	// that a test can turn a running member into a liar.
	corrupt atomic.Bool
	// notHeld counts chunk requests answered "not held here".
	notHeld atomic.Int64
	stats   *Stats
	// received counts chunks other members pushed here.
	received func(chunks, bytes int64)
	// owner tells, for opHas, which chunks this member owns.
	owner func() func(chunkstore.ID) bool
	// swarm: the peer cache and the relay (relay.go), set once at start.
	swarm atomic.Pointer[swarmHooks]
	// kv: the member's KV-cache blocks (kv.go, Node.SetKV); nil: none.
	kv atomic.Pointer[KVBlocks]

	// limits caps connections per address and in all; handshake and
	// idle are the deadlines (DefaultHandshakeTimeout, DefaultIdleTimeout).
	limits          *connlimit.Limiter
	handshake, idle time.Duration
	refusedLog      connlimit.Every

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// serverLimits are a server's deadlines; zero: the defaults.
type serverLimits struct {
	handshake, idle time.Duration
}

func newServer(s *chunkstore.Store, ln net.Listener, sec security, log *slog.Logger, stats *Stats, corrupt bool,
	received func(chunks, bytes int64), owner func() func(chunkstore.ID) bool, lim serverLimits) *server {
	sv := &server{s: s, ln: sec.listener(ln), log: log, stats: stats, received: received, owner: owner, conns: map[net.Conn]struct{}{},
		limits: connlimit.New(dataPlaneCaps), handshake: lim.handshake, idle: lim.idle, refusedLog: connlimit.Every{Period: 10 * time.Second}}
	sv.corrupt.Store(corrupt)
	if sv.handshake <= 0 {
		sv.handshake = DefaultHandshakeTimeout
	}
	if sv.idle <= 0 {
		sv.idle = DefaultIdleTimeout
	}
	sv.wg.Add(1)
	go sv.accept()
	return sv
}

func (sv *server) close() {
	sv.ln.Close()
	sv.mu.Lock()
	for c := range sv.conns {
		c.Close()
	}
	sv.conns = nil // closing: admit closes what it is given
	sv.mu.Unlock()
	sv.wg.Wait()
}

// accept accepts until close. An accept that fails for want of
// descriptors backs off and tries again (unixsock.ServeListener): a flood
// of connections must not end the data plane for good.
func (sv *server) accept() {
	defer sv.wg.Done()
	if err := unixsock.ServeListener(sv.ln, sv.admit, sv.log); err != nil {
		sv.log.Error("data plane: no longer accepting", "err", err)
	}
}

// admit starts serving c, or closes it at once when its address or the
// data plane holds its cap of connections.
func (sv *server) admit(c net.Conn) {
	release, ok := sv.limits.Acquire(connlimit.AddrKey(c.RemoteAddr()))
	if !ok {
		if sv.refusedLog.Allow() {
			perAddr, total := dataPlaneCaps()
			sv.log.Warn("data plane: too many connections; closing new ones at once", "remote", c.RemoteAddr().String(),
				"per_address", perAddr, "total", total, "held", sv.limits.Held(), "refused_since_start", sv.limits.Refused())
		}
		c.Close()
		return
	}
	sv.mu.Lock()
	if sv.conns == nil {
		sv.mu.Unlock()
		c.Close()
		release()
		return
	}
	sv.conns[c] = struct{}{}
	sv.mu.Unlock()
	sv.wg.Add(1)
	go func() {
		defer sv.wg.Done()
		sv.serveConn(c)
		sv.mu.Lock()
		if sv.conns != nil {
			delete(sv.conns, c)
		}
		sv.mu.Unlock()
		c.Close()
		release()
	}()
}

// serverHandshake runs the server's half of c's handshake (TLS, or the
// plaintext challenge-response) under the deadline already set.
func serverHandshake(c net.Conn) error {
	switch c := c.(type) {
	case *tls.Conn:
		return c.Handshake()
	case *plainConn:
		return c.handshake()
	}
	return nil
}

func (sv *server) serveConn(c net.Conn) {
	// The handshake and the magic within sv.handshake: a connection that
	// holds a descriptor without a word is closed.
	c.SetDeadline(time.Now().Add(sv.handshake))
	var magic [len(wireMagic)]byte
	err := serverHandshake(c)
	if err == nil {
		_, err = io.ReadFull(c, magic[:])
	}
	if err != nil {
		_, isTLS := c.(*tls.Conn)
		_, isPlain := c.(*plainConn)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			sv.log.Debug("data plane: no handshake in time; closing", "remote", c.RemoteAddr().String(), "timeout", sv.handshake)
		case (isTLS || isPlain) && err != io.EOF:
			// A handshake refused (no certificate from this cluster)
			// shows here first.
			sv.log.Warn("data plane: refused a connection", "remote", c.RemoteAddr().String(), "err", err)
		}
		return
	}
	if string(magic[:]) != wireMagic {
		sv.log.Warn("data plane: not a kylix peer", "remote", c.RemoteAddr().String())
		return
	}
	c.SetDeadline(time.Time{})
	var busy atomic.Int32 // answers being made or sent
	r := bufio.NewReaderSize(&idleReader{c: c, idle: sv.idle, busy: &busy}, 16<<10)
	w := &answerWriter{c: c, idle: sv.idle, bw: bufio.NewWriterSize(idleWriter{c: c, idle: sv.idle}, 64<<10)}
	if pc, ok := c.(*plainConn); ok && !sv.corrupt.Load() {
		// Plaintext over TCP: chunks go from the pack to the socket with
		// sendfile (sendChunk). Not with TLS, which must encrypt them,
		// nor with the corrupting test hook, which changes them.
		w.tcp, _ = pc.Conn.(*net.TCPConn)
	}
	sem := make(chan struct{}, maxInFlightPerConn)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		f, err := readRequest(r)
		if err != nil {
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				sv.log.Debug("data plane: closing an idle connection", "remote", c.RemoteAddr().String(), "idle", sv.idle)
			case err != io.EOF && !errors.Is(err, net.ErrClosed):
				sv.log.Warn("data plane: bad request; closing the connection", "remote", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		rq, err := decodeRequest(f)
		if err != nil {
			sv.log.Warn("data plane: bad request; closing the connection", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		busy.Add(1)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; busy.Add(-1); wg.Done() }()
			w.send(f.id, sv.answer(rq, w.tcp != nil))
		}()
	}
}

// idleReader reads a served connection's requests. A read that waits the
// idle timeout with nothing arriving ends the connection, unless answers
// are being made or sent (busy): a long transfer, a relay fetching for
// the client. The deadline is set again at every read, so a long request
// (a push of 64 MiB) only needs its bytes to keep coming. crypto/tls
// keeps a connection usable after a read deadline passed.
type idleReader struct {
	c    net.Conn
	idle time.Duration
	busy *atomic.Int32
}

func (r *idleReader) Read(p []byte) (int, error) {
	for {
		r.c.SetReadDeadline(time.Now().Add(r.idle))
		n, err := r.c.Read(p)
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && r.busy.Load() > 0 {
			continue
		}
		return n, err
	}
}

// writePiece is what idleWriter writes under one deadline.
const writePiece = 1 << 20

// idleWriter writes a served connection's answers, a piece at a time,
// each within the idle timeout: a client that takes nothing for that long
// (it stopped reading) loses the connection, one that reads slowly does
// not (a 256 MiB manifest needs no more than 1 MiB a minute).
type idleWriter struct {
	c    net.Conn
	idle time.Duration
}

func (w idleWriter) Write(p []byte) (n int, err error) {
	for len(p) > 0 {
		k := min(len(p), writePiece)
		w.c.SetWriteDeadline(time.Now().Add(w.idle))
		m, err := w.c.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// answerWriter writes one connection's answers. Small ones go through a
// buffer, and the last of the writers waiting flushes it: answers ready
// together go out in one write. A chunk read into a pooled frame (header
// room and payload in one buffer) is written to the connection in one
// call, without a copy into the buffer.
type answerWriter struct {
	c       net.Conn
	idle    time.Duration // each piece written within it (idleWriter)
	tcp     *net.TCPConn  // plaintext over TCP: chunks are sent with sendfile
	mu      sync.Mutex
	bw      *bufio.Writer
	writers atomic.Int32 // answers waiting to be written
}

// send writes answer a to request id and gives back a's pooled frame.
// A write that fails closes the connection.
func (w *answerWriter) send(id uint32, a answer) {
	defer a.release()
	w.writers.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if a.span != nil {
		var hdr [frameHeader]byte
		putHeader(hdr[:], a.st, id, int(a.span.Len))
		if _, err = w.bw.Write(hdr[:]); err == nil {
			err = w.bw.Flush()
		}
		if err == nil {
			err = sendChunk(w.tcp, *a.span, w.idle)
		}
	} else if a.frame != nil {
		f := *a.frame
		putHeader(f, a.st, id, len(f)-frameHeader)
		if len(f) <= w.bw.Available() {
			_, err = w.bw.Write(f)
		} else if err = w.bw.Flush(); err == nil {
			_, err = idleWriter{c: w.c, idle: w.idle}.Write(f)
		}
	} else {
		var hdr [frameHeader]byte
		putHeader(hdr[:], a.st, id, len(a.payload))
		if _, err = w.bw.Write(hdr[:]); err == nil {
			_, err = w.bw.Write(a.payload)
		}
	}
	if w.writers.Add(-1) == 0 && err == nil {
		err = w.bw.Flush()
	}
	if err != nil {
		w.c.Close()
	}
}

// answer is a request's answer: status st and a payload, either in
// payload or, for a chunk read from the packs, in frame (a pooled buffer:
// frameHeader bytes of room for the header, then the payload), given back
// by release once written.
type answer struct {
	st      byte
	payload []byte
	frame   *[]byte
	// span, for a plaintext TCP connection: the chunk in its pack, sent
	// with sendfile; its lease is held until written.
	span *chunkstore.ChunkSpan
}

func (a answer) release() {
	if a.frame != nil {
		putFrame(a.frame)
	}
	if a.span != nil {
		a.span.Release()
	}
}

// sendChunk writes a chunk's bytes from its pack to c with sendfile(2):
// from the page cache to the socket, with no copy through this process.
// A pack shorter than the index says fails (the header already promised
// the bytes: the caller closes the connection, and the receiver asks
// another member). Each writePiece is sent within idle (as idleWriter).
func sendChunk(c *net.TCPConn, sp chunkstore.ChunkSpan, idle time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	off, left := sp.Off, int(sp.Len)
	for left > 0 {
		piece := min(left, writePiece)
		left -= piece
		c.SetWriteDeadline(time.Now().Add(idle))
		if err := sendPiece(rc, sp, &off, piece); err != nil {
			return err
		}
	}
	return nil
}

// sendPiece sends left bytes of sp's pack from *off with sendfile.
func sendPiece(rc syscall.RawConn, sp chunkstore.ChunkSpan, off *int64, left int) error {
	var serr error
	err := rc.Write(func(fd uintptr) bool {
		for left > 0 {
			n, err := unix.Sendfile(int(fd), sp.Fd(), off, left)
			if n > 0 {
				left -= n
			}
			switch {
			case err == unix.EAGAIN:
				return false // wait until the socket can take more
			case err == unix.EINTR:
			case err != nil:
				serr = err
				return true
			case n == 0:
				serr = fmt.Errorf("chunk %s: its pack ends %d bytes short: %w", sp.ID.Short(), left, chunkstore.ErrCorrupt)
				return true
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	return serr
}

// answer serves one request from the local store; sendfile: the
// connection can take a chunk from its pack by sendfile (fromPack).
func (sv *server) answer(rq request, sendfile bool) answer {
	id := chunkstore.ID(rq.id)
	switch rq.op {
	case opChunk, opRelay:
		if a, ok := sv.fromPack(id, rq.len, sendfile); ok {
			return a
		}
		// Not in a pack here, but maybe in memory: read or fetched
		// lately (a member reading a model serves it on).
		var data []byte
		err := chunkstore.ErrNotLocal
		if b, ok := sv.s.CachedChunk(id); ok {
			data, err = b, nil
		} else if sw := sv.swarm.Load(); sw != nil {
			data, err = sw.chunk(rq.op == opRelay, id, rq.len)
		}
		switch {
		case errors.Is(err, chunkstore.ErrNotLocal) || errors.Is(err, chunkstore.ErrNotFound):
			sv.notHeld.Add(1)
			return answer{st: stNotFound}
		case err != nil:
			return answer{st: stError, payload: errMsg(err)}
		case uint32(len(data)) != rq.len:
			return answer{st: stError, payload: errMsg(errLength)}
		}
		sv.stats.served(int64(len(data)))
		if sv.corrupt.Load() {
			data = append([]byte(nil), data...)
			data[0] ^= 0xff
		}
		return answer{st: stOK, payload: data}
	case opObject:
		obj, err := sv.s.GetObject(id)
		switch {
		case errors.Is(err, chunkstore.ErrNotFound):
			return answer{st: stNotFound}
		case err != nil:
			return answer{st: stError, payload: errMsg(err)}
		case len(obj) > maxObject:
			return answer{st: stError, payload: errMsg(errors.New("object too large for the data plane"))}
		}
		return answer{st: stOK, payload: obj}
	case opHas:
		st, p := sv.has(rq.raw)
		return answer{st: st, payload: p}
	case opLastRead:
		return answer{st: stOK, payload: sv.lastRead(rq.raw)}
	case opPut:
		st, p := sv.put(rq.raw)
		return answer{st: st, payload: p}
	case opKVGet, opKVPut, opKVHas:
		return sv.kvAnswer(rq)
	}
	return answer{st: stError, payload: errMsg(errors.New("unknown op"))}
}

var errLength = errors.New("chunk length differs from the one asked for")

// fromPack answers a chunk request from the packs: the chunk's bytes are
// read straight into a pooled frame, or, with sendfile, left in the pack
// for the writer to send (its lease held by the answer). Not hashed here:
// the receiver checks every chunk against its id before anyone sees it,
// and counts a member whose bytes fail. False when the chunk is not in a
// pack here.
func (sv *server) fromPack(id chunkstore.ID, size uint32, sendfile bool) (answer, bool) {
	sp, err := sv.s.LeaseChunk(id)
	switch {
	case errors.Is(err, chunkstore.ErrNotLocal):
		return answer{}, false
	case err != nil:
		return answer{st: stError, payload: errMsg(err)}, true
	}
	if sp.Len != size {
		sp.Release()
		return answer{st: stError, payload: errMsg(errLength)}, true
	}
	if sendfile {
		sv.stats.served(int64(size))
		sv.stats.ServedPackBytes.Add(int64(size))
		return answer{st: stOK, span: &sp}, true
	}
	defer sp.Release()
	f := getFrame(int(size))
	if err := sp.ReadInto((*f)[frameHeader:]); err != nil {
		putFrame(f)
		return answer{st: stError, payload: errMsg(err)}, true
	}
	sv.stats.served(int64(size))
	sv.stats.ServedPackBytes.Add(int64(size))
	if sv.corrupt.Load() {
		(*f)[frameHeader] ^= 0xff
	}
	return answer{st: stOK, frame: f}, true
}

func errMsg(err error) []byte {
	m := err.Error()
	if len(m) > maxErrorLen {
		m = m[:maxErrorLen]
	}
	return []byte(m)
}

// swarmHooks give the data plane the node's peer cache and relay.
type swarmHooks struct {
	cache *peerCache
	relay func(ctx context.Context, id chunkstore.ID, size uint32) ([]byte, error)
}

// chunk serves a chunk that is neither in the packs nor in memory: from
// the peer cache, or (relay requests) through the relay's one fetch.
func (h *swarmHooks) chunk(relay bool, id chunkstore.ID, size uint32) ([]byte, error) {
	if b, ok := h.cache.peek(id, size); ok {
		return b, nil
	}
	if relay {
		data, err := h.relay(context.Background(), id, size)
		if err == nil && data == nil {
			err = chunkstore.ErrNotLocal
		}
		return data, err
	}
	return nil, chunkstore.ErrNotLocal
}
