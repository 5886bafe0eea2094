package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// shardRulesOn is m's kylix tier shards --json listing: k by path of the
// cluster's rules.
func shardRulesOn(t *testing.T, m *member) map[string]int {
	t.Helper()
	var out struct {
		Rules []struct {
			Path  string `json:"path"`
			K     int    `json:"k"`
			From  string `json:"from"`
			Error string `json:"error"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "tier", "shards", "--data", m.data, "--json")), &out); err != nil {
		t.Fatal(err)
	}
	rules := map[string]int{}
	for _, r := range out.Rules {
		if r.From == "cluster" && r.Error == "" {
			rules[r.Path] = r.K
		}
	}
	return rules
}

// tierColdShape runs kylix tier cold --json of p on m and returns the
// shape it coded in and the files it converted.
func tierColdShape(t *testing.T, m *member, p string) (string, int) {
	t.Helper()
	var out struct {
		Files   int    `json:"files"`
		Stripes int    `json:"stripes"`
		Shape   string `json:"shape"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, "/", "tier", "--data", m.data, "--json", "cold", p)), &out); err != nil {
		t.Fatal(err)
	}
	if out.Stripes == 0 {
		t.Fatalf("kylix tier cold %s on %s coded no stripe: %+v", p, m.addr, out)
	}
	return out.Shape, out.Files
}

// TestClusterTierShards: the cold tier's k per path kept in the namespace
// for the whole cluster, with eight `kylix serve` processes (the default
// is then 6+2). kylix tier shards models/narrow 5 on A reaches B with the
// namespace merge, and kylix tier cold on B codes a file under it in 5+2
// stripes and one elsewhere in 6+2; the rule cleared on B leaves A's
// listing after the merge, a rule for a path not there yet is kept and
// said so. Bad input is refused with what is allowed; a node that is not
// in a cluster, or no node at all, says it needs a cluster member.
func TestClusterTierShards(t *testing.T) {
	requireFUSE(t)
	single := startNode(t, filepath.Join(t.TempDir(), "single"), filepath.Join(t.TempDir(), "mnt"))
	if _, errs, code := kylix(t, "/", "tier", "shards", "--data", single.data); code != 1 || !strings.Contains(errs, "not in a cluster") {
		t.Errorf("kylix tier shards on a single node: exit %d, %s", code, errs)
	}
	single.stop()
	if _, errs, code := kylix(t, "/", "tier", "shards", "--data", single.data, "models", "5"); code != 1 || !strings.Contains(errs, "no node serves") || !strings.Contains(errs, "kylix serve --listen") {
		t.Errorf("kylix tier shards without a node: exit %d, %s", code, errs)
	}

	key := clusterKey(t)
	var ms []*member
	for i := range 8 {
		var join []string
		if i > 0 {
			join = []string{ms[0].addr}
		}
		ms = append(ms, startMember(t, fmt.Sprintf("127.0.0.%d", 140+i), key, nil, join...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of A:\n%s\nlog of B:\n%s", ms[0].log, ms[1].log)
		}
	})
	waitFor(t, membershipWait, "eight alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 8 {
				return false
			}
		}
		return true
	})
	a, b := ms[0], ms[1]

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"models/narrow", "x"}, 2, `K "x" is not a number`},
		{[]string{"models/narrow"}, 2, "give K"},
		{[]string{"models/narrow", "5", "--clear"}, 2, "--clear takes PATH alone"},
		{[]string{"models/narrow", "4"}, 1, "want 5 to 10 data shards"},
		{[]string{"models/narrow", "11"}, 1, "want 5 to 10 data shards"},
		{[]string{".kylix-policy/x", "5"}, 1, "reserved"},
	} {
		args := append([]string{"tier", "shards", "--data", a.data}, c.args...)
		if out, errs, code := kylix(t, "/", args...); code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("kylix %s: exit %d (want %d)\nstdout: %s\nstderr: %s (want %q)", strings.Join(args, " "), code, c.code, out, errs, c.want)
		}
	}
	if out := mustKylix(t, "/", "tier", "shards", "--data", a.data); !strings.Contains(out, "no rules of k by path") || !strings.Contains(out, "6+2") {
		t.Errorf("kylix tier shards with no rule: %s", out)
	}

	src, _ := randomFile(t, 4<<20)
	mustKylix(t, "/", "import", "--data", a.data, src, "models/narrow/x.bin")
	src2, _ := randomFile(t, 4<<20)
	mustKylix(t, "/", "import", "--data", a.data, src2, "models/wide.bin")
	if out := mustKylix(t, "/", "tier", "shards", "--data", a.data, "models/narrow", "5"); !strings.Contains(out, "shards /models/narrow: stripes of 5+2") || strings.Contains(out, "nothing is at") {
		t.Errorf("kylix tier shards models/narrow 5: %s", out)
	}
	if out := mustKylix(t, "/", "tier", "shards", "--data", a.data, "/later/", "7"); !strings.Contains(out, "nothing is at /later yet") {
		t.Errorf("kylix tier shards of a path not there yet: %s", out)
	}
	waitFor(t, nsWait, "A's rules and files on B", func() bool {
		r := shardRulesOn(t, b)
		_, _, code := kylix(t, "/", "stat", "--data", b.data, "models/wide.bin")
		return r["/models/narrow"] == 5 && r["/later"] == 7 && code == 0
	})
	if out := mustKylix(t, "/", "tier", "shards", "--data", b.data); !strings.Contains(out, "/models/narrow") || !strings.Contains(out, "5+2") || !strings.Contains(out, "cluster") {
		t.Errorf("kylix tier shards on B:\n%s", out)
	}

	// B converts: the file under the rule in 5+2, the other in 6+2.
	if shape, files := tierColdShape(t, b, "models/narrow"); shape != "5+2" || files != 1 {
		t.Errorf("kylix tier cold models/narrow on B: %d files in %q, want 1 in 5+2", files, shape)
	}
	if shape, files := tierColdShape(t, b, "models/wide.bin"); shape != "6+2" || files != 1 {
		t.Errorf("kylix tier cold models/wide.bin on B: %d files in %q, want 1 in the default 6+2", files, shape)
	}

	// Cleared on B: gone from A's listing after the merge.
	if out := mustKylix(t, "/", "tier", "shards", "--data", b.data, "models/narrow", "--clear"); !strings.Contains(out, "rule removed") {
		t.Errorf("kylix tier shards models/narrow --clear: %s", out)
	}
	if out := mustKylix(t, "/", "tier", "shards", "--data", b.data, "models/narrow", "--clear"); !strings.Contains(out, "no cluster rule was there") {
		t.Errorf("kylix tier shards --clear again: %s", out)
	}
	waitFor(t, nsWait, "the cleared rule gone from A's listing", func() bool {
		r := shardRulesOn(t, a)
		_, ok := r["/models/narrow"]
		return !ok && r["/later"] == 7
	})
}
