package peers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

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
	var wmu sync.Mutex
	var writers atomic.Int32 // answers waiting to be written
	bw := bufio.NewWriterSize(c, 256<<10)
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
			st, p := sv.answer(rq)
			writers.Add(1)
			wmu.Lock()
			defer wmu.Unlock()
			_, err := bw.Write(header(st, f.id, len(p)))
			if err == nil {
				_, err = bw.Write(p)
			}
			// The last of the writers waiting flushes: answers ready
			// together go out in one write.
			if writers.Add(-1) == 0 && err == nil {
				err = bw.Flush()
			}
			if err != nil {
				c.Close()
			}
		}()
	}
}

// answer serves one request from the local store.
func (sv *server) answer(rq request) (byte, []byte) {
	id := chunkstore.ID(rq.id)
	switch rq.op {
	case opChunk, opRelay:
		// Not hashed here: the receiver checks every chunk against its id
		// before anyone sees it, and counts a member whose bytes fail.
		data, err := sv.s.ReadChunkUnverified(id)
		fromPack := err == nil
		if errors.Is(err, chunkstore.ErrNotLocal) {
			// Not in a pack here, but maybe in memory: read or fetched
			// lately (a member reading a model serves it on).
			if b, ok := sv.s.CachedChunk(id); ok {
				data, err = b, nil
			} else if sw := sv.swarm.Load(); sw != nil {
				data, err = sw.chunk(rq.op == opRelay, id, rq.len)
			}
		}
		switch {
		case errors.Is(err, chunkstore.ErrNotLocal) || errors.Is(err, chunkstore.ErrNotFound):
			return stNotFound, nil
		case err != nil:
			return stError, errMsg(err)
		case uint32(len(data)) != rq.len:
			return stError, errMsg(errors.New("chunk length differs from the one asked for"))
		}
		sv.stats.served(int64(len(data)))
		if fromPack {
			sv.stats.ServedPackBytes.Add(int64(len(data)))
		}
		if sv.corrupt {
			data = append([]byte(nil), data...)
			data[0] ^= 0xff
		}
		return stOK, data
	case opObject:
		obj, err := sv.s.GetObject(id)
		switch {
		case errors.Is(err, chunkstore.ErrNotFound):
			return stNotFound, nil
		case err != nil:
			return stError, errMsg(err)
		case len(obj) > maxObject:
			return stError, errMsg(errors.New("object too large for the data plane"))
		}
		return stOK, obj
	case opHas:
		return sv.has(rq.raw)
	case opPut:
		return sv.put(rq.raw)
	}
	return stError, errMsg(errors.New("unknown op"))
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
