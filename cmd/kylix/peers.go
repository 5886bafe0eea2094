package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
	"github.com/kylix/kylix/peers"
)

func init() {
	register(&command{name: "cluster-key", summary: "print a new cluster key (for serve --cluster-key FILE)", run: runClusterKey})
	register(&command{name: "peers", summary: "show the cluster's members as the running node sees them", run: runPeers})
}

// peerFlags are serve's cluster flags (docs/design/peers.md).
type peerFlags struct {
	listen, join, keyFile, name, zone, dataListen *string
	dataPlane, peerCache, role                    *string
	replicas, readAhead                           *int
	logGossip                                     *bool
	repairRate                                    *int64
	failureGrace, leaveDelay, coldAfter           *time.Duration
	coldShards                                    *[]string
	highWatermark                                 *int
}

func addPeerFlags(f *flags) *peerFlags {
	return &peerFlags{
		listen:     f.String("listen", "", "join a cluster: gossip on HOST:PORT (TCP and UDP); needs --cluster-key"),
		join:       f.String("join", "", "members to join at start: HOST:PORT[,HOST:PORT...] (their --listen)"),
		keyFile:    f.String("cluster-key", "", "file holding the cluster key (kylix cluster-key > FILE; mode 0600)"),
		name:       f.String("node-name", "", "this member's name in the cluster, unique, without '/' (default HOSTNAME@LISTEN)"),
		zone:       f.String("zone", "", "this member's failure zone (a tag)"),
		dataListen: f.String("data-listen", "", "data plane address (default: the --listen host, a port the kernel chooses)"),
		dataPlane:  f.String("data-plane", "tls", "data plane between members: tls (mutual TLS 1.3) or plaintext (trusted networks: peers authenticated, nothing encrypted; chunks verified either way)"),
		peerCache: f.String("peer-cache", "8GiB", "budget of the cache of chunks fetched from other members, under DATA/peer-cache "+
			"(least recently used evicted; 0: none)"),
		replicas: f.Int("replicas", peers.DefaultReplicas, "members that keep each chunk (placement by rendezvous hashing)"),
		readAhead: f.Int("read-ahead", chunkstore.DefaultReadAheadChunks, "chunks fetched from other members ahead of a sequential reader of a file not stored here "+
			"(in file order, into the chunk cache; 0: none)"),
		repairRate: f.Int64("repair-rate", peers.DefaultRepairRate, "placement and repair pulls: at most BYTES a second (0: no limit)"),
		failureGrace: f.Duration("failure-grace", peers.DefaultFailureGrace,
			"how long after gossip marks a member failed its chunks are repaired elsewhere (0: at once)"),
		leaveDelay: f.Duration("leave-delay", peers.DefaultLeaveDelay,
			"on stop, how long the member waits after announcing its leave, so the others learn it left rather than failed (0: none)"),
		coldAfter: f.Duration("cold-after", 0, "move the files nobody read (nor wrote) for this long to the cold tier: Reed-Solomon stripes across the members, "+
			"as kylix tier cold does (0: never; a read counts until the end of its day, UTC; pinned files never move; needs 7 members)"),
		coldShards: f.StringSlice("cold-shards", nil, "PATH=K[,PATH=K...]: stripes of K data shards and 2 parity for the files at and below the namespace path PATH "+
			"(5 to 10; the longest PATH above a file decides; repeat the flag or separate with commas; in the config file a list), for --cold-after and for kylix tier cold without --data-shards "+
			"(default: the widest the cluster allows, up to 10). This member's own: the cluster's rules (kylix tier shards) apply on every member, and this flag wins over them here for the same PATH"),
		highWatermark: f.Int("high-watermark", node.DefaultHighWatermark, "percent of the data file system in use past which the files made local here (KYLIX_IOC_MAKE_LOCAL) are released, least recently read first, "+
			"until their copies of chunks owned elsewhere would bring it 5 points under: rebalance drops each copy once its owners confirm it, then a gc gives the room back (pinned files never; 0: never)"),
		role:      f.String("role", "node", "node (stores its share of the cluster's chunks) or reader (owns none: reads from the others, keeps what it fetched in its peer cache and what it pins; for GPU nodes that load models)"),
		logGossip: f.Bool("log-gossip", false, "log every line of the gossip layer (serf, memberlist), not only its warnings and errors: joins, state exchanges, probes (diagnosis)"),
	}
}

// config is the cluster member's configuration (nil without --listen: a
// single node).
func (pf *peerFlags) config(data string, log *slog.Logger) (*peers.Config, error) {
	if *pf.listen == "" {
		if *pf.join != "" || *pf.keyFile != "" {
			return nil, fmt.Errorf("serve: --join and --cluster-key need --listen HOST:PORT")
		}
		if *pf.coldAfter != 0 || len(*pf.coldShards) > 0 {
			return nil, fmt.Errorf("serve: --cold-after and --cold-shards need a cluster (--listen HOST:PORT): the cold tier codes data across its members")
		}
		if *pf.highWatermark != node.DefaultHighWatermark {
			return nil, fmt.Errorf("serve: --high-watermark needs a cluster (--listen HOST:PORT): it releases the files made local on a member, whose chunks other members own")
		}
		return nil, nil
	}
	coldShards, err := peers.ParseShardPolicy(*pf.coldShards)
	if err != nil {
		return nil, fmt.Errorf("serve: --cold-shards %w", err)
	}
	if *pf.highWatermark < 0 || *pf.highWatermark > 100 || (*pf.highWatermark > 0 && *pf.highWatermark <= 5) {
		return nil, fmt.Errorf("serve: --high-watermark %d: want a percent of the data file system from 6 to 100, or 0 for never", *pf.highWatermark)
	}
	if *pf.coldAfter < 0 {
		return nil, fmt.Errorf("serve: --cold-after %s: want a duration above 0, or 0 for never", *pf.coldAfter)
	}
	if *pf.keyFile == "" {
		return nil, fmt.Errorf("serve: --listen needs --cluster-key FILE (make one with: kylix cluster-key > FILE; chmod 600 FILE)")
	}
	key, err := peers.LoadKey(*pf.keyFile)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if *pf.role != "node" && *pf.role != "reader" {
		return nil, fmt.Errorf("serve: --role %q: use node or reader", *pf.role)
	}
	if *pf.dataPlane != "tls" && *pf.dataPlane != "plaintext" {
		return nil, fmt.Errorf("serve: --data-plane %q: use tls or plaintext", *pf.dataPlane)
	}
	var join []string
	for _, a := range strings.Split(*pf.join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			join = append(join, a)
		}
	}
	// Capacity: the size of the data directory's file system (the
	// directory may not exist yet: the nearest existing parent).
	var capacity int64
	for dir := data; ; dir = filepath.Dir(dir) {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil {
			capacity = int64(st.Blocks) * st.Bsize
			break
		}
		if dir == filepath.Dir(dir) {
			break
		}
	}
	var cacheDir string
	var cacheBytes int64
	if c := strings.TrimSpace(*pf.peerCache); c != "0" {
		if cacheBytes, err = parseSize(c); err != nil {
			return nil, fmt.Errorf("serve: --peer-cache: %w", err)
		}
		cacheDir = filepath.Join(data, "peer-cache")
	}
	return &peers.Config{CacheDir: cacheDir, CacheBytes: cacheBytes, NoRelay: os.Getenv("KYLIX_TEST_PEER_NO_RELAY") == "1",
		Name: *pf.name, Listen: *pf.listen, DataListen: *pf.dataListen, Join: join, Key: key,
		Capacity: capacity, Zone: *pf.zone, Replicas: *pf.replicas, Version: "dev", Logger: log,
		Plaintext: *pf.dataPlane == "plaintext", GossipLog: *pf.logGossip, Reader: *pf.role == "reader",
		RepairRate: orNone(*pf.repairRate), FailureGrace: time.Duration(orNone(int64(*pf.failureGrace))),
		LeaveDelay:    time.Duration(orNone(int64(*pf.leaveDelay))),
		CorruptServed: os.Getenv("KYLIX_TEST_PEER_CORRUPT") == "1", ServeDelay: testServeDelay(),
		CrashAfterStripes: testInt("KYLIX_TEST_TIER_CRASH_AFTER"), ColdShards: coldShards,
		HandshakeTimeout: testDuration("KYLIX_TEST_PEER_HANDSHAKE"), IdleTimeout: testDuration("KYLIX_TEST_PEER_IDLE")}, nil
}

// readAheadChunks is the store's Options.ReadAheadChunks from --read-ahead.
func (pf *peerFlags) readAheadChunks() int {
	return int(orNone(int64(*pf.readAhead)))
}

// testServeDelay is KYLIX_TEST_PEER_DELAY (a duration): a test hook that
// delays what this member's data plane sends (a distant member).
func testServeDelay() time.Duration {
	return testDuration("KYLIX_TEST_PEER_DELAY")
}

// testDuration is the duration in the environment variable name, 0 when
// unset or not one: test hooks (KYLIX_TEST_PEER_HANDSHAKE and
// KYLIX_TEST_PEER_IDLE shorten the data plane's handshake and idle
// deadlines, docs/design/peers.md).
func testDuration(name string) time.Duration {
	d, _ := time.ParseDuration(os.Getenv(name))
	return d
}

// testInt reads a test hook's count from the environment (0: unset).
func testInt(name string) int {
	v, _ := strconv.Atoi(os.Getenv(name))
	return v
}

// orNone maps a flag's 0 ("none") to the node's negative "none" (its 0
// is "the default").
func orNone(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

func runClusterKey(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "cluster-key", "", `
Prints a new random cluster key. Every member of a cluster is started with
the same key (serve --cluster-key FILE): gossip is encrypted with a key
derived from it, and the data plane's certificates are signed by an
authority derived from it. Keep the file private (mode 0600).`)
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	k, err := peers.NewKey()
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, k.String())
	return nil
}

func runPeers(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "peers", "[--data DIR] [--json]", `
Shows the members of the cluster the node serving --data belongs to: state
(alive, leaving, left, failed), addresses, capacity, when last seen (now for
alive members), namespace root, and this node's exchanges with each: chunks
and bytes fetched, bad chunks (bytes that failed their hash: never served to
a reader), failed requests, and the measured throughput (a moving
average of bytes a second of recent chunks, their latency, the recent
failure rate: holders are asked in that order), and the chunks fetched
ahead of sequential readers (--read-ahead). Fails when no node runs, or when it was
started without --listen.`).withJSON()
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	var out node.PeersStatus
	if err := f.call(ctx, node.OpPeers, nil, &out, nil); err != nil {
		return noNode(err, fmt.Sprintf("no node serves %s (start one with kylix serve --listen)", f.data))
	}
	if f.jsonOut {
		return f.printJSON(out)
	}
	pl := out.Placement
	fmt.Fprintf(e.stdout, "placement: %d replicas; %d chunks owned here, %d of them missing after the last pass (%d passes); pulled %d chunks (%s)\n",
		out.Replicas, pl.OwnedChunks, pl.OwnedMissing, pl.Passes, pl.PulledChunks, human(pl.PulledBytes))
	fmt.Fprintf(e.stdout, "push: sent %d chunks (%s) to owners on import, received %d (%s); repair rate %s/s (0: no limit), failure grace %s\n",
		pl.PushedChunks, human(pl.PushedBytes), pl.ReceivedChunks, human(pl.ReceivedBytes), human(pl.RepairRate), pl.FailureGrace)
	if len(pl.InGrace) > 0 {
		fmt.Fprintf(e.stdout, "failed, still owners within the grace: %s\n", strings.Join(pl.InGrace, ", "))
	}
	sw := out.Swarm
	fmt.Fprintf(e.stdout, "peer cache: %s of %s, %d chunks; hits %d, misses %d, evictions %d; relay: got %d chunks through relays, answered %d relay requests, %d shared fetches\n",
		human(sw.Cache.Bytes), human(sw.Cache.BudgetBytes), sw.Cache.Chunks, sw.Cache.Hits, sw.Cache.Misses, sw.Cache.Evictions, sw.RelayAsked, sw.RelayServed, sw.SharedFetches)
	if sw.Cache.Writes != "" {
		fmt.Fprintf(e.stdout, "peer cache: chunks loads fetch are kept behind them, written %s\n", sw.Cache.Writes)
	}
	if sw.Cache.NotKept > 0 || sw.Cache.WriteFailures > 0 {
		fmt.Fprintf(e.stdout, "peer cache: %d chunks loads fetched were not kept (the writers behind them were a full queue behind, or found no room above the reserve), %d writes failed\n", sw.Cache.NotKept, sw.Cache.WriteFailures)
	}
	fmt.Fprintf(e.stdout, "read-ahead: window %d chunks; fetched %d chunks (%s) ahead of sequential readers\n", out.ReadAhead.Window, out.ReadAhead.Chunks, human(out.ReadAhead.Bytes))
	if out.StripeShape != "" {
		fmt.Fprintf(e.stdout, "erasure coding: kylix tier cold codes %s stripes; rebuilt %d chunks from their stripes\n", out.StripeShape, out.StripeRebuilt)
	} else {
		fmt.Fprintf(e.stdout, "erasure coding: none: %s; rebuilt %d chunks from their stripes\n", out.StripeNote, out.StripeRebuilt)
	}
	for _, m := range out.Members {
		self := ""
		if m.Self {
			self = " (this node)"
		}
		role := ""
		if m.Role == "reader" {
			role = " (reader: owns no chunks)"
		}
		fmt.Fprintf(e.stdout, "%s%s%s: %s, gossip %s, data %s (%s), capacity %s, last seen %s\n  fetched %d chunks (%s), bad chunks %d, errors %d",
			m.Name, self, role, m.State, m.Addr, m.DataAddr, m.Plane, human(m.Capacity), m.LastSeen.UTC().Format(time.RFC3339), m.Fetched, human(m.FetchedBytes), m.BadChunks, m.Errors)
		if tp := m.Throughput; tp.Samples > 0 {
			fmt.Fprintf(e.stdout, ", throughput %s/s (latency %.1f ms, %d chunks measured)", human(tp.BytesPerSec), tp.LatencyMs, tp.Samples)
		}
		if tp := m.Throughput; tp.FailRate > 0 {
			fmt.Fprintf(e.stdout, ", failure rate %.2f", tp.FailRate)
		}
		if m.Self {
			fmt.Fprintf(e.stdout, ", served %d chunks (%s, %s of them from packs)", m.Served, human(m.ServedBytes), human(m.ServedPackBytes))
		}
		fmt.Fprintln(e.stdout)
	}
	return nil
}
