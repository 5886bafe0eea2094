package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/chunkstore"
)

// freeAddr returns a loopback address with a port free for TCP and UDP.
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

type testNode struct {
	*Node
	s *chunkstore.Store
}

// startNode opens a store in a temporary directory and starts a node on
// it, joining join.
func startNode(t *testing.T, name string, key Key, corrupt bool, join ...string) (*testNode, error) {
	t.Helper()
	return startNodeCfg(t, Config{Name: name, Key: key, Join: join, CorruptServed: corrupt})
}

// cacheBytes is the chunk cache of test members.
var cacheBytes int64 = 1 << 20

func startNodeCfg(t *testing.T, cfg Config) (*testNode, error) {
	t.Helper()
	cfg.Capacity, cfg.FetchTimeout = 1<<30, 5*time.Second
	for attempt := 0; ; attempt++ {
		// freeAddr's port is free when it returns, not when the member
		// binds it: another test process (go test runs packages side by
		// side) may take it in between; then a new port (CI saw
		// "address already in use" here).
		cfg.Listen = freeAddr(t)
		n, err := New(cfg)
		require.NoError(t, err)
		s, err := chunkstore.Open(chunkstore.Options{Dir: t.TempDir(), Fetcher: n, CacheBytes: cacheBytes})
		require.NoError(t, err)
		if err := n.Start(s, nil); err != nil {
			s.Close()
			if attempt < 5 && strings.Contains(err.Error(), "address already in use") {
				continue
			}
			return nil, err
		}
		t.Cleanup(func() { s.Close() })
		t.Cleanup(func() { n.Close() })
		return &testNode{n, s}, nil
	}
}

func mustStart(t *testing.T, name string, key Key, corrupt bool, join ...string) *testNode {
	t.Helper()
	n, err := startNode(t, name, key, corrupt, join...)
	require.NoError(t, err)
	return n
}

// eventually waits for cond, polling, up to convergeWait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(convergeWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// convergeWait bounds a wait for members to converge (placement, merges,
// rebalance after its settle time). Alone they take seconds; CI runs the
// cluster tests of test/ (eight serve processes at once) beside this
// package on two cores, where a rebalance once took past 20 s
// (TestJoinMovesOneNth), and once past 60 s with the package taking twice
// its usual time.
const convergeWait = 120 * time.Second

// importBytes stores data at path on n.
func importBytes(t *testing.T, n *testNode, path string, data []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.WriteFile(src, data, 0o644))
	_, err := n.s.Import(context.Background(), src, path, chunkstore.ImportOptions{})
	require.NoError(t, err)
}

func readAll(n *testNode, path string) ([]byte, error) {
	f, _, err := n.s.OpenPath(path)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, f.Size())
	_, err = f.ReadAt(buf, 0)
	return buf, err
}

// randBytes returns n bytes of one seeded stream, each call the next bytes:
// every run of the package's tests gets the same files, so chunk
// boundaries, placement and stripe sizes are the same run to run (a test
// that depends on them cannot pass or fail by chance), and no two calls
// return the same bytes.
func randBytes(n int) []byte {
	b := make([]byte, n)
	testBytesMu.Lock()
	testBytes.Read(b)
	testBytesMu.Unlock()
	return b
}

var (
	testBytesMu sync.Mutex
	testBytes   = mrand.NewChaCha8([32]byte{'k', 'y', 'l', 'i', 'x'})
)

// TestClusterReadsAndMerges: a file imported on one member appears in the
// others' namespaces and reads there byte for byte from the member holding
// it; files imported on different members are all kept.
func TestClusterReadsAndMerges(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b := mustStart(t, "b", key, false, a.cfg.Listen)
	eventually(t, "two alive members", func() bool { return len(b.livePeers()) == 1 && len(a.livePeers()) == 1 })

	data := randBytes(3<<20 + 12345)
	importBytes(t, a, "models/x.bin", data)
	importBytes(t, b, "models/y.bin", []byte("from b"))
	for _, n := range []*testNode{a, b} {
		eventually(t, "both files on "+n.self, func() bool {
			_, e1 := n.s.Lookup("models/x.bin")
			_, e2 := n.s.Lookup("models/y.bin")
			return e1 == nil && e2 == nil
		})
	}
	got, err := readAll(b, "models/x.bin")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data), "bytes read on b differ from the source")
	got, err = readAll(a, "models/y.bin")
	require.NoError(t, err)
	require.Equal(t, "from b", string(got))
	require.Positive(t, b.statsFor("a").Fetched.Load())
	// The two namespaces converge to one root.
	eventually(t, "one root", func() bool {
		ra, _, _ := a.s.Root()
		rb, _, _ := b.s.Root()
		return ra == rb
	})
}

// TestWrongChunkNeverReachesReader: a member that serves flipped bytes is
// counted and skipped; with no other holder the read fails (EIO in the
// mount), never returning its bytes.
func TestWrongChunkNeverReachesReader(t *testing.T) {
	key, _ := NewKey()
	good := mustStart(t, "good", key, false)
	bad := mustStart(t, "bad", key, true, good.cfg.Listen)
	rd := mustStart(t, "reader", key, false, good.cfg.Listen)
	eventually(t, "three alive members", func() bool { return len(rd.livePeers()) == 2 })

	// About 24 chunks of about 1 MiB: the bad member ranks first for some
	// (all but certainly: 2^-24 that it does not; checked below).
	data := randBytes(24 << 20)
	importBytes(t, good, "f", data)
	importBytes(t, bad, "f", data) // same content: same chunks, same manifest
	eventually(t, "f on reader", func() bool { _, err := rd.s.Lookup("f"); return err == nil })
	f, _, err := rd.s.OpenPath("f")
	require.NoError(t, err)
	// The test needs a chunk for which the bad member ranks first.
	badFirst := 0
	for _, c := range f.M.Chunks {
		if rank(c.ID, rd.livePeers())[0].name == "bad" {
			badFirst++
		}
	}
	require.Positive(t, badFirst, "no chunk ranks the bad member first; use more chunks")
	got, err := readAll(rd, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
	// Those chunks were asked of the bad member first, by the read or by
	// placement (which pulls what the reader owns): each time counted.
	require.Positive(t, rd.statsFor("bad").BadChunks.Load())

	// Only the bad member holds this one: the read fails.
	only := randBytes(1 << 20)
	importBytes(t, bad, "g", only)
	eventually(t, "g on reader", func() bool { _, err := rd.s.Lookup("g"); return err == nil })
	_, err = readAll(rd, "g")
	require.Error(t, err)
	require.True(t, errors.Is(err, chunkstore.ErrNotLocal) || errors.Is(err, chunkstore.ErrCorrupt), "err: %v", err)
}

// TestWrongKeyRefused: a node with another cluster key cannot join.
func TestWrongKeyRefused(t *testing.T) {
	k1, _ := NewKey()
	k2, _ := NewKey()
	a := mustStart(t, "a", k1, false)
	_, err := startNode(t, "intruder", k2, false, a.cfg.Listen)
	require.Error(t, err)
	require.Len(t, a.serf.Members(), 1)
	// Nor can it use the data plane: its certificate is not the cluster's.
	_, ct, err := tlsConfigs(k2)
	require.NoError(t, err)
	cc, err := dialPeer(context.Background(), a.DataAddr(), security{client: ct})
	if err == nil {
		_, _, err = cc.roundTrip(context.Background(), request{op: opObject}, maxObject)
	}
	require.Error(t, err)
}

// TestOtherDataPlaneRefused: a member whose data plane differs (TLS
// against plaintext, either way round) cannot join: its join fails naming
// both planes, and the cluster lists only its own members.
func TestOtherDataPlaneRefused(t *testing.T) {
	key, _ := NewKey()
	for _, clusterPlain := range []bool{false, true} {
		a, err := startNodeCfg(t, Config{Name: "a", Key: key, Plaintext: clusterPlain})
		require.NoError(t, err)
		_, err = startNodeCfg(t, Config{Name: "other", Key: key, Plaintext: !clusterPlain, Join: []string{a.cfg.Listen}})
		require.ErrorContains(t, err, "every member of a cluster must use the same --data-plane")
		require.ErrorContains(t, err, "data plane and this member")
		require.Len(t, a.serf.Members(), 1)
		require.Equal(t, map[bool]string{false: "tls", true: "plaintext"}[clusterPlain], a.Members()[0].Plane)
		// One of the same plane joins.
		_, err = startNodeCfg(t, Config{Name: "same", Key: key, Plaintext: clusterPlain, Join: []string{a.cfg.Listen}})
		require.NoError(t, err)
	}
}

// TestPlacement: chunks imported on one member reach their R=2 owners
// (rendezvous order over the live members), so the file reads on another
// member after the importer is gone.
func TestPlacement(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b := mustStart(t, "b", key, false, a.cfg.Listen)
	c := mustStart(t, "c", key, false, a.cfg.Listen)
	nodes := map[string]*testNode{"a": a, "b": b, "c": c}
	eventually(t, "three alive members", func() bool {
		return len(a.members()) == 3 && len(b.members()) == 3 && len(c.members()) == 3
	})
	data := randBytes(8 << 20)
	importBytes(t, a, "f", data)
	f, _, err := a.s.OpenPath("f")
	require.NoError(t, err)
	require.Greater(t, len(f.M.Chunks), 2)
	eventually(t, "every chunk on its two owners", func() bool {
		for _, ch := range f.M.Chunks {
			for _, p := range rank(ch.ID, a.members())[:2] {
				if !nodes[p.name].s.HasChunk(ch.ID) {
					return false
				}
			}
		}
		return true
	})
	pulled := b.Placement().PulledChunks + c.Placement().PulledChunks
	require.Positive(t, pulled)
	require.NoError(t, a.Close())
	eventually(t, "a gone", func() bool { return len(b.livePeers()) == 1 })
	got, err := readAll(b, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
}

// TestHealedSplitMerges: two members written apart (two clusters, as the
// sides of a partition are) and then joined: files of both are kept, and
// the path both wrote keeps the newer write with the other kept as a
// conflict version, on both members.
func TestHealedSplitMerges(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b := mustStart(t, "b", key, false)
	importBytes(t, a, "only-a", []byte("a"))
	importBytes(t, a, "p", []byte("written on a"))
	importBytes(t, b, "only-b", []byte("b"))
	importBytes(t, b, "p", []byte("written on b"))
	ea, err := a.s.Lookup("p")
	require.NoError(t, err)
	eb, err := b.s.Lookup("p")
	require.NoError(t, err)
	win, lose := "written on a", "written on b"
	if winner(ea, eb) == eb {
		win, lose = lose, win
	}
	loser := ea
	if win == "written on a" {
		loser = eb
	}
	conflict := fmt.Sprintf("p.conflict-%x", uint64(loser.HLC))

	require.NoError(t, b.Join([]string{a.cfg.Listen}))
	for _, n := range []*testNode{a, b} {
		eventually(t, "both sides' files on "+n.self, func() bool {
			for _, p := range []string{"only-a", "only-b", conflict} {
				if _, err := n.s.Lookup(p); err != nil {
					return false
				}
			}
			return true
		})
		for p, want := range map[string]string{"only-a": "a", "only-b": "b", "p": win, conflict: lose} {
			got, err := readAll(n, p)
			require.NoError(t, err, "%s on %s", p, n.self)
			require.Equal(t, want, string(got), "%s on %s", p, n.self)
		}
	}
}

// TestMakeLocal: File.MakeLocal (KYLIX_IOC_MAKE_LOCAL) brings a file's
// chunks from the member holding them and stores them, so the file reads
// after that member is gone.
func TestMakeLocal(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, Join: []string{a.cfg.Listen}, NoPlacement: true})
	require.NoError(t, err)
	data := randBytes(5 << 20)
	importBytes(t, a, "f", data)
	eventually(t, "f on b", func() bool { _, err := b.s.Lookup("f"); return err == nil })
	f, _, err := b.s.OpenPath("f")
	require.NoError(t, err)
	p, err := f.Plan(0, f.Size())
	require.NoError(t, err)
	require.Len(t, p.Missing(), len(f.M.Chunks), "b holds nothing before")
	p.Release()
	n, err := f.MakeLocal(context.Background(), 0, f.Size())
	require.NoError(t, err)
	require.Equal(t, len(f.M.Chunks), n)
	f, _, err = b.s.OpenPath("f")
	require.NoError(t, err)
	p, err = f.Plan(0, f.Size())
	require.NoError(t, err)
	require.Empty(t, p.Missing())
	p.Release()
	require.NoError(t, a.Close())
	got, err := readAll(b, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
}

// TestJoinMovesOneNth: a member joining a placed cluster pulls only the
// chunks it now owns, about R/N of them (1/N of the replica bytes), and
// no other member pulls anything.
func TestJoinMovesOneNth(t *testing.T) {
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b := mustStart(t, "b", key, false, a.cfg.Listen)
	c := mustStart(t, "c", key, false, a.cfg.Listen)
	old := []*testNode{a, b, c}
	placedOver := func(n int, ns ...*testNode) func() bool {
		return func() bool {
			for _, x := range ns {
				pl := x.Placement()
				if pl.Members != n || pl.OwnedMissing != 0 || pl.OwnedChunks == 0 {
					return false
				}
			}
			return true
		}
	}
	eventually(t, "three alive members", func() bool { return len(a.members()) == 3 && len(b.members()) == 3 && len(c.members()) == 3 })
	data := randBytes(48 << 20)
	importBytes(t, a, "f", data)
	f, _, err := a.s.OpenPath("f")
	require.NoError(t, err)
	eventually(t, "placed over 3", placedOver(3, old...))
	// copies counts the stored copies of f's chunks on ns.
	copies := func(ns ...*testNode) int {
		n := 0
		for _, x := range ns {
			for _, c := range f.M.Chunks {
				if x.s.HasChunk(c.ID) {
					n++
				}
			}
		}
		return n
	}
	// The importer drops the copies it does not own once b and c hold them.
	eventually(t, "exactly R copies of every chunk on the three", func() bool { return copies(old...) == DefaultReplicas*len(f.M.Chunks) })
	before, dropped := map[string]int64{}, int64(0)
	for _, x := range old {
		before[x.self] = x.Placement().PulledChunks
		dropped += x.Placement().DroppedChunks
	}

	d := mustStart(t, "d", key, false, a.cfg.Listen)
	eventually(t, "placed over 4", placedOver(4, append(old, d)...))
	for _, x := range old {
		require.Equal(t, before[x.self], x.Placement().PulledChunks, "%s pulled after the join", x.self)
	}
	chunks := len(f.M.Chunks)
	moved := float64(d.Placement().PulledChunks) / float64(DefaultReplicas*chunks)
	t.Logf("%d chunks; the new member pulled %d: %.2f of the replicas (1/N = 0.25)", chunks, d.Placement().PulledChunks, moved)
	require.InDelta(t, 0.25, moved, 0.15)
	// The removal side: each replica the new member took is dropped by the
	// old member that no longer owns it, once both owners hold it; so R
	// copies again, and the file reads whole on every member.
	all := append(old, d)
	droppedSince := func() int64 {
		var n int64
		for _, x := range old {
			n += x.Placement().DroppedChunks
		}
		return n - dropped
	}
	eventually(t, "exactly R copies of every chunk on the four, each moved copy dropped by one old member", func() bool {
		return copies(all...) == DefaultReplicas*len(f.M.Chunks) && droppedSince() == d.Placement().PulledChunks
	})
	for _, x := range all {
		g, _, err := x.s.OpenPath("f")
		require.NoError(t, err)
		got := make([]byte, g.Size())
		_, err = g.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "f on %s", x.self)
	}
}

// TestServesFromMemory: a member serves chunks it holds only in its memory
// cache (it read them), so a third member reads a file whose only packed
// copy is gone.
func TestServesFromMemory(t *testing.T) {
	old := cacheBytes
	cacheBytes = 64 << 20
	defer func() { cacheBytes = old }()
	key, _ := NewKey()
	a := mustStart(t, "a", key, false)
	b, err := startNodeCfg(t, Config{Name: "b", Key: key, Join: []string{a.cfg.Listen}, NoPlacement: true})
	require.NoError(t, err)
	data := randBytes(6 << 20)
	importBytes(t, a, "f", data)
	eventually(t, "f on b", func() bool { _, err := b.s.Lookup("f"); return err == nil })
	// Read as the mount does, in pieces: chunks read in part stay cached.
	f, _, err := b.s.OpenPath("f")
	require.NoError(t, err)
	got := make([]byte, f.Size())
	for off := int64(0); off < f.Size(); off += 128 << 10 {
		_, err := f.ReadAt(got[off:min(off+128<<10, f.Size())], off)
		require.NoError(t, err)
	}
	require.True(t, bytes.Equal(got, data))
	require.NoError(t, a.Close())
	c, err := startNodeCfg(t, Config{Name: "c", Key: key, Join: []string{b.cfg.Listen}, NoPlacement: true})
	require.NoError(t, err)
	eventually(t, "f on c", func() bool { _, err := c.s.Lookup("f"); return err == nil })
	got, err = readAll(c, "f")
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, data))
	require.Positive(t, c.statsFor("b").Fetched.Load())
}

// TestNodeNameWithSlash: serf rejoins a failed member by NAME/ADDRESS,
// cut at the first '/': a name with one is refused, and the default name
// has none.
func TestNodeNameWithSlash(t *testing.T) {
	key, err := NewKey()
	require.NoError(t, err)
	_, err = New(Config{Listen: "127.0.0.1:0", Name: "rack1/node2", Key: key})
	require.ErrorContains(t, err, `"rack1/node2" contains '/'`)
	n, err := New(Config{Listen: "127.0.0.1:0", Key: key})
	require.NoError(t, err)
	require.NotContains(t, n.self, "/")
	require.Contains(t, n.self, "@127.0.0.1:0")
}
