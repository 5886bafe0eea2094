package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClusterPinResumedAtRestart: a node that stops while a pin is still
// fetching its chunks (the record marks it pending), or whose recorded pin
// lacks chunks here when it starts, fetches them from the members once it
// is back in the cluster, and holds the pin. Before, the pending pin was
// dropped and the other stayed "not held" for good. The record is written
// as a node killed in the middle of `kylix pin` leaves it (DATA/pins.json,
// docs/design/pin.md), while B is stopped.
func TestClusterPinResumedAtRestart(t *testing.T) {
	requireFUSE(t)
	a, b, key := startPairR1(t, "127.0.0.50", "127.0.0.51")
	files := map[string][32]byte{}
	for _, name := range []string{"cp/pending.bin", "cp/recorded.bin"} {
		src, sum := randomFile(t, 20<<20+333)
		mustKylix(t, "/", "import", "--data", a.data, src, name)
		waitFor(t, nsWait, name+" in B's namespace", visible(filepath.Join(b.mnt, name)))
		if st := clusterStat(t, b, name); *st.LocalBytes >= st.Size {
			t.Fatalf("B stores all of %s before the test (R=1, two members)", name)
		}
		files[name] = sum
	}

	b.stop()
	added := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339Nano)
	rec := fmt.Sprintf(`{"version":1,"pins":[{"path":"cp/pending.bin","added":%q,"pending":true},{"path":"cp/recorded.bin","added":%q}]}`, added, added)
	if err := os.WriteFile(filepath.Join(b.data, "pins.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	b2 := &member{node: launchNode(t, b.data, b.mnt, nil, nil, "--listen", b.addr, "--cluster-key", key, "--node-name", "127.0.0.51", "--log-gossip", "--replicas", "1", "--join", a.addr), addr: b.addr}

	type pinsOut struct {
		Pins struct {
			Pins []struct {
				Path  string `json:"path"`
				Held  bool   `json:"held"`
				State string `json:"state"`
			} `json:"pins"`
		} `json:"pins"`
	}
	var last pinsOut
	waitFor(t, 90*time.Second, "both recorded pins held on B after its restart", func() bool {
		var out pinsOut
		if err := json.Unmarshal([]byte(mustKylix(t, "/", "node", "--data", b2.data, "--json")), &out); err != nil {
			t.Fatal(err)
		}
		last = out
		held := 0
		for _, p := range out.Pins.Pins {
			if p.Held {
				held++
			}
		}
		return len(out.Pins.Pins) == 2 && held == 2
	})
	t.Logf("pins on B: %+v", last.Pins.Pins)
	for name, sum := range files {
		if st := clusterStat(t, b2, name); *st.LocalBytes != st.Size || !st.Pinned {
			t.Errorf("after the restart, B stores %d of %d bytes of %s (pinned %v)", *st.LocalBytes, st.Size, name, st.Pinned)
		}
		if shaOn(t, b2, filepath.Join(b2.mnt, name)) != sum {
			t.Errorf("%s read through B's mount differs from the source", name)
		}
	}
	logText := b2.log.String()
	if !strings.Contains(logText, "a pin was still fetching its chunks when the node stopped; it is resumed") ||
		strings.Count(logText, "pinned again after fetching its missing chunks from the members") != 2 {
		t.Errorf("B's log does not say both pins were resumed:\n%s", logText)
	}
	recB, err := os.ReadFile(filepath.Join(b2.data, "pins.json"))
	if err != nil || strings.Contains(string(recB), `"pending":`) || !strings.Contains(string(recB), `"cp/pending.bin"`) {
		t.Errorf("B's pin record after the restart: %s %v", recB, err)
	}
}

// TestClusterLoadFetches: kylix load on a member that stores only part of
// a file (R=1, two members) fetches the rest from the other member while
// it loads, and places every byte (--device host, --check: read back and
// compared with the store). Whole files and a tensor-parallel share of a
// safetensors model (strided copies of fetched chunks) both. The fetched
// chunks are not written into B's packs.
func TestClusterLoadFetches(t *testing.T) {
	requireFUSE(t)
	a, b, _ := startPairR1(t, "127.0.0.54", "127.0.0.55")
	src, _ := randomFile(t, 24<<20+77)
	mustKylix(t, "/", "import", "--data", a.data, src, "cp/load.bin")
	models := t.TempDir()
	mustKylix(t, "/", "demo-model", "--size", "48MiB", models)
	mustKylix(t, "/", "import", "--data", a.data, filepath.Join(models, "base"), "cp/model")
	waitFor(t, nsWait, "cp/load.bin and cp/model in B's namespace", func() bool {
		return visible(filepath.Join(b.mnt, "cp", "load.bin"))() && visible(filepath.Join(b.mnt, "cp", "model"))()
	})
	before := clusterStat(t, b, "cp/load.bin")
	if *before.LocalBytes >= before.Size {
		t.Fatalf("B stores all of cp/load.bin before the test (R=1, two members)")
	}
	type report struct {
		Bytes         int64 `json:"bytes"`
		FetchedChunks int   `json:"fetched_chunks"`
		Fetched       int64 `json:"fetched_bytes"`
		Files         []struct {
			Checked bool   `json:"checked"`
			IO      string `json:"io"`
		} `json:"files"`
	}
	load := func(args ...string) report {
		t.Helper()
		out := mustKylix(t, "/", append([]string{"load", "--data", b.data, "--device", "host", "--check", "--json"}, args...)...)
		var rep report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, f := range rep.Files {
			if !f.Checked {
				t.Fatalf("kylix load %v: a file not checked: %s", args, out)
			}
		}
		return rep
	}
	rep := load("cp/load.bin")
	// Every chunk B lacks was fetched once, during the load.
	if rep.Bytes != 24<<20+77 || len(rep.Files) != 1 || rep.Fetched != before.Size-*before.LocalBytes || rep.FetchedChunks == 0 || !strings.Contains(rep.Files[0].IO, "fetched") {
		t.Fatalf("kylix load on B: %+v; want %d bytes fetched (B stores %d of %d)", rep, before.Size-*before.LocalBytes, *before.LocalBytes, before.Size)
	}
	if st := clusterStat(t, b, "cp/load.bin"); *st.LocalBytes != *before.LocalBytes {
		t.Errorf("after kylix load, B stores %d of %d bytes; want %d as before: a load does not write into the packs", *st.LocalBytes, st.Size, *before.LocalBytes)
	}
	// A tensor-parallel share of a model only partly on B.
	rep = load("--tp-size", "2", "--tp-rank", "1", "cp/model")
	if rep.FetchedChunks == 0 || len(rep.Files) == 0 {
		t.Fatalf("kylix load --tp-size 2 --tp-rank 1 on B fetched nothing: %+v", rep)
	}
}
