// Package connlimit bounds the connections that a listener others can reach
// holds open, per peer (a uid, an address) and in all, as parts of the
// process's descriptor limit: a peer that opens thousands of connections
// gets a few of them and the rest closed at once, and the node keeps the
// descriptors its own work needs (the mount's files, packs, the admin
// socket). The numbers are in docs/design/client.md and peers.md.
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// NoFile is the process's soft RLIMIT_NOFILE now. Read at every call (one
// getrlimit): an operator's prlimit on a running node takes effect at the
// next connection.
func NoFile() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 1 << 30
	}
	return int(r.Cur)
}

// RaiseNoFile raises the soft RLIMIT_NOFILE to the hard limit and returns
// the soft limit then in force. (The Go runtime already does so at start
// on Linux; the node does it itself so that the caps below do not depend
// on that, and logs the number.) prlimit, not setrlimit, so that programs
// the node starts still get the limit it was started with (the runtime
// restores that one for children unless setrlimit was called).
func RaiseNoFile() (int, error) {
	var r unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &r); err != nil {
		return NoFile(), err
	}
	if r.Cur < r.Max {
		nr := unix.Rlimit{Cur: r.Max, Max: r.Max}
		if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &nr, nil); err != nil {
			return NoFile(), err
		}
	}
	return NoFile(), nil
}

// Share is the part of a descriptor limit n that one listener's
// connections may hold in all: a quarter. The client socket's unprivileged
// users, root's clients and the data plane each get one; the last quarter
// (and more, since few of these are full at once) is the node's own.
func Share(n int) int { return max(n/4, 1) }

// PerPeer is what one peer (an unprivileged uid, a source address) may
// hold of a limit n: a sixteenth, at most most.
func PerPeer(n, most int) int { return max(min(n/16, most), 1) }

// Limiter counts a listener's connections by key and refuses one over a
// cap. The caps are asked for at every Acquire (they follow the limit).
type Limiter struct {
	caps    func() (perKey, total int)
	mu      sync.Mutex
	held    map[string]int
	total   int
	refused atomic.Int64
}

// New returns a Limiter whose caps are caps() at each Acquire.
func New(caps func() (perKey, total int)) *Limiter {
	return &Limiter{caps: caps, held: map[string]int{}}
}

// Acquire takes a slot for a connection from key. False: key holds its
// cap, or the listener holds its total, and the connection is to be
// closed at once (counted in Refused). release gives the slot back (call
// it once, when the connection closes).
func (l *Limiter) Acquire(key string) (release func(), ok bool) {
	perKey, total := l.caps()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= total || l.held[key] >= perKey {
		l.refused.Add(1)
		return nil, false
	}
	l.total++
	l.held[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.total--
			if l.held[key]--; l.held[key] <= 0 {
				delete(l.held, key)
			}
		})
	}, true
}

// Held is the connections held now, all keys together.
func (l *Limiter) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Refused is the connections refused since New.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// AddrKey is the key of a TCP peer's address: the IPv4 address, or an
// IPv6 address's /64 (one host usually holds a whole /64, so that a peer
// cannot multiply its cap by its addresses). Anything else: its string.
func AddrKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// Listener closes at once every accepted connection over its Limiter's
// caps (keyed by AddrKey of the remote address), and gives a connection's
// slot back when it is closed.
type Listener struct {
	net.Listener
	Limits *Limiter
	// OnRefuse, when set, is called (in Accept) for each refused
	// connection, before it is closed.
	OnRefuse func(net.Conn)
}

// Accept returns the next connection within the caps; those over them
// are closed without a word.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, ok := l.Limits.Acquire(AddrKey(c.RemoteAddr()))
		if !ok {
			if l.OnRefuse != nil {
				l.OnRefuse(c)
			}
			c.Close()
			continue
		}
		return &conn{Conn: c, release: release}, nil
	}
}

type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// Unwrap is the connection accepted (so that the data plane can reach a
// *net.TCPConn for sendfile).
func (c *conn) Unwrap() net.Conn { return c.Conn }

// Every limits calls to f to one a period: refusals are logged without a
// flood of log lines.
type Every struct {
	Period time.Duration
	last   atomic.Int64
}

// Allow says whether f may run now (once per Period).
func (e *Every) Allow() bool {
	now := time.Now().UnixNano()
	last := e.last.Load()
	return now-last >= int64(e.Period) && e.last.CompareAndSwap(last, now)
}
