package chunkstore

import (
	"context"
	"errors"
	"testing"
)

// TestDropChunks: dropped chunks leave the index (reads say ErrNotLocal,
// so a cluster member fetches them), survive a reopen as dropped, and the
// next GC deletes the pack they leave empty; ids not stored are skipped.
func TestDropChunks(t *testing.T) {
	dir, src := t.TempDir(), t.TempDir()
	writeTree(t, src, map[string]int{"f": 3<<20 + 5}, 7)
	s := openTest(t, dir)
	ctx := context.Background()
	if _, err := s.Import(ctx, src, "d", ImportOptions{}); err != nil {
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
	var ids []ID
	var want int64
	for _, c := range m.Chunks {
		ids = append(ids, c.ID)
		want += int64(c.Len)
	}
	n, b, err := s.DropChunks(ctx, append(ids, Sum([]byte("never stored"))))
	if err != nil || n != len(ids) || b != want {
		t.Fatalf("DropChunks: %d chunks, %d bytes, %v; want %d, %d", n, b, err, len(ids), want)
	}
	for _, id := range ids {
		if s.HasChunk(id) {
			t.Fatalf("chunk %s still in the index", id.Short())
		}
		if _, err := s.ReadChunkUnverified(id); !errors.Is(err, ErrNotLocal) {
			t.Fatalf("read of a dropped chunk: %v, want ErrNotLocal", err)
		}
	}
	s.Close()
	s = openTest(t, dir)
	if s.HasChunk(ids[0]) {
		t.Fatal("a dropped chunk is back after a reopen")
	}
	res, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.PacksRemoved == 0 {
		t.Errorf("GC after the drop removed no pack: %+v", res)
	}
}

// TestDropChunksBusy: while an import runs, DropChunks drops nothing and
// says so, rather than waiting (and stalling every import behind it).
func TestDropChunksBusy(t *testing.T) {
	s := openTest(t, t.TempDir())
	im := s.NewImporter()
	id := Sum([]byte("x"))
	if err := im.PutChunk(id, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.DropChunks(context.Background(), []ID{id}); !errors.Is(err, ErrBusy) {
		t.Fatalf("DropChunks during an import: %v, want ErrBusy", err)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := s.DropChunks(context.Background(), []ID{id}); err != nil || n != 1 {
		t.Fatalf("DropChunks after the import: %d, %v", n, err)
	}
}
