package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"

	"github.com/kylix/kylix/internal/testneeds"
)

// startClientNode starts kylix serve with its client socket in a temporary
// directory (not /run/kylix) and returns the node and the socket path.
func startClientNode(t *testing.T, data, mnt string) (*node, string) {
	t.Helper()
	sockDir := t.TempDir()
	os.Chmod(sockDir, 0o755)
	sock := filepath.Join(sockDir, "client.sock")
	n := launchNode(t, data, mnt, nil, func() bool { return clientAnswers(sock) }, "--client-socket", sock)
	return n, sock
}

func clientAnswers(sock string) bool {
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// clientConn is a test client of the node's client socket.
type clientConn struct {
	t   testing.TB
	c   *net.UnixConn
	seq uint32
}

func dialClient(t testing.TB, sock string) *clientConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("dial client socket: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &clientConn{t: t, c: c}
}

type clientReply struct {
	h      clientproto.Header
	status int32
	msg    string
	fields []byte
	fds    []*os.File
}

func (r *clientReply) close() {
	for _, f := range r.fds {
		f.Close()
	}
}

// raw sends one datagram with fds and returns the reply.
func (c *clientConn) raw(msg []byte, fds ...int) *clientReply {
	c.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.c.WriteMsgUnix(msg, oob, nil); err != nil {
		c.t.Fatalf("send: %v", err)
	}
	buf := make([]byte, 1<<16)
	roob := make([]byte, unix.CmsgSpace(4*clientproto.MaxFds))
	c.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, oobn, _, _, err := c.c.ReadMsgUnix(buf, roob)
	if err != nil {
		c.t.Fatalf("receive: %v", err)
	}
	r := &clientReply{}
	msgs, _ := unix.ParseSocketControlMessage(roob[:oobn])
	for _, m := range msgs {
		got, _ := unix.ParseUnixRights(&m)
		for _, fd := range got {
			r.fds = append(r.fds, os.NewFile(uintptr(fd), "pack"))
		}
	}
	r.h, r.status, r.msg, r.fields, err = clientproto.ParseReply(buf[:n])
	if err != nil {
		c.t.Fatalf("reply: %v (%d bytes)", err, n)
	}
	return r
}

func (c *clientConn) req(op uint16, body []byte, fds ...int) *clientReply {
	c.t.Helper()
	c.seq++
	r := c.raw(clientproto.Request(op, c.seq, body), fds...)
	if r.h.Seq != c.seq || r.h.Op != op|clientproto.ReplyBit {
		c.t.Fatalf("reply header %+v for op %d seq %d", r.h, op, c.seq)
	}
	return r
}

func openRO(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// importFiles writes files (name -> bytes) into a work dir and imports
// them as m/NAME.
func importFiles(t *testing.T, data string, files map[string][]byte) {
	t.Helper()
	work := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(work, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		mustKylix(t, work, "import", "--data", data, name, "m/"+name)
	}
}

// TestClientPacksHandsOutTheFilesPack: a client with a read-only fd of a
// large file gets, over SCM_RIGHTS, a read-only fd of its whole-file pack
// and reads exactly the file's bytes from it; STAT describes the file; the
// pack fd cannot be written.
func TestClientPacksHandsOutTheFilesPack(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(6<<20+123, 41)
	importFiles(t, data, map[string][]byte{"big": want})
	n, sock := startClientNode(t, data, mnt)
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m/big"))

	r := c.req(clientproto.OpStat, nil, int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("STAT: %d %s", r.status, r.msg)
	}
	st, err := clientproto.ParseStat(r.fields)
	if err != nil || st.Size != uint64(len(want)) || st.NChunks == 0 || st.LocalChunks != st.NChunks {
		t.Fatalf("STAT reply %+v, %v", st, err)
	}

	r = c.req(clientproto.OpPacks, nil, int(f.Fd()))
	defer r.close()
	if r.status != 0 {
		t.Fatalf("PACKS: %d %s", r.status, r.msg)
	}
	es, err := clientproto.ParsePacks(r.fields)
	if err != nil || len(es) != 1 || len(r.fds) != 1 {
		t.Fatalf("PACKS: entries %+v (%v), %d fds; want one whole-file pack", es, err, len(r.fds))
	}
	if es[0].Flags != clientproto.PackWholeFile|clientproto.PackChecked || es[0].Size != uint64(len(want)) || es[0].Generation == 0 {
		t.Errorf("pack entry %+v", es[0])
	}
	got, err := io.ReadAll(io.NewSectionReader(r.fds[0], 0, 1<<40))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the pack fd holds %d bytes (%v), equal to the file: %v", len(got), err, bytes.Equal(got, want))
	}
	if _, err := r.fds[0].WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("the pack fd handed out is writable")
	}
	fl, _ := unix.FcntlInt(r.fds[0].Fd(), unix.F_GETFL, 0)
	if fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("pack fd flags %#x, want O_RDONLY", fl)
	}
	out := mustKylix(t, t.TempDir(), "node", "--data", data)
	if !strings.Contains(out, "1 pack fds handed out") {
		t.Errorf("kylix node does not count the pack fd:\n%s", out)
	}
	n.stop()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("client socket left after the node stopped: %v", err)
	}
}

// TestClientPacksOnlyVerifiedWholeFilePacks: a small file in a pack shared
// with other files yields no pack fd (its pack holds bytes of files the
// caller may not read), and neither does a whole-file pack with a flipped
// byte (the passthrough check refuses it); both read fine through the
// mount, where the node verifies every chunk, or fail there with EIO.
func TestClientPacksOnlyVerifiedWholeFilePacks(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	big := randomBytes(6<<20, 43)
	importFiles(t, data, map[string][]byte{"small1": []byte("one"), "small2": []byte("two"), "big": big})
	var st struct {
		Pack string `json:"whole_file_pack"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, t.TempDir(), "stat", "--data", data, "--json", "m/big")), &st); err != nil || st.Pack == "" {
		t.Fatalf("stat: no whole-file pack (%v)", err)
	}
	pf, err := os.OpenFile(st.Pack, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pf.WriteAt([]byte{big[5<<20] ^ 0x5a}, 5<<20)
	pf.Close()

	_, sock := startClientNode(t, data, mnt)
	c := dialClient(t, sock)
	for _, name := range []string{"small1", "big"} {
		f := openRO(t, filepath.Join(mnt, "m", name))
		r := c.req(clientproto.OpPacks, nil, int(f.Fd()))
		es, err := clientproto.ParsePacks(r.fields)
		if r.status != 0 || err != nil || len(es) != 0 || len(r.fds) != 0 {
			r.close()
			t.Fatalf("%s: PACKS status %d (%s), %d entries (%v), %d fds; want n = 0", name, r.status, r.msg, len(es), err, len(r.fds))
		}
	}
}

// TestClientRefusals: what the node refuses, with which errno, and that it
// keeps serving afterwards.
func TestClientRefusals(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(6<<20, 47)
	importFiles(t, data, map[string][]byte{"big": want, "w": []byte("small")})
	_, sock := startClientNode(t, data, mnt)
	good := openRO(t, filepath.Join(mnt, "m/big"))
	other := openRO(t, "/proc/self/status")
	dir := openRO(t, filepath.Join(mnt, "m"))
	wo, err := os.OpenFile(filepath.Join(mnt, "m/w"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wo.Close()
	opath, err := unix.Open(filepath.Join(mnt, "m/big"), unix.O_PATH, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(opath)

	hdr := func(magic uint32, version, op uint16, bodyLen uint32, body []byte) []byte {
		return append(clientproto.AppendHeader(nil, clientproto.Header{Magic: magic, Version: version, Op: op, Seq: 7, BodyLen: bodyLen}), body...)
	}
	cases := []struct {
		name string
		msg  []byte
		fds  []int
		want syscall.Errno
	}{
		{"non-Kylix fd", clientproto.Request(clientproto.OpStat, 1, nil), []int{int(other.Fd())}, syscall.EXDEV},
		{"directory", clientproto.Request(clientproto.OpPacks, 1, nil), []int{int(dir.Fd())}, syscall.EISDIR},
		{"write-only fd", clientproto.Request(clientproto.OpPacks, 1, nil), []int{int(wo.Fd())}, syscall.EBADF},
		{"O_PATH fd", clientproto.Request(clientproto.OpPacks, 1, nil), []int{opath}, syscall.EBADF},
		{"no fd", clientproto.Request(clientproto.OpPacks, 1, nil), nil, syscall.EBADF},
		{"two fds", clientproto.Request(clientproto.OpPacks, 1, nil), []int{int(good.Fd()), int(good.Fd())}, syscall.EBADF},
		{"garbage", []byte("GET / HTTP/1.0\r\n\r\n"), nil, syscall.EPROTO},
		{"short", []byte{1, 2, 3}, []int{int(good.Fd())}, syscall.EINVAL},
		{"wrong magic", hdr(0x12345678, 1, clientproto.OpStat, 0, nil), []int{int(good.Fd())}, syscall.EPROTO},
		{"wrong version", hdr(clientproto.Magic, 9, clientproto.OpStat, 0, nil), []int{int(good.Fd())}, syscall.EPROTONOSUPPORT},
		{"body_len lies", hdr(clientproto.Magic, 1, clientproto.OpStat, 100, []byte{1, 2}), []int{int(good.Fd())}, syscall.EINVAL},
		{"body on STAT", clientproto.Request(clientproto.OpStat, 1, []byte{1}), []int{int(good.Fd())}, syscall.EINVAL},
		{"unknown op", clientproto.Request(99, 1, nil), []int{int(good.Fd())}, syscall.EOPNOTSUPP},
		{"oversize", clientproto.Request(clientproto.OpFill, 1, make([]byte, clientproto.MaxRequest)), []int{int(good.Fd())}, syscall.EMSGSIZE},
		{"FILL short body", clientproto.Request(clientproto.OpFill, 1, make([]byte, 10)), []int{int(good.Fd())}, syscall.EINVAL},
		{"FILL too many ranges", clientproto.Request(clientproto.OpFill, 1, fillBody(5000)), []int{int(good.Fd())}, syscall.E2BIG},
	}
	c := dialClient(t, sock)
	for _, tc := range cases {
		r := c.raw(tc.msg, tc.fds...)
		r.close()
		if r.status != -int32(tc.want) || len(r.fds) != 0 {
			t.Errorf("%s: status %d (%s), %d fds; want -%d (%v)", tc.name, r.status, r.msg, len(r.fds), int(tc.want), tc.want)
		}
	}
	// The node still serves, on the same connection and a new one.
	for _, cc := range []*clientConn{c, dialClient(t, sock)} {
		r := cc.req(clientproto.OpPacks, nil, int(good.Fd()))
		r.close()
		if r.status != 0 || len(r.fds) != 1 {
			t.Fatalf("after the refusals: PACKS status %d (%s), %d fds", r.status, r.msg, len(r.fds))
		}
	}
}

func fillBody(nRanges int) []byte {
	b := clientproto.FillRequest{Length: 1}.Append(nil)
	b[96], b[97] = byte(nRanges), byte(nRanges>>8)
	return b // the count alone is refused, before the ranges are read
}

// TestClientFillWithoutGPU: FILL on a machine without a CUDA driver is
// -ENODEV with the reason.
func TestClientFillWithoutGPU(t *testing.T) {
	requireFUSE(t)
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a GPU is here; scripts/gpu-onramp.sh tests FILL")
	}
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"big": randomBytes(6<<20, 53)})
	_, sock := startClientNode(t, data, mnt)
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m/big"))
	r := c.req(clientproto.OpFill, clientproto.FillRequest{Length: 4096}.Append(nil), int(f.Fd()))
	if r.status != -int32(syscall.ENODEV) || !strings.Contains(r.msg, "cuda") {
		t.Fatalf("FILL without a GPU: status %d (%s), want -ENODEV and the reason", r.status, r.msg)
	}
}

// TestClientSocketRefusesUserWhoMayNotRead: a process of uid 65534 cannot
// obtain an fd of a root 0600 file (the kernel refuses its open, and it
// has no other way to name the file), while the same process gets the pack
// of a 0644 file over the same socket.
func TestClientSocketRefusesUserWhoMayNotRead(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "setpriv", "util-linux")
	data, mnt := dirs(t)
	// Let uid 65534 reach the mount point and the test binary.
	for d := filepath.Dir(mnt); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	secret, public := randomBytes(6<<20, 59), randomBytes(6<<20, 61)
	importFiles(t, data, map[string][]byte{"secret": secret, "public": public})
	_, sock := startClientNode(t, data, mnt)
	if err := os.Chmod(filepath.Join(mnt, "m/secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(mnt, "m/public"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := selfForOtherUser(t, t.TempDir())
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		bin, "-test.run", "^TestClientHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "KYLIX_CLIENT_HELPER=1", "KYLIX_BIN="+kylixBin, "KYLIX_HELPER_SOCK="+sock,
		"KYLIX_HELPER_SECRET="+filepath.Join(mnt, "m/secret"), "KYLIX_HELPER_PUBLIC="+filepath.Join(mnt, "m/public"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	for _, line := range []string{"secret open: permission denied", "secret via /proc: permission denied", fmt.Sprintf("public pack: %d bytes", len(public))} {
		if !strings.Contains(string(out), line) {
			t.Errorf("helper output lacks %q:\n%s", line, out)
		}
	}
}

// TestClientHelperProcess is the client run as another user by
// TestClientSocketRefusesUserWhoMayNotRead (skipped otherwise).
func TestClientHelperProcess(t *testing.T) {
	if os.Getenv("KYLIX_CLIENT_HELPER") != "1" {
		t.Skip("helper process")
	}
	c := dialClient(t, os.Getenv("KYLIX_HELPER_SOCK"))
	_, err := os.Open(os.Getenv("KYLIX_HELPER_SECRET"))
	fmt.Printf("secret open: %v\n", errors.Unwrap(err))
	// An O_PATH fd needs no read permission; reopening it through /proc
	// does, and the node refuses O_PATH fds themselves.
	if fd, err := unix.Open(os.Getenv("KYLIX_HELPER_SECRET"), unix.O_PATH, 0); err == nil {
		_, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
		fmt.Printf("secret via /proc: %v\n", errors.Unwrap(err))
		r := c.req(clientproto.OpPacks, nil, fd)
		r.close()
		fmt.Printf("secret O_PATH PACKS: status %d, %d fds\n", r.status, len(r.fds))
		if len(r.fds) != 0 {
			t.Fatal("a pack fd of the secret file was handed out")
		}
	}
	f, err := os.Open(os.Getenv("KYLIX_HELPER_PUBLIC"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.req(clientproto.OpPacks, nil, int(f.Fd()))
	defer r.close()
	if len(r.fds) != 1 {
		t.Fatalf("public: PACKS status %d (%s), %d fds", r.status, r.msg, len(r.fds))
	}
	b, err := io.ReadAll(r.fds[0])
	fmt.Printf("public pack: %d bytes (%v)\n", len(b), err)
}

// TestClientManyConcurrent: 16 clients at once, each with its own
// connection, ask STAT and PACKS repeatedly and get the right pack.
func TestClientManyConcurrent(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	files := map[string][]byte{"a": randomBytes(5<<20, 67), "b": randomBytes(7<<20, 71)}
	importFiles(t, data, files)
	_, sock := startClientNode(t, data, mnt)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []string{"a", "b"}[i%2]
			c := dialClient(t, sock)
			f, err := os.Open(filepath.Join(mnt, "m", name))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for range 10 {
				r := c.req(clientproto.OpPacks, nil, int(f.Fd()))
				if len(r.fds) != 1 {
					errs <- fmt.Errorf("client %d: status %d (%s), %d fds", i, r.status, r.msg, len(r.fds))
					r.close()
					return
				}
				head := make([]byte, 4096)
				r.fds[0].ReadAt(head, int64(len(files[name])-4096))
				r.close()
				if !bytes.Equal(head, files[name][len(files[name])-4096:]) {
					errs <- fmt.Errorf("client %d: wrong bytes from the pack of %s", i, name)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestInoSurvivesChmod: a file's, a directory's and a symlink's inode
// numbers stay what they were after a chmod/chown through the mount (a
// SETATTR reply without the inode number made the kernel's st_ino 0, and
// the client socket, which finds a file by its inode, lost it).
func TestInoSurvivesChmod(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"f": []byte("x")})
	startClientNode(t, data, mnt)
	link := filepath.Join(mnt, "m/l")
	if err := os.Symlink("f", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(mnt, "m/f"), filepath.Join(mnt, "m"), link} {
		var before, after unix.Stat_t
		if err := unix.Lstat(p, &before); err != nil {
			t.Fatal(err)
		}
		if p == link {
			err := unix.Lchown(p, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
		} else if err := os.Chmod(p, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(p, &after); err != nil {
			t.Fatal(err)
		}
		if before.Ino == 0 || after.Ino != before.Ino {
			t.Errorf("%s: st_ino %d before the change, %d after", p, before.Ino, after.Ino)
		}
	}
}

// TestClientSocketLifecycle: a node killed with SIGKILL leaves its client
// socket behind; the next node replaces it (and serves on it); a second
// node for the same socket is refused while the first runs; a socket
// inside the data directory is refused; the socket is 0666 in a 0755
// directory.
func TestClientSocketLifecycle(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"big": randomBytes(6<<20, 73)})
	n, sock := startClientNode(t, data, mnt)
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o666 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("client socket %v (%v), want a 0666 socket", fi.Mode(), err)
	}
	if di, _ := os.Stat(filepath.Dir(sock)); di.Mode().Perm() != 0o755 {
		t.Errorf("client socket directory mode %v, want 0755", di.Mode().Perm())
	}
	// A second node on the same socket (another store and mount) is refused.
	data2, mnt2 := dirs(t)
	out, err := exec.Command(kylixBin, "serve", "--data", data2, "--mount", mnt2, "--client-socket", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another node listens") {
		t.Errorf("second node on a live client socket: %v\n%s", err, out)
	}
	n.kill9()
	syscall.Unmount(mnt, syscall.MNT_DETACH)
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("a killed node's socket is gone (%v); the test needs it stale", err)
	}
	// The next node replaces the stale socket.
	n2 := launchNode(t, data, mnt, nil, func() bool { return clientAnswers(sock) }, "--client-socket", sock)
	f := openRO(t, filepath.Join(mnt, "m/big"))
	r := dialClient(t, sock).req(clientproto.OpPacks, nil, int(f.Fd()))
	r.close()
	if r.status != 0 || len(r.fds) != 1 {
		t.Fatalf("PACKS after the restart: %d (%s), %d fds", r.status, r.msg, len(r.fds))
	}
	if !strings.Contains(n2.log.String(), "replacing a stale client socket") {
		t.Errorf("no log line about the stale socket:\n%s", n2.log)
	}
	f.Close()
	n2.stop()

	out, err = exec.Command(kylixBin, "serve", "--data", data, "--mount", mnt, "--client-socket", filepath.Join(data, "c.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "inside the data directory") {
		t.Errorf("client socket in the data directory: %v\n%s", err, out)
	}
	if isMounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		t.Error("a refused serve left its mount")
	}
}

// TestClientSocketDefaultPath: without --client-socket, a node run as root
// listens on /run/kylix/<mount path with / as _>.sock, says so, and
// removes it at stop.
func TestClientSocketDefaultPath(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := startNode(t, data, mnt)
	sock := "/run/kylix/" + strings.ReplaceAll(mnt, "/", "_") + ".sock"
	if len(sock) > 101 {
		t.Skipf("temporary path too long for the plain name: %s", sock)
	}
	waitFor(t, 10*time.Second, "the default client socket", func() bool { return clientAnswers(sock) })
	// The socket answers before serve prints where it listens.
	waitFor(t, 10*time.Second, "serve to name its client socket", func() bool {
		return strings.Contains(n.log.String(), "client socket: "+sock)
	})
	if out := mustKylix(t, t.TempDir(), "node", "--data", data); !strings.Contains(out, sock) {
		t.Errorf("kylix node does not name the client socket:\n%s", out)
	}
	n.stop()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("default client socket left after stop: %v", err)
	}
}
