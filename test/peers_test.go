package test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Clusters of real `kylix serve` processes on loopback: each member on its
// own 127.0.0.x address (docs/design/peers.md).

// clusterKey writes a new cluster key file.
func clusterKey(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(p, []byte(mustKylix(t, "/", "cluster-key")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// gossipAddr returns ip:port with the port free for TCP and UDP.
func gossipAddr(t *testing.T, ip string) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatalf("no free port on %s", ip)
	return ""
}

// membershipWait bounds the wait for members to see each other. Gossip
// usually converges in well under a second, but a member that misses every
// broadcast about a newcomer (seen once in CI, cause not known) only
// learns of it at its next full state exchange with a random member, which
// memberlist schedules every 30 s: the wait covers two of those.
const membershipWait = 75 * time.Second

// nsWait bounds a namespace change reaching another member (the root's
// gossip, then the merge). Alone it takes a second or two; a loaded
// two-core CI once took more than 20 s (TestClusterBadPeer).
const nsWait = 60 * time.Second

type member struct {
	*node
	addr string
}

// startMember starts a node of the cluster on ip, joining join (may be
// empty), with the extra environment.
func startMember(t *testing.T, ip, key string, env []string, join ...string) *member {
	t.Helper()
	return startMemberArgs(t, ip, key, env, nil, join...)
}

// startMemberArgs is startMember with extra serve flags.
func startMemberArgs(t *testing.T, ip, key string, env, extra []string, join ...string) *member {
	t.Helper()
	data, mnt := dirs(t)
	addr := gossipAddr(t, ip)
	// --leave-delay 10ms: a stop announces the leave and waits 10 ms, not
	// serf's 1 s, for every member every cluster test stops.
	args := append([]string{"--listen", addr, "--cluster-key", key, "--node-name", ip, "--log-gossip", "--leave-delay", "10ms"}, extra...)
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	return &member{node: launchNode(t, data, mnt, env, nil, args...), addr: addr}
}

type peerOut struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Fetched   int64  `json:"chunks_fetched"`
	BadChunks int64  `json:"bad_chunks"`
	Errors    int64  `json:"errors"`
}

type placementOut struct {
	Passes       int64 `json:"passes"`
	Members      int   `json:"members"`
	OwnedChunks  int64 `json:"owned_chunks"`
	OwnedMissing int64 `json:"owned_missing"`
	PulledChunks int64 `json:"pulled_chunks"`
}

func peersJSON(t *testing.T, m *member) (map[string]peerOut, placementOut) {
	t.Helper()
	var out struct {
		Placement placementOut `json:"placement"`
		Members   []peerOut    `json:"members"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	ps := map[string]peerOut{}
	for _, p := range out.Members {
		ps[p.Name] = p
	}
	return ps, out.Placement
}

func peersOf(t *testing.T, m *member) map[string]peerOut {
	t.Helper()
	ps, _ := peersJSON(t, m)
	return ps
}

func aliveCount(t *testing.T, m *member) int {
	n := 0
	for _, p := range peersOf(t, m) {
		if p.State == "alive" {
			n++
		}
	}
	return n
}

// randomFile writes n random bytes and returns the path and its SHA-256.
func randomFile(t *testing.T, n int) (string, [32]byte) {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	p := filepath.Join(t.TempDir(), "src.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, sha256.Sum256(b)
}

// shaOn returns the SHA-256 of a file in m's mount, failing the test with
// m's log when it cannot be read.
func shaOn(t *testing.T, m *member, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v\nnode log:\n%s", err, m.log)
	}
	return sha256.Sum256(b)
}

func visible(p string) func() bool {
	return func() bool { _, err := os.Stat(p); return err == nil }
}

// TestClusterReadElsewhere: three members; a file imported on A reads
// byte-equal through B's mount; a file imported on C shows on A too; with
// the file also on C, a kill -9 of A in the middle of B's read leaves B
// reading the rest from C.
func TestClusterReadElsewhere(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.2", key, nil)
	b := startMember(t, "127.0.0.3", key, nil, a.addr)
	c := startMember(t, "127.0.0.4", key, nil, a.addr)
	waitFor(t, membershipWait, "three alive members seen by B", func() bool { return aliveCount(t, b) == 3 })

	src, sum := randomFile(t, 24<<20+4321)
	mustKylix(t, "/", "import", "--data", a.data, src, "models/m.bin")
	onB := filepath.Join(b.mnt, "models", "m.bin")
	waitFor(t, nsWait, "models/m.bin in B's mount", visible(onB))
	if shaOn(t, b, onB) != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
	if p := peersOf(t, b)["127.0.0.2"]; p.Fetched == 0 {
		t.Errorf("B fetched nothing from A: %+v", p)
	}
	if out := mustKylix(t, "/", "peers", "--data", b.data); !strings.Contains(out, "127.0.0.3 (this node): alive") ||
		!strings.Contains(out, "127.0.0.2: alive") || !strings.Contains(out, "placement: 2 replicas") {
		t.Errorf("kylix peers:\n%s", out)
	}

	other, _ := randomFile(t, 1000)
	mustKylix(t, "/", "import", "--data", c.data, other, "from-c")
	waitFor(t, nsWait, "from-c in A's mount", visible(filepath.Join(a.mnt, "from-c")))

	// A second file, held by A and C (the same content imported on both).
	src2, sum2 := randomFile(t, 32<<20)
	mustKylix(t, "/", "import", "--data", a.data, src2, "big.bin")
	mustKylix(t, "/", "import", "--data", c.data, src2, "big.bin")
	onB2 := filepath.Join(b.mnt, "big.bin")
	waitFor(t, nsWait, "big.bin in B's mount", visible(onB2))
	f, err := os.Open(onB2)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, 4<<20); err != nil {
		t.Fatal(err)
	}
	a.kill9()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read after A was killed: %v\n%s", err, b.log)
	}
	if [32]byte(h.Sum(nil)) != sum2 {
		t.Fatal("bytes read through B's mount after A was killed differ from the source")
	}
	syscall.Unmount(a.mnt, syscall.MNT_DETACH)
}

// TestClusterBadPeer: a member that serves flipped bytes never reaches a
// reader: B reads the right bytes from A, counts C's bad chunks, and gets
// EIO for a file only C holds.
func TestClusterBadPeer(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.5", key, nil)
	c := startMember(t, "127.0.0.6", key, []string{"KYLIX_TEST_PEER_CORRUPT=1"}, a.addr)
	b := startMember(t, "127.0.0.7", key, nil, a.addr)
	waitFor(t, membershipWait, "three alive members seen by B", func() bool { return aliveCount(t, b) == 3 })

	// Random bytes are cut into chunks of about 1 MiB: with 32 of them, C
	// ranks first for some (all but certainly: 2^-32 that it does not).
	src, sum := randomFile(t, 32<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "f.bin")
	mustKylix(t, "/", "import", "--data", c.data, src, "f.bin")
	onB := filepath.Join(b.mnt, "f.bin")
	waitFor(t, nsWait, "f.bin in B's mount", visible(onB))
	if shaOn(t, b, onB) != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
	if p := peersOf(t, b)["127.0.0.6"]; p.BadChunks == 0 {
		t.Errorf("kylix peers shows no bad chunk from C: %+v", p)
	}

	// kylix load on B fetches what B lacks during the load, not through
	// the mount: with C in the cluster the bytes loaded are right (--check
	// compares every one with the store's), and a file only C holds fails
	// to load, naming the wrong chunk (below). By now B asks A first (C's
	// failures sank it in B's order), so the second is the one that
	// certainly meets C's bytes.
	src2, _ := randomFile(t, 32<<20)
	mustKylix(t, "/", "import", "--data", a.data, src2, "g.bin")
	mustKylix(t, "/", "import", "--data", c.data, src2, "g.bin")
	waitFor(t, nsWait, "g.bin in B's mount", visible(filepath.Join(b.mnt, "g.bin")))
	out := mustKylix(t, "/", "load", "--data", b.data, "--device", "host", "--check", "g.bin")
	if !strings.Contains(out, "read back and compared") || !strings.Contains(out, "\nfetched: ") {
		t.Errorf("kylix load on B of a file A and C hold: %s", out)
	}

	only, _ := randomFile(t, 2<<20)
	mustKylix(t, "/", "import", "--data", c.data, only, "only-c.bin")
	onB = filepath.Join(b.mnt, "only-c.bin")
	waitFor(t, nsWait, "only-c.bin in B's mount", visible(onB))
	_, err := os.ReadFile(onB)
	if err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("read of a file only the bad member holds: %v, want EIO", err)
	}
	_, errs, code := kylix(t, "/", "load", "--data", b.data, "--device", "host", "only-c.bin")
	if code == 0 || !strings.Contains(errs, "sent a wrong chunk") {
		t.Errorf("kylix load on B of a file only the bad member holds: exit %d\n%s\nwant an error saying the member sent a wrong chunk", code, errs)
	}
}

// TestClusterWrongKey: a node with another cluster key is refused: its
// serve exits with an error naming the key, and the cluster does not list
// it.
func TestClusterWrongKey(t *testing.T) {
	requireFUSE(t)
	a := startMember(t, "127.0.0.8", clusterKey(t), nil)
	out := refusedServe(t, "--listen", gossipAddr(t, "127.0.0.9"), "--cluster-key", clusterKey(t), "--join", a.addr)
	if !strings.Contains(out, "cluster key") {
		t.Fatalf("serve with a wrong key: %s", out)
	}
	if n := len(peersOf(t, a)); n != 1 {
		t.Errorf("A lists %d members, want itself only", n)
	}
}

// TestClusterOtherDataPlane: a node with the cluster's key but the other
// data plane (plaintext against TLS) is refused the same way: it could not
// exchange a chunk with the others. kylix peers shows each member's plane.
func TestClusterOtherDataPlane(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.52", key, nil)
	out := refusedServe(t, "--listen", gossipAddr(t, "127.0.0.53"), "--cluster-key", key, "--data-plane", "plaintext", "--join", a.addr)
	if !strings.Contains(out, "uses the tls data plane and this member plaintext: every member of a cluster must use the same --data-plane") {
		t.Fatalf("serve with the other data plane: %s", out)
	}
	if !strings.Contains(a.log.String(), "cluster: member refused") {
		t.Errorf("A's log does not say it refused the member:\n%s", a.log)
	}
	var got struct {
		Members []struct {
			Name  string `json:"name"`
			Plane string `json:"data_plane"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", a.data, "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Members) != 1 || got.Members[0].Plane != "tls" {
		t.Errorf("A's members after refusing the other plane: %+v", got.Members)
	}
}

// refusedServe runs kylix serve with args (and a fresh data directory and
// mount point), which must exit with an error within 30 s and leave no
// mount; it returns what serve printed.
func refusedServe(t *testing.T, args ...string) string {
	t.Helper()
	data, mnt := dirs(t)
	cmd := exec.Command(kylixBin, append([]string{"serve", "--data", data, "--mount", mnt}, args...)...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("serve %v was not refused: %s", args, out)
	}
	if err == nil {
		t.Fatalf("serve %v exited 0: %s", args, out)
	}
	if isMounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		t.Error("the refused node left its mount")
	}
	return string(out)
}

// TestClusterPlacement: five members. A file imported on A reaches the
// owners of its chunks (R=2); after a kill -9 of A the survivors repair
// (the new owners of A's chunks pull them), so after a kill -9 of B too the
// file still reads byte-equal through C's mount. Without the repair, a
// chunk whose two owners were A and B (one in ten) would be lost.
func TestClusterPlacement(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	grace := []string{"--failure-grace", "4s"}
	a := startMemberArgs(t, "127.0.0.10", key, nil, grace)
	ms := []*member{a}
	for _, ip := range []string{"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"} {
		ms = append(ms, startMemberArgs(t, ip, key, nil, grace, a.addr))
	}
	b, c := ms[1], ms[2]
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range ms {
				t.Logf("log of %s:\n%s", m.addr, m.log)
			}
		}
	})
	waitFor(t, membershipWait, "five alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 5 {
				return false
			}
		}
		return true
	})
	src, sum := randomFile(t, 24<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "m.bin")
	placed := func(members int, ms []*member) func() bool {
		return func() bool {
			for _, m := range ms {
				if _, err := os.Stat(filepath.Join(m.mnt, "m.bin")); err != nil {
					return false
				}
				_, pl := peersJSON(t, m)
				if pl.OwnedMissing != 0 || pl.Members != members {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 30*time.Second, "the chunks B..E own pulled", placed(5, ms[1:]))

	a.kill9()
	syscall.Unmount(a.mnt, syscall.MNT_DETACH)
	waitFor(t, 60*time.Second, "A seen failed by B..E", func() bool {
		for _, m := range ms[1:] {
			if peersOf(t, m)["127.0.0.10"].State != "failed" {
				return false
			}
		}
		return true
	})
	// Within the failure grace A still owns its chunks: B reports them
	// under-replicated and nobody repairs them yet. (Checked only if B's
	// last pass still counted A as in its grace after df answered.)
	under := dfCluster(t, b)
	if inGrace(t, b, "127.0.0.10") {
		if under.UnderBytes == 0 {
			t.Errorf("within the grace after A failed, df on B shows no under-replicated bytes: %+v", under)
		}
	} else {
		t.Log("the grace ended before df answered; not checked")
	}
	waitFor(t, 60*time.Second, "B..E repaired: no owned chunk missing after a pass over the four left", placed(4, ms[1:]))
	waitFor(t, 30*time.Second, "df on B: nothing under-replicated", func() bool {
		d := dfCluster(t, b)
		return d.UnderBytes == 0 && d.UnheldBytes == 0 && d.MinCopies >= 2 && d.Bytes >= 24<<20
	})

	b.kill9()
	syscall.Unmount(b.mnt, syscall.MNT_DETACH)
	if shaOn(t, c, filepath.Join(c.mnt, "m.bin")) != sum {
		t.Fatal("bytes read through C's mount after A and B were killed differ from the source")
	}
}

// replicationOut is the "cluster" object of kylix df --json and stat --json.
type replicationOut struct {
	Replicas    int   `json:"replicas"`
	Alive       int   `json:"alive_members"`
	Chunks      int64 `json:"chunks"`
	Bytes       int64 `json:"bytes"`
	LocalBytes  int64 `json:"local_bytes"`
	MinCopies   int   `json:"min_copies"`
	UnderChunks int64 `json:"under_replicated_chunks"`
	UnderBytes  int64 `json:"under_replicated_bytes"`
	UnheldBytes int64 `json:"unheld_bytes"`
	Holders     []struct {
		Member string `json:"member"`
		Chunks int64  `json:"chunks"`
		Bytes  int64  `json:"bytes"`
	} `json:"holders"`
	Unanswered []string `json:"unanswered"`
	// Cold data.
	ColdChunks        int64 `json:"cold_chunks"`
	Stripes           int   `json:"stripes"`
	ParityBytes       int64 `json:"parity_bytes"`
	DegradedStripes   int   `json:"degraded_stripes"`
	UnreadableStripes int   `json:"unreadable_stripes"`
}

func dfCluster(t *testing.T, m *member) replicationOut {
	t.Helper()
	var out struct {
		Cluster *replicationOut `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "df", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	if out.Cluster == nil {
		t.Fatal("kylix df --json of a cluster member has no cluster object")
	}
	return *out.Cluster
}

func statCluster(t *testing.T, m *member, p string) replicationOut {
	t.Helper()
	var out struct {
		Cluster *replicationOut `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "stat", "--data", m.data, "--json", p)), &out); err != nil {
		t.Fatal(err)
	}
	if out.Cluster == nil {
		t.Fatal("kylix stat --json of a file on a cluster member has no cluster object")
	}
	return *out.Cluster
}

func inGrace(t *testing.T, m *member, name string) bool {
	t.Helper()
	var out struct {
		Placement struct {
			InGrace []string `json:"in_grace"`
		} `json:"placement"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	for _, n := range out.Placement.InGrace {
		if n == name {
			return true
		}
	}
	return false
}

type pushOut struct {
	PushedChunks   int64 `json:"pushed_chunks"`
	ReceivedChunks int64 `json:"received_chunks"`
	PulledChunks   int64 `json:"pulled_chunks"`
}

func pushStats(t *testing.T, m *member) pushOut {
	t.Helper()
	var out struct {
		Placement pushOut `json:"placement"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out.Placement
}

// TestClusterPush: three members, R=2. When kylix import on A returns, the
// file's chunks are already on their owners, pushed by A: A's stat, asked
// at once, finds every chunk on two members; the chunks B and C received
// by push are the ones A sent; df shows nothing under-replicated; B's stat
// agrees. Then A drops the copies it does not own (rebalance): two copies
// of each chunk remain, and the file still reads whole through A's mount.
func TestClusterPush(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startMember(t, "127.0.0.40", key, nil)
	b := startMember(t, "127.0.0.41", key, nil, a.addr)
	c := startMember(t, "127.0.0.42", key, nil, a.addr)
	ms := []*member{a, b, c}
	waitFor(t, membershipWait, "three alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 3 {
				return false
			}
		}
		return true
	})
	src, sum := randomFile(t, 16<<20+777)
	mustKylix(t, "/", "import", "--data", a.data, src, "p/m.bin")
	st := statCluster(t, a, "p/m.bin")
	if st.MinCopies < 2 || st.UnderChunks != 0 || st.Chunks == 0 || len(st.Unanswered) != 0 {
		t.Fatalf("right after the import, stat on A: %+v", st)
	}
	var held int64
	for _, h := range st.Holders {
		held += h.Chunks
	}
	if len(st.Holders) != 3 || held < 2*st.Chunks {
		t.Errorf("holders: %+v", st.Holders)
	}
	pa := pushStats(t, a)
	pb, pc := pushStats(t, b), pushStats(t, c)
	if pa.PushedChunks == 0 || pb.ReceivedChunks+pc.ReceivedChunks != pa.PushedChunks {
		t.Errorf("A pushed %d chunks; B received %d, C %d", pa.PushedChunks, pb.ReceivedChunks, pc.ReceivedChunks)
	}
	if d := dfCluster(t, a); d.UnderBytes != 0 || d.Bytes != st.Bytes {
		t.Errorf("df on A: %+v", d)
	}
	waitFor(t, nsWait, "p/m.bin in B's namespace", visible(filepath.Join(b.mnt, "p", "m.bin")))
	if sb := statCluster(t, b, "p/m.bin"); sb.MinCopies < 2 || sb.UnderChunks != 0 {
		t.Errorf("stat on B: %+v", sb)
	}
	if out := mustKylix(t, "/", "stat", "--data", a.data, "p/m.bin"); !strings.Contains(out, "under-replicated: 0 chunks") ||
		!strings.Contains(out, "held by 127.0.0.41") {
		t.Errorf("kylix stat on A:\n%s", out)
	}
	// Rebalance: A, the importer, drops the copies it does not own once
	// both their owners confirm them, so exactly R copies remain.
	waitFor(t, 30*time.Second, "exactly two copies of every chunk", func() bool {
		s := statCluster(t, a, "p/m.bin")
		var n int64
		for _, h := range s.Holders {
			n += h.Chunks
		}
		return s.MinCopies == 2 && n == 2*s.Chunks
	})
	if shaOn(t, a, filepath.Join(a.mnt, "p", "m.bin")) != sum {
		t.Fatal("bytes read through A's mount after it dropped copies differ from the source")
	}
}
