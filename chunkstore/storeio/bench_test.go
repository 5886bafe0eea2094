package storeio

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"unsafe"
)

// The benchmarks read a 1 GiB file made once per process in a directory on a
// real disk: $KYLIX_BENCH_DIR, or /var/tmp (which ProbeDirect must accept:
// not tmpfs). One op is one pass over the whole file in requests of the given
// size, issued as batches of benchBatchBytes; b.SetBytes makes the result
// MB/s. Run with -benchtime 1x (each op is 1 GiB) and -count 3, e.g.
//
//	go test -run '^$' -bench . -benchtime 1x -count 3 ./chunkstore/storeio/
const (
	benchFileSize   = 1 << 30
	benchBatchBytes = 256 << 20
)

var bench struct {
	once sync.Once
	dir  string
	path string
	buf  []byte // benchBatchBytes, aligned, shared by all benchmarks
	err  error

	warmOnce sync.Once
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	os.Exit(code)
}

func benchSetup(b *testing.B) {
	bench.once.Do(func() {
		base := os.Getenv("KYLIX_BENCH_DIR")
		if base == "" {
			base = "/var/tmp"
		}
		if bench.err = ProbeDirect(base); bench.err != nil {
			return
		}
		if bench.dir, bench.err = os.MkdirTemp(base, "storeio-bench-"); bench.err != nil {
			return
		}
		bench.path = filepath.Join(bench.dir, "1GiB")
		bench.buf = AlignedBuffer(benchBatchBytes)
		bench.err = writeBenchFile(bench.path, bench.buf)
	})
	if bench.err != nil {
		b.Skipf("no benchmark file: %v", bench.err)
	}
}

// writeBenchFile fills path with benchFileSize pseudo-random bytes and syncs it.
func writeBenchFile(path string, scratch []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&scratch[0])), len(scratch)/8)
	for written := 0; written < benchFileSize; written += len(scratch) {
		for i := range words {
			words[i] = rng.Uint64()
		}
		if _, err := f.Write(scratch); err != nil {
			return err
		}
	}
	return f.Sync()
}

type benchReader struct {
	name string
	new  func() (Reader, error)
}

func benchReaders() []benchReader {
	var rs []benchReader
	for _, d := range []int{1, 8, 32, 64} {
		rs = append(rs, benchReader{fmt.Sprintf("io_uring-d%d", d), func() (Reader, error) { return NewUring(UringOptions{Depth: d}) }})
	}
	for _, w := range []int{1, 4, 16} {
		rs = append(rs, benchReader{fmt.Sprintf("pread-w%d", w), func() (Reader, error) { return NewPread(w), nil }})
	}
	return rs
}

func BenchmarkRead(b *testing.B) {
	for _, mode := range []string{"direct", "buffered"} {
		for _, size := range []int{1 << 20, 4 << 20} {
			for _, br := range benchReaders() {
				b.Run(fmt.Sprintf("%s/%dMiB/%s", mode, size>>20, br.name), func(b *testing.B) {
					benchRead(b, mode, size, br, 1)
				})
			}
		}
	}
}

// BenchmarkConcurrentCallers: 4 goroutines share one Reader, each reading its
// quarter of the file in batches of 16 requests of 1 MiB.
func BenchmarkConcurrentCallers(b *testing.B) {
	for _, mode := range []string{"direct", "buffered"} {
		for _, br := range []benchReader{
			{"io_uring-d64", func() (Reader, error) { return NewUring(UringOptions{Depth: 64}) }},
			{"pread-w16", func() (Reader, error) { return NewPread(16), nil }},
		} {
			b.Run(fmt.Sprintf("%s/1MiB/4callers/%s", mode, br.name), func(b *testing.B) {
				benchRead(b, mode, 1<<20, br, 4)
			})
		}
	}
}

func benchRead(b *testing.B, mode string, size int, br benchReader, callers int) {
	benchSetup(b)
	var f *os.File
	var err error
	if mode == "direct" {
		f, err = OpenDirect(bench.path)
	} else {
		f, err = os.Open(bench.path)
		bench.warmOnce.Do(func() { warm(b, f) })
	}
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r, err := br.new()
	if err != nil {
		b.Skip(err)
	}
	defer r.Close()
	fd := int(f.Fd())
	perCaller := benchBatchBytes / callers / size // requests per batch per caller
	if callers > 1 {
		perCaller = 16
	}
	part := benchFileSize / callers
	b.SetBytes(benchFileSize)
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				reqs := make([]*Request, perCaller)
				bufs := bench.buf[c*perCaller*size:]
				for i := range reqs {
					reqs[i] = &Request{Fd: fd, Buf: bufs[i*size : (i+1)*size]}
				}
				for off := c * part; off < (c+1)*part; off += perCaller * size {
					for i, q := range reqs {
						q.Off = int64(off + i*size)
					}
					if err := r.Read(context.Background(), reqs); err != nil {
						b.Error(err)
						return
					}
					for _, q := range reqs {
						if q.N != size {
							b.Errorf("short read at %d: %d", q.Off, q.N)
							return
						}
					}
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	// CPU time of the whole process (user+system, io_uring and io-wq kernel
	// threads included) per GiB read: what the reads cost the machine.
	b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(b.N), "cpu-ms/GiB")
}

func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// warm reads the file once so that buffered benchmarks measure the page cache.
func warm(b *testing.B, f *os.File) {
	buf := bench.buf
	for off := int64(0); off < benchFileSize; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
}
