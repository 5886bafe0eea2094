package fs_test

import (
	"context"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// TestBenchNodeMemory measures what a file the kernel knows costs the
// node (issue 20, item 1; docs/bench.md, "Node memory per known file"):
// the Go heap after a GC and the process's RSS after the freed pages went
// back to the system, before and after a walk that lstats every one of
// KYLIX_BENCH_TREE entries (default 100 000, 1000 to a directory), in
// process, with a heap profile of the read-only mount written to
// KYLIX_BENCH_HEAPPROFILE when set.
//
//	KYLIX_BENCH=1 go test ./fs -run 'TestBenchNodeMemory$' -count=1 -v
func TestBenchNodeMemory(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	n := 100000
	if v, err := strconv.Atoi(os.Getenv("KYLIX_BENCH_TREE")); err == nil {
		n = v
	}
	for _, ro := range []bool{false, true} {
		m := fstest.Mount(t, kfs.Options{ReadOnly: ro})
		syntheticTree(t, m.Store, n, 1000)
		m.FS.Reconcile()
		dir := filepath.Join(m.Dir, "bench")
		heap := func() uint64 {
			runtime.GC()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		h0, r0 := heap(), rss(t)
		count := 0
		err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			_, err = os.Lstat(p)
			count++
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		h1, r1 := heap(), rss(t)
		t.Logf("read-only %v: heap %d -> %d B after a walk of %d entries: %.0f B per entry", ro, h0, h1, count, float64(int64(h1)-int64(h0))/float64(count))
		t.Logf("read-only %v: RSS %d -> %d B after the walk: %.0f B per entry", ro, r0, r1, float64(int64(r1)-int64(r0))/float64(count))
		// Then a read of every file: what a file read once keeps.
		files := 0
		err = filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			files++
			_, err = os.ReadFile(p)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		m.FS.PrefetchIdle()
		h2 := heap()
		t.Logf("read-only %v: heap %d -> %d B after reading %d files: %.0f B more per file", ro, h1, h2, files, float64(int64(h2)-int64(h1))/float64(files))
		if p := os.Getenv("KYLIX_BENCH_HEAPPROFILE"); p != "" && ro {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
}

// rss returns the process's resident set after a GC that returns freed
// pages to the system.
func rss(t *testing.T) uint64 {
	t.Helper()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	var size, res uint64
	if _, err := fmt.Sscan(string(b), &size, &res); err != nil {
		t.Fatal(err)
	}
	return res * uint64(os.Getpagesize())
}

// syntheticTree adds n files of one shared content (perDir to a
// directory) under bench/.
func syntheticTree(t *testing.T, s *chunkstore.Store, n, perDir int) {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "mkns-")
	if err != nil {
		t.Fatal(err)
	}
	tmp.WriteString("a small file shared by every name in the synthetic namespace\n")
	im := s.NewImporter()
	defer im.Abort()
	r, err := im.PutFile(context.Background(), tmp, "f", nil)
	if err != nil {
		t.Fatal(err)
	}
	top := &chunkstore.DirManifest{}
	now := time.Now().UnixNano()
	for d := 0; d*perDir < n; d++ {
		m := &chunkstore.DirManifest{}
		for i := d * perDir; i < min(n, (d+1)*perDir); i++ {
			m.Put(chunkstore.Entry{Name: fmt.Sprintf("file-%07d.bin", i), Kind: chunkstore.KindFile, Mode: 0o644, Size: r.Size, ID: r.ID, MTime: now})
		}
		top.Put(chunkstore.Entry{Name: fmt.Sprintf("dir-%05d", d), Kind: chunkstore.KindDir, Mode: 0o755, MTime: now, ID: im.PutObject(m.Encode())})
	}
	if err := im.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *chunkstore.NSTx) error {
		return tx.Put("bench", chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o755, MTime: now, ID: tx.PutDir(top)})
	}); err != nil {
		t.Fatal(err)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
}
