package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/testneeds"
)

// running is a node started in-process by startNode.
type running struct {
	n     *Node
	data  string
	mount string
	ready Ready
}

// startNode runs a node in-process on fresh directories (root and FUSE
// needed, as for every mount test); the cleanup stops it and checks that
// it unmounted and removed its admin socket.
func startNode(t *testing.T, cfg Config) *running {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("an in-process node mounts: needs root (CI runs as root)")
	}
	testneeds.FUSE(t)
	r := &running{data: t.TempDir(), mount: t.TempDir()}
	cfg.DataDir, cfg.Mount = r.data, r.mount
	if cfg.ClientSocket == "" {
		cfg.ClientSocket = filepath.Join(t.TempDir(), "client.sock")
	}
	cfg.StopTimeout = -1 // no watchdog: it would exit the test binary
	n, err := New(cfg)
	require.NoError(t, err)
	r.n = n
	ctx, cancel := context.WithCancel(context.Background())
	readyCh := make(chan Ready, 1)
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx, func(rd Ready) { readyCh <- rd }) }()
	select {
	case r.ready = <-readyCh:
	case err := <-done:
		cancel()
		t.Fatalf("node stopped before it served: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		_, err := os.Stat(filepath.Join(r.data, SocketName))
		assert.ErrorIs(t, err, os.ErrNotExist, "admin socket removed at stop")
		mounted, _ := os.ReadFile("/proc/self/mounts")
		assert.NotContains(t, string(mounted), " "+r.mount+" ", "unmounted at stop")
	})
	return r
}

// call sends a typed request through the node's admin socket.
func (r *running) call(t *testing.T, op string, req, reply any, onEvent func(Event)) error {
	t.Helper()
	c, err := Dial(r.data)
	require.NoError(t, err)
	return c.Call(context.Background(), op, req, reply, onEvent)
}

func writeSource(t *testing.T, size int) (string, []byte) {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*131 + i>>9)
	}
	p := filepath.Join(t.TempDir(), "w.bin")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p, b
}

// TestNodeInProcess runs a node in this process and drives it as the CLI
// does, through the admin socket's typed requests: import (the mount shows
// the file, byte for byte), status, pin and unpin (the record and the
// status follow), warm with progress events, a host-device load with its
// pass report, metrics; the cluster-only requests say there is no
// cluster; a second node on the same data directory is refused.
func TestNodeInProcess(t *testing.T) {
	r := startNode(t, Config{PinBudget: 64 << 20})
	assert.Equal(t, r.mount, r.ready.Mount)
	assert.Equal(t, filepath.Join(r.data, SocketName), r.ready.AdminSocket)

	src, want := writeSource(t, 5<<20+123)
	var imp ImportReply
	var events int
	require.NoError(t, r.call(t, OpImport, ImportRequest{Src: src, Dest: "m/w.bin"}, &imp, func(Event) { events++ }))
	assert.Equal(t, 1, imp.Result.Files)
	assert.Equal(t, int64(len(want)), imp.Result.Bytes)
	got, err := os.ReadFile(filepath.Join(r.mount, "m/w.bin"))
	require.NoError(t, err, "the import is in the mount")
	assert.True(t, bytes.Equal(want, got), "the mount serves the imported bytes")

	// The client socket: STAT of a file the caller opened in the mount.
	f, err := os.Open(filepath.Join(r.mount, "m/w.bin"))
	require.NoError(t, err)
	defer f.Close()
	cc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: r.ready.ClientSocket, Net: "unixpacket"})
	require.NoError(t, err)
	defer cc.Close()
	_, _, err = cc.WriteMsgUnix(clientproto.Request(clientproto.OpStat, 7, nil), unix.UnixRights(int(f.Fd())), nil)
	require.NoError(t, err)
	buf := make([]byte, 4096)
	nr, err := cc.Read(buf)
	require.NoError(t, err)
	h, status, msg, fields, err := clientproto.ParseReply(buf[:nr])
	require.NoError(t, err)
	require.Zero(t, status, msg)
	assert.Equal(t, uint32(7), h.Seq)
	sr, err := clientproto.ParseStat(fields)
	require.NoError(t, err)
	assert.Equal(t, uint64(len(want)), sr.Size)
	assert.Equal(t, sr.NChunks, sr.LocalChunks)

	var st NodeStatus
	require.NoError(t, r.call(t, OpNode, NodeRequest{}, &st, nil))
	assert.Equal(t, os.Getpid(), st.PID)
	assert.Equal(t, r.mount, st.Mount)
	require.NotNil(t, st.Clients, "a client socket was asked for")
	assert.Equal(t, int64(1), st.Clients.Requests, "the STAT")
	require.NotNil(t, st.Pins)
	assert.Equal(t, int64(64<<20), st.Pins.BudgetBytes)

	var pin PinReply
	require.NoError(t, r.call(t, OpPin, PathRequest{Path: "m"}, &pin, nil))
	assert.Equal(t, "m", pin.Path)
	assert.Equal(t, 1, pin.Files)
	assert.GreaterOrEqual(t, pin.LockedBytes, int64(len(want)))
	assert.False(t, pin.Cluster)
	rec, err := readPinRecord(r.data)
	require.NoError(t, err)
	require.Len(t, rec.Pins, 1)
	assert.Equal(t, "m", rec.Pins[0].Path)
	on, note := r.n.PinView().Info("m/w.bin", mustLookup(t, r.n, "m/w.bin"))
	assert.True(t, on, note)

	err = r.call(t, OpUnpin, PathRequest{Path: "other"}, nil, nil)
	require.ErrorContains(t, err, "unpin other: not pinned (pinned: m)")
	var unpin UnpinReply
	require.NoError(t, r.call(t, OpUnpin, PathRequest{Path: "m"}, &unpin, nil))
	assert.Zero(t, unpin.LockedBytes)
	rec, err = readPinRecord(r.data)
	require.NoError(t, err)
	assert.Empty(t, rec.Pins)

	var warm WarmReply
	var last Event
	require.NoError(t, r.call(t, OpWarm, PathRequest{Path: "m"}, &warm, func(ev Event) { last = ev }))
	assert.Equal(t, int64(len(want)), warm.Bytes)
	assert.True(t, warm.Verified)
	assert.Equal(t, last.Total, last.Done, "the last progress event is the end")
	assert.Equal(t, int64(len(want)), last.Done)
	err = r.call(t, OpWarm, PathRequest{Path: "nothing/here"}, nil, nil)
	require.ErrorContains(t, err, "warm nothing/here: no such path in the namespace")

	var passes []LoadPass
	require.NoError(t, r.call(t, OpLoad, LoadRequest{Paths: []string{"m"}, Device: "host", Path: "auto", IO: "auto",
		TPSize: 1, BufMiB: 16, VerifyOn: "auto", Check: true, Repeat: 2, Files: 1, Reader: "pread"}, nil, func(ev Event) {
		var p LoadPass
		require.NoError(t, json.Unmarshal(ev.Data, &p))
		passes = append(passes, p)
	}))
	require.Len(t, passes, 2, "one event per pass")
	for _, p := range passes {
		assert.Equal(t, int64(len(want)), p.Report.Bytes)
		require.Len(t, p.Report.Files, 1)
		assert.True(t, p.Report.Files[0].Checked, "read back and compared")
		assert.True(t, p.Report.Files[0].Verified)
	}

	var m MetricsReply
	require.NoError(t, r.call(t, OpMetrics, nil, &m, nil))
	assert.Contains(t, m.Text, "kylix_fs_opens_total{path=")
	assert.Contains(t, m.Text, "kylix_import_bytes_total ")

	require.ErrorContains(t, r.call(t, OpPeers, nil, nil, nil), "not in a cluster")
	require.ErrorContains(t, r.call(t, OpEvict, EvictRequest{All: true}, nil, nil), "not in a cluster")
	require.ErrorContains(t, r.call(t, "frobnicate", nil, nil, nil), `unknown request "frobnicate"`)

	_, err = New(Config{DataDir: r.data, Mount: t.TempDir(), StopTimeout: -1})
	require.ErrorContains(t, err, "a node already serves")
}

// TestAdminProtocolRefusals: a request of another protocol version, a
// malformed line and a store command without Config.Exec are refused with
// a message that says why, and the node keeps serving.
func TestAdminProtocolRefusals(t *testing.T) {
	r := startNode(t, Config{ClientSocket: "none"})
	raw := func(line string) Reply {
		conn, err := net.Dial("unix", filepath.Join(r.data, SocketName))
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte(line + "\n"))
		require.NoError(t, err)
		kind, payload, err := readFrame(conn)
		require.NoError(t, err)
		require.Equal(t, byte(frameReply), kind)
		var rep Reply
		require.NoError(t, json.Unmarshal(payload, &rep))
		return rep
	}
	assert.Contains(t, raw(`{"v": 99, "op": "node"}`).Error, "admin protocol version 1, the command sent version 99")
	assert.Contains(t, raw(`{"args": ["ls"], "cwd": "/"}`).Error, "the command sent version 0")
	assert.Contains(t, raw(`not json`).Error, "bad request")
	c, err := Dial(r.data)
	require.NoError(t, err)
	var stderr strings.Builder
	code, err := c.Exec(context.Background(), ExecRequest{Args: []string{"ls"}, Cwd: "/"}, &strings.Builder{}, &stderr)
	require.NoError(t, err)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "runs no store commands")
	var st NodeStatus
	require.NoError(t, r.call(t, OpNode, nil, &st, nil), "still serving")
	assert.Nil(t, st.Clients, "no client socket")
}

func mustLookup(t *testing.T, n *Node, path string) chunkstore.Entry {
	t.Helper()
	ent, err := n.Store().Lookup(path)
	require.NoError(t, err)
	return ent
}

// TestNewFailsCleanly: a node that cannot start (here: its client socket's
// path is taken by a plain file) says why, and leaves nothing behind: no
// admin socket, and the store unlocked for the next command.
func TestNewFailsCleanly(t *testing.T) {
	data := t.TempDir()
	taken := filepath.Join(t.TempDir(), "client.sock")
	require.NoError(t, os.WriteFile(taken, []byte("not a socket"), 0o644))
	_, err := New(Config{DataDir: data, Mount: t.TempDir(), ClientSocket: taken, StopTimeout: -1})
	require.ErrorContains(t, err, "client socket")
	_, err = os.Stat(filepath.Join(data, SocketName))
	assert.ErrorIs(t, err, os.ErrNotExist, "no admin socket left")
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	require.NoError(t, err, "the store is not left locked")
	s.Close()
}
