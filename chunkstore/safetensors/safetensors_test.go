package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// file builds a safetensors file from a raw JSON header and dataLen data bytes.
func file(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

func withLen(n uint64, rest string) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, n)
	return append(b, rest...)
}

func TestParseRejects(t *testing.T) {
	defer func(n int) { maxTensors = n }(maxTensors)
	maxTensors = 3
	const u8x4 = `{"dtype":"U8","shape":[4],"data_offsets":[0,4]}`
	tests := []struct {
		name string
		b    []byte
		size int64 // file size if not len(b)
		want string
	}{
		{"empty file", nil, 0, "shorter than the 8-byte"},
		{"7-byte file", []byte{1, 0, 0, 0, 0, 0, 0}, 0, "shorter than the 8-byte"},
		{"header length 0", withLen(0, "{}"), 0, "header length is 0"},
		{"header length over 100 MiB", withLen(100<<20+1, "{}"), 1 << 40, "exceeds"},
		{"header length huge", withLen(1<<63, "{}"), 1 << 40, "exceeds"},
		{"header beyond file end", withLen(100, "{}"), 0, "past the end"},
		{"header truncated in buffer", withLen(100, "{}"), 200, "only 2 were given"},
		{"invalid JSON", file(`{"a":`, 0), 0, "invalid JSON"},
		{"not an object", file(`[1,2]`, 0), 0, "does not start with '{'"},
		{"leading space", file(` {}`, 0), 0, "does not start with '{'"},
		{"trailing garbage", file(`{} x`, 0), 0, "data after"},
		{"two objects", file(`{}{}`, 0), 0, "data after"},
		{"invalid UTF-8", file("{\"a\xff\":1}", 0), 0, "UTF-8"},
		{"tensor not object", file(`{"a":[1]}`, 0), 0, "not a JSON object"},
		{"tensor null", file(`{"a":null}`, 0), 0, "not a JSON object"},
		{"missing dtype", file(`{"a":{"shape":[1],"data_offsets":[0,1]}}`, 1), 0, "missing"},
		{"missing offsets", file(`{"a":{"dtype":"U8","shape":[1]}}`, 1), 0, "missing"},
		{"dtype not string", file(`{"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}}`, 1), 0, "dtype is not a string"},
		{"unknown dtype", file(`{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, 1), 0, `unknown dtype "Q4"`},
		{"lowercase dtype", file(`{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, 4), 0, "unknown dtype"},
		{"negative dim", file(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, 0), 0, "shape[0] = -1"},
		{"float dim", file(`{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}`, 1), 0, "shape[0] = 1.0"},
		{"string dim", file(`{"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}}`, 1), 0, "shape[0]"},
		{"dim over int64", file(`{"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]}}`, 1), 0, "shape[0]"},
		{"shape not array", file(`{"a":{"dtype":"U8","shape":4,"data_offsets":[0,4]}}`, 4), 0, "shape is not an array"},
		{"shape product overflow", file(`{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0), 0, "too many elements"},
		{"shape bytes overflow", file(`{"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}`, 0), 0, "too large"},
		{"offsets 3 elements", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 2), 0, "3 elements, want 2"},
		{"offsets 1 element", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1]}}`, 2), 0, "1 elements, want 2"},
		{"offsets negative", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}`, 2), 0, "data_offsets[0]"},
		{"begin after end", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}}`, 2), 0, "begin after end"},
		{"length mismatch", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8), 0, "needs 8"},
		{"beyond data section", file(`{"a":`+u8x4+`}`, 3), 0, "run past the 3-byte data section"},
		{"overlap", file(`{"a":`+u8x4+`,"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 6), 0, "overlaps"},
		{"same range", file(`{"a":`+u8x4+`,"b":`+u8x4+`}`, 4), 0, "overlaps"},
		{"empty tensor inside another", file(`{"a":`+u8x4+`,"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}}`, 4), 0, "overlaps"},
		{"duplicate name", file(`{"a":`+u8x4+`,"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), 0, `duplicate key "a"`},
		{"duplicate field", file(`{"a":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4), 0, `duplicate key "dtype"`},
		{"too many tensors", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"c":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, 0), 0, "more than 3 tensors"},
		{"metadata string", file(`{"__metadata__":"x"}`, 0), 0, "__metadata__: not a JSON object"},
		{"metadata array", file(`{"__metadata__":["a"]}`, 0), 0, "__metadata__: not a JSON object"},
		{"metadata number value", file(`{"__metadata__":{"a":1}}`, 0), 0, `value of "a" is not a string`},
		{"metadata null value", file(`{"__metadata__":{"a":null}}`, 0), 0, `value of "a" is not a string`},
		{"metadata nested", file(`{"__metadata__":{"a":{"b":"c"}}}`, 0), 0, `value of "a" is not a string`},
		{"metadata duplicate key", file(`{"__metadata__":{"a":"1","a":"2"}}`, 0), 0, `duplicate key "a"`},
		{"metadata twice", file(`{"__metadata__":{},"__metadata__":{}}`, 0), 0, `duplicate key "__metadata__"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.size
			if size == 0 {
				size = int64(len(tc.b))
			}
			_, err := ParseBytes(tc.b, size)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseBytes: err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseBytes: err = %q, want it to mention %q", err, tc.want)
			}
			if int64(len(tc.b)) == size {
				_, err := Parse(bytes.NewReader(tc.b), size)
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Parse: err = %v, want ErrMalformed mentioning %q", err, tc.want)
				}
			}
		})
	}
}

func TestParseReaderError(t *testing.T) {
	b := file(`{}`, 0)
	// The file claims more bytes than the reader has: a read error, not ErrMalformed.
	_, err := Parse(bytes.NewReader(b[:9]), int64(len(b)))
	if err == nil || errors.Is(err, ErrMalformed) || !errors.Is(err, io.EOF) {
		t.Fatalf("err = %v, want a wrapped io.EOF", err)
	}
}

func TestParseAccepts(t *testing.T) {
	hdr := `{"__metadata__":{"format":"pt","x":"\u00e9"},` +
		`"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28],"extra":"ignored"},` +
		`"a":{"dtype":"F32","shape":[],"data_offsets":[4,8]},` +
		`"e":{"dtype":"I64","shape":[0,5],"data_offsets":[8,8]},` +
		`"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}   `
	b := file(hdr, 40)
	h, err := ParseBytes(b, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if h.Len != int64(len(hdr)) || h.DataStart() != 8+int64(len(hdr)) {
		t.Errorf("Len = %d, DataStart = %d", h.Len, h.DataStart())
	}
	if !reflect.DeepEqual(h.Metadata, map[string]string{"format": "pt", "x": "é"}) {
		t.Errorf("Metadata = %v", h.Metadata)
	}
	want := []Tensor{
		{Name: "z", DType: U8, Shape: []int64{0}, Begin: 0, End: 0},
		{Name: "a", DType: F32, Shape: []int64{}, Begin: 4, End: 8},
		{Name: "e", DType: I64, Shape: []int64{0, 5}, Begin: 8, End: 8},
		{Name: "b", DType: BF16, Shape: []int64{2, 3}, Begin: 16, End: 28},
	}
	if !reflect.DeepEqual(h.Tensors, want) {
		t.Errorf("Tensors = %+v\nwant %+v", h.Tensors, want)
	}
	wantHoles := []Hole{{0, 4}, {8, 16}, {28, 40}}
	if got := h.Holes(int64(len(b))); !reflect.DeepEqual(got, wantHoles) {
		t.Errorf("Holes = %v, want %v", got, wantHoles)
	}
	if a, ok := h.Tensor("a"); !ok || a.NumElements() != 1 || a.Size() != 4 {
		t.Errorf("Tensor(a) = %+v, %v", a, ok)
	}
	// Trailing bytes after the header in the buffer are ignored.
	if _, err := ParseBytes(append(b[:8+len(hdr):8+len(hdr)], "junk"...), int64(len(b))); err != nil {
		t.Errorf("ParseBytes with extra bytes: %v", err)
	}
	// null metadata is no metadata.
	b = file(`{"__metadata__":null}`, 0)
	if h, err := ParseBytes(b, int64(len(b))); err != nil || h.Metadata != nil || len(h.Tensors) != 0 {
		t.Errorf("null metadata: %+v, %v", h, err)
	}
}

func randTensors(r *rand.Rand, n int) []WriteTensor {
	dts := []DType{BOOL, U8, I8, F8E5M2, F8E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64}
	ts := make([]WriteTensor, n)
	for i := range ts {
		dt := dts[r.IntN(len(dts))]
		shape := make([]int64, r.IntN(4))
		for j := range shape {
			shape[j] = int64(r.IntN(6))
		}
		sz, _ := byteLen(dt, shape)
		data := make([]byte, sz)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		ts[i] = WriteTensor{Name: "t." + string(rune('a'+i%26)) + strings.Repeat("x", i), DType: dt, Shape: shape, Data: data}
	}
	return ts
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		ts := randTensors(r, r.IntN(12))
		var md map[string]string
		if r.IntN(2) == 0 {
			md = map[string]string{"format": "pt", "k<&>": strings.Repeat("v", r.IntN(20)), "ü": "\"quoted\"\n"}
		}
		var buf bytes.Buffer
		if err := Write(&buf, ts, md); err != nil {
			t.Fatal(err)
		}
		b := buf.Bytes()
		h, err := Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("iter %d: Parse: %v", iter, err)
		}
		if h.DataStart()%8 != 0 {
			t.Errorf("DataStart %d not a multiple of 8", h.DataStart())
		}
		if holes := h.Holes(int64(len(b))); len(holes) != 0 {
			t.Errorf("holes %v in a written file", holes)
		}
		if !reflect.DeepEqual(h.Metadata, md) && !(len(md) == 0 && len(h.Metadata) == 0) {
			t.Errorf("metadata %v, want %v", h.Metadata, md)
		}
		_, eh, err := EncodeHeader(specsOf(ts), md)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(eh, h) {
			t.Errorf("EncodeHeader header %+v\nParse header %+v", eh, h)
		}
		if len(h.Tensors) != len(ts) {
			t.Fatalf("%d tensors, want %d", len(h.Tensors), len(ts))
		}
		for _, w := range ts {
			got, ok := h.Tensor(w.Name)
			if !ok {
				t.Fatalf("tensor %q missing", w.Name)
			}
			if got.DType != w.DType || !reflect.DeepEqual(got.Shape, append([]int64{}, w.Shape...)) {
				t.Errorf("tensor %q: %+v, want %+v", w.Name, got, w)
			}
			if data := b[h.DataStart()+got.Begin : h.DataStart()+got.End]; !bytes.Equal(data, w.Data) {
				t.Errorf("tensor %q: data differs", w.Name)
			}
		}
	}
}

func specsOf(ts []WriteTensor) []TensorSpec {
	s := make([]TensorSpec, len(ts))
	for i, t := range ts {
		s[i] = TensorSpec{t.Name, t.DType, t.Shape}
	}
	return s
}

// TestWriteReference checks the exact bytes for a small file against the
// layout the reference implementation writes: compact JSON, metadata first,
// spaces up to a multiple of 8.
func TestWriteReference(t *testing.T) {
	var buf bytes.Buffer
	err := Write(&buf, []WriteTensor{{Name: "w", DType: F32, Shape: []int64{2}, Data: make([]byte, 8)}}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	js := `{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	js += strings.Repeat(" ", (8-len(js)%8)%8)
	want := file(js, 8)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("got  %q\nwant %q", buf.Bytes(), want)
	}
}

func TestWriteRejects(t *testing.T) {
	f32 := func(name string, shape []int64, n int) WriteTensor {
		return WriteTensor{Name: name, DType: F32, Shape: shape, Data: make([]byte, n)}
	}
	tests := []struct {
		name string
		ts   []WriteTensor
		md   map[string]string
	}{
		{"unknown dtype", []WriteTensor{{Name: "a", DType: "X", Shape: []int64{1}, Data: []byte{0}}}, nil},
		{"negative dim", []WriteTensor{f32("a", []int64{-1}, 0)}, nil},
		{"short data", []WriteTensor{f32("a", []int64{2}, 4)}, nil},
		{"long data", []WriteTensor{f32("a", []int64{1}, 8)}, nil},
		{"duplicate", []WriteTensor{f32("a", []int64{1}, 4), f32("a", []int64{1}, 4)}, nil},
		{"reserved name", []WriteTensor{f32(MetadataKey, []int64{1}, 4)}, nil},
		{"bad UTF-8 name", []WriteTensor{f32("a\xff", []int64{1}, 4)}, nil},
		{"bad UTF-8 metadata", nil, map[string]string{"a": "\xff"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Write(io.Discard, tc.ts, tc.md)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestWriteStreamFillSize(t *testing.T) {
	specs := []TensorSpec{{Name: "a", DType: U16, Shape: []int64{4}}}
	for _, n := range []int{0, 7, 9} {
		err := WriteStream(io.Discard, specs, nil, func(i int, w io.Writer) error {
			_, err := w.Write(make([]byte, n))
			return err
		})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("fill of %d bytes: err = %v, want ErrInvalid", n, err)
		}
	}
	var buf bytes.Buffer
	err := WriteStream(&buf, specs, nil, func(i int, w io.Writer) error {
		for j := 0; j < 8; j++ {
			if _, err := w.Write([]byte{byte(j)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseBytes(buf.Bytes(), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if got := buf.Bytes()[h.DataStart():]; !bytes.Equal(got, []byte{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("data = %v", got)
	}
}

func FuzzParse(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 8; i++ {
		var buf bytes.Buffer
		if err := Write(&buf, randTensors(r, i), map[string]string{"format": "pt"}); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Add(file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 6))
	f.Add(file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 4))
	f.Add(file(`{"__metadata__":{"a":1}}`, 0))
	f.Add(file(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0))
	f.Add(withLen(1<<62, "{}"))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		size := int64(len(b))
		h, err := ParseBytes(b, size)
		h2, err2 := Parse(bytes.NewReader(b), size)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("ParseBytes err %v, Parse err %v", err, err2)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if !reflect.DeepEqual(h, h2) {
			t.Fatalf("ParseBytes and Parse differ")
		}
		dataLen := size - h.DataStart()
		var prevEnd int64
		for i, tn := range h.Tensors {
			n, err := byteLen(tn.DType, tn.Shape)
			if err != nil || n != tn.End-tn.Begin || tn.Begin < 0 || tn.End > dataLen {
				t.Fatalf("tensor %+v invalid (len %d, err %v, dataLen %d)", tn, n, err, dataLen)
			}
			if i > 0 && tn.Begin < prevEnd {
				t.Fatalf("tensor %+v overlaps the previous one", tn)
			}
			prevEnd = max(prevEnd, tn.End)
		}
		// A valid file with no holes survives a rewrite with the same layout.
		if len(h.Holes(size)) != 0 {
			return
		}
		ws := make([]WriteTensor, len(h.Tensors))
		for i, tn := range h.Tensors {
			ws[i] = WriteTensor{tn.Name, tn.DType, tn.Shape, b[h.DataStart()+tn.Begin : h.DataStart()+tn.End]}
		}
		var buf bytes.Buffer
		if err := Write(&buf, ws, h.Metadata); err != nil {
			if errors.Is(err, ErrInvalid) {
				return // e.g. a name that is not writable
			}
			t.Fatal(err)
		}
		h3, err := ParseBytes(buf.Bytes(), int64(buf.Len()))
		if err != nil {
			t.Fatalf("rewritten file does not parse: %v", err)
		}
		if !bytes.Equal(buf.Bytes()[h3.DataStart():], b[h.DataStart():]) {
			t.Fatalf("rewritten data differs")
		}
	})
}
