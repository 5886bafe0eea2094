package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestLeaseChunk: a stored chunk's span reads back its bytes (as
// ReadChunkUnverified does), a buffer of the wrong size is refused, a chunk
// not stored is ErrNotLocal, and the lease keeps a GC from deleting the
// pack of a dropped chunk until it is released.
func TestLeaseChunk(t *testing.T) {
	dir, src := t.TempDir(), t.TempDir()
	writeTree(t, src, map[string]int{"f": 3<<20 + 5}, 11)
	s := openTest(t, dir)
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "d", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(src, "f"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Lookup("d/f")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.FileManifest(e.ID)
	if err != nil {
		t.Fatal(err)
	}
	var off int
	var spans []ChunkSpan
	for _, c := range m.Chunks {
		sp, err := s.LeaseChunk(c.ID)
		if err != nil {
			t.Fatal(err)
		}
		spans = append(spans, sp)
		if sp.Len != c.Len || sp.ID != c.ID {
			t.Fatalf("span of %s: %d bytes, want %d", c.ID.Short(), sp.Len, c.Len)
		}
		buf := make([]byte, sp.Len)
		if err := sp.ReadInto(buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want[off:off+int(c.Len)]) {
			t.Fatalf("chunk %s: the span's bytes differ from the file's", c.ID.Short())
		}
		if err := sp.ReadInto(buf[1:]); err == nil {
			t.Fatal("ReadInto took a buffer shorter than the chunk")
		}
		off += int(c.Len)
	}
	if _, err := s.LeaseChunk(Sum([]byte("never stored"))); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("LeaseChunk of a chunk not stored: %v, want ErrNotLocal", err)
	}
	// Dropped and collected while leased: the pack stays readable.
	ids := make([]ID, len(m.Chunks))
	for i, c := range m.Chunks {
		ids[i] = c.ID
	}
	if _, _, err := s.DropChunks(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	sp := spans[0]
	buf := make([]byte, sp.Len)
	if err := sp.ReadInto(buf); err != nil || !bytes.Equal(buf, want[:sp.Len]) {
		t.Fatalf("a leased span after GC: %v", err)
	}
	path := sp.Path()
	for _, sp := range spans {
		sp.Release()
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("pack %s after the last lease of a collected pack: %v, want deleted", path, err)
	}
}
