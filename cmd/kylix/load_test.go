package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadReaderIOUring: `kylix load --reader io_uring` was refused once the
// store's own reader became the pread pool ("this store reads with pread"),
// which turned the GPU suite red. A load that asks for io_uring now gets a
// ring of its own. The host test device stands in for a GPU; --check copies
// every byte back and compares it with the store.
func TestLoadReaderIOUring(t *testing.T) {
	src := demo(t)
	data := t.TempDir()
	mustKylix(t, data, "import", filepath.Join(src, "base"), "models/base")
	r := kylix(t, data, "load", "--device", "host", "--check", "--reader", "io_uring", "--io", "direct", "models/base")
	if r.code != 0 {
		if strings.Contains(r.stderr, "io_uring is not available") {
			t.Skipf("io_uring unavailable on this machine: %s", r.stderr)
		}
		t.Fatalf("load --reader io_uring: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "read back and compared") {
		t.Fatalf("load --check did not compare the bytes:\n%s", r.stdout)
	}
}
