package fs_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/internal/damage"
)

// node is an in-process node over a data directory that a test stops and
// starts again (a restart: a new store, a new record of verified packs).
type ptNode struct {
	t    *testing.T
	data string
	s    *chunkstore.Store
	fsys *kfs.FS
	dir  string
	up   bool
}

func startPT(t *testing.T, data string) *ptNode {
	t.Helper()
	return startPTOpts(t, data, kfs.Options{ScrubRate: chunkstore.DefaultScrubRate})
}

func startPTOpts(t *testing.T, data string, opts kfs.Options) *ptNode {
	t.Helper()
	fstest.RequireFUSE(t)
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := kfs.New(s, opts)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := fsys.Mount(dir); err != nil {
		s.Close()
		t.Fatal(err)
	}
	n := &ptNode{t: t, data: data, s: s, fsys: fsys, dir: dir, up: true}
	t.Cleanup(n.stop)
	return n
}

func (n *ptNode) stop() {
	if !n.up {
		return
	}
	n.up = false
	if err := n.fsys.Unmount(); err != nil {
		n.t.Errorf("unmount: %v", err)
	}
	n.s.Close()
}

// importData stores data at name in the store in data (no node running).
func importData(t *testing.T, data, name string, content []byte) string {
	t.Helper()
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), src, name, chunkstore.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	f, _, err := s.OpenPath(name)
	if err != nil {
		t.Fatal(err)
	}
	_, path, ok := f.PassthroughCandidate()
	if !ok {
		t.Fatalf("%s has no whole-file pack", name)
	}
	return path
}

// readGood reads [off, off+n) with readahead off (the kernel then asks
// only for those pages, never for the damaged chunk).
func readGood(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)
	buf := make([]byte, n)
	m, err := unix.Pread(fd, buf, off)
	if err != nil || int64(m) != n {
		t.Fatalf("pread %d at %d: %d, %v", n, off, m, err)
	}
	return buf
}

// expectRefused opens p and asserts the daemon served it, not passthrough.
func expectRefused(t *testing.T, n *ptNode, p string, want []byte) {
	t.Helper()
	before := n.fsys.Stats()
	got := readGood(t, p, 0, 64<<10)
	st := n.fsys.Stats()
	if st.PassthroughOpens != before.PassthroughOpens {
		t.Fatalf("a flipped pack was handed out for passthrough: %+v -> %+v", before, st)
	}
	if st.PassthroughRefused != before.PassthroughRefused+1 || st.DaemonOpens != before.DaemonOpens+1 {
		t.Fatalf("open not refused and served by the daemon: %+v -> %+v", before, st)
	}
	if !bytes.Equal(got, want[:64<<10]) {
		t.Fatal("daemon read of an intact range returned wrong bytes")
	}
	if v := getxattr(t, p, "user.kylix.path"); v != "daemon" {
		t.Errorf("user.kylix.path = %q, want daemon", v)
	}
	if v := longXattr(t, p, "user.kylix.verify"); !strings.Contains(v, "failed its check") {
		t.Errorf("user.kylix.verify = %q", v)
	}
}

// TestPassthroughFlippedPackAtStart: a byte flipped in a whole-file pack
// while no node ran is never returned: the open is served by the daemon.
func TestPassthroughFlippedPackAtStart(t *testing.T) {
	data := t.TempDir()
	want := pattern(21, 5<<20)
	pack := importData(t, data, "m/big", want)
	damage.FlipByte(t, pack, int64(len(want))-100)
	n := startPT(t, data)
	expectRefused(t, n, filepath.Join(n.dir, "m/big"), want)
}

// TestPassthroughFlipAfterRestart: a pack verified and served by one run
// of the node, flipped while it is down, is caught by the next run.
func TestPassthroughFlipAfterRestart(t *testing.T) {
	data := t.TempDir()
	want := pattern(22, 5<<20)
	pack := importData(t, data, "m/big", want)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	if v := longXattr(t, p, "user.kylix.verify"); !strings.Contains(v, "hashed whole at the next open") {
		t.Errorf("before the first open: user.kylix.verify = %q", v)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("clean read: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 {
		t.Fatalf("clean pack not served by passthrough: %+v", st)
	}
	if v := longXattr(t, p, "user.kylix.verify"); !strings.Contains(v, "verified at first open") || !strings.Contains(v, "scrub at 64 MiB/s") {
		t.Errorf("after a verified open: user.kylix.verify = %q", v)
	}
	// A restart within the same boot trusts the last run's check of the
	// unchanged pack (chunkstore/packverify_persist.go).
	n.stop()
	n = startPT(t, data)
	p = filepath.Join(n.dir, "m/big")
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after restart: %v", err)
	}
	if st, vs := n.fsys.Stats(), n.s.PackVerifyStats(); st.PassthroughOpens != 1 || vs.Verified != 0 {
		t.Fatalf("restart, unchanged pack: %+v %+v", st, vs)
	}
	n.stop()
	damage.FlipByte(t, pack, 3<<20)
	n = startPT(t, data)
	expectRefused(t, n, filepath.Join(n.dir, "m/big"), want)
}

// TestPassthroughPackChangedWhileRunning: a pack touched while the node
// runs is hashed again at the next open: touched only, it passes; flipped
// with its mtime set back (ctime still moves), it is refused.
func TestPassthroughPackChangedWhileRunning(t *testing.T) {
	data := t.TempDir()
	want := pattern(23, 5<<20)
	pack := importData(t, data, "m/big", want)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	if _, err := os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	if st := n.s.PackVerifyStats(); st.Verified != 1 {
		t.Fatalf("first open: %+v", st)
	}
	if _, err := os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	if st := n.s.PackVerifyStats(); st.Verified != 1 {
		t.Fatalf("second open of an unchanged pack hashed it again: %+v", st)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(pack, later, later); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after touch: %v", err)
	}
	if st := n.s.PackVerifyStats(); st.Verified != 2 {
		t.Fatalf("a touched pack was not hashed again: %+v", st)
	}
	fi, err := os.Stat(pack)
	if err != nil {
		t.Fatal(err)
	}
	damage.FlipByte(t, pack, 2<<20)
	if err := os.Chtimes(pack, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	expectRefused(t, n, p, want)
}

// TestPassthroughConcurrentFirstOpens: opens racing on a pack nobody has
// checked yet share one check, and all get passthrough.
func TestPassthroughConcurrentFirstOpens(t *testing.T) {
	data := t.TempDir()
	want := pattern(24, 16<<20)
	importData(t, data, "m/big", want)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("read: %v", err)
			}
		}()
	}
	wg.Wait()
	if st := n.s.PackVerifyStats(); st.Verified != 1 || st.Failed != 0 {
		t.Fatalf("concurrent first opens: %+v, want one check", st)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 6 {
		t.Fatalf("opens: %+v", st)
	}
}

func longXattr(t *testing.T, path, name string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		t.Fatalf("getxattr %s %s: %v", path, name, err)
	}
	return string(buf[:n])
}

// TestPassthroughSurvivesDuplicates: a safetensors file with two identical
// 4 MiB tensors (10% of it) is served by passthrough, and a fine-tune that
// shares most tensors with it is served by the daemon, right.
func TestPassthroughSurvivesDuplicates(t *testing.T) {
	data := t.TempDir()
	norm := pattern(41, 4<<20)
	tensors := [][]byte{norm}
	for i := range 8 {
		tensors = append(tensors, pattern(uint64(50+i), 4<<20))
	}
	tensors = append(tensors, norm)
	want := safetensorsFile(t, tensors)
	importData(t, data, "m/model.safetensors", want)
	ft := append([][]byte(nil), tensors...)
	ft[3] = pattern(99, 4<<20)
	wantFT := safetensorsFile(t, ft)
	// The fine-tune has no pack of its own: import it without the helper's
	// whole-file check.
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "ft.safetensors")
	os.WriteFile(src, wantFT, 0o644)
	if _, err := s.Import(context.Background(), src, "m/ft.safetensors", chunkstore.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/model.safetensors")
	// 40 MiB, above chunkstore.InlineCheckMax: the first open is the
	// node's while the pack is checked in the background. Its second
	// copies are not read by the node, so only that check proves it.
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("first read: %v", err)
	}
	if vs := waitChecks(t, n); vs.Verified != 1 || vs.ByReads != 0 || vs.Deferred != 1 {
		t.Fatalf("background check of a pack with second copies: %+v", vs)
	}
	if v := getxattr(t, p, "user.kylix.path"); v != "passthrough" {
		t.Errorf("user.kylix.path = %q, want passthrough", v)
	}
	before := n.fsys.Stats()
	got, err = os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 || st.DaemonReads != before.DaemonReads {
		t.Fatalf("file with 10%% duplicates not served by passthrough: %+v", st)
	}
	pft := filepath.Join(n.dir, "m/ft.safetensors")
	got, err = os.ReadFile(pft)
	if err != nil || !bytes.Equal(got, wantFT) {
		t.Fatalf("fine-tune read: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 || st.DaemonOpens != 2 {
		t.Fatalf("fine-tune: %+v", st)
	}
}

func safetensorsFile(t *testing.T, tensors [][]byte) []byte {
	t.Helper()
	var ts []safetensors.WriteTensor
	for i, d := range tensors {
		ts = append(ts, safetensors.WriteTensor{Name: fmt.Sprintf("t%02d", i), DType: safetensors.U8, Shape: []int64{int64(len(d))}, Data: d})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestVerifyXattrScrubOff: with no scrub, user.kylix.verify does not claim
// one.
func TestVerifyXattrScrubOff(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	importTree(t, m, "m", map[string][]byte{"big": pattern(61, 2<<20), "small": pattern(62, 5000)})
	p := filepath.Join(m.Dir, "m/big")
	if _, err := os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	if v := longXattr(t, p, "user.kylix.verify"); !strings.Contains(v, "verified at first open") || !strings.Contains(v, "scrub off") {
		t.Errorf("user.kylix.verify = %q", v)
	}
	if v := longXattr(t, filepath.Join(m.Dir, "m/small"), "user.kylix.verify"); !strings.HasPrefix(v, "daemon: every chunk is hashed") {
		t.Errorf("small file: user.kylix.verify = %q", v)
	}
}

// TestPassthroughFlipWhileOpen: a pack flipped while a passthrough handle
// is open: the open handle cannot be revoked, but a new open is checked
// again and fails (the kernel cannot give the inode a node-served open
// beside a passthrough one) instead of returning the flipped byte.
func TestPassthroughFlipWhileOpen(t *testing.T) {
	data := t.TempDir()
	want := pattern(71, 3<<20)
	pack := importData(t, data, "m/big", want)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	f1, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	damage.FlipByte(t, pack, 1<<20)
	f2, err := os.Open(p)
	if err == nil {
		b := make([]byte, 1)
		_, rerr := f2.ReadAt(b, 1<<20)
		f2.Close()
		if rerr == nil && b[0] != want[1<<20] {
			t.Fatal("a new open read the flipped byte")
		}
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 || st.PassthroughRefused != 1 {
		t.Fatalf("the second open was not checked and refused: %+v", st)
	}
}
