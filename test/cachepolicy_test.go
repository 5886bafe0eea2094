package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// packResidency evicts (evict) or measures the page-cache residency of
// every pack of the store at data: the share of their pages in memory.
func packResidency(t *testing.T, data string, evict bool) float64 {
	t.Helper()
	packs, err := filepath.Glob(filepath.Join(data, "packs", "*.pack"))
	require.NoError(t, err)
	require.NotEmpty(t, packs)
	var in, all int
	for _, p := range packs {
		f, err := os.Open(p)
		require.NoError(t, err)
		st, err := f.Stat()
		require.NoError(t, err)
		if evict {
			require.NoError(t, unix.Fdatasync(int(f.Fd())))
			require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		} else if st.Size() > 0 {
			m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
			require.NoError(t, err)
			vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
			_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
			require.Zero(t, errno, "mincore")
			for _, v := range vec {
				if v&1 != 0 {
					in++
				}
			}
			all += len(vec)
			require.NoError(t, unix.Munmap(m))
		}
		f.Close()
	}
	if all == 0 {
		return 0
	}
	return float64(in) / float64(all)
}

// TestLoadCachePolicy: `kylix load` of a model that fits half of the
// memory available reads its cold bytes through the page cache, so that
// the next load is warm (its packs are resident afterwards), and says so;
// `--io direct` leaves the cache as it was. (A model larger than the rule
// allows is read with O_DIRECT: gpuio.FitsPageCache, TestFitsPageCache.)
func TestLoadCachePolicy(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	model := demoModel(t, "64MiB")
	mustKylix(t, "/", "import", "--data", data, filepath.Join(model, "base"), "models/m")

	packResidency(t, data, true)
	require.Less(t, packResidency(t, data, false), 0.05, "the packs should be out of the page cache")
	out := mustKylix(t, "/", "load", "--data", data, "--device", "host", "--io", "direct", "--json", "models/m")
	var rep struct {
		CachePolicy string `json:"cache_policy"`
		Files       []struct {
			IO string `json:"io"`
		} `json:"files"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Empty(t, rep.CachePolicy, "--io direct chose; no policy applies")
	assert.Less(t, packResidency(t, data, false), 0.05, "--io direct filled the page cache")

	out = mustKylix(t, "/", "load", "--data", data, "--device", "host", "--json", "models/m")
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Contains(t, rep.CachePolicy, "through the page cache")
	for _, f := range rep.Files {
		assert.Equal(t, "page cache", f.IO)
	}
	assert.Greater(t, packResidency(t, data, false), 0.9, "a load that fits the cache left it cold")
}
