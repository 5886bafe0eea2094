package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"unicode/utf8"
)

// TensorSpec describes a tensor to write: its bytes come later, from the
// caller (WriteStream) or from WriteTensor.Data (Write).
type TensorSpec struct {
	Name  string
	DType DType
	Shape []int64
}

// Size returns the tensor's length in bytes, or -1 if the spec is invalid.
func (s TensorSpec) Size() int64 {
	n, err := byteLen(s.DType, s.Shape)
	if err != nil {
		return -1
	}
	return n
}

// WriteTensor is a tensor with its bytes in memory, for Write.
type WriteTensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte // little-endian elements, len = product(Shape)*DType.ElemSize()
}

// EncodeHeader returns the file prefix for tensors laid out back to back in
// the given order: the 8-byte length followed by the JSON header, padded with
// spaces so that the data section starts at a multiple of 8, as the reference
// implementation does. It also returns the header as Parse would return it
// for the finished file (tensors in file order). Metadata keys are written
// sorted, "__metadata__" first, so the same input always gives the same bytes.
func EncodeHeader(specs []TensorSpec, metadata map[string]string) ([]byte, *Header, error) {
	if len(specs) > MaxTensors {
		return nil, nil, fmt.Errorf("%w: %d tensors, more than %d", ErrInvalid, len(specs), MaxTensors)
	}
	var buf bytes.Buffer
	buf.WriteString("\x00\x00\x00\x00\x00\x00\x00\x00{")
	first := true
	member := func(key string, val []byte) {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(key) // a string always marshals
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(val)
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, nil, fmt.Errorf("%w: metadata %q is not valid UTF-8", ErrInvalid, k)
		}
	}
	if len(metadata) > 0 {
		md, err := json.Marshal(metadata) // sorted keys
		if err != nil {
			return nil, nil, fmt.Errorf("%w: metadata: %w", ErrInvalid, err)
		}
		member(MetadataKey, md)
	}
	h := &Header{}
	if len(metadata) > 0 {
		h.Metadata = maps.Clone(metadata)
	}
	names := make(map[string]struct{}, len(specs))
	var off int64
	for _, s := range specs {
		if s.Name == MetadataKey {
			return nil, nil, fmt.Errorf("%w: tensor name %q is reserved", ErrInvalid, s.Name)
		}
		if !utf8.ValidString(s.Name) {
			return nil, nil, fmt.Errorf("%w: tensor name %q is not valid UTF-8", ErrInvalid, s.Name)
		}
		if _, dup := names[s.Name]; dup {
			return nil, nil, fmt.Errorf("%w: duplicate tensor name %q", ErrInvalid, s.Name)
		}
		names[s.Name] = struct{}{}
		n, err := byteLen(s.DType, s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %w", ErrInvalid, s.Name, err)
		}
		if off+n < off {
			return nil, nil, fmt.Errorf("%w: tensor %q: data section too large", ErrInvalid, s.Name)
		}
		shape := s.Shape
		if shape == nil {
			shape = []int64{} // a scalar: "shape":[] rather than null
		}
		info, err := json.Marshal(struct {
			DType       DType    `json:"dtype"`
			Shape       []int64  `json:"shape"`
			DataOffsets [2]int64 `json:"data_offsets"`
		}{s.DType, shape, [2]int64{off, off + n}})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %w", ErrInvalid, s.Name, err)
		}
		member(s.Name, info)
		h.Tensors = append(h.Tensors, Tensor{Name: s.Name, DType: s.DType, Shape: slices.Clone(shape), Begin: off, End: off + n})
		off += n
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	b := buf.Bytes()
	n := int64(len(b) - 8)
	if n > MaxHeaderLen {
		return nil, nil, fmt.Errorf("%w: header of %d bytes exceeds the %d-byte limit", ErrInvalid, n, MaxHeaderLen)
	}
	binary.LittleEndian.PutUint64(b, uint64(n))
	h.Len = n
	// Parse reports tensors sorted by (Begin, End, Name); zero-length tensors
	// can share an offset, so sort the same way.
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, c := &h.Tensors[i], &h.Tensors[j]
		if a.Begin != c.Begin {
			return a.Begin < c.Begin
		}
		if a.End != c.End {
			return a.End < c.End
		}
		return a.Name < c.Name
	})
	return b, h, nil
}

// Write writes a complete safetensors file holding tensors, in the given
// order, and metadata (which may be nil).
func Write(w io.Writer, tensors []WriteTensor, metadata map[string]string) error {
	specs := make([]TensorSpec, len(tensors))
	for i, t := range tensors {
		specs[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		if n := specs[i].Size(); n >= 0 && int64(len(t.Data)) != n {
			return fmt.Errorf("%w: tensor %q: %d data bytes, %s%v needs %d", ErrInvalid, t.Name, len(t.Data), t.DType, t.Shape, n)
		}
	}
	return WriteStream(w, specs, metadata, func(i int, w io.Writer) error {
		_, err := w.Write(tensors[i].Data)
		return err
	})
}

// WriteStream writes a safetensors file without holding tensor data in
// memory: after the header it calls fill(i, w) for each spec in order, and
// fill must write exactly specs[i].Size() bytes of tensor i to w (in as many
// Write calls as it likes). Writing more or fewer is an error.
func WriteStream(w io.Writer, specs []TensorSpec, metadata map[string]string, fill func(i int, w io.Writer) error) error {
	hdr, _, err := EncodeHeader(specs, metadata)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: write header: %w", err)
	}
	for i, s := range specs {
		want := s.Size()
		lw := &limitedWriter{w: w, left: want}
		if err := fill(i, lw); err != nil {
			return fmt.Errorf("safetensors: write tensor %q: %w", s.Name, err)
		}
		if lw.left != 0 {
			return fmt.Errorf("%w: tensor %q: fill wrote %d bytes, want %d", ErrInvalid, s.Name, want-lw.left, want)
		}
	}
	return nil
}

// limitedWriter passes writes through and refuses any byte beyond left.
type limitedWriter struct {
	w    io.Writer
	left int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, fmt.Errorf("%w: %d bytes more than the tensor's size", ErrInvalid, int64(len(p))-l.left)
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}
