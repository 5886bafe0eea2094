package test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/internal/testneeds"
)

// notifySocket is a service manager's end of the sd_notify protocol: a
// unix datagram socket whose path goes to the service in NOTIFY_SOCKET.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{path: path, conn: conn}
}

// next returns the next datagram's variables (KEY=VALUE lines), failing
// the test if none arrives within d.
func (s *notifySocket) next(t *testing.T, d time.Duration, what string) map[string]string {
	t.Helper()
	buf := make([]byte, 4096)
	s.conn.SetReadDeadline(time.Now().Add(d))
	n, err := s.conn.Read(buf)
	require.NoError(t, err, "waiting %v for %s on NOTIFY_SOCKET", d, what)
	vars := map[string]string{}
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// TestServeNotifiesSystemd runs the real `kylix serve` the way systemd
// runs a Type=notify unit (contrib/systemd/kylix.service): with
// NOTIFY_SOCKET naming a datagram socket. READY=1 must arrive only once the
// mount answers and both sockets listen, and STOPPING=1 when SIGTERM
// arrives, before the node unmounts and exits cleanly.
func TestServeNotifiesSystemd(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"a.bin": randomBytes(1<<20, 3)})
	ns := listenNotify(t)
	clientSock := filepath.Join(t.TempDir(), "client.sock")
	var log bytes.Buffer
	cmd := exec.Command(kylixBin, "serve", "--data", data, "--mount", mnt, "--client-socket", clientSock, "--stop-timeout", "10s")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.path)
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	// exited is closed when the node has exited, with its error in waitErr.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				t.Errorf("node %d did not exit after SIGKILL; log:\n%s", cmd.Process.Pid, &log)
			}
		}
		if isMounted(mnt) {
			exec.Command("umount", "-l", mnt).Run()
		}
	})

	ready := ns.next(t, 30*time.Second, "READY=1")
	// Checked as soon as READY=1 arrives: by then everything must answer.
	require.Equal(t, "1", ready["READY"], "first notification %v; node log:\n%s", ready, &log)
	assert.True(t, isMounted(mnt), "READY=1 before %s was mounted", mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "m", "a.bin"))
	assert.NoError(t, err, "reading through the mount at READY=1")
	assert.True(t, bytes.Equal(randomBytes(1<<20, 3), got), "bytes through the mount at READY=1 differ from the file imported")
	assert.True(t, answers(filepath.Join(data, "kylix.sock")), "admin socket does not answer at READY=1")
	assert.True(t, clientAnswers(clientSock), "client socket does not answer at READY=1")
	assert.Contains(t, ready["STATUS"], mnt, "STATUS says where the node serves")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	stopping := ns.next(t, 10*time.Second, "STOPPING=1")
	assert.Equal(t, "1", stopping["STOPPING"], "notification after SIGTERM: %v", stopping)
	select {
	case <-exited:
		assert.NoError(t, waitErr, "node exit after SIGTERM; log:\n%s", &log)
	case <-time.After(20 * time.Second):
		t.Fatalf("node did not exit within 20s of SIGTERM (--stop-timeout 10s); log:\n%s", &log)
	}
	assert.False(t, isMounted(mnt), "%s still mounted after the node stopped", mnt)
}

// TestServeWithoutNotifySocket: started by hand (no NOTIFY_SOCKET), the
// node serves as before and says nothing about a service manager.
func TestServeWithoutNotifySocket(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n := launchNode(t, data, mnt, []string{"NOTIFY_SOCKET="}, nil, "--client-socket", "none")
	n.stop()
	assert.NotContains(t, n.log.String(), "NOTIFY_SOCKET", "a node without a service manager warned about one")
}

// unitSettings returns the KEY=VALUE settings of a systemd unit file (the
// last value of each key).
func unitSettings(t *testing.T, text string) map[string]string {
	t.Helper()
	kv := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "unit line %q", line)
		kv[k] = v
	}
	return kv
}

// TestSystemdUnit checks contrib/systemd/kylix.service: systemd-analyze
// verify accepts it (with ExecStart pointed at the binary under test, which
// it checks exists) and rejects a broken copy, and it has what the notify
// protocol and a clean stop need: Type=notify, kylix serve with a
// --stop-timeout shorter than TimeoutStopSec, SIGTERM to the main process
// only, and no setting that hides /dev/fuse or gives the service a mount
// namespace of its own.
func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("../contrib/systemd/kylix.service")
	require.NoError(t, err)
	kv := unitSettings(t, string(unit))
	assert.Equal(t, "notify", kv["Type"])
	assert.Equal(t, "main", kv["NotifyAccess"])
	assert.Equal(t, "mixed", kv["KillMode"])
	assert.Equal(t, "SIGTERM", kv["KillSignal"])
	exec0 := strings.Fields(kv["ExecStart"])
	require.GreaterOrEqual(t, len(exec0), 2, "ExecStart=%s", kv["ExecStart"])
	assert.Equal(t, "serve", exec0[1])
	var stopTimeout time.Duration
	for i, a := range exec0 {
		if a == "--stop-timeout" && i+1 < len(exec0) {
			stopTimeout, err = time.ParseDuration(exec0[i+1])
			require.NoError(t, err)
		}
	}
	require.NotZero(t, stopTimeout, "ExecStart sets no --stop-timeout")
	unitStop, err := time.ParseDuration(kv["TimeoutStopSec"])
	require.NoError(t, err, "TimeoutStopSec=%s", kv["TimeoutStopSec"])
	assert.Greater(t, unitStop, stopTimeout, "systemd's SIGKILL (TimeoutStopSec) must come after the node's own --stop-timeout")
	for _, k := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectSystem", "ProtectHome",
		"PrivateTmp", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "ProtectKernelTunables",
		"ProtectControlGroups", "ProtectKernelLogs", "ProtectHostname", "PrivateMounts", "MountFlags", "MemoryDenyWriteExecute"} {
		assert.NotContains(t, kv, k, "%s= hides /dev/fuse, keeps the mount in a namespace of the service's own, or breaks the CUDA driver", k)
	}

	analyze := testneeds.Command(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	good := filepath.Join(dir, "kylix.service")
	require.NoError(t, os.WriteFile(good, []byte(strings.Replace(string(unit), "ExecStart="+exec0[0], "ExecStart="+kylixBin, 1)), 0o644))
	out, err := exec.Command(analyze, "verify", good).CombinedOutput()
	assert.NoError(t, err, "systemd-analyze verify: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify warns")
	// The same check must catch a broken unit.
	bad := filepath.Join(dir, "broken", "kylix.service")
	require.NoError(t, os.MkdirAll(filepath.Dir(bad), 0o755))
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(string(unit), "Type=notify", "Type=notifyy", 1)+"\nExecStart=\n"), 0o644))
	out, err = exec.Command(analyze, "verify", bad).CombinedOutput()
	assert.True(t, err != nil || len(bytes.TrimSpace(out)) > 0, "systemd-analyze verify accepted a broken unit")
}
