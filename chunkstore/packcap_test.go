package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// openFds counts this process's open descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(des)
}

// TestOpenPacksCapped: reading 40 files, each in a pack of its own, keeps
// at most the cap (8 here) of pack descriptors open: idle packs are closed
// least recently used first. A pack leased all along is never closed
// under its reader: its descriptor still names the pack file and reads
// it, and leasing a pack again after it was closed reopens it.
func TestOpenPacksCapped(t *testing.T) {
	const files, limit = 40, 8
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, IO: "pread", CacheBytes: 1 << 20, LargeFileMin: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetMaxOpenPacks(limit)
	src := t.TempDir()
	data := map[string][]byte{}
	for i := range files {
		name := fmt.Sprintf("f%02d", i)
		b := make([]byte, 8192+i)
		for j := range b {
			b[j] = byte(i*7 + j)
		}
		data[name] = b
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Import(context.Background(), src, "d", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	first := mustOpen(t, s, "d/f00")
	held, err := s.Lease(first.Extents()[0].Pack)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	base := openFds(t)
	packs := map[uint64]bool{}
	for i := range files {
		name := fmt.Sprintf("d/f%02d", i)
		f := mustOpen(t, s, name)
		packs[f.Extents()[0].Pack] = true
		buf := make([]byte, f.Size())
		if _, err := f.ReadAt(buf, 0); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(buf) != string(data[name[2:]]) {
			t.Fatalf("%s: wrong bytes", name)
		}
		for _, c := range f.M.Chunks {
			s.cache.remove(c.ID) // the next pass reads the pack again
		}
		if n := openFds(t); n > base+limit {
			t.Fatalf("after reading %d files in %d packs: %d descriptors open, %d before (cap %d)", i+1, len(packs), n, base, limit)
		}
	}
	if len(packs) != files {
		t.Fatalf("%d packs for %d files: want one each", len(packs), files)
	}
	// The leased pack's descriptor was not closed (nor reused).
	var a, b unix.Stat_t
	if err := unix.Fstat(held.Fd(), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(held.Path(), &b); err != nil || a.Ino != b.Ino || a.Dev != b.Dev {
		t.Fatalf("the leased pack's fd no longer names its file (%v)", err)
	}
	buf := make([]byte, 100)
	if _, err := unix.Pread(held.Fd(), buf, 0); err != nil || string(buf) != string(data["f00"][:100]) {
		t.Fatalf("reading the leased pack: %v", err)
	}
	// Packs closed for the cap are reopened on demand.
	for i := range files {
		name := fmt.Sprintf("d/f%02d", i)
		f := mustOpen(t, s, name)
		buf := make([]byte, f.Size())
		if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != string(data[name[2:]]) {
			t.Fatalf("%s again: %v", name, err)
		}
	}
	if n := openFds(t); n > base+limit {
		t.Fatalf("after the second pass: %d descriptors open, %d before (cap %d)", n, base, limit)
	}
}
