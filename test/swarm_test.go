package test

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// swarmOut is what the swarm test reads from `kylix peers --json`.
type swarmOut struct {
	Swarm struct {
		Cache struct {
			Hits   int64 `json:"hits"`
			Chunks int   `json:"chunks"`
		} `json:"cache"`
		RelayServed int64 `json:"relay_served"`
	} `json:"swarm"`
	Members []struct {
		Name            string `json:"name"`
		Self            bool   `json:"self"`
		State           string `json:"state"`
		FetchedBytes    int64  `json:"bytes_fetched"`
		ServedPackBytes int64  `json:"bytes_served_from_packs"`
	} `json:"members"`
}

func swarmJSON(t *testing.T, m *member) swarmOut {
	t.Helper()
	var out swarmOut
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "peers", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// packBytes sums the bytes the members served from their packs (as
// holders of the chunks, not from a cache).
func packBytes(t *testing.T, ms []*member) int64 {
	var s int64
	for _, m := range ms {
		for _, p := range swarmJSON(t, m).Members {
			if p.Self {
				s += p.ServedPackBytes
			}
		}
	}
	return s
}

// TestClusterSwarm: five members; a model (two files) imported on A and
// placed (R=2); then B..E read it through their mounts at once. Every byte
// is right, and the bytes that left the holders' packs during the read are
// at most 1.5 times the model (each chunk's relay fetched it once and
// served the others). B restarted reads the model again with no byte from
// the network: the chunks it does not own come from its peer cache.
//
// KYLIX_SWARM_NO_RELAY=1 runs the members with the relay off (each reader
// asks the holders): the figure before the relay, logged, not asserted.
func TestClusterSwarm(t *testing.T) {
	requireFUSE(t)
	noRelay := os.Getenv("KYLIX_SWARM_NO_RELAY") == "1"
	var env []string
	if noRelay {
		env = []string{"KYLIX_TEST_PEER_NO_RELAY=1"}
	}
	key := clusterKey(t)
	a := startMember(t, "127.0.0.30", key, env)
	ms := []*member{a}
	for _, ip := range []string{"127.0.0.31", "127.0.0.32", "127.0.0.33", "127.0.0.34"} {
		ms = append(ms, startMember(t, ip, key, env, a.addr))
	}
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
	files := []string{"model/a.safetensors", "model/b.safetensors"}
	sums := map[string][32]byte{}
	var size int64
	for _, f := range files {
		src, sum := randomFile(t, 24<<20)
		mustKylix(t, "/", "import", "--data", a.data, src, f)
		sums[f] = sum
		size += 24 << 20
	}
	waitFor(t, 60*time.Second, "the chunks B..E own pulled", func() bool {
		for _, m := range ms[1:] {
			for _, f := range files {
				if _, err := os.Stat(filepath.Join(m.mnt, f)); err != nil {
					return false
				}
			}
			if _, pl := peersJSON(t, m); pl.OwnedMissing != 0 || pl.Members != 5 {
				return false
			}
		}
		return true
	})
	placed := packBytes(t, ms)

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(ms))
	for i, m := range ms[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, f := range files {
				h := sha256.New()
				r, err := os.Open(filepath.Join(m.mnt, f))
				if err == nil {
					_, err = io.Copy(h, r)
					r.Close()
				}
				if err == nil && [32]byte(h.Sum(nil)) != sums[f] {
					err = fmt.Errorf("%s read through %s's mount differs from the source", f, m.addr)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	read := packBytes(t, ms)
	ratio := float64(read-placed) / float64(size)
	t.Logf("relay off: %v; model %d MiB; 4 readers at once in %v; bytes leaving the holders' packs during the read / model = %.2f (placement before it: %.2f)",
		noRelay, size>>20, took.Round(time.Millisecond), ratio, float64(placed)/float64(size))
	if noRelay {
		return
	}
	if ratio > 1.5 {
		t.Errorf("the holders served %.2f times the model to 4 readers at once, want at most 1.5", ratio)
	}

	// B restarted (memory cache and page cache gone) reads the model again
	// from its packs and its peer cache: nothing is fetched.
	b := ms[1]
	b.stop()
	b.node = launchNode(t, b.data, b.mnt, env, nil, "--listen", b.addr, "--cluster-key", key, "--node-name", "127.0.0.31", "--join", a.addr, "--log-gossip")
	waitFor(t, membershipWait, "five alive members seen by B", func() bool { return aliveCount(t, b) == 5 })
	for _, f := range files {
		if shaOn(t, b, filepath.Join(b.mnt, f)) != sums[f] {
			t.Fatalf("%s read again through B's mount differs from the source", f)
		}
	}
	out := swarmJSON(t, b)
	for _, p := range out.Members {
		if p.FetchedBytes != 0 {
			t.Errorf("B fetched %d bytes from %s on its second read", p.FetchedBytes, p.Name)
		}
	}
	if out.Swarm.Cache.Hits == 0 {
		t.Errorf("B's second read did not hit its peer cache: %+v", out.Swarm)
	}
	t.Logf("B's second read: %d peer cache hits", out.Swarm.Cache.Hits)
	if h := mustKylix(t, "/", "peers", "--data", b.data); !strings.Contains(h, "peer cache: ") || !strings.Contains(h, "hits ") {
		t.Errorf("kylix peers shows no peer cache line:\n%s", h)
	}
}
