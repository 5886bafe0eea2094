package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
)

// gcResult is the part of `kylix gc --json` these tests read.
type gcResult struct {
	ChunksRemoved  int   `json:"chunks_removed"`
	PacksRemoved   int   `json:"packs_removed"`
	BytesFreed     int64 `json:"bytes_freed"`
	DeadBytes      int64 `json:"dead_bytes_in_live_packs"`
	PacksCompacted int   `json:"packs_compacted"`
	BytesMoved     int64 `json:"bytes_moved"`
	Retained       int   `json:"packs_retained_by_reads"`
}

type dfResult struct {
	StoredBytes int64 `json:"stored_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	DeadBytes   int64 `json:"dead_bytes"`
	LastGC      *struct {
		BytesFreed     int64 `json:"bytes_freed"`
		PacksCompacted int   `json:"packs_compacted"`
	} `json:"last_gc"`
}

func gcJSON(t *testing.T, data string, args ...string) gcResult {
	t.Helper()
	var r gcResult
	out := mustKylix(t, data, append([]string{"gc", "--data", data, "--json"}, args...)...)
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	return r
}

func dfJSON(t *testing.T, data string) dfResult {
	t.Helper()
	var r dfResult
	out := mustKylix(t, data, "df", "--data", data, "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	return r
}

// packsDU is what du says the pack files of data take.
func packsDU(t *testing.T, data string) int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(data, "packs", "*.pack"))
	require.NoError(t, err)
	var n int64
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// TestGCCompactsSharedPack: two small files imported together share a
// pack; after `kylix rm` of one, `kylix gc` gives its bytes back: df and gc
// say how many, du of packs/ drops by as much, and the other file exports
// byte for byte.
func TestGCCompactsSharedPack(t *testing.T) {
	data, src := t.TempDir(), t.TempDir()
	keep, drop := randomBytes(300<<10, 1), randomBytes(700<<10, 2)
	require.NoError(t, os.WriteFile(filepath.Join(src, "keep.bin"), keep, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "drop.bin"), drop, 0o644))
	mustKylix(t, data, "import", "--data", data, src, "m")
	mustKylix(t, data, "rm", "--data", data, "m/drop.bin")

	// Without compaction nothing comes back: the pack is shared.
	du0 := packsDU(t, data)
	r := gcJSON(t, data, "--no-compact")
	require.Positive(t, r.ChunksRemoved)
	require.Zero(t, r.PacksCompacted)
	require.Greater(t, r.DeadBytes, int64(600<<10))
	require.Equal(t, du0, packsDU(t, data))
	require.Greater(t, dfJSON(t, data).DeadBytes, int64(600<<10))

	r = gcJSON(t, data)
	require.Equal(t, 1, r.PacksCompacted, "%+v", r)
	require.Equal(t, int64(len(keep)), r.BytesMoved)
	du1 := packsDU(t, data)
	require.Equal(t, du0-du1, r.BytesFreed, "gc's bytes_freed vs du of packs/")
	require.Greater(t, du0-du1, int64(650<<10))

	df := dfJSON(t, data)
	require.NotNil(t, df.LastGC)
	require.Equal(t, r.BytesFreed, df.LastGC.BytesFreed)
	require.Equal(t, 1, df.LastGC.PacksCompacted)
	require.Equal(t, du1, df.DiskBytes)
	require.Less(t, df.DeadBytes, int64(4096))
	out := mustKylix(t, data, "df", "--data", data)
	require.Contains(t, out, "last_gc:")

	mustKylix(t, data, "verify", "--data", data)
	mustKylix(t, data, "fsck", "--data", data)
	dst := filepath.Join(t.TempDir(), "out")
	mustKylix(t, data, "export", "--data", data, "m", dst)
	got, err := os.ReadFile(filepath.Join(dst, "keep.bin"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, keep))
	_, err = os.Stat(filepath.Join(dst, "drop.bin"))
	require.True(t, os.IsNotExist(err))

	// Text output says what was freed; bad flags are refused.
	out = mustKylix(t, data, "gc", "--data", data)
	require.Contains(t, out, "freed")
	_, errs, code := kylix(t, data, "gc", "--data", data, "--compact-threshold", "1.5")
	require.Equal(t, 2, code, errs)
	_, errs, code = kylix(t, data, "gc", "--data", data, "--max-bytes", "lots")
	require.Equal(t, 2, code, errs)
}

// safetensorsFile returns a safetensors file of n U8 tensors of size bytes
// each: the store cuts it into one chunk per tensor.
func safetensorsFile(n, size int, seed uint64) []byte {
	var hdr strings.Builder
	hdr.WriteString("{")
	for i := range n {
		if i > 0 {
			hdr.WriteString(",")
		}
		fmt.Fprintf(&hdr, `"t%d":{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}`, i, size, i*size, (i+1)*size)
	}
	hdr.WriteString("}")
	h := hdr.String()
	for len(h)%8 != 0 {
		h += " "
	}
	out := make([]byte, 8, 8+len(h)+n*size)
	for i := range 8 {
		out[i] = byte(uint64(len(h)) >> (8 * i))
	}
	out = append(out, h...)
	return append(out, randomBytes(n*size, seed)...)
}

// TestGCCompactsUnderMountedReader: a file held open through the mount
// while `kylix gc` (run by the node) compacts its pack keeps reading right:
// the node's open file still names the old pack, and its reads of chunks
// not read before find them at their new place.
func TestGCCompactsUnderMountedReader(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	startNode(t, data, mnt)
	src := t.TempDir()
	// Under 1 MiB: a shared pack, served by the node (not passthrough).
	keep, drop := safetensorsFile(4, 200<<10, 3), randomBytes(700<<10, 4)
	require.NoError(t, os.WriteFile(filepath.Join(src, "keep.safetensors"), keep, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "drop.bin"), drop, 0o644))
	mustKylix(t, data, "import", "--data", data, src, "m")
	st := mustKylix(t, data, "stat", "--data", data, "--json", "m/keep.safetensors")
	require.Contains(t, st, `"chunk_count": 5`)

	f, err := os.Open(filepath.Join(mnt, "m", "keep.safetensors"))
	require.NoError(t, err)
	defer f.Close()
	// The node resolves the file's chunk locations now (the open, and
	// the xattr asking which path serves it), before the compaction;
	// nothing is read, so no chunk is in the node's cache.
	buf := make([]byte, 256)
	_, err = unix.Fgetxattr(int(f.Fd()), "user.kylix.path", buf)
	require.NoError(t, err)

	mustKylix(t, data, "rm", "--data", data, "m/drop.bin")
	du0 := packsDU(t, data)
	r := gcJSON(t, data)
	require.Equal(t, 1, r.PacksCompacted, "%+v", r)
	require.Less(t, packsDU(t, data), du0)

	for pass := 0; pass < 2; pass++ {
		// Drop the file's cached pages so the reads go to the node.
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		got := make([]byte, len(keep))
		n, err := f.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, len(keep), n)
		require.True(t, bytes.Equal(got, keep), "pass %d: bytes differ after compaction", pass)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "m", "keep.safetensors"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, keep))
	mustKylix(t, data, "verify", "--data", data)
	mustKylix(t, data, "fsck", "--data", data)
}

// TestGCKill9MidCompaction: a real `kylix gc` is killed with SIGKILL while
// it compacts (when its new pack appears, and when half of it is written);
// the store then verifies, passes fsck, holds every kept file byte for
// byte, and a second gc finishes the job.
func TestGCKill9MidCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 96 MiB store")
	}
	seed, src := t.TempDir(), t.TempDir()
	const files, size = 96, 1<<20 - 4096 // small files: one shared pack
	keep := map[string][]byte{}
	for i := range files {
		b := randomBytes(size, uint64(100+i))
		dir := "drop"
		if i%3 == 0 {
			dir = "keep"
		}
		p := filepath.Join(src, dir, fmt.Sprintf("f%03d", i))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, b, 0o644))
		if dir == "keep" {
			keep[filepath.Base(p)] = b
		}
	}
	mustKylix(t, seed, "import", "--data", seed, src, "m")
	mustKylix(t, seed, "rm", "--data", seed, "-r", "m/drop")
	live := int64(len(keep) * size)

	for _, point := range []struct {
		name string
		at   int64 // kill once the new pack holds this many bytes
	}{{"new-pack-appears", 0}, {"half-copied", live / 2}, {"copied", live}} {
		t.Run(point.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			run(t, "/", "cp", "-a", seed, data)
			before := map[string]bool{}
			names, _ := filepath.Glob(filepath.Join(data, "packs", "*.pack"))
			for _, n := range names {
				before[n] = true
			}
			cmd := exec.Command(kylixBin, "gc", "--data", data)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			killed := false
			deadline := time.Now().Add(60 * time.Second)
		poll:
			for time.Now().Before(deadline) {
				select {
				case <-exited:
					break poll
				default:
				}
				names, _ := filepath.Glob(filepath.Join(data, "packs", "*.pack"))
				for _, n := range names {
					if before[n] {
						continue
					}
					if st, err := os.Stat(n); err == nil && st.Size() >= point.at {
						cmd.Process.Signal(syscall.SIGKILL)
						killed = true
						<-exited
						break poll
					}
				}
			}
			if !killed {
				t.Skipf("gc finished before the kill point (%s): %s", point.name, out.String())
			}
			mustKylix(t, data, "verify", "--data", data)
			mustKylix(t, data, "fsck", "--data", data)
			dst := filepath.Join(t.TempDir(), "out")
			mustKylix(t, data, "export", "--data", data, "m/keep", dst)
			for name, b := range keep {
				got, err := os.ReadFile(filepath.Join(dst, name))
				require.NoError(t, err)
				require.True(t, bytes.Equal(got, b), name)
			}
			r := gcJSON(t, data)
			require.LessOrEqual(t, r.PacksCompacted, 1)
			du := packsDU(t, data)
			require.Less(t, du, live+live/10, "after the second gc the packs still take %d bytes for %d live", du, live)
			mustKylix(t, data, "verify", "--data", data)
			mustKylix(t, data, "fsck", "--data", data)
			require.False(t, strings.Contains(out.String(), "panic"), out.String())
		})
	}
}

// TestGCCompactionThenFill: a client holds a file open through the mount
// while kylix gc compacts its pack; a GPU fill (stub driver) of that fd
// afterwards places the file's bytes (the node plans on the moved chunks,
// File.Fresh, instead of calling them missing).
func TestGCCompactionThenFill(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	_, sock := startStubGPUNode(t, data, mnt)
	src := t.TempDir()
	keep, drop := safetensorsFile(4, 200<<10, 5), randomBytes(700<<10, 6)
	require.NoError(t, os.WriteFile(filepath.Join(src, "keep.safetensors"), keep, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "drop.bin"), drop, 0o644))
	mustKylix(t, data, "import", "--data", data, src, "m")
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m", "keep.safetensors"))
	a := newShmAlloc(t, 1<<20)
	r := c.req(clientproto.OpFill, fillReq(a, 0, 0, uint64(len(keep))), int(f.Fd()))
	require.Zero(t, r.status, r.msg)
	require.True(t, bytes.Equal(a.bytes(t)[:len(keep)], keep))

	mustKylix(t, data, "rm", "--data", data, "m/drop.bin")
	require.Equal(t, 1, gcJSON(t, data).PacksCompacted)
	b := newShmAlloc(t, 1<<20)
	r = c.req(clientproto.OpFill, fillReq(b, 0, 0, uint64(len(keep))), int(f.Fd()))
	require.Zero(t, r.status, "FILL after gc: %s", r.msg)
	require.True(t, bytes.Equal(b.bytes(t)[:len(keep)], keep))
}

// TestGCCompactionUnderPreload: the LD_PRELOAD shim reads a small file from
// its shared pack; after kylix gc compacts that pack, the shim reads it
// from the new pack (bypassing FUSE again), byte for byte.
func TestGCCompactionUnderPreload(t *testing.T) {
	requireFUSE(t)
	lib, _ := preloadLib(t)
	data, mnt := dirs(t)
	src := t.TempDir()
	keep, drop := randomBytes(300<<10, 7), randomBytes(700<<10, 8)
	require.NoError(t, os.WriteFile(filepath.Join(src, "keep.bin"), keep, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "drop.bin"), drop, 0o644))
	mustKylix(t, "/", "import", "--data", data, src, "m")
	before := extentsOf(t, data, "m/keep.bin")
	startClientNode(t, data, mnt)
	out, st := shimRun(t, lib, nil, "cat", filepath.Join(mnt, "m/keep.bin"))
	require.True(t, bytes.Equal(out, keep))
	require.Equal(t, uint64(len(keep)), st.Bypassed, "%+v", st)

	mustKylix(t, "/", "rm", "--data", data, "m/drop.bin")
	require.Equal(t, 1, gcJSON(t, data).PacksCompacted)
	after := extentsOf(t, data, "m/keep.bin")
	require.NotEqual(t, before[0].Pack, after[0].Pack)
	out, st = shimRun(t, lib, nil, "cat", filepath.Join(mnt, "m/keep.bin"))
	require.True(t, bytes.Equal(out, keep))
	require.Equal(t, uint64(len(keep)), st.Bypassed, "after gc: %+v", st)
}
