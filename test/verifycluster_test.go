package test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestVerifyClusterMember: on a healthy member of a two-member cluster
// with one copy of each chunk (R=1), kylix verify reports the chunks other
// members hold as "not stored here ... held by the cluster" and exits 0
// (it said CORRUPT missing-chunk and exited 1). After the member holding
// them is killed, the same chunks are reported as held by no member that
// answered, and verify exits 1.
func TestVerifyClusterMember(t *testing.T) {
	requireFUSE(t)
	a, b, _ := startPairR1(t, "127.0.0.66", "127.0.0.67")
	src, _ := randomFile(t, 24<<20+777)
	mustKylix(t, "/", "import", "--data", a.data, src, "v/f.bin")
	waitFor(t, nsWait, "v/f.bin in B's namespace", visible(filepath.Join(b.mnt, "v", "f.bin")))

	out, errs, code := kylix(t, "/", "verify", "--data", b.data)
	if code != 0 || strings.Contains(out, "CORRUPT") || !strings.Contains(out, "held by the cluster") || !strings.Contains(out, "not stored here: ") {
		t.Fatalf("verify on a healthy member: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	t.Logf("healthy member:\n%s", out)
	js, errs, code := kylix(t, "/", "verify", "--json", "--data", b.data)
	var rep struct {
		NotHere  *int  `json:"not_stored_here"`
		Problems []any `json:"problems"`
	}
	if code != 0 || json.Unmarshal([]byte(js), &rep) != nil || rep.NotHere == nil || *rep.NotHere == 0 || len(rep.Problems) != 0 {
		t.Fatalf("verify --json on a healthy member: exit %d\nstdout: %s\nstderr: %s", code, js, errs)
	}

	a.kill9()
	syscall.Unmount(a.mnt, syscall.MNT_DETACH)
	out, errs, code = kylix(t, "/", "verify", "--data", b.data)
	if code != 1 || !strings.Contains(out, "LOST missing-chunk") {
		t.Fatalf("verify after the only holder died: exit %d, want 1 and LOST\nstdout: %s\nstderr: %s", code, out, errs)
	}
	t.Logf("holder gone:\n%s", out)
}
