package fs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/internal/damage"
)

// The first open of a large file after a start does not wait for its
// pack's whole hash (docs/design/verification.md, "The first open after a
// start"). The files are above chunkstore.InlineCheckMax.
const firstSize = chunkstore.InlineCheckMax + 8<<20

// slowCheck paces the background check so slowly (1 MiB/s: its first
// batch waits half a minute) that only the node's own reads can prove the
// pack within a test.
var slowCheck = kfs.Options{ScrubRate: 1 << 20}

func waitChecks(t *testing.T, n *ptNode) chunkstore.PackVerifyStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.s.WaitPackChecks(ctx); err != nil {
		t.Fatalf("background pack check: %v", err)
	}
	return n.s.PackVerifyStats()
}

// TestFirstOpenServedByNodeWhileChecked: the first open of an unchecked
// pack is served by the node at once (no check has run when it returns),
// its reads are right, and the background check, once passed, gives the
// next open passthrough.
func TestFirstOpenServedByNodeWhileChecked(t *testing.T) {
	data := t.TempDir()
	want := pattern(81, firstSize)
	importData(t, data, "m/big", want)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	st, vs := n.fsys.Stats(), n.s.PackVerifyStats()
	if st.PassthroughOpens != 0 || st.DaemonOpens != 1 || vs.Deferred != 1 {
		t.Fatalf("first open not served by the node while checked: %+v %+v", st, vs)
	}
	if v := getxattr(t, p, "user.kylix.path"); !strings.Contains(v, "until the pack check finishes") {
		t.Errorf("user.kylix.path = %q", v)
	}
	if v := longXattr(t, p, "user.kylix.verify"); !strings.HasPrefix(v, "daemon until the pack check finishes") {
		t.Errorf("user.kylix.verify = %q", v)
	}
	// Only the head, without readahead: the node's reads do not cover
	// the pack.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM)
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, want[:len(head)]) {
		t.Fatalf("node read: %v", err)
	}
	f.Close()
	if st := n.fsys.Stats(); st.DaemonReads == 0 {
		t.Fatalf("no read reached the node: %+v", st)
	}
	vs = waitChecks(t, n)
	if vs.Verified != 1 || vs.ByReads != 0 || vs.Bytes != int64(firstSize) {
		t.Fatalf("background check: %+v", vs)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after the check: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 {
		t.Fatalf("open after the check not passthrough: %+v", st)
	}
	if v := getxattr(t, p, "user.kylix.path"); v != "passthrough" {
		t.Errorf("user.kylix.path = %q, want passthrough", v)
	}
}

// TestNodeReadRecordsCheck: a whole-file read by the node proves the pack
// (no whole-pack hash: Bytes stays 0) and stops the background check; the
// next open gets passthrough; the record survives a restart; a touch or an
// append afterwards loses it.
func TestNodeReadRecordsCheck(t *testing.T) {
	data := t.TempDir()
	want := pattern(82, firstSize)
	pack := importData(t, data, "m/big", want)
	n := startPTOpts(t, data, slowCheck)
	p := filepath.Join(n.dir, "m/big")
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("node read: %v", err)
	}
	vs := waitChecks(t, n)
	if vs.Verified != 1 || vs.ByReads != 1 || vs.Bytes != 0 || vs.Deferred != 1 {
		t.Fatalf("a whole read by the node did not count as the check: %+v", vs)
	}
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 || st.DaemonOpens != 1 {
		t.Fatalf("open after the node's read: %+v", st)
	}
	n.stop()
	n = startPTOpts(t, data, slowCheck)
	p = filepath.Join(n.dir, "m/big")
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after restart: %v", err)
	}
	if st, vs := n.fsys.Stats(), n.s.PackVerifyStats(); st.PassthroughOpens != 1 || vs.Deferred != 0 {
		t.Fatalf("record by reads not kept across a restart: %+v %+v", st, vs)
	}
	// Touched: the record is lost, the next open is the node's again.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(pack, later, later); err != nil {
		t.Fatal(err)
	}
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after touch: %v", err)
	}
	if st, vs := n.fsys.Stats(), waitChecks(t, n); st.PassthroughOpens != 1 || vs.Deferred != 1 || vs.ByReads != 1 {
		t.Fatalf("touched pack: %+v %+v", st, vs)
	}
	// Appended to: not the file any more, never passthrough.
	fa, err := os.OpenFile(pack, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fa.Write([]byte{1})
	fa.Close()
	if got, err = os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after append: %v", err)
	}
	if st := n.fsys.Stats(); st.PassthroughOpens != 1 || st.PassthroughRefused != 1 {
		t.Fatalf("appended pack: %+v", st)
	}
}

// TestNodeReadOfChangingPackNotRecorded: a pack touched while the node
// reads it does not get a record from those reads.
func TestNodeReadOfChangingPackNotRecorded(t *testing.T) {
	data := t.TempDir()
	want := pattern(83, firstSize)
	pack := importData(t, data, "m/big", want)
	n := startPTOpts(t, data, slowCheck)
	p := filepath.Join(n.dir, "m/big")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The head only, without readahead: with the node's prefetch (8 MiB)
	// it stays far from the whole 40 MiB, so the record is incomplete
	// when the pack changes.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM)
	head := make([]byte, 1<<20)
	if _, err := f.ReadAt(head, 0); err != nil || !bytes.Equal(head, want[:len(head)]) {
		t.Fatalf("head: %v", err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(pack, later, later); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(rest, want) {
		t.Fatalf("whole read after the change: %v", err)
	}
	if vs := n.s.PackVerifyStats(); vs.ByReads != 0 || vs.Verified != 0 || vs.ProgressDropped != 1 {
		t.Fatalf("reads across a change of the pack recorded: %+v", vs)
	}
}

// TestFirstOpenFlippedPackNeverPassthrough: a byte flipped in an unchecked
// large pack: the first open is the node's, which returns EIO for the
// damaged range and right bytes elsewhere; the background check fails
// and no open ever gets passthrough.
func TestFirstOpenFlippedPackNeverPassthrough(t *testing.T) {
	data := t.TempDir()
	want := pattern(84, firstSize)
	pack := importData(t, data, "m/big", want)
	flip := int64(firstSize) - 100
	damage.FlipByte(t, pack, flip)
	n := startPT(t, data)
	p := filepath.Join(n.dir, "m/big")
	if got := readGood(t, p, 0, 64<<10); !bytes.Equal(got, want[:64<<10]) {
		t.Fatal("node read of an intact range returned wrong bytes")
	}
	if _, err := os.ReadFile(p); !errors.Is(err, syscall.EIO) {
		t.Fatalf("whole read of a flipped pack: %v, want EIO", err)
	}
	vs := waitChecks(t, n)
	if vs.Failed != 1 || vs.Verified != 0 || vs.ByReads != 0 {
		t.Fatalf("flipped pack: %+v", vs)
	}
	expectRefused(t, n, p, want)
	if st := n.fsys.Stats(); st.PassthroughOpens != 0 {
		t.Fatalf("a flipped pack was handed to passthrough: %+v", st)
	}
}
