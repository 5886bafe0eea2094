package chunking

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Record-aware chunking for data sets (docs/design/chunking.md, "Data
// sets"). A file of records (a tar shard of samples, a JSON-lines file) is
// cut where its records begin and end, so that a record's bytes are cut
// the same way wherever they sit: a sample moved to another shard, a shard
// rewritten in another order, or a directory of files imported beside the
// tar made of them, all share the samples' chunks.

// ErrBadTar reports a file named *.tar whose structure is not a tar
// archive's (a header checksum that fails, a member past the end). The file
// is then stored byte for byte with content-defined chunking; the error
// says why.
var ErrBadTar = errors.New("file named .tar is not a valid tar archive")

const tarBlock = 512

// TarSpans returns the spans of a tar archive of size bytes: for each
// member, one span holding the previous member's padding and the member's
// header blocks (extended PAX and GNU long-name headers included), then the
// member's data cut by cdc exactly as the same bytes imported as a file of
// their own are cut; the last span holds the last padding, the trailer and
// whatever follows it. Spans tile [0, size).
func TarSpans(r io.ReaderAt, size int64, cdc *CDC) ([]Span, error) {
	var spans []Span
	var blk [tarBlock]byte
	start, off := int64(0), int64(0) // start: where the pending header span begins
	for {
		if off+tarBlock > size {
			if off == size && off == 0 {
				return nil, fmt.Errorf("%w: empty", ErrBadTar)
			}
			return nil, fmt.Errorf("%w: ends at %d inside a header", ErrBadTar, size)
		}
		if _, err := r.ReadAt(blk[:], off); err != nil {
			return nil, fmt.Errorf("tar header at %d: %w", off, err)
		}
		if blk == [tarBlock]byte{} {
			break // the trailer: the rest is one span
		}
		n, typ, err := tarHeader(blk[:])
		if err != nil {
			return nil, fmt.Errorf("%w: header at %d: %w", ErrBadTar, off, err)
		}
		data := off + tarBlock
		next := data + (n+tarBlock-1)/tarBlock*tarBlock
		if next > size || next < data {
			return nil, fmt.Errorf("%w: member at %d needs %d bytes, the file has %d", ErrBadTar, off, next, size)
		}
		switch typ {
		case 'x', 'g', 'L', 'K':
			// Extended headers belong to the member that follows: they
			// stay in its header span.
			off = next
			continue
		}
		spans = append(spans, Span{start, data - start})
		if n > 0 {
			ds, err := cdc.SpansReaderAt(io.NewSectionReader(r, data, n), n)
			if err != nil {
				return nil, fmt.Errorf("tar member at %d: %w", off, err)
			}
			for _, s := range ds {
				spans = append(spans, Span{s.Off + data, s.Len})
			}
		}
		start, off = data+n, next
	}
	if start < size {
		spans = append(spans, Span{start, size - start})
	}
	return spans, nil
}

// tarHeader checks one header block's checksum and returns the member's
// data size and type flag. Sizes in base-256 (GNU, for members of 8 GiB or
// more) are read too.
func tarHeader(b []byte) (int64, byte, error) {
	chk, err := tarOctal(b[148:156])
	if err != nil {
		return 0, 0, fmt.Errorf("checksum field: %w", err)
	}
	var unsigned, signed int64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		unsigned += int64(c)
		signed += int64(int8(c))
	}
	if chk != unsigned && chk != signed {
		return 0, 0, fmt.Errorf("checksum %d, the block sums to %d", chk, unsigned)
	}
	var n int64
	if b[124]&0x80 != 0 { // base-256
		if b[124] != 0x80 || b[125]|b[126]|b[127] != 0 {
			return 0, 0, errors.New("size too large")
		}
		for _, c := range b[128:136] {
			n = n<<8 | int64(c)
		}
		if n < 0 {
			return 0, 0, errors.New("size too large")
		}
	} else if n, err = tarOctal(b[124:136]); err != nil {
		return 0, 0, fmt.Errorf("size field: %w", err)
	}
	typ := b[156]
	switch typ {
	case '1', '2', '3', '4', '5', '6':
		n = 0 // links, devices, directories, fifos: no data, whatever size says
	}
	return n, typ, nil
}

func tarOctal(f []byte) (int64, error) {
	f = bytes.Trim(f, " \x00")
	if len(f) == 0 {
		return 0, nil
	}
	v, err := strconv.ParseInt(string(f), 8, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not an octal number", f)
	}
	return v, nil
}

// LineSpans returns the spans of a file of lines (JSON lines, CSV, text):
// cdc's cuts, each moved forward to just after the next newline, so chunks
// end at lines' ends. Where the cuts fall depends only on the content, as
// with cdc alone, so an insertion moves only the chunks around it. No chunk
// is longer than cdc's maximum (every chunk in the store fits one buffer
// size): where the next newline lies past it, the cut moves back to the
// last newline within it, and a line longer than that is cut where cdc
// cut it. Spans tile [0, size).
func LineSpans(r io.ReaderAt, size int64, cdc *CDC) ([]Span, error) {
	raw, err := cdc.SpansReaderAt(r, size)
	if err != nil {
		return nil, err
	}
	limit := int64(cdc.max)
	var spans []Span
	var start int64
	buf := make([]byte, 64<<10)
	// The raw cuts, then the file's end as often as it takes: a last raw
	// cut moved back leaves a tail cut by the same rule.
	for i := 0; start < size; i++ {
		end := size
		if i < len(raw) {
			end = raw[i].End()
		}
		cut := min(end, start+limit)
		if cut <= start {
			continue // an earlier cut moved past this one
		}
		if cut < size {
			nl, ok, err := nextNewline(r, cut-1, min(size, start+limit), buf)
			if err != nil {
				return nil, err
			}
			if !ok {
				nl, ok, err = lastNewline(r, start, cut)
				if err != nil {
					return nil, err
				}
			}
			if ok {
				cut = nl + 1
			}
		}
		spans = append(spans, Span{start, cut - start})
		start = cut
	}
	return spans, nil
}

// lastNewline finds the last '\n' in [from, to).
func lastNewline(r io.ReaderAt, from, to int64) (int64, bool, error) {
	b := make([]byte, to-from)
	if _, err := r.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return 0, false, fmt.Errorf("read at %d: %w", from, err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return from + int64(i), true, nil
	}
	return 0, false, nil
}

// nextNewline finds the first '\n' in [off, end).
func nextNewline(r io.ReaderAt, off, end int64, buf []byte) (int64, bool, error) {
	for off < end {
		n := int(min(int64(len(buf)), end-off))
		if _, err := r.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return 0, false, fmt.Errorf("read at %d: %w", off, err)
		}
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return off + int64(i), true, nil
		}
		off += int64(n)
	}
	return 0, false, nil
}
