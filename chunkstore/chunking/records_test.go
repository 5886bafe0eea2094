package chunking

import (
	"archive/tar"
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type tarMember struct {
	name string
	typ  byte
	data []byte
}

// makeTar writes members with the standard library's writer (not ours),
// then pads the archive to a 10 KiB record as GNU tar does.
func makeTar(t testing.TB, members []tarMember) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: 0o644, ModTime: time.Unix(1700000000, 0)}
		if m.typ == tar.TypeReg {
			h.Size = int64(len(m.data))
		}
		if m.typ == tar.TypeSymlink {
			h.Linkname = "target"
		}
		require.NoError(t, tw.WriteHeader(h))
		if len(m.data) > 0 {
			_, err := tw.Write(m.data)
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	for buf.Len()%10240 != 0 {
		buf.WriteByte(0)
	}
	return buf.Bytes()
}

func spanBytes(b []byte, spans []Span) [][]byte {
	out := make([][]byte, len(spans))
	for i, s := range spans {
		out[i] = b[s.Off:s.End()]
	}
	return out
}

func TestTarSpans(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	big := randBytes(r, 10<<20) // CDC cuts it into several chunks
	members := []tarMember{
		{"d/", tar.TypeDir, nil},
		{"d/0001.jpg", tar.TypeReg, randBytes(r, 3000)},
		{"d/0001.cls", tar.TypeReg, []byte("7\n")},
		{"d/" + strings.Repeat("x", 180) + ".txt", tar.TypeReg, randBytes(r, 700)}, // PAX path
		{"d/empty", tar.TypeReg, nil},
		{"d/link", tar.TypeSymlink, nil},
		{"d/big.bin", tar.TypeReg, big},
		{"d/last.bin", tar.TypeReg, randBytes(r, 512)},
	}
	b := makeTar(t, members)
	cdc := DefaultCDC()
	spans, err := TarSpans(bytes.NewReader(b), int64(len(b)), cdc)
	require.NoError(t, err)
	checkTiles(t, spans, int64(len(b)))
	chunks := spanBytes(b, spans)
	// Each member's data is cut exactly as the same bytes stored as a file
	// of their own: its chunks appear, in order, among the tar's.
	for _, m := range members {
		if len(m.data) == 0 {
			continue
		}
		own := spanBytes(m.data, cdc.SplitBytes(m.data))
		found := false
		for i := range chunks {
			if i+len(own) <= len(chunks) && bytes.Equal(chunks[i], own[0]) {
				found = true
				for j := range own {
					assert.Equal(t, own[j], chunks[i+j], "%s chunk %d", m.name, j)
				}
			}
		}
		assert.True(t, found, "%s: its chunks are not among the tar's", m.name)
	}
	assert.Greater(t, len(spans), len(members), "the 10 MiB member is cut by CDC")
}

// A sample moved: the same members in another order, or split over other
// archives, share every data chunk.
func TestTarSpansShareAcrossOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var members []tarMember
	for i := 0; i < 200; i++ {
		members = append(members, tarMember{strings.Repeat("k", i%7+1) + ".bin", tar.TypeReg, randBytes(r, 1000+r.IntN(60000))})
	}
	ids := func(ms []tarMember) map[string]bool {
		b := makeTar(t, ms)
		spans, err := TarSpans(bytes.NewReader(b), int64(len(b)), DefaultCDC())
		require.NoError(t, err)
		out := map[string]bool{}
		for _, c := range spanBytes(b, spans) {
			out[string(c)] = true
		}
		return out
	}
	a := ids(members)
	rev := append([]tarMember(nil), members...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	bset := ids(rev[:120])
	for k := range ids(rev[120:]) {
		bset[k] = true
	}
	for _, m := range members {
		assert.True(t, a[string(m.data)] && bset[string(m.data)], "member %s is not a chunk of both", m.name)
	}
}

func TestTarSpansBad(t *testing.T) {
	b := makeTar(t, []tarMember{{"a", tar.TypeReg, []byte("hello")}, {"b", tar.TypeReg, bytes.Repeat([]byte("x"), 5000)}})
	for name, bad := range map[string][]byte{
		"checksum":  func() []byte { c := bytes.Clone(b); c[512+512+3] ^= 1; return c }(), // b's header
		"truncated": b[:512+512+512+1000],
		"empty":     nil,
		"short":     b[:100],
	} {
		_, err := TarSpans(bytes.NewReader(bad), int64(len(bad)), DefaultCDC())
		assert.ErrorIs(t, err, ErrBadTar, name)
	}
}

func FuzzTarSpans(f *testing.F) {
	f.Add(makeTar(f, []tarMember{{"a", tar.TypeReg, []byte("hello")}}))
	f.Add(makeTar(f, []tarMember{{strings.Repeat("n", 300), tar.TypeReg, bytes.Repeat([]byte{1}, 2000)}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		spans, err := TarSpans(bytes.NewReader(b), int64(len(b)), DefaultCDC())
		if err != nil {
			if !errors.Is(err, ErrBadTar) {
				t.Fatalf("not ErrBadTar: %v", err)
			}
			return
		}
		checkTiles(t, spans, int64(len(b)))
	})
}

func TestLineSpans(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	var buf bytes.Buffer
	line := func() {
		n := 20 + r.IntN(400)
		buf.WriteString(`{"text": "`)
		for i := 0; i < n; i++ {
			buf.WriteByte('a' + byte(r.IntN(26)))
		}
		buf.WriteString("\"}\n")
	}
	for buf.Len() < 12<<20 {
		line()
	}
	v1 := bytes.Clone(buf.Bytes())
	cdc := DefaultCDC()
	spans, err := LineSpans(bytes.NewReader(v1), int64(len(v1)), cdc)
	require.NoError(t, err)
	checkTiles(t, spans, int64(len(v1)))
	require.Greater(t, len(spans), 4)
	_, _, maxLen := cdc.Sizes()
	for _, s := range spans {
		assert.Equal(t, byte('\n'), v1[s.End()-1], "a chunk ends inside a line at %d", s.End())
		assert.LessOrEqual(t, s.Len, int64(maxLen))
	}
	// Rows inserted in the middle move only the chunks around them.
	mid := bytes.IndexByte(v1[len(v1)/2:], '\n') + len(v1)/2 + 1
	buf.Reset()
	buf.Write(v1[:mid])
	for i := 0; i < 50; i++ {
		line()
	}
	buf.Write(v1[mid:])
	v2 := buf.Bytes()
	s2, err := LineSpans(bytes.NewReader(v2), int64(len(v2)), cdc)
	require.NoError(t, err)
	have := map[string]bool{}
	for _, c := range spanBytes(v1, spans) {
		have[string(c)] = true
	}
	shared := 0
	for _, c := range spanBytes(v2, s2) {
		if have[string(c)] {
			shared += len(c)
		}
	}
	assert.Greater(t, float64(shared)/float64(len(v1)), 0.7, "after an insertion, most of the file still dedups")

	// Lines of up to 3 MiB: chunks never pass the maximum, and end at a
	// line's end wherever one lies within it.
	buf.Reset()
	for buf.Len() < 20<<20 {
		buf.Write(bytes.ReplaceAll(randBytes(r, 1+r.IntN(3<<20)), []byte("\n"), []byte("y")))
		buf.WriteByte('\n')
	}
	long := buf.Bytes()
	ls, err := LineSpans(bytes.NewReader(long), int64(len(long)), cdc)
	require.NoError(t, err)
	checkTiles(t, ls, int64(len(long)))
	for _, s := range ls {
		assert.LessOrEqual(t, s.Len, int64(maxLen))
		if v := long[s.End()-1]; v != '\n' {
			assert.Equal(t, -1, bytes.IndexByte(long[s.Off:s.End()], '\n'), "cut inside a line although the chunk holds a line's end")
		}
	}

	// A file with no newline at all is cut as CDC cuts it.
	flat := bytes.ReplaceAll(randBytes(r, 3<<20), []byte("\n"), []byte("x"))
	fs, err := LineSpans(bytes.NewReader(flat), int64(len(flat)), cdc)
	require.NoError(t, err)
	assert.Equal(t, cdc.SplitBytes(flat), fs)
}
