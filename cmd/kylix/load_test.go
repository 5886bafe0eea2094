package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadReaderIOUring: `kylix load --reader io_uring` was refused ("this
// store reads with pread") once the store's own reader became pread, which
// failed the GPU suite (issue 7, finding 8). The load brings its own ring.
func TestLoadReaderIOUring(t *testing.T) {
	data := t.TempDir()
	src := filepath.Join(t.TempDir(), "w.bin")
	b := make([]byte, 3<<20)
	for i := range b {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	mustKylix(t, data, "import", src, "w.bin")
	r := kylix(t, data, "load", "--device", "host", "--reader", "io_uring", "--io", "buffered", "--check", "w.bin")
	if r.code != 0 {
		if strings.Contains(r.stderr, "not available on this system") {
			t.Skipf("io_uring unavailable here: %s", r.stderr)
		}
		t.Fatalf("load --reader io_uring: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
