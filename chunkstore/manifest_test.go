package chunkstore

import (
	"bytes"
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
		{Name: "a.bin", Kind: KindFile, Mode: 0o644, Size: 10, MTime: 123, ID: Sum([]byte("f")), HLC: 7},
		{Name: "gone", Kind: KindFile, HLC: 9, Deleted: true},
		{Name: "link", Kind: KindSymlink, Mode: 0o777, Size: 5, Target: "a.bin", HLC: 8},
		{Name: "sub", Kind: KindDir, Mode: 0o755, ID: Sum([]byte("d")), MTime: -5},
	}}
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
	if len(got.Live()) != 3 || !got.Entries[1].Deleted || got.Entries[2].Target != "a.bin" || got.Entries[3].MTime != -5 {
		t.Fatalf("round trip: %+v", got.Entries)
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
	}
	for name, b := range cases {
		if _, err := DecodeDirManifest(b); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalidPath) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
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
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeDirManifest(b)
		if err != nil {
			return
		}
		m2, err := DecodeDirManifest(m.Encode())
		if err != nil {
			t.Fatalf("re-decoding an accepted manifest failed: %v", err)
		}
		if len(m2.Entries) != len(m.Entries) {
			t.Fatal("entry count changed")
		}
	})
}
