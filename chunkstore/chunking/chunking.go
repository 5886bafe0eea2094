// Package chunking decides where chunk boundaries go in a file.
//
// Two strategies, chosen per file by Detect:
//
//   - Tensor-aware (TensorSpans) for safetensors files: the header is one
//     span, each tensor one or more spans, large tensors cut at fixed offsets
//     from the tensor's own start. Two versions of a model that share a tensor
//     then share its chunks even when the header length, and so every tensor's
//     file offset, changes. A tensor is also a plain range read of whole chunks.
//   - Content-defined (CDC, FastCDC) for everything else: boundaries follow the
//     content, so an insertion or deletion changes only the chunks around it.
//
// The package only computes spans; hashing and storing them is the chunk
// store's business. See docs/design/chunking.md for the measurements behind
// the default sizes.
package chunking

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kylix/kylix/chunkstore/safetensors"
)

// Span is a byte range [Off, Off+Len) of a file. Spans returned by this
// package have Len > 0, are in order, and tile the file exactly.
type Span struct {
	Off, Len int64
}

// End returns Off+Len.
func (s Span) End() int64 { return s.Off + s.Len }

// DefaultTensorChunk is the largest span TensorSpans makes by default: a
// tensor longer than this is cut every DefaultTensorChunk bytes from its
// start. On the demo model pair, 1, 4 and 16 MiB store exactly the same bytes
// (fine-tunes change whole tensors), so the choice is about I/O:
// 4 MiB is the same maximum as DefaultCDCMax, so every chunk in the store
// fits one buffer size; it is a large unit of I/O (a few ms on disk or
// network) that still splits a big tensor into many chunks fetched in
// parallel, and it keeps edits inside a tensor (appended vocabulary rows,
// partial updates) from costing more than 4 MiB each. See
// docs/design/chunking.md.
const DefaultTensorChunk = 4 << 20

// TensorSpans returns the spans of a safetensors file of fileSize bytes whose
// header h was parsed (safetensors.Parse) from that file:
//
//   - [0, h.DataStart()) — the 8-byte length and the JSON header — is one span;
//   - each tensor of non-zero length is one span, or, when longer than
//     maxChunk, spans of maxChunk bytes measured from the tensor's own start
//     (the last one shorter), so the cut points inside a tensor do not move
//     when the header length changes;
//   - holes between tensors and any tail after the last one are spans of
//     their own, cut the same way from the hole's start.
//
// maxChunk <= 0 means DefaultTensorChunk. The spans always tile [0, fileSize)
// exactly, even for a header that does not match the file (its tensors are
// then clipped to the file).
func TensorSpans(h *safetensors.Header, fileSize int64, maxChunk int64) []Span {
	if maxChunk <= 0 {
		maxChunk = DefaultTensorChunk
	}
	if fileSize <= 0 {
		return nil
	}
	spans := make([]Span, 0, len(h.Tensors)+2)
	cut := func(from, to int64) {
		for o := from; o < to; o += maxChunk {
			spans = append(spans, Span{o, min(maxChunk, to-o)})
		}
	}
	ds := min(max(h.DataStart(), 0), fileSize)
	if ds > 0 {
		spans = append(spans, Span{0, ds})
	}
	pos := ds
	for _, t := range h.Tensors {
		b, e := min(ds+t.Begin, fileSize), min(ds+t.End, fileSize)
		if e <= pos {
			continue // empty, or overlapping a tensor already placed
		}
		if b > pos {
			cut(pos, b) // a hole
		}
		b = max(b, pos)
		cut(b, e)
		pos = e
	}
	cut(pos, fileSize)
	return spans
}

// Format is how a file is chunked.
type Format int

const (
	// FormatOpaque files are chunked by content (CDC).
	FormatOpaque Format = iota
	// FormatSafetensors files are chunked at tensor boundaries (TensorSpans).
	FormatSafetensors
	// FormatTar files (*.tar: WebDataset shards and other tar archives) are
	// chunked at member boundaries (TarSpans).
	FormatTar
	// FormatLines files (*.jsonl, *.ndjson, *.csv, *.tsv) are chunked by
	// content with every cut at a line's end (LineSpans).
	FormatLines
	// FormatParquet files (*.parquet) are chunked at column chunks
	// (ParquetSpans).
	FormatParquet
	// FormatArrow files (*.arrow, *.feather: the Arrow IPC file format)
	// are chunked at record batches and dictionaries (ArrowSpans).
	FormatArrow
)

func (f Format) String() string {
	switch f {
	case FormatOpaque:
		return "opaque"
	case FormatSafetensors:
		return "safetensors"
	case FormatTar:
		return "tar"
	case FormatLines:
		return "lines"
	case FormatParquet:
		return "parquet"
	case FormatArrow:
		return "arrow"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// ErrBadSafetensors reports a file named *.safetensors whose header does not
// parse. Detect's error wraps both it and the parser's error
// (safetensors.ErrMalformed, or the read error).
var ErrBadSafetensors = errors.New("file named .safetensors is not valid safetensors")

// Detect decides how the file name, of size bytes readable through r, is
// chunked. A name ending in ".safetensors" (any case) is parsed: if it parses,
// Detect returns FormatSafetensors and the header, for TensorSpans. If it does
// not, Detect does not fall back silently: it returns an error wrapping
// ErrBadSafetensors, together with FormatOpaque, the format to use if the
// caller decides to store the file anyway (with CDC). A name ending in
// ".tar" is FormatTar, one ending in ".jsonl", ".ndjson", ".csv" or ".tsv"
// FormatLines, ".parquet" FormatParquet and ".arrow" or ".feather"
// FormatArrow, by name alone (their Spans functions check the content).
// Any other name is FormatOpaque with no error; its content is not read.
func Detect(name string, r io.ReaderAt, size int64) (Format, *safetensors.Header, error) {
	lower := strings.ToLower(name)
	switch {
	case strings.HasSuffix(lower, ".tar"):
		return FormatTar, nil, nil
	case strings.HasSuffix(lower, ".jsonl"), strings.HasSuffix(lower, ".ndjson"),
		strings.HasSuffix(lower, ".csv"), strings.HasSuffix(lower, ".tsv"):
		return FormatLines, nil, nil
	case strings.HasSuffix(lower, ".parquet"):
		return FormatParquet, nil, nil
	case strings.HasSuffix(lower, ".arrow"), strings.HasSuffix(lower, ".feather"):
		return FormatArrow, nil, nil
	}
	if !strings.HasSuffix(lower, ".safetensors") {
		return FormatOpaque, nil, nil
	}
	h, err := safetensors.Parse(r, size)
	if err != nil {
		return FormatOpaque, nil, fmt.Errorf("%w: %s: %w", ErrBadSafetensors, name, err)
	}
	return FormatSafetensors, h, nil
}
