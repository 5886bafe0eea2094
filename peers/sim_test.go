package peers

import (
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"

	"github.com/kylix/kylix/chunkstore"
)

// Membership simulated in process (issue 9, deliverable 8; results in
// docs/bench.md, "Peers: membership convergence and repair time").
//
// What runs: real serf v0.10.2 on real memberlist v0.5.4, one serf per
// member, configured as Node.Start configures them (serf.DefaultConfig,
// memberlist.DefaultLANConfig, the gossip keyring with both verifications
// on, the same tags), except that memberlist's transport is simNet
// (simnet_test.go), an in-memory network, compression is off, members are
// named host-0001... (no "/": design/peers.md, Membership), and the whole
// cluster runs in a testing/synctest bubble: time is virtual. It advances
// only when every goroutine of every member is blocked, so the timings
// are memberlist's protocol timings (probe every 1 s, gossip every 200 ms
// to 3 members, suspicion, push-pull every 30 s scaled by cluster size)
// with zero CPU time and zero network latency, whatever the load of this
// machine. What is not simulated: latency, bandwidth, CPU time per
// message, clock skew, correlated loss (packets are lost independently at
// random with the loss fraction; a partition cuts all traffic between two
// sides).

// simCluster is N serf members on one simNet.
type simCluster struct {
	tb     testing.TB
	net    *simNet
	rng    *rand.Rand
	stop   chan struct{}
	wg     sync.WaitGroup
	serial int

	mu         sync.Mutex
	alive      []*simMember // not killed
	killed     map[string]bool
	falseFails int // failed events about members not killed
	w          *simWatch
}

type simMember struct {
	name string
	serf *serf.Serf
	tr   *simTransport
}

// simWatch waits until every member in want has had an event of type typ
// about member target.
type simWatch struct {
	target string
	typ    serf.EventType
	start  time.Time
	want   map[string]bool
	seen   []time.Duration
	done   chan struct{}
}

var simKey = []byte("kylix membership simulation key!") // 32 bytes

func newSimCluster(tb testing.TB, loss float64, seed uint64) *simCluster {
	return &simCluster{tb: tb, net: newSimNet(loss, seed), rng: rand.New(rand.NewPCG(seed, 2)),
		stop: make(chan struct{}), killed: map[string]bool{}}
}

// add starts a member and, unless it is the first, joins it to a random
// alive member (ignoring old events, as Node.Start does); before is called
// with its name first.
func (c *simCluster) add(before func(name string)) *simMember {
	c.serial++
	tr := c.net.newTransport()
	name := fmt.Sprintf("host-%04d", c.serial)
	if before != nil {
		before(name)
	}
	discard := log.New(io.Discard, "", 0)
	conf := serf.DefaultConfig()
	conf.NodeName = name
	conf.Tags = map[string]string{tagRole: "node", tagData: ":40001", tagCapacity: "1000000000000",
		tagVersion: "sim", tagNS: strings.Repeat("ab", 32)}
	conf.Logger = discard
	ml := memberlist.DefaultLANConfig()
	ml.Logger = discard
	ml.Name = name
	ml.Transport = tr
	var err error
	ml.Keyring, err = memberlist.NewKeyring(nil, simKey)
	if err != nil {
		c.tb.Fatal(err)
	}
	ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	// Compression (LZW of every packet and state exchange) only changes
	// byte counts, not which messages a packet carries, so not the timing;
	// off, it saves most of the simulation's allocations.
	ml.EnableCompression = false
	conf.MemberlistConfig = ml
	events := make(chan serf.Event, 256)
	conf.EventCh = events
	s, err := serf.Create(conf)
	if err != nil {
		c.tb.Fatalf("serf member %d: %v", c.serial, err)
	}
	m := &simMember{name: name, serf: s, tr: tr}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			select {
			case <-c.stop:
				return
			case e := <-events:
				c.event(name, e)
			}
		}
	}()
	c.mu.Lock()
	var seed *simMember
	if len(c.alive) > 0 {
		seed = c.alive[c.rng.IntN(len(c.alive))]
	}
	c.alive = append(c.alive, m)
	c.mu.Unlock()
	if seed != nil {
		if _, err := s.Join([]string{seed.tr.addr}, true); err != nil {
			c.tb.Fatalf("member %s joins %s: %v", name, seed.name, err)
		}
	}
	return m
}

func (c *simCluster) event(self string, e serf.Event) {
	me, ok := e.(serf.MemberEvent)
	if !ok {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range me.Members {
		if me.Type == serf.EventMemberFailed && !c.killed[m.Name] {
			c.falseFails++
		}
		w := c.w
		if w == nil || w.target != m.Name || w.typ != me.Type || !w.want[self] {
			continue
		}
		delete(w.want, self)
		w.seen = append(w.seen, now.Sub(w.start))
		if len(w.want) == 0 {
			close(w.done)
		}
	}
}

// watch starts waiting for every alive member but skip to see an event
// of type typ about target.
func (c *simCluster) watch(target string, typ serf.EventType, skip string) *simWatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := &simWatch{target: target, typ: typ, start: time.Now(), want: map[string]bool{}, done: make(chan struct{})}
	for _, m := range c.alive {
		if m.name != skip && m.name != target {
			w.want[m.name] = true
		}
	}
	c.w = w
	return w
}

// wait waits for w up to limit of virtual time: the time until the last
// member saw the event, and the median over members.
func (c *simCluster) wait(w *simWatch, limit time.Duration) (last, median time.Duration, ok bool) {
	select {
	case <-w.done:
	case <-time.After(limit):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w = nil
	if len(w.want) > 0 {
		return 0, 0, false
	}
	return slices.Max(w.seen), simMedian(w.seen), true
}

// converge waits (virtual time, polling each second) until every alive
// member counts n alive members in memberlist.
func (c *simCluster) converge(n int, limit time.Duration) bool {
	start, up0 := time.Now(), simUptime()
	for i := 0; time.Since(start) < limit; i++ {
		done := 0
		c.mu.Lock()
		for _, m := range c.alive {
			if m.serf.Memberlist().NumMembers() == n {
				done++
			}
		}
		all := done == len(c.alive)
		c.mu.Unlock()
		if all {
			return true
		}
		if i%10 == 9 && testing.Verbose() {
			c.tb.Logf("  %d of %d members count %d alive after %v virtual (%v wall)", done, len(c.alive), n,
				time.Since(start), (simUptime() - up0).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	return false
}

// kill stops a random member without leaving (a kill -9).
func (c *simCluster) kill() *simMember {
	c.mu.Lock()
	i := c.rng.IntN(len(c.alive))
	m := c.alive[i]
	c.alive = slices.Delete(c.alive, i, i+1)
	c.killed[m.name] = true
	c.mu.Unlock()
	return m
}

func (c *simCluster) close() {
	c.mu.Lock()
	ms := slices.Clone(c.alive)
	c.mu.Unlock()
	for _, m := range ms {
		m.serf.Shutdown()
	}
	close(c.stop)
	c.wg.Wait()
	// Probes, indirect probes and stream handlers under way end at their
	// time limits (at most memberlist's 10 s TCP timeout); the bubble's
	// clock stops once its main goroutine returns, so wait for them here.
	time.Sleep(time.Minute)
}

// simUptime is the machine's uptime (/proc/uptime): wall time, which
// the bubble's clock is not; progress logs only.
func simUptime() time.Duration {
	b, _ := os.ReadFile("/proc/uptime")
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return time.Duration(f * float64(time.Second))
}

func simMedian(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// simResult is one size's figures: per trial, the time until the last
// member saw the join (or the failure), and the median member.
type simResult struct {
	n, trials                 int
	loss                      float64
	joinLast, joinMedian      []time.Duration
	failLast, failFirst       []time.Duration
	failMedian                []time.Duration
	falseFails                int
	packets, lost, overflowed int64
	build                     time.Duration // virtual time until the first convergence
	wall                      time.Duration
}

// Bounds on one trial, virtual time: a join is seen at the latest at a
// push-pull (30 s, times 6 at 1000 members); a failure after at most the
// longest suspicion timeout (6 x 4 x log10(N) probe intervals) and the
// probes before it.
const (
	simJoinLimit = 240 * time.Second
	simFailLimit = 120 * time.Second
)

// runSim builds an n-member cluster and runs trials of (join one member,
// wait until all saw it alive; kill one member, wait until all marked it
// failed), in a synctest bubble.
func runSim(t *testing.T, n, trials int, loss float64) (r simResult) {
	r = simResult{n: n, trials: trials, loss: loss}
	wall, up0 := time.Now(), simUptime()
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, loss, uint64(n)*1000+uint64(loss*100))
		defer c.close()
		start := time.Now()
		for range n {
			c.add(nil)
		}
		if !c.converge(n, 10*time.Minute) {
			t.Fatalf("%d members: not every member saw all %d within 10 min (virtual)", n, n)
		}
		r.build = time.Since(start)
		if testing.Verbose() {
			t.Logf("N=%d loss %v: all members see all after %v virtual (%v since the start, wall)", n, loss, r.build, (simUptime() - up0).Round(time.Second))
		}
		// Let the join broadcasts of the build finish before the trials.
		time.Sleep(30 * time.Second)
		for i := range trials {
			// Join: a new member joins a random one.
			var w *simWatch
			m := c.add(func(name string) { w = c.watch(name, serf.EventMemberJoin, "") })
			last, med, ok := c.wait(w, simJoinLimit)
			if !ok {
				t.Fatalf("%d members, trial %d: %d members did not see %s join within %v", n, i, len(w.want), m.name, simJoinLimit)
			}
			r.joinLast = append(r.joinLast, last)
			r.joinMedian = append(r.joinMedian, med)
			time.Sleep(10 * time.Second)
			// Failure: a random member stops without leaving.
			k := c.kill()
			w = c.watch(k.name, serf.EventMemberFailed, "")
			k.serf.Shutdown()
			last, med, ok = c.wait(w, simFailLimit)
			if !ok {
				t.Fatalf("%d members, trial %d: %d members did not mark %s failed within %v", n, i, len(w.want), k.name, simFailLimit)
			}
			r.failLast = append(r.failLast, last)
			r.failMedian = append(r.failMedian, med)
			r.failFirst = append(r.failFirst, slices.Min(w.seen))
			if testing.Verbose() {
				t.Logf("N=%d loss %v, trial %d: join seen by all after %v, failure after %v (%v wall)", n, loss, i, r.joinLast[i], last, (simUptime() - up0).Round(time.Second))
			}
			time.Sleep(10 * time.Second)
		}
		c.mu.Lock()
		r.falseFails = c.falseFails
		c.mu.Unlock()
		r.packets, r.lost, r.overflowed = c.net.packets.Load(), c.net.lost.Load(), c.net.overflow.Load()
	})
	r.wall = time.Since(wall)
	return r
}

func (r simResult) String() string {
	return fmt.Sprintf("N=%d loss=%.0f%% trials=%d: join seen by all %v (median member %v); "+
		"failure marked by all %v (first %v, median member %v); false failures %d; packets %d lost %d overflowed %d; "+
		"build %v virtual; wall %v",
		r.n, r.loss*100, r.trials, simMedian(r.joinLast), simMedian(r.joinMedian),
		simMedian(r.failLast), simMedian(r.failFirst), simMedian(r.failMedian), r.falseFails,
		r.packets, r.lost, r.overflowed, r.build.Round(time.Second), r.wall.Round(time.Second))
}

// TestSimMembership: 10 members on the in-memory network, real serf in
// virtual time. Every member sees a join within a second (gossip, not the
// 30 s push-pull) in the median trial, and marks a killed member failed
// within memberlist's bounds (suspicion at least 4 x log10(N) probe
// intervals, at most 6 times that).
func TestSimMembership(t *testing.T) {
	r := runSim(t, 10, 5, 0)
	t.Log(r)
	if j := simMedian(r.joinLast); j > time.Second {
		t.Errorf("median join convergence %v, want at most 1 s (gossip)", j)
	}
	for i, f := range r.failLast {
		if f < 4*time.Second || f > 30*time.Second {
			t.Errorf("trial %d: failure seen by all after %v, want between 4 s (suspicion minimum) and 30 s", i, f)
		}
	}
	if r.falseFails > 0 {
		t.Errorf("%d members marked failed that were not killed", r.falseFails)
	}
}

// TestSimPartitionHeals: 10 members are cut 5 | 5 until each side has
// marked the other failed, then the network heals. Nothing else happens:
// serf's reconnect (every 30 s it joins a random failed member) must join
// the sides again, so that every member counts all 10 alive within two
// minutes (virtual).
func TestSimPartitionHeals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, 0, 7)
		defer c.close()
		for range 10 {
			c.add(nil)
		}
		if !c.converge(10, time.Minute) {
			t.Fatal("10 members: not every member saw all 10 within a minute")
		}
		var side []string
		for _, m := range c.alive[:5] {
			side = append(side, m.tr.addr)
		}
		c.net.partition(side)
		cut := time.Now()
		if !c.converge(5, 2*time.Minute) {
			t.Fatal("partitioned: the sides did not mark each other failed within 2 minutes")
		}
		split := time.Since(cut)
		c.net.partition(nil)
		healed := time.Now()
		if !c.converge(10, 2*time.Minute) {
			t.Fatal("healed: the sides did not join again within 2 minutes")
		}
		t.Logf("partition seen by all (each side counts 5) after %v; after healing, all count 10 after %v (virtual; polled each second)",
			split, time.Since(healed))
	})
}

// TestSimMembershipScale (KYLIX_SIM=1): the same at 10, 100 and 1000
// members (KYLIX_SIM_SIZES=10,100 to choose), with no loss and with 10 %
// of packets lost (KYLIX_SIM_LOSS=0,0.1), KYLIX_SIM_TRIALS trials (5).
func TestSimMembershipScale(t *testing.T) {
	if os.Getenv("KYLIX_SIM") != "1" {
		t.Skip("KYLIX_SIM=1 runs the membership simulation at 10, 100 and 1000 members")
	}
	sizes := simInts(os.Getenv("KYLIX_SIM_SIZES"), "10,100,1000")
	trials := simInts(os.Getenv("KYLIX_SIM_TRIALS"), "5")[0]
	var losses []float64
	for _, s := range strings.Split(cmpOr(os.Getenv("KYLIX_SIM_LOSS"), "0,0.1"), ",") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, f)
	}
	for _, n := range sizes {
		for _, loss := range losses {
			r := runSim(t, n, trials, loss)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			t.Logf("%v; heap sys %d MiB", r, ms.HeapSys>>20)
			t.Logf("  join, all members, per trial: %v", r.joinLast)
			t.Logf("  failure, all members, per trial: %v", r.failLast)
			if simMedian(r.joinLast) > 30*time.Second {
				t.Errorf("N=%d loss %v: median join convergence %v, over a push-pull interval", n, loss, simMedian(r.joinLast))
			}
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func simInts(s, def string) []int {
	var out []int
	for _, f := range strings.Split(cmpOr(s, def), ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			panic(fmt.Sprintf("bad number %q", f))
		}
		out = append(out, v)
	}
	return out
}

// Repair and join, modelled with the real placement code (issue 9,
// deliverable 8; docs/bench.md).
//
// What is computed: a data set of equal 1 MiB chunks (the store's CDC
// average), random chunk ids, N members of equal capacity without zones,
// R = 2. For every chunk of the data set, whether member f (the one that
// fails) or member j (the one that joins) is among its owners: f's (or
// j's) score against the others', stopping at the second member that
// beats it; where it is an owner, owners() before and after, and relayFor
// (fetch.go, relay.go) give who holds the surviving copy (source), who
// becomes the new owner and pulls (destination), and the relay the pull
// goes through (Node.Fetch asks a chunk's relay first; the relay fetches
// from the holder). Every 1024th other chunk is checked to keep its
// owners. Not modelled: disks, network bandwidth and latency (only the
// repair rate limit, per pulling member), the namespace walk before each
// pass, the peer cache (a relay holding the chunk already), and members
// that see the membership at different times.

type repairModel struct {
	n, r    int
	chunks  int64   // sampled
	scale   float64 // chunks of the data set per chunk sampled
	failed  string
	under   int64            // chunks f owned: under R once it is gone
	dst     map[string]int64 // new owners' pulls, chunks
	src     map[string]int64 // surviving holders' sends
	relay   map[string]int64 // relays' sends
	moved   int64            // chunks j owns after joining
	dropped map[string]int64 // owners that lose a chunk to j
	checked int64            // other chunks checked to keep their owners
}

// simChunkBytes is the chunk size of the model.
const simChunkBytes = 1 << 20

// simOwner reports whether x is among the r owners of id over x and
// others (no zones, as rank orders: higher score, then smaller name).
func simOwner(id chunkstore.ID, x peer, others []peer, r int) bool {
	sx := score(id, x.name, x.capacity)
	beats := 0
	for _, p := range others {
		if p.name == x.name {
			continue
		}
		s := score(id, p.name, p.capacity)
		if s > sx || (s == sx && p.name < x.name) {
			if beats++; beats >= r {
				return false
			}
		}
	}
	return true
}

func simNames(ps []peer) map[string]bool {
	m := map[string]bool{}
	for _, p := range ps {
		m[p.name] = true
	}
	return m
}

// runRepairModel samples chunks chunks of a data set of scale times as
// many.
func runRepairModel(t testing.TB, n int, chunks int64, scale float64, seed uint64) repairModel {
	const r = DefaultReplicas
	rng := rand.New(rand.NewPCG(seed, 3))
	mk := func(i int) peer {
		return peer{name: fmt.Sprintf("host-%04d", i), addr: fmt.Sprintf("10.0.%d.%d:40001", i>>8, i&255), capacity: 8 << 40}
	}
	all := make([]peer, n)
	for i := range all {
		all[i] = mk(i + 1)
	}
	fi := rng.IntN(n)
	f := all[fi]
	after := slices.Delete(slices.Clone(all), fi, fi+1)
	j := mk(n + 1)
	withJ := append(slices.Clone(all), j)
	relays := &Node{cfg: Config{Replicas: r}}
	m := repairModel{n: n, r: r, chunks: chunks, scale: scale, failed: f.name, dst: map[string]int64{}, src: map[string]int64{},
		relay: map[string]int64{}, dropped: map[string]int64{}}
	var id chunkstore.ID
	for c := range chunks {
		for k := 0; k < len(id); k += 8 {
			binary.LittleEndian.PutUint64(id[k:], rng.Uint64())
		}
		fOwns := simOwner(id, f, all, r)
		jOwns := simOwner(id, j, all, r)
		if fOwns || jOwns || c%1024 == 0 {
			ob := simNames(owners(id, all, r))
			if fOwns != ob[f.name] {
				t.Fatalf("chunk %d: the model says %s owns it: %v, owners() says %v", c, f.name, fOwns, ob[f.name])
			}
			oa := owners(id, after, r)
			na := simNames(oa)
			if !fOwns {
				if !maps.Equal(ob, na) {
					t.Fatalf("chunk %d: owners %v before %s failed, %v after, though it did not own it", c, ob, f.name, na)
				}
			} else {
				var kept, added []string
				for _, p := range oa {
					if ob[p.name] {
						kept = append(kept, p.name)
					} else {
						added = append(added, p.name)
					}
				}
				if len(kept) != r-1 || len(added) != 1 {
					t.Fatalf("chunk %d: owners %v before, %v after %s failed: want %d kept and one new", c, ob, na, f.name, r-1)
				}
				m.under++
				m.dst[added[0]]++
				m.src[kept[0]]++
				if rl, ok := relays.relayFor(id, after); ok {
					m.relay[rl.name]++
				}
			}
			oj := simNames(owners(id, withJ, r))
			if jOwns != oj[j.name] {
				t.Fatalf("chunk %d: the model says %s owns it after joining: %v, owners() says %v", c, j.name, jOwns, oj[j.name])
			}
			if jOwns {
				m.moved++
				for name := range ob {
					if !oj[name] {
						m.dropped[name]++
					}
				}
			} else if !maps.Equal(ob, oj) {
				t.Fatalf("chunk %d: owners %v before %s joined, %v after, though it does not own it", c, ob, j.name, oj)
			}
			if !fOwns && !jOwns {
				m.checked++
			}
		}
	}
	return m
}

func simMaxMean(m map[string]int64, over int) (mx int64, mean float64) {
	var sum int64
	for _, v := range m {
		mx = max(mx, v)
		sum += v
	}
	return mx, float64(sum) / float64(over)
}

// pullSeconds is how long the busiest new owner pulls at the default
// repair rate.
func (m repairModel) pullSeconds() float64 {
	mx, _ := simMaxMean(m.dst, m.n-1)
	return float64(mx*simChunkBytes) * m.scale / DefaultRepairRate
}

func (m repairModel) String() string {
	gib := func(c int64) string {
		b := float64(c*simChunkBytes) * m.scale
		switch {
		case b >= 1<<40:
			return fmt.Sprintf("%.2f TiB", b/(1<<40))
		case b >= 1<<30:
			return fmt.Sprintf("%.1f GiB", b/(1<<30))
		}
		return fmt.Sprintf("%.0f MiB", b/(1<<20))
	}
	dmx, dmean := simMaxMean(m.dst, m.n-1)
	smx, _ := simMaxMean(m.src, m.n-1)
	rmx, _ := simMaxMean(m.relay, m.n-1)
	ddx, _ := simMaxMean(m.dropped, m.n)
	return fmt.Sprintf("N=%d, %s, %d chunks sampled: failure of %s leaves %d chunks (%.4f, R/N=%.4f) under R, %s; "+
		"new owners %d of %d survivors, pull per member mean %s max %s (%.1f s at %d MiB/s); max source %s, max relay %s. "+
		"Join: %d chunks (%.4f of chunks, R/(N+1)=%.4f; %.4f of replicas, 1/(N+1)=%.4f) move to the new member, %s (%.0f s at %d MiB/s), "+
		"max one old member drops %s. %d other chunks checked unchanged.",
		m.n, gib(m.chunks), m.chunks, m.failed, m.under, float64(m.under)/float64(m.chunks), float64(m.r)/float64(m.n), gib(m.under),
		len(m.dst), m.n-1, gib(int64(dmean)), gib(dmx), m.pullSeconds(), DefaultRepairRate>>20, gib(smx), gib(rmx),
		m.moved, float64(m.moved)/float64(m.chunks), float64(m.r)/float64(m.n+1),
		float64(m.moved)/float64(m.chunks)/float64(m.r), 1/float64(m.n+1), gib(m.moved),
		float64(m.moved*simChunkBytes)*m.scale/DefaultRepairRate, DefaultRepairRate>>20, gib(ddx), m.checked)
}

// checkRepairModel asserts what rendezvous placement promises: a failure
// puts R/N of the chunks under R and their new owners are spread over the
// survivors; a join moves R/(N+1) of the chunks (1/(N+1) of the replicas)
// to the new member, one replica of each from an old owner. Fractions
// within 5 standard deviations (binomial); the busiest new owner pulls at
// most 2.5 times the mean when the mean is 10 chunks or more (the ids are
// seeded, so the test gives the same figures every run).
func checkRepairModel(t testing.TB, m repairModel) {
	within := func(what string, got int64, p float64) {
		mean := p * float64(m.chunks)
		sd := math.Sqrt(mean * (1 - p))
		if math.Abs(float64(got)-mean) > 5*sd {
			t.Errorf("N=%d: %s: %d chunks, want %.0f ± %.0f (5 sd)", m.n, what, got, mean, 5*sd)
		}
	}
	within("under R after a failure", m.under, float64(m.r)/float64(m.n))
	within("moved to a joining member", m.moved, float64(m.r)/float64(m.n+1))
	var drops int64
	for _, v := range m.dropped {
		drops += v
	}
	if drops != m.moved {
		t.Errorf("N=%d: %d chunks moved to the new member but %d replicas dropped", m.n, m.moved, drops)
	}
	dmx, dmean := simMaxMean(m.dst, m.n-1)
	if dmean >= 10 && float64(dmx) > 2.5*dmean {
		t.Errorf("N=%d: the busiest new owner pulls %d chunks, mean %.1f: not spread", m.n, dmx, dmean)
	}
	if dmean >= 10 && len(m.dst) != m.n-1 {
		t.Errorf("N=%d: %d of %d survivors pull, want all", m.n, len(m.dst), m.n-1)
	}
}

// TestSimRepairModel: the model over 64 GiB (every chunk) at 10 and 100
// members.
func TestSimRepairModel(t *testing.T) {
	for _, n := range []int{10, 100} {
		m := runRepairModel(t, n, 64<<10, 1, uint64(n))
		t.Log(m)
		checkRepairModel(t, m)
	}
}

// TestSimRepairScale (KYLIX_SIM=1): the model for 10 TiB in 1 MiB chunks
// (KYLIX_SIM_TIB), sampled: KYLIX_SIM_SAMPLE_GIB of chunks (1024, one in
// ten), figures scaled to the data set, at 10, 100 and 1000 members
// (KYLIX_SIM_SIZES).
func TestSimRepairScale(t *testing.T) {
	if os.Getenv("KYLIX_SIM") != "1" {
		t.Skip("KYLIX_SIM=1 runs the repair model for 10 TiB at 10, 100 and 1000 members")
	}
	tib := simInts(os.Getenv("KYLIX_SIM_TIB"), "10")[0]
	sample := int64(simInts(os.Getenv("KYLIX_SIM_SAMPLE_GIB"), "1024")[0]) << 10
	scale := float64(int64(tib)<<20) / float64(sample)
	for _, n := range simInts(os.Getenv("KYLIX_SIM_SIZES"), "10,100,1000") {
		start := time.Now()
		m := runRepairModel(t, n, sample, scale, uint64(n))
		t.Logf("%v (%v)", m, time.Since(start).Round(time.Second))
		checkRepairModel(t, m)
	}
}
