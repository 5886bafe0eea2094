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
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// maxInFlightPerConn bounds the requests one connection has served at once.
const maxInFlightPerConn = 16

// server answers other members' data plane requests from the local store.
type server struct {
	s   *chunkstore.Store
	ln  net.Listener
	log *slog.Logger
	// corrupt flips the first byte of every chunk served: a test hook for
	// a member that serves wrong bytes (docs/design/peers.md).
	corrupt bool
	stats   *Stats
	// received counts chunks other members pushed here.
	received func(chunks, bytes int64)
	// owner tells, for opHas, which chunks this member owns.
	owner func() func(chunkstore.ID) bool
	// swarm: the peer cache and the relay (relay.go), set once at start.
	swarm atomic.Pointer[swarmHooks]

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newServer(s *chunkstore.Store, ln net.Listener, sec security, log *slog.Logger, stats *Stats, corrupt bool,
	received func(chunks, bytes int64), owner func() func(chunkstore.ID) bool) *server {
	sv := &server{s: s, ln: sec.listener(ln), log: log, stats: stats, corrupt: corrupt, received: received, owner: owner, conns: map[net.Conn]struct{}{}}
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
	sv.mu.Unlock()
	sv.wg.Wait()
}

func (sv *server) accept() {
	defer sv.wg.Done()
	for {
		c, err := sv.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				sv.log.Warn("data plane: accept", "err", err)
			}
			return
		}
		sv.mu.Lock()
		sv.conns[c] = struct{}{}
		sv.mu.Unlock()
		sv.wg.Add(1)
		go func() {
			defer sv.wg.Done()
			sv.serveConn(c)
			sv.mu.Lock()
			delete(sv.conns, c)
			sv.mu.Unlock()
			c.Close()
		}()
	}
}

func (sv *server) serveConn(c net.Conn) {
	r := bufio.NewReaderSize(c, 16<<10)
	var magic [len(wireMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		_, isTLS := c.(*tls.Conn)
		_, isPlain := c.(*plainConn)
		if (isTLS || isPlain) && err != io.EOF {
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
	w := &answerWriter{c: c, bw: bufio.NewWriterSize(c, 64<<10)}
	if pc, ok := c.(*plainConn); ok && !sv.corrupt {
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
			if err != io.EOF && !errors.Is(err, net.ErrClosed) {
				sv.log.Warn("data plane: bad request; closing the connection", "remote", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		rq, err := decodeRequest(f)
		if err != nil {
			sv.log.Warn("data plane: bad request; closing the connection", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			w.send(f.id, sv.answer(rq, w.tcp != nil))
		}()
	}
}

// answerWriter writes one connection's answers. Small ones go through a
// buffer, and the last of the writers waiting flushes it: answers ready
// together go out in one write. A chunk read into a pooled frame (header
// room and payload in one buffer) is written to the connection in one
// call, without a copy into the buffer.
type answerWriter struct {
	c       net.Conn
	tcp     *net.TCPConn // plaintext over TCP: chunks are sent with sendfile
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
			err = sendChunk(w.tcp, *a.span)
		}
	} else if a.frame != nil {
		f := *a.frame
		putHeader(f, a.st, id, len(f)-frameHeader)
		if len(f) <= w.bw.Available() {
			_, err = w.bw.Write(f)
		} else if err = w.bw.Flush(); err == nil {
			_, err = w.c.Write(f)
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
// another member).
func sendChunk(c *net.TCPConn, sp chunkstore.ChunkSpan) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	off, left := sp.Off, int(sp.Len)
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		for left > 0 {
			n, err := unix.Sendfile(int(fd), sp.Fd(), &off, left)
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
			return answer{st: stNotFound}
		case err != nil:
			return answer{st: stError, payload: errMsg(err)}
		case uint32(len(data)) != rq.len:
			return answer{st: stError, payload: errMsg(errLength)}
		}
		sv.stats.served(int64(len(data)))
		if sv.corrupt {
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
	case opPut:
		st, p := sv.put(rq.raw)
		return answer{st: st, payload: p}
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
	if sv.corrupt {
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
