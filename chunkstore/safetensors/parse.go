package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"
)

// Parse reads and validates the header of the safetensors file of fileSize
// bytes readable through r. It reads only the 8-byte prefix and the header,
// never the data section.
func Parse(r io.ReaderAt, fileSize int64) (*Header, error) {
	var prefix [8]byte
	if fileSize < 8 {
		return nil, malformed("file is %d bytes, shorter than the 8-byte header length", fileSize)
	}
	if _, err := r.ReadAt(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read header length: %w", err)
	}
	n, err := HeaderLen(prefix[:], fileSize)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 8+n)
	copy(buf, prefix[:])
	if _, err := r.ReadAt(buf[8:], 8); err != nil {
		return nil, fmt.Errorf("safetensors: read %d-byte header: %w", n, err)
	}
	return ParseBytes(buf, fileSize)
}

// HeaderLen decodes and checks the 8-byte length prefix of a file of fileSize
// bytes: it returns N, the JSON header length, which is at least 1, at most
// MaxHeaderLen, and fits in the file. prefix must hold at least 8 bytes.
func HeaderLen(prefix []byte, fileSize int64) (int64, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return 0, malformed("file is %d bytes, shorter than the 8-byte header length", min(fileSize, int64(len(prefix))))
	}
	u := binary.LittleEndian.Uint64(prefix)
	switch {
	case u == 0:
		return 0, malformed("header length is 0")
	case u > MaxHeaderLen:
		return 0, malformed("header length %d exceeds the %d-byte limit", u, MaxHeaderLen)
	case int64(u) > fileSize-8:
		return 0, malformed("header length %d runs past the end of the %d-byte file", u, fileSize)
	}
	return int64(u), nil
}

// ParseBytes validates a header held in memory: b starts with the 8-byte
// length and holds at least the whole JSON header after it (anything beyond
// is ignored, so a caller may pass the first megabytes of a file). fileSize
// is the size of the whole file, used to check that the tensors fit.
func ParseBytes(b []byte, fileSize int64) (*Header, error) {
	n, err := HeaderLen(b, fileSize)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < 8+n {
		return nil, malformed("header is %d bytes but only %d were given", n, len(b)-8)
	}
	js := b[8 : 8+n]
	if js[0] != '{' {
		return nil, malformed("header does not start with '{'")
	}
	if !utf8.Valid(js) {
		return nil, malformed("header is not valid UTF-8")
	}
	h := &Header{Len: n}
	dataLen := fileSize - h.DataStart()
	seen := make(map[string]struct{})
	err = walkObject(js, func(key string, val json.RawMessage) error {
		if _, dup := seen[key]; dup {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = struct{}{}
		if key == MetadataKey {
			md, err := parseMetadata(val)
			if err != nil {
				return fmt.Errorf("%s: %w", MetadataKey, err)
			}
			h.Metadata = md
			return nil
		}
		if len(h.Tensors) >= maxTensors {
			return fmt.Errorf("more than %d tensors", maxTensors)
		}
		t, err := parseTensor(key, val, dataLen)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", key, err)
		}
		h.Tensors = append(h.Tensors, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := &h.Tensors[i], &h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		if a.End != b.End {
			return a.End < b.End
		}
		return a.Name < b.Name
	})
	for i := 1; i < len(h.Tensors); i++ {
		if p, t := h.Tensors[i-1], h.Tensors[i]; t.Begin < p.End {
			return nil, malformed("tensor %q [%d,%d) overlaps tensor %q [%d,%d)", t.Name, t.Begin, t.End, p.Name, p.Begin, p.End)
		}
	}
	return h, nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// walkObject calls fn for each member of the JSON object in js, in order,
// and checks that nothing but whitespace follows the object.
func walkObject(js []byte, fn func(key string, val json.RawMessage) error) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	if tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("invalid JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return errors.New("invalid JSON: object key is not a string")
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return fmt.Errorf("invalid JSON in value of %q: %w", key, err)
		}
		if err := fn(key, val); err != nil {
			return err
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return fmt.Errorf("invalid JSON: unterminated object: %v", err)
	}
	rest := js[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return errors.New("invalid JSON: data after the header object")
	}
	return nil
}

func parseMetadata(val json.RawMessage) (map[string]string, error) {
	if string(val) == "null" {
		return nil, nil
	}
	if len(val) == 0 || val[0] != '{' {
		return nil, errors.New("not a JSON object")
	}
	md := make(map[string]string)
	err := walkObject(val, func(key string, v json.RawMessage) error {
		if _, dup := md[key]; dup {
			return fmt.Errorf("duplicate key %q", key)
		}
		if len(v) == 0 || v[0] != '"' {
			return fmt.Errorf("value of %q is not a string", key)
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("value of %q: %w", key, err)
		}
		md[key] = s
		return nil
	})
	if err != nil {
		return nil, err
	}
	return md, nil
}

func parseTensor(name string, val json.RawMessage, dataLen int64) (Tensor, error) {
	t := Tensor{Name: name}
	if len(val) == 0 || val[0] != '{' {
		return t, errors.New("not a JSON object")
	}
	var dtype, shape, offsets json.RawMessage
	err := walkObject(val, func(key string, v json.RawMessage) error {
		var dst *json.RawMessage
		switch key {
		case "dtype":
			dst = &dtype
		case "shape":
			dst = &shape
		case "data_offsets":
			dst = &offsets
		default:
			return nil // the reference ignores unknown fields too
		}
		if *dst != nil {
			return fmt.Errorf("duplicate key %q", key)
		}
		*dst = v
		return nil
	})
	if err != nil {
		return t, err
	}
	if dtype == nil || shape == nil || offsets == nil {
		return t, errors.New("missing dtype, shape or data_offsets")
	}
	var ds string
	if dtype[0] != '"' || json.Unmarshal(dtype, &ds) != nil {
		return t, errors.New("dtype is not a string")
	}
	t.DType = DType(ds)
	if !t.DType.Valid() {
		return t, fmt.Errorf("unknown dtype %q", ds)
	}
	if t.Shape, err = intArray(shape, "shape"); err != nil {
		return t, err
	}
	offs, err := intArray(offsets, "data_offsets")
	if err != nil {
		return t, err
	}
	if len(offs) != 2 {
		return t, fmt.Errorf("data_offsets has %d elements, want 2", len(offs))
	}
	t.Begin, t.End = offs[0], offs[1]
	if t.Begin > t.End {
		return t, fmt.Errorf("data_offsets [%d,%d): begin after end", t.Begin, t.End)
	}
	want, err := byteLen(t.DType, t.Shape)
	if err != nil {
		return t, err
	}
	if got := t.End - t.Begin; got != want {
		return t, fmt.Errorf("data_offsets [%d,%d) hold %d bytes, but %s%v needs %d", t.Begin, t.End, got, t.DType, t.Shape, want)
	}
	if t.End > dataLen {
		return t, fmt.Errorf("data_offsets [%d,%d) run past the %d-byte data section", t.Begin, t.End, max(dataLen, 0))
	}
	return t, nil
}

// intArray decodes a JSON array of non-negative integers that fit in int64.
// Its length is bounded by len(raw), which the caller already bounded.
func intArray(raw json.RawMessage, what string) ([]int64, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("%s is not an array", what)
	}
	var nums []json.RawMessage
	if err := json.Unmarshal(raw, &nums); err != nil {
		return nil, fmt.Errorf("%s is not an array of integers: %w", what, err)
	}
	out := make([]int64, len(nums))
	for i, n := range nums {
		// ParseInt accepts only [+-]digits, so strings, floats, exponents,
		// null and nested values are all rejected here.
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || n[0] < '0' || n[0] > '9' {
			return nil, fmt.Errorf("%s[%d] = %s is not a non-negative 64-bit integer", what, i, string(n))
		}
		out[i] = v
	}
	return out, nil
}

// maxTensors is MaxTensors, lowered by tests.
var maxTensors = MaxTensors
