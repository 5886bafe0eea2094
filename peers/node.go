package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/pace"
	"github.com/kylix/kylix/internal/units"
)

// Config configures a Node.
type Config struct {
	// Name is the member's name, unique in the cluster, without '/'.
	// Default: HOSTNAME@LISTEN.
	Name string
	// Listen is the gossip address (TCP and UDP), host:port.
	Listen string
	// DataListen is the data plane's address; default the host of Listen
	// with a port the kernel chooses (members learn it from the tags).
	DataListen string
	// Join lists members to join at start (host:port of their gossip).
	Join []string
	// Key is the cluster key.
	Key Key
	// Capacity is the bytes this member offers (a tag; placement weight).
	Capacity int64
	// Zone is the failure zone (a tag), may be empty.
	Zone string
	// Version is the software version (a tag).
	Version string
	// Logger receives what the node does (default: discard).
	Logger *slog.Logger
	// CorruptServed makes the data plane flip the first byte of every
	// chunk it serves. Tests only: a member that serves wrong bytes.
	CorruptServed bool
	// ServeRate limits the bytes a second the data plane sends, all
	// connections together (0: no limit). Tests only: a member with
	// little bandwidth (weights.go).
	ServeRate int64
	// ServeDelay delays every byte the data plane sends by this much
	// (the sender does not wait). Tests only: a distant member.
	ServeDelay time.Duration
	// CrashAfterStripes makes MakeCold kill its own process (SIGKILL,
	// as kill -9) once it has stored that many stripes, before it names
	// them (0: never). Tests only: a crash in the middle of a conversion.
	CrashAfterStripes int
	// Replicas is the number of members that keep each chunk (placement).
	// Default DefaultReplicas.
	Replicas int
	// Reader: this member owns no chunks (tag role=reader): placement
	// puts every chunk on the other members, so it pulls nothing and keeps
	// only what it pins; it reads from the others, keeps what it fetched in
	// its peer cache and may relay. For GPU nodes that load models and
	// should not store the cluster's data. Other members need no flag: they
	// read the tag.
	Reader bool
	// NoPlacement: this member pulls nothing for placement (a member that
	// only reads; benchmarks use it). It still counts as an owner.
	NoPlacement bool
	// Plaintext: the data plane authenticates peers by an HMAC
	// challenge-response under the cluster key and does not encrypt
	// (trusted networks only; every member must use the same). Default:
	// mutual TLS 1.3.
	Plaintext bool
	// RepairRate bounds placement and repair pulls, bytes a second: 0
	// means DefaultRepairRate, negative no limit.
	RepairRate int64
	// FailureGrace is how long after serf marks a member failed it still
	// counts as an owner (nobody repairs its chunks): 0 means
	// DefaultFailureGrace, negative none.
	FailureGrace time.Duration
	// ColdShards sets k of the stripes per path (serve --cold-shards):
	// for serve --cold-after, and kylix tier cold without --data-shards.
	// nil: the cluster's default everywhere.
	ColdShards ShardPolicy
	// Keep lists the namespace paths whose chunks this member keeps even
	// when it does not own them (pins); nil: none. An error keeps all.
	Keep func() ([]string, error)
	// FetchTimeout bounds one attempt to fetch a chunk from one member.
	// Default 30 s.
	FetchTimeout time.Duration
	// LeaveDelay is how long Close waits after announcing the leave, so
	// the others learn this member left rather than failed: 0 means
	// DefaultLeaveDelay, negative none.
	LeaveDelay time.Duration
	// CacheDir holds the peer cache (chunks fetched from other members);
	// empty: no peer cache. CacheBytes is its budget (default
	// DefaultCacheBytes).
	CacheDir   string
	CacheBytes int64
	// CacheMinFree is free space on the peer cache's file system that the
	// cache leaves to others (the node sets its mount's reserve): it
	// stores a chunk only while this much stays free after it, evicting
	// its least recently used chunks first, and evicts when the free space
	// falls below it (cache.go). Zero: the budget alone bounds the cache.
	CacheMinFree units.SizeOrPercent
	// CacheClaimed, when set, returns bytes of the cache's file system
	// that others have set aside and not written yet (the mount's pending
	// commits, fs.FS.SpaceClaimed): the cache leaves them free too, above
	// CacheMinFree, so its writers never take the room a write through
	// the mount was promised.
	CacheClaimed func() int64
	// NoRelay: ask the holders directly, never a chunk's relay (tests and
	// benchmarks compare the two).
	NoRelay bool
	// HandshakeTimeout: a data plane connection that has not completed
	// its handshake by then is closed (default DefaultHandshakeTimeout).
	// IdleTimeout: one idle that long is closed (default
	// DefaultIdleTimeout; server.go). Tests set them shorter.
	HandshakeTimeout time.Duration
	IdleTimeout      time.Duration
	// GossipLog passes every line of serf and memberlist to Logger (at
	// Info), not only their warnings and errors: which member learned of
	// which join, state exchanges, probes. For diagnosis.
	GossipLog bool
}

// Tag names (serf tags hold at most 512 bytes in all: only small facts).
const (
	tagRole = "role"
	// Roles: a node stores its share of the chunks; a reader owns none.
	roleNode    = "node"
	roleReader  = "reader"
	tagData     = "dp"  // data plane address; host empty: the gossip host
	tagCapacity = "cap" // bytes offered
	tagZone     = "zone"
	tagVersion  = "ver"
	tagNS       = "ns" // namespace root id (hex)
	// tagPlane is the data plane's mode: planeTLS or planePlain. Members
	// of one cluster must agree (mergeCheck); a member without the tag
	// is taken as TLS, the default.
	tagPlane   = "plane"
	planeTLS   = "tls"
	planePlain = "plaintext"
)

// Node is this process's membership in a cluster: gossip, the data plane
// and the fetcher. Create it with New (before the store opens, since the
// store takes its Fetcher), then Start it with the open store.
type Node struct {
	cfg Config
	log *slog.Logger
	sec security

	s      *chunkstore.Store
	serf   *serf.Serf
	events chan serf.Event
	srv    *server
	dataLn net.Listener
	self   string
	// onNS is called after a merge changed the local namespace.
	onNS func()

	mu       sync.Mutex
	pools    map[string]*pool  // by data plane address
	stats    map[string]*Stats // by member name
	seen     map[string]time.Time
	nsMerged map[string]string // member -> the root of theirs merged last
	nsTag    string
	tagMu    sync.Mutex // setTag
	lease    leases     // GC leases, here and seen (lease.go)
	// memberChanged is when a member last joined, left or failed here.
	memberChanged time.Time

	nsKick chan struct{}
	place  placement
	cache  *peerCache // nil: none
	relay  relayState
	pick   sync.Mutex // pickHolder: order and count in flight in one step
	// intoFlights: the FetchIntos in progress here, one per chunk
	// (fetch.go); intoShared counts those served from another's.
	intoMu      sync.Mutex
	intoFlights map[chunkstore.ID]*intoFlight
	intoShared  atomic.Int64
	// roomFreed: peer cache bytes evicted for writes through the mount
	// and not yet logged; roomLogged: when they last were (FreePeerCache).
	roomFreed, roomLogged atomic.Int64
	// stripes: the stripes this node knows chunks of; stripeReads counts
	// chunks rebuilt from them (stripestore.go).
	stripes     stripeIndex
	stripeReads atomic.Int64
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	started     atomic.Bool
}

// Stats counts what one member did for or to this node.
type Stats struct {
	Fetched      atomic.Int64 // chunks fetched from the member
	FetchedBytes atomic.Int64
	BadChunks    atomic.Int64 // chunks that failed their hash
	Errors       atomic.Int64 // requests that failed (connection, error answer)
	Served       atomic.Int64 // chunks this node served (own stats only)
	ServedBytes  atomic.Int64
	// ServedPackBytes: of ServedBytes, those read from this node's packs
	// (it holds the chunk), not from a cache.
	ServedPackBytes atomic.Int64
	// weight: the member's measured throughput (weights.go).
	weight weight
}

func (s *Stats) served(n int64) { s.Served.Add(1); s.ServedBytes.Add(n) }

// New prepares a node; nothing listens until Start.
func New(cfg Config) (*Node, error) {
	if cfg.Listen == "" {
		return nil, errors.New("cluster: no gossip address (--listen HOST:PORT)")
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("cluster: --listen %s: %w", cfg.Listen, err)
	}
	if cfg.Name == "" {
		h, _ := os.Hostname()
		cfg.Name = h + "@" + cfg.Listen
	}
	// serf rejoins a failed member by NAME/ADDRESS, which memberlist cuts
	// at the first '/': a name with one would never be rejoined.
	if strings.Contains(cfg.Name, "/") {
		return nil, fmt.Errorf("cluster: member name %q contains '/': gossip could not rejoin it after a failure; choose another --node-name", cfg.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = DefaultReplicas
	}
	if cfg.RepairRate == 0 {
		cfg.RepairRate = DefaultRepairRate
	}
	if cfg.FailureGrace == 0 {
		cfg.FailureGrace = DefaultFailureGrace
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 30 * time.Second
	}
	sec, err := newSecurity(cfg.Key, cfg.Plaintext)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger, sec: sec, self: cfg.Name,
		pools: map[string]*pool{}, stats: map[string]*Stats{}, seen: map[string]time.Time{},
		nsMerged: map[string]string{}, nsKick: make(chan struct{}, 1), place: placement{kick: make(chan struct{}, 1)}}
	if cfg.CacheDir != "" {
		if cfg.CacheBytes <= 0 {
			cfg.CacheBytes = DefaultCacheBytes
		}
		if n.cache, err = openPeerCache(cfg.CacheDir, cfg.CacheBytes, cfg.CacheMinFree, cfg.CacheClaimed); err != nil {
			return nil, err
		}
		n.cfg = cfg
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.place.limit = pace.New(cfg.RepairRate)
	n.place.stats.RepairRate, n.place.stats.FailureGrace = n.place.limit.Rate(), max(cfg.FailureGrace, 0)
	return n, nil
}

// Start listens (data plane, then gossip), joins cfg.Join and starts
// spreading and merging namespaces; onNamespaceChange (may be nil) is
// called after a merge changed the local namespace (the mount refreshes
// what it shows). A join that reaches no member fails (the usual cause is a
// different cluster key).
func (n *Node) Start(s *chunkstore.Store, onNamespaceChange func()) error {
	n.s, n.onNS = s, onNamespaceChange
	host, _, _ := net.SplitHostPort(n.cfg.Listen)
	dl := n.cfg.DataListen
	if dl == "" {
		dl = net.JoinHostPort(host, "0")
	}
	ln, err := net.Listen("tcp", dl)
	if err != nil {
		return fmt.Errorf("cluster: data plane listen %s: %w", dl, err)
	}
	n.dataLn = ln
	if n.cfg.ServeRate > 0 || n.cfg.ServeDelay > 0 {
		ln = &slowListener{Listener: ln, rate: float64(n.cfg.ServeRate), delay: n.cfg.ServeDelay}
	}
	n.srv = newServer(s, ln, n.sec, n.log, n.statsFor(n.self), n.cfg.CorruptServed, n.countReceived, n.ownsFn,
		serverLimits{handshake: n.cfg.HandshakeTimeout, idle: n.cfg.IdleTimeout})
	n.srv.swarm.Store(&swarmHooks{cache: n.cache, relay: n.serveRelay})
	dpTag := ln.Addr().String()
	if h, p, _ := net.SplitHostPort(dpTag); net.ParseIP(h).IsUnspecified() {
		dpTag = ":" + p // peers use the gossip address's host
	}
	root, _, err := s.Root()
	if err != nil {
		n.srv.close()
		return err
	}
	n.nsTag = root.String()
	conf := serf.DefaultConfig()
	conf.NodeName = n.self
	role := roleNode
	if n.cfg.Reader {
		role = roleReader
	}
	conf.Tags = map[string]string{tagRole: role, tagData: dpTag, tagCapacity: strconv.FormatInt(n.cfg.Capacity, 10),
		tagVersion: n.cfg.Version, tagNS: n.nsTag}
	if n.cfg.Zone != "" {
		conf.Tags[tagZone] = n.cfg.Zone
	}
	plane := planeTLS
	if n.cfg.Plaintext {
		plane = planePlain
	}
	conf.Tags[tagPlane] = plane
	conf.Merge = mergeCheck{self: n.self, plane: plane, log: n.log}
	lw := &logWriter{log: n.log, all: n.cfg.GossipLog}
	conf.Logger = log.New(lw, "", 0)
	ml := memberlist.DefaultLANConfig()
	ml.Logger = conf.Logger
	ml.Name = n.self
	gh, gp, _ := net.SplitHostPort(n.cfg.Listen)
	ml.BindAddr = gh
	ml.BindPort, _ = strconv.Atoi(gp)
	ml.Keyring, err = memberlist.NewKeyring(nil, n.cfg.Key.gossipKey())
	if err != nil {
		n.srv.close()
		return fmt.Errorf("cluster: gossip keyring: %w", err)
	}
	ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	conf.MemberlistConfig = ml
	if n.cfg.LeaveDelay != 0 {
		conf.LeavePropagateDelay = max(n.cfg.LeaveDelay, 0)
	}
	if testGossip != nil {
		testGossip(conf)
	}
	n.events = make(chan serf.Event, 256)
	conf.EventCh = n.events
	n.serf, err = serf.Create(conf)
	if err != nil {
		n.srv.close()
		return fmt.Errorf("cluster: gossip on %s: %w", n.cfg.Listen, err)
	}
	n.started.Store(true)
	n.wg.Add(3)
	go n.eventLoop()
	go n.watchRoot()
	go n.nsLoop()
	if !n.cfg.NoPlacement {
		n.wg.Add(1)
		go n.placeLoop()
	}
	if len(n.cfg.Join) > 0 {
		if err := n.joinAtStart(); err != nil {
			n.Close()
			return fmt.Errorf("cluster: join %s: %w (every member must use the same cluster key and --data-plane)", strings.Join(n.cfg.Join, ","), err)
		}
	}
	// The join brought the members' tags: from now on GC knows the leases.
	n.watchLeases()
	n.lease.mu.Lock()
	n.lease.watched = true
	n.lease.mu.Unlock()
	s.SetReceivedHold(n.receivedHold)
	s.SetBeforeGC(n.mergeBeforeGC)
	n.log.Info("cluster: member", "name", n.self, "gossip", n.cfg.Listen, "data_plane", ln.Addr().String(),
		"members", n.serf.NumNodes(), "replicas", n.cfg.Replicas)
	return nil
}

// JoinRetryFor is how long a member starting with --join keeps trying
// the members it names before it gives up: members of a cluster are often
// started at once (a DaemonSet, a script), and the one named may not
// listen yet. Consul's retry_join does the same.
const JoinRetryFor = 30 * time.Second

// joinAtStart joins cfg.Join, trying again (every 250 ms, then up to 2 s
// apart) while every member named refuses the connection (not listening
// yet), until JoinRetryFor has passed. Any other failure (another cluster
// key, another data plane) is final at once. memberlist words the dial
// error with %v, so the refusal is known by its text only.
func (n *Node) joinAtStart() error {
	deadline := time.Now().Add(JoinRetryFor)
	wait := 250 * time.Millisecond
	for {
		_, err := n.serf.Join(n.cfg.Join, true)
		if err == nil || !strings.Contains(err.Error(), "connection refused") || time.Now().Add(wait).After(deadline) {
			return err
		}
		n.log.Info("cluster: no member to join answered yet; trying again", "join", strings.Join(n.cfg.Join, ","), "in", wait, "err", err)
		time.Sleep(wait)
		wait = min(2*wait, 2*time.Second)
	}
}

// Join joins the members at addrs (their gossip addresses) after Start:
// two clusters, or the two sides of a partition, become one and their
// namespaces merge.
func (n *Node) Join(addrs []string) error {
	if _, err := n.serf.Join(addrs, true); err != nil {
		return fmt.Errorf("cluster: join %s: %w (every member must use the same cluster key and --data-plane)", strings.Join(addrs, ","), err)
	}
	return nil
}

// testGossip, when set (by this package's tests only), adjusts the
// gossip configuration of every node started: a graceful leave waits for
// serf's LeavePropagateDelay (1 s) and its broadcast, about 2 s a member,
// most of a cluster test's time.
var testGossip func(*serf.Config)

// Close leaves the cluster and stops serving.
func (n *Node) Close() error { return n.close(true) }

// close stops serving; leave announces it first (without, the others
// find the member failed: a crash, for tests).
func (n *Node) close(leave bool) error {
	if !n.started.Swap(false) {
		return nil
	}
	if leave {
		n.serf.Leave()
	}
	n.s.SetReceivedHold(nil) // the grace alone, as on a single node
	n.s.SetBeforeGC(nil)
	n.serf.Shutdown()
	n.cancel()
	n.srv.close()
	n.wg.Wait()
	n.cache.close() // what loads fetched, queued to be kept, is written first
	n.mu.Lock()
	for _, p := range n.pools {
		p.close()
	}
	n.mu.Unlock()
	return nil
}

// Running reports whether the member has started (Start) and not
// closed: its membership can be asked.
func (n *Node) Running() bool { return n.started.Load() }

// Name is this member's name.
func (n *Node) Name() string { return n.self }

// DataAddr is the data plane's listening address.
func (n *Node) DataAddr() string { return n.dataLn.Addr().String() }

func (n *Node) statsFor(name string) *Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.stats[name]
	if !ok {
		s = &Stats{}
		n.stats[name] = s
	}
	return s
}

// eventLoop records when members were last seen changing state and asks
// for a namespace merge when a member's namespace root moved.
func (n *Node) eventLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case ev := <-n.events:
			me, ok := ev.(serf.MemberEvent)
			if !ok {
				continue
			}
			n.mu.Lock()
			for _, m := range me.Members {
				n.seen[m.Name] = time.Now()
			}
			if me.Type != serf.EventMemberUpdate {
				n.memberChanged = time.Now() // rebalance waits for it to settle
			}
			n.mu.Unlock()
			n.log.Info("cluster", "event", me.Type.String(), "members", memberNames(me.Members))
			n.kickNS()
			n.kickPlace()
		}
	}
}

func memberNames(ms []serf.Member) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Name)
	}
	return strings.Join(s, ",")
}

// Member is one member as `kylix peers` shows it.
type Member struct {
	Name     string    `json:"name"`
	Self     bool      `json:"self"`
	Addr     string    `json:"addr"`      // gossip address
	DataAddr string    `json:"data_addr"` // data plane address
	State    string    `json:"state"`     // alive, leaving, left, failed
	Capacity int64     `json:"capacity_bytes"`
	Zone     string    `json:"zone,omitempty"`
	Role     string    `json:"role"`       // node, or reader (owns no chunks)
	Plane    string    `json:"data_plane"` // tls or plaintext (every member alike)
	Version  string    `json:"version,omitempty"`
	LastSeen time.Time `json:"last_seen"` // now for alive members; else when its state last changed
	// NSRoot is the member's namespace root.
	NSRoot string `json:"namespace_root"`
	// Counters of this node's exchanges with the member.
	Fetched      int64 `json:"chunks_fetched"`
	FetchedBytes int64 `json:"bytes_fetched"`
	BadChunks    int64 `json:"bad_chunks"`
	Errors       int64 `json:"errors"`
	Served       int64 `json:"chunks_served,omitempty"` // self only
	ServedBytes  int64 `json:"bytes_served,omitempty"`  // self only
	// ServedPackBytes: of ServedBytes, those from this node's packs.
	ServedPackBytes int64 `json:"bytes_served_from_packs,omitempty"` // self only
	// Throughput: the member's measured fetch throughput (weights.go).
	Throughput Throughput `json:"throughput"`
}

// Members lists the cluster as this node sees it, by name.
func (n *Node) Members() []Member {
	var out []Member
	now := time.Now()
	for _, m := range n.serf.Members() {
		mm := Member{Name: m.Name, Self: m.Name == n.self, Addr: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))),
			DataAddr: dataAddr(m), State: m.Status.String(), Capacity: parseCap(m.Tags[tagCapacity]), Zone: m.Tags[tagZone], Role: m.Tags[tagRole], Plane: m.Tags[tagPlane], Version: m.Tags[tagVersion], NSRoot: m.Tags[tagNS]}
		if mm.Plane == "" {
			mm.Plane = planeTLS
		}
		n.mu.Lock()
		mm.LastSeen = n.seen[m.Name]
		n.mu.Unlock()
		if m.Status == serf.StatusAlive {
			mm.LastSeen = now
		}
		st := n.statsFor(m.Name)
		mm.Fetched, mm.FetchedBytes, mm.BadChunks, mm.Errors = st.Fetched.Load(), st.FetchedBytes.Load(), st.BadChunks.Load(), st.Errors.Load()
		mm.Served, mm.ServedBytes, mm.ServedPackBytes = st.Served.Load(), st.ServedBytes.Load(), st.ServedPackBytes.Load()
		mm.Throughput = st.weight.throughput()
		out = append(out, mm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func parseCap(s string) int64 {
	c, _ := strconv.ParseInt(s, 10, 64)
	return c
}

// dataAddr is a member's data plane address.
func dataAddr(m serf.Member) string {
	dp := m.Tags[tagData]
	h, p, err := net.SplitHostPort(dp)
	if err != nil {
		return ""
	}
	if h == "" {
		h = m.Addr.String()
	}
	return net.JoinHostPort(h, p)
}

// peer is a live member other than this node, as the fetcher uses it.
type peer struct {
	name     string
	addr     string
	capacity int64
	zone     string
	reader   bool // owns no chunks (Config.Reader)
}

// peerOf is what placement and fetching need of a serf member.
func peerOf(m serf.Member) peer {
	return peer{name: m.Name, addr: dataAddr(m), capacity: parseCap(m.Tags[tagCapacity]), zone: m.Tags[tagZone],
		reader: m.Tags[tagRole] == roleReader}
}

// livePeers lists the alive members other than this node that have a data
// plane.
func (n *Node) livePeers() []peer {
	var ps []peer
	for _, m := range n.serf.Members() {
		if m.Name == n.self || m.Status != serf.StatusAlive {
			continue
		}
		a := dataAddr(m)
		if a == "" {
			continue
		}
		p := peerOf(m)
		p.addr = a
		ps = append(ps, p)
	}
	return ps
}

func (n *Node) poolFor(addr string) *pool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pools[addr]
	if !ok {
		p = &pool{addr: addr, sec: n.sec, idle: n.cfg.IdleTimeout}
		n.pools[addr] = p
	}
	return p
}

// request asks one peer for something and returns its answer's bytes;
// (nil, nil) means the peer does not hold it.
func (n *Node) request(ctx context.Context, p peer, rq request, max uint32) ([]byte, error) {
	pl := n.poolFor(p.addr)
	cc, err := pl.get(ctx)
	if err != nil {
		return nil, err
	}
	st, data, err := cc.roundTrip(ctx, rq, max)
	if err != nil && ctx.Err() == nil && cc.dead() && !errors.Is(err, errProtocol) {
		// A connection that broke (the peer restarted, or closed an idle
		// connection) is dialed again, once.
		if cc, err = pl.get(ctx); err == nil {
			st, data, err = cc.roundTrip(ctx, rq, max)
		}
	}
	switch {
	case err != nil:
		return nil, err
	case st == stNotFound:
		return nil, nil
	case st == stError:
		return nil, fmt.Errorf("member %s: %s", p.name, data)
	}
	return data, nil
}

// logWriter passes serf's and memberlist's warnings and errors to the
// node's log; their debug and info lines are dropped unless all is set
// (Config.GossipLog).
type logWriter struct {
	log *slog.Logger
	all bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	switch {
	case strings.Contains(line, "[ERR]"):
		w.log.Error("gossip: " + line)
	case strings.Contains(line, "[WARN]"):
		w.log.Warn("gossip: " + line)
	case w.all:
		w.log.Info("gossip: " + line)
	}
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

// mergeCheck refuses members whose data plane is not this member's: a TLS
// member and a plaintext one cannot exchange a chunk, so letting them into
// one cluster would make its files visible everywhere and readable only
// on some members. serf asks it when a join merges two member lists and
// when it hears of a new member, on both sides: the joining member's
// join fails with the reason, and the cluster never lists it.
type mergeCheck struct {
	self, plane string
	log         *slog.Logger
}

func (c mergeCheck) NotifyMerge(ms []*serf.Member) error {
	for _, m := range ms {
		if m.Name == c.self {
			continue
		}
		plane := m.Tags[tagPlane]
		if plane == "" {
			plane = planeTLS
		}
		if plane != c.plane {
			err := fmt.Errorf("member %s uses the %s data plane and this member %s: every member of a cluster must use the same --data-plane", m.Name, plane, c.plane)
			c.log.Error("cluster: member refused", "member", m.Name, "err", err)
			return err
		}
	}
	return nil
}
