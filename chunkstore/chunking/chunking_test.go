package chunking

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// checkTiles fails unless spans are non-empty, in order, and tile [0, size).
func checkTiles(t *testing.T, spans []Span, size int64) {
	t.Helper()
	var pos int64
	for i, s := range spans {
		if s.Len <= 0 || s.Off != pos {
			t.Fatalf("span %d = %+v, want Off %d and Len > 0", i, s, pos)
		}
		pos = s.End()
	}
	if pos != size {
		t.Fatalf("spans end at %d, want %d", pos, size)
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

// header builds a parsed header for tensors of the given byte sizes, with
// gaps[i] unused bytes before tensor i, and returns it with the file size
// (tail extra bytes after the last tensor).
func header(t *testing.T, sizes, gaps []int64, tail int64, md map[string]string) (*safetensors.Header, []byte) {
	t.Helper()
	var js strings.Builder
	js.WriteString("{")
	if md != nil {
		js.WriteString(`"__metadata__":{`)
		first := true
		for k, v := range md {
			if !first {
				js.WriteString(",")
			}
			first = false
			js.WriteString(`"` + k + `":"` + v + `"`)
		}
		js.WriteString("},")
	}
	var off int64
	for i, n := range sizes {
		if i > 0 {
			js.WriteString(",")
		}
		if gaps != nil {
			off += gaps[i]
		}
		js.WriteString(`"t` + itoa(int64(i)) + `":{"dtype":"U8","shape":[` + itoa(n) + `],"data_offsets":[` + itoa(off) + `,` + itoa(off+n) + `]}`)
		off += n
	}
	js.WriteString("}")
	b := make([]byte, 8, 8+js.Len()+int(off+tail))
	binary.LittleEndian.PutUint64(b, uint64(js.Len()))
	b = append(b, js.String()...)
	b = append(b, make([]byte, off+tail)...)
	h, err := safetensors.ParseBytes(b, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	return h, b
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

func TestTensorSpans(t *testing.T) {
	const m = 100
	h, b := header(t, []int64{10, 100, 101, 350, 0, 5}, []int64{0, 3, 0, 0, 7, 250}, 42, nil)
	ds := h.DataStart()
	spans := TensorSpans(h, int64(len(b)), m)
	checkTiles(t, spans, int64(len(b)))
	rel := func(off, n int64) Span { return Span{ds + off, n} }
	want := []Span{
		{0, ds},
		rel(0, 10),                 // t0
		rel(10, 3),                 // hole
		rel(13, 100),               // t1, exactly m
		rel(113, 100), rel(213, 1), // t2, m+1
		rel(214, 100), rel(314, 100), rel(414, 100), rel(514, 50), // t3, 3.5m
		rel(564, 7),                                // hole before the empty t4
		rel(571, 100), rel(671, 100), rel(771, 50), // hole of 250 after it, cut from its start
		rel(821, 5),  // t5
		rel(826, 42), // tail
	}
	if !reflect.DeepEqual(spans, want) {
		t.Errorf("spans\n got %v\nwant %v", spans, want)
	}
	if got := TensorSpans(h, int64(len(b)), 0); len(got) != 10 {
		t.Errorf("default maxChunk: %v", got)
	}
}

func TestTensorSpansEdges(t *testing.T) {
	h, b := header(t, nil, nil, 0, nil)
	checkTiles(t, TensorSpans(h, int64(len(b)), 10), int64(len(b)))
	if s := TensorSpans(h, 0, 10); s != nil {
		t.Errorf("empty file: %v", s)
	}
	// A header that does not match the file: tensors clipped, still tiling.
	h, b = header(t, []int64{50, 50}, nil, 0, nil)
	for _, size := range []int64{1, h.DataStart(), h.DataStart() + 20, int64(len(b)) + 30} {
		checkTiles(t, TensorSpans(h, size, 16), size)
	}
}

// TestTensorSpansProperty checks random layouts: spans tile the file, none
// crosses a tensor boundary, and inside a tensor cuts are at multiples of
// maxChunk from its start.
func TestTensorSpansProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 300; iter++ {
		n := r.IntN(20)
		sizes, gaps := make([]int64, n), make([]int64, n)
		for i := range sizes {
			sizes[i] = int64(r.IntN(1000))
			if r.IntN(4) == 0 {
				gaps[i] = int64(r.IntN(300))
			}
		}
		h, b := header(t, sizes, gaps, int64(r.IntN(3)*r.IntN(500)), nil)
		maxChunk := int64(1 + r.IntN(400))
		spans := TensorSpans(h, int64(len(b)), maxChunk)
		checkTiles(t, spans, int64(len(b)))
		cuts := map[int64]bool{}
		for _, s := range spans {
			cuts[s.Off] = true
			if s.Off > 0 && s.Len > maxChunk {
				t.Fatalf("span %+v longer than %d", s, maxChunk)
			}
		}
		for _, tn := range h.Tensors {
			if tn.Size() == 0 {
				continue
			}
			tb, te := h.DataStart()+tn.Begin, h.DataStart()+tn.End
			for o := tb; o < te; o += maxChunk {
				if !cuts[o] {
					t.Fatalf("no cut at %d inside tensor %+v", o, tn)
				}
			}
			for o := range cuts {
				if o > tb && o < te && (o-tb)%maxChunk != 0 {
					t.Fatalf("cut at %d inside tensor %+v, not a multiple of %d", o, tn, maxChunk)
				}
			}
			if te < int64(len(b)) && !cuts[te] {
				t.Fatalf("no cut at the end %d of tensor %+v", te, tn)
			}
		}
	}
}

// TestTensorSpansHeaderShift: two versions whose headers differ in length
// get the same tensor spans relative to their data sections.
func TestTensorSpansHeaderShift(t *testing.T) {
	sizes := []int64{1000, 30, 5000, 7}
	h1, b1 := header(t, sizes, nil, 0, map[string]string{"format": "pt"})
	h2, b2 := header(t, sizes, nil, 0, map[string]string{"format": "pt", "finetuned_from": "some-base-model-with-a-long-name"})
	if h1.DataStart() == h2.DataStart() {
		t.Fatal("headers have the same length")
	}
	s1, s2 := TensorSpans(h1, int64(len(b1)), 512)[1:], TensorSpans(h2, int64(len(b2)), 512)[1:]
	if len(s1) != len(s2) {
		t.Fatalf("%d and %d spans", len(s1), len(s2))
	}
	for i := range s1 {
		if s1[i].Off-h1.DataStart() != s2[i].Off-h2.DataStart() || s1[i].Len != s2[i].Len {
			t.Errorf("span %d: %+v vs %+v", i, s1[i], s2[i])
		}
	}
}

func TestDetect(t *testing.T) {
	_, good := header(t, []int64{4}, nil, 0, nil)
	bad := []byte("not a safetensors file at all")
	tests := []struct {
		name    string
		data    []byte
		want    Format
		wantErr bool
	}{
		{"model.safetensors", good, FormatSafetensors, false},
		{"dir/Model-00001-of-00002.SAFETENSORS", good, FormatSafetensors, false},
		{"model.safetensors", bad, FormatOpaque, true},
		{"model.safetensors", nil, FormatOpaque, true},
		{"model.bin", good, FormatOpaque, false},
		{"config.json", bad, FormatOpaque, false},
		{"safetensors", good, FormatOpaque, false},
	}
	for _, tc := range tests {
		f, h, err := Detect(tc.name, bytes.NewReader(tc.data), int64(len(tc.data)))
		if f != tc.want || (err != nil) != tc.wantErr || (f == FormatSafetensors) != (h != nil) {
			t.Errorf("Detect(%q) = %v, %v, %v", tc.name, f, h != nil, err)
		}
		if err != nil && (!errors.Is(err, ErrBadSafetensors) || !errors.Is(err, safetensors.ErrMalformed)) {
			t.Errorf("Detect(%q) error %v does not wrap ErrBadSafetensors and ErrMalformed", tc.name, err)
		}
	}
	if FormatSafetensors.String() != "safetensors" || FormatOpaque.String() != "opaque" {
		t.Error("Format.String")
	}
}

func TestNewCDC(t *testing.T) {
	for _, s := range [][3]int{{0, 10, 100}, {63, 128, 256}, {256, 256, 1024}, {256, 1024, 1024}, {256, 1024, 512}, {1 << 20, 1 << 29, 1<<30 + 1}} {
		if _, err := NewCDC(s[0], s[1], s[2]); err == nil {
			t.Errorf("NewCDC%v: no error", s)
		}
	}
	c, err := NewCDC(64, 3000, 100000) // avg rounds to 2048
	if err != nil {
		t.Fatal(err)
	}
	if c.maskS != 0xFFF8_0000_0000_0000 || c.maskL != 0xFF80_0000_0000_0000 {
		t.Errorf("masks %x %x", c.maskS, c.maskL)
	}
	if mn, avg, mx := DefaultCDC().Sizes(); mn != 256<<10 || avg != 1<<20 || mx != 4<<20 {
		t.Errorf("DefaultCDC sizes %d %d %d", mn, avg, mx)
	}
	if mn, avg, mx := XetCDC().Sizes(); mn != 8<<10 || avg != 64<<10 || mx != 128<<10 {
		t.Errorf("XetCDC sizes %d %d %d", mn, avg, mx)
	}
}

// TestGearGolden pins the gear table and the boundaries it gives: changing
// either changes the chunk ids of every opaque file already stored.
func TestGearGolden(t *testing.T) {
	sum := sha256.New()
	for _, g := range gear {
		binary.Write(sum, binary.LittleEndian, g)
	}
	if got := sum.Sum(nil); got[0] != goldenGear[0] || got[1] != goldenGear[1] || got[2] != goldenGear[2] || got[3] != goldenGear[3] {
		t.Errorf("gear table digest starts %x, want %x", got[:4], goldenGear)
	}
	c, _ := NewCDC(2048, 8192, 32768)
	data := randBytes(rand.New(rand.NewPCG(42, 42)), 200000)
	var lens []int64
	for _, s := range c.SplitBytes(data) {
		lens = append(lens, s.Len)
	}
	if !reflect.DeepEqual(lens, goldenLens) {
		t.Errorf("chunk lengths %v, want %v", lens, goldenLens)
	}
}

var (
	goldenGear = [4]byte{0x92, 0xde, 0xf2, 0x2a}
	goldenLens = []int64{7724, 7164, 8645, 9085, 12844, 11495, 11436, 10232, 7032, 10756, 13389, 2888, 8746, 10154, 10067, 13385, 8259, 10092, 8397, 8668, 9129, 413}
)

func testCDCs(t *testing.T) []*CDC {
	small, err := NewCDC(2048, 8192, 32768)
	if err != nil {
		t.Fatal(err)
	}
	return []*CDC{small, XetCDC()}
}

func TestCDCBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range testCDCs(t) {
		for _, data := range [][]byte{randBytes(r, 8<<20), make([]byte, 1<<20), bytes.Repeat([]byte("abcdefg"), 200000)} {
			spans := c.SplitBytes(data)
			checkTiles(t, spans, int64(len(data)))
			for i, s := range spans {
				if s.Len > int64(c.max) || (s.Len < int64(c.min) && i != len(spans)-1) {
					t.Fatalf("%v: span %d = %+v outside [min, max]", c, i, s)
				}
			}
			if data[0] != 0 && data[1] != 'b' { // random data: the average is about right
				avg := float64(len(data)) / float64(len(spans))
				if avg < 0.7*float64(c.avg) || avg > 1.5*float64(c.avg) {
					t.Errorf("%v: average chunk %.0f bytes", c, avg)
				}
				t.Logf("%v: %d chunks, average %.0f", c, len(spans), avg)
			}
		}
	}
}

// TestCDCCutIndependent: Cut gives the same answer whatever amount of data
// past the boundary it is shown, and 0 only when it cannot know yet.
func TestCDCCutIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	c := testCDCs(t)[0]
	data := randBytes(r, 1<<20)
	full := c.Cut(data, false)
	if full == 0 {
		t.Fatal("no cut with 1 MiB of data")
	}
	for n := 0; n <= c.max+10; n += 1 + r.IntN(300) {
		got := c.Cut(data[:n], false)
		switch {
		case n < full && got != 0:
			t.Fatalf("Cut(%d bytes) = %d before the boundary at %d", n, got, full)
		case n >= full && got != full:
			t.Fatalf("Cut(%d bytes) = %d, want %d", n, got, full)
		}
		if eof := c.Cut(data[:n], true); (n >= full && eof != full) || (n < full && eof != n) {
			t.Fatalf("Cut(%d bytes, EOF) = %d", n, eof)
		}
	}
}

// chunkyReader returns random short reads.
type chunkyReader struct {
	r    *rand.Rand
	data []byte
}

func (c *chunkyReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.r.IntN(70000))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func TestCDCSplitMatchesBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, c := range testCDCs(t) {
		for _, n := range []int{0, 1, 100, c.min, c.min + 1, c.max, 3*c.max + 17, 2 << 20} {
			data := randBytes(r, n)
			want := c.SplitBytes(data)
			var got []Span
			err := c.Split(&chunkyReader{r, data}, func(s Span, chunk []byte) error {
				if !bytes.Equal(chunk, data[s.Off:s.End()]) {
					t.Fatalf("chunk bytes for %+v differ", s)
				}
				got = append(got, s)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%v, %d bytes: Split %v, SplitBytes %v", c, n, got, want)
			}
			ra, err := c.SpansReaderAt(bytes.NewReader(data), int64(n))
			if err != nil || !reflect.DeepEqual(ra, want) {
				t.Fatalf("SpansReaderAt: %v, %v", ra, err)
			}
		}
	}
	c := testCDCs(t)[0]
	if _, err := c.SpansReaderAt(bytes.NewReader(make([]byte, 10)), 20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short reader: %v", err)
	}
	boom := errors.New("boom")
	if err := c.Split(io.MultiReader(bytes.NewReader(make([]byte, 100)), iotestErr{boom}), func(Span, []byte) error { return nil }); !errors.Is(err, boom) {
		t.Errorf("read error: %v", err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// TestCDCResync: after an insertion, a deletion or an overwrite, chunking
// finds its old boundaries again within a few chunks.
func TestCDCResync(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	c := testCDCs(t)[0]
	orig := randBytes(r, 4<<20)
	edits := map[string][]byte{
		"insert 100": append(append(append([]byte{}, orig[:1<<20]...), randBytes(r, 100)...), orig[1<<20:]...),
		"insert 1":   append(append(append([]byte{}, orig[:2<<20]...), 'x'), orig[2<<20:]...),
		"delete 999": append(append([]byte{}, orig[:1<<20]...), orig[1<<20+999:]...),
		"prepend 37": append(randBytes(r, 37), orig...),
	}
	ids := func(data []byte) map[[32]byte]bool {
		m := map[[32]byte]bool{}
		for _, s := range c.SplitBytes(data) {
			m[sha256.Sum256(data[s.Off:s.End()])] = true
		}
		return m
	}
	before := ids(orig)
	for name, edited := range edits {
		after := c.SplitBytes(edited)
		var lost int
		for _, s := range after {
			if !before[sha256.Sum256(edited[s.Off:s.End()])] {
				lost++
			}
		}
		if lost > 4 {
			t.Errorf("%s: %d of %d chunks new, want at most 4", name, lost, len(after))
		}
		t.Logf("%s: %d of %d chunks new", name, lost, len(after))
	}
}

func BenchmarkCDCCut(b *testing.B) {
	data := randBytes(rand.New(rand.NewPCG(1, 1)), 64<<20)
	for _, c := range []*CDC{XetCDC(), DefaultCDC()} {
		b.Run(c.String(), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				c.SplitBytes(data)
			}
		})
	}
}
