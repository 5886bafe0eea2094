package chunkstore

import (
	"context"
	"testing"
)

// TestFileLocal: a file is local while the index holds every chunk, and
// not once one was dropped (it would be fetched from a peer).
func TestFileLocal(t *testing.T) {
	s, _, _, _ := faultStore(t, map[string]int{"a": 3 << 20}, Options{})
	f := mustOpen(t, s, "m/a")
	if !f.Local() {
		t.Fatal("a file just imported is not local")
	}
	if n, _, err := s.DropChunks(context.Background(), []ID{f.M.Chunks[len(f.M.Chunks)-1].ID}); err != nil || n != 1 {
		t.Fatalf("drop: %d %v", n, err)
	}
	if g := mustOpen(t, s, "m/a"); g.Local() {
		t.Fatal("a file with a dropped chunk is local")
	}
}
