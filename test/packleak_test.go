package test

// Issue 18, item 3: a pack fd handed out can never reveal bytes its
// receiver may not read, now or later (docs/design/client.md, "A
// handed-out pack never grows"). A process of uid 65534 gets pack fds the
// way the LD_PRELOAD shim does (PACKS with the shared flag) and hands them
// to the test, which then has root write (and delete) 0600 files through
// the mount and scans every byte of those fds for the files' markers.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/testneeds"
)

// leakHelperOut is what the helper reports about its PACKS.
type leakHelperOut struct {
	Status int32
	Msg    string
	Flags  []uint32
}

// packsAsNobody runs this test binary as uid 65534 (TestPackLeakHelper):
// it opens path, asks PACKS (with flags, as the shim does, or version 1's
// empty body) and sends the pack fds it got back over a socketpair. The
// caller owns the returned files.
func packsAsNobody(t *testing.T, sock, path string, shared bool) ([]*os.File, leakHelperOut) {
	t.Helper()
	testneeds.Command(t, "setpriv", "util-linux")
	bin := selfForOtherUser(t, t.TempDir())
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(sp[0]), "mine"), os.NewFile(uintptr(sp[1]), "theirs")
	defer mine.Close()
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		bin, "-test.run", "^TestPackLeakHelper$")
	flag := "0"
	if shared {
		flag = "1"
	}
	cmd.Env = append(os.Environ(), "KYLIX_LEAK_HELPER=1", "KYLIX_BIN="+kylixBin, "KYLIX_HELPER_SOCK="+sock,
		"KYLIX_HELPER_FILE="+path, "KYLIX_HELPER_SHARED="+flag)
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	err = cmd.Run()
	theirs.Close()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, stdout.String())
	}
	var out leakHelperOut
	line := ""
	for l := range strings.Lines(stdout.String()) {
		if strings.HasPrefix(l, "PACKS ") {
			line = strings.TrimPrefix(l, "PACKS ")
		}
	}
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		t.Fatalf("helper output %q: %v", stdout.String(), err)
	}
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*clientproto.MaxFds))
	_, oobn, _, _, err := unix.Recvmsg(int(mine.Fd()), buf, oob, 0)
	if err != nil {
		t.Fatalf("receive the helper's fds: %v", err)
	}
	var fds []*os.File
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		got, _ := unix.ParseUnixRights(&m)
		for _, fd := range got {
			fds = append(fds, os.NewFile(uintptr(fd), "pack"))
		}
	}
	if len(fds) != len(out.Flags) {
		t.Fatalf("helper got %d pack fds, sent %d", len(out.Flags), len(fds))
	}
	t.Cleanup(func() {
		for _, f := range fds {
			f.Close()
		}
	})
	return fds, out
}

// TestPackLeakHelper is the uid 65534 client of packsAsNobody (skipped
// otherwise).
func TestPackLeakHelper(t *testing.T) {
	if os.Getenv("KYLIX_LEAK_HELPER") != "1" {
		t.Skip("helper process")
	}
	back := os.NewFile(3, "back")
	c := dialClient(t, os.Getenv("KYLIX_HELPER_SOCK"))
	f, err := os.Open(os.Getenv("KYLIX_HELPER_FILE"))
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	if os.Getenv("KYLIX_HELPER_SHARED") == "1" {
		body = clientproto.AppendPacksRequest(nil, clientproto.PacksShared)
	}
	r := c.req(clientproto.OpPacks, body, int(f.Fd()))
	out := leakHelperOut{Status: r.status, Msg: r.msg, Flags: []uint32{}}
	es, err := clientproto.ParsePacks(r.fields)
	if err == nil {
		for _, e := range es {
			out.Flags = append(out.Flags, e.Flags)
		}
	}
	var fds []int
	for _, pf := range r.fds {
		fds = append(fds, int(pf.Fd()))
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(int(back.Fd()), []byte{1}, oob, nil, 0); err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(out)
	fmt.Printf("PACKS %s\n", j)
}

// writeCommitted writes b to path through the mount with mode, and fsyncs
// (which returns once the file is committed to the store) before closing.
func writeCommitted(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(mode); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// syncMount commits everything written through the mount (syncfs on it).
func syncMount(t *testing.T, mnt string) {
	t.Helper()
	d, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		t.Fatalf("syncfs %s: %v", mnt, err)
	}
}

// marked is n bytes of a unique 32-byte marker, repeated.
func marked(n int, seed uint64) (b, marker []byte) {
	marker = randomBytes(32, seed)
	for len(b) < n {
		b = append(b, marker...)
	}
	return b[:n], marker
}

// scanFds fails the test if any byte range of any fd, read whole from
// offset 0 to its current size, holds marker.
func scanFds(t *testing.T, what string, fds []*os.File, marker []byte) {
	t.Helper()
	for i, pf := range fds {
		b, err := io.ReadAll(io.NewSectionReader(pf, 0, 1<<40))
		if err != nil {
			t.Fatalf("read pack fd %d: %v", i, err)
		}
		if k := bytes.Index(b, marker); k >= 0 {
			t.Errorf("LEAK: pack fd %d handed to uid 65534 reads %s at offset %d (fd size %d)", i, what, k, len(b))
		}
	}
}

// leakSetup starts a node on a fresh store whose mount uid 65534 may enter.
func leakSetup(t *testing.T) (mnt, sock string) {
	requireFUSE(t)
	data, mnt := dirs(t)
	for d := filepath.Dir(mnt); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	// A store with one imported file, so the node has a namespace; the
	// node's own run starts a new shared pack.
	importFiles(t, data, map[string][]byte{"seed": randomBytes(3000, 5)})
	_, sock = startClientNode(t, data, mnt)
	if err := os.Chmod(filepath.Join(mnt, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	return mnt, sock
}

// TestPackLeakAppendAfterHandout: uid 65534 holds the shared pack of its
// small file; root then writes a 0600 small file (committed: fsync), and
// writes and deletes another; neither marker is ever readable through the
// fd. Then the whole-file case: uid 65534 holds a large file's pack; root
// rewrites that file in place, appends to it and makes it 0600: the fd
// still reads exactly the bytes it was handed.
func TestPackLeakAppendAfterHandout(t *testing.T) {
	mnt, sock := leakSetup(t)
	pub := randomBytes(9000, 11)
	writeCommitted(t, filepath.Join(mnt, "m/pub"), pub, 0o644)
	fds, out := packsAsNobody(t, sock, filepath.Join(mnt, "m/pub"), true)
	if len(fds) != 1 || out.Flags[0]&clientproto.PackShared == 0 {
		t.Fatalf("uid 65534 should get its file's shared pack: %+v", out)
	}
	if b, _ := io.ReadAll(io.NewSectionReader(fds[0], 0, 1<<40)); !bytes.Contains(b, pub) {
		t.Fatalf("the shared pack fd does not hold the file it was handed for")
	}

	secret, marker := marked(12000, 13)
	writeCommitted(t, filepath.Join(mnt, "m/secret"), secret, 0o600)
	syncMount(t, mnt)
	scanFds(t, "a root 0600 file written after the hand-out", fds, marker)

	gone, marker2 := marked(7000, 17)
	writeCommitted(t, filepath.Join(mnt, "m/gone"), gone, 0o600)
	if err := os.Remove(filepath.Join(mnt, "m/gone")); err != nil {
		t.Fatal(err)
	}
	syncMount(t, mnt)
	scanFds(t, "a root 0600 file written and deleted after the hand-out", fds, marker2)

	// Whole-file pack (passthrough's rule: exactly the file).
	big := randomBytes(3<<20, 19)
	writeCommitted(t, filepath.Join(mnt, "m/big"), big, 0o644)
	wfds, wout := packsAsNobody(t, sock, filepath.Join(mnt, "m/big"), false)
	if len(wfds) != 1 || wout.Flags[0]&clientproto.PackWholeFile == 0 {
		t.Fatalf("uid 65534 should get the large file's whole-file pack: %+v", wout)
	}
	over, marker3 := marked(1<<20, 23)
	f, err := os.OpenFile(filepath.Join(mnt, "m/big"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(over, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(over, int64(len(big))); err != nil { // grows it
		t.Fatal(err)
	}
	if err := f.Chmod(0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	syncMount(t, mnt)
	scanFds(t, "a rewrite of the file after the hand-out", wfds, marker3)
	b, err := io.ReadAll(io.NewSectionReader(wfds[0], 0, 1<<40))
	if err != nil || !bytes.Equal(b, big) {
		t.Errorf("the whole-file pack fd no longer reads exactly the file it was handed for (%d bytes, %v)", len(b), err)
	}
	st, err := os.Stat(filepath.Join(mnt, "m/big"))
	if err != nil || st.Size() != int64(len(big))+int64(len(over)) {
		t.Fatalf("the rewrite did not take: %v %v", st, err)
	}
}

// TestPackLeakDeletedBeforeHandout: root writes a 0600 small file and
// deletes it; then a user-readable small file lands in the same shared
// pack, and uid 65534 asks for that file's packs. The deleted file's bytes
// are still in the pack (until GC), so the pack must not be handed out.
func TestPackLeakDeletedBeforeHandout(t *testing.T) {
	mnt, sock := leakSetup(t)
	gone, marker := marked(12000, 29)
	writeCommitted(t, filepath.Join(mnt, "m/gone"), gone, 0o600)
	if err := os.Remove(filepath.Join(mnt, "m/gone")); err != nil {
		t.Fatal(err)
	}
	pub := randomBytes(9000, 31)
	writeCommitted(t, filepath.Join(mnt, "m/pub"), pub, 0o644)
	syncMount(t, mnt)
	fds, out := packsAsNobody(t, sock, filepath.Join(mnt, "m/pub"), true)
	scanFds(t, "a root 0600 file deleted before the hand-out", fds, marker)
	if len(fds) == 0 && !strings.Contains(out.Msg, "no live file") {
		t.Errorf("the refusal should say why: %q", out.Msg)
	}
	// The user still reads its file, through the mount.
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "cat", filepath.Join(mnt, "m/pub"))
	got, err := cmd.Output()
	if err != nil || !bytes.Equal(got, pub) {
		t.Errorf("uid 65534 reads its file through the mount: %d bytes, %v", len(got), err)
	}
}
