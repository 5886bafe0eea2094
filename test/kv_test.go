package test

// The KV-cache store through the real node (docs/design/kv.md): kylix
// serve with --kv-mem/--kv-disk, the client socket's KV ops with a memfd
// buffer, another uid's namespace, a restart, a flipped byte on disk, the
// CLI (kylix kv stats/clear) and the metrics.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/testneeds"
)

const kvBlock = 64 << 10

// kvKey is the test's key i; kvBlockOf its block (a function of the key
// and of who put it, so a block read back names its writer).
func kvKey(i int) [32]byte {
	var k [32]byte
	copy(k[:], fmt.Sprintf("prefix-%d", i))
	return k
}

func kvBlockOf(i int, who string) []byte {
	return randomBytes(kvBlock, uint64(i)*1000+uint64(len(who))*7+uint64(who[0]))
}

// memBuf is a memfd of n blocks.
func memBuf(t testing.TB, n int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("kv-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(n*kvBlock)))
	return fd
}

func kvBody(keys ...[32]byte) []byte {
	return clientproto.KVBlocksRequest{Device: clientproto.KVDeviceHost, Keys: keys}.Append(nil)
}

// kvPut puts blocks (of blockOf) under keys ids; the per-key statuses.
func (c *clientConn) kvPut(fd int, who string, ids ...int) []int32 {
	c.t.Helper()
	keys := make([][32]byte, len(ids))
	for j, i := range ids {
		keys[j] = kvKey(i)
		_, err := unix.Pwrite(fd, kvBlockOf(i, who), int64(j*kvBlock))
		require.NoError(c.t, err)
	}
	r := c.req(clientproto.OpKVPut, kvBody(keys...), fd)
	require.Zero(c.t, r.status, r.msg)
	bs, st, err := clientproto.ParseKVPut(r.fields)
	require.NoError(c.t, err)
	require.Equal(c.t, uint32(kvBlock), bs)
	return st
}

// kvGet gets keys ids and checks every hit is who's block; the tiers.
func (c *clientConn) kvGet(fd int, who string, ids ...int) []byte {
	c.t.Helper()
	keys := make([][32]byte, len(ids))
	for j, i := range ids {
		keys[j] = kvKey(i)
	}
	zero := make([]byte, len(ids)*kvBlock)
	_, err := unix.Pwrite(fd, zero, 0)
	require.NoError(c.t, err)
	r := c.req(clientproto.OpKVGet, kvBody(keys...), fd)
	require.Zero(c.t, r.status, r.msg)
	_, tiers, err := clientproto.ParseKVTiers(r.fields)
	require.NoError(c.t, err)
	require.Len(c.t, tiers, len(ids))
	for j, i := range ids {
		got := make([]byte, kvBlock)
		_, err := unix.Pread(fd, got, int64(j*kvBlock))
		require.NoError(c.t, err)
		if tiers[j] == clientproto.KVMiss {
			require.True(c.t, bytes.Equal(got, make([]byte, kvBlock)), "a miss writes nothing (key %d)", i)
		} else {
			require.True(c.t, bytes.Equal(got, kvBlockOf(i, who)), "key %d from tier %d is not %s's block", i, tiers[j], who)
		}
	}
	return tiers
}

func (c *clientConn) kvContains(ids ...int) []byte {
	c.t.Helper()
	keys := make([][32]byte, len(ids))
	for j, i := range ids {
		keys[j] = kvKey(i)
	}
	r := c.req(clientproto.OpKVContains, clientproto.AppendKVKeys(nil, keys))
	require.Zero(c.t, r.status, r.msg)
	_, tiers, err := clientproto.ParseKVTiers(r.fields)
	require.NoError(c.t, err)
	return tiers
}

func startKVNode(t *testing.T, data, mnt string, extra ...string) (*node, string) {
	t.Helper()
	sockDir := t.TempDir()
	os.Chmod(sockDir, 0o755)
	sock := filepath.Join(sockDir, "client.sock")
	args := append([]string{"--client-socket", sock, "--kv-block", "64KiB", "--kv-mem", "256KiB", "--kv-disk", "1MiB"}, extra...)
	n := launchNode(t, data, mnt, nil, func() bool { return clientAnswers(sock) }, args...)
	killOnFailure(t, n)
	return n, sock
}

type kvCLIStats struct {
	Enabled bool `json:"enabled"`
	Stats   struct {
		BlockSize int `json:"block_size"`
		Memory    struct {
			Blocks, Hits int64
		} `json:"memory"`
		Disk struct {
			Blocks, Hits int64
		} `json:"disk"`
		Puts, Refused, Misses, Dirty int64
		VerifyFailures               int64  `json:"verify_failures"`
		DiskReads                    string `json:"disk_reads"`
	} `json:"stats"`
}

func kvStatsCLI(t *testing.T, data string) kvCLIStats {
	t.Helper()
	var st kvCLIStats
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "", "kv", "stats", "--data", data, "--json")), &st))
	return st
}

// TestKVThroughClientSocket: blocks put through the client socket come
// back byte-equal from memory and from disk, in LRU order; they survive a
// restart; a flipped byte on disk is a miss; the refusals; the CLI and
// the metrics count it all.
func TestKVThroughClientSocket(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	addr := freeAddr(t)
	n, sock := startKVNode(t, data, mnt, "--metrics", addr)
	c := dialClient(t, sock)
	fd := memBuf(t, 16)

	// 4 blocks fit the host tier, 15 the disk tier (1 MiB / 68 KiB files).
	require.Equal(t, []int32{0, 0, 0, 0}, c.kvPut(fd, "root", 0, 1, 2, 3))
	assert.Equal(t, []byte{1, 1, 1, 1}, c.kvGet(fd, "root", 0, 1, 2, 3), "all in memory")
	assert.Equal(t, []byte{0}, c.kvGet(fd, "root", 99), "never put: a miss")
	// Later puts push the least recently used out of memory once they are
	// on disk; a put refused for room is retried as a scheduler would.
	for i := 4; i < 8; i++ {
		for attempt := 0; ; attempt++ {
			st := c.kvPut(fd, "root", i)
			if st[0] == 0 {
				break
			}
			require.Equal(t, -int32(syscall.ENOSPC), st[0], "a put is stored or refused for room")
			require.Less(t, attempt, 10000, "the host tier never made room")
		}
	}
	mustKylix(t, "", "kv", "stats", "--data", data) // text form runs
	tiers := c.kvGet(fd, "root", 0, 1, 2, 3, 4, 5, 6, 7)
	for i, tr := range tiers {
		assert.NotEqual(t, byte(0), tr, "key %d", i)
	}
	assert.Contains(t, tiers, byte(clientproto.KVDisk), "some blocks came from disk: %v", tiers)

	// Refusals, each answered and the node serving on.
	other := memBuf(t, 1)
	for _, x := range []struct {
		name string
		op   uint16
		body []byte
		fds  []int
		want syscall.Errno
	}{
		{"GPU memory with a buffer fd", clientproto.OpKVGet, clientproto.KVBlocksRequest{Device: 0, Keys: [][32]byte{kvKey(0)}}.Append(nil), []int{fd}, syscall.EBADF},
		{"GPU memory on a node without a GPU", clientproto.OpKVGet, clientproto.KVBlocksRequest{Device: 0, Keys: [][32]byte{kvKey(0)}}.Append(nil), nil, syscall.ENODEV},
		{"no buffer", clientproto.OpKVGet, kvBody(kvKey(0)), nil, syscall.EBADF},
		{"buffer too short", clientproto.OpKVGet, kvBody(kvKey(0), kvKey(1)), []int{other}, syscall.EFAULT},
		{"read-only buffer for a get", clientproto.OpKVGet, kvBody(kvKey(0)), []int{roFd(t, fd)}, syscall.EBADF},
		{"buffer not in memory", clientproto.OpKVPut, kvBody(kvKey(0)), []int{diskFile(t)}, syscall.EINVAL},
		{"a pipe", clientproto.OpKVPut, kvBody(kvKey(0)), []int{pipeFd(t)}, syscall.EINVAL},
		{"no keys", clientproto.OpKVPut, kvBody(), []int{fd}, syscall.EINVAL},
		{"contains with an fd", clientproto.OpKVContains, clientproto.AppendKVKeys(nil, [][32]byte{kvKey(0)}), []int{fd}, syscall.EBADF},
		{"stats with a body", clientproto.OpKVStats, []byte{0}, nil, syscall.EINVAL},
	} {
		r := c.req(x.op, x.body, x.fds...)
		assert.Equal(t, -int32(x.want), r.status, "%s: %s", x.name, r.msg)
	}
	big := kvBody(kvKey(0))
	le32 := func(b []byte, v uint32) { b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24) }
	le32(big[8:], clientproto.MaxKVKeys+1)
	assert.Equal(t, -int32(syscall.E2BIG), c.req(clientproto.OpKVGet, big, fd).status)

	var status struct {
		KV *struct {
			BlockSize int `json:"block_size"`
		} `json:"kv"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "", "node", "--data", data, "--json")), &status))
	require.NotNil(t, status.KV, "kylix node --json has the KV store")
	assert.Equal(t, kvBlock, status.KV.BlockSize)
	st := kvStatsCLI(t, data)
	require.True(t, st.Enabled)
	assert.Equal(t, kvBlock, st.Stats.BlockSize)
	assert.Positive(t, st.Stats.Disk.Hits)
	assert.Positive(t, st.Stats.Memory.Hits)
	m := metrics(t, "http://"+addr+"/metrics")
	assert.Equal(t, float64(st.Stats.Disk.Hits), m[`kylix_kv_hits_total{tier="disk"}`])
	assert.Equal(t, float64(st.Stats.Memory.Hits), m[`kylix_kv_hits_total{tier="memory"}`])
	assert.Equal(t, float64(st.Stats.Misses), m[`kylix_kv_misses_total`])

	// Restart: the blocks are on disk (SIGTERM writes what is queued).
	n.stop()
	p := filepath.Join(data, "kv", "00000000", fmt.Sprintf("%x.kvb", kvKey(5)))
	b, err := os.ReadFile(p)
	require.NoError(t, err, "block 5's file")
	b[100] ^= 1
	require.NoError(t, os.WriteFile(p, b, 0o600))
	_, sock = startKVNode(t, data, mnt)
	c = dialClient(t, sock)
	assert.Equal(t, []byte{2, 2, 2, 2, 2}, c.kvContains(0, 1, 2, 6, 7))
	assert.Equal(t, []byte{2, 2, 0, 2}, c.kvGet(fd, "root", 0, 1, 5, 7), "after the restart, from disk; 5's flipped byte is a miss")
	assert.Equal(t, []byte{0}, c.kvContains(5), "the damaged block is dropped")
	assert.Equal(t, int64(1), kvStatsCLI(t, data).Stats.VerifyFailures)
	// The disk tier read those blocks with O_DIRECT where the data
	// directory's file system takes it, and says how it reads.
	wantReads := "O_DIRECT"
	probe := filepath.Join(t.TempDir(), "probe") // the same file system as data
	require.NoError(t, os.WriteFile(probe, make([]byte, 4096), 0o600))
	if f, err := os.OpenFile(probe, os.O_RDONLY|syscall.O_DIRECT, 0); err != nil {
		wantReads = "buffered: O_DIRECT refused"
	} else {
		f.Close()
	}
	assert.True(t, strings.HasPrefix(kvStatsCLI(t, data).Stats.DiskReads, wantReads), kvStatsCLI(t, data).Stats.DiskReads)
	assert.Contains(t, mustKylix(t, "", "kv", "stats", "--data", data), "disk reads "+wantReads)

	// Model GC, compaction and fsck never touch the KV tier's files.
	importFiles(t, data, map[string][]byte{"model": randomBytes(3<<20, 97)})
	mustKylix(t, "", "rm", "--data", data, "m/model")
	mustKylix(t, "", "gc", "--data", data, "--compact-threshold", "0.01")
	mustKylix(t, "", "fsck", "--data", data)
	assert.NotContains(t, c.kvGet(fd, "root", 0, 1, 2, 3, 4, 6, 7), byte(clientproto.KVMiss), "KV blocks after gc --compact and fsck")
	assert.Equal(t, int64(7), kvStatsCLI(t, data).Stats.Disk.Blocks, "every block file still there")

	// kylix kv clear drops every block, memory and disk.
	assert.Contains(t, mustKylix(t, "", "kv", "clear", "--data", data), "dropped")
	assert.Equal(t, []byte{0, 0, 0}, c.kvContains(0, 1, 7))
	ents, _ := os.ReadDir(filepath.Join(data, "kv", "00000000"))
	assert.Empty(t, ents, "no block files left")
}

func roFd(t *testing.T, fd int) int {
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

func diskFile(t *testing.T) int {
	p := filepath.Join(t.TempDir(), "buf")
	require.NoError(t, os.WriteFile(p, make([]byte, kvBlock), 0o600))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

func pipeFd(t *testing.T) int {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close(); w.Close() })
	return int(r.Fd())
}

// TestKVNodeWithoutKV: a node started without --kv-mem refuses KV ops,
// saying how to have them; kylix kv stats says there is none.
func TestKVNodeWithoutKV(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, sock := startClientNode(t, data, mnt)
	c := dialClient(t, sock)
	r := c.req(clientproto.OpKVStats, nil)
	assert.Equal(t, -int32(syscall.EOPNOTSUPP), r.status)
	assert.Contains(t, r.msg, "--kv-mem")
	assert.Contains(t, mustKylix(t, "", "kv", "stats", "--data", data), "kv: none")
}

// TestKVNamespacePerUID: blocks are kept per uid. uid 65534, through the
// real socket, cannot see or read root's block under the same key, gets
// its own block back under it, and clears only its own; kylix kv clear
// --uid drops one uid's blocks. Many clients of both uids at once.
func TestKVNamespacePerUID(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "setpriv", "util-linux")
	data, mnt := dirs(t)
	_, sock := startKVNode(t, data, mnt)
	for d := filepath.Dir(sock); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // let uid 65534 reach the socket
	}
	c := dialClient(t, sock)
	fd := memBuf(t, 4)
	require.Equal(t, []int32{0, 0}, c.kvPut(fd, "root", 1, 2))

	bin := selfForOtherUser(t, t.TempDir())
	helper := func(step string) string {
		cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
			bin, "-test.run", "^TestKVHelperProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "KYLIX_KV_HELPER="+step, "KYLIX_BIN="+kylixBin, "KYLIX_HELPER_SOCK="+sock)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "helper as uid 65534 (%s):\n%s", step, out)
		return string(out)
	}
	out := helper("first")
	for _, want := range []string{"contains root's keys: [0 0]", "get root's keys: [0 0]", "own put: [0]", "own get: [1]"} {
		assert.Contains(t, out, want)
	}
	// root still reads its own block under key 1, not the other uid's.
	assert.Equal(t, []byte{1, 1}, c.kvGet(fd, "root", 1, 2))

	// Both uids at once, on the same keys: each reads only its own.
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 4 {
		wg.Go(func() {
			cc := dialClient(t, sock)
			buf := memBuf(t, 2)
			for i := range 20 {
				id := 1 + (g+i)%2
				cc.kvPut(buf, "root", id)
				cc.kvGet(buf, "root", id, 3-id)
			}
		})
	}
	wg.Go(func() {
		if out := helper("race"); !strings.Contains(out, "race ok") {
			errs <- out
		}
	})
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("helper: %s", e)
	}

	out = helper("clear")
	assert.Contains(t, out, "cleared 1")
	assert.Equal(t, []byte{1, 1}, c.kvGet(fd, "root", 1, 2), "the other uid's clear leaves root's blocks")
	helper("first")
	assert.Contains(t, mustKylix(t, "", "kv", "clear", "--data", data, "--uid", "65534"), "dropped 1 blocks of uid 65534")
	assert.Equal(t, []byte{1, 1}, c.kvContains(1, 2))
}

// TestKVHelperProcess is the client run as uid 65534 by
// TestKVNamespacePerUID (skipped otherwise).
func TestKVHelperProcess(t *testing.T) {
	step := os.Getenv("KYLIX_KV_HELPER")
	if step == "" {
		t.Skip("helper process")
	}
	c := dialClient(t, os.Getenv("KYLIX_HELPER_SOCK"))
	fd := memBuf(t, 2)
	switch step {
	case "first":
		fmt.Printf("contains root's keys: %v\n", c.kvContains(1, 2))
		fmt.Printf("get root's keys: %v\n", c.kvGet(fd, "other", 2, 2)) // checks nothing was written
		fmt.Printf("own put: %v\n", c.kvPut(fd, "other", 1))
		fmt.Printf("own get: %v\n", c.kvGet(fd, "other", 1)) // checks the bytes are this uid's
	case "race":
		for i := range 20 {
			c.kvPut(fd, "other", 1)
			c.kvGet(fd, "other", 1, 2-i%2) // 2 is never this uid's: a miss
		}
		fmt.Println("race ok")
	case "flood":
		stored := 0
		for i := range 60 {
			if c.kvPut(fd, "other", 1000+i)[0] == 0 {
				stored++
			}
		}
		fmt.Printf("flood stored %d\n", stored)
	case "clear":
		r := c.req(clientproto.OpKVClear, nil)
		require.Zero(t, r.status, r.msg)
		st, err := clientproto.ParseKVStats(r.fields)
		require.NoError(t, err)
		fmt.Printf("cleared %d\n", st.Cleared)
	}
}

// TestKVFairShareBetweenUIDs: uid 65534 putting 60 blocks as fast as it
// can, through the real socket, into a host tier of 4 blocks and a disk
// tier of 14, does not evict root's two blocks: past its fair share it
// evicts only its own (docs/design/kv.md, "Who may read whose blocks").
// With plain LRU, root's blocks were gone from memory and disk.
func TestKVFairShareBetweenUIDs(t *testing.T) {
	requireFUSE(t)
	testneeds.Command(t, "setpriv", "util-linux")
	data, mnt := dirs(t)
	_, sock := startKVNode(t, data, mnt)
	for d := filepath.Dir(sock); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // let uid 65534 reach the socket
	}
	c := dialClient(t, sock)
	fd := memBuf(t, 2)
	require.Equal(t, []int32{0, 0}, c.kvPut(fd, "root", 1, 2))
	bin := selfForOtherUser(t, t.TempDir())
	cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		bin, "-test.run", "^TestKVHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "KYLIX_KV_HELPER=flood", "KYLIX_BIN="+kylixBin, "KYLIX_HELPER_SOCK="+sock)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "helper as uid 65534:\n%s", out)
	require.Contains(t, string(out), "flood stored")
	assert.Equal(t, []byte{clientproto.KVMemory, clientproto.KVMemory}, c.kvGet(fd, "root", 1, 2), "root's blocks stay in memory")
}

// TestKVKill9DuringDiskWrites: the node is killed with SIGKILL while the
// disk writer is behind; after a restart every block is either its own
// bytes (from disk) or a miss, and no temporary file is left.
func TestKVKill9DuringDiskWrites(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n, sock := startKVNode(t, data, mnt, "--kv-mem", "4MiB", "--kv-disk", "8MiB")
	c := dialClient(t, sock)
	const blocks = 60
	fd := memBuf(t, blocks)
	ids := make([]int, blocks)
	for i := range ids {
		ids[i] = i
	}
	for _, st := range c.kvPut(fd, "root", ids...) {
		require.Zero(t, st)
	}
	n.kill9()
	_, sock = startKVNode(t, data, mnt, "--kv-mem", "4MiB", "--kv-disk", "8MiB")
	c = dialClient(t, sock)
	tiers := c.kvGet(fd, "root", ids...) // every hit checked byte for byte
	hits := 0
	for _, tr := range tiers {
		if tr != clientproto.KVMiss {
			hits++
		}
	}
	t.Logf("after kill -9 with %d blocks put: %d on disk", blocks, hits)
	ents, err := os.ReadDir(filepath.Join(data, "kv", "00000000"))
	if !errors.Is(err, os.ErrNotExist) { // killed before the first write
		require.NoError(t, err)
	}
	for _, e := range ents {
		assert.True(t, strings.HasSuffix(e.Name(), ".kvb"), "left behind: %s", e.Name())
	}
}

// TestKVFullDisk: the disk tier on a file system too small for its blocks
// (a 128 KiB tmpfs at DATA/kv): puts are still taken, kept in memory, and
// kylix kv stats says the disk is full.
func TestKVFullDisk(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	kvDir := filepath.Join(data, "kv")
	require.NoError(t, os.MkdirAll(kvDir, 0o700))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128k,mode=0700", "tmpfs", kvDir).CombinedOutput(); err != nil {
		testneeds.Missing(t, "mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", kvDir).Run() }) // after the node stops
	_, sock := startKVNode(t, data, mnt)
	c := dialClient(t, sock)
	fd := memBuf(t, 4)
	require.Equal(t, []int32{0, 0, 0, 0}, c.kvPut(fd, "root", 0, 1, 2, 3))
	var st map[string]any
	for i := 0; ; i++ { // until the writer has tried all four
		require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "", "kv", "stats", "--data", data, "--json")), &st))
		s := st["stats"].(map[string]any)
		if s["dirty"].(float64) == 0 && s["disk_writes"].(float64)+s["disk_write_errors"].(float64) >= 4 {
			break
		}
		require.Less(t, i, 2000, "the disk writer never finished: %v", s)
	}
	s := st["stats"].(map[string]any)
	assert.GreaterOrEqual(t, s["disk_write_errors"].(float64), float64(2), "a 128 KiB disk holds one 68 KiB block file: %v", s)
	assert.Contains(t, s["disk_last_error"], "no space left on device")
	assert.Contains(t, s["disk_last_error"], "file system is full")
	assert.Equal(t, []byte{1, 1, 1, 1}, c.kvGet(fd, "root", 0, 1, 2, 3), "every block served from memory")
	assert.Contains(t, mustKylix(t, "", "kv", "stats", "--data", data), "last disk error:")
}

// TestKVStubGPU: KV_PUT and KV_GET straight from and into the caller's
// GPU memory by CUDA IPC, on the stub driver (its "device memory" is a
// /dev/shm file the test reads back): blocks at the offsets asked, in any
// order, nothing written for a miss or outside the blocks; GPU put, host
// get and the reverse are the same bytes; offsets past the allocation the
// driver reports (near 2^64 too) are refused before any byte moves; a
// handle that does not open is refused.
func TestKVStubGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, sock := startStubGPUNode(t, data, mnt, "--kv-block", "64KiB", "--kv-mem", "1MiB", "--kv-disk", "1MiB")
	c := dialClient(t, sock)
	hostMemory := func() string {
		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "", "kv", "stats", "--data", data, "--json")), &st))
		return st["stats"].(map[string]any)["host_memory"].(string)
	}
	require.Equal(t, "pageable", hostMemory(), "no GPU request yet")
	gpuReq := func(a *shmAlloc, ids []int, offs []uint64) []byte {
		r := clientproto.KVBlocksRequest{Device: 0, IPCHandle: a.handle, Offsets: offs}
		for _, i := range ids {
			r.Keys = append(r.Keys, kvKey(i))
		}
		return r.Append(nil)
	}
	// Put 3 blocks from GPU memory, laid out out of order with gaps.
	src := newShmAlloc(t, 8*kvBlock)
	img := make([]byte, src.size)
	offs := []uint64{5 * kvBlock, 100, 2*kvBlock + 7}
	for j, i := range []int{0, 1, 2} {
		copy(img[offs[j]:], kvBlockOf(i, "gpu"))
	}
	require.NoError(t, os.WriteFile(src.path, img, 0o600))
	r := c.req(clientproto.OpKVPut, gpuReq(src, []int{0, 1, 2}, offs))
	require.Zero(t, r.status, r.msg)
	_, st, err := clientproto.ParseKVPut(r.fields)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 0, 0}, st)
	// The copies went by the copy engine from page-locked slots.
	require.Equal(t, "pinned for cuda:0", hostMemory())

	// Get them (and a miss) into another allocation, at other offsets.
	dst := newShmAlloc(t, 6*kvBlock)
	// Apart by at least a block: the keys of one request are written in
	// parallel, so overlapping places would leave either block's bytes.
	getOffs := []uint64{0, 3*kvBlock + 1, kvBlock + 9, 4*kvBlock + 8}
	r = c.req(clientproto.OpKVGet, gpuReq(dst, []int{2, 0, 99, 1}, getOffs))
	require.Zero(t, r.status, r.msg)
	_, tiers, err := clientproto.ParseKVTiers(r.fields)
	require.NoError(t, err)
	require.Equal(t, []byte{1, 1, 0, 1}, tiers)
	got := dst.bytes(t)
	want := make([]byte, dst.size)
	copy(want[0:], kvBlockOf(2, "gpu"))
	copy(want[3*kvBlock+1:], kvBlockOf(0, "gpu"))
	copy(want[4*kvBlock+8:], kvBlockOf(1, "gpu"))
	require.True(t, bytes.Equal(got, want), "the allocation holds exactly the blocks at their offsets, nothing for the miss")

	// GPU put, host get: the same bytes.
	fd := memBuf(t, 3)
	assert.Equal(t, []byte{1, 1, 1}, c.kvGet(fd, "gpu", 0, 1, 2))

	// Refusals, each before a byte moves.
	before := dst.bytes(t)
	for _, x := range []struct {
		name string
		offs []uint64
		want syscall.Errno
	}{
		{"past the allocation", []uint64{0, uint64(dst.size) - kvBlock + 1}, syscall.EFAULT},
		{"near 2^64", []uint64{0, ^uint64(0) - 10}, syscall.EFAULT},
		{"at the end", []uint64{uint64(dst.size), 0}, syscall.EFAULT},
	} {
		r := c.req(clientproto.OpKVGet, gpuReq(dst, []int{0, 1}, x.offs))
		assert.Equal(t, -int32(x.want), r.status, "%s: %s", x.name, r.msg)
	}
	require.True(t, bytes.Equal(dst.bytes(t), before), "a refused request wrote nothing")
	bad := *dst
	bad.handle[20] ^= 1 // another path
	r = c.req(clientproto.OpKVGet, gpuReq(&bad, []int{0}, []uint64{0}))
	assert.Equal(t, -int32(syscall.EINVAL), r.status, r.msg)
	r = c.req(clientproto.OpKVGet, clientproto.KVBlocksRequest{Device: 7, IPCHandle: dst.handle, Keys: [][32]byte{kvKey(0)}, Offsets: []uint64{0}}.Append(nil))
	assert.Equal(t, -int32(syscall.ENODEV), r.status, r.msg)
}

// TestKVCLIUsage: kylix kv's usage errors (exit 2, saying what is wrong)
// and its answer when no node runs (exit 1, naming the flag to start one).
func TestKVCLIUsage(t *testing.T) {
	data := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"kv"}, 2, "name what to do: stats or clear"},
		{[]string{"kv", "frob"}, 2, `unknown subcommand "frob"`},
		{[]string{"kv", "clear", "--uid", "-5", "--data", data}, 2, "--uid -5 is no uid"},
		{[]string{"kv", "stats", "--data", data}, 1, "--kv-mem"},
	} {
		_, errs, code := kylix(t, "", c.args...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errs)
		assert.Contains(t, errs, c.want, "%v", c.args)
	}
}

// TestKVStubGPUConcurrent: four clients put and get the same eight keys
// through GPU memory (the stub driver) at once, on a host tier of four
// slots, so blocks are evicted and their slots reused while other
// requests copy from them: every hit holds exactly its key's block (a
// function of the key), never another's.
func TestKVStubGPUConcurrent(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, sock := startStubGPUNode(t, data, mnt, "--kv-block", "64KiB", "--kv-mem", "256KiB")
	const keys, per = 8, 3
	t.Run("clients", func(t *testing.T) {
		for n := range 4 {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				t.Parallel()
				c := dialClient(t, sock)
				src, dst := newShmAlloc(t, per*kvBlock), newShmAlloc(t, per*kvBlock)
				offs := []uint64{0, kvBlock, 2 * kvBlock}
				for r := range 40 {
					ids := []int{(n + r) % keys, (n + r + 3) % keys, (n + r + 5) % keys}
					img := make([]byte, src.size)
					req := clientproto.KVBlocksRequest{Device: 0, IPCHandle: src.handle, Offsets: offs}
					for j, i := range ids {
						copy(img[offs[j]:], kvBlockOf(i, "gpu"))
						req.Keys = append(req.Keys, kvKey(i))
					}
					require.NoError(t, os.WriteFile(src.path, img, 0o600))
					rp := c.req(clientproto.OpKVPut, req.Append(nil))
					require.Zero(t, rp.status, rp.msg)

					require.NoError(t, os.WriteFile(dst.path, make([]byte, dst.size), 0o600))
					req.IPCHandle = dst.handle
					rg := c.req(clientproto.OpKVGet, req.Append(nil))
					require.Zero(t, rg.status, rg.msg)
					_, tiers, err := clientproto.ParseKVTiers(rg.fields)
					require.NoError(t, err)
					got := dst.bytes(t)
					for j, i := range ids {
						b := got[offs[j] : offs[j]+kvBlock]
						if tiers[j] == clientproto.KVMiss {
							require.True(t, bytes.Equal(b, make([]byte, kvBlock)), "a miss writes nothing")
							continue
						}
						require.True(t, bytes.Equal(b, kvBlockOf(i, "gpu")), "round %d: key %d from tier %d holds another block", r, i, tiers[j])
					}
				}
			})
		}
	})
}

// TestKVStubGPUKeepsMappings: a connection's GPU KV requests keep the
// caller's allocations mapped in the node between requests (opening an
// IPC handle per request cost more than the copies), at most eight per
// connection, the least recently used let go first, one mapping per
// allocation however many connections name it, and none once they close. The stub driver maps an allocation's /dev/shm file,
// so the node's /proc/PID/maps shows what it keeps.
func TestKVStubGPUKeepsMappings(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n, sock := startStubGPUNode(t, data, mnt, "--kv-block", "64KiB", "--kv-mem", "1MiB")
	mapped := func(a *shmAlloc) int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", n.cmd.Process.Pid))
		require.NoError(t, err)
		return strings.Count(string(b), a.path)
	}
	get := func(c *clientConn, a *shmAlloc, id int) int {
		req := clientproto.KVBlocksRequest{Device: 0, IPCHandle: a.handle, Offsets: []uint64{0}, Keys: [][32]byte{kvKey(id)}}
		r := c.req(clientproto.OpKVGet, req.Append(nil))
		require.Zero(t, r.status, r.msg)
		_, tiers, err := clientproto.ParseKVTiers(r.fields)
		require.NoError(t, err)
		return int(tiers[0])
	}
	c := dialClient(t, sock)
	src := newShmAlloc(t, kvBlock)
	require.NoError(t, os.WriteFile(src.path, kvBlockOf(1, "gpu"), 0o600))
	r := c.req(clientproto.OpKVPut, clientproto.KVBlocksRequest{Device: 0, IPCHandle: src.handle, Offsets: []uint64{0}, Keys: [][32]byte{kvKey(1)}}.Append(nil))
	require.Zero(t, r.status, r.msg)
	assert.Equal(t, 1, mapped(src), "the put's allocation stays mapped after its request")

	dst := newShmAlloc(t, kvBlock)
	for range 3 {
		require.NoError(t, os.WriteFile(dst.path, make([]byte, kvBlock), 0o600))
		assert.Equal(t, clientproto.KVMemory, get(c, dst, 1))
		got, err := os.ReadFile(dst.path)
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, kvBlockOf(1, "gpu")), "each get lands in the allocation named")
		assert.Equal(t, 1, mapped(dst), "one mapping for the allocation, however many requests")
	}
	// A new allocation has a new handle: the block lands there, not in
	// the one kept mapped.
	other := newShmAlloc(t, kvBlock)
	assert.Equal(t, clientproto.KVMemory, get(c, other, 1))
	got, err := os.ReadFile(other.path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, kvBlockOf(1, "gpu")))

	// Eight more allocations: the connection keeps eight, the least
	// recently used (src, then dst) unmapped first.
	var more []*shmAlloc
	for range 8 {
		a := newShmAlloc(t, kvBlock)
		more = append(more, a)
		get(c, a, 1)
	}
	assert.Zero(t, mapped(src), "least recently used: unmapped")
	assert.Zero(t, mapped(dst), "next least recently used: unmapped")
	for _, a := range more {
		assert.Equal(t, 1, mapped(a))
	}
	// Another connection keeps what it names too, sharing the node's one
	// mapping of an allocation both name (a handle is opened once per
	// context); closing the first lets go of what only it kept.
	c2 := dialClient(t, sock)
	assert.Equal(t, clientproto.KVMemory, get(c2, dst, 1))
	shared := more[len(more)-1]
	assert.Equal(t, clientproto.KVMemory, get(c2, shared, 1))
	assert.Equal(t, 1, mapped(shared), "one mapping for two connections")
	c.c.Close()
	waitFor(t, 10*time.Second, "the closed connection's allocations unmapped", func() bool {
		for _, a := range append(more[:len(more)-1], other) {
			if mapped(a) != 0 {
				return false
			}
		}
		return true
	})
	assert.Equal(t, 1, mapped(dst), "the open connection keeps its own")
	assert.Equal(t, 1, mapped(shared), "and the one it shared")
	c2.c.Close()
	waitFor(t, 10*time.Second, "nothing mapped once no connection is left", func() bool {
		return mapped(dst) == 0 && mapped(shared) == 0
	})
}

// TestKVBatchGetIsOneCopy: blocks put from GPU memory in one request take
// adjacent slots of the host tier in their order, so getting the batch
// back into one allocation is one copy, not one per block (the node's
// debug log counts the copies of each GPU get).
func TestKVBatchGetIsOneCopy(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	n, sock := startStubGPUNode(t, data, mnt, "--kv-block", "64KiB", "--kv-mem", "2MiB", "--log-level", "debug")
	c := dialClient(t, sock)
	const blocks = 16
	src, dst := newShmAlloc(t, blocks*kvBlock), newShmAlloc(t, blocks*kvBlock)
	img := make([]byte, src.size)
	req := clientproto.KVBlocksRequest{Device: 0, IPCHandle: src.handle}
	for i := range blocks {
		copy(img[i*kvBlock:], kvBlockOf(i, "batch"))
		req.Keys = append(req.Keys, kvKey(i))
		req.Offsets = append(req.Offsets, uint64(i*kvBlock))
	}
	require.NoError(t, os.WriteFile(src.path, img, 0o600))
	r := c.req(clientproto.OpKVPut, req.Append(nil))
	require.Zero(t, r.status, r.msg)
	req.IPCHandle = dst.handle
	r = c.req(clientproto.OpKVGet, req.Append(nil))
	require.Zero(t, r.status, r.msg)
	got, err := os.ReadFile(dst.path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, img), "the batch got back byte for byte")
	// The node's log reaches the test through a pipe: wait for the line.
	line := regexp.MustCompile(`msg="kv: get into GPU memory" blocks=16 copies=(\d+) `)
	waitFor(t, 10*time.Second, "the get's debug line", func() bool { return line.MatchString(n.log.String()) })
	assert.Equal(t, "1", line.FindStringSubmatch(n.log.String())[1], "copies for a batch put together")
}
