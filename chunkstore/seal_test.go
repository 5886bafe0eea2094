package chunkstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// putBytes stores b as one file (one Importer, closed) and returns it.
func putBytes(t testing.TB, s *Store, b []byte) *File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	im := s.NewImporter()
	r, err := im.PutFile(context.Background(), f, "f", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	sf, err := s.OpenFile(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sf
}

func rnd(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, ^seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func onlyPack(t testing.TB, f *File) uint64 {
	t.Helper()
	ex := f.Extents()
	if len(ex) != 1 || ex[0].Pack == 0 {
		t.Fatalf("extents %+v: want one, in a pack", ex)
	}
	return ex[0].Pack
}

// TestSealForHandout: once the current shared pack is sealed for a
// hand-out, the next small file lands in a new pack and the sealed pack's
// file does not change; a second hand-out of the current pack within
// SealInterval is refused (ErrPackOpen), and allowed once it has passed;
// a pack that is not the current one needs no rotation.
func TestSealForHandout(t *testing.T) {
	now := time.Unix(1e9, 0)
	s, err := Open(Options{Dir: t.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := putBytes(t, s, rnd(5000, 1))
	pa := onlyPack(t, a)
	before, err := os.Stat(s.PackPath(pa))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SealForHandout(pa); err != nil {
		t.Fatalf("seal the current shared pack: %v", err)
	}
	b := putBytes(t, s, rnd(6000, 2))
	pb := onlyPack(t, b)
	if pb == pa {
		t.Fatalf("a small file imported after the hand-out of pack %d was appended to it", pa)
	}
	after, err := os.Stat(s.PackPath(pa))
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("sealed pack changed: %d -> %d bytes", before.Size(), after.Size())
	}
	// Sealing a pack that takes no appends is free and always allowed.
	if err := s.SealForHandout(pa); err != nil {
		t.Fatal(err)
	}
	// The new current pack, within the interval: refused, not rotated.
	if err := s.SealForHandout(pb); !errors.Is(err, ErrPackOpen) {
		t.Fatalf("second rotation within SealInterval: %v, want ErrPackOpen", err)
	}
	if c := putBytes(t, s, rnd(7000, 3)); onlyPack(t, c) != pb {
		t.Fatalf("a refused hand-out rotated the pack")
	}
	now = now.Add(DefaultSealInterval)
	if err := s.SealForHandout(pb); err != nil {
		t.Fatalf("after SealInterval: %v", err)
	}
	if d := putBytes(t, s, rnd(8000, 4)); onlyPack(t, d) == pb {
		t.Fatalf("appended to pack %d after its hand-out", pb)
	}
	if sealed, refused := s.SealStats(); sealed != 2 || refused != 1 {
		t.Fatalf("SealStats = %d, %d; want 2, 1", sealed, refused)
	}
}

// TestSealForHandoutAcrossRestart: a new run of the store never appends to
// a pack of an earlier run (whose fds may still be out: clients keep them
// across a node restart), sealed or not.
func TestSealForHandoutAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	pa := onlyPack(t, putBytes(t, s, rnd(5000, 5)))
	s.Close()
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if pb := onlyPack(t, putBytes(t, s, rnd(5000, 6))); pb == pa {
		t.Fatalf("a new run appended to pack %d of the previous run", pa)
	}
}

// TestSealUnderMixedLoad: every small file imported is handed out at once
// (the worst case: each import followed by a PACKS for it). The interval
// bounds the packs made: at most one rotation per SealInterval, not one
// pack per file; the log gives the import rate with and without sealing.
func TestSealUnderMixedLoad(t *testing.T) {
	const files = 150
	run := func(seal bool) (packs int, el time.Duration) {
		s, err := Open(Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		seen := map[uint64]bool{}
		start := time.Now()
		for i := range files {
			p := onlyPack(t, putBytes(t, s, rnd(4000+i, uint64(100+i))))
			seen[p] = true
			if seal {
				s.SealForHandout(p)
			}
		}
		return len(seen), time.Since(start)
	}
	np, nt := run(false)
	sp, st := run(true)
	t.Logf("%d small files, each imported with its own Importer: no hand-outs %d pack(s) in %v; each handed out at once %d pack(s) in %v",
		files, np, nt, sp, st)
	if bound := 2 + int(st/DefaultSealInterval); sp > bound {
		t.Fatalf("%d packs for %d files in %v: more than one rotation per %v", sp, files, st, DefaultSealInterval)
	}
}

// TestDroppedCopiesAreZero: a large file's in-place duplicate copies,
// dropped once its duplicates pass DupInPlaceMaxPercent, are punched out
// and the partial blocks at their ends zeroed: every byte of its pack
// outside what the index names there is zero, so the pack can be handed
// out as shared to a reader of a file with chunks in it
// (docs/design/client.md). Before, the ends of each copy stayed.
func TestDroppedCopiesAreZero(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	im := s.NewImporter()
	e := &exclusiveSink{im: im, size: 1 << 20}
	var named [][2]int64
	write := func(b []byte) {
		off := int64(0)
		if e.w != nil {
			off = e.w.off
		}
		if err := e.write(Sum(b), b); err != nil {
			t.Fatal(err)
		}
		named = append(named, [2]int64{off, off + int64(len(b))})
	}
	write(rnd(10000, 1))
	for i := range 6 { // 6 x 7000 bytes of copies, back to back, unaligned
		if err := e.dup(rnd(7000, uint64(10+i))); err != nil {
			t.Fatal(err)
		}
	}
	write(rnd(5000, 2))
	if err := e.dup(rnd(3000, 3)); err != nil {
		t.Fatal(err)
	}
	write(rnd(9000, 4))
	if err := e.dup(rnd(60000, 5)); err != nil { // past 10%: copies dropped
		t.Fatal(err)
	}
	if !e.dedup {
		t.Fatal("duplicates past DupInPlaceMaxPercent did not turn deduplication on")
	}
	write(rnd(4000, 6))
	if err := e.finish(); err != nil {
		t.Fatal(err)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.PackPath(e.pack))
	if err != nil {
		t.Fatal(err)
	}
	in := func(i int64) bool {
		for _, r := range named {
			if i >= r[0] && i < r[1] {
				return true
			}
		}
		return false
	}
	for i, c := range b {
		if !in(int64(i)) && c != 0 {
			t.Fatalf("pack byte %d is %#x and belongs to no chunk the index places there (a dropped duplicate copy)", i, c)
		}
	}
}
