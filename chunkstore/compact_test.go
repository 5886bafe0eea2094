package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/chunkstore/storeio/storeiotest"
)

// Small files share one pack; "drop" is removed, "keep" stays.
var (
	keepSizes = map[string]int{"k1": 200 << 10, "k2": 5000, "sub/k3": 70000}
	dropSizes = map[string]int{"d1": 600 << 10, "d2": 300 << 10}
)

// compactFixture imports keep/ and drop/ as one tree (so their chunks share
// a pack), then removes tree/drop. It returns the data directory and the
// contents of keep.
func compactFixture(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	src := t.TempDir()
	keep := writeTree(t, filepath.Join(src, "keep"), keepSizes, 31)
	writeTree(t, filepath.Join(src, "drop"), dropSizes, 32)
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, IO: "pread"})
	require.NoError(t, err)
	_, err = s.Import(context.Background(), src, "tree", ImportOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("tree/drop", true) }))
	require.NoError(t, s.Close())
	return dir, keep
}

// packsDU is the disk space the pack files of dir take (blocks, as du).
func packsDU(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "packs"))
	require.NoError(t, err)
	var n int64
	for _, e := range ents {
		if _, ok := parsePackName(e.Name()); !ok {
			continue
		}
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(filepath.Join(dir, "packs", e.Name()), &st))
		n += st.Blocks * 512
	}
	return n
}

// checkStore reopens dir and asserts verify and fsck are clean and
// tree/keep exports byte-equal.
func checkStore(t *testing.T, dir string, keep map[string][]byte) {
	t.Helper()
	s, err := Open(Options{Dir: dir, IO: "pread"})
	require.NoError(t, err, "reopen")
	defer s.Close()
	ctx := context.Background()
	rep, err := s.Verify(ctx, "", nil)
	require.NoError(t, err)
	require.True(t, rep.OK(), "verify: %+v", rep)
	fr, err := s.Fsck(ctx)
	require.NoError(t, err)
	require.True(t, fr.OK(), "fsck: %+v", fr)
	sameFiles(t, "keep", exported(t, s, "tree/keep"), keep)
	_, err = s.Lookup("tree/drop")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestCompactMovesLiveChunksAndFreesSpace(t *testing.T) {
	dir, keep := compactFixture(t)
	s := openTest(t, dir)
	ctx := context.Background()

	// Plain GC removes the dead chunks but no pack: they share it.
	du0 := packsDU(t, dir)
	res, err := s.GC(ctx)
	require.NoError(t, err)
	require.Positive(t, res.ChunksRemoved)
	require.Zero(t, res.PacksRemoved)
	require.Greater(t, res.DeadBytes, int64(800<<10))
	require.Equal(t, du0, packsDU(t, dir), "plain gc freed disk space it cannot free")

	f, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	oldPack := f.Extents()[0].Pack

	res, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted, "%+v", res)
	require.Equal(t, 1, res.PacksWritten)
	var live int64
	for _, n := range keepSizes {
		live += int64(n)
	}
	require.Equal(t, live, res.BytesMoved)
	require.Less(t, res.DeadBytes, int64(4096))
	du1 := packsDU(t, dir)
	// Measured: the pack now holds the live bytes and no more.
	require.Equal(t, du0-du1, res.BytesFreed, "reported vs measured")
	require.GreaterOrEqual(t, du0-du1, int64(900<<10)-4096*4)
	require.LessOrEqual(t, du1, alignUp(live)+4096)
	_, err = os.Stat(s.PackPath(oldPack))
	require.True(t, os.IsNotExist(err), "old pack still there: %v", err)

	// A File opened before the compaction still reads: its chunks are
	// found at their new place.
	got := make([]byte, f.Size())
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, keep["k1"]))
	f2, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	require.NotEqual(t, oldPack, f2.Extents()[0].Pack)
	// A plan on the old File reports the moved chunks as not local (its
	// packs must match its Extents); Fresh opens it again for planners.
	p, err := f.Plan(0, f.Size())
	require.NoError(t, err)
	require.NotEmpty(t, p.Missing())
	p.Release()
	ff, err := f.Fresh()
	require.NoError(t, err)
	require.NotSame(t, f, ff)
	p, err = ff.Plan(0, ff.Size())
	require.NoError(t, err)
	require.Empty(t, p.Missing())
	p.Release()
	same, err := f2.Fresh()
	require.NoError(t, err)
	require.Same(t, f2, same)

	// Nothing more to do the second time.
	res, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Zero(t, res.PacksCompacted)
	require.NoError(t, s.Close())
	checkStore(t, dir, keep)
}

func TestCompactThresholdAndMaxBytes(t *testing.T) {
	dir, _ := compactFixture(t)
	s := openTest(t, dir)
	ctx := context.Background()
	// The pack is ~80% dead: a threshold of 0.9 leaves it.
	res, err := s.Collect(ctx, GCOptions{Compact: true, CompactThreshold: 0.9})
	require.NoError(t, err)
	require.Zero(t, res.PacksCompacted)
	require.Positive(t, res.DeadBytes)
	// A bound below its live bytes defers it.
	res, err = s.Collect(ctx, GCOptions{Compact: true, MaxBytes: 100 << 10})
	require.NoError(t, err)
	require.Zero(t, res.PacksCompacted)
	require.Equal(t, 1, res.Deferred)
	var calls int
	res, err = s.Collect(ctx, GCOptions{Compact: true, MaxBytes: 1 << 20, Progress: func(done, total int64) {
		calls++
		require.LessOrEqual(t, done, total)
	}})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted)
	require.Positive(t, calls)
}

// dumpIndex returns every record of the index in dir, by bucket.
func dumpIndex(t *testing.T, dir string) map[string]map[string]string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "index.db"), 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	out := map[string]map[string]string{}
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketChunks, bucketPacks, bucketObjects, bucketHeads, bucketIntents} {
			m := map[string]string{}
			if err := tx.Bucket(b).ForEach(func(k, v []byte) error {
				m[string(k)] = string(v)
				return nil
			}); err != nil {
				return err
			}
			out[string(b)] = m
		}
		return nil
	}))
	return out
}

// TestCompactRebuildIndexMatches: an index rebuilt from the metadata log
// after compaction equals the index.
func TestCompactRebuildIndexMatches(t *testing.T) {
	dir, keep := compactFixture(t)
	s, err := Open(Options{Dir: dir, IO: "pread"})
	require.NoError(t, err)
	res, err := s.Collect(context.Background(), GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted)
	require.NoError(t, s.Close())
	want := dumpIndex(t, dir)
	rep, err := RebuildIndex(context.Background(), Options{Dir: dir})
	require.NoError(t, err)
	require.Empty(t, rep.Dropped)
	require.Empty(t, rep.Unreferenced)
	require.Equal(t, want, dumpIndex(t, dir))
	checkStore(t, dir, keep)
}

// TestCompactRelocationReplays: the relocation frame itself (not a
// snapshot) rebuilds the index: the log is read before GC rewrites it.
func TestCompactRelocationReplays(t *testing.T) {
	dir, keep := compactFixture(t)
	s, err := Open(Options{Dir: dir, IO: "pread"})
	require.NoError(t, err)
	var saved []byte
	testHookCompact = func(step string) {
		if step == "retired" && saved == nil {
			// The log as it is right after the relocation commit.
			saved, err = os.ReadFile(s.mlog.path())
			require.NoError(t, err)
		}
	}
	defer func() { testHookCompact = nil }()
	_, err = s.Collect(context.Background(), GCOptions{Compact: true})
	require.NoError(t, err)
	require.NotNil(t, saved)
	require.NoError(t, s.Close())
	want := dumpIndex(t, dir)
	// Replace the compacted log by the one holding the relocation frame.
	gens, err := scanLogs(vfs.Default, filepath.Join(dir, "packs"))
	require.NoError(t, err)
	require.Len(t, gens, 1)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "packs", logName(gens[0])), saved, 0o600))
	seen := false
	require.NoError(t, func() error {
		_, _, err := readFrames(vfs.Default, filepath.Join(dir, "packs", logName(gens[0])), 0, func(p []byte, _ int64) error {
			return decodeRecords(p, func(r record) error {
				seen = seen || r.kind == recRelocate
				return nil
			})
		})
		return err
	}())
	require.True(t, seen, "no relocation record in the log")
	rep, err := RebuildIndex(context.Background(), Options{Dir: dir})
	require.NoError(t, err)
	require.Empty(t, rep.Dropped)
	got := dumpIndex(t, dir)
	// The compacted pack's removal intent was cleared by a later frame
	// (recAbandon) not in the saved log: it may remain as an intent.
	delete(got, string(bucketIntents))
	delete(want, string(bucketIntents))
	require.Equal(t, want, got)
	checkStore(t, dir, keep)
}

// TestCompactCrashAtEachStep: a simulated kill -9 at each file operation of
// a compacting GC, and at each of its steps, leaves a store that opens,
// verifies, passes fsck and holds every kept file byte for byte.
func TestCompactCrashAtEachStep(t *testing.T) {
	dir, keep := compactFixture(t)
	fx := &fixture{dir: dir}
	in := vfs.NewInjector(nil, nil)
	s, err := Open(Options{Dir: fx.clone(t), IO: "pread", FS: in})
	require.NoError(t, err)
	in.Arm(nil)
	res, err := s.Collect(context.Background(), GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted)
	counts := opCounts{}
	for op := vfs.OpCreate; op <= vfs.OpClose; op++ {
		counts[op] = in.Count(op)
	}
	s.Close()
	runs := 0
	for _, op := range []vfs.Op{vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpTruncate, vfs.OpRename, vfs.OpRemove} {
		for i := 1; i <= counts.Count(op); i++ {
			for _, short := range []bool{false, true} {
				if short && op != vfs.OpWrite {
					continue
				}
				runs++
				t.Run(fmt.Sprintf("%s-%d-short=%v", op, i, short), func(t *testing.T) {
					d := fx.clone(t)
					inj := vfs.NewInjector(nil, nil)
					s, err := Open(Options{Dir: d, IO: "pread", FS: inj})
					require.NoError(t, err)
					inj.Arm(&vfs.Fault{Op: op, N: i, Short: short, Crash: true})
					_, _ = s.Collect(context.Background(), GCOptions{Compact: true})
					require.True(t, inj.Fired(), "the fault never fired")
					s.Close()
					checkStore(t, d, keep)
				})
			}
		}
	}
	require.Greater(t, runs, 10)
	// Killed after the k-th commit's log frame is synced, before its index
	// transaction (1: the removal of dead chunks, 2: the relocation, 3:
	// clearing the old pack's removal intent): the next open applies it.
	for k := 1; k <= 3; k++ {
		t.Run(fmt.Sprintf("before-index-%d", k), func(t *testing.T) {
			d := fx.clone(t)
			s, err := Open(Options{Dir: d, IO: "pread"})
			require.NoError(t, err)
			crash := errors.New("killed")
			calls := 0
			s.testHookBeforeIndex = func() error {
				calls++
				if calls >= k {
					return crash
				}
				return nil
			}
			_, err = s.Collect(context.Background(), GCOptions{Compact: true})
			s.testHookBeforeIndex = nil
			require.ErrorIs(t, err, crash)
			require.Equal(t, k, calls)
			s.Close()
			checkStore(t, d, keep)
		})
	}
}

// TestCompactDuringReadInFlight: a read of the pack being compacted is in
// flight; it returns the right bytes, the old pack stays until it ends and
// goes then.
func TestCompactDuringReadInFlight(t *testing.T) {
	dir, keep := compactFixture(t)
	s := openTest(t, dir)
	ctx := context.Background()
	f, _, err := s.OpenPath("tree/keep/k1")
	require.NoError(t, err)
	old := f.Extents()[0].PackPath
	fr := storeiotest.Wrap(s.io)
	entered, proceed := make(chan struct{}), make(chan struct{})
	first := true
	fr.Before = func([]*storeio.Request) {
		if first {
			first = false
			close(entered)
			<-proceed
		}
	}
	s.io = fr
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	got := make([]byte, f.Size())
	go func() {
		n, err := f.ReadAt(got, 0)
		done <- result{n, err}
	}()
	<-entered
	res, err := s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted)
	require.Equal(t, 1, res.Retained)
	_, err = os.Stat(old)
	require.NoError(t, err, "compaction deleted a pack a read still uses")
	close(proceed)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Equal(t, len(got), r.n)
		require.True(t, bytes.Equal(got, keep["k1"]))
	case <-time.After(10 * time.Second):
		t.Fatal("read did not finish")
	}
	_, err = os.Stat(old)
	require.True(t, os.IsNotExist(err), "old pack still there after its last read: %v", err)
	// Every kept file still reads, through Files opened before and after.
	for name, want := range keep {
		g, _, err := s.OpenPath("tree/keep/" + name)
		require.NoError(t, err)
		b := make([]byte, g.Size())
		_, err = g.ReadAt(b, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(b, want), name)
	}
	require.NoError(t, s.Close())
	// The intent of the old pack is cleared at the next open.
	checkStore(t, dir, keep)
}

// TestCompactLeavesCorruptChunk: a live chunk that does not verify is never
// copied: its pack is left as it is and reported.
func TestCompactLeavesCorruptChunk(t *testing.T) {
	dir, _ := compactFixture(t)
	s := openTest(t, dir)
	f, _, err := s.OpenPath("tree/keep/k2")
	require.NoError(t, err)
	ex := f.Extents()[0]
	corruptOneByte(t, f)
	packs := packFiles(t, dir)
	res, err := s.Collect(context.Background(), GCOptions{Compact: true})
	require.NoError(t, err)
	require.Zero(t, res.PacksCompacted)
	require.Len(t, res.Skipped, 1)
	require.Contains(t, res.Skipped[0], ex.PackPath)
	// Nothing was written or removed.
	names := func(m map[string]string) []string {
		var out []string
		for k := range m {
			if _, ok := parsePackName(k); ok {
				out = append(out, k)
			}
		}
		sort.Strings(out)
		return out
	}
	require.Equal(t, names(packs), names(packFiles(t, dir)))
	fr, err := s.Fsck(context.Background())
	require.NoError(t, err)
	require.True(t, fr.OK(), "%+v", fr)
}

// stFile returns a safetensors file whose U8 tensors hold the given bytes:
// the store cuts it into one chunk per tensor.
func stFile(tensors [][]byte) []byte {
	hdr := "{"
	off := 0
	for i, b := range tensors {
		if i > 0 {
			hdr += ","
		}
		hdr += fmt.Sprintf(`"t%03d":{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}`, i, len(b), off, off+len(b))
		off += len(b)
	}
	hdr += "}"
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	out := make([]byte, 8, 8+len(hdr)+off)
	for i := range 8 {
		out[i] = byte(uint64(len(hdr)) >> (8 * i))
	}
	out = append(out, hdr...)
	for _, b := range tensors {
		out = append(out, b...)
	}
	return out
}

// TestCompactKeepsWholeFilePacks: a large file stored whole in its own pack
// with a duplicate chunk in place (its index location is another pack) has
// bytes that look dead; compaction leaves the pack whole, so FUSE
// passthrough still serves the file from it.
func TestCompactKeepsWholeFilePacks(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 1))
	var tensors [][]byte
	for range 20 {
		tensors = append(tensors, randBytes(r, 200<<10))
	}
	src1, src2 := t.TempDir(), t.TempDir()
	// c is tensor 5's bytes alone: one chunk with the same id.
	require.NoError(t, os.WriteFile(filepath.Join(src1, "c"), tensors[5], 0o644))
	big := stFile(tensors)
	require.NoError(t, os.WriteFile(filepath.Join(src2, "b.safetensors"), big, 0o644))
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	_, err := s.Import(ctx, src1, "c", ImportOptions{})
	require.NoError(t, err)
	_, err = s.Import(ctx, src2, "b", ImportOptions{})
	require.NoError(t, err)
	f, _, err := s.OpenPath("b/b.safetensors")
	require.NoError(t, err)
	pack, _, ok := f.PassthroughCandidate()
	require.True(t, ok, "the file is not stored whole")
	res, err := s.Collect(ctx, GCOptions{Compact: true, CompactThreshold: 0.01})
	require.NoError(t, err)
	require.Equal(t, 1, res.WholeFileKept, "%+v", res)
	require.Zero(t, res.PacksCompacted)
	f, _, err = s.OpenPath("b/b.safetensors")
	require.NoError(t, err)
	p2, _, ok := f.PassthroughCandidate()
	require.True(t, ok)
	require.Equal(t, pack, p2)
	chk, err := s.VerifyPack(ctx, f)
	require.NoError(t, err)
	require.True(t, chk.OK())

	// Once the file is gone its pack holds nothing live (c's chunk is
	// indexed in c's own pack) and goes whole.
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("b", true) }))
	res, err = s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksRemoved, "%+v", res)
	_, err = os.Stat(s.PackPath(pack))
	require.True(t, os.IsNotExist(err))
	sameFiles(t, "c", exported(t, s, "c"), map[string][]byte{"c": tensors[5]})
}

// TestCompactKeepsRegionsAligned: each small file's region in the new pack
// starts 4 KiB-aligned, as import lays them out, and that padding does not
// make the compacted pack a victim again.
func TestCompactKeepsRegionsAligned(t *testing.T) {
	src := t.TempDir()
	sizes := map[string]int{}
	for i := range 40 {
		sizes[fmt.Sprintf("d%d/f%02d", i%2, i)] = 300 + i
	}
	files := writeTree(t, src, sizes, 51)
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	_, err := s.Import(ctx, src, "m", ImportOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx *NSTx) error { return tx.Remove("m/d1", true) }))
	res, err := s.Collect(ctx, GCOptions{Compact: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.PacksCompacted, "%+v", res)
	for name, want := range files {
		if name[:2] != "d0" {
			continue
		}
		f, _, err := s.OpenPath("m/" + name)
		require.NoError(t, err)
		ex := f.Extents()
		require.Len(t, ex, 1)
		require.Zero(t, ex[0].PackOff%4096, "%s at %d", name, ex[0].PackOff)
		got := make([]byte, f.Size())
		_, err = f.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, want), name)
	}
	res, err = s.Collect(ctx, GCOptions{Compact: true, CompactThreshold: 0.01})
	require.NoError(t, err)
	require.Zero(t, res.PacksCompacted, "a compacted pack compacted again: %+v", res)
}
