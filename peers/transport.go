package peers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore"
)

// connsPerPeer is how many data plane connections a node keeps to each
// peer; requests are spread over them round-robin and pipelined on each.
const connsPerPeer = 4

// dialTimeout bounds connecting (TCP and TLS handshake) to a peer.
const dialTimeout = 5 * time.Second

// clientConn is one pipelined data plane connection to a peer.
type clientConn struct {
	c   net.Conn
	wmu sync.Mutex
	bw  *bufio.Writer

	mu      sync.Mutex
	next    uint32
	pending map[uint32]*call
	err     error // set once the connection is dead
	plain   bool  // the plaintext data plane (no TLS)
	// used is when a request was last sent or an answer last read
	// (UnixNano), for pool.get's idle check.
	used atomic.Int64
}

// idleFor is how long the connection has had no request in flight and
// none sent or answered; 0 while one is in flight.
func (cc *clientConn) idleFor(now time.Time) time.Duration {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if len(cc.pending) > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, cc.used.Load()))
}

type call struct {
	max uint32 // the longest payload the answer may have
	// hash: a chunk request; the reader hashes an ok answer's payload as
	// it reads it (while the bytes are in the cache) into sum.
	hash bool
	sum  [32]byte
	// into: where an ok answer of exactly len(into) bytes goes (the
	// caller's memory; request.into). The reader writes into it only
	// after taking the call out of pending, and closes done when it has
	// stopped; a caller that gives up after that waits for done
	// (roundTrip), so nothing is written there once roundTrip returned.
	into   []byte
	done   chan struct{}
	status byte
	data   []byte
	err    error
}

func dialPeer(ctx context.Context, addr string, sec security) (*clientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := sec.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("data plane %s: %w", addr, err)
	}
	cc := &clientConn{c: c, bw: bufio.NewWriterSize(c, 64<<10), pending: map[uint32]*call{}, plain: sec.plain != nil}
	cc.used.Store(time.Now().UnixNano())
	cc.bw.WriteString(wireMagic)
	go cc.readLoop()
	return cc, nil
}

func (cc *clientConn) dead() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err != nil
}

func (cc *clientConn) close(err error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
	}
	pend := cc.pending
	cc.pending = map[uint32]*call{}
	cc.mu.Unlock()
	cc.c.Close()
	for _, cl := range pend {
		cl.err = err
		close(cl.done)
	}
}

func (cc *clientConn) readLoop() {
	r := bufio.NewReaderSize(cc.c, 32<<10)
	var hdr [frameHeader]byte
	h := blake3.New()
	var stage []byte
	if cc.plain {
		// Plaintext: the kernel copies into a piece-sized buffer that
		// stays in the CPU's cache, which is then hashed and copied into
		// the chunk's fresh buffer. Reading straight into the fresh
		// buffer cost more (BenchmarkFetch3Plaintext, medians of 4 and 8
		// runs: 1.87 against 1.73 cores per GB/s, docs/bench.md). TLS
		// already decrypts out of its own record buffer; staging it too
		// changed nothing measurable.
		stage = make([]byte, hashPiece)
	}
	for {
		kind, id, n, err := readHeader(r, &hdr)
		if err != nil {
			cc.close(fmt.Errorf("data plane connection to %s: %w", cc.c.RemoteAddr(), err))
			return
		}
		cc.mu.Lock()
		cl := cc.pending[id]
		delete(cc.pending, id)
		cc.mu.Unlock()
		if cl == nil { // the caller gave up: skip the answer
			if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
				cc.close(fmt.Errorf("data plane connection to %s: %w", cc.c.RemoteAddr(), noEOF(err)))
				return
			}
			continue
		}
		max := cl.max
		if kind == stError {
			max = maxErrorLen
		}
		if n > max || kind > stError || (kind == stNotFound && n != 0) {
			err := fmt.Errorf("answer of kind %d with %d bytes (at most %d): %w", kind, n, max, errProtocol)
			cl.err = err
			close(cl.done)
			cc.close(err)
			return
		}
		// The payload is read straight into a buffer of its size (past
		// what the reader had buffered), or into the caller's memory, a
		// chunk's hashed piece by piece.
		var buf []byte
		st := stage
		if kind == stOK && cl.into != nil && int(n) == len(cl.into) {
			// The caller's memory is reused (a load's pinned buffers),
			// not fresh: read straight into it.
			buf, st = cl.into, nil
		} else {
			buf = make([]byte, n)
		}
		if cl.hash && kind == stOK {
			h.Reset()
			err = readHashed(r, buf, h, st)
			h.Sum(cl.sum[:0])
		} else {
			_, err = io.ReadFull(r, buf)
		}
		if err != nil {
			err = fmt.Errorf("data plane connection to %s: %w", cc.c.RemoteAddr(), noEOF(err))
			cl.err = err
			close(cl.done)
			cc.close(err)
			return
		}
		cl.status, cl.data = kind, buf
		cc.used.Store(time.Now().UnixNano())
		close(cl.done)
	}
}

// hashPiece is how much of a chunk is read before it is hashed: small
// enough to be hashed from the CPU's cache.
const hashPiece = 128 << 10

// readHashed fills buf from r and writes it to h piece by piece, each
// piece read into stage (of hashPiece bytes) first when it is not nil.
func readHashed(r io.Reader, buf []byte, h *blake3.Hasher, stage []byte) error {
	for off := 0; off < len(buf); {
		end := min(off+hashPiece, len(buf))
		if stage != nil {
			p := stage[:end-off]
			if _, err := io.ReadFull(r, p); err != nil {
				return err
			}
			h.Write(p)
			copy(buf[off:end], p)
			off = end
			continue
		}
		if _, err := io.ReadFull(r, buf[off:end]); err != nil {
			return err
		}
		h.Write(buf[off:end])
		off = end
	}
	return nil
}

// errWrongChunk: a member sent bytes that fail their hash.
var errWrongChunk = errors.New("sent bytes that fail their hash")

// roundTrip sends one request and waits for its answer.
// An ok answer to a chunk request (opChunk, opRelay) is checked against
// the chunk's id here, before the caller sees it: bytes that fail are
// errWrongChunk (the connection stays up).
func (cc *clientConn) roundTrip(ctx context.Context, rq request, max uint32) (byte, []byte, error) {
	chunk := rq.op == opChunk || rq.op == opRelay
	cl := &call{max: max, hash: chunk, done: make(chan struct{})}
	if chunk {
		cl.into = rq.into
	}
	cc.mu.Lock()
	if cc.err != nil {
		err := cc.err
		cc.mu.Unlock()
		return 0, nil, err
	}
	cc.next++
	id := cc.next
	cc.pending[id] = cl
	cc.mu.Unlock()
	cc.used.Store(time.Now().UnixNano())

	cc.wmu.Lock()
	_, err := cc.bw.Write(appendFrame(make([]byte, 0, frameHeader+36), rq.op, id, encodeRequest(rq)))
	if err == nil {
		err = cc.bw.Flush()
	}
	cc.wmu.Unlock()
	if err != nil {
		cc.close(fmt.Errorf("data plane connection to %s: %w", cc.c.RemoteAddr(), err))
	}
	select {
	case <-cl.done:
		if chunk && cl.err == nil && cl.status == stOK && cl.sum != rq.id {
			return 0, nil, fmt.Errorf("chunk %s of %d bytes: %w", chunkstore.ID(rq.id).Short(), len(cl.data), errWrongChunk)
		}
		return cl.status, cl.data, cl.err
	case <-ctx.Done():
		cc.mu.Lock()
		_, waiting := cc.pending[id]
		delete(cc.pending, id)
		cc.mu.Unlock()
		if !waiting && cl.into != nil {
			// The reader took the answer and may be writing it into the
			// caller's memory. Closing the connection ends that read at
			// once (a stalled peer cannot hold us); the reader closes
			// done when it has stopped.
			select {
			case <-cl.done:
			default:
				cc.close(fmt.Errorf("data plane connection to %s: a fetch into the caller's memory was cancelled while its answer arrived: %w", cc.c.RemoteAddr(), ctx.Err()))
				<-cl.done
			}
		}
		return 0, nil, ctx.Err()
	}
}

// pool holds the connections to one peer.
type pool struct {
	addr string
	sec  security
	// idle is the peer's idle timeout as this node knows it (its own,
	// Config.IdleTimeout; 0: DefaultIdleTimeout): a connection idle for
	// half of it is dialed again rather than used, so that a request
	// seldom meets the server closing it (Node.request retries once when
	// it does).
	idle time.Duration
	mu   sync.Mutex
	cs   [connsPerPeer]*clientConn
	rr   atomic.Uint32
	// dialing serializes the dials of one slot: however many callers
	// find it empty at once, one connection is made (the peer caps the
	// connections from an address: maxConnsPerAddr).
	dialing [connsPerPeer]sync.Mutex
}

// get returns a live connection, dialing one when its slot is empty,
// dead or idle too long.
func (p *pool) get(ctx context.Context) (*clientConn, error) {
	i := int(p.rr.Add(1) % connsPerPeer)
	if cc := p.live(i); cc != nil {
		return cc, nil
	}
	p.dialing[i].Lock()
	defer p.dialing[i].Unlock()
	if cc := p.live(i); cc != nil { // dialed by another caller meanwhile
		return cc, nil
	}
	cc, err := dialPeer(ctx, p.addr, p.sec)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	old := p.cs[i]
	p.cs[i] = cc
	p.mu.Unlock()
	if old != nil {
		old.close(errors.New("data plane connection idle: replaced"))
	}
	return cc, nil
}

// live is slot i's connection if it is alive and not idle for half the
// peer's idle timeout, else nil.
func (p *pool) live(i int) *clientConn {
	p.mu.Lock()
	cc := p.cs[i]
	p.mu.Unlock()
	if cc == nil || cc.dead() {
		return nil
	}
	idle := p.idle
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	if cc.idleFor(time.Now()) > idle/2 {
		return nil
	}
	return cc
}

func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, cc := range p.cs {
		if cc != nil {
			cc.close(net.ErrClosed)
			p.cs[i] = nil
		}
	}
}
