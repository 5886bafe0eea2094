package test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/internal/testneeds"
	"github.com/stretchr/testify/require"
)

// startStubGPUNode starts a node whose CUDA driver is the stub of package
// cuda's tests (cuda/testdata/stub: "device memory" is host memory, and its
// IPC handles name files the client maps too), so FILL runs end to end on
// a machine without a GPU: protocol, fd check, IPC open, the driver's bounds,
// the gpuio pipeline, verification, idle release.
func startStubGPUNode(t *testing.T, data, mnt string, extra ...string) (*node, string) {
	t.Helper()
	cc := testneeds.Command(t, "cc", "gcc libc6-dev") // builds the stub CUDA driver
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real GPU is here: scripts/gpu-onramp.sh tests FILL")
	}
	lib := t.TempDir()
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", filepath.Join(lib, "libcuda.so.1"), "../cuda/testdata/stub/libcuda.c").CombinedOutput(); err != nil {
		t.Fatalf("building the stub driver: %v\n%s", err, out)
	}
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "client.sock")
	n := launchNode(t, data, mnt, []string{"LD_LIBRARY_PATH=" + lib, "CUFILE_ENV_PATH_JSON=" + filepath.Join(lib, "none.json")},
		func() bool { return clientAnswers(sock) }, append([]string{"--client-socket", sock}, extra...)...)
	return n, sock
}

// shmAlloc is "device memory" the client exports: a file the stub driver
// maps in the node.
type shmAlloc struct {
	path   string
	handle [64]byte
	size   int
}

func newShmAlloc(t *testing.T, size int) *shmAlloc {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "kyf")
	if err != nil {
		t.Skipf("needs /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a := &shmAlloc{path: f.Name(), size: size}
	copy(a.handle[:], "KYLXSHM\x00")
	binary.LittleEndian.PutUint64(a.handle[8:], uint64(size))
	if len(f.Name()) > 47 {
		t.Fatalf("shm path %s too long for the stub handle", f.Name())
	}
	copy(a.handle[16:], f.Name())
	return a
}

func (a *shmAlloc) bytes(t *testing.T) []byte {
	b, err := os.ReadFile(a.path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fillReq(a *shmAlloc, dstOff, fileOff, n uint64, ranges ...clientproto.Range) []byte {
	return clientproto.FillRequest{IPCHandle: a.handle, DstOffset: dstOff, FileOffset: fileOff, Length: n, Ranges: ranges}.Append(nil)
}

// TestClientFillStubGPU: FILL places exactly the file's bytes at the
// offsets asked, single and multi-range; refuses writes past the
// allocation the driver reports (whatever the caller claims) and ranges
// past the file, before writing anything; kylix node reports the context;
// it is given back after --gpu-idle.
func TestClientFillStubGPU(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(20<<20+777, 79)
	importFiles(t, data, map[string][]byte{"big": want})
	n, sock := startStubGPUNode(t, data, mnt, "--gpu-idle", "1s")
	c := dialClient(t, sock)
	f := openRO(t, filepath.Join(mnt, "m/big"))

	a := newShmAlloc(t, 24<<20)
	r := c.req(clientproto.OpFill, fillReq(a, 4096, 0, uint64(len(want))), int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("FILL: %d %s\n%s", r.status, r.msg, n.log)
	}
	fr, err := clientproto.ParseFillReply(r.fields)
	if err != nil || fr.Bytes != uint64(len(want)) || fr.Path == "" || fr.Verified == "no" {
		t.Fatalf("FILL reply %+v (%v)", fr, err)
	}
	t.Logf("FILL: %+v", fr)
	got := a.bytes(t)
	if !bytes.Equal(got[4096:4096+len(want)], want) {
		t.Fatal("the allocation does not hold the file's bytes")
	}
	if !bytes.Equal(got[:4096], make([]byte, 4096)) || !bytes.Equal(got[4096+len(want):], make([]byte, len(got)-4096-len(want))) {
		t.Fatal("FILL wrote outside the range asked")
	}

	// Several ranges, out of order, into a fresh allocation.
	b := newShmAlloc(t, 8<<20)
	rs := []clientproto.Range{{FileOffset: 17 << 20, Length: 3 << 20, DstOffset: 0}, {FileOffset: 5, Length: 1 << 20, DstOffset: 5 << 20}, {FileOffset: 9 << 20, Length: 100, DstOffset: 7 << 20}}
	r = c.req(clientproto.OpFill, fillReq(b, 0, 0, 0, rs...), int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("multi-range FILL: %d %s", r.status, r.msg)
	}
	got = b.bytes(t)
	for _, x := range rs {
		if !bytes.Equal(got[x.DstOffset:x.DstOffset+x.Length], want[x.FileOffset:x.FileOffset+x.Length]) {
			t.Errorf("range %+v: wrong bytes", x)
		}
	}

	// Strided ranges (a share split along a later dimension): rows packed
	// densely, mixed with a plain range, several batches' worth of rows.
	sa := newShmAlloc(t, 8<<20)
	srs := []clientproto.Range{
		{FileOffset: 1000, Length: 300, DstOffset: 0, Rows: 7000, Pitch: 1000},               // 2.1 MB in rows of 300
		{FileOffset: 12 << 20, Length: 1 << 20, DstOffset: 3 << 20},                          // plain
		{FileOffset: 3 << 20, Length: 64 << 10, DstOffset: 5 << 20, Rows: 8, Pitch: 1 << 20}, // rows longer than a page
	}
	r = c.req(clientproto.OpFill, clientproto.FillRequest{IPCHandle: sa.handle, Flags: clientproto.FillStrided, Ranges: srs}.Append(nil), int(f.Fd()))
	if r.status != 0 {
		t.Fatalf("strided FILL: %d %s", r.status, r.msg)
	}
	fr, err = clientproto.ParseFillReply(r.fields)
	if err != nil || fr.Bytes != 7000*300+1<<20+8*64<<10 {
		t.Fatalf("strided FILL reply %+v (%v): bytes placed must be the share's, not the rows' span", fr, err)
	}
	got = sa.bytes(t)
	for _, x := range srs {
		for row := uint64(0); row < max(1, x.Rows); row++ {
			d, o := x.DstOffset+row*x.Length, x.FileOffset+row*x.Pitch
			if !bytes.Equal(got[d:d+x.Length], want[o:o+x.Length]) {
				t.Fatalf("strided range %+v row %d: wrong bytes", x, row)
			}
		}
	}

	// Refusals: nothing is written.
	z := newShmAlloc(t, 1<<20)
	strided := func(rs ...clientproto.Range) []byte {
		return clientproto.FillRequest{IPCHandle: z.handle, Flags: clientproto.FillStrided, Ranges: rs}.Append(nil)
	}
	for _, tc := range []struct {
		name string
		body []byte
		want syscall.Errno
	}{
		{"past the allocation", fillReq(z, 1<<20-100, 0, 4096), syscall.EFAULT},
		{"offset near 2^64", fillReq(z, ^uint64(0)-10, 0, 4096), syscall.EFAULT},
		{"one range of many past the allocation", fillReq(z, 0, 0, 0, clientproto.Range{Length: 10}, clientproto.Range{Length: 4096, DstOffset: 1<<20 - 1}), syscall.EFAULT},
		{"past the file", fillReq(z, 0, uint64(len(want))-10, 4096), syscall.EINVAL},
		{"file offset near 2^64", fillReq(z, 0, ^uint64(0)-10, 4096), syscall.EINVAL},
		{"strided rows past the file", strided(clientproto.Range{FileOffset: 0, Length: 10, Rows: 3, Pitch: uint64(len(want)) / 2}), syscall.EINVAL},
		{"strided rows that overlap", strided(clientproto.Range{Length: 10, Rows: 2, Pitch: 5}), syscall.EINVAL},
		{"strided rows overflowing", strided(clientproto.Range{Length: 1, Rows: 1 << 63, Pitch: 1 << 62}), syscall.EINVAL},
		{"strided rows past the allocation", strided(clientproto.Range{Length: 1000, Rows: 1100, Pitch: 1000}), syscall.EFAULT},
		{"strided size overflowing", strided(clientproto.Range{Length: 1 << 20, Rows: 1 << 44, Pitch: 0}), syscall.EINVAL},
		{"garbage handle", clientproto.FillRequest{Length: 10}.Append(nil), syscall.EINVAL},
		{"no such device", clientproto.FillRequest{Device: 7, IPCHandle: z.handle, Length: 10}.Append(nil), syscall.ENODEV},
	} {
		r := c.req(clientproto.OpFill, tc.body, int(f.Fd()))
		if r.status != -int32(tc.want) {
			t.Errorf("%s: status %d (%s), want -%d (%v)", tc.name, r.status, r.msg, int(tc.want), tc.want)
		}
	}
	if !bytes.Equal(z.bytes(t), make([]byte, 1<<20)) {
		t.Error("a refused FILL wrote into the allocation")
	}

	out := mustKylix(t, t.TempDir(), "node", "--data", data)
	if !strings.Contains(out, "cuda:0: CUDA context held") || !strings.Contains(out, "3 GPU fills") {
		t.Errorf("kylix node during fills:\n%s", out)
	}
	// Per process: what it was given, and what was read for it.
	if !strings.Contains(out, fmt.Sprintf("filled:   pid %d (uid %d) on cuda:0: 3 fills", os.Getpid(), os.Getuid())) {
		t.Errorf("kylix node lists no fills for this process:\n%s", out)
	}
	var ns struct {
		Clients struct {
			ByProcess []struct {
				PID       int   `json:"pid"`
				Bytes     int64 `json:"bytes"`
				ReadBytes int64 `json:"read_bytes"`
			} `json:"by_process"`
		} `json:"clients"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, t.TempDir(), "node", "--json", "--data", data)), &ns))
	require.Len(t, ns.Clients.ByProcess, 1)
	placed := int64(len(want)) + 3<<20 + 1<<20 + 100 + 7000*300 + 1<<20 + 8*64<<10
	require.Equal(t, os.Getpid(), ns.Clients.ByProcess[0].PID)
	require.Equal(t, placed, ns.Clients.ByProcess[0].Bytes)
	require.GreaterOrEqual(t, ns.Clients.ByProcess[0].ReadBytes, placed, "whole chunks are read for what is placed")
	waitFor(t, 20*time.Second, "the context given back after --gpu-idle", func() bool {
		return strings.Contains(mustKylix(t, t.TempDir(), "node", "--data", data), "no CUDA context held")
	})
	// And taken again.
	r = c.req(clientproto.OpFill, fillReq(z, 0, 0, 1<<20), int(f.Fd()))
	if r.status != 0 || !bytes.Equal(z.bytes(t), want[:1<<20]) {
		t.Fatalf("FILL after the idle release: %d %s", r.status, r.msg)
	}
}

// TestClientFillConcurrent: 6 clients fill 6 allocations at once, each
// gets the file's bytes.
func TestClientFillConcurrent(t *testing.T) {
	requireFUSE(t)
	data, mnt := dirs(t)
	want := randomBytes(12<<20, 83)
	importFiles(t, data, map[string][]byte{"big": want})
	_, sock := startStubGPUNode(t, data, mnt)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	allocs := make([]*shmAlloc, 6)
	for i := range allocs {
		allocs[i] = newShmAlloc(t, len(want))
	}
	for i := range allocs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialClient(t, sock)
			f, err := os.Open(filepath.Join(mnt, "m/big"))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for range 3 {
				r := c.req(clientproto.OpFill, fillReq(allocs[i], 0, 0, uint64(len(want))), int(f.Fd()))
				if r.status != 0 {
					errs <- fmt.Errorf("client %d: %d %s", i, r.status, r.msg)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, a := range allocs {
		if !bytes.Equal(a.bytes(t), want) {
			t.Errorf("client %d: wrong bytes", i)
		}
	}
}
