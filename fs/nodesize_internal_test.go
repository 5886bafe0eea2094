package fs

import (
	"testing"
	"unsafe"
)

// TestFileNodeSize: a mount may know millions of files, so a file node
// stays in the 288-byte size class (docs/bench.md, "Node memory per known
// file"); a field added must make room for itself.
func TestFileNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(fileNode{}); n > 288 {
		t.Fatalf("fileNode is %d bytes, over the 288-byte size class it was kept in", n)
	}
}
