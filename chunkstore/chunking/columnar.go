package chunking

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
)

// Columnar files (docs/design/chunking.md, "Data sets"): a Parquet file is
// cut where its column chunks begin and end, an Arrow IPC file where its
// record batches and dictionaries do. A data set that gains row groups or
// batches then keeps every chunk of the ones it had, wherever the writer
// put them, and a column chunk copied into another file (compaction,
// re-partitioning) is cut the same way there. Each region is cut by CDC
// inside, as a file of its own would be; the bytes between regions (magic,
// page indexes, footers) are spans of their own.

// ErrBadParquet and ErrBadArrow report files named *.parquet or *.arrow
// (*.feather) whose layout is not what the format says: they are stored
// with content-defined chunking, and the error says why.
var (
	ErrBadParquet = errors.New("file named .parquet is not a valid Parquet file")
	ErrBadArrow   = errors.New("file named .arrow is not a valid Arrow IPC file")
)

// maxFooter bounds the footer a file may declare (Parquet metadata, an
// Arrow footer): larger is treated as damage, not read.
const maxFooter = 64 << 20

// region is a byte range of a file that is cut on its own.
type region struct{ off, n int64 }

// regionSpans tiles [0, size) with the regions (sorted, non-overlapping,
// inside [lo, hi)) cut by cdc and the gaps between them as single spans
// (or cut by cdc where longer than its maximum).
func regionSpans(r io.ReaderAt, size int64, regs []region, cdc *CDC) ([]Span, error) {
	var spans []Span
	cut := func(off, n int64) error {
		if n == 0 {
			return nil
		}
		if n <= int64(cdc.min) {
			spans = append(spans, Span{off, n})
			return nil
		}
		ss, err := cdc.SpansReaderAt(io.NewSectionReader(r, off, n), n)
		if err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		for _, s := range ss {
			spans = append(spans, Span{s.Off + off, s.Len})
		}
		return nil
	}
	pos := int64(0)
	for _, g := range regs {
		if err := cut(pos, g.off-pos); err != nil {
			return nil, err
		}
		if err := cut(g.off, g.n); err != nil {
			return nil, err
		}
		pos = g.off + g.n
	}
	if err := cut(pos, size-pos); err != nil {
		return nil, err
	}
	return spans, nil
}

// checkRegions sorts regs and checks they lie in [lo, hi) without overlap.
func checkRegions(regs []region, lo, hi int64, bad error) error {
	sort.Slice(regs, func(i, j int) bool { return regs[i].off < regs[j].off })
	prev := lo
	for _, g := range regs {
		if g.n < 0 || g.off < prev || g.off+g.n > hi || g.off+g.n < g.off {
			return fmt.Errorf("%w: a region [%d, +%d) lies outside [%d, %d) or overlaps the one before", bad, g.off, g.n, prev, hi)
		}
		prev = g.off + g.n
	}
	return nil
}

// ParquetSpans returns the spans of a Parquet file of size bytes: each
// column chunk (from its dictionary page, or first data page, for its
// total compressed size) cut by cdc, and the bytes around them (the
// magic, page indexes, bloom filters, the footer) as spans of their own.
// Spans tile [0, size).
func ParquetSpans(r io.ReaderAt, size int64, cdc *CDC) ([]Span, error) {
	if size < 12 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadParquet, size)
	}
	var tail [8]byte
	if _, err := r.ReadAt(tail[:], size-8); err != nil {
		return nil, fmt.Errorf("parquet footer: %w", err)
	}
	var head [4]byte
	if _, err := r.ReadAt(head[:], 0); err != nil {
		return nil, fmt.Errorf("parquet magic: %w", err)
	}
	if string(tail[4:]) != "PAR1" || string(head[:]) != "PAR1" {
		return nil, fmt.Errorf("%w: no PAR1 magic (an encrypted footer, PARE, is not read)", ErrBadParquet)
	}
	mlen := int64(binary.LittleEndian.Uint32(tail[:4]))
	metaOff := size - 8 - mlen
	if mlen == 0 || mlen > maxFooter || metaOff < 4 {
		return nil, fmt.Errorf("%w: footer of %d bytes in a file of %d", ErrBadParquet, mlen, size)
	}
	meta := make([]byte, mlen)
	if _, err := r.ReadAt(meta, metaOff); err != nil {
		return nil, fmt.Errorf("parquet footer: %w", err)
	}
	regs, err := parquetColumnChunks(meta)
	if err != nil {
		return nil, fmt.Errorf("%w: footer: %w", ErrBadParquet, err)
	}
	if err := checkRegions(regs, 4, metaOff, ErrBadParquet); err != nil {
		return nil, err
	}
	return regionSpans(r, size, regs, cdc)
}

// Thrift compact protocol types (the encoding of Parquet's footer).
const (
	tcStop   = 0
	tcTrue   = 1
	tcFalse  = 2
	tcByte   = 3
	tcI16    = 4
	tcI32    = 5
	tcI64    = 6
	tcDouble = 7
	tcBinary = 8
	tcList   = 9
	tcSet    = 10
	tcMap    = 11
	tcStruct = 12
)

// thrift reads the compact protocol: just enough to walk Parquet's
// FileMetaData to its column chunks and skip everything else. Every
// length is checked against what is left; nesting is bounded.
type thrift struct {
	b     []byte
	depth int
}

var errThrift = errors.New("malformed thrift data")

func (t *thrift) byte1() (byte, error) {
	if len(t.b) == 0 {
		return 0, errThrift
	}
	c := t.b[0]
	t.b = t.b[1:]
	return c, nil
}

func (t *thrift) uvarint() (uint64, error) {
	v, n := binary.Uvarint(t.b)
	if n <= 0 {
		return 0, errThrift
	}
	t.b = t.b[n:]
	return v, nil
}

func (t *thrift) varint() (int64, error) { // zigzag
	u, err := t.uvarint()
	return int64(u>>1) ^ -int64(u&1), err
}

// field reads a field header after the field id last; stop at the end.
func (t *thrift) field(last int16) (id int16, typ byte, stop bool, err error) {
	h, err := t.byte1()
	if err != nil || h == tcStop {
		return 0, 0, true, err
	}
	typ = h & 0x0f
	if d := h >> 4; d != 0 {
		return last + int16(d), typ, false, nil
	}
	v, err := t.varint()
	return int16(v), typ, false, err
}

// list reads a list or set header.
func (t *thrift) list() (n int, elem byte, err error) {
	h, err := t.byte1()
	if err != nil {
		return 0, 0, err
	}
	size := uint64(h >> 4)
	if size == 15 {
		if size, err = t.uvarint(); err != nil {
			return 0, 0, err
		}
	}
	if size > uint64(len(t.b)) { // every element takes a byte at least
		return 0, 0, errThrift
	}
	return int(size), h & 0x0f, nil
}

// skip passes over one value of type typ (in a list, bools take a byte).
func (t *thrift) skip(typ byte, inList bool) error {
	switch typ {
	case tcTrue, tcFalse:
		if inList {
			_, err := t.byte1()
			return err
		}
		return nil
	case tcByte:
		_, err := t.byte1()
		return err
	case tcI16, tcI32, tcI64:
		_, err := t.uvarint()
		return err
	case tcDouble:
		if len(t.b) < 8 {
			return errThrift
		}
		t.b = t.b[8:]
		return nil
	case tcBinary:
		n, err := t.uvarint()
		if err != nil || n > uint64(len(t.b)) {
			return errThrift
		}
		t.b = t.b[n:]
		return nil
	case tcList, tcSet:
		n, elem, err := t.list()
		if err != nil {
			return err
		}
		return t.nested(func() error {
			for i := 0; i < n; i++ {
				if err := t.skip(elem, true); err != nil {
					return err
				}
			}
			return nil
		})
	case tcMap:
		n, err := t.uvarint()
		if err != nil || n > uint64(len(t.b)) {
			return errThrift
		}
		if n == 0 {
			return nil
		}
		kv, err := t.byte1()
		if err != nil {
			return err
		}
		return t.nested(func() error {
			for i := uint64(0); i < n; i++ {
				if err := t.skip(kv>>4, true); err != nil {
					return err
				}
				if err := t.skip(kv&0x0f, true); err != nil {
					return err
				}
			}
			return nil
		})
	case tcStruct:
		return t.structFields(func(int16, byte) (bool, error) { return false, nil })
	}
	return fmt.Errorf("%w: type %d", errThrift, typ)
}

func (t *thrift) nested(fn func() error) error {
	if t.depth >= 32 {
		return fmt.Errorf("%w: nested too deep", errThrift)
	}
	t.depth++
	defer func() { t.depth-- }()
	return fn()
}

// structFields walks a struct's fields: fn reads a field it wants (and
// says so), every other one is skipped.
func (t *thrift) structFields(fn func(id int16, typ byte) (bool, error)) error {
	return t.nested(func() error {
		var last int16
		for {
			id, typ, stop, err := t.field(last)
			if err != nil {
				return err
			}
			if stop {
				return nil
			}
			last = id
			done, err := fn(id, typ)
			if err != nil {
				return err
			}
			if !done {
				if err := t.skip(typ, false); err != nil {
					return err
				}
			}
		}
	})
}

// structList walks a list of structs, calling each for every element.
func (t *thrift) structList(typ byte, each func() error) error {
	if typ != tcList {
		return fmt.Errorf("%w: want a list, have type %d", errThrift, typ)
	}
	n, elem, err := t.list()
	if err != nil {
		return err
	}
	if elem != tcStruct {
		return fmt.Errorf("%w: want a list of structs", errThrift)
	}
	return t.nested(func() error {
		for i := 0; i < n; i++ {
			if err := each(); err != nil {
				return err
			}
		}
		return nil
	})
}

// parquetColumnChunks returns the byte ranges of the column chunks that
// FileMetaData meta places in this file.
func parquetColumnChunks(meta []byte) ([]region, error) {
	t := &thrift{b: meta}
	var regs []region
	// FileMetaData: 4 row_groups list<RowGroup>.
	err := t.structFields(func(id int16, typ byte) (bool, error) {
		if id != 4 {
			return false, nil
		}
		return true, t.structList(typ, func() error {
			// RowGroup: 1 columns list<ColumnChunk>.
			return t.structFields(func(id int16, typ byte) (bool, error) {
				if id != 1 {
					return false, nil
				}
				return true, t.structList(typ, func() error {
					g, elsewhere, err := parquetColumnChunk(t)
					if err != nil {
						return err
					}
					if !elsewhere {
						regs = append(regs, g)
					}
					return nil
				})
			})
		})
	})
	return regs, err
}

// parquetColumnChunk reads a ColumnChunk: 1 file_path (set when the data
// lives in another file), 3 meta_data ColumnMetaData (7
// total_compressed_size, 9 data_page_offset, 11 dictionary_page_offset).
func parquetColumnChunk(t *thrift) (region, bool, error) {
	var elsewhere, haveMeta bool
	var total, data, dict int64
	err := t.structFields(func(id int16, typ byte) (bool, error) {
		switch {
		case id == 1 && typ == tcBinary:
			elsewhere = true
			return false, nil
		case id == 3 && typ == tcStruct:
			haveMeta = true
			return true, t.structFields(func(id int16, typ byte) (bool, error) {
				if typ != tcI64 || (id != 7 && id != 9 && id != 11) {
					return false, nil
				}
				v, err := t.varint()
				switch id {
				case 7:
					total = v
				case 9:
					data = v
				case 11:
					dict = v
				}
				return true, err
			})
		}
		return false, nil
	})
	if err != nil {
		return region{}, false, err
	}
	if !haveMeta {
		return region{}, false, fmt.Errorf("%w: a column chunk without metadata", errThrift)
	}
	start := data
	if dict > 0 && dict < start {
		start = dict
	}
	return region{start, total}, elsewhere, nil
}

// ArrowSpans returns the spans of an Arrow IPC file (the random-access
// "file" format, ARROW1 ... footer ... ARROW1) of size bytes: each block
// the footer lists (dictionary batches and record batches, message and
// body) cut by cdc, and the bytes around them (the magic, the schema
// message, the footer) as spans of their own. Spans tile [0, size).
func ArrowSpans(r io.ReaderAt, size int64, cdc *CDC) ([]Span, error) {
	const magic = "ARROW1"
	if size < 8+4+6 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadArrow, size)
	}
	var head [6]byte
	var tail [10]byte
	if _, err := r.ReadAt(head[:], 0); err != nil {
		return nil, fmt.Errorf("arrow magic: %w", err)
	}
	if _, err := r.ReadAt(tail[:], size-10); err != nil {
		return nil, fmt.Errorf("arrow footer: %w", err)
	}
	if string(head[:]) != magic || string(tail[4:]) != magic {
		return nil, fmt.Errorf("%w: no ARROW1 magic at both ends (an Arrow stream has no footer: it is cut by content)", ErrBadArrow)
	}
	flen := int64(int32(binary.LittleEndian.Uint32(tail[:4])))
	foff := size - 10 - flen
	if flen <= 0 || flen > maxFooter || foff < 8 {
		return nil, fmt.Errorf("%w: footer of %d bytes in a file of %d", ErrBadArrow, flen, size)
	}
	footer := make([]byte, flen)
	if _, err := r.ReadAt(footer, foff); err != nil {
		return nil, fmt.Errorf("arrow footer: %w", err)
	}
	regs, err := arrowBlocks(footer)
	if err != nil {
		return nil, fmt.Errorf("%w: footer: %w", ErrBadArrow, err)
	}
	if err := checkRegions(regs, 8, foff, ErrBadArrow); err != nil {
		return nil, err
	}
	return regionSpans(r, size, regs, cdc)
}

var errFlatbuf = errors.New("malformed flatbuffer")

// arrowBlocks reads the Footer table (flatbuffers): field 2 dictionaries
// and field 3 recordBatches, vectors of Block structs {offset int64,
// metaDataLength int32, (pad), bodyLength int64}.
func arrowBlocks(b []byte) ([]region, error) {
	u32 := func(off int) (uint32, error) {
		if off < 0 || off+4 > len(b) {
			return 0, errFlatbuf
		}
		return binary.LittleEndian.Uint32(b[off:]), nil
	}
	root, err := u32(0)
	if err != nil {
		return nil, err
	}
	table := int(root)
	vt, err := u32(table)
	if err != nil {
		return nil, err
	}
	vtable := table - int(int32(vt))
	if vtable < 0 || vtable+4 > len(b) {
		return nil, errFlatbuf
	}
	vlen := int(binary.LittleEndian.Uint16(b[vtable:]))
	var regs []region
	for _, field := range []int{2, 3} { // dictionaries, recordBatches
		slot := vtable + 4 + 2*field
		if 4+2*field+2 > vlen || slot+2 > len(b) {
			continue // field absent
		}
		fo := int(binary.LittleEndian.Uint16(b[slot:]))
		if fo == 0 {
			continue
		}
		ref := table + fo
		rel, err := u32(ref)
		if err != nil {
			return nil, err
		}
		vec := ref + int(rel)
		n, err := u32(vec)
		if err != nil {
			return nil, err
		}
		if uint64(n)*24 > uint64(len(b)) {
			return nil, errFlatbuf
		}
		for i := 0; i < int(n); i++ {
			at := vec + 4 + 24*i
			if at < 0 || at+24 > len(b) {
				return nil, errFlatbuf
			}
			off := int64(binary.LittleEndian.Uint64(b[at:]))
			meta := int64(int32(binary.LittleEndian.Uint32(b[at+8:])))
			body := int64(binary.LittleEndian.Uint64(b[at+16:]))
			if off < 0 || meta < 0 || body < 0 {
				return nil, errFlatbuf
			}
			regs = append(regs, region{off, meta + body})
		}
	}
	return regs, nil
}
