package fs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
)

// BenchmarkWriteSmallFiles writes 16 KiB files through the mount (open,
// one write, close) and waits for their commits: what space accounting
// adds to each write and close (docs/bench.md, "Space accounting").
func BenchmarkWriteSmallFiles(b *testing.B) {
	m := fstest.Mount(b, kfs.Options{})
	data := pattern(1, 16<<10)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := os.WriteFile(filepath.Join(m.Dir, fmt.Sprintf("f%07d", i)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.FS.Sync(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWriteLarge writes one 64 MiB file in 1 MiB writes per iteration
// and waits for its commit.
func BenchmarkWriteLarge(b *testing.B) {
	m := fstest.Mount(b, kfs.Options{})
	chunk := pattern(2, 1<<20)
	b.SetBytes(64 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Create(filepath.Join(m.Dir, fmt.Sprintf("big%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 64; j++ {
			chunk[0] = byte(i)
			chunk[1] = byte(j) // no two writes dedup
			if _, err := f.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.FS.Sync(); err != nil {
		b.Fatal(err)
	}
}
