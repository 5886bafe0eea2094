package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// The small-files benchmark of issue 20, item 1 (docs/bench.md, "Small
// files and listings through the mount"), side by side in one run:
// 10 000 files of 4-64 KiB (random sizes, seeded) read with
// open+read+close on ext4 (a directory on the data disk) and through the
// mount, warm (the pass after a warm-up pass) and on the first pass after
// a node start; then a walk that lstats every one of 100 000 entries, and
// `ls -lR` of them, on ext4 and through the mount. Medians of
// KYLIX_BENCH_REPS runs (default 3), the sides interleaved.
//
//	KYLIX_BENCH=1 go test -ldflags=-checklinkname=0 ./test -run 'TestBenchSmallFiles$' -count=1 -v -timeout 30m
//
// KYLIX_BENCH_SMALL and KYLIX_BENCH_TREE change the counts.
func TestBenchSmallFiles(t *testing.T) {
	if os.Getenv("KYLIX_BENCH") != "1" {
		t.Skip("a benchmark: KYLIX_BENCH=1")
	}
	requireFUSE(t)
	nSmall, nTree, reps := envInt("KYLIX_BENCH_SMALL", 10000), envInt("KYLIX_BENCH_TREE", 100000), envInt("KYLIX_BENCH_REPS", 3)
	base := t.TempDir()
	src, tree := filepath.Join(base, "small"), filepath.Join(base, "tree")
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	writeSmallFiles(t, src, nSmall, 20)
	for d := 0; d*1000 < nTree; d++ {
		dir := filepath.Join(tree, fmt.Sprintf("dir-%05d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := d * 1000; i < min(nTree, (d+1)*1000); i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file-%07d.bin", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mkTree(t, data, nTree, 1000)

	n := startNode(t, data, mnt)
	mustKylix(t, base, "import", "--data", data, src, "small")
	msrc, mtree := filepath.Join(mnt, "small"), filepath.Join(mnt, "bench")

	var ext4, warm, first, walkE, walkM, lsE, lsM []float64
	readTree(t, src) // warm-up passes
	readTree(t, msrc)
	walkTree(t, tree)
	walkTree(t, mtree)
	for range reps {
		ext4 = append(ext4, readTree(t, src))
		warm = append(warm, readTree(t, msrc))
		walkE = append(walkE, walkTree(t, tree))
		walkM = append(walkM, walkTree(t, mtree))
		lsE = append(lsE, lsR(t, tree))
		lsM = append(lsM, lsR(t, mtree))
	}
	for range reps {
		n.stop()
		n = startNode(t, data, mnt)
		first = append(first, readTree(t, msrc))
	}
	// Node memory per file the kernel knows: Go heap after a GC and RSS,
	// before and after a walk that looks up every entry of the tree.
	heap0, rss0 := nodeMem(t, base, data)
	walkTree(t, mtree)
	heap1, rss1 := nodeMem(t, base, data)
	t.Logf("node memory after a walk of %d entries: heap %d -> %d B (%.0f B/file), RSS %d -> %d B (%.0f B/file)",
		nTree, heap0, heap1, float64(heap1-heap0)/float64(nTree), rss0, rss1, float64(rss1-rss0)/float64(nTree))
	e, w, f := median(ext4), median(warm), median(first)
	we, wm, le, lm := median(walkE), median(walkM), median(lsE), median(lsM)
	t.Logf("small files (%d, 4-64 KiB), open+read+close, files/s: ext4 %v", nSmall, ext4)
	t.Logf("  mount warm %v", warm)
	t.Logf("  mount first pass after a node start %v", first)
	t.Logf("walk with lstat of %d entries, s: ext4 %v mount %v", nTree, walkE, walkM)
	t.Logf("ls -lR of %d entries, s: ext4 %v mount %v", nTree, lsE, lsM)
	t.Logf("| %d small files (4-64 KiB), open+read+close, warm | %.0f files/s | %.0f files/s on ext4 | %.2fx |", nSmall, w, e, w/e)
	t.Logf("| same, first pass after a node start | %.0f files/s | %.0f files/s | %.2fx |", f, e, f/e)
	t.Logf("| walk with lstat over %d entries | %.3f s | %.3f s on ext4 | %.2fx the time |", nTree, wm, we, wm/we)
	t.Logf("| `ls -lR` over %d entries | %.3f s | %.3f s on ext4 | %.2fx the time |", nTree, lm, le, lm/le)
}

// nodeMem returns the node's Go heap after a GC and its resident set.
func nodeMem(t *testing.T, dir, data string) (heap, rss int64) {
	t.Helper()
	var st struct {
		Heap int64 `json:"heap_bytes"`
		RSS  int64 `json:"rss_bytes"`
	}
	if err := json.Unmarshal([]byte(mustKylix(t, dir, "node", "--data", data, "--gc", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	return st.Heap, st.RSS
}

// writeSmallFiles writes n files of 4-64 KiB (sizes and bytes from seed),
// 100 to a directory.
func writeSmallFiles(t *testing.T, dir string, n int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 64<<10)
	for i := range n {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		size := 4<<10 + r.IntN(60<<10+1)
		for j := 0; j < size; j += 8 {
			v := r.Uint64()
			for k := 0; k < 8 && j+k < size; k++ {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), buf[:size], 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mkTree adds n files of one shared 100-byte content (perDir to a
// directory) under bench/ in the store in data, with no node running.
func mkTree(t *testing.T, data string, n, perDir int) {
	t.Helper()
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tmp, err := os.CreateTemp(t.TempDir(), "mkns-")
	if err != nil {
		t.Fatal(err)
	}
	tmp.WriteString("a small file shared by every name in the synthetic namespace, 100 bytes long......................\n")
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

// readTree opens, reads whole and closes every regular file under dir and
// returns files/s (the listing included, on both sides alike).
func readTree(t *testing.T, dir string) float64 {
	t.Helper()
	buf := make([]byte, 1<<20)
	start := time.Now()
	files := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		for {
			_, err = f.Read(buf)
			if err != nil {
				break
			}
		}
		f.Close()
		files++
		if err != io.EOF {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(files) / time.Since(start).Seconds()
}

// walkTree lists dir recursively and lstats every entry (what ls -lR asks
// of the file system, without its extended attributes); seconds.
func walkTree(t *testing.T, dir string) float64 {
	t.Helper()
	start := time.Now()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		_, err = os.Lstat(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start).Seconds()
}

// lsR runs ls -lR on dir; seconds.
func lsR(t *testing.T, dir string) float64 {
	t.Helper()
	cmd := exec.Command("ls", "-lR", dir)
	start := time.Now()
	if out, err := cmd.Output(); err != nil || len(out) == 0 {
		t.Fatalf("ls -lR %s: %v", dir, err)
	}
	return time.Since(start).Seconds()
}
