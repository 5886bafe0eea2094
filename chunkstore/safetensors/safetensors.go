// Package safetensors reads and writes the safetensors file format
// (https://github.com/huggingface/safetensors), the format model weights are
// usually published in.
//
// A file is an 8-byte little-endian unsigned length N, then N bytes of JSON
// (the header), then the data section. The header maps each tensor name to its
// dtype, shape and data_offsets, a [begin, end) byte range relative to the
// start of the data section; the optional key "__metadata__" maps strings to
// strings.
//
// The chunker (package chunking) uses Parse to place chunk boundaries at tensor
// boundaries, so Parse is written for untrusted input: it never panics, it
// allocates nothing before checking the header length (at most MaxHeaderLen
// and within the file), every later allocation is bounded by the header
// bytes it actually holds, and every rejection wraps ErrMalformed.
//
// Parse is slightly more lenient than the reference implementation in one
// respect, on purpose: the reference requires the tensors to tile the data
// section exactly; Parse accepts unused bytes between tensors and after the
// last one ("holes"). They are reported by Header.Holes, and the chunker makes
// them chunks of their own. Everything else the reference rejects, Parse
// rejects too. Write produces files the reference accepts (no holes, header
// padded with spaces to a multiple of 8 bytes).
package safetensors

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrMalformed reports a file or header that is not valid safetensors. Errors
// returned by Parse and ParseBytes for bad input wrap it; errors from the
// underlying reader are wrapped as they are.
var ErrMalformed = errors.New("safetensors: malformed file")

// ErrInvalid reports a tensor description given to Write or EncodeHeader that
// cannot be written (unknown dtype, wrong data length, duplicate name, ...).
var ErrInvalid = errors.New("safetensors: invalid tensor description")

const (
	// MaxHeaderLen is the largest JSON header accepted, as in the reference
	// implementation (100 MiB).
	MaxHeaderLen = 100 << 20
	// MaxTensors is the largest number of tensors accepted in one file.
	MaxTensors = 1 << 20
	// MetadataKey is the reserved header key holding the string->string metadata.
	MetadataKey = "__metadata__"
)

// DType is a tensor element type, spelled as in the header ("BF16", "F32", ...).
type DType string

// The dtypes this package knows. Any other dtype string is rejected.
const (
	BOOL   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	F8E5M2 DType = "F8_E5M2"
	F8E4M3 DType = "F8_E4M3"
	I16    DType = "I16"
	U16    DType = "U16"
	F16    DType = "F16"
	BF16   DType = "BF16"
	I32    DType = "I32"
	U32    DType = "U32"
	F32    DType = "F32"
	F64    DType = "F64"
	I64    DType = "I64"
	U64    DType = "U64"
)

// ElemSize returns the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) ElemSize() int64 {
	switch d {
	case BOOL, U8, I8, F8E5M2, F8E4M3:
		return 1
	case I16, U16, F16, BF16:
		return 2
	case I32, U32, F32:
		return 4
	case F64, I64, U64:
		return 8
	}
	return 0
}

// Valid reports whether d is a dtype this package knows.
func (d DType) Valid() bool { return d.ElemSize() != 0 }

// Tensor describes one tensor of a parsed file. Begin and End are byte offsets
// relative to the start of the data section (Header.DataStart), as in the
// file; the tensor's bytes in the file are [DataStart+Begin, DataStart+End).
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// Size returns the tensor's length in bytes.
func (t Tensor) Size() int64 { return t.End - t.Begin }

// NumElements returns the product of the shape (1 for a scalar).
func (t Tensor) NumElements() int64 {
	n, _ := numElements(t.Shape)
	return n
}

// Header is a parsed safetensors header.
type Header struct {
	// Len is N, the length of the JSON header in bytes (padding included).
	Len int64
	// Metadata is the "__metadata__" map, nil when the file has none.
	Metadata map[string]string
	// Tensors are sorted by Begin (then End, then Name).
	Tensors []Tensor
}

// DataStart returns the file offset of the data section, 8+Len.
func (h *Header) DataStart() int64 { return 8 + h.Len }

// Tensor returns the tensor named name.
func (h *Header) Tensor(name string) (Tensor, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// Hole is a byte range [Begin, End) of the data section, relative to its start,
// that belongs to no tensor.
type Hole struct{ Begin, End int64 }

// Holes returns the ranges of the data section of a file of fileSize bytes that
// no tensor covers: gaps between tensors and any tail after the last one, in
// order. A file written by Write has none.
func (h *Header) Holes(fileSize int64) []Hole {
	var holes []Hole
	var pos int64
	for _, t := range h.Tensors {
		if t.Begin > pos {
			holes = append(holes, Hole{pos, t.Begin})
		}
		pos = max(pos, t.End)
	}
	if dataLen := fileSize - h.DataStart(); dataLen > pos {
		holes = append(holes, Hole{pos, dataLen})
	}
	return holes
}

// numElements returns the product of shape, or ok=false if a dimension is
// negative or the product overflows int64.
func numElements(shape []int64) (n int64, ok bool) {
	n = 1
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > 1<<63-1 {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// byteLen returns numElements(shape)*dtype.ElemSize(), with the same checks.
func byteLen(d DType, shape []int64) (int64, error) {
	es := d.ElemSize()
	if es == 0 {
		return 0, fmt.Errorf("unknown dtype %q", string(d))
	}
	n, ok := numElements(shape)
	if !ok {
		return 0, fmt.Errorf("shape %v has a negative dimension or too many elements", shape)
	}
	hi, lo := bits.Mul64(uint64(n), uint64(es))
	if hi != 0 || lo > 1<<63-1 {
		return 0, fmt.Errorf("shape %v of %s is too large", shape, d)
	}
	return int64(lo), nil
}
