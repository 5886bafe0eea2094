package peers

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// simNet is an in-memory network for memberlist, after memberlist's own
// MockNetwork/MockTransport (mock_transport.go): packets ("UDP") go
// straight into the receiver's channel, streams ("TCP") are net.Pipe
// pairs. Unlike the mock it can kill a member (its transport then neither
// sends nor receives: a kill -9, not a leave), drop a fraction of packets
// at random, cut the network in two (partition), and never blocks a
// sender on a receiver that stopped reading (a full receive queue drops
// the packet, as a full UDP socket buffer would). Delivery takes no time: there is no latency, bandwidth or
// reordering beyond the receivers' scheduling.
type simNet struct {
	mu    sync.Mutex
	nodes map[string]*simTransport // by "ip:port"
	next  int
	loss  float64        // fraction of packets dropped
	side  map[string]int // partition: members on different sides cannot talk
	rng   *rand.Rand

	packets, lost, overflow atomic.Int64
}

func newSimNet(loss float64, seed uint64) *simNet {
	return &simNet{nodes: map[string]*simTransport{}, loss: loss, rng: rand.New(rand.NewPCG(seed, 1))}
}

// simQueue is each member's receive queue, in packets.
const simQueue = 512

// newTransport gives a member its own address, 10.x.y.z:7946.
func (n *simNet) newTransport() *simTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	i := n.next
	ip := net.IPv4(10, byte(i>>16), byte(i>>8), byte(i))
	t := &simTransport{
		net:      n,
		ip:       ip,
		addr:     net.JoinHostPort(ip.String(), "7946"),
		packetCh: make(chan *memberlist.Packet, simQueue),
		streamCh: make(chan net.Conn),
		stop:     make(chan struct{}),
	}
	n.nodes[t.addr] = t
	return t
}

// partition puts the members at addrs on side 1, the others on side 0;
// nil heals.
func (n *simNet) partition(addrs []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.side = map[string]int{}
	for _, a := range addrs {
		n.side[a] = 1
	}
}

// peer returns the live transport at addr reachable from from, if any;
// dropped reports a packet lost at random (only asked for packets).
func (n *simNet) peer(from, addr string, packet bool) (t *simTransport, dropped bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t = n.nodes[addr]
	if t == nil || t.down.Load() || n.side[from] != n.side[addr] {
		return nil, false
	}
	if packet && n.loss > 0 && n.rng.Float64() < n.loss {
		return nil, true
	}
	return t, false
}

type simTransport struct {
	net      *simNet
	ip       net.IP
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	stop     chan struct{}
	down     atomic.Bool
	once     sync.Once
}

var _ memberlist.Transport = (*simTransport)(nil)

type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

// FinalAdvertiseAddr is the member's own address.
func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, 7946, nil
}

// WriteTo delivers a packet unless the receiver is down, the packet is
// lost at random, or the receiver's queue is full.
func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	if t.down.Load() {
		return now, nil
	}
	t.net.packets.Add(1)
	dest, dropped := t.net.peer(t.addr, addr, true)
	if dropped {
		t.net.lost.Add(1)
		return now, nil
	}
	if dest == nil {
		return now, nil // nobody there: UDP says nothing
	}
	p := &memberlist.Packet{Buf: bytes.Clone(b), From: simAddr(t.addr), Timestamp: now}
	select {
	case dest.packetCh <- p:
	default:
		t.net.overflow.Add(1)
	}
	return now, nil
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

var errSimRefused = errors.New("connection refused")

// DialTimeout connects a stream to addr, refused when nobody is there or
// the member was killed.
func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.down.Load() {
		return nil, errSimRefused
	}
	dest, _ := t.net.peer(t.addr, addr, false)
	if dest == nil {
		return nil, fmt.Errorf("dial %s: %w", addr, errSimRefused)
	}
	a, b := net.Pipe()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case dest.streamCh <- &simConn{a, simAddr(t.addr)}:
		return &simConn{b, simAddr(dest.addr)}, nil
	case <-dest.stop:
	case <-timer.C:
	}
	a.Close()
	b.Close()
	return nil, fmt.Errorf("dial %s: %w", addr, errSimRefused)
}

func (t *simTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown (memberlist's, when serf shuts down without leaving) takes the
// member off the network at once.
func (t *simTransport) Shutdown() error {
	t.down.Store(true)
	t.once.Do(func() { close(t.stop) })
	return nil
}

// simConn is one end of a stream; memberlist logs and checks the remote
// address.
type simConn struct {
	net.Conn
	remote simAddr
}

func (c *simConn) RemoteAddr() net.Addr { return c.remote }
