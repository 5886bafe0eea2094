package gpuio

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// PageCacheShare is the part of the memory available to the kernel
// (MemAvailable) a load may take of the page cache: a load at most this
// large reads its cold bytes through the cache, so that repeating it is a
// warm load; a larger one reads them with O_DIRECT and evicts nothing
// (docs/design/gpuio.md, "One page-cache policy").
const PageCacheShare = 0.5

// FitsPageCache reports whether a load of n bytes fits the page cache by
// that rule, and says why in words (for reports). A machine whose
// /proc/meminfo cannot be read is treated as one where nothing fits.
func FitsPageCache(n int64) (bool, string) {
	avail, err := MemAvailable()
	if err != nil {
		return false, fmt.Sprintf("cold bytes read with O_DIRECT (memory available unknown: %v)", err)
	}
	limit := int64(float64(avail) * PageCacheShare)
	if n <= limit {
		return true, fmt.Sprintf("cold bytes read through the page cache: the load (%d bytes) fits half of the memory available (%d bytes), so a repeat is warm", n, avail)
	}
	return false, fmt.Sprintf("cold bytes read with O_DIRECT: the load (%d bytes) is more than half of the memory available (%d bytes), so it evicts nothing", n, avail)
}

// MemAvailable is MemAvailable of /proc/meminfo in bytes.
func MemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemAvailable %q", f[1])
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemAvailable")
}
