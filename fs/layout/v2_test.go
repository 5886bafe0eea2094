package layout

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kylix/kylix/internal/testneeds"
)

// cLayout is what the Go package says about each C struct: its size and
// the offset of every field. TestHeaderFields compiles kylix_layout.h and
// checks every number.
var cLayout = []struct {
	name   string
	size   int
	fields [][2]any // field name, offset
}{
	{"kylix_probe", ProbeSize, [][2]any{{"magic", 0}, {"version", 4}, {"node_pid", 8}, {"client_socket", 16}}},
	{"kylix_chunks", ChunksHeaderSize, [][2]any{{"magic", 0}, {"version", 4}, {"flags", 6}, {"first_chunk", 8},
		{"max_entries", 16}, {"n_entries", 20}, {"n_chunks", 24}, {"file_size", 32}, {"file_id", 40}}},
	{"kylix_chunk", ChunkEntrySize, [][2]any{{"file_offset", 0}, {"length", 8}, {"flags", 12}, {"pack_index", 16},
		{"reserved", 20}, {"pack_offset", 24}, {"id", 32}}},
	{"kylix_pack", PackSize, [][2]any{{"magic", 0}, {"version", 4}, {"flags", 6}, {"pack_index", 8}, {"n_packs", 12},
		{"generation", 16}, {"size", 24}, {"pack_flags", 32}, {"path_len", 36}, {"path", 40}}},
	{"kylix_make_local", MakeLocalSize, [][2]any{{"magic", 0}, {"version", 4}, {"flags", 6}, {"offset", 8}, {"length", 16}}},
	{"kylix_layout", LayoutSize, [][2]any{{"magic", 0}, {"version", 4}, {"flags", 6}, {"offset", 8}, {"length", 16},
		{"file_size", 24}, {"next_offset", 32}, {"n_extents", 40}, {"reserved", 44}, {"file_id", 48}, {"ext", headerSize}}},
	{"kylix_extent", extentSize, [][2]any{{"file_offset", 0}, {"length", 8}, {"pack_id", 16}, {"pack_offset", 24},
		{"flags", 32}, {"reserved", 36}}},
	{"kylix_pack_path", PackPathSize, [][2]any{{"magic", 0}, {"version", 4}, {"flags", 6}, {"pack_id", 8}, {"len", 16},
		{"reserved", 20}, {"path", 24}}},
}

// cConst are the header's numbers, with what Go says.
var cConst = []struct {
	expr string
	want uint64
}{
	{"KYLIX_LAYOUT_MAGIC", Magic}, {"KYLIX_LAYOUT_VERSION", Version}, {"KYLIX_LAYOUT_VERSION2", Version2},
	{"KYLIX_LAYOUT_MAX_EXTENTS", MaxExtents}, {"KYLIX_PACK_PATH_MAX", PackPathMax},
	{"KYLIX_EXTENT_LOCAL", ExtentLocal}, {"KYLIX_EXTENT_WHOLE_FILE", ExtentWholeFile},
	{"KYLIX_CLIENT_SOCKET_MAX", ClientSocketMax}, {"KYLIX_CHUNKS_MAX_ENTRIES", MaxChunkEntries},
	{"KYLIX_PACK_PATH_MAX2", PackPathMaxV2}, {"KYLIX_CHUNK_LOCAL", ChunkLocal}, {"KYLIX_NO_PACK", uint64(NoPack)},
	{"KYLIX_PACK_WHOLE_FILE", PackWholeFile}, {"KYLIX_PACK_CHECKED", PackChecked},
	{"sizeof(((struct kylix_probe *)0)->client_socket)", ClientSocketMax},
	{"sizeof(((struct kylix_pack *)0)->path)", PackPathMaxV2},
	{"KYLIX_IOC_LAYOUT", uint64(CmdLayout)}, {"KYLIX_IOC_PACK_PATH", uint64(CmdPackPath)},
	{"KYLIX_IOC_PROBE", uint64(CmdProbe)}, {"KYLIX_IOC_PACK", uint64(CmdPack)},
	{"KYLIX_IOC_MAKE_LOCAL", uint64(CmdMakeLocal)},
	{"KYLIX_IOC_CHUNKS(0)", uint64(CmdChunks(0))}, {"KYLIX_IOC_CHUNKS(1)", uint64(CmdChunks(1))},
	{"KYLIX_IOC_CHUNKS(KYLIX_CHUNKS_MAX_ENTRIES)", uint64(CmdChunks(MaxChunkEntries))},
	{"KYLIX_CHUNKS_SIZE(KYLIX_CHUNKS_MAX_ENTRIES)", uint64(ChunksSize(MaxChunkEntries))},
	{"_IOC_SIZE(KYLIX_IOC_CHUNKS(KYLIX_CHUNKS_MAX_ENTRIES))", uint64(ChunksSize(MaxChunkEntries))},
	{"_IOC_SIZE(KYLIX_IOC_PACK)", PackSize},
	{"kylix_pack_generation(0, 0, 0, 0, 0)", Generation(0, 0, 0, 0, 0)},
	{"kylix_pack_generation(66306ull, 1234567ull, 1073741824, 1764500000123456789, -5)",
		Generation(66306, 1234567, 1<<30, 1764500000123456789, -5)},
	{"kylix_pack_generation(~0ull, 1, -1, 7, 1764500000999999999)", Generation(^uint64(0), 1, -1, 7, 1764500000999999999)},
}

// TestHeaderFields compiles a C program against kylix_layout.h (with
// -Wall -Wextra -Werror, as libkylix does) and checks every struct size,
// every field offset, every constant, every command number and the
// generation function against this package.
func TestHeaderFields(t *testing.T) {
	cc := testneeds.Command(t, "cc", "gcc libc6-dev") // checks kylix_layout.h
	var src strings.Builder
	var want []string
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"kylix_layout.h\"\nint main(void) {\n")
	for _, s := range cLayout {
		fmt.Fprintf(&src, "\tprintf(\"sizeof %s %%zu\\n\", sizeof(struct %s));\n", s.name, s.name)
		want = append(want, fmt.Sprintf("sizeof %s %d", s.name, s.size))
		for _, f := range s.fields {
			fmt.Fprintf(&src, "\tprintf(\"offsetof %s.%s %%zu\\n\", offsetof(struct %s, %s));\n", s.name, f[0], s.name, f[0])
			want = append(want, fmt.Sprintf("offsetof %s.%s %d", s.name, f[0], f[1]))
		}
	}
	for _, c := range cConst {
		fmt.Fprintf(&src, "\tprintf(\"%%s %%llu\\n\", %q, (unsigned long long)(%s));\n", c.expr, c.expr)
		want = append(want, fmt.Sprintf("%s %d", c.expr, c.want))
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	cfile := filepath.Join(dir, "h.c")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "h")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", wd, "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(got) != len(want) {
		t.Fatalf("C printed %d lines, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("C says %q, Go says %q", got[i], want[i])
		}
	}
	t.Logf("%d numbers agree", len(want))
}

func TestDecodeCmd(t *testing.T) {
	c := DecodeCmd(CmdChunks(MaxChunkEntries))
	if !c.Read || !c.Write || c.Type != 'K' || c.Nr != NrChunks || c.Size != ChunksSize(MaxChunkEntries) || c.Size >= 1<<14 {
		t.Fatalf("%+v", c)
	}
	if c := DecodeCmd(CmdMakeLocal); c.Read || !c.Write || c.Size != MakeLocalSize {
		t.Fatalf("%+v", c)
	}
	if c := DecodeCmd(CmdProbe); !c.Read || c.Write || c.Size != ProbeSize {
		t.Fatalf("%+v", c)
	}
}

func TestV2RoundTrip(t *testing.T) {
	// Probe.
	b := make([]byte, ProbeSize)
	if err := EncodeProbe(b, Probe{Version: 2, NodePID: 42, ClientSocket: "/run/kylix/x.sock"}); err != nil {
		t.Fatal(err)
	}
	if p, err := DecodeProbe(b); err != nil || p.NodePID != 42 || p.ClientSocket != "/run/kylix/x.sock" || p.Version != 2 {
		t.Fatalf("%+v %v", p, err)
	}
	if err := EncodeProbe(b, Probe{ClientSocket: "/" + strings.Repeat("x", ClientSocketMax)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("long socket path: %v", err)
	}
	// Chunks.
	req := EncodeChunksRequest(ChunksRequest{FirstChunk: 3, MaxEntries: 2})
	r, err := DecodeChunksRequest(req, uint32(len(req)))
	if err != nil || r.FirstChunk != 3 || r.MaxEntries != 2 {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := DecodeChunksRequest(req, uint32(len(req))+64); !errors.Is(err, ErrInvalid) {
		t.Errorf("size mismatch: %v", err)
	}
	rep := ChunksReply{NChunks: 9, FileSize: 1000, FileID: [32]byte{1},
		Entries: []Chunk{{FileOffset: 100, Length: 50, Flags: ChunkLocal, PackIndex: 0, PackOffset: 4096, ID: [32]byte{7}},
			{FileOffset: 150, Length: 70, PackIndex: NoPack}}}
	if err := EncodeChunksReply(req, rep); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeChunksReply(req)
	if err != nil || len(got.Entries) != 2 || got.Entries[0] != rep.Entries[0] || got.Entries[1] != rep.Entries[1] || got.FileID != rep.FileID {
		t.Fatalf("%+v %v", got, err)
	}
	rep.Entries = append(rep.Entries, Chunk{FileOffset: 220, Length: 1, PackIndex: NoPack})
	if err := EncodeChunksReply(req, rep); !errors.Is(err, ErrInvalid) {
		t.Errorf("overfull reply: %v", err)
	}
	// Pack.
	pb := EncodePackRequest(5)
	if i, err := DecodePackRequest(pb); err != nil || i != 5 {
		t.Fatalf("%d %v", i, err)
	}
	pi := PackInfo{NPacks: 6, Generation: 99, Size: 1 << 20, Flags: PackChecked | PackWholeFile, Path: "/data/packs/ab/cd.pack"}
	if err := EncodePackReply(pb, pi); err != nil {
		t.Fatal(err)
	}
	if p, err := DecodePackReply(pb); err != nil || p != pi {
		t.Fatalf("%+v %v", p, err)
	}
	// Make local.
	ml := EncodeMakeLocal(MakeLocalRequest{Offset: 10, Length: 20})
	if r, err := DecodeMakeLocal(ml); err != nil || r.Offset != 10 || r.Length != 20 {
		t.Fatalf("%+v %v", r, err)
	}
}

// TestV2Rejects: every rule of the header, broken once, is ErrInvalid.
func TestV2Rejects(t *testing.T) {
	mut := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	chunks := EncodeChunksRequest(ChunksRequest{MaxEntries: 1})
	for name, b := range map[string][]byte{
		"magic": mut(chunks, 0, 0), "version": mut(chunks, 4, 1), "flags": mut(chunks, 7, 1),
		"max_entries": mut(chunks, 16, 2), "n_entries": mut(chunks, 20, 1), "n_chunks": mut(chunks, 24, 1),
		"file_size": mut(chunks, 39, 1), "file_id": mut(chunks, 71, 1),
	} {
		if _, err := DecodeChunksRequest(b, uint32(len(b))); !errors.Is(err, ErrInvalid) {
			t.Errorf("chunks %s: %v", name, err)
		}
	}
	big := EncodeChunksRequest(ChunksRequest{MaxEntries: MaxChunkEntries + 1})
	if _, err := DecodeChunksRequest(big, uint32(len(big))); !errors.Is(err, ErrInvalid) {
		t.Errorf("too many entries: %v", err)
	}
	pack := EncodePackRequest(0)
	for name, b := range map[string][]byte{
		"magic": mut(pack, 3, 0), "version": mut(pack, 5, 1), "flags": mut(pack, 6, 1),
		"n_packs": mut(pack, 12, 1), "generation": mut(pack, 16, 1), "path": mut(pack, 4095, 'x'),
	} {
		if _, err := DecodePackRequest(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("pack %s: %v", name, err)
		}
	}
	ml := EncodeMakeLocal(MakeLocalRequest{})
	for name, b := range map[string][]byte{
		"magic": mut(ml, 1, 0), "version": mut(ml, 4, 3), "flags": mut(ml, 6, 1), "huge offset": mut(ml, 15, 0x80),
	} {
		if _, err := DecodeMakeLocal(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("make_local %s: %v", name, err)
		}
	}
	// Replies a caller decodes: a node (or a non-Kylix file system that
	// echoes the buffer) cannot make the decoder read out of bounds.
	rep := EncodeChunksRequest(ChunksRequest{MaxEntries: 1})
	rep[20] = 2
	if _, err := DecodeChunksReply(rep); !errors.Is(err, ErrInvalid) {
		t.Errorf("n_entries past the buffer: %v", err)
	}
	if _, err := DecodeProbe(make([]byte, ProbeSize)); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero probe: %v", err)
	}
}

func TestGenerationChanges(t *testing.T) {
	base := Generation(1, 2, 3, 4, 5)
	for i, g := range []uint64{Generation(9, 2, 3, 4, 5), Generation(1, 9, 3, 4, 5), Generation(1, 2, 9, 4, 5),
		Generation(1, 2, 3, 9, 5), Generation(1, 2, 3, 4, 9)} {
		if g == base || g == 0 {
			t.Errorf("field %d: generation %x, base %x", i, g, base)
		}
	}
}

// FuzzDecodeV2 feeds arbitrary bytes to every v2 decoder: none may panic,
// and whatever is accepted must satisfy the rules.
func FuzzDecodeV2(f *testing.F) {
	f.Add(EncodeChunksRequest(ChunksRequest{MaxEntries: 2}), uint32(ChunksSize(2)))
	f.Add(EncodePackRequest(1), uint32(PackSize))
	f.Add(EncodeMakeLocal(MakeLocalRequest{Offset: 1}), uint32(MakeLocalSize))
	f.Add(make([]byte, ProbeSize), uint32(ProbeSize))
	r := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		b := make([]byte, ChunksSize(3))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		copy(b, EncodeChunksRequest(ChunksRequest{MaxEntries: 3})[:8])
		f.Add(b, uint32(len(b)))
	}
	f.Fuzz(func(t *testing.T, b []byte, size uint32) {
		if r, err := DecodeChunksRequest(b, size); err == nil {
			if r.MaxEntries > MaxChunkEntries || ChunksSize(r.MaxEntries) != uint32(len(b)) {
				t.Fatalf("accepted %+v for %d bytes", r, len(b))
			}
		}
		if rep, err := DecodeChunksReply(b); err == nil {
			for _, c := range rep.Entries {
				if c.FileOffset+uint64(c.Length) > rep.FileSize {
					t.Fatalf("accepted entry %+v past %d", c, rep.FileSize)
				}
			}
		}
		DecodePackRequest(b)
		if p, err := DecodePackReply(b); err == nil && len(p.Path) >= PackPathMaxV2 {
			t.Fatalf("path of %d", len(p.Path))
		}
		if m, err := DecodeMakeLocal(b); err == nil && (m.Offset > 1<<62 || m.Length > 1<<62) {
			t.Fatalf("accepted %+v", m)
		}
		if p, err := DecodeProbe(b); err == nil && len(p.ClientSocket) >= ClientSocketMax {
			t.Fatalf("socket path of %d", len(p.ClientSocket))
		}
	})
}
