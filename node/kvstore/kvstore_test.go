package kvstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/internal/testneeds"
)

const bs = 64 << 10

func key(ns uint32, i int) Key {
	k := Key{NS: ns}
	copy(k.ID[:], fmt.Sprintf("key-%d", i))
	return k
}

// block is key k's content: every test checks a hit against it.
func block(k Key) []byte {
	b := make([]byte, bs)
	for i := range b {
		b[i] = byte(int(k.ID[4]) + int(k.ID[5])*7 + int(k.NS)*13 + i*31 + i>>8)
	}
	return b
}

func open(t *testing.T, dir string, memBlocks, diskBlocks int64) *Store {
	t.Helper()
	s, err := Open(Options{BlockSize: bs, MemBudget: memBlocks * bs, DiskBudget: diskBlocks * diskSize(bs), Dir: dir})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, s *Store, k Key) Tier {
	t.Helper()
	var got []byte
	tier, err := s.Get(k, func(b []byte) error { got = bytes.Clone(b); return nil })
	require.NoError(t, err)
	if tier != Miss {
		require.True(t, bytes.Equal(got, block(k)), "block of %x from %v is not the block put", k.ID[:6], tier)
	}
	return tier
}

func put(t *testing.T, s *Store, k Key) {
	t.Helper()
	require.NoError(t, s.Put(k, block(k)))
	s.Flush()
}

func TestMemoryRoundTripAndLRU(t *testing.T) {
	s := open(t, "", 3, 0)
	for i := range 3 {
		put(t, s, key(1, i))
	}
	assert.Equal(t, Memory, get(t, s, key(1, 0))) // 0 is now the most recently used
	put(t, s, key(1, 3))                          // evicts 1, the least recently used
	assert.Equal(t, Miss, s.Contains(key(1, 1)))
	for _, i := range []int{0, 2, 3} {
		assert.Equal(t, Memory, get(t, s, key(1, i)), "key %d", i)
	}
	assert.Equal(t, Miss, get(t, s, key(1, 1)))
	assert.Equal(t, Miss, get(t, s, key(2, 0)), "another namespace's key is another key")
	err := s.Put(key(1, 9), make([]byte, bs-1))
	assert.ErrorIs(t, err, ErrSize)
	st := s.Stats()
	assert.Equal(t, int64(3), st.Memory.Blocks)
	assert.Equal(t, int64(1), st.Memory.Evictions)
	assert.Equal(t, int64(4), st.Memory.Hits)
	assert.Equal(t, int64(2), st.Misses)
	assert.Equal(t, "pageable", st.HostMemory)
	var n int64
	for _, c := range st.Memory.GetLatency.Counts {
		n += c
	}
	assert.Equal(t, st.Memory.Hits, n, "one latency per memory hit")
	assert.Positive(t, st.Memory.GetLatency.Seconds)
}

func TestDiskRoundTripEvictionAndRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1, 3)
	for i := range 3 {
		put(t, s, key(1, i))
	}
	st := s.Stats()
	assert.Equal(t, int64(3), st.Disk.Blocks)
	assert.Equal(t, int64(1), st.Memory.Blocks)
	assert.Equal(t, Disk, s.Contains(key(1, 0)))
	assert.Equal(t, Disk, get(t, s, key(1, 0)), "verified read from the disk tier")
	assert.Equal(t, Memory, s.Contains(key(1, 0)), "a disk hit is kept in memory")
	put(t, s, key(1, 3)) // the disk tier evicts 1: 0 was read since
	assert.Equal(t, Miss, s.Contains(key(1, 1)))
	for _, i := range []int{0, 2, 3} {
		assert.NotEqual(t, Miss, get(t, s, key(1, i)), "key %d", i)
	}
	_, err := os.Stat(s.path(key(1, 1)))
	assert.ErrorIs(t, err, os.ErrNotExist, "an evicted block's file is removed")

	// Restart: the disk index is rebuilt from the files.
	s.Close()
	s2 := open(t, dir, 1, 3)
	assert.Equal(t, int64(3), s2.Stats().Disk.Blocks)
	for _, i := range []int{0, 2, 3} {
		assert.Equal(t, Disk, get(t, s2, key(1, i)), "key %d after restart", i)
	}
	assert.Equal(t, Miss, get(t, s2, key(1, 1)))

	// A smaller budget at the next start keeps the most recent blocks.
	s2.Close()
	s3 := open(t, dir, 1, 1)
	assert.Equal(t, int64(1), s3.Stats().Disk.Blocks)
}

// TestDamagedBlocksAreMisses: a flipped byte in a block's bytes or in its
// trailer, a torn (short) file, a file renamed to another key: each is a
// miss and is dropped, never wrong bytes.
func TestDamagedBlocksAreMisses(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1, 8)
	for i := range 6 {
		put(t, s, key(1, i))
	}
	s.Close()
	flip := func(i int, off int64) {
		p := s.path(key(1, i))
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		b := make([]byte, 1)
		_, err = f.ReadAt(b, off)
		require.NoError(t, err)
		b[0] ^= 0x20
		_, err = f.WriteAt(b, off)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	flip(0, 12345)                                           // the block's bytes
	flip(1, bs+56+3)                                         // the BLAKE3 in the trailer
	flip(2, bs+24)                                           // the key in the trailer
	require.NoError(t, os.Truncate(s.path(key(1, 3)), bs/2)) // torn write
	require.NoError(t, os.Rename(s.path(key(1, 4)), s.path(key(1, 9))))
	tmp := filepath.Join(dir, "00000001", tmpPrefix+"123")
	require.NoError(t, os.WriteFile(tmp, block(key(1, 7)), 0o600))

	s2 := open(t, dir, 1, 8)
	_, err := os.Stat(tmp)
	assert.ErrorIs(t, err, os.ErrNotExist, "a write cut short is removed at start")
	for _, i := range []int{0, 1, 2, 3, 4, 9} {
		var got []byte
		tier, err := s2.Get(key(1, i), func(b []byte) error { got = b; return nil })
		require.NoError(t, err)
		assert.Equal(t, Miss, tier, "damaged block %d", i)
		assert.Nil(t, got)
		assert.Equal(t, Miss, s2.Contains(key(1, i)), "damaged block %d is dropped", i)
		_, err = os.Stat(s2.path(key(1, i)))
		assert.ErrorIs(t, err, os.ErrNotExist, "damaged block %d's file is removed", i)
	}
	assert.Equal(t, Disk, get(t, s2, key(1, 5)), "an intact block beside them")
	assert.Equal(t, int64(4), s2.Stats().VerifyFailures) // 0, 1, 2, 9 (3 was removed at start, 4 is gone)
}

// TestPutRefusedWhenNothingCanBeEvicted: with the disk writer stuck, the
// host tier fills with blocks that may not be evicted; the next put is
// refused at once (ErrFull), and taken once the writes are done.
func TestPutRefusedWhenNothingCanBeEvicted(t *testing.T) {
	s := open(t, t.TempDir(), 2, 8)
	release := make(chan struct{})
	s.mu.Lock()
	w := s.write
	s.write = func(p string, d, tr []byte) error { <-release; return w(p, d, tr) }
	s.mu.Unlock()
	require.NoError(t, s.Put(key(1, 0), block(key(1, 0))))
	require.NoError(t, s.Put(key(1, 1), block(key(1, 1))))
	start := time.Now()
	err := s.Put(key(1, 2), block(key(1, 2)))
	assert.ErrorIs(t, err, ErrFull)
	assert.Less(t, time.Since(start), time.Second, "a refused put does not wait")
	assert.Equal(t, int64(1), s.Stats().Refused)
	assert.Equal(t, int64(2), s.Stats().Dirty)
	close(release)
	s.Flush()
	require.NoError(t, s.Put(key(1, 2), block(key(1, 2))))
	s.Flush()
	for i := range 3 {
		assert.NotEqual(t, Miss, get(t, s, key(1, i)))
	}
}

// TestDiskWriteFailureKeepsMemoryOnly: a disk that refuses writes
// (ENOSPC, injected) leaves the block in memory only, with the reason in
// the stats; nothing half-written is left for a restart to find.
func TestDiskWriteFailureKeepsMemoryOnly(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 4, 8)
	s.mu.Lock()
	s.write = func(p string, d, tr []byte) error {
		return fmt.Errorf("write %s: %w", p, syscall.ENOSPC)
	}
	s.mu.Unlock()
	put(t, s, key(1, 0))
	st := s.Stats()
	assert.Equal(t, int64(1), st.DiskWriteErrors)
	assert.Equal(t, int64(1), st.MemoryOnly)
	assert.Contains(t, st.DiskLastError, "file system is full")
	assert.Equal(t, int64(0), st.Disk.Blocks)
	assert.Equal(t, int64(0), st.Dirty)
	assert.Equal(t, Memory, get(t, s, key(1, 0)))
	s.Close()
	s2 := open(t, dir, 4, 8)
	assert.Equal(t, Miss, get(t, s2, key(1, 0)))
}

// TestFullTmpfs: the disk tier on a real file system too small for a
// block file (a 64 KiB tmpfs, root only): the write fails with ENOSPC, the
// temporary file is removed, the block stays in memory only.
func TestFullTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		testneeds.Missing(t, "mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		testneeds.Missing(t, "mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	s := open(t, dir, 4, 8)
	put(t, s, key(1, 0))
	st := s.Stats()
	assert.Equal(t, int64(1), st.DiskWriteErrors, "%+v", st)
	assert.Contains(t, st.DiskLastError, "no space left")
	assert.Equal(t, Memory, get(t, s, key(1, 0)))
	ents, err := os.ReadDir(filepath.Join(dir, "00000001"))
	require.NoError(t, err)
	assert.Empty(t, ents, "no temporary file left")
}

func TestClearNamespace(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 2, 8)
	for i := range 3 {
		put(t, s, key(1, i))
		put(t, s, key(2, i))
	}
	assert.Equal(t, 3, s.Clear(1, false))
	for i := range 3 {
		assert.Equal(t, Miss, s.Contains(key(1, i)))
		assert.NotEqual(t, Miss, get(t, s, key(2, i)))
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "00000001"))
	assert.Empty(t, ents)
	mem, disk := s.NSStats(2)
	assert.Equal(t, int64(3), disk)
	assert.LessOrEqual(t, mem, int64(2))
	assert.Equal(t, 3, s.Clear(0, true))
	assert.Equal(t, int64(0), s.Stats().Disk.Blocks)
}

// TestConcurrentSameKeys: many goroutines put and get the same few keys
// through both tiers (run under -race by make test): every hit is the
// key's block, refusals are ErrFull only, and the counts add up.
func TestConcurrentSameKeys(t *testing.T) {
	s := open(t, t.TempDir(), 4, 6)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for g := range 8 {
		wg.Go(func() {
			for i := range 150 {
				k := key(uint32(g%2), (g*7+i)%12)
				if i%3 == 0 {
					if err := s.Put(k, block(k)); err != nil && !errors.Is(err, ErrFull) {
						mu.Lock()
						failures = append(failures, err.Error())
						mu.Unlock()
					}
					continue
				}
				_, err := s.Get(k, func(b []byte) error {
					if !bytes.Equal(b, block(k)) {
						return fmt.Errorf("wrong bytes for key %x", k.ID[:6])
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
				if i%10 == 0 {
					s.Contains(k)
					s.Stats()
				}
				if g == 0 && i == 75 {
					s.Clear(1, false)
				}
			}
		})
	}
	wg.Wait()
	s.Flush()
	assert.Empty(t, failures)
	st := s.Stats()
	assert.LessOrEqual(t, st.Memory.Bytes, st.Memory.Budget)
	assert.LessOrEqual(t, st.Disk.Bytes, st.Disk.Budget)
	assert.Equal(t, int64(8*100), st.Memory.Hits+st.Disk.Hits+st.Misses)
	assert.Equal(t, int64(0), st.VerifyFailures)
	t.Logf("%+v", st) // disk hits depend on the scheduling: usually a third of the gets
}

// TestDiskReadsBypassThePageCache: a block got from the disk tier is read
// with O_DIRECT (it goes into the host tier; a copy in the page cache
// would only push out others' data): after its file's pages are dropped,
// a disk hit leaves none of them cached. Stats say how the tier reads.
func TestDiskReadsBypassThePageCache(t *testing.T) {
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	require.NoError(t, os.WriteFile(probe, make([]byte, pageSize), 0o600))
	if f, err := os.OpenFile(probe, os.O_RDONLY|syscall.O_DIRECT, 0); err != nil {
		testneeds.Missing(t, "the file system of %s refuses O_DIRECT: %v", dir, err)
	} else {
		f.Close()
	}
	s := open(t, dir, 1, 4)
	a, b := key(1, 0), key(1, 1)
	put(t, s, a)
	put(t, s, b) // a is on disk only now
	require.Equal(t, Disk, s.Contains(a))
	path := s.path(a)
	cached := func() int {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, f.Sync())
		fi, err := f.Stat()
		require.NoError(t, err)
		m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
		require.NoError(t, err)
		defer unix.Munmap(m)
		vec := make([]byte, (len(m)+pageSize-1)/pageSize)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(len(m)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
		require.Zero(t, errno, "mincore")
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	drop := func() {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, f.Sync())
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	}
	drop()
	require.Zero(t, cached(), "the block file's pages were dropped")
	assert.Equal(t, Disk, get(t, s, a))
	assert.Zero(t, cached(), "a disk hit cached none of the file's pages")
	assert.Equal(t, DiskReadsDirect, s.Stats().DiskReads)
}

// TestDiskReadsBufferedWhereRefused: where the file system refuses
// O_DIRECT the tier reads through the page cache from then on, and its
// stats say so and why; the blocks are still there.
func TestDiskReadsBufferedWhereRefused(t *testing.T) {
	s := open(t, t.TempDir(), 1, 4)
	directTries := 0
	s.read = func(path string, k Key, data []byte, direct bool) (chunkstore.ID, error) {
		if direct {
			directTries++
			return chunkstore.ID{}, fmt.Errorf("%w: opening %s: %w", errDirectRefused, path, syscall.EINVAL)
		}
		return readBlockFile(path, k, data, false)
	}
	keys := []Key{key(1, 0), key(1, 1), key(1, 2)}
	for _, k := range keys {
		put(t, s, k)
	}
	assert.Equal(t, Disk, get(t, s, keys[0]))
	assert.Equal(t, Disk, get(t, s, keys[1]))
	assert.Equal(t, 1, directTries, "one refusal turns the tier buffered")
	st := s.Stats()
	assert.True(t, strings.HasPrefix(st.DiskReads, DiskReadsBuffered+": O_DIRECT refused"), st.DiskReads)

	// A block size O_DIRECT cannot read is buffered from the start.
	odd, err := Open(Options{BlockSize: 1000, MemBudget: 1000, DiskBudget: 4 * diskSize(1000), Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(odd.Close)
	assert.Contains(t, odd.Stats().DiskReads, "not a multiple of 4096")
	mem, err := Open(Options{BlockSize: bs, MemBudget: bs})
	require.NoError(t, err)
	t.Cleanup(mem.Close)
	assert.Empty(t, mem.Stats().DiskReads, "no disk tier: nothing to say")
}
