package test

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterReader: two nodes and a member started with --role reader,
// R = 2. A file imported on the reader goes to the two nodes (its owners:
// the reader owns nothing), the reader drops its own copies once they hold
// them, still reads the file whole through its mount (fetched), and every
// member lists it as a reader.
func TestClusterReader(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	data, mnt := dirs(t)
	if _, errs, code := kylix(t, "/", "serve", "--data", data, "--mount", mnt, "--listen", "127.0.0.93:0",
		"--cluster-key", key, "--role", "writer"); code == 0 || !strings.Contains(errs, "--role") || isMounted(mnt) {
		t.Fatalf("serve --role writer: exit %d, stderr %q; want a failure naming --role, nothing mounted", code, errs)
	}
	a := startMember(t, "127.0.0.90", key, nil)
	b := startMember(t, "127.0.0.91", key, nil, a.addr)
	r := startMemberArgs(t, "127.0.0.92", key, nil, []string{"--role", "reader"}, a.addr)
	ms := []*member{a, b, r}
	waitFor(t, membershipWait, "three alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 3 {
				return false
			}
		}
		return true
	})
	var out struct {
		Members []struct {
			Name string `json:"name"`
			Role string `json:"role"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", a.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, m := range out.Members {
		roles[m.Name] = m.Role
	}
	if roles["127.0.0.90"] != "node" || roles["127.0.0.91"] != "node" || roles["127.0.0.92"] != "reader" {
		t.Fatalf("roles as A sees them: %v", roles)
	}

	src, sum := randomFile(t, 12<<20+321)
	mustKylix(t, "/", "import", "--data", r.data, src, "r/m.bin")
	waitFor(t, 60*time.Second, "every chunk on A and B, none on the reader (it dropped its copies)", func() bool {
		s := statCluster(t, r, "r/m.bin")
		if s.Chunks == 0 || s.MinCopies != 2 {
			return false
		}
		full := 0
		for _, h := range s.Holders {
			switch {
			case h.Member == "127.0.0.92" && h.Chunks != 0:
				return false
			case h.Member != "127.0.0.92" && h.Chunks == s.Chunks:
				full++
			}
		}
		return full == 2
	})
	if _, pl := peersJSON(t, r); pl.OwnedChunks != 0 || pl.PulledChunks != 0 {
		t.Errorf("the reader's placement: %+v; want nothing owned or pulled", pl)
	}
	if shaOn(t, r, filepath.Join(r.mnt, "r", "m.bin")) != sum {
		t.Fatal("bytes read through the reader's mount differ from the source")
	}
	waitFor(t, nsWait, "r/m.bin in B's namespace", visible(filepath.Join(b.mnt, "r", "m.bin")))
	if shaOn(t, b, filepath.Join(b.mnt, "r", "m.bin")) != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
}

// TestClusterMetrics: a member's --metrics endpoint reports the cluster:
// members by state, and what a reader (it owns nothing) fetched from the
// others to read a file through its mount, byte for byte, which they
// served; a node outside a cluster reports none of it.
func TestClusterMetrics(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	aAddr, rAddr := freeAddr(t), freeAddr(t)
	a := startMemberArgs(t, "127.0.0.96", key, nil, []string{"--metrics", aAddr})
	r := startMemberArgs(t, "127.0.0.97", key, nil, []string{"--role", "reader", "--metrics", rAddr}, a.addr)
	waitFor(t, membershipWait, "two alive members seen by each", func() bool {
		return aliveCount(t, a) == 2 && aliveCount(t, r) == 2
	})
	src, sum := randomFile(t, 6<<20+123)
	mustKylix(t, "/", "import", "--data", a.data, src, "m/f.bin")
	p := filepath.Join(r.mnt, "m", "f.bin")
	waitFor(t, membershipWait, "the file in the reader's namespace", func() bool { _, err := os.Stat(p); return err == nil })
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, sum, sha256.Sum256(b), "the file through the reader's mount")

	mr := metrics(t, "http://"+rAddr+"/metrics")
	assert.Equal(t, 2.0, mr[`kylix_cluster_members{state="alive"}`])
	assert.Zero(t, mr[`kylix_cluster_members{state="failed"}`])
	assert.GreaterOrEqual(t, mr["kylix_cluster_fetched_bytes_total"], float64(len(b)), "the reader fetched every byte it read")
	assert.Positive(t, mr["kylix_cluster_fetched_chunks_total"])
	assert.Zero(t, mr["kylix_cluster_bad_chunks_total"])
	ma := metrics(t, "http://"+aAddr+"/metrics")
	assert.GreaterOrEqual(t, ma["kylix_cluster_served_bytes_total"], float64(len(b)), "A served them")
	for _, name := range []string{"kylix_cluster_repair_pulled_bytes_total", "kylix_cluster_stripe_rebuilt_chunks_total", "kylix_cluster_peer_cache_bytes", "kylix_cluster_peer_cache_not_kept_total"} {
		_, ok := ma[name]
		assert.True(t, ok, "%s reported", name)
	}

	// A node outside a cluster reports no cluster series.
	data, mnt := dirs(t)
	addr := freeAddr(t)
	launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--metrics", addr)
	for name := range metrics(t, "http://"+addr+"/metrics") {
		assert.NotContains(t, name, "kylix_cluster_", "a single node")
	}
}
