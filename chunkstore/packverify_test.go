package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/internal/damage"
)

func importOne(t *testing.T, s *Store, data []byte, name string) (*File, PutResult) {
	t.Helper()
	p := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	im := s.NewImporter()
	put, err := im.PutFile(context.Background(), src, name, nil)
	if cerr := im.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.OpenFile(put.ID)
	if err != nil {
		t.Fatal(err)
	}
	return f, put
}

func TestOpenPassthroughRefusesFlippedPack(t *testing.T) {
	s := openTest(t, t.TempDir())
	data := randBytes(rand.New(rand.NewPCG(1, 2)), 5<<20)
	f, _ := importOne(t, s, data, "big")
	_, path, ok := f.PassthroughCandidate()
	if !ok {
		t.Fatal("a fresh large file has no whole-file pack")
	}
	ctx := context.Background()
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatalf("clean pack refused: %v", err)
	}
	pf.Close()
	if st := s.PackVerifyStats(); st.Verified != 1 || st.Bytes != int64(len(data)) {
		t.Fatalf("stats after the first open: %+v", st)
	}
	// A second open uses the record: no second hash.
	pf, err = s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	if st := s.PackVerifyStats(); st.Verified != 1 {
		t.Fatalf("second open hashed again: %+v", st)
	}
	damage.FlipByte(t, path, int64(len(data))-100)
	if _, err := s.OpenPassthrough(ctx, f); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped pack: err %v, want ErrCorrupt", err)
	}
	c, err := s.VerifyPack(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Bad) != 1 || !c.Bad[0].Indexed || c.Bad[0].FileOff > int64(len(data))-100 {
		t.Fatalf("bad chunks: %+v", c.Bad)
	}
}

func TestConcurrentFirstOpensShareOneCheck(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(3, 4)), 24<<20), "big")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pf, err := s.OpenPassthrough(context.Background(), f)
			if err == nil {
				pf.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := s.PackVerifyStats(); st.Verified+st.Failed != 1 {
		t.Fatalf("8 concurrent first opens made %d checks, want 1", st.Verified+st.Failed)
	}
}

func TestScrubMarksFlippedPackBad(t *testing.T) {
	s := openTest(t, t.TempDir())
	data := randBytes(rand.New(rand.NewPCG(5, 6)), 3<<20)
	f, _ := importOne(t, s, data, "big")
	ctx := context.Background()
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	rep, err := s.ScrubPacks(ctx, 0)
	if err != nil || rep.Packs != 1 || len(rep.Bad) != 0 {
		t.Fatalf("clean scrub: %+v %v", rep, err)
	}
	_, path, _ := f.PassthroughCandidate()
	damage.FlipByte(t, path, 12345)
	rep, err = s.ScrubPacks(ctx, 0)
	if err != nil || len(rep.Bad) != 1 {
		t.Fatalf("scrub missed the flip: %+v %v", rep, err)
	}
	checks := s.PackVerifyStats().Verified + s.PackVerifyStats().Failed
	// The open finds the scrub's verdict for this very identity.
	if _, err := s.OpenPassthrough(ctx, f); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open after a failed scrub: %v", err)
	}
	if n := s.PackVerifyStats().Verified + s.PackVerifyStats().Failed; n != checks {
		t.Fatalf("open re-hashed a pack the scrub had just judged")
	}
}

func TestScrubRateLimit(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(7, 8)), 4<<20), "big")
	ctx, cancel := context.WithCancel(context.Background())
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	// 1 byte/s: the first batch's pace never ends; cancel returns at once.
	done := make(chan error, 1)
	go func() { _, err := s.ScrubPacks(ctx, 1); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("rate-limited scrub: %v", err)
	}
}

// safetensorsWith builds a safetensors file from tensors (name -> bytes).
func safetensorsWith(t *testing.T, tensors [][]byte) []byte {
	t.Helper()
	var ts []safetensors.WriteTensor
	for i, d := range tensors {
		ts = append(ts, safetensors.WriteTensor{Name: "t" + string(rune('a'+i)), DType: safetensors.U8, Shape: []int64{int64(len(d))}, Data: d})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestDuplicatesStoredInPlace: a file with two identical 4 MiB tensors
// (10% of it) keeps a pack that is exactly the file, proven by the check.
func TestDuplicatesStoredInPlace(t *testing.T) {
	s := openTest(t, t.TempDir())
	r := rand.New(rand.NewPCG(9, 10))
	norm := randBytes(r, 4<<20)
	var tensors [][]byte
	tensors = append(tensors, norm)
	for range 8 {
		tensors = append(tensors, randBytes(r, 4<<20))
	}
	tensors = append(tensors, norm)
	data := safetensorsWith(t, tensors)
	f, put := importOne(t, s, data, "m.safetensors")
	if put.DupCopyBytes != 4<<20 {
		t.Fatalf("duplicate copy bytes %d, want %d (%+v)", put.DupCopyBytes, 4<<20, put)
	}
	_, path, ok := f.PassthroughCandidate()
	if !ok {
		t.Fatalf("no whole-file pack for a file with 10%% duplicates: extents %+v", f.Extents())
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the pack is not exactly the file (%d bytes, %v)", len(got), err)
	}
	ctx := context.Background()
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	// A flip in the second copy (not the indexed one): no passthrough,
	// and the daemon path still reads the file right from the first.
	last := chunkLocs(f)[len(f.M.Chunks)-1]
	if last.Loc.Off == last.FileOff {
		t.Fatalf("the duplicate's index entry points at its second copy")
	}
	damage.FlipByte(t, path, last.FileOff+7)
	if _, err := s.OpenPassthrough(ctx, f); !errors.Is(err, ErrNotWholeFile) {
		t.Fatalf("flipped second copy: %v, want ErrNotWholeFile", err)
	}
	f2, err := s.OpenFile(f.ID)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := f2.WriteTo(ctx, &buf, nil); err != nil || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("daemon read after a flip in the second copy: %v", err)
	}
}

// TestFinetuneStaysDeduplicated: a file sharing most tensors with one
// stored before is stored deduplicated, and its pack holds only its new
// bytes (the copies written before the share passed 10% are punched out).
func TestFinetuneStaysDeduplicated(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	r := rand.New(rand.NewPCG(11, 12))
	var base [][]byte
	for range 10 {
		base = append(base, randBytes(r, 4<<20))
	}
	importOne(t, s, safetensorsWith(t, base), "base.safetensors")
	ft := append([][]byte(nil), base...)
	ft[0] = randBytes(r, 4<<20) // one tensor changed
	ftData := safetensorsWith(t, ft)
	f, put := importOne(t, s, ftData, "ft.safetensors")
	if put.DupCopyBytes != 0 || put.NewBytes > 5<<20 {
		t.Fatalf("fine-tune stored %d new and %d copied bytes", put.NewBytes, put.DupCopyBytes)
	}
	if _, _, ok := f.PassthroughCandidate(); ok {
		// Its candidate could only be the base's pack, which differs.
		if _, err := s.OpenPassthrough(context.Background(), f); !errors.Is(err, ErrNotWholeFile) {
			t.Fatalf("fine-tune handed a pack for passthrough: %v", err)
		}
	}
	var buf bytes.Buffer
	if _, err := f.WriteTo(context.Background(), &buf, nil); err != nil || !bytes.Equal(buf.Bytes(), ftData) {
		t.Fatalf("fine-tune read back: %v", err)
	}
	// Disk use of the fine-tune's own pack (the one holding its changed
	// tensor): its new bytes; the copy of an unchanged tensor written
	// before the duplicates passed 10% is punched out.
	var ownPack uint64
	for _, l := range chunkLocs(f) {
		if l.FileOff > 0 && l.Loc.Pack != 0 {
			ownPack = l.Loc.Pack
			break
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(s.PackPath(ownPack), &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 5<<20 {
		t.Fatalf("fine-tune's pack uses %d bytes on disk; its new bytes are about 4 MiB", used)
	}
	if rep, err := s.Verify(context.Background(), "", nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestChecksPersistWithinOneBoot: a store reopened in the same boot trusts
// the checks of the last run for unchanged packs; after a reboot (another
// boot id) or a change of the pack, it checks again.
func TestChecksPersistWithinOneBoot(t *testing.T) {
	boot := filepath.Join(t.TempDir(), "boot_id")
	os.WriteFile(boot, []byte("boot-1\n"), 0o644)
	old := bootIDPath
	bootIDPath = boot
	t.Cleanup(func() { bootIDPath = old })

	dir := t.TempDir()
	ctx := context.Background()
	reopen := func() (*Store, *File) {
		s, err := Open(Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		f, _, err := s.OpenPath("big")
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		return s, f
	}
	s := openTest(t, dir)
	data := randBytes(rand.New(rand.NewPCG(13, 14)), 3<<20)
	src := filepath.Join(t.TempDir(), "big")
	os.WriteFile(src, data, 0o644)
	if _, err := s.Import(ctx, src, "big", ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	f, _, _ := s.OpenPath("big")
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	_, path, _ := f.PassthroughCandidate()
	s.Close()
	if fi, err := os.Stat(filepath.Join(dir, verifiedFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record of checked packs: %v %v", fi, err)
	}

	opens := func(wantChecks int64) {
		t.Helper()
		s, f := reopen()
		defer s.Close()
		pf, err := s.OpenPassthrough(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		pf.Close()
		if st := s.PackVerifyStats(); st.Verified != wantChecks {
			t.Fatalf("checks in this run: %d, want %d", st.Verified, wantChecks)
		}
	}
	opens(0) // same boot, unchanged pack: trusted
	os.WriteFile(boot, []byte("boot-2\n"), 0o644)
	opens(1) // rebooted: checked again
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	opens(1) // touched: checked again
	opens(0)
}

// TestRunScrubFindsFlip: the background scrub's first pass finds a pack
// flipped after its check, and stops when its context ends.
func TestRunScrubFindsFlip(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(15, 16)), 3<<20), "big")
	ctx, cancel := context.WithCancel(context.Background())
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	_, path, _ := f.PassthroughCandidate()
	damage.FlipByte(t, path, 77)
	stopped := make(chan struct{})
	go func() { s.RunScrub(ctx, 1<<30); close(stopped) }()
	deadline := time.Now().Add(20 * time.Second)
	for s.PackVerifyStats().ScrubFailed == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the scrub did not find the flipped pack: %+v", s.PackVerifyStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-stopped
	if _, err := s.OpenPassthrough(context.Background(), f); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open after the scrub failed the pack: %v", err)
	}
}

// TestVerityProbe: the probe says no where the kernel has no fs-verity for
// ext4 (our machines) and leaves nothing behind either way.
func TestVerityProbe(t *testing.T) {
	dir := t.TempDir()
	err := ProbeVerity(dir)
	var fsType syscall.Statfs_t
	syscall.Statfs(dir, &fsType)
	const ext4Magic = 0xef53
	if _, ferr := os.Stat("/sys/fs/ext4/features/verity"); fsType.Type == ext4Magic && ferr != nil && err == nil {
		t.Fatal("probe claims fs-verity on ext4 without the kernel feature")
	}
	t.Logf("fs-verity in %s: %v", dir, err)
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("probe left %v", ents)
	}
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(17, 18)), 2<<20), "big")
	pf, err := s.OpenPassthrough(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	_, path, _ := f.PassthroughCandidate()
	if HasVerity(path) != (s.VerityStatus() == nil) {
		t.Fatalf("pack sealed: %v, probe: %v", HasVerity(path), s.VerityStatus())
	}
}

// TestCheckLogAppendsAndRewrites: the record grows by one line per check,
// a failed check cancels a pass across a restart, a torn last line is
// skipped and the next check rewrites the record whole.
func TestCheckLogAppendsAndRewrites(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	ctx := context.Background()
	var files []*File
	for i := range 3 {
		f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(uint64(20+i), 1)), 2<<20), "f")
		files = append(files, f)
		pf, err := s.OpenPassthrough(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		pf.Close()
	}
	log := filepath.Join(dir, verifiedFile)
	b, _ := os.ReadFile(log)
	if n := bytes.Count(b, []byte("\n")); n != 4 {
		t.Fatalf("record has %d lines, want a header and 3 checks:\n%s", n, b)
	}
	_, path, _ := files[1].PassthroughCandidate()
	damage.FlipByte(t, path, 99)
	if _, err := s.OpenPassthrough(ctx, files[1]); !errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
	// A crash tore a line being appended.
	f, _ := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"pack":`)
	f.Close()
	s.Close()
	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i, f := range files {
		f2, err := s2.OpenFile(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		_, c, _ := s2.PackState(f2)
		if trusted := c != nil && c.OK(); trusted != (i != 1) {
			t.Fatalf("file %d: trusted after restart = %v", i, trusted)
		}
	}
	// The next check rewrites the torn record whole.
	damage.FlipByte(t, path, 99) // flipped back: the pack is right again
	f1, _ := s2.OpenFile(files[1].ID)
	pf, err := s2.OpenPassthrough(ctx, f1)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	b, _ = os.ReadFile(log)
	if n := bytes.Count(b, []byte("\n")); n != 4 || !bytes.HasSuffix(b, []byte("\n")) {
		t.Fatalf("record after the rewrite:\n%s", b)
	}
}

// TestPackChangedDuringCheck: a pack whose identity moves while it is
// hashed is checked again; one that keeps moving is refused, and not as
// "not the whole file" (it may be, once it holds still).
func TestPackChangedDuringCheck(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, _ := importOne(t, s, randBytes(rand.New(rand.NewPCG(19, 20)), 2<<20), "big")
	touches := 0
	checkedHook = func(path string) {
		if touches > 0 {
			touches--
			later := time.Now().Add(time.Duration(touches+1) * time.Hour)
			os.Chtimes(path, later, later)
		}
	}
	t.Cleanup(func() { checkedHook = nil })
	ctx := context.Background()
	touches = 1
	pf, err := s.OpenPassthrough(ctx, f)
	if err != nil {
		t.Fatalf("a pack that moved once: %v", err)
	}
	pf.Close()
	if st := s.PackVerifyStats(); st.Verified != 1 {
		t.Fatalf("checks: %+v", st)
	}
	_, path, _ := f.PassthroughCandidate()
	later := time.Now().Add(10 * time.Hour)
	os.Chtimes(path, later, later)
	touches = 100
	_, err = s.OpenPassthrough(ctx, f)
	if err == nil || errors.Is(err, ErrNotWholeFile) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("a pack that keeps moving: %v", err)
	}
	if touches != 98 {
		t.Fatalf("%d checks of a moving pack, want 2", 100-touches)
	}
}

type chunkLoc struct {
	FileOff int64
	Loc     Location
}

// chunkLocs lists each chunk's file offset and indexed location.
func chunkLocs(f *File) []chunkLoc {
	out := make([]chunkLoc, len(f.M.Chunks))
	for i := range out {
		out[i] = chunkLoc{f.offs[i], f.locs[i]}
	}
	return out
}
