package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/testneeds"
)

// Pins (docs/design/pin.md), through the real CLI against a real node.

type pinStat struct {
	Size          int64  `json:"size"`
	Pinned        bool   `json:"pinned"`
	PinNote       string `json:"pin_note"`
	PinGPU        string `json:"pin_gpu"`
	ResidentBytes int64  `json:"resident_bytes"`
	Extents       []struct {
		PackPath string `json:"pack_path"`
	} `json:"extents"`
}

func statPin(t *testing.T, data, path string) pinStat {
	t.Helper()
	var st pinStat
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "stat", "--json", "--data", data, path)), &st))
	return st
}

type nodePinsOut struct {
	Pins struct {
		BudgetBytes int64 `json:"budget_bytes"`
		LockedBytes int64 `json:"locked_bytes"`
		Pins        []struct {
			Path  string `json:"path"`
			Held  bool   `json:"held"`
			State string `json:"state"`
		} `json:"pins"`
		GPU []struct {
			Device          string `json:"device"`
			RegisteredBytes int64  `json:"registered_bytes"`
			PinnedBytes     int64  `json:"pinned_bytes"`
		} `json:"gpu"`
		GPUNote string `json:"gpu_note"`
	} `json:"pins"`
}

func nodePins(t *testing.T, data string) nodePinsOut {
	t.Helper()
	var out nodePinsOut
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "node", "--json", "--data", data)), &out))
	return out
}

// vmLocked is the node process's locked memory (VmLck), what mlock holds.
func vmLocked(t *testing.T, n *node) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(n.cmd.Process.Pid), "status"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmLck:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmLck in /proc/PID/status")
	return 0
}

// evict drops a file's pack pages from the page cache (clean pages only).
func evict(t *testing.T, pack string) {
	t.Helper()
	f, err := os.Open(pack)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

// TestPinHoldsPathsInMemory: a pinned file is locked in the node's memory
// (VmLck) and resident, stat/ls/node say so; a pin past the budget is
// refused with the budget, used and needed named and nothing of it locked;
// a missing path is a clear error; unpin releases; pins need a node.
func TestPinHoldsPathsInMemory(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a, b := randomBytes(9<<20+123, 1), randomBytes(20<<20, 2)
	importFiles(t, data, map[string][]byte{"a": a, "b": b})
	dd := filepath.Join(t.TempDir(), "d")
	require.NoError(t, os.MkdirAll(filepath.Join(dd, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dd, "x"), randomBytes(2<<20, 9), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dd, "sub", "y"), randomBytes(3<<20+1, 10), 0o644))
	mustKylix(t, data, "import", "--data", data, dd, "d")

	// Without a node: pin is refused, naming what to do.
	_, errs, code := kylix(t, data, "pin", "--data", data, "m/a")
	require.NotZero(t, code)
	require.Contains(t, errs, "no node serves")

	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--pin-budget", "24MiB")
	locked0 := vmLocked(t, n)
	out := mustKylix(t, data, "pin", "--data", data, "m/a")
	require.Contains(t, out, "pinned m/a: 1 files")
	require.Contains(t, out, "not registered with any GPU", "no GPU loader: the output must say the pin is not registered")
	st := statPin(t, data, "m/a")
	require.True(t, st.Pinned, "%+v", st)
	require.Equal(t, int64(len(a)), st.ResidentBytes)
	require.GreaterOrEqual(t, vmLocked(t, n)-locked0, int64(len(a)), "the node's locked memory grows by the file")
	// Locked pages stay resident when asked to leave.
	evict(t, st.Extents[0].PackPath)
	require.Equal(t, int64(len(a)), statPin(t, data, "m/a").ResidentBytes)
	statText := mustKylix(t, data, "stat", "--data", data, "m/a")
	require.Contains(t, statText, "pinned:   yes (pin m/a)")
	require.Contains(t, statText, "9.0 MiB locked, not registered with any GPU", "stat says plainly that no GPU registration holds")
	require.Regexp(t, `100% pinned +a\n`, mustKylix(t, data, "ls", "--data", data, "m"))
	var ls []struct {
		Name   string `json:"name"`
		Pinned bool   `json:"pinned"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "ls", "--json", "--data", data, "m")), &ls))
	for _, e := range ls {
		require.Equal(t, e.Name == "a", e.Pinned, "%+v", e)
	}
	np := nodePins(t, data)
	require.Equal(t, int64(24<<20), np.Pins.BudgetBytes)
	require.GreaterOrEqual(t, np.Pins.LockedBytes, int64(len(a)))
	require.Len(t, np.Pins.Pins, 1)
	require.Empty(t, np.Pins.GPU)
	require.Contains(t, np.Pins.GPUNote, "not registered")

	// Past the budget: refused, with the numbers; nothing half-pinned.
	recBefore, err := os.ReadFile(filepath.Join(data, "pins.json"))
	require.NoError(t, err)
	lockedBefore := vmLocked(t, n)
	_, errs, code = kylix(t, data, "pin", "--data", data, "m/b")
	require.NotZero(t, code)
	for _, want := range []string{"refused", "pin budget is 24.0 MiB", "9.0 MiB of it is used", "needs 20.0 MiB more", "--pin-budget"} {
		require.Contains(t, errs, want)
	}
	require.Equal(t, lockedBefore, vmLocked(t, n))
	require.Len(t, nodePins(t, data).Pins.Pins, 1)
	recAfter, _ := os.ReadFile(filepath.Join(data, "pins.json"))
	require.Equal(t, recBefore, recAfter)
	require.False(t, statPin(t, data, "m/b").Pinned)

	// A missing path.
	_, errs, code = kylix(t, data, "pin", "--data", data, "m/nope")
	require.NotZero(t, code)
	require.Contains(t, errs, "pin m/nope: no such path in the namespace")
	_, errs, code = kylix(t, data, "unpin", "--data", data, "m/b")
	require.NotZero(t, code)
	require.Contains(t, errs, "unpin m/b: not pinned (pinned: m/a)")

	// Unpin releases the memory and the record.
	mustKylix(t, data, "unpin", "--data", data, "m/a")
	require.False(t, statPin(t, data, "m/a").Pinned)
	require.Less(t, vmLocked(t, n), lockedBefore-int64(len(a))/2)
	require.Zero(t, nodePins(t, data).Pins.LockedBytes)
	rec, _ := os.ReadFile(filepath.Join(data, "pins.json"))
	require.NotContains(t, string(rec), "m/a")

	// A directory: every file under it.
	var po struct {
		Path        string `json:"path"`
		Files       int    `json:"files"`
		Bytes       int64  `json:"bytes"`
		LockedBytes int64  `json:"locked_bytes"`
		BudgetBytes int64  `json:"budget_bytes"`
		UsedBytes   int64  `json:"used_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "pin", "--json", "--data", data, "d")), &po))
	require.Equal(t, "d", po.Path)
	require.Equal(t, 2, po.Files)
	require.Equal(t, int64(5<<20+1), po.Bytes)
	require.GreaterOrEqual(t, po.LockedBytes, po.Bytes)
	require.Equal(t, po.LockedBytes, po.UsedBytes)
	require.Equal(t, int64(24<<20), po.BudgetBytes)
	for _, p := range []string{"d", "d/x", "d/sub", "d/sub/y"} {
		st := statPin(t, data, p)
		require.True(t, st.Pinned, p)
		require.Equal(t, st.Size, st.ResidentBytes, p)
	}
	require.False(t, statPin(t, data, "m/a").Pinned)
	require.GreaterOrEqual(t, vmLocked(t, n)-locked0, int64(5<<20))
}

// TestPinSurvivesRestartAndKill: the record brings pins back after a clean
// stop and after kill -9 (it is replaced atomically: never half written);
// without a node, stat names the recorded pin and unpin edits the record.
func TestPinSurvivesRestartAndKill(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a := randomBytes(6<<20, 3)
	importFiles(t, data, map[string][]byte{"a": a, "c": randomBytes(100, 4)})
	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	mustKylix(t, data, "pin", "--data", data, "m/a")
	mustKylix(t, data, "pin", "--data", data, "m/c")
	n.stop()

	st := statPin(t, data, "m/a")
	require.False(t, st.Pinned)
	require.Contains(t, st.PinNote, "recorded pin m/a")

	pinnedAgain := func(path string) func() bool {
		return func() bool { return statPin(t, data, path).Pinned }
	}
	n = launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	waitFor(t, 20*time.Second, "m/a pinned again after a restart", pinnedAgain("m/a"))
	require.True(t, statPin(t, data, "m/c").Pinned)
	require.GreaterOrEqual(t, vmLocked(t, n), int64(len(a)))

	// kill -9 right after changes of the record.
	mustKylix(t, data, "unpin", "--data", data, "m/c")
	n.kill9()
	b, err := os.ReadFile(filepath.Join(data, "pins.json"))
	require.NoError(t, err)
	var rec struct {
		Version int
		Pins    []struct{ Path string }
	}
	require.NoError(t, json.Unmarshal(b, &rec), "the record is whole after kill -9: %s", b)
	require.Equal(t, 1, rec.Version)
	require.Len(t, rec.Pins, 1)
	require.Equal(t, "m/a", rec.Pins[0].Path)
	_, err = os.Stat(filepath.Join(data, "pins.json.tmp"))
	require.ErrorIs(t, err, os.ErrNotExist)

	n = launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	waitFor(t, 20*time.Second, "m/a pinned again after kill -9", pinnedAgain("m/a"))
	require.False(t, statPin(t, data, "m/c").Pinned)
	n.stop()

	// A budget too small at the next start: the pin stays recorded and the
	// node says why it is not held.
	n = launchNode(t, data, mnt, nil, nil, "--client-socket", "none", "--pin-budget", "1MiB")
	waitFor(t, 20*time.Second, "the node reports the pin it could not hold", func() bool {
		p := nodePins(t, data).Pins.Pins
		return len(p) == 1 && strings.Contains(p[0].State, "not held") && strings.Contains(p[0].State, "refused")
	})
	require.Contains(t, mustKylix(t, data, "node", "--data", data), "m/a: not held: pin m/a: refused")
	n.stop()

	// Without a node, unpin edits the record.
	require.Contains(t, mustKylix(t, data, "unpin", "--data", data, "m/a"), "removed the pin of m/a")
	b, _ = os.ReadFile(filepath.Join(data, "pins.json"))
	require.NotContains(t, string(b), "m/a")

	// A damaged record: the node does not start, and says what to do.
	require.NoError(t, os.WriteFile(filepath.Join(data, "pins.json"), []byte("{garbage"), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	outb, err := exec.CommandContext(ctx, kylixBin, "serve", "--data", data, "--mount", mnt, "--client-socket", "none").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(outb), "pins.json: not a version 1 record")
	require.Contains(t, string(outb), "fix or remove it")
	require.False(t, isMounted(mnt))
}

// TestWarm: warm reads a path's chunks verified into the page cache, with
// and without a node, and says how much is resident.
func TestWarm(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a := randomBytes(12<<20+5, 5)
	importFiles(t, data, map[string][]byte{"a": a, "b": randomBytes(3000, 6)})
	type warmJSON struct {
		Files         int   `json:"files"`
		Bytes         int64 `json:"bytes"`
		ResidentBytes int64 `json:"resident_bytes"`
		Verified      bool  `json:"verified"`
	}
	check := func() {
		t.Helper()
		evict(t, statPin(t, data, "m/a").Extents[0].PackPath)
		require.Less(t, statPin(t, data, "m/a").ResidentBytes, int64(len(a)), "evicted")
		var w warmJSON
		require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "warm", "--json", "--data", data, "m")), &w))
		require.Equal(t, warmJSON{Files: 2, Bytes: int64(len(a)) + 3000, ResidentBytes: int64(len(a)) + 3000, Verified: true}, w)
		require.Equal(t, int64(len(a)), statPin(t, data, "m/a").ResidentBytes)
		// On a terminal: a progress bar on stderr (script gives it a pty).
		if _, err := exec.LookPath("script"); err != nil {
			t.Log("no script(1): progress bar not checked")
			return
		}
		tty := run(t, data, "script", "-qec", kylixBin+" warm --data "+data+" m/a", "/dev/null")
		require.Contains(t, tty, "warm m/a [==============================] 100% 12.0 MiB/12.0 MiB")
		require.Contains(t, tty, "warmed m/a: 1 files")
	}
	check()
	out := mustKylix(t, data, "warm", "--data", data, "m/a")
	require.Regexp(t, `^warmed m/a: 1 files, 12.0 MiB verified in .* resident in the page cache\n$`, out)
	_, errs, code := kylix(t, data, "warm", "--data", data, "m/nope")
	require.NotZero(t, code)
	require.Contains(t, errs, "warm m/nope: no such path")

	launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	check()
}

// TestPinnedFillStubGPU: a GPU fill of a pinned file copies straight from
// the pinned pages registered with the device ("page cache (pinned)"),
// exactly the file's bytes; kylix node reports the registered bytes; a pin
// made while the loader exists is registered at once; after --gpu-idle the
// registration goes with the loader and the node says so. Runs on the stub
// CUDA driver (no GPU needed).
func TestPinnedFillStubGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a, b := randomBytes(20<<20+77, 7), randomBytes(5<<20, 8)
	importFiles(t, data, map[string][]byte{"a": a, "b": b})
	n, sock := startStubGPUNode(t, data, mnt, "--gpu-idle", "2s")
	mustKylix(t, data, "pin", "--data", data, "m/a")
	c := dialClient(t, sock)
	fill := func(name string, want []byte) clientproto.FillReply {
		t.Helper()
		f := openRO(t, filepath.Join(mnt, "m", name))
		al := newShmAlloc(t, len(want))
		r := c.req(clientproto.OpFill, fillReq(al, 0, 0, uint64(len(want))), int(f.Fd()))
		require.Zero(t, r.status, "FILL %s: %s\n%s", name, r.msg, n.log)
		fr, err := clientproto.ParseFillReply(r.fields)
		require.NoError(t, err)
		require.True(t, bytes.Equal(al.bytes(t), want), "FILL %s: wrong bytes", name)
		return fr
	}
	// Pinned chunks were hashed when pinned: placed as they are...
	fr := fill("a", a)
	require.Equal(t, "page cache (pinned, verified)", fr.IO)
	require.Equal(t, "pin", fr.Verified)
	// ...unless the caller requires verification on the GPU at this load:
	// then every chunk is hashed again (the stub has no GPU hashing, so
	// the node says so, with the bytes in place).
	{
		f := openRO(t, filepath.Join(mnt, "m", "a"))
		al := newShmAlloc(t, len(a))
		r := c.req(clientproto.OpFill, clientproto.FillRequest{IPCHandle: al.handle, Flags: clientproto.FillVerify, Length: uint64(len(a))}.Append(nil), int(f.Fd()))
		require.Equal(t, -int32(syscall.EOPNOTSUPP), r.status, r.msg)
		fr, err := clientproto.ParseFillReply(r.fields)
		require.NoError(t, err)
		require.Equal(t, "page cache (pinned)", fr.IO)
		require.Equal(t, "cpu", fr.Verified)
		require.True(t, bytes.Equal(al.bytes(t), a))
	}
	require.Contains(t, mustKylix(t, data, "stat", "--data", data, "m/a"), "20.0 MiB locked and registered for GPU copies (by cuda:0 (")
	np := nodePins(t, data)
	require.Len(t, np.Pins.GPU, 1)
	require.Equal(t, np.Pins.LockedBytes, np.Pins.GPU[0].RegisteredBytes)
	nodeText := mustKylix(t, data, "node", "--data", data)
	t.Log(nodeText)
	require.Regexp(t, `gpu: cuda:0 \(.*\): 20\.0 MiB of 20\.0 MiB registered`, nodeText)
	require.NotContains(t, fill("b", b).IO, "pinned")

	// Pinned while the loader is held: registered at once.
	require.Regexp(t, `gpu: cuda:0 \(.*\): 25\.0 MiB of 25\.0 MiB registered`, mustKylix(t, data, "pin", "--data", data, "m/b"))
	require.Equal(t, "page cache (pinned, verified)", fill("b", b).IO)
	np = nodePins(t, data)
	require.Equal(t, np.Pins.LockedBytes, np.Pins.GPU[0].RegisteredBytes)

	waitFor(t, 20*time.Second, "the registration to go with the idle loader", func() bool {
		return len(nodePins(t, data).Pins.GPU) == 0
	})
	require.Contains(t, nodePins(t, data).Pins.GPUNote, "not registered")
	require.Contains(t, statPin(t, data, "m/a").PinGPU, "not registered with any GPU")
	require.Equal(t, "page cache (pinned, verified)", fill("a", a).IO, "a new loader registers the pins again")
	mustKylix(t, data, "unpin", "--data", data, "m/a")
	require.NotContains(t, fill("a", a).IO, "pinned")
}

// TestPinMemlockLimit: a node without CAP_IPC_LOCK under a small
// RLIMIT_MEMLOCK refuses a pin past the limit with a message that names the
// limit and how to raise it, and unlocks what it had locked of the pin.
func TestPinMemlockLimit(t *testing.T) {
	requireFUSE(t)
	for _, tool := range []string{"prlimit", "setpriv"} {
		testneeds.Command(t, tool, "util-linux")
	}
	data, mnt := dirs(t)
	importFiles(t, data, map[string][]byte{"a": randomBytes(2<<20, 11), "b": randomBytes(9<<20, 12)})
	// The node runs under a wrapper: 4 MiB RLIMIT_MEMLOCK, no CAP_IPC_LOCK.
	wrap := filepath.Join(t.TempDir(), "kylix-memlock")
	require.NoError(t, os.WriteFile(wrap, []byte("#!/bin/sh\nexec prlimit --memlock=4194304:4194304 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock "+kylixBin+" \"$@\"\n"), 0o755))
	real := kylixBin
	kylixBin = wrap
	n := launchNode(t, data, mnt, nil, nil, "--client-socket", "none")
	kylixBin = real
	_, errs, code := kylix(t, data, "pin", "--data", data, "m")
	require.NotZero(t, code)
	t.Logf("refused: %s", errs)
	for _, want := range []string{"pin m:", "cannot lock the pages in memory", "RLIMIT_MEMLOCK is 4194304 bytes", "ulimit -l"} {
		require.Contains(t, errs, want)
	}
	require.Zero(t, vmLocked(t, n), "nothing of the refused pin stays locked")
	require.Empty(t, nodePins(t, data).Pins.Pins)
	mustKylix(t, data, "pin", "--data", data, "m/a") // within the limit
	require.True(t, statPin(t, data, "m/a").Pinned)
	// kylix doctor, run the way the node runs, says so too.
	require.Regexp(t, `no +pins +RLIMIT_MEMLOCK is 4.0 MiB and there is no CAP_IPC_LOCK`, run(t, data, wrap, "doctor", "--data", t.TempDir()))
}

// TestPinnedLoadStubGPU: kylix load through a node copies a pinned file
// from its pinned pages registered with the device, as a GPU fill does
// ("pinned" in its io), and every byte is right (--check); the node's fill
// device, which holds the registration, stays after the load (kylix node
// shows the pins registered), so the next load does not register them
// again; a file not pinned is read as before. Stub CUDA driver.
func TestPinnedLoadStubGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a, b := randomBytes(20<<20+77, 9), randomBytes(5<<20, 10)
	importFiles(t, data, map[string][]byte{"a": a, "b": b})
	startStubGPUNode(t, data, mnt)
	mustKylix(t, data, "pin", "--data", data, "m/a")
	type loadRep struct {
		Files []struct {
			Path    string `json:"path"`
			IO      string `json:"io"`
			Checked bool   `json:"checked"`
		} `json:"files"`
	}
	load := func(p string) (string, bool) {
		t.Helper()
		var r loadRep
		out := mustKylix(t, data, "load", "--data", data, "--device", "cuda:0", "--check", "--json", p)
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Len(t, r.Files, 1, out)
		return r.Files[0].IO, r.Files[0].Checked
	}
	for range 2 {
		io, checked := load("m/a")
		require.True(t, checked)
		require.Contains(t, io, "pinned", "a pinned file loaded through the node")
		require.Regexp(t, `gpu: cuda:0 \(.*\): 20\.0 MiB of 20\.0 MiB registered`, mustKylix(t, data, "node", "--data", data))
	}
	io, checked := load("m/b")
	require.True(t, checked)
	require.NotContains(t, io, "pinned")
}
