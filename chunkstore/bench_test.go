package chunkstore

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/kylix/kylix/internal/demomodel"
)

// The store benchmarks compare, in one run, on the same files and disk:
//
//	import  vs  cp -r (+ sync)  vs  hashing alone on all cores
//	export  vs  reading the source files
//
// The model is generated once under KYLIX_BENCH_DIR (default: a directory
// under the repository's .bench, on the real disk rather than tmpfs), sized by
// KYLIX_BENCH_SIZE (default 512MiB per version). Run: make bench, or
//
//	go test ./chunkstore -run '^$' -bench Store -benchtime 3x -count 5
var benchModel struct {
	once sync.Once
	dir  string
	size int64
	err  error
}

func benchSource(b *testing.B) (dir string, bytes int64) {
	benchModel.once.Do(func() {
		root := os.Getenv("KYLIX_BENCH_DIR")
		if root == "" {
			wd, _ := os.Getwd()
			root = filepath.Join(wd, "..", ".bench")
		}
		size := int64(512 << 20)
		if s := os.Getenv("KYLIX_BENCH_SIZE_MIB"); s != "" {
			var mib int64
			for _, c := range s {
				mib = mib*10 + int64(c-'0')
			}
			size = mib << 20
		}
		dir := filepath.Join(root, "model")
		if _, err := os.Stat(filepath.Join(dir, "base")); err != nil {
			os.RemoveAll(dir)
			if _, err := demomodel.Generate(dir, demomodel.Options{Size: size, Seed: 42}); err != nil {
				benchModel.err = err
				return
			}
		}
		benchModel.dir = filepath.Join(dir, "base")
		filepath.Walk(benchModel.dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				benchModel.size += fi.Size()
			}
			return nil
		})
	})
	if benchModel.err != nil {
		b.Fatal(benchModel.err)
	}
	return benchModel.dir, benchModel.size
}

// warm reads every file once so that each contender starts from the page cache.
func warm(b *testing.B, dir string) {
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			f, _ := os.Open(p)
			io.Copy(io.Discard, f)
			f.Close()
		}
		return nil
	})
}

func benchScratch(b *testing.B) string {
	d := filepath.Join(filepath.Dir(benchModel.dir), "..", "scratch")
	os.RemoveAll(d)
	if err := os.MkdirAll(d, 0o755); err != nil {
		b.Fatal(err)
	}
	return d
}

func BenchmarkStoreImport(b *testing.B) {
	src, n := benchSource(b)
	warm(b, src)
	b.SetBytes(n)
	for b.Loop() {
		b.StopTimer()
		d := benchScratch(b)
		s, err := Open(Options{Dir: d})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.Import(context.Background(), src, "m", ImportOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
}

// BenchmarkStoreCp is what a user does instead: cp -r, then sync so the bytes
// are on disk as they are after an import (which fsyncs before it commits).
func BenchmarkStoreCp(b *testing.B) {
	src, n := benchSource(b)
	warm(b, src)
	b.SetBytes(n)
	for b.Loop() {
		b.StopTimer()
		d := filepath.Join(benchScratch(b), "copy")
		b.StartTimer()
		if out, err := exec.Command("cp", "-r", src, d).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
		if out, err := exec.Command("sync", "-f", d).CombinedOutput(); err != nil {
			b.Fatalf("sync: %v %s", err, out)
		}
	}
}

// BenchmarkStoreCpNoSync is cp -r alone (the bytes may still be in the page
// cache when it returns).
func BenchmarkStoreCpNoSync(b *testing.B) {
	src, n := benchSource(b)
	warm(b, src)
	b.SetBytes(n)
	for b.Loop() {
		b.StopTimer()
		d := filepath.Join(benchScratch(b), "copy")
		b.StartTimer()
		if out, err := exec.Command("cp", "-r", src, d).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
	}
}

// BenchmarkStoreHashAllCores reads the files and BLAKE3-hashes 16 MiB pieces
// on every core: the hashing bound an import cannot beat.
func BenchmarkStoreHashAllCores(b *testing.B) {
	src, n := benchSource(b)
	warm(b, src)
	var files []string
	filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	b.SetBytes(n)
	for b.Loop() {
		type piece struct {
			f   *os.File
			off int64
		}
		q := make(chan piece, 64)
		var wg sync.WaitGroup
		for range runtime.GOMAXPROCS(0) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 16<<20)
				for p := range q {
					k, _ := p.f.ReadAt(buf, p.off)
					Sum(buf[:k])
				}
			}()
		}
		var open []*os.File
		for _, name := range files {
			f, _ := os.Open(name)
			open = append(open, f)
			fi, _ := f.Stat()
			for off := int64(0); off < fi.Size(); off += 16 << 20 {
				q <- piece{f, off}
			}
		}
		close(q)
		wg.Wait()
		for _, f := range open {
			f.Close()
		}
	}
}

func benchStore(b *testing.B) *Store {
	src, _ := benchSource(b)
	d := filepath.Join(filepath.Dir(benchModel.dir), "..", "store")
	s, err := Open(Options{Dir: d, IO: os.Getenv("KYLIX_BENCH_IO")})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Lookup("m"); err != nil {
		if _, err := s.Import(context.Background(), src, "m", ImportOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkStoreExport reads every stored file back (verifying each chunk)
// and discards the bytes; compare with BenchmarkStoreReadSource.
func BenchmarkStoreExport(b *testing.B) {
	_, n := benchSource(b)
	s := benchStore(b)
	defer s.Close()
	var files []ID
	s.Walk("m", func(p string, e Entry) error {
		if e.Kind == KindFile {
			files = append(files, e.ID)
		}
		return nil
	})
	b.SetBytes(n)
	for b.Loop() {
		for _, id := range files {
			f, err := s.OpenFile(id)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.WriteTo(context.Background(), io.Discard, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkStoreReadSource reads the source files (page cache warm) into
// io.Discard with 32 MiB reads.
func BenchmarkStoreReadSource(b *testing.B) {
	src, n := benchSource(b)
	warm(b, src)
	b.SetBytes(n)
	buf := make([]byte, 32<<20)
	for b.Loop() {
		filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				f, _ := os.Open(p)
				io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
				f.Close()
			}
			return nil
		})
	}
}

// BenchmarkSumParallel is BLAKE3 over 4 MiB chunks on every core: the ceiling
// for verifying data that is already in memory.
func BenchmarkSumParallel(b *testing.B) {
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(buf)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			Sum(buf)
		}
	})
}
