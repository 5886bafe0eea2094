package test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRecordChunkingDedups: import cuts tar archives at their members and
// JSON-lines files at line ends, through the real CLI and GNU tar. A
// directory of samples, a tar of it and a tar of the same samples in
// reverse order cost the samples' bytes once: each tar adds only its
// headers. Rows inserted in the middle of a .jsonl file add about what was
// inserted. Every file reads back byte for byte.
func TestRecordChunkingDedups(t *testing.T) {
	work := t.TempDir()
	data := filepath.Join(work, "data")
	src := filepath.Join(work, "src")
	require.NoError(t, os.MkdirAll(src, 0o755))
	r := rand.New(rand.NewPCG(11, 12))
	var names []string
	var sampleBytes int64
	for i := 0; i < 300; i++ {
		n := fmt.Sprintf("%05d.bin", i)
		b := make([]byte, 1024+r.IntN(60<<10))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		require.NoError(t, os.WriteFile(filepath.Join(src, n), b, 0o644))
		names = append(names, n)
		sampleBytes += int64(len(b))
	}
	run(t, src, "tar", "-cf", filepath.Join(work, "a.tar"), ".")
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	list := filepath.Join(work, "list")
	require.NoError(t, os.WriteFile(list, []byte(strings.Join(names, "\n")+"\n"), 0o644))
	run(t, src, "tar", "-cf", filepath.Join(work, "b.tar"), "-T", list)

	mustKylix(t, "/", "import", "--data", data, src, "ds/files")
	u0 := uniqueBytes(t, data, "ds")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "a.tar"), "ds/a.tar")
	u1 := uniqueBytes(t, data, "ds")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "b.tar"), "ds/b.tar")
	u2 := uniqueBytes(t, data, "ds")
	t.Logf("samples %d B; unique: files %d, +a.tar %d, +b.tar %d", sampleBytes, u0, u1-u0, u2-u1)
	// Headers and padding: at most 2 KiB a member (512 B of header, up to
	// 511 of padding, GNU tar's record padding at the end).
	assert.Less(t, u1-u0, int64(300*2048+20480), "a.tar stored its samples again")
	assert.Less(t, u2-u1, int64(300*2048+20480), "b.tar (the same samples reversed) stored them again")

	// JSON lines: rows inserted in the middle.
	var v1 bytes.Buffer
	row := func(b *bytes.Buffer, i int) {
		fmt.Fprintf(b, `{"id": %d, "text": "%x"}`+"\n", i, r.Uint64()*uint64(i+1))
	}
	for i := 0; v1.Len() < 12<<20; i++ {
		row(&v1, i)
	}
	mid := bytes.IndexByte(v1.Bytes()[v1.Len()/2:], '\n') + v1.Len()/2 + 1
	var v2 bytes.Buffer
	v2.Write(v1.Bytes()[:mid])
	for i := 0; i < 1000; i++ {
		row(&v2, -i)
	}
	v2.Write(v1.Bytes()[mid:])
	require.NoError(t, os.WriteFile(filepath.Join(work, "v1.jsonl"), v1.Bytes(), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "v2.jsonl"), v2.Bytes(), 0o644))
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "v1.jsonl"), "ds/v1.jsonl")
	u3 := uniqueBytes(t, data, "ds")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "v2.jsonl"), "ds/v2.jsonl")
	u4 := uniqueBytes(t, data, "ds")
	t.Logf("jsonl: v1 %d B, v2 added %d unique bytes (%d inserted)", u3-u2, u4-u3, v2.Len()-v1.Len())
	assert.Less(t, u4-u3, int64(v2.Len())/3, "v2 shares most of v1's chunks")

	// Byte for byte, out of the store.
	out := filepath.Join(work, "out")
	mustKylix(t, "/", "export", "--data", data, "ds", out)
	for _, f := range []string{"a.tar", "b.tar", "v1.jsonl", "v2.jsonl"} {
		run(t, "/", "cmp", filepath.Join(work, f), filepath.Join(out, f))
	}
	// A broken tar is still stored byte for byte, with a note saying why
	// it was not cut at members.
	bad, err := os.ReadFile(filepath.Join(work, "a.tar"))
	require.NoError(t, err)
	bad[148] ^= 0x01 // the first header's checksum field
	require.NoError(t, os.WriteFile(filepath.Join(work, "bad.tar"), bad, 0o644))
	_, errs, code := kylix(t, "/", "import", "--data", data, filepath.Join(work, "bad.tar"), "ds/bad.tar")
	assert.Equal(t, 0, code)
	assert.Contains(t, errs, "not a valid tar archive")
	mustKylix(t, "/", "export", "--data", data, "ds/bad.tar", filepath.Join(work, "bad.out"))
	run(t, "/", "cmp", filepath.Join(work, "bad.tar"), filepath.Join(work, "bad.out"))
}

// TestColumnarImport: Parquet files (written by parquet-go) through the
// CLI: a file of more row groups than an earlier one stores little more
// than its new row groups; a truncated one and one with a corrupt footer
// are stored byte for byte with a note saying why they were not cut at
// column chunks.
func TestColumnarImport(t *testing.T) {
	work := t.TempDir()
	data := filepath.Join(work, "data")
	type row struct {
		ID   int64  `parquet:"id"`
		Text string `parquet:"text"`
	}
	write := func(name string, n int) []byte {
		var buf bytes.Buffer
		w := parquet.NewGenericWriter[row](&buf, parquet.MaxRowsPerRowGroup(4000))
		rs := make([]row, 0, 4000)
		rr := rand.New(rand.NewPCG(33, 34)) // the same rows in every file
		for i := 0; i < n; i++ {
			rs = append(rs, row{ID: int64(i), Text: fmt.Sprintf("%x %x", rr.Uint64(), rr.Uint64())})
			if len(rs) == cap(rs) || i == n-1 {
				_, err := w.Write(rs)
				require.NoError(t, err)
				require.NoError(t, w.Flush())
				rs = rs[:0]
			}
		}
		require.NoError(t, w.Close())
		require.NoError(t, os.WriteFile(filepath.Join(work, name), buf.Bytes(), 0o644))
		return buf.Bytes()
	}
	v1 := write("v1.parquet", 60000)
	v2 := write("v2.parquet", 80000)
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "v1.parquet"), "ds/v1.parquet")
	u1 := uniqueBytes(t, data, "ds")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(work, "v2.parquet"), "ds/v2.parquet")
	u2 := uniqueBytes(t, data, "ds")
	t.Logf("parquet: v1 %d B stored %d; v2 %d B added %d", len(v1), u1, len(v2), u2-u1)
	assert.Less(t, u2-u1, int64(len(v2)-len(v1))+int64(len(v2))/20, "v2 stored v1's row groups again")

	for name, b := range map[string][]byte{
		"cut.parquet":    v1[:len(v1)/2],
		"footer.parquet": append(append(bytes.Clone(v1[:len(v1)-8]), 0xff, 0xff, 0xff, 0x7f), []byte("PAR1")...),
	} {
		require.NoError(t, os.WriteFile(filepath.Join(work, name), b, 0o644))
		_, errs, code := kylix(t, "/", "import", "--data", data, filepath.Join(work, name), "ds/"+name)
		assert.Equal(t, 0, code, errs)
		assert.Contains(t, errs, "not a valid Parquet file", name)
		out := filepath.Join(work, name+".out")
		mustKylix(t, "/", "export", "--data", data, "ds/"+name, out)
		run(t, "/", "cmp", filepath.Join(work, name), out)
	}
}
