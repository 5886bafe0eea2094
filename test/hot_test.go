package test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/damage"
	"github.com/kylix/kylix/internal/testneeds"
)

// hotOut is the hot files of kylix node --json.
type hotOut struct {
	Pins struct {
		LockedBytes int64 `json:"locked_bytes"`
		Hot         struct {
			BudgetBytes int64 `json:"budget_bytes"`
			LockedBytes int64 `json:"locked_bytes"`
			Files       []struct {
				Path        string `json:"path"`
				LockedBytes int64  `json:"locked_bytes"`
			} `json:"files"`
			Made     int64            `json:"made"`
			Skipped  int64            `json:"skipped"`
			LastSkip string           `json:"last_skip"`
			Evicted  map[string]int64 `json:"evicted"`
		} `json:"hot"`
	} `json:"pins"`
}

func nodeHot(t *testing.T, data string) hotOut {
	t.Helper()
	var out hotOut
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, data, "node", "--json", "--data", data)), &out))
	return out
}

func hotPaths(h hotOut) []string {
	ps := []string{}
	for _, f := range h.Pins.Hot.Files {
		ps = append(ps, f.Path)
	}
	return ps
}

// TestHotFilesStubGPU: a file a GPU fill read from the page cache is made
// hot by the node (locked, verified, registered), so the next fill of it
// copies straight from the registered pages, verified when they were
// locked ("page cache (pinned, verified)"), byte-equal; kylix load through
// the node does the same; a byte changed in a hot file's pack (its file's
// identity changes) is hashed and fails the next fill. A
// full --hot-budget releases the least recently loaded file; a pin that
// needs the memory releases hot files first; --hot-budget 0 makes none.
// Stub CUDA driver (no GPU needed).
func TestHotFilesStubGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a, b, c := randomBytes(12<<20+77, 21), randomBytes(4<<20, 22), randomBytes(6<<20+5, 23)
	importFiles(t, data, map[string][]byte{"a": a, "b": b, "c": c})
	// Locked, each is a page more than its bytes (b: exactly 4 MiB): a and
	// b fit the hot budget together, b and c too, a and c do not. The pin
	// budget is as large: hot files count in it.
	addr := freeAddr(t)
	n, sock := startStubGPUNode(t, data, mnt, "--hot-budget", "17MiB", "--pin-budget", "17MiB", "--metrics", addr)
	cl := dialClient(t, sock)
	fill := func(name string, want []byte) string { t.Helper(); return fillFile(t, cl, n, mnt, name, want) }
	waitHot := func(want ...string) hotOut {
		t.Helper()
		var h hotOut
		waitFor(t, 30*time.Second, "hot files "+filepath.Join(want...), func() bool {
			h = nodeHot(t, data)
			return assertSameSet(hotPaths(h), want)
		})
		return h
	}

	require.NotContains(t, fill("a", a), "pinned", "the first fill reads through the bounce buffers")
	h := waitHot("m/a")
	require.GreaterOrEqual(t, h.Pins.Hot.Files[0].LockedBytes, int64(len(a)))
	require.Equal(t, "page cache (pinned, verified)", fill("a", a), "the next fill copies from the registered pages, verified when locked")
	text := mustKylix(t, data, "node", "--data", data)
	require.Regexp(t, `hot: +1 files, 12\.\d MiB locked of a 17\.0 MiB budget \(1 made\)`, text)
	require.Contains(t, text, "  m/a: 12.0 MiB, ")
	mt := metrics(t, "http://"+addr+"/metrics")
	require.Equal(t, 1.0, mt["kylix_hot_files"])
	require.Equal(t, 1.0, mt["kylix_hot_made_total"])
	require.Equal(t, float64(h.Pins.Hot.LockedBytes), mt["kylix_hot_locked_bytes"])
	require.Equal(t, float64(17<<20), mt["kylix_hot_budget_bytes"])

	// kylix load through the node: b becomes hot beside a.
	type loadRep struct {
		Files []struct {
			IO      string `json:"io"`
			Checked bool   `json:"checked"`
		} `json:"files"`
	}
	load := func(p string) string {
		t.Helper()
		var r loadRep
		out := mustKylix(t, data, "load", "--data", data, "--device", "cuda:0", "--check", "--json", p)
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Len(t, r.Files, 1, out)
		require.True(t, r.Files[0].Checked)
		return r.Files[0].IO
	}
	require.NotContains(t, load("m/b"), "pinned")
	waitHot("m/a", "m/b")
	require.Contains(t, load("m/b"), "pinned")

	// c does not fit beside both: the least recently loaded (a) goes.
	require.Equal(t, "page cache (pinned, verified)", fill("b", b)) // b is now the most recent
	fill("c", c)
	h = waitHot("m/b", "m/c")
	require.Equal(t, int64(1), h.Pins.Hot.Evicted["budget"])
	// a again: it fits only alone.
	require.NotContains(t, fill("a", a), "pinned")
	h = waitHot("m/a")
	require.Equal(t, int64(3), h.Pins.Hot.Evicted["budget"])
	require.Equal(t, 3.0, metrics(t, "http://"+addr+"/metrics")[`kylix_hot_released_total{reason="budget"}`])

	// A pin comes first: pinning c does not fit beside hot a in the pin
	// budget, so a is released; a loaded again cannot be made hot while
	// the pin holds its share, and kylix node says why.
	mustKylix(t, data, "pin", "--data", data, "m/c")
	h = nodeHot(t, data)
	require.Empty(t, hotPaths(h))
	require.Equal(t, int64(1), h.Pins.Hot.Evicted["pin"], "%+v", h.Pins.Hot)
	require.Equal(t, "page cache (pinned, verified)", fill("c", c))
	require.NotContains(t, fill("a", a), "pinned")
	waitFor(t, 30*time.Second, "a not made hot, said", func() bool {
		return strings.Contains(nodeHot(t, data).Pins.Hot.LastSkip, "m/a: it needs 12.0 MiB of locked memory and the pins leave")
	})
	require.Empty(t, hotPaths(nodeHot(t, data)))

	// A byte changed in a hot file's pack after it was locked (through
	// the page cache, the pages the GPU copies): the pack's times change,
	// so the next fill hashes the chunks and fails, never places it.
	mustKylix(t, data, "unpin", "--data", data, "m/c")
	require.NotContains(t, fill("a", a), "pinned")
	waitHot("m/a")
	f := openRO(t, filepath.Join(mnt, "m", "a")) // opened before: a new open checks the pack again
	ext := extentsOf(t, data, "m/a")
	damage.FlipByte(t, ext[0].PackPath, ext[0].PackOff+ext[0].Len/2)
	al := newShmAlloc(t, len(a))
	r := cl.req(clientproto.OpFill, fillReq(al, 0, 0, uint64(len(a))), int(f.Fd()))
	require.Equal(t, -int32(syscall.EIO), r.status, "a fill of a changed hot file: %s", r.msg)
	require.Contains(t, r.msg, "corrupt")
}

// fillFile has the node fill a whole file of the mount (m/NAME) into a
// fresh allocation, checks every byte against want, and returns the I/O
// the node reports.
func fillFile(t *testing.T, cl *clientConn, n *node, mnt, name string, want []byte) string {
	t.Helper()
	f := openRO(t, filepath.Join(mnt, "m", name))
	al := newShmAlloc(t, len(want))
	r := cl.req(clientproto.OpFill, fillReq(al, 0, 0, uint64(len(want))), int(f.Fd()))
	require.Zero(t, r.status, "FILL %s: %s\n%s", name, r.msg, n.log)
	fr, err := clientproto.ParseFillReply(r.fields)
	require.NoError(t, err)
	require.True(t, bytes.Equal(al.bytes(t), want), "FILL %s: wrong bytes", name)
	return fr.IO
}

// assertSameSet reports whether got and want hold the same strings.
func assertSameSet(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	m := map[string]bool{}
	for _, g := range got {
		m[g] = true
	}
	for _, w := range want {
		if !m[w] {
			return false
		}
	}
	return true
}

// TestHotFilesOff: with --hot-budget 0 a fill makes nothing hot, and
// kylix node says hot files are off.
func TestHotFilesOff(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a := randomBytes(3<<20, 24)
	importFiles(t, data, map[string][]byte{"a": a})
	n, sock := startStubGPUNode(t, data, mnt, "--hot-budget", "0")
	cl := dialClient(t, sock)
	for range 2 {
		require.NotContains(t, fillFile(t, cl, n, mnt, "a", a), "pinned")
	}
	require.Contains(t, mustKylix(t, data, "node", "--data", data), "hot:      off (--hot-budget 0)")
	require.Empty(t, nodeHot(t, data).Pins.Hot.Files)
}

// TestHotFilesMemlockLimit: a node without CAP_IPC_LOCK under a 4 MiB
// RLIMIT_MEMLOCK makes no file hot past it; kylix node says why, the node
// logs it once (not at every load), and the fills stay right.
func TestHotFilesMemlockLimit(t *testing.T) {
	requireFUSE(t)
	for _, tool := range []string{"prlimit", "setpriv"} {
		testneeds.Command(t, tool, "util-linux")
	}
	data, mnt := dirs(t)
	a, b := randomBytes(6<<20, 25), randomBytes(5<<20, 26)
	importFiles(t, data, map[string][]byte{"a": a, "b": b})
	wrap := filepath.Join(t.TempDir(), "kylix-memlock")
	require.NoError(t, os.WriteFile(wrap, []byte("#!/bin/sh\nexec prlimit --memlock=4194304:4194304 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock "+kylixBin+" \"$@\"\n"), 0o755))
	real := kylixBin
	kylixBin = wrap
	n, sock := startStubGPUNode(t, data, mnt)
	kylixBin = real
	cl := dialClient(t, sock)
	for i := range 3 {
		for name, want := range map[string][]byte{"a": a, "b": b} {
			fillFile(t, cl, n, mnt, name, want)
		}
		want := int64(2 * (i + 1))
		waitFor(t, 30*time.Second, "the node to try both files", func() bool { return nodeHot(t, data).Pins.Hot.Skipped >= want })
	}
	h := nodeHot(t, data)
	require.Empty(t, hotPaths(h))
	require.Contains(t, h.Pins.Hot.LastSkip, "RLIMIT_MEMLOCK is 4194304 bytes")
	require.Equal(t, 1, strings.Count(n.log.String(), "could not be made hot"), "said once:\n%s", n.log)
}

// TestHotFilesGoWithTheGPU: when the node gives its last GPU context back
// after --gpu-idle, its hot files are released (reason gpu-idle), so the
// next loader does not register them on the next load's path; the next
// fill makes the file hot again.
func TestHotFilesGoWithTheGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	a := randomBytes(3<<20, 27)
	importFiles(t, data, map[string][]byte{"a": a})
	n, sock := startStubGPUNode(t, data, mnt, "--gpu-idle", "3s")
	cl := dialClient(t, sock)
	fill := func() string { t.Helper(); return fillFile(t, cl, n, mnt, "a", a) }
	fill()
	waitFor(t, 30*time.Second, "a hot", func() bool { return len(hotPaths(nodeHot(t, data))) == 1 })
	waitFor(t, 30*time.Second, "the context given back and a released", func() bool {
		h := nodeHot(t, data)
		return len(hotPaths(h)) == 0 && h.Pins.Hot.Evicted["gpu-idle"] == 1
	})
	require.Zero(t, nodeHot(t, data).Pins.LockedBytes)
	require.NotContains(t, fill(), "pinned")
	waitFor(t, 30*time.Second, "a hot again", func() bool { return len(hotPaths(nodeHot(t, data))) == 1 })
}
