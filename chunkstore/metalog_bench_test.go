package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Costs of the metadata log (docs/design/index.md, docs/bench.md): every
// commit appends a frame and fdatasyncs it before the index transaction, and
// every new pack first logs an intent. These benchmarks use only the public
// API, so the same file measures the code before the log.

// BenchmarkStoreImportSmallFile: one import of one 4 KiB file (one pack
// flush and one namespace commit), the worst case per byte.
func BenchmarkStoreImportSmallFile(b *testing.B) {
	src := b.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), make([]byte, 4096), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := Open(Options{Dir: b.TempDir(), IO: "pread"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.SetBytes(4096)
	i := 0
	for b.Loop() {
		// Different bytes each time, so every import writes a chunk.
		data := make([]byte, 4096)
		copy(data, fmt.Sprint(i))
		os.WriteFile(filepath.Join(src, "f"), data, 0o644)
		if _, err := s.Import(context.Background(), filepath.Join(src, "f"), fmt.Sprintf("f%d", i), ImportOptions{}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkStoreImportLargeFiles: one import of 16 files of 8 MiB (each its
// own exclusive pack: an intent, a pack sync, a log frame per file).
func BenchmarkStoreImportLargeFiles(b *testing.B) {
	src := b.TempDir()
	for f := range 16 {
		data := make([]byte, 8<<20)
		for i := range data {
			data[i] = byte(i*7 + f*13 + i>>12)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(f)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(16 * 8 << 20)
	for b.Loop() {
		b.StopTimer()
		s, err := Open(Options{Dir: b.TempDir(), IO: "pread"})
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

// BenchmarkOpenIndex100k: opening a store whose index holds 100 000 chunk
// records (400 GiB of 4 MiB chunks); Open reads every record once to find a
// damaged page before a reader does.
func BenchmarkOpenIndex100k(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(Options{Dir: dir, IO: "pread"})
	if err != nil {
		b.Fatal(err)
	}
	fillIndex(b, s, 100000)
	s.Close()
	for b.Loop() {
		s, err := Open(Options{Dir: dir, IO: "pread"})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
