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
