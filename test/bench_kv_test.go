package test

// TestBenchKVHostTier (KYLIX_BENCH=1): put and get of 2 MiB KV blocks
// through the client socket's host tier (a memfd buffer shared with the
// node), against a plain memcpy of the same bytes in one process.
//
//	KYLIX_BENCH=1 go test ./test -run 'TestBenchKVHostTier$' -count=1 -v
//
// KYLIX_BENCH_REPS sets the repeats (default 5); medians are reported.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
)

func TestBenchKVHostTier(t *testing.T) {
	benchGate(t)
	const bs, batch, blocks = 2 << 20, 64, 256 // 512 MiB in batches of 128 MiB
	data, mnt := dirs(t)
	sockDir := t.TempDir()
	os.Chmod(sockDir, 0o755)
	sock := filepath.Join(sockDir, "client.sock")
	launchNode(t, data, mnt, nil, func() bool { return clientAnswers(sock) },
		"--client-socket", sock, "--kv-block", "2MiB", "--kv-mem", "768MiB")
	c := dialClient(t, sock)
	fd, err := unix.MemfdCreate("kv-bench", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, batch*bs))
	buf, err := unix.Mmap(fd, 0, batch*bs, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(buf)
	copy(buf, randomBytes(len(buf), 5))
	keysOf := func(round, b int) [][32]byte {
		ks := make([][32]byte, batch)
		for i := range ks {
			copy(ks[i][:], fmt.Sprintf("r%d-b%d-k%d", round, b, i))
		}
		return ks
	}
	reps := envInt("KYLIX_BENCH_REPS", 5)
	var put, get, mem []float64
	dst := make([]byte, len(buf))
	for r := range reps {
		start := time.Now()
		for b := range blocks / batch {
			rep := c.req(clientproto.OpKVPut, clientproto.KVBlocksRequest{Device: clientproto.KVDeviceHost, Keys: keysOf(r, b)}.Append(nil), fd)
			require.Zero(t, rep.status, rep.msg)
			_, st, err := clientproto.ParseKVPut(rep.fields)
			require.NoError(t, err)
			for _, s := range st {
				require.Zero(t, s)
			}
		}
		put = append(put, float64(blocks*bs)/time.Since(start).Seconds()/1e9)
		start = time.Now()
		for b := range blocks / batch {
			rep := c.req(clientproto.OpKVGet, clientproto.KVBlocksRequest{Device: clientproto.KVDeviceHost, Keys: keysOf(r, b)}.Append(nil), fd)
			require.Zero(t, rep.status, rep.msg)
			_, tiers, err := clientproto.ParseKVTiers(rep.fields)
			require.NoError(t, err)
			for _, tr := range tiers {
				require.Equal(t, byte(clientproto.KVMemory), tr)
			}
		}
		get = append(get, float64(blocks*bs)/time.Since(start).Seconds()/1e9)
		start = time.Now()
		for range blocks / batch {
			copy(dst, buf)
		}
		mem = append(mem, float64(blocks*bs)/time.Since(start).Seconds()/1e9)
		mustKylix(t, "", "kv", "clear", "--data", data)
	}
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	t.Logf("KV host tier, %d blocks of %d MiB in batches of %d, %d reps: put %.2f GB/s %v, get %.2f GB/s %v, memcpy %.2f GB/s %v",
		blocks, bs>>20, batch, reps, med(put), put, med(get), get, med(mem), mem)
}
