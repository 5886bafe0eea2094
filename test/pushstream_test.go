package test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Push while the import reads (docs/design/peers.md, "Push on import"):
// clusters of real `kylix serve` processes on 127.0.0.70-75.

// pauseMember stops m's process (SIGSTOP): it answers nothing, its
// connections stay open. The returned func continues it; a cleanup
// continues it too, so that the node can be stopped at the end.
func pauseMember(t *testing.T, m *member) func() {
	t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume := func() { m.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(resume)
	return resume
}

// startImport starts `kylix import` of src to dest on m; wait returns its
// exit code and stderr.
func startImport(t *testing.T, m *member, src, dest string) (done func() bool, wait func() (int, string)) {
	t.Helper()
	cmd := exec.Command(kylixBin, "import", "--data", m.data, src, dest)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var err error
	go func() { err = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	done = func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}
	wait = func() (int, string) {
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			t.Fatalf("kylix import on %s did not return in 2 minutes; node log:\n%s", m.addr, m.log)
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), errb.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, errb.String()
	}
	return done, wait
}

// committed reports whether path is in m's namespace (kylix stat answers).
func committed(t *testing.T, m *member, path string) bool {
	_, _, code := kylix(t, "/", "stat", "--data", m.data, path)
	return code == 0
}

func threeMembers(t *testing.T, ips [3]string, extra []string) (a, b, c *member) {
	t.Helper()
	key := clusterKey(t)
	a = startMemberArgs(t, ips[0], key, nil, extra)
	b = startMemberArgs(t, ips[1], key, nil, extra, a.addr)
	c = startMemberArgs(t, ips[2], key, nil, extra, a.addr)
	waitFor(t, membershipWait, "three alive members seen by each", func() bool {
		for _, m := range []*member{a, b, c} {
			if aliveCount(t, m) != 3 {
				return false
			}
		}
		return true
	})
	return a, b, c
}

// TestClusterPushStreams: three members, R=2. The owners get the chunks
// while the import on A still reads: with C paused (so the import cannot
// finish: C's batches wait unanswered), B has received chunks and A has
// not committed the file yet. Once C continues, the import returns; at
// that moment every chunk is on two members (stat on A, asked at once),
// what B and C received is what A pushed, nothing is named on stderr, a
// kylix gc on the owners right away removes none of it, and the file
// reads whole through B's mount.
func TestClusterPushStreams(t *testing.T) {
	requireFUSE(t)
	a, b, c := threeMembers(t, [3]string{"127.0.0.70", "127.0.0.71", "127.0.0.72"}, nil)
	src, sum := randomFile(t, 96<<20+333)
	resume := pauseMember(t, c)
	done, wait := startImport(t, a, src, "s/m.bin")
	waitFor(t, 60*time.Second, "B to receive chunks of the import", func() bool {
		return pushStats(t, b).ReceivedChunks > 0 || done()
	})
	if done() {
		code, errs := wait()
		t.Fatalf("the import returned (exit %d) while its owner C was paused; stderr: %s", code, errs)
	}
	if committed(t, a, "s/m.bin") {
		t.Fatal("B received chunks only after the import committed on A: no push while reading")
	}
	resume()
	code, errs := wait()
	if code != 0 || strings.Contains(errs, "not copied") {
		t.Fatalf("kylix import: exit %d, stderr: %s", code, errs)
	}
	st := statCluster(t, a, "s/m.bin")
	if st.MinCopies < 2 || st.UnderChunks != 0 || st.Chunks == 0 || len(st.Unanswered) != 0 {
		t.Fatalf("right after the import, stat on A: %+v", st)
	}
	pa, pb, pc := pushStats(t, a), pushStats(t, b), pushStats(t, c)
	if pa.PushedChunks == 0 || pb.ReceivedChunks+pc.ReceivedChunks != pa.PushedChunks {
		t.Errorf("A pushed %d chunks; B received %d, C %d", pa.PushedChunks, pb.ReceivedChunks, pc.ReceivedChunks)
	}
	for _, m := range []*member{b, c} {
		var g struct {
			Removed int `json:"chunks_removed"`
		}
		if err := json.Unmarshal([]byte(mustKylix(t, "/", "gc", "--data", m.data, "--json")), &g); err != nil {
			t.Fatal(err)
		}
		if g.Removed != 0 {
			t.Errorf("kylix gc on %s right after the import removed %d chunks", m.addr, g.Removed)
		}
	}
	if st := statCluster(t, a, "s/m.bin"); st.MinCopies < 2 || st.UnderChunks != 0 {
		t.Errorf("after kylix gc on the owners, stat on A: %+v", st)
	}
	onB := filepath.Join(b.mnt, "s", "m.bin")
	waitFor(t, nsWait, "s/m.bin in B's mount", visible(onB))
	if shaOn(t, b, onB) != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
}

// TestClusterPushOwnerKilled: an owner (C) stops answering in the middle
// of an import on A and is then killed with SIGKILL. The import still
// succeeds (exit 0, the file is in A's namespace and reads whole), names
// C on stderr, and once C's failure grace is over the chunks reach their
// owners among the members left: stat on A finds two copies of each.
func TestClusterPushOwnerKilled(t *testing.T) {
	requireFUSE(t)
	a, b, c := threeMembers(t, [3]string{"127.0.0.73", "127.0.0.74", "127.0.0.75"}, []string{"--failure-grace", "4s"})
	src, sum := randomFile(t, 64<<20+17)
	pauseMember(t, c)
	done, wait := startImport(t, a, src, "k/m.bin")
	waitFor(t, 60*time.Second, "B to receive chunks of the import", func() bool {
		return pushStats(t, b).ReceivedChunks > 0 || done()
	})
	if done() {
		code, errs := wait()
		t.Fatalf("the import returned (exit %d) while its owner C was paused; stderr: %s", code, errs)
	}
	c.kill9()
	syscall.Unmount(c.mnt, syscall.MNT_DETACH)
	code, errs := wait()
	if code != 0 {
		t.Fatalf("kylix import with an owner killed: exit %d, stderr: %s", code, errs)
	}
	if !strings.Contains(errs, "not copied to member 127.0.0.75") {
		t.Errorf("the import's stderr does not name the killed owner: %s", errs)
	}
	if !committed(t, a, "k/m.bin") {
		t.Fatal("the import returned 0 but the file is not in A's namespace")
	}
	if shaOn(t, a, filepath.Join(a.mnt, "k", "m.bin")) != sum {
		t.Fatal("bytes read through A's mount differ from the source")
	}
	waitFor(t, 90*time.Second, "two copies of every chunk on A and B", func() bool {
		st := statCluster(t, a, "k/m.bin")
		return st.Alive == 2 && st.MinCopies == 2 && st.UnderChunks == 0
	})
	onB := filepath.Join(b.mnt, "k", "m.bin")
	waitFor(t, nsWait, "k/m.bin in B's mount", visible(onB))
	if shaOn(t, b, onB) != sum {
		t.Fatal("bytes read through B's mount differ from the source")
	}
}
