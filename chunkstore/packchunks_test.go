package chunkstore

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/kylix/kylix/internal/damage"
)

// TestOpenCheckedChunks: a small file in a shared pack is handed out after
// its chunks hash; the record spares a second hash; a flipped byte in one
// of its chunks (a changed pack) is ErrCorrupt, while a flip in another
// file's chunk of the same pack does not concern it.
func TestOpenCheckedChunks(t *testing.T) {
	s := openTest(t, t.TempDir())
	r := rand.New(rand.NewPCG(5, 6))
	a, b := randBytes(r, 5000), randBytes(r, 7000)
	// Small files go to the store's current shared pack.
	fa, _ := importOne(t, s, a, "a")
	fb, _ := importOne(t, s, b, "b")
	ea, eb := fa.Extents(), fb.Extents()
	if len(ea) != 1 || len(eb) != 1 || ea[0].Pack == 0 {
		t.Fatalf("extents %+v %+v", ea, eb)
	}
	ctx := context.Background()
	pf, err := s.OpenCheckedChunks(ctx, fa, ea[0].Pack)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(a))
	if _, err := pf.ReadAt(got, ea[0].PackOff); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	pf.Close()
	if string(got) != string(a) {
		t.Fatal("the pack fd does not read the file's bytes at its offset")
	}
	before := s.PackVerifyStats().Bytes
	pf, err = s.OpenCheckedChunks(ctx, fa, ea[0].Pack)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	if s.PackVerifyStats().Bytes != before {
		t.Fatal("an unchanged pack was hashed again")
	}
	if eb[0].Pack != ea[0].Pack {
		t.Fatalf("the two small files are in packs %d and %d, not one", ea[0].Pack, eb[0].Pack)
	}
	{
		damage.FlipByte(t, eb[0].PackPath, eb[0].PackOff+10)
		pf, err := s.OpenCheckedChunks(ctx, fa, ea[0].Pack)
		if err != nil {
			t.Fatalf("a flip in another file's chunk: %v", err)
		}
		pf.Close()
	}
	damage.FlipByte(t, ea[0].PackPath, ea[0].PackOff+100)
	if _, err := s.OpenCheckedChunks(ctx, fa, ea[0].Pack); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped chunk: %v, want ErrCorrupt", err)
	}
}
