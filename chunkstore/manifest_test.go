package chunkstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"testing"
)

func sampleFile() *FileManifest {
	return &FileManifest{Size: 10, Format: FormatSafetensors, Chunks: []ChunkRef{
		{ID: Sum([]byte("a")), Len: 4}, {ID: Sum([]byte("b")), Len: 6},
	}}
}

func sampleDir() *DirManifest {
	return &DirManifest{Entries: []Entry{
		{Name: "a.bin", Kind: KindFile, Mode: 0o644, UID: 1000, GID: 2000, Size: 10, MTime: 123, ID: Sum([]byte("f")), HLC: 7},
		{Name: "gone", Kind: KindFile, HLC: 9, Deleted: true},
		{Name: "link", Kind: KindSymlink, Mode: 0o777, UID: 65534, GID: 65534, Size: 5, Target: "a.bin", HLC: 8},
		{Name: "sub", Kind: KindDir, Mode: 0o755 | fs.ModeSetgid | fs.ModeSticky, GID: 3000, ID: Sum([]byte("d")), MTime: -5},
		{Name: "suid", Kind: KindFile, Mode: 0o755 | fs.ModeSetuid, UID: OwnerUnknown, GID: OwnerUnknown, ID: Sum([]byte("s"))},
	}}
}

// v1Dir is a KXD1 manifest as the encoder wrote it before owners were
// stored (bytes kept literally, so the old format stays readable): a file
// "a" 0644 and a directory "d" with Go's setgid bit, 02755.
func v1Dir() []byte {
	var b []byte
	b = append(b, "KXD1"...)
	b = append(b, 2)                   // entries
	b = append(b, 1, 'a', 1, 0)        // name, kind file, flags
	b = binary.AppendUvarint(b, 0o644) // mode
	b = append(b, 10, 246, 1, 7)       // size 10, mtime 123, hlc 7
	b = append(b, make([]byte, IDSize)...)
	b = append(b, 1, 'd', 2, 0)
	b = binary.AppendUvarint(b, uint64(0o755|fs.ModeSetgid))
	b = append(b, 0, 0, 0)
	b = append(b, make([]byte, IDSize)...)
	return b
}

func TestFileManifestRoundTrip(t *testing.T) {
	m := sampleFile()
	got, err := DecodeFileManifest(m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), m.Encode()) || got.Size != 10 || len(got.Chunks) != 2 || got.Format != FormatSafetensors {
		t.Fatalf("round trip: %+v", got)
	}
	empty := &FileManifest{}
	if _, err := DecodeFileManifest(empty.Encode()); err != nil {
		t.Fatalf("empty file: %v", err)
	}
}

func TestDirManifestRoundTrip(t *testing.T) {
	m := sampleDir()
	got, err := DecodeDirManifest(m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), m.Encode()) {
		t.Fatal("re-encoding differs")
	}
	if len(got.Live()) != 4 || !got.Entries[1].Deleted || got.Entries[2].Target != "a.bin" || got.Entries[3].MTime != -5 {
		t.Fatalf("round trip: %+v", got.Entries)
	}
	for i, e := range m.Entries {
		g := got.Entries[i]
		if g.UID != e.UID || g.GID != e.GID || g.Mode != e.Mode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", e.Name, g.UID, g.GID, g.Mode, e.UID, e.GID, e.Mode)
		}
	}
	if string(m.Encode()[:4]) != "KXD2" {
		t.Fatalf("encoder writes %q, want KXD2", m.Encode()[:4])
	}
	// The empty directory keeps its KXD1 bytes: its ID is well known and
	// stores made before KXD2 point at it without holding it.
	if got := (&DirManifest{}).Encode(); string(got) != "KXD1\x00" {
		t.Fatalf("empty directory encodes as %q", got)
	}
}

func TestDirManifestReadsV1(t *testing.T) {
	m, err := DecodeDirManifest(v1Dir())
	if err != nil {
		t.Fatal(err)
	}
	a, d := m.Entries[0], m.Entries[1]
	if a.Name != "a" || a.Mode != 0o644 || a.Size != 10 || a.MTime != 123 || a.HLC != 7 || d.Mode != 0o755|fs.ModeSetgid {
		t.Fatalf("decoded %+v", m.Entries)
	}
	if a.UID != OwnerUnknown || a.GID != OwnerUnknown || d.UID != OwnerUnknown {
		t.Fatalf("v1 owners %d:%d, want OwnerUnknown", a.UID, a.GID)
	}
	// Re-encoded, it is KXD2 and keeps everything.
	m2, err := DecodeDirManifest(m.Encode())
	if err != nil || string(m.Encode()[:4]) != "KXD2" || m2.Entries[1].Mode != d.Mode || m2.Entries[0].UID != OwnerUnknown {
		t.Fatalf("re-encoded: %+v %v", m2, err)
	}
}

func TestUnixMode(t *testing.T) {
	for u := uint32(0); u <= 0o7777; u++ {
		if got := UnixMode(ModeFromUnix(u)); got != u {
			t.Fatalf("UnixMode(ModeFromUnix(%#o)) = %#o", u, got)
		}
	}
	if UnixMode(0o755|fs.ModeSetuid|fs.ModeDir) != 0o4755 {
		t.Fatal("setuid or type bits")
	}
}

func TestFileManifestRejects(t *testing.T) {
	good := sampleFile().Encode()
	cases := map[string][]byte{
		"empty":         nil,
		"bad magic":     append([]byte("KXF2"), good[4:]...),
		"truncated":     good[:len(good)-3],
		"trailing":      append(append([]byte{}, good...), 0),
		"size mismatch": (&FileManifest{Size: 11, Chunks: sampleFile().Chunks}).Encode(),
		"zero chunk":    (&FileManifest{Size: 0, Chunks: []ChunkRef{{Len: 0}}}).Encode(),
		"bad format":    (&FileManifest{Size: 10, Format: 9, Chunks: sampleFile().Chunks}).Encode(),
		"huge count":    {'K', 'X', 'F', '1', 0, 10, 0xff, 0xff, 0xff, 0xff, 0x0f},
	}
	for name, b := range cases {
		if _, err := DecodeFileManifest(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

func TestDirManifestRejects(t *testing.T) {
	enc := func(es ...Entry) []byte { return (&DirManifest{Entries: es}).Encode() }
	f := func(name string) Entry { return Entry{Name: name, Kind: KindFile, Mode: 0o644} }
	good := sampleDir().Encode()
	cases := map[string][]byte{
		"bad magic":  []byte("KXD0\x00"),
		"truncated":  good[:len(good)-1],
		"trailing":   append(append([]byte{}, good...), 1),
		"unsorted":   enc(f("b"), f("a")),
		"duplicate":  enc(f("a"), f("a")),
		"slash":      enc(f("a/b")),
		"dotdot":     enc(f("..")),
		"dot":        enc(f(".")),
		"nul":        enc(f("a\x00")),
		"bad kind":   enc(Entry{Name: "x", Kind: 9}),
		"empty link": enc(Entry{Name: "x", Kind: KindSymlink}),
		"huge count": []byte("KXD1\xff\xff\xff\xff\x0f"),
		"empty name": []byte("KXD1\x01\x00\x01\x00\x00\x00\x00\x00"),
		"huge v2":    []byte("KXD2\xff\xff\xff\xff\x0f"),
		"empty v2":   []byte("KXD2\x00"),
		"v2 mode":    bytes.Replace(enc(f("a")), []byte{0xa4, 0x03}, []byte{0x80, 0x40}, 1), // 0o644 -> 0o10000
		"v2 uid":     v2WithOwner(1 << 32),
		"v1 mode":    bytes.Replace(v1Dir(), []byte{0xa4, 0x03}, []byte{0x80, 0x40}, 1),
		"v1 trunc":   v1Dir()[:len(v1Dir())-1],
	}
	for name, b := range cases {
		if _, err := DecodeDirManifest(b); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalidPath) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

// v2WithOwner is a KXD2 manifest of one file whose uid is uid (which may
// be out of range).
func v2WithOwner(uid uint64) []byte {
	b := []byte("KXD2\x01\x01x\x01\x00")
	b = binary.AppendUvarint(b, 0o644)
	b = binary.AppendUvarint(b, uid)
	b = append(b, 0, 0, 0, 0)
	return append(b, make([]byte, IDSize)...)
}

func TestSplitPath(t *testing.T) {
	ok := map[string]string{"": "", "/": "", "models/x": "models/x", "/models//x/": "models/x", "./a/./b": "a/b"}
	for in, want := range ok {
		got, err := CleanPath(in)
		if err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "a/../b", "../x", "a/\x00", string(make([]byte, 300))} {
		if _, err := SplitPath(bad); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("SplitPath(%q): got %v, want ErrInvalidPath", bad, err)
		}
	}
}

func TestDirPutFind(t *testing.T) {
	var m DirManifest
	for _, n := range []string{"m", "c", "x", "a", "c"} {
		m.Put(Entry{Name: n, Kind: KindFile, Mode: fs.FileMode(0o600)})
	}
	if len(m.Entries) != 4 {
		t.Fatalf("entries %d", len(m.Entries))
	}
	if _, err := DecodeDirManifest(m.Encode()); err != nil {
		t.Fatalf("Put left entries unsorted: %v", err)
	}
}

func FuzzDecodeFileManifest(f *testing.F) {
	f.Add(sampleFile().Encode())
	f.Add((&FileManifest{}).Encode())
	f.Add([]byte("KXF1"))
	coded := sampleFile()
	coded.Stripes = []*Stripe{{K: 2, M: 1, ShardSize: coded.Chunks[0].Len, Chunks: coded.Chunks[:1], Parity: []ID{Sum([]byte("p"))}}}
	f.Add(coded.Encode()) // KXF2: a cold file naming its stripe
	f.Add([]byte("KXF2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeFileManifest(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Encode(), b) {
			t.Fatalf("accepted non-canonical encoding")
		}
	})
}

func FuzzDecodeDirManifest(f *testing.F) {
	f.Add(sampleDir().Encode())
	f.Add((&DirManifest{}).Encode())
	f.Add([]byte("KXD1\x01"))
	f.Add([]byte("KXD2\x01"))
	f.Add(v1Dir())
	f.Add(v2WithOwner(uint64(OwnerUnknown)))
	f.Add(specialDir().Encode())
	f.Add(literalCharDev())
	f.Add(linkDir().Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeDirManifest(b)
		if err != nil {
			return
		}
		enc := m.Encode()
		// KXD2 (and the empty KXD1) has exactly one encoding; other KXD1
		// input is re-encoded as KXD2.
		if (bytes.HasPrefix(b, []byte("KXD2")) || len(m.Entries) == 0) && !bytes.Equal(enc, b) {
			t.Fatalf("accepted non-canonical encoding")
		}
		m2, err := DecodeDirManifest(enc)
		if err != nil {
			t.Fatalf("re-decoding an accepted manifest failed: %v", err)
		}
		if !bytes.Equal(m2.Encode(), enc) || len(m2.Entries) != len(m.Entries) {
			t.Fatal("re-encoding changed the manifest")
		}
		for i := range m.Entries {
			if m.Entries[i] != m2.Entries[i] {
				t.Fatalf("entry %d changed: %+v -> %+v", i, m.Entries[i], m2.Entries[i])
			}
		}
	})
}

func specialDir() *DirManifest {
	return &DirManifest{Entries: []Entry{
		{Name: "blk", Kind: KindBlockDev, Mode: 0o660, UID: 0, GID: 6, MTime: 1, Rdev: 8<<8 | 1, HLC: 3},
		{Name: "chr", Kind: KindCharDev, Mode: 0o666, Rdev: 1<<8 | 3, HLC: 4},
		{Name: "fifo", Kind: KindFifo, Mode: 0o644 | fs.ModeSetgid, UID: 1000, GID: 1000, MTime: 2, HLC: 5},
		{Name: "gone", Kind: KindCharDev, HLC: 6, Deleted: true},
		{Name: "sock", Kind: KindSocket, Mode: 0o755, UID: 65534, GID: 65534, HLC: 7},
	}}
}

// literalCharDev is the KXD2 bytes of one character device "c" (mode
// 0620, owner 0:5, mtime 0, HLC 1, rdev 136:0 = 0x8800), written out so
// that the encoding of special files cannot change unnoticed.
func literalCharDev() []byte {
	b := []byte("KXD2")
	b = append(b, 1)            // entries
	b = append(b, 1, 'c', 6, 0) // name, kind char device, flags
	b = binary.AppendUvarint(b, 0o620)
	b = append(b, 0, 5, 0, 0, 1) // uid, gid, size, mtime, hlc
	b = binary.AppendUvarint(b, 0x8800)
	return b
}

func TestDirManifestSpecialFiles(t *testing.T) {
	m := specialDir()
	got, err := DecodeDirManifest(m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), m.Encode()) {
		t.Fatal("re-encoding differs")
	}
	for i, e := range m.Entries {
		if got.Entries[i] != e {
			t.Errorf("entry %d: %+v, want %+v", i, got.Entries[i], e)
		}
	}
	lit, err := DecodeDirManifest(literalCharDev())
	if err != nil {
		t.Fatal(err)
	}
	want := Entry{Name: "c", Kind: KindCharDev, Mode: 0o620, UID: 0, GID: 5, HLC: 1, Rdev: 0x8800}
	if len(lit.Entries) != 1 || lit.Entries[0] != want {
		t.Fatalf("literal: %+v, want %+v", lit.Entries, want)
	}
	if !bytes.Equal(lit.Encode(), literalCharDev()) {
		t.Fatal("literal bytes are not what Encode writes")
	}
	// A device without its number is truncated; a special file in the old
	// encoding was never written, so it is rejected.
	if _, err := DecodeDirManifest(literalCharDev()[:len(literalCharDev())-2]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated rdev: %v", err)
	}
	v1 := []byte("KXD1\x01\x01f\x04\x00\x00\x00\x00\x00")
	if _, err := DecodeDirManifest(v1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("fifo in KXD1: %v", err)
	}
	for k, name := range map[Kind]string{KindFifo: "fifo", KindSocket: "socket", KindCharDev: "char-device", KindBlockDev: "block-device"} {
		if k.String() != name || !k.Special() || k.IsDevice() != (k == KindCharDev || k == KindBlockDev) {
			t.Errorf("%d: %v special %v device %v", k, k, k.Special(), k.IsDevice())
		}
	}
	if KindFile.Special() || KindSymlink.Special() || KindDir.IsDevice() {
		t.Error("file, symlink or dir counted as special")
	}
}

func linkDir() *DirManifest {
	return &DirManifest{Entries: []Entry{
		{Name: "0000000000000abc", Kind: KindFile, Mode: 0o640, UID: 1, GID: 2, Size: 3, ID: Sum([]byte("c")), HLC: 4, Nlink: 3},
		{Name: "fifo-set", Kind: KindFifo, Mode: 0o600, HLC: 5, Nlink: 2},
		{Name: "name", Kind: KindHardlink, Link: 0xabc, HLC: 6},
		{Name: "with-ctime", Kind: KindFile, ID: Sum([]byte("t")), MTime: 5, CTime: -7, ATime: 9, Nlink: 1},
	}}
}

// TestDirManifestLinks: hard-link names and link-table entries round-trip;
// a link count on a directory or a name, a zero count behind the flag and
// set number 0 are rejected.
func TestDirManifestLinks(t *testing.T) {
	m := linkDir()
	got, err := DecodeDirManifest(m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range m.Entries {
		if got.Entries[i] != e {
			t.Errorf("entry %d: %+v, want %+v", i, got.Entries[i], e)
		}
	}
	bad := func(e Entry) []byte { return (&DirManifest{Entries: []Entry{e}}).Encode() }
	for name, b := range map[string][]byte{
		"dir with nlink":      bad(Entry{Name: "d", Kind: KindDir, Nlink: 2}),
		"hardlink with nlink": bad(Entry{Name: "h", Kind: KindHardlink, Link: 1, Nlink: 2}),
		"set 0":               bad(Entry{Name: "h", Kind: KindHardlink}),
	} {
		if _, err := DecodeDirManifest(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	zero := bad(Entry{Name: "f", Kind: KindFile, Nlink: 1})
	zero[len(zero)-1] = 0 // the count, made 0 behind the flag
	if _, err := DecodeDirManifest(zero); !errors.Is(err, ErrCorrupt) {
		t.Errorf("nlink 0 behind the flag: %v", err)
	}
}
