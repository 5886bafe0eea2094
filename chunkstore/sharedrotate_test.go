package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestSharedPackRotationInOneImport: an import whose small files fill more
// than one shared pack must still sync the packs it filled (closing the
// old pack at rotation made its Flush fail with EBADF).
func TestSharedPackRotationInOneImport(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), SharedPackMax: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := t.TempDir()
	for i := range 40 {
		b := make([]byte, 8<<10)
		for k := range b {
			b[k] = byte(i*31 + k*7)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Import(context.Background(), src, "small", ImportOptions{}); err != nil {
		t.Fatalf("import across shared packs: %v", err)
	}
	rep, err := s.Verify(context.Background(), "", nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}
