package fs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/internal/fstest"
	"github.com/kylix/kylix/fs/layout"
)

// manyTensors returns a safetensors file of n small tensors: the store cuts
// one chunk per tensor, so the file has more chunks than one
// KYLIX_IOC_CHUNKS call can carry.
func manyTensors(t *testing.T, n int) []byte {
	t.Helper()
	var ts []safetensors.WriteTensor
	for i := range n {
		size := 4096 + 37*i
		ts = append(ts, safetensors.WriteTensor{Name: fmt.Sprintf("t%04d", i), DType: safetensors.U8,
			Shape: []int64{int64(size)}, Data: pattern(uint64(100+i), size)})
	}
	var b bytes.Buffer
	if err := safetensors.Write(&b, ts, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func openRO(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// checkChunks lists every chunk of fd (totals first, then pages) and
// checks each against the file's bytes: a local chunk's bytes, read from
// its pack by the path KYLIX_IOC_PACK gives, hash to its id and equal the
// file's bytes at its offset. It returns the reply and the pack table.
func checkChunks(t *testing.T, fd int, data []byte) (layout.ChunksReply, map[uint32]layout.PackInfo) {
	t.Helper()
	all, err := layout.AllChunks(fd)
	if err != nil {
		t.Fatal(err)
	}
	if all.FileSize != uint64(len(data)) || uint64(len(all.Entries)) != all.NChunks || all.NChunks == 0 {
		t.Fatalf("size %d, %d chunks, %d entries; want size %d", all.FileSize, all.NChunks, len(all.Entries), len(data))
	}
	packs := map[uint32]layout.PackInfo{}
	files := map[uint32]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var off uint64
	for i, c := range all.Entries {
		if c.FileOffset != off {
			t.Fatalf("chunk %d at %d, want %d", i, c.FileOffset, off)
		}
		off += uint64(c.Length)
		want := data[c.FileOffset : c.FileOffset+uint64(c.Length)]
		if chunkstore.Sum(want) != chunkstore.ID(c.ID) {
			t.Fatalf("chunk %d: id %x is not the hash of the file's bytes", i, c.ID[:6])
		}
		if !c.Local() {
			t.Fatalf("chunk %d is not local", i)
		}
		p, ok := packs[c.PackIndex]
		if !ok {
			if p, err = layout.Pack(fd, c.PackIndex); err != nil {
				t.Fatalf("pack %d: %v", c.PackIndex, err)
			}
			if c.PackIndex >= p.NPacks {
				t.Fatalf("pack index %d of %d", c.PackIndex, p.NPacks)
			}
			packs[c.PackIndex] = p
			if files[c.PackIndex], err = os.Open(p.Path); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(files[c.PackIndex].Fd()), &st); err != nil {
				t.Fatal(err)
			}
			if g := layout.Generation(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()); g != p.Generation || uint64(st.Size) != p.Size {
				t.Fatalf("pack %d: generation %x size %d from fstat, node says %x size %d", c.PackIndex, g, st.Size, p.Generation, p.Size)
			}
		}
		got := make([]byte, c.Length)
		if _, err := files[c.PackIndex].ReadAt(got, int64(c.PackOffset)); err != nil {
			t.Fatalf("chunk %d: read pack %s at %d: %v", i, p.Path, c.PackOffset, err)
		}
		if chunkstore.Sum(got) != chunkstore.ID(c.ID) || !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: pack bytes differ from the file's", i)
		}
	}
	return all, packs
}

// TestIoctlV2Chunks: every chunk entry of every kind of file (a pack of its
// own, a shared pack, chunks shared with another file, more chunks than a
// page holds) reads back from its pack, hashes to its id and equals the
// file's bytes; paging by any page size gives the same list.
func TestIoctlV2Chunks(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	base := pattern(21, 6<<20+99)
	many := manyTensors(t, 300)
	importTree(t, m, "a", map[string][]byte{"w.bin": base, "s.bin": pattern(22, 5000), "many.safetensors": many})
	dedup := append(append([]byte{}, base[:3<<20]...), pattern(23, 2<<20+1)...)
	importTree(t, m, "b", map[string][]byte{"d.bin": dedup})
	for _, c := range []struct {
		path  string
		data  []byte
		whole bool
	}{{"a/w.bin", base, true}, {"a/s.bin", pattern(22, 5000), false}, {"b/d.bin", dedup, false}, {"a/many.safetensors", many, true}} {
		t.Run(c.path, func(t *testing.T) {
			fd := openRO(t, filepath.Join(m.Dir, c.path))
			all, packs := checkChunks(t, fd, c.data)
			t.Logf("%d chunks in %d packs", all.NChunks, len(packs))
			for i, p := range packs {
				if (p.Flags&layout.PackWholeFile != 0) != c.whole {
					t.Errorf("pack %d flags %#x, whole-file should be %v", i, p.Flags, c.whole)
				}
			}
			if c.path == "b/d.bin" && len(packs) < 2 {
				t.Errorf("the dedup file uses %d packs, want its base's and its own", len(packs))
			}
			if c.path == "a/many.safetensors" && all.NChunks <= layout.MaxChunkEntries {
				t.Fatalf("only %d chunks: paging is not exercised", all.NChunks)
			}
			// Other page sizes give the same entries.
			for _, page := range []uint32{1, 7, layout.MaxChunkEntries - 1} {
				var got []layout.Chunk
				for uint64(len(got)) < all.NChunks {
					rep, err := layout.Chunks(fd, uint64(len(got)), page)
					if err != nil {
						t.Fatal(err)
					}
					if want := min(uint64(page), all.NChunks-uint64(len(got))); uint64(len(rep.Entries)) != want || rep.FileID != all.FileID {
						t.Fatalf("page %d at %d: %d entries, want %d", page, len(got), len(rep.Entries), want)
					}
					got = append(got, rep.Entries...)
					if page == 1 && len(got) > 20 {
						break
					}
				}
				for i := range got {
					if got[i] != all.Entries[i] {
						t.Fatalf("page size %d: entry %d %+v, want %+v", page, i, got[i], all.Entries[i])
					}
				}
			}
			// The end is a valid place to ask from; past it is not.
			if rep, err := layout.Chunks(fd, all.NChunks, 3); err != nil || len(rep.Entries) != 0 {
				t.Errorf("from the end: %+v %v", rep, err)
			}
			if _, err := layout.Chunks(fd, all.NChunks+1, 3); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("past the end: %v, want EINVAL", err)
			}
			if _, err := layout.Pack(fd, uint32(len(packs))); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("pack index past the table: %v, want EINVAL", err)
			}
			// v1 still answers.
			if rep, err := layout.Query(fd, 0, 0); err != nil || rep.FileSize != uint64(len(c.data)) {
				t.Errorf("v1 layout: %+v %v", rep, err)
			}
		})
	}
}

// TestIoctlV2Generation: the generation changes when the pack file is
// touched, and the pack-checked flag, set once the passthrough check has
// hashed the pack, no longer applies to the changed file.
func TestIoctlV2Generation(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	data := pattern(31, 3<<20+5)
	importTree(t, m, "g", map[string][]byte{"f.bin": data})
	fd := openRO(t, filepath.Join(m.Dir, "g/f.bin"))
	// The passthrough pack check (which a passthrough open runs) hashes
	// the pack whole and records the state it hashed.
	sf, _, err := m.Store.OpenPath("g/f.bin")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := m.Store.VerifyPack(context.Background(), sf); err != nil || !c.OK() {
		t.Fatalf("pack check: %+v %v", c, err)
	}
	p1, err := layout.Pack(fd, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p1.NPacks != 1 || p1.Flags != layout.PackWholeFile|layout.PackChecked || p1.Size != uint64(len(data)) {
		t.Fatalf("before: %+v, want one whole-file checked pack of %d bytes", p1, len(data))
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p1.Path, later, later); err != nil {
		t.Fatal(err)
	}
	p2, err := layout.Pack(fd, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Generation == p1.Generation {
		t.Fatalf("generation %x unchanged after the pack was touched", p1.Generation)
	}
	if p2.Flags&layout.PackChecked != 0 {
		t.Errorf("flags %#x after the pack changed: the check was of the old state", p2.Flags)
	}
	var st unix.Stat_t
	if err := unix.Stat(p2.Path, &st); err != nil {
		t.Fatal(err)
	}
	if g := layout.Generation(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()); g != p2.Generation {
		t.Errorf("generation %x, stat gives %x", p2.Generation, g)
	}
}

// TestIoctlV2Probe: PROBE answers on a read-only open, a directory and a
// file being written, with the node's pid and client socket; a file
// elsewhere answers ENOTTY. The other v2 ioctls say EBUSY while a file is
// being written.
func TestIoctlV2Probe(t *testing.T) {
	const sock = "/run/kylix/test-mount.sock"
	m := fstest.Mount(t, kfs.Options{ClientSocket: sock})
	importTree(t, m, "p", map[string][]byte{"f.bin": pattern(41, 10000)})
	check := func(what string, fd int) {
		p, err := layout.ProbeFD(fd)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if p.Version != layout.Version2 || p.NodePID != uint64(os.Getpid()) || p.ClientSocket != sock {
			t.Errorf("%s: %+v", what, p)
		}
	}
	check("read-only file", openRO(t, filepath.Join(m.Dir, "p/f.bin")))
	check("directory", openRO(t, filepath.Join(m.Dir, "p")))
	check("root", openRO(t, m.Dir))

	w, err := os.OpenFile(filepath.Join(m.Dir, "p/new.bin"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(pattern(42, 5000)); err != nil {
		t.Fatal(err)
	}
	wfd := int(w.Fd())
	check("file being written", wfd)
	if _, err := layout.Chunks(wfd, 0, 0); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("chunks of a file being written: %v, want EBUSY", err)
	}
	if _, err := layout.Pack(wfd, 0); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("pack of a file being written: %v, want EBUSY", err)
	}
	if err := layout.MakeLocal(wfd, 0, 0); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("make local of a file being written: %v, want EBUSY", err)
	}

	other := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(other, []byte("not kylix"), 0o644); err != nil {
		t.Fatal(err)
	}
	ofd := openRO(t, other)
	if _, err := layout.ProbeFD(ofd); !errors.Is(err, syscall.ENOTTY) {
		t.Errorf("probe of a file elsewhere: %v, want ENOTTY", err)
	}
	if layout.IsKylix(ofd) {
		t.Error("a plain file is Kylix")
	}
}

// TestIoctlV2MakeLocal: a range whose chunks are stored answers 0; a file
// whose pack was moved away answers EIO, and its chunks are listed as not
// local.
func TestIoctlV2MakeLocal(t *testing.T) {
	fstest.RequireFUSE(t)
	data := t.TempDir()
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	keep, lose := pattern(51, 2<<20+3), pattern(52, 2<<20+7)
	for name, b := range map[string][]byte{"keep": keep, "lose": lose} {
		src := filepath.Join(t.TempDir(), name+".bin")
		if err := os.WriteFile(src, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Import(context.Background(), src, name+".bin", chunkstore.ImportOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sf, _, err := s.OpenPath("lose.bin")
	if err != nil {
		t.Fatal(err)
	}
	ex := sf.Extents()
	if len(ex) != 1 || ex[0].Pack == 0 {
		t.Fatalf("lose.bin extents %+v, want one pack of its own", ex)
	}
	packPath := ex[0].PackPath
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(packPath, packPath+".away"); err != nil {
		t.Fatal(err)
	}
	m := fstest.MountStore(t, data, kfs.Options{})

	kfd := openRO(t, filepath.Join(m.Dir, "keep.bin"))
	for _, r := range [][2]uint64{{0, 0}, {10, 100}, {uint64(len(keep)), 0}, {5, 1 << 40}} {
		if err := layout.MakeLocal(kfd, r[0], r[1]); err != nil {
			t.Errorf("make local %v of a stored file: %v", r, err)
		}
	}
	if err := layout.MakeLocal(kfd, uint64(len(keep))+1, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("make local past the end: %v, want EINVAL", err)
	}

	lfd := openRO(t, filepath.Join(m.Dir, "lose.bin"))
	if err := layout.MakeLocal(lfd, 0, 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("make local of a file whose pack is gone: %v, want EIO", err)
	}
	all, err := layout.AllChunks(lfd)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range all.Entries {
		if c.Local() || c.PackIndex != layout.NoPack || c.PackOffset != 0 {
			t.Fatalf("chunk %d of a file whose pack is gone: %+v", i, c)
		}
		if chunkstore.Sum(lose[c.FileOffset:c.FileOffset+uint64(c.Length)]) != chunkstore.ID(c.ID) {
			t.Fatalf("chunk %d: wrong id", i)
		}
	}
	if _, err := layout.Pack(lfd, 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("pack gone from disk: %v, want ENOENT", err)
	}
}

// TestIoctlV2Garbage: malformed requests of every v2 ioctl get EINVAL
// (wrong magic, version, flags, non-zero output fields, a size that does
// not match _IOC_SIZE, a wrong direction), random buffers too; unknown
// commands get ENOTTY. The node survives all of it and still answers.
func TestIoctlV2Garbage(t *testing.T) {
	m := fstest.Mount(t, kfs.Options{})
	data := pattern(61, 1<<20+17)
	importTree(t, m, "x", map[string][]byte{"f.bin": data})
	fd := openRO(t, filepath.Join(m.Dir, "x/f.bin"))
	bad := func(what string, cmd uint32, b []byte) {
		t.Helper()
		if err := layout.Raw(fd, cmd, b); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v, want EINVAL", what, err)
		}
	}
	set := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	ioc := func(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | 'K'<<8 | nr }

	ch := layout.EncodeChunksRequest(layout.ChunksRequest{MaxEntries: 2})
	cmd := layout.CmdChunks(2)
	bad("chunks: magic", cmd, set(ch, 0, 'x'))
	bad("chunks: version", cmd, set(ch, 4, 1))
	bad("chunks: flags", cmd, set(ch, 6, 1))
	bad("chunks: n_entries", cmd, set(ch, 20, 1))
	bad("chunks: n_chunks", cmd, set(ch, 24, 1))
	bad("chunks: file_size", cmd, set(ch, 32, 1))
	bad("chunks: file_id", cmd, set(ch, 40, 1))
	bad("chunks: max_entries above _IOC_SIZE", cmd, set(ch, 16, 3))
	bad("chunks: max_entries below _IOC_SIZE", cmd, set(ch, 16, 1))
	big := layout.EncodeChunksRequest(layout.ChunksRequest{MaxEntries: 255})[:16383]
	bad("chunks: 255 entries", ioc(3, 4, 16383), big)
	bad("chunks: size not a whole entry", ioc(3, 4, uint32(len(ch)+8)), append(bytes.Clone(ch), make([]byte, 8)...))
	bad("chunks: short of the header", ioc(3, 4, 40), ch[:40])
	bad("chunks: read only", ioc(2, 4, uint32(len(ch))), bytes.Clone(ch))
	bad("chunks: write only", ioc(1, 4, uint32(len(ch))), bytes.Clone(ch))
	bad("chunks: first_chunk past the end", cmd, layout.EncodeChunksRequest(layout.ChunksRequest{FirstChunk: 1 << 40, MaxEntries: 2}))

	pk := layout.EncodePackRequest(0)
	bad("pack: magic", layout.CmdPack, set(pk, 2, 0))
	bad("pack: version", layout.CmdPack, set(pk, 4, 3))
	bad("pack: flags", layout.CmdPack, set(pk, 7, 0x80))
	bad("pack: n_packs", layout.CmdPack, set(pk, 12, 1))
	bad("pack: path", layout.CmdPack, set(pk, 4000, 'a'))
	bad("pack: index past the table", layout.CmdPack, layout.EncodePackRequest(1))
	bad("pack: index ~0", layout.CmdPack, layout.EncodePackRequest(layout.NoPack))
	bad("pack: wrong size", ioc(3, 5, 2048), pk[:2048])

	ml := layout.EncodeMakeLocal(layout.MakeLocalRequest{})
	bad("make local: magic", layout.CmdMakeLocal, set(ml, 0, 0))
	bad("make local: version", layout.CmdMakeLocal, set(ml, 4, 1))
	bad("make local: flags", layout.CmdMakeLocal, set(ml, 6, 1))
	bad("make local: offset past the end", layout.CmdMakeLocal, layout.EncodeMakeLocal(layout.MakeLocalRequest{Offset: uint64(len(data)) + 1}))
	bad("make local: overflow", layout.CmdMakeLocal, layout.EncodeMakeLocal(layout.MakeLocalRequest{Offset: 5, Length: ^uint64(0)}))
	bad("make local: wrong size", ioc(1, 6, 32), append(bytes.Clone(ml), make([]byte, 8)...))
	bad("make local: read-write", ioc(3, 6, 24), bytes.Clone(ml))

	bad("probe: wrong size", ioc(2, 3, 128), make([]byte, 128))
	bad("probe: write", ioc(3, 3, 256), make([]byte, 256))

	r := rand.New(rand.NewPCG(7, 7))
	fill := func(n int, header []byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(2) == 0 {
			copy(b, header[:8])
		}
		return b
	}
	for range 200 {
		n := uint32(r.IntN(layout.MaxChunkEntries + 1))
		b := fill(int(layout.ChunksSize(n)), ch)
		if r.IntN(2) == 0 {
			clear(b[8:20]) // first_chunk 0, max_entries 0: a header that passes up to there
		}
		bad("chunks: random", layout.CmdChunks(n), b)
		bad("pack: random", layout.CmdPack, fill(layout.PackSize, pk))
		bad("make local: random", layout.CmdMakeLocal, fill(layout.MakeLocalSize, ml))
	}

	for _, cmd := range []uint32{ioc(2, 7, 16), ioc(3, 0, 8), ioc(2, 200, 64), 3<<30 | 8<<16 | 'Z'<<8 | 4} {
		if err := layout.Raw(fd, cmd, make([]byte, 64)); !errors.Is(err, syscall.ENOTTY) {
			t.Errorf("unknown command %#x: %v, want ENOTTY", cmd, err)
		}
	}
	// Still answering, and right.
	checkChunks(t, fd, data)
}

// BenchmarkIoctlV2AllChunks: listing every chunk of a 4000-chunk file
// (the chunk count of a 16 GiB model at 4 MiB) through the mount, totals
// first then pages of 254, plus one KYLIX_IOC_PACK: what kylix_open pays.
func BenchmarkIoctlV2AllChunks(b *testing.B) {
	m := fstest.Mount(b, kfs.Options{})
	var ts []safetensors.WriteTensor
	for i := range 4000 {
		ts = append(ts, safetensors.WriteTensor{Name: fmt.Sprintf("t%05d", i), DType: safetensors.U8,
			Shape: []int64{4096}, Data: pattern(uint64(i), 4096)})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		b.Fatal(err)
	}
	src := b.TempDir()
	if err := os.WriteFile(filepath.Join(src, "m.safetensors"), buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	if _, err := m.Store.Import(context.Background(), src, "m", chunkstore.ImportOptions{}); err != nil {
		b.Fatal(err)
	}
	m.FS.Reconcile()
	f, err := os.Open(filepath.Join(m.Dir, "m/m.safetensors"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	b.ResetTimer()
	for b.Loop() {
		all, err := layout.AllChunks(fd)
		if err != nil || all.NChunks < 4000 {
			b.Fatalf("%d chunks, %v", all.NChunks, err)
		}
		if _, err := layout.Pack(fd, all.Entries[0].PackIndex); err != nil {
			b.Fatal(err)
		}
	}
}
