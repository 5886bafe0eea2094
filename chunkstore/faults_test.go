package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
)

// Fault tests: each injects one failure (or a simulated kill -9) at a chosen
// file operation and asserts the exact outcome. See docs/design/index.md.

var (
	baseSizes = map[string]int{"a": 1<<20 + 5000, "b": 5000, "d/c": 300}
	newSizes  = map[string]int{"x": 2<<20 + 3, "y": 7000, "z/w": 100}
)

// fixture is a data directory holding one committed import ("base"), and
// the tree a test then imports ("new").
type fixture struct {
	dir             string
	base, newTree   map[string][]byte
	baseSrc, newSrc string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	fx := &fixture{dir: t.TempDir(), baseSrc: t.TempDir(), newSrc: t.TempDir()}
	fx.base = writeTree(t, fx.baseSrc, baseSizes, 21)
	fx.newTree = writeTree(t, fx.newSrc, newSizes, 22)
	s := openTest(t, fx.dir)
	if _, err := s.Import(context.Background(), fx.baseSrc, "base", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return fx
}

// clone copies the fixture's data directory for one run.
func (fx *fixture) clone(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(fx.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(fx.dir, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// packFiles returns the sha256 of every file in dir/packs, by name.
func packFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "packs"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, "packs", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

// exported exports path from s and returns the files' contents.
func exported(t *testing.T, s *Store, path string) map[string][]byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := s.Export(context.Background(), path, out, ExportOptions{}); err != nil {
		t.Fatalf("export %s: %v", path, err)
	}
	got := map[string][]byte{}
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(out, p)
		got[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameFiles(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d files, want %d", what, len(got), len(want))
	}
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			t.Fatalf("%s: %s differs (%d bytes, want %d)", what, name, len(got[name]), len(b))
		}
	}
}

// checkConsistent reopens dir without faults and asserts: base intact and
// verifying; new either wholly there (and identical) or wholly absent (it
// must be there if committed); index, log and packs agree. It returns
// whether new is there.
func checkConsistent(t *testing.T, fx *fixture, dir string, committed bool) bool {
	t.Helper()
	s, err := Open(Options{Dir: dir, IO: "pread"})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	rep, err := s.Verify(ctx, "", nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify after reopen: %+v %v", rep, err)
	}
	fr, err := s.Fsck(ctx)
	if err != nil || !fr.OK() {
		t.Fatalf("fsck after reopen: %+v %v", fr, err)
	}
	sameFiles(t, "base", exported(t, s, "base"), fx.base)
	_, err = s.Lookup("new")
	if errors.Is(err, ErrNotFound) {
		if committed {
			t.Fatal("a committed import is gone after reopen")
		}
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, "new", exported(t, s, "new"), fx.newTree)
	return true
}

// opCounts is how many operations of each kind a workload made.
type opCounts map[vfs.Op]int

func (c opCounts) Count(op vfs.Op) int { return c[op] }

// countOps runs the workload once without faults and returns how many
// operations of each kind it made (closing the store not included).
func countOps(t *testing.T, fx *fixture, work func(*Store) error) opCounts {
	t.Helper()
	in := vfs.NewInjector(nil, nil)
	s, err := Open(Options{Dir: fx.clone(t), IO: "pread", FS: in})
	if err != nil {
		t.Fatal(err)
	}
	in.Arm(nil)
	if err := work(s); err != nil {
		t.Fatal(err)
	}
	c := opCounts{}
	for op := vfs.OpCreate; op <= vfs.OpClose; op++ {
		c[op] = in.Count(op)
	}
	s.Close()
	return c
}

func TestFaultAtEachOperation(t *testing.T) {
	fx := newFixture(t)
	work := func(s *Store) error {
		_, err := s.Import(context.Background(), fx.newSrc, "new", ImportOptions{})
		return err
	}
	counted := countOps(t, fx, work)
	type mode struct {
		name  string
		err   error
		short bool
	}
	modes := []mode{{"EIO", syscall.EIO, false}, {"ENOSPC", syscall.ENOSPC, false}, {"short-write", syscall.ENOSPC, true}}
	runs := 0
	for _, op := range []vfs.Op{vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpClose} {
		n := counted.Count(op)
		if n == 0 {
			t.Fatalf("the import made no %s operation: the seam is not in the path", op)
		}
		for i := 1; i <= n; i++ {
			for _, m := range modes {
				if m.short && op != vfs.OpWrite {
					continue
				}
				if testing.Short() && m.name != "EIO" && i > 2 {
					continue // -short (the race run): every operation once
				}
				t.Run(fmt.Sprintf("%s-%d-%s", op, i, m.name), func(t *testing.T) {
					runs++
					dir := fx.clone(t)
					before := packFiles(t, dir)
					in := vfs.NewInjector(nil, nil)
					s, err := Open(Options{Dir: dir, IO: "pread", FS: in})
					if err != nil {
						t.Fatal(err)
					}
					in.Arm(&vfs.Fault{Op: op, N: i, Err: m.err, Short: m.short})
					err = work(s)
					if !in.Fired() {
						t.Fatalf("fault %s #%d never fired", op, i)
					}
					if err == nil {
						t.Fatalf("import succeeded although %s #%d failed", op, i)
					}
					if !errors.Is(err, m.err) {
						t.Fatalf("import error does not wrap %v: %v", m.err, err)
					}
					s.Close()
					// Earlier packs are untouched, byte for byte.
					after := packFiles(t, dir)
					for name, h := range before {
						if strings.HasSuffix(name, ".pack") && after[name] != h {
							t.Fatalf("pack %s changed", name)
						}
					}
					if checkConsistent(t, fx, dir, false) {
						t.Fatal("a failed import is visible after reopen")
					}
				})
			}
		}
	}
	t.Logf("%d injected faults", runs)
}

// TestCrashAtEachStep stops all file IO at each operation of an import in
// turn (what kill -9 there would leave: writes made so far reach the disk,
// nothing after happens), and also between the log append and the index
// transaction; then reopens and checks the store.
func TestCrashAtEachStep(t *testing.T) {
	fx := newFixture(t)
	work := func(s *Store) error {
		_, err := s.Import(context.Background(), fx.newSrc, "new", ImportOptions{})
		return err
	}
	counted := countOps(t, fx, work)
	for _, op := range []vfs.Op{vfs.OpCreate, vfs.OpWrite, vfs.OpSync} {
		for i := 1; i <= counted.Count(op); i++ {
			for _, short := range []bool{false, true} {
				if short && op != vfs.OpWrite {
					continue
				}
				t.Run(fmt.Sprintf("%s-%d-short=%v", op, i, short), func(t *testing.T) {
					dir := fx.clone(t)
					in := vfs.NewInjector(nil, nil)
					s, err := Open(Options{Dir: dir, IO: "pread", FS: in})
					if err != nil {
						t.Fatal(err)
					}
					in.Arm(&vfs.Fault{Op: op, N: i, Short: short, Crash: true})
					if err := work(s); err == nil {
						t.Fatal("import succeeded after the process was 'killed'")
					}
					s.Close()
					checkConsistent(t, fx, dir, false)
				})
			}
		}
	}
	// Killed after a commit's log frame is synced, before the index
	// transaction: the commit is in the log, so the next open applies it.
	for k := 1; k <= 3; k++ {
		t.Run(fmt.Sprintf("before-index-%d", k), func(t *testing.T) {
			dir := fx.clone(t)
			s, err := Open(Options{Dir: dir, IO: "pread"})
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			crash := errors.New("killed")
			s.testHookBeforeIndex = func() error {
				calls++
				if calls >= k {
					return crash
				}
				return nil
			}
			err = work(s)
			s.testHookBeforeIndex = nil
			s.Close()
			if calls < k {
				t.Skipf("the import made only %d commits", calls)
			}
			if !errors.Is(err, crash) {
				t.Fatalf("import: %v", err)
			}
			checkConsistent(t, fx, dir, false)
		})
	}
}

// TestCrashedPackWithIntentIsRemoved: a pack begun (its intent logged) and
// never committed is removed at the next open; a pack nothing mentions is
// left alone (TestOpenRepairsTornWrites).
func TestCrashedPackWithIntentIsRemoved(t *testing.T) {
	fx := newFixture(t)
	dir := fx.clone(t)
	in := vfs.NewInjector(nil, nil)
	s, err := Open(Options{Dir: dir, IO: "pread", FS: in})
	if err != nil {
		t.Fatal(err)
	}
	// The first pack write is the new large file's exclusive pack.
	in.Arm(&vfs.Fault{Op: vfs.OpWrite, N: 1, Path: ".pack", Crash: true})
	if _, err := s.Import(context.Background(), fx.newSrc, "new", ImportOptions{}); err == nil {
		t.Fatal("import succeeded")
	}
	s.Close()
	before := packFiles(t, dir)
	var var1 []string
	for name := range before {
		if _, ok := fx.packNames(t)[name]; !ok && strings.HasSuffix(name, ".pack") {
			var1 = append(var1, name)
		}
	}
	if len(var1) == 0 {
		t.Fatal("the crash left no new pack behind: nothing tested")
	}
	checkConsistent(t, fx, dir, false)
	after := packFiles(t, dir)
	for _, name := range var1 {
		if _, ok := after[name]; ok {
			t.Fatalf("uncommitted pack %s was not removed", name)
		}
	}
}

func (fx *fixture) packNames(t *testing.T) map[string]string { return packFiles(t, fx.dir) }

// TestGCCrashAtEachStep: GC removes records (log, then index) and compacts
// the log; a crash at any of its file operations leaves a store that opens,
// verifies and still holds everything reachable.
func TestGCCrashAtEachStep(t *testing.T) {
	fx := newFixture(t)
	prep := func(dir string, in vfs.FS) *Store {
		s, err := Open(Options{Dir: dir, IO: "pread", FS: in})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The data dir for each run: base plus "drop", then "drop" removed.
	seed := fx.clone(t)
	s := prep(seed, nil)
	if _, err := s.Import(context.Background(), fx.newSrc, "drop", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *NSTx) error { return tx.Remove("drop", true) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	gfx := &fixture{dir: seed, base: fx.base, newTree: fx.newTree}
	in := vfs.NewInjector(nil, nil)
	s = prep(gfx.clone(t), in)
	in.Arm(nil)
	if res, err := s.GC(context.Background()); err != nil || res.PacksRemoved == 0 {
		t.Fatalf("gc: %+v %v", res, err)
	}
	counts := opCounts{}
	for op := vfs.OpCreate; op <= vfs.OpClose; op++ {
		counts[op] = in.Count(op)
	}
	s.Close()
	for _, op := range []vfs.Op{vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpRename, vfs.OpRemove} {
		for i := 1; i <= counts.Count(op); i++ {
			t.Run(fmt.Sprintf("%s-%d", op, i), func(t *testing.T) {
				dir := gfx.clone(t)
				inj := vfs.NewInjector(nil, nil)
				s := prep(dir, inj)
				inj.Arm(&vfs.Fault{Op: op, N: i, Crash: true})
				// Whether GC reports the "kill" depends on the step
				// (removing the old log generation only warns); what
				// matters is the store found at the next open.
				_, _ = s.GC(context.Background())
				if !inj.Fired() {
					t.Fatal("the fault never fired")
				}
				s.Close()
				checkConsistent(t, gfx, dir, false)
			})
		}
	}
}

// damage kinds applied to index.db.
var indexDamage = []struct {
	name string
	fn   func(path string) error
}{
	{"deleted", os.Remove},
	{"empty", func(p string) error { return os.Truncate(p, 0) }},
	{"truncated", func(p string) error { return os.Truncate(p, 3*4096) }},
	{"truncated-mid-page", func(p string) error { return os.Truncate(p, 2*4096+100) }},
	{"meta-pages-garbage", func(p string) error { return overwrite(p, 0, 2*4096, 0x5a) }},
	{"meta-pages-zeroed", func(p string) error { return overwrite(p, 0, 2*4096, 0) }},
}

// overwrite writes n bytes of pattern b (0x5a: a pseudo-random stream) at off.
func overwrite(path string, off, n int64, b byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, n)
	if b != 0 {
		x := uint32(b)
		for i := range buf {
			x = x*1664525 + 1013904223
			buf[i] = byte(x >> 24)
		}
	}
	_, err = f.WriteAt(buf, off)
	return err
}

// TestDamagedIndexRefusesAndRebuilds: a missing, empty, truncated or garbled
// index never deletes a pack: Open returns ErrIndexDamaged naming the command
// to run, and RebuildIndex restores everything (byte-identical export).
func TestDamagedIndexRefusesAndRebuilds(t *testing.T) {
	fx := newFixture(t)
	// A second import, a removal and a GC, so the log holds every kind of
	// record and has been compacted once.
	{
		s := openTest(t, fx.dir)
		ctx := context.Background()
		if _, err := s.Import(ctx, fx.newSrc, "drop", ImportOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(func(tx *NSTx) error { return tx.Remove("drop", true) }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GC(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Import(ctx, fx.newSrc, "new", ImportOptions{}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	for _, d := range indexDamage {
		t.Run(d.name, func(t *testing.T) {
			dir := fx.clone(t)
			before := packFiles(t, dir)
			if err := d.fn(filepath.Join(dir, "index.db")); err != nil {
				t.Fatal(err)
			}
			for range 2 { // and again: a refusal changes nothing
				_, err := Open(Options{Dir: dir, IO: "pread"})
				if !errors.Is(err, ErrIndexDamaged) {
					t.Fatalf("open: %v, want ErrIndexDamaged", err)
				}
				if !strings.Contains(err.Error(), "kylix fsck --rebuild-index") {
					t.Fatalf("the error does not say what to run: %v", err)
				}
			}
			if after := packFiles(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("packs directory changed:\nbefore %v\nafter  %v", before, after)
			}
			rebuildAndCheck(t, fx, dir)
		})
	}
	// Garbage over each page in turn, then zeros: open either works with
	// every byte intact or refuses; it never panics, crashes or deletes.
	refused := 0
	st, err := os.Stat(filepath.Join(fx.dir, "index.db"))
	if err != nil {
		t.Fatal(err)
	}
	for pg := int64(2); pg < st.Size()/4096; pg++ {
		for _, pattern := range []byte{byte(pg) | 1, 0} {
			t.Run(fmt.Sprintf("page-%d-pattern-%x", pg, pattern), func(t *testing.T) {
				dir := fx.clone(t)
				before := packFiles(t, dir)
				if err := overwrite(filepath.Join(dir, "index.db"), pg*4096, 4096, pattern); err != nil {
					t.Fatal(err)
				}
				s, err := Open(Options{Dir: dir, IO: "pread"})
				if err == nil {
					// An unused page: nothing was damaged.
					sameFiles(t, "base", exported(t, s, "base"), fx.base)
					sameFiles(t, "new", exported(t, s, "new"), fx.newTree)
					s.Close()
					return
				}
				if !errors.Is(err, ErrIndexDamaged) {
					t.Fatalf("open: %v, want ErrIndexDamaged", err)
				}
				t.Log(err)
				// A second open in this process must give the same answer
				// (bbolt's mmap and flock from the failed one are released).
				if _, err := Open(Options{Dir: dir, IO: "pread"}); !errors.Is(err, ErrIndexDamaged) {
					t.Fatalf("second open: %v", err)
				}
				refused++
				if after := packFiles(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatal("packs directory changed")
				}
				rebuildAndCheck(t, fx, dir)
			})
		}
	}
	if refused == 0 {
		t.Fatal("no garbled page was detected: the index walk reads nothing")
	}
}

func rebuildAndCheck(t *testing.T, fx *fixture, dir string) {
	t.Helper()
	rep, err := RebuildIndex(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if len(rep.Dropped) != 0 || rep.LogDamage != "" || len(rep.Unreferenced) != 0 {
		t.Fatalf("rebuild report: %+v", rep)
	}
	if !checkConsistent(t, fx, dir, true) {
		t.Fatal("new is gone after rebuild")
	}
}

// TestRebuildDropsChunksThatDoNotVerify: a flipped byte in a pack is found
// by the rebuild; the chunk is left out and verify names the file.
func TestRebuildDropsChunksThatDoNotVerify(t *testing.T) {
	fx := newFixture(t)
	s := openTest(t, fx.dir)
	f, _, err := s.OpenPath("base/a")
	if err != nil {
		t.Fatal(err)
	}
	corruptOneByte(t, f)
	s.Close()
	if err := os.Remove(filepath.Join(fx.dir, "index.db")); err != nil {
		t.Fatal(err)
	}
	rep, err := RebuildIndex(context.Background(), Options{Dir: fx.dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Dropped) != 1 {
		t.Fatalf("rebuild dropped %v, want one chunk", rep.Dropped)
	}
	s = openTest(t, fx.dir)
	vr, err := s.Verify(context.Background(), "", nil)
	if err != nil || vr.OK() || len(vr.Problems) != 1 || vr.Problems[0].Paths[0] != "base/a" {
		t.Fatalf("verify after rebuild: %+v %v", vr, err)
	}
	// Importing the file again stores the chunk anew, and a second rebuild
	// keeps the good copy (the log records the drop).
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), fx.base["a"], 0o644)
	if _, err := s.Import(context.Background(), filepath.Join(src, "a"), "base/a", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.Remove(filepath.Join(fx.dir, "index.db"))
	if rep, err := RebuildIndex(context.Background(), Options{Dir: fx.dir}); err != nil || len(rep.Dropped) != 0 {
		t.Fatalf("second rebuild: %+v %v", rep, err)
	}
	checkConsistent(t, fx, fx.dir, false)
}

// TestTornLogTailIsCutOff: a frame half written when the process died is cut
// off at open (its commit never reached the index), earlier data intact.
func TestTornLogTailIsCutOff(t *testing.T) {
	fx := newFixture(t)
	gens, _ := scanLogs(vfs.Default, filepath.Join(fx.dir, "packs"))
	log := filepath.Join(fx.dir, "packs", logName(gens[len(gens)-1]))
	st, _ := os.Stat(log)
	payload := appendRecord(nil, record{kind: recHead, head: Head{Name: "x", HLC: 1}})
	fr := frame(payload)
	lf, _ := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	lf.Write(fr[:len(fr)-3])
	lf.Close()
	var logged bytes.Buffer
	s, err := Open(Options{Dir: fx.dir, IO: "pread", Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetHead("x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a torn commit was applied: %v", err)
	}
	s.Close()
	if st2, _ := os.Stat(log); st2.Size() != st.Size() {
		t.Fatalf("log is %d bytes, want %d", st2.Size(), st.Size())
	}
	if !strings.Contains(logged.String(), "torn end of the metadata log") {
		t.Fatalf("nothing logged: %s", logged.String())
	}
	checkConsistent(t, fx, fx.dir, false)
}

// TestOldStoreGetsALog: a store written before the metadata log existed (an
// index without log state or intents bucket, no log file) gets a log written
// from its index at open, after which the index can be rebuilt from it; and a
// store whose log file was lost gets it written again.
func TestOldStoreGetsALog(t *testing.T) {
	fx := newFixture(t)
	pdir := filepath.Join(fx.dir, "packs")
	removeLogs := func() {
		gens, _ := scanLogs(vfs.Default, pdir)
		if len(gens) == 0 {
			t.Fatal("no log to remove")
		}
		for _, g := range gens {
			os.Remove(filepath.Join(pdir, logName(g)))
		}
	}
	// The log lost, the index intact.
	removeLogs()
	s := openTest(t, fx.dir)
	s.Close()
	// An index as an older kylix wrote it.
	removeLogs()
	db, err := bolt.Open(filepath.Join(fx.dir, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Delete(keyLogState); err != nil {
			return err
		}
		return tx.DeleteBucket(bucketIntents)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = openTest(t, fx.dir)
	s.Close()
	if gens, _ := scanLogs(vfs.Default, pdir); len(gens) != 1 {
		t.Fatalf("log generations after open: %v", gens)
	}
	os.Remove(filepath.Join(fx.dir, "index.db"))
	if _, err := RebuildIndex(context.Background(), Options{Dir: fx.dir}); err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, fx, fx.dir, false)
}

// TestReplacedIndexIsRefused: an index that does not record the log it
// caches (a fresh or foreign index.db) while the log has records is refused,
// never taken as the truth (that would rewrite the log from it).
func TestReplacedIndexIsRefused(t *testing.T) {
	fx := newFixture(t)
	before := packFiles(t, fx.dir)
	os.Remove(filepath.Join(fx.dir, "index.db"))
	db, err := bolt.Open(filepath.Join(fx.dir, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := initIndex(db); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(Options{Dir: fx.dir, IO: "pread"}); !errors.Is(err, ErrIndexDamaged) {
		t.Fatalf("open with a foreign index: %v", err)
	}
	if fmt.Sprint(packFiles(t, fx.dir)) != fmt.Sprint(before) {
		t.Fatal("packs directory changed")
	}
	// Even with the log gone too, an index that knows no pack while packs
	// exist is not taken for an old store's index.
	saved := t.TempDir()
	gens, _ := scanLogs(vfs.Default, filepath.Join(fx.dir, "packs"))
	for _, g := range gens {
		from := filepath.Join(fx.dir, "packs", logName(g))
		if err := os.Rename(from, filepath.Join(saved, logName(g))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(Options{Dir: fx.dir, IO: "pread"}); !errors.Is(err, ErrIndexDamaged) {
		t.Fatalf("open with an empty index and no log: %v", err)
	}
	for _, g := range gens {
		os.Rename(filepath.Join(saved, logName(g)), filepath.Join(fx.dir, "packs", logName(g)))
	}
	rebuildAndCheck2(t, fx)
}

func rebuildAndCheck2(t *testing.T, fx *fixture) {
	t.Helper()
	if _, err := RebuildIndex(context.Background(), Options{Dir: fx.dir}); err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, fx, fx.dir, false)
}
