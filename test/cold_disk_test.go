package test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// smallDisk mounts a tmpfs of size bytes under a new temporary directory
// and returns its path; it is unmounted at the end of the test, after the
// members started later have stopped (cleanups run last first). The test
// is skipped when the mount is refused.
func smallDisk(t *testing.T, size int64) string {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		t.Skipf("cannot mount a tmpfs of %d bytes for a member's data: %v", size, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(disk, 0); err != nil {
			t.Errorf("unmounting the tmpfs at %s: %v", disk, err)
			unix.Unmount(disk, unix.MNT_DETACH)
		}
	})
	return disk
}

// startMemberOn is startMemberArgs with the member's data directory at
// data (on a file system of the test's choosing).
func startMemberOn(t *testing.T, ip, key, data string, extra []string, join ...string) *member {
	t.Helper()
	mnt := filepath.Join(openTempDir(t), "mnt") // other users may write through it
	addr := gossipAddr(t, ip)
	args := append([]string{"--listen", addr, "--cluster-key", key, "--node-name", ip, "--log-gossip", "--leave-delay", "10ms"}, extra...)
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	return &member{node: launchNode(t, data, mnt, nil, nil, args...), addr: addr}
}

// fillDisk appends to the file at p until its file system answers
// ENOSPC, and returns the bytes it added. Called again, it takes back
// whatever was freed meanwhile.
func fillDisk(t *testing.T, p string) int64 {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("filling %s: %v", p, err)
		}
	}
}

// freeBytes is what an unprivileged writer may still write on the file
// system at p.
func freeBytes(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// processAlive reports whether the node's process still runs (not a
// zombie: nothing waits for it until the test stops it).
func processAlive(n *node) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// TestClusterColdRepairFullDisk: eight `kylix serve` processes, each
// with its data on a tmpfs of the same size (capacity is the placement
// weight: equal file systems keep the full member an owner like any
// other). A file goes cold in 6+2 stripes and settles, one copy of each
// shard. Then one member's disk (F) is filled to ENOSPC and another
// holder (K) is killed with SIGKILL: past the failure grace, seven
// members cannot hold 8-wide stripes, so each shard goes to its two
// owners, K's rebuilt from their stripes, and F owns some it cannot
// store. Throughout, the file reads byte-equal through another member's
// mount and through F's; F keeps answering (kylix peers, df, stat) and
// says in its placement report that it misses owned chunks; the other
// owners repair around it (no stripe degraded, none past repair, no chunk
// unheld). Once the filler is removed, F stores what it owns at its next
// pass (a pass that failed to store runs again after placeRetry, doubling
// up to 30 s): no owned chunk missing, every chunk on two members, and the
// file still reads byte-equal.
func TestClusterColdRepairFullDisk(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	last := time.Now()
	took := func(what string) { // how long each step took, for a slow run
		t.Logf("%s: %s", what, time.Since(last).Round(time.Millisecond))
		last = time.Now()
	}
	const diskSize = 96 << 20
	const (
		a    = 0 // imports and converts
		r    = 1 // reads through its mount
		full = 3 // its disk fills up
		kill = 5 // killed with SIGKILL
	)
	var ms []*member
	var disks []string
	for i := range 8 {
		disk := smallDisk(t, diskSize)
		disks = append(disks, disk)
		// Each joins every member started before it: its push/pull with
		// each tells them of it directly. Joining the first alone, a
		// member that missed the gossip of a later join learnt of it only
		// at its next 30 s push/pull with a random member (in 4 runs of 12
		// here), which is not what this test is about.
		var join []string
		for _, m := range ms {
			join = append(join, m.addr)
		}
		ms = append(ms, startMemberOn(t, fmt.Sprintf("127.0.0.%d", 120+i), key, filepath.Join(disk, "data"),
			[]string{"--failure-grace", "3s"}, join...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range ms {
				t.Logf("log of %s:\n%s", m.addr, m.log)
			}
		}
	})
	f := ms[full]
	fname := f.addr[:strings.LastIndex(f.addr, ":")]
	waitFor(t, membershipWait, "eight alive members seen by each", func() bool {
		for _, m := range ms {
			if aliveCount(t, m) != 8 {
				return false
			}
		}
		return true
	})
	took("eight members started and alive for each")

	src, sum := randomFile(t, 24<<20)
	mustKylix(t, "/", "import", "--data", ms[a].data, src, "d/f.bin")
	for _, m := range []*member{ms[r], f} {
		waitFor(t, nsWait, "d/f.bin in the mount of "+m.addr, visible(filepath.Join(m.mnt, "d/f.bin")))
	}
	if out := mustKylix(t, "/", "tier", "--data", ms[a].data, "cold", "d"); !strings.Contains(out, "of 6+2") {
		t.Fatalf("kylix tier cold: %s", out)
	}
	var cold replicationOut
	waitFor(t, 90*time.Second, "every chunk held once, no stripe missing a shard", func() bool {
		cold = dfCluster(t, ms[a])
		var held int64
		for _, h := range cold.Holders {
			held += h.Bytes
		}
		return cold.ColdChunks == cold.Chunks && cold.UnderChunks == 0 && cold.DegradedStripes == 0 && held == cold.Bytes && cold.Bytes == 24<<20
	})
	took(fmt.Sprintf("imported, cold in %d stripes, each shard held once", cold.Stripes))
	if shaOn(t, ms[r], filepath.Join(ms[r].mnt, "d/f.bin")) != sum {
		t.Fatal("cold d/f.bin read through R's mount differs from the source")
	}

	// F's disk full: nothing more can be stored there.
	filler := filepath.Join(disks[full], "filler")
	filled := fillDisk(t, filler)
	t.Logf("filled F's disk with %d bytes; %d left", filled, freeBytes(t, disks[full]))
	_, before := peersJSON(t, f)

	// K killed: past the grace, the 8-wide stripes do not fit the seven
	// left, and each shard goes to its two owners (F among them for some).
	ms[kill].kill9()
	syscall.Unmount(ms[kill].mnt, syscall.MNT_DETACH)
	if shaOn(t, ms[r], filepath.Join(ms[r].mnt, "d/f.bin")) != sum {
		t.Fatal("d/f.bin read through R's mount with K killed differs from the source")
	}
	waitFor(t, 60*time.Second, "F's placement to report owned chunks it cannot store", func() bool {
		fillDisk(t, filler) // whatever F freed (dropped copies), taken back
		_, pl := peersJSON(t, f)
		return pl.Members == 7 && pl.Passes > before.Passes && pl.OwnedMissing > 0
	})
	took("K killed, F's pass past the grace missing owned chunks")
	if !strings.Contains(f.log.String(), "no space left on device") {
		t.Errorf("F's log does not say its disk is full:\n%s", f.log)
	}
	waitFor(t, 60*time.Second, "the other owners to repair around F (no stripe degraded, no chunk unheld)", func() bool {
		fillDisk(t, filler)
		st := dfCluster(t, ms[a])
		if st.UnreadableStripes != 0 {
			t.Fatalf("stripes past repair with one member killed and one full: %+v", st)
		}
		return st.Alive == 7 && st.DegradedStripes == 0 && st.UnheldBytes == 0 && st.Stripes == cold.Stripes && len(st.Unanswered) == 0
	})
	took("repaired around F")
	for _, m := range []*member{ms[r], f} {
		if shaOn(t, m, filepath.Join(m.mnt, "d/f.bin")) != sum {
			t.Fatalf("d/f.bin read through %s's mount with F full and K killed differs from the source", m.addr)
		}
	}
	if !processAlive(f.node) {
		t.Fatalf("F died with its disk full:\n%s", f.log)
	}
	if ps := peersOf(t, f); ps[fname].State != "alive" || aliveCount(t, f) != 7 {
		t.Errorf("kylix peers on F, its disk full: %+v", ps)
	}
	if st := dfCluster(t, f); st.DegradedStripes != 0 || st.UnheldBytes != 0 || st.Stripes != cold.Stripes {
		t.Errorf("kylix df on F, its disk full: %+v", st)
	}
	if st := statCluster(t, f, "d/f.bin"); st.ColdChunks != st.Chunks || st.Stripes != cold.Stripes {
		t.Errorf("kylix stat on F, its disk full: %+v", st)
	}

	// Room again: F stores what it owns at its next pass.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	_, freed := peersJSON(t, f)
	took("reads and reports with F full")
	waitFor(t, 45*time.Second, "F to hold every chunk it owns once its disk has room", func() bool {
		_, pl := peersJSON(t, f)
		return pl.Passes > freed.Passes && pl.OwnedMissing == 0 && pl.OwnedChunks > 0
	})
	took("F caught up once its disk had room")
	waitFor(t, 60*time.Second, "every chunk on two of the seven, no stripe degraded", func() bool {
		st := dfCluster(t, ms[a])
		return st.Alive == 7 && st.DegradedStripes == 0 && st.UnreadableStripes == 0 && st.UnderChunks == 0 && st.MinCopies >= 2 && len(st.Unanswered) == 0
	})
	if st := statCluster(t, f, "d/f.bin"); st.ColdChunks != st.Chunks || st.Stripes != cold.Stripes {
		t.Errorf("kylix stat on F after the repair: %+v", st)
	}
	for _, m := range []*member{ms[r], f} {
		if shaOn(t, m, filepath.Join(m.mnt, "d/f.bin")) != sum {
			t.Fatalf("d/f.bin read through %s's mount after the repair differs from the source", m.addr)
		}
	}
}
