package chunking

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Files of the formats are written by the formats' own libraries
// (parquet-go, Apache Arrow's Go implementation), not by us.

type row struct {
	ID    int64  `parquet:"id"`
	Text  string `parquet:"text"`
	Label int32  `parquet:"label"`
}

func rows(r *rand.Rand, from, n int) []row {
	out := make([]row, n)
	for i := range out {
		b := make([]byte, 40+r.IntN(400))
		for j := range b {
			b[j] = 'a' + byte(r.IntN(26))
		}
		out[i] = row{ID: int64(from + i), Text: string(b), Label: int32(r.IntN(10))}
	}
	return out
}

func writeParquet(t testing.TB, rs []row, perGroup int64) []byte {
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[row](&buf, parquet.MaxRowsPerRowGroup(perGroup))
	for i := 0; i < len(rs); i += int(perGroup) {
		_, err := w.Write(rs[i:min(len(rs), i+int(perGroup))])
		require.NoError(t, err)
		require.NoError(t, w.Flush())
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// chunkSet is the set of chunk contents of b cut by spans.
func chunkSet(b []byte, spans []Span) map[string]bool {
	out := map[string]bool{}
	for _, c := range spanBytes(b, spans) {
		out[string(c)] = true
	}
	return out
}

func TestParquetSpans(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	rs := rows(r, 0, 40000)
	b := writeParquet(t, rs[:30000], 5000)
	cdc := DefaultCDC()
	spans, err := ParquetSpans(bytes.NewReader(b), int64(len(b)), cdc)
	require.NoError(t, err)
	checkTiles(t, spans, int64(len(b)))
	// Every column chunk parquet-go's reader sees begins and ends at a cut.
	f, err := parquet.OpenFile(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	cuts := map[int64]bool{}
	for _, s := range spans {
		cuts[s.Off], cuts[s.End()] = true, true
	}
	groups := f.Metadata().RowGroups
	require.Len(t, groups, 6)
	for _, g := range groups {
		for _, c := range g.Columns {
			start := c.MetaData.DataPageOffset
			if d := c.MetaData.DictionaryPageOffset; d > 0 && d < start {
				start = d
			}
			assert.True(t, cuts[start] && cuts[start+c.MetaData.TotalCompressedSize], "column %v at %d+%d is not cut at its ends", c.MetaData.PathInSchema, start, c.MetaData.TotalCompressedSize)
		}
	}
	// The data set gains row groups: every column chunk of the old file
	// is a chunk of the new one.
	b2 := writeParquet(t, rs, 5000)
	s2, err := ParquetSpans(bytes.NewReader(b2), int64(len(b2)), cdc)
	require.NoError(t, err)
	newSet := chunkSet(b2, s2)
	var shared, total int
	for _, c := range spanBytes(b, spans) {
		total += len(c)
		if newSet[string(c)] {
			shared += len(c)
		}
	}
	t.Logf("parquet: %d of %d bytes of the old file are chunks of the new one", shared, total)
	assert.Greater(t, float64(shared)/float64(total), 0.97)

	// Two files merged into one (compaction): the second file's row
	// groups sit at other offsets there. Cut at column chunks, all of
	// its bytes are chunks of the merged file; cut by CDC alone, the
	// chunks across the boundaries are lost.
	other := rows(r, 40000, 15000)
	bB := writeParquet(t, other, 5000)
	bC := writeParquet(t, append(append([]row(nil), rs[:30000]...), other...), 5000)
	share := func(split func([]byte) []Span) float64 {
		set := chunkSet(bC, split(bC))
		var shared, total int
		for _, c := range spanBytes(bB, split(bB)) {
			total += len(c)
			if set[string(c)] {
				shared += len(c)
			}
		}
		return float64(shared) / float64(total)
	}
	aligned := share(func(b []byte) []Span {
		s, err := ParquetSpans(bytes.NewReader(b), int64(len(b)), cdc)
		require.NoError(t, err)
		return s
	})
	byCDC := share(cdc.SplitBytes)
	t.Logf("parquet merge: the second file's bytes shared with the merged file: %.3f cut at column chunks, %.3f by CDC", aligned, byCDC)
	assert.Greater(t, aligned, 0.97)
	assert.Greater(t, aligned, byCDC)
}

func TestParquetSpansBad(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	b := writeParquet(t, rows(r, 0, 3000), 1000)
	n := len(b)
	cases := map[string][]byte{
		"no magic":       append([]byte("PAR0"), b[4:]...),
		"footer too big": func() []byte { c := bytes.Clone(b); c[n-8], c[n-7], c[n-6] = 0xff, 0xff, 0xff; return c }(),
		"footer garbage": func() []byte {
			c := bytes.Clone(b)
			ml := int(c[n-8]) | int(c[n-7])<<8 | int(c[n-6])<<16
			for i := n - 8 - ml; i < n-8; i++ {
				c[i] = 0xff
			}
			return c
		}(),
		"truncated": b[:n/2],
		"tiny":      []byte("PAR1PAR1"),
	}
	for name, c := range cases {
		_, err := ParquetSpans(bytes.NewReader(c), int64(len(c)), DefaultCDC())
		assert.ErrorIs(t, err, ErrBadParquet, name)
	}
}

func FuzzParquetSpans(f *testing.F) {
	r := rand.New(rand.NewPCG(25, 26))
	f.Add(writeParquet(f, rows(r, 0, 200), 50))
	f.Fuzz(func(t *testing.T, b []byte) {
		spans, err := ParquetSpans(bytes.NewReader(b), int64(len(b)), DefaultCDC())
		if err != nil {
			if !errors.Is(err, ErrBadParquet) {
				t.Fatalf("not ErrBadParquet: %v", err)
			}
			return
		}
		checkTiles(t, spans, int64(len(b)))
	})
}

func writeArrow(t testing.TB, batches, perBatch int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	schema := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64}, {Name: "text", Type: arrow.BinaryTypes.String}}, nil)
	var buf bytes.Buffer
	w, err := ipc.NewFileWriter(&buf, ipc.WithSchema(schema))
	require.NoError(t, err)
	mem := memory.NewGoAllocator()
	for i := 0; i < batches; i++ {
		bld := array.NewRecordBuilder(mem, schema)
		for j := 0; j < perBatch; j++ {
			bld.Field(0).(*array.Int64Builder).Append(int64(i*perBatch + j))
			bld.Field(1).(*array.StringBuilder).Append(fmt.Sprintf("row %d %x", i*perBatch+j, r.Uint64()))
		}
		rec := bld.NewRecordBatch()
		require.NoError(t, w.Write(rec))
		rec.Release()
		bld.Release()
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func TestArrowSpans(t *testing.T) {
	b := writeArrow(t, 12, 20000, 7)
	cdc := DefaultCDC()
	spans, err := ArrowSpans(bytes.NewReader(b), int64(len(b)), cdc)
	require.NoError(t, err)
	checkTiles(t, spans, int64(len(b)))
	// Arrow's reader reads the file; every batch region begins with an
	// IPC message's continuation marker.
	rd, err := ipc.NewFileReader(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, 12, rd.NumRecords())
	regs := 0
	for _, s := range spans {
		if bytes.HasPrefix(b[s.Off:], []byte{0xff, 0xff, 0xff, 0xff}) {
			regs++
		}
	}
	assert.GreaterOrEqual(t, regs, 12)
	// More batches written after the same ones: the old batches' chunks
	// are all in the new file.
	b2 := writeArrow(t, 20, 20000, 7)
	s2, err := ArrowSpans(bytes.NewReader(b2), int64(len(b2)), cdc)
	require.NoError(t, err)
	newSet := chunkSet(b2, s2)
	var shared, total int
	for _, c := range spanBytes(b, spans) {
		total += len(c)
		if newSet[string(c)] {
			shared += len(c)
		}
	}
	t.Logf("arrow: %d of %d bytes of the old file are chunks of the new one", shared, total)
	assert.Greater(t, float64(shared)/float64(total), 0.97)

	for name, c := range map[string][]byte{
		"stream, no footer": b[:len(b)-10],
		"footer garbage": func() []byte {
			c := bytes.Clone(b)
			for i := len(c) - 200; i < len(c)-10; i++ {
				c[i] = 0x7f
			}
			return c
		}(),
	} {
		_, err := ArrowSpans(bytes.NewReader(c), int64(len(c)), cdc)
		assert.ErrorIs(t, err, ErrBadArrow, name)
	}
}

func FuzzArrowSpans(f *testing.F) {
	f.Add(writeArrow(f, 2, 10, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		spans, err := ArrowSpans(bytes.NewReader(b), int64(len(b)), DefaultCDC())
		if err != nil {
			if !errors.Is(err, ErrBadArrow) {
				t.Fatalf("not ErrBadArrow: %v", err)
			}
			return
		}
		checkTiles(t, spans, int64(len(b)))
	})
}
