package chunking

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
)

// Default CDC sizes for the store. A 1 MiB average is where dedup of model
// files and transfer efficiency meet: models change whole tensors, which are
// megabytes, so smaller chunks find almost nothing more to share
// (docs/design/chunking.md measures Xet's 64 KiB against it) while costing 16
// times the chunk count, index entries and per-chunk requests. The 4 MiB
// maximum bounds the memory one chunk read needs; the 256 KiB minimum
// (average/4, FastCDC's usual ratio) keeps tiny chunks out.
const (
	DefaultCDCMin = 256 << 10
	DefaultCDCAvg = 1 << 20
	DefaultCDCMax = 4 << 20
)

// Hugging Face Xet's chunk sizes, for comparison: 64 KiB average, 8 KiB
// minimum, 128 KiB maximum.
const (
	XetCDCMin = 8 << 10
	XetCDCAvg = 64 << 10
	XetCDCMax = 128 << 10
)

// CDC is a FastCDC content-defined chunker (Xia et al., "FastCDC: a Fast and
// Efficient Content-Defined Chunking Approach for Data Deduplication", USENIX
// ATC 2016): a gear rolling hash, cut-point skipping up to the minimum size,
// and normalized chunking (level 2) — a harder cut condition before the
// average size and an easier one after it, which narrows the size
// distribution around the average. Boundaries depend only on the content
// since the previous boundary, so the same bytes always chunk the same way.
//
// A CDC is immutable and safe for concurrent use.
type CDC struct {
	min, avg, max int
	maskS, maskL  uint64
}

// NewCDC returns a chunker whose chunks are at least min and at most max
// bytes (except a last, shorter chunk) and about avg bytes on average. avg is
// rounded to the nearest power of two, the cut condition's granularity. It
// needs 64 <= min < avg < max <= 1 GiB.
func NewCDC(min, avg, max int) (*CDC, error) {
	if min < 64 || min >= avg || avg >= max || max > 1<<30 {
		return nil, fmt.Errorf("CDC sizes min %d avg %d max %d: need 64 <= min < avg < max <= 1 GiB", min, avg, max)
	}
	b := bits.Len(uint(avg)) - 1 // floor(log2(avg))
	if avg-(1<<b) > (1<<(b+1))-avg {
		b++
	}
	// The gear hash's high bits depend on the last 64 bytes, its low bits on
	// only the last few, so the masks take the top bits.
	top := func(n int) uint64 { return ^uint64(0) << (64 - n) }
	return &CDC{min: min, avg: avg, max: max, maskS: top(b + 2), maskL: top(b - 2)}, nil
}

// Sizes returns the chunker's min, avg and max.
func (c *CDC) Sizes() (min, avg, max int) { return c.min, c.avg, c.max }

func (c *CDC) String() string { return fmt.Sprintf("CDC(min %d, avg %d, max %d)", c.min, c.avg, c.max) }

var (
	defaultCDC = sync.OnceValue(func() *CDC { return mustCDC(DefaultCDCMin, DefaultCDCAvg, DefaultCDCMax) })
	xetCDC     = sync.OnceValue(func() *CDC { return mustCDC(XetCDCMin, XetCDCAvg, XetCDCMax) })
)

// DefaultCDC returns the store's chunker for files that are not tensor-aware:
// min 256 KiB, avg 1 MiB, max 4 MiB.
func DefaultCDC() *CDC { return defaultCDC() }

// XetCDC returns a chunker with Hugging Face Xet's sizes (min 8 KiB, avg 64
// KiB, max 128 KiB), for comparison. It is this package's FastCDC with Xet's
// parameters, not a byte-exact copy of Xet's chunker.
func XetCDC() *CDC { return xetCDC() }

func mustCDC(min, avg, max int) *CDC {
	c, err := NewCDC(min, avg, max)
	if err != nil {
		panic(err)
	}
	return c
}

// Cut returns the length of the chunk that starts at data[0]. It returns 0
// when it cannot decide yet: no boundary in data, len(data) < max and
// !atEOF; call again with more data (at least max bytes when the file has
// them, to avoid rescanning). With atEOF, the rest of data is the last chunk
// if no boundary is found. The result does not depend on how much data past
// the boundary is supplied.
func (c *CDC) Cut(data []byte, atEOF bool) int {
	n := len(data)
	if n <= c.min {
		if atEOF {
			return n
		}
		return 0
	}
	end := min(n, c.max)
	normal := min(end, c.avg)
	d := data[:end]
	var h uint64
	i := c.min
	for ; i < normal; i++ {
		h = h<<1 + gear[d[i]]
		if h&c.maskS == 0 {
			return i + 1
		}
	}
	for ; i < len(d); i++ {
		h = h<<1 + gear[d[i]]
		if h&c.maskL == 0 {
			return i + 1
		}
	}
	if end == c.max || atEOF {
		return end
	}
	return 0
}

// SplitBytes returns the spans of data, all of it.
func (c *CDC) SplitBytes(data []byte) []Span {
	var spans []Span
	var off int
	for off < len(data) {
		n := c.Cut(data[off:], true)
		spans = append(spans, Span{int64(off), int64(n)})
		off += n
	}
	return spans
}

// Split reads r to the end and calls fn with each chunk in order: its span
// (offsets from where r started) and its bytes, which are valid only during
// the call. It holds at most 2*max bytes of r in memory.
func (c *CDC) Split(r io.Reader, fn func(s Span, chunk []byte) error) error {
	buf := make([]byte, 2*c.max)
	var start, end int
	var off int64
	eof := false
	for {
		if !eof && end-start < c.max {
			end = copy(buf, buf[start:end])
			start = 0
			for !eof && end < len(buf) {
				n, err := r.Read(buf[end:])
				end += n
				if errors.Is(err, io.EOF) {
					eof = true
				} else if err != nil {
					return fmt.Errorf("read at %d: %w", off+int64(end-start), err)
				}
			}
		}
		if start == end && eof {
			return nil
		}
		n := c.Cut(buf[start:end], eof)
		if n == 0 {
			continue // unreachable: with end-start >= max or eof, Cut decides
		}
		if err := fn(Span{off, int64(n)}, buf[start:start+n]); err != nil {
			return err
		}
		start += n
		off += int64(n)
	}
}

// SpansReaderAt returns the CDC spans of the size bytes of r.
func (c *CDC) SpansReaderAt(r io.ReaderAt, size int64) ([]Span, error) {
	var spans []Span
	err := c.Split(io.NewSectionReader(r, 0, size), func(s Span, _ []byte) error {
		spans = append(spans, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n := len(spans); (n == 0 && size != 0) || (n > 0 && spans[n-1].End() != size) {
		return nil, fmt.Errorf("%w: reader ended before %d bytes", io.ErrUnexpectedEOF, size)
	}
	return spans, nil
}

// gear is the gear hash table: 256 pseudo-random 64-bit values from
// splitmix64 with a fixed seed. Changing it changes every CDC boundary, and so
// every chunk id of every opaque file already stored: never change it.
var gear = func() (t [256]uint64) {
	s := uint64(0x6b796c6978676561) // "kylixgea"
	for i := range t {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		t[i] = z ^ (z >> 31)
	}
	return t
}()
