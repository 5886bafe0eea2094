package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/internal/damage"
)

// Issue 7, findings 1 and 8: a corrupt or missing chunk under a file the node
// serves gives EIO within a bounded time (the old code looped forever in the
// node and the reader never returned), with one log line, other files still
// read correctly, and the node stops on SIGTERM within seconds.

// faultFiles imports into a running node: a small file and its neighbour in
// one shared pack, a base file with a pack of its own, and a fine-tune of
// it that shares all but a few chunks (several extents in two packs, served
// by the node, not by passthrough). It returns the sources' bytes by name.
func faultFiles(t *testing.T, data string) map[string][]byte {
	t.Helper()
	src := t.TempDir()
	r := rand.NewChaCha8([32]byte{7})
	rnd := func(n int) []byte { b := make([]byte, n); r.Read(b); return b }
	base := rnd(24 << 20)
	ft := bytes.Clone(base)
	copy(ft[12<<20:], rnd(256<<10)) // a fine-tune: 1% of the bytes changed
	files := map[string][]byte{
		"small.txt": rnd(5000),
		"other.txt": rnd(7000),
		"base.bin":  base,
		"ft.bin":    ft,
	}
	for _, name := range []string{"small.txt", "other.txt", "base.bin", "ft.bin"} {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			t.Fatal(err)
		}
		mustKylix(t, "/", "import", "--data", data, p, name)
	}
	return files
}

type statExtent struct {
	FileOff  int64  `json:"file_offset"`
	Len      int64  `json:"length"`
	Pack     uint64 `json:"pack"`
	PackPath string `json:"pack_path"`
	PackOff  int64  `json:"pack_offset"`
}

func extentsOf(t *testing.T, data, name string) []statExtent {
	t.Helper()
	var st struct {
		Extents []statExtent `json:"extents"`
	}
	out := mustKylix(t, "/", "stat", "--data", data, "--json", name)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stat %s: %v\n%s", name, err, out)
	}
	return st.Extents
}

// catWithin reads a file through the mount in a child process (a read stuck
// in the kernel cannot hang the test: the child is killed at the deadline).
// timedOut says the deadline passed.
func catWithin(t *testing.T, path string, d time.Duration) (out []byte, stderr string, err error, timedOut bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, "cat", path)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.Bytes(), e.String(), err, ctx.Err() != nil
}

// stopWithin sends SIGTERM and reports whether the node exited within d. A
// node that does not is killed and its mount detached, so that the suite
// goes on.
func (n *node) stopWithin(d time.Duration) bool {
	n.t.Helper()
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		n.cmd.Process.Kill()
		<-done
		syscall.Unmount(n.mnt, syscall.MNT_DETACH)
		return false
	}
}

// killOnFailure makes sure a node stuck in the old code's retry loop does
// not outlive the test (its cleanup would wait 20 s, then give up).
func killOnFailure(t *testing.T, n *node) {
	t.Cleanup(func() {
		if n.cmd.ProcessState == nil && t.Failed() {
			n.cmd.Process.Kill()
			n.cmd.Wait()
			syscall.Unmount(n.mnt, syscall.MNT_DETACH)
		}
	})
}

// expectEIO reads name through the mount and wants EIO within the deadline.
func expectEIO(t *testing.T, mnt, name string) {
	t.Helper()
	_, stderr, err, timedOut := catWithin(t, filepath.Join(mnt, name), 15*time.Second)
	switch {
	case timedOut:
		t.Fatalf("reading %s: no answer within 15 s (the node retries forever)", name)
	case err == nil:
		t.Fatalf("reading %s succeeded; want EIO", name)
	case !strings.Contains(stderr, "Input/output error"):
		t.Fatalf("reading %s: %v %q; want EIO (Input/output error)", name, err, stderr)
	}
}

// expectSame reads name through the mount and wants its bytes.
func expectSame(t *testing.T, mnt, name string, want []byte) {
	t.Helper()
	got, stderr, err, timedOut := catWithin(t, filepath.Join(mnt, name), 15*time.Second)
	if timedOut || err != nil {
		t.Fatalf("reading %s: %v %s (timed out: %v)", name, err, stderr, timedOut)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("reading %s: wrong bytes (%d bytes, want %d)", name, len(got), len(want))
	}
}

func countLines(log, sub string) int {
	return strings.Count(log, sub)
}

func TestCorruptChunkGivesEIO(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	killOnFailure(t, n)
	files := faultFiles(t, data)
	small := extentsOf(t, data, "small.txt")
	other := extentsOf(t, data, "other.txt")
	ft := extentsOf(t, data, "ft.bin")
	if len(small) != 1 || len(other) != 1 || small[0].Pack != other[0].Pack {
		t.Fatalf("small.txt and other.txt should share one pack: %+v %+v", small, other)
	}
	if len(ft) < 3 {
		t.Fatalf("ft.bin should be a multi-extent (deduplicated) file: %+v", ft)
	}
	// A byte inside the small file's chunk, and one inside the first
	// extent of the fine-tune (a chunk it shares with base.bin).
	damage.FlipByte(t, small[0].PackPath, small[0].PackOff+100)
	damage.FlipByte(t, ft[0].PackPath, ft[0].PackOff+ft[0].Len/2)

	expectEIO(t, mnt, "small.txt")
	expectEIO(t, mnt, "ft.bin")
	expectSame(t, mnt, "other.txt", files["other.txt"]) // same pack, other chunk
	// The fine-tune's bytes past the bad chunk still read (its last extent).
	last := ft[len(ft)-1]
	got, _, err, timedOut := catWithin(t, filepath.Join(mnt, "ft.bin"), 15*time.Second)
	_ = got
	if timedOut || err == nil {
		t.Fatalf("ft.bin: want EIO, got %v (timed out %v)", err, timedOut)
	}
	tail := make([]byte, last.Len)
	f, err := os.Open(filepath.Join(mnt, "ft.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(tail, last.FileOff); err != nil {
		t.Fatalf("reading the intact tail of ft.bin: %v", err)
	}
	f.Close()
	if !bytes.Equal(tail, files["ft.bin"][last.FileOff:]) {
		t.Fatal("the intact tail of ft.bin reads wrong bytes")
	}

	start := time.Now()
	if !n.stopWithin(5 * time.Second) {
		t.Fatalf("the node did not exit within 5 s of SIGTERM: %s", n.log)
	}
	t.Logf("node stopped in %v", time.Since(start).Round(time.Millisecond))
	log := n.log.String()
	// One line per bad chunk, however many requests met it (two reads of
	// ft.bin and the kernel's readahead and retries).
	if c := countLines(log, "chunk cannot be read"); c < 2 || c > 3 {
		t.Errorf("want one log line per bad chunk (2, or 3 if a read came after the failure was forgotten), got %d:\n%s", c, log)
	}
	if !strings.Contains(log, "hash mismatch") {
		t.Errorf("the log does not say what is wrong:\n%s", log)
	}
}

func TestMissingPackGivesEIO(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	killOnFailure(t, n)
	files := faultFiles(t, data)
	small := extentsOf(t, data, "small.txt")
	ft := extentsOf(t, data, "ft.bin")
	base := extentsOf(t, data, "base.bin")
	if len(base) != 1 || ft[0].Pack != base[0].Pack || small[0].Pack == base[0].Pack {
		t.Fatalf("unexpected layout: base %+v ft %+v small %+v", base, ft, small)
	}
	// Move base.bin's pack away: ft.bin loses the chunks it shares.
	moved := filepath.Join(t.TempDir(), "moved.pack")
	if err := os.Rename(base[0].PackPath, moved); err != nil {
		// Another file system: copy and remove.
		b, rerr := os.ReadFile(base[0].PackPath)
		if rerr != nil {
			t.Fatal(err, rerr)
		}
		os.WriteFile(moved, b, 0o600)
		os.Remove(base[0].PackPath)
	}
	expectEIO(t, mnt, "ft.bin")
	expectSame(t, mnt, "small.txt", files["small.txt"])
	expectSame(t, mnt, "other.txt", files["other.txt"])
	if !n.stopWithin(5 * time.Second) {
		t.Fatalf("the node did not exit within 5 s of SIGTERM: %s", n.log)
	}
	log := n.log.String()
	if strings.Contains(log, "no such file or directory") && !strings.Contains(log, "not stored locally") {
		t.Errorf("a missing pack should be reported as a chunk not stored locally:\n%s", log)
	}
	if c := countLines(log, "chunk cannot be read"); c < 1 {
		t.Errorf("the failure was not logged:\n%s", log)
	}
}

// TestServeRefusesMountInsideData: the node served its own store through
// itself and deadlocked.
func TestServeRefusesMountInsideData(t *testing.T) {
	requireFUSE(t)
	base := t.TempDir()
	data := filepath.Join(base, "data")
	for _, c := range []struct{ data, mnt, want string }{
		{data, filepath.Join(data, "mnt"), "inside the data directory"},
		{filepath.Join(base, "m", "data"), filepath.Join(base, "m"), "inside the mount point"},
		{data, data, "inside the data directory"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, kylixBin, "serve", "--data", c.data, "--mount", c.mnt)
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		var ee *exec.ExitError
		if timedOut {
			syscall.Unmount(c.mnt, syscall.MNT_DETACH)
			t.Fatalf("serve --data %s --mount %s: still running after 20 s; want a refusal", c.data, c.mnt)
		}
		if !errors.As(err, &ee) || !strings.Contains(string(out), c.want) {
			t.Errorf("serve --data %s --mount %s: %v %s; want a refusal saying %q", c.data, c.mnt, err, out, c.want)
		}
		if isMounted(c.mnt) {
			syscall.Unmount(c.mnt, syscall.MNT_DETACH)
			t.Errorf("%s was mounted", c.mnt)
		}
	}
}

// TestStopWithFilesOpen: SIGTERM while programs hold files open in the mount
// (one half-written, one being read): the node commits the write, detaches
// the busy mount and exits within seconds; the write is there after a
// restart.
func TestStopWithFilesOpen(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	killOnFailure(t, n)
	files := faultFiles(t, data)
	r, err := os.Open(filepath.Join(mnt, "other.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Read(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	w, err := os.Create(filepath.Join(mnt, "written.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := []byte("written before SIGTERM, never closed\n")
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	// About 2.5 s here: unmount is retried, then the busy mount detached and
	// its server given 2 s to finish (fs.Unmount).
	start := time.Now()
	if !n.stopWithin(8 * time.Second) {
		t.Fatalf("the node did not exit within 8 s of SIGTERM with files open: %s", n.log)
	}
	t.Logf("node stopped in %v", time.Since(start).Round(time.Millisecond))
	if isMounted(mnt) {
		t.Fatalf("%s still mounted after the node exited", mnt)
	}
	r.Close()
	w.Close()
	startNode(t, data, mnt)
	expectSame(t, mnt, "written.txt", want)
	expectSame(t, mnt, "other.txt", files["other.txt"])
}
