//go:build linux

package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/cuda/cudatest"
)

const MiB = 1 << 20

// gpuContext skips without a GPU, else returns device 0's primary context,
// closed at the end of the test; a leak (an object still alive) fails it.
func gpuContext(t testing.TB) *cuda.Context {
	t.Helper()
	cudatest.RequireGPU(t)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctx.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	return ctx
}

func must[T any](t testing.TB) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 0x6b}))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func wait(t testing.TB, tr *cuda.Transfer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceInfo(t *testing.T) {
	cudatest.RequireGPU(t)
	path, _ := cuda.LibraryPath()
	n := must[int](t)(cuda.DeviceCount())
	t.Logf("library %s, %d device(s)", path, n)
	for i := 0; i < n; i++ {
		dev := must[cuda.Device](t)(cuda.GetDevice(i))
		in := must[cuda.DeviceInfo](t)(dev.Info())
		t.Logf("%s: %+v", dev, in)
		if in.Name == "" || in.TotalMem == 0 || in.Major < 1 || in.PCIBusID == "" || in.DriverVersion < 1000 {
			t.Errorf("implausible info %+v", in)
		}
		if !in.UnifiedAddressing {
			t.Errorf("no unified addressing on a 64-bit Linux GPU")
		}
	}
}

func TestContextRestoredOnThread(t *testing.T) {
	ctx := gpuContext(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := must[uintptr](t)(cuda.CurrentContextForTest())
	free, total := uint64(0), uint64(0)
	var err error
	if free, total, err = ctx.MemInfo(); err != nil {
		t.Fatal(err)
	}
	after := must[uintptr](t)(cuda.CurrentContextForTest())
	t.Logf("current before %#x after %#x; primary %#x; mem free %d of %d", before, after, ctx.Handle(), free, total)
	if before != after {
		t.Fatalf("current context changed from %#x to %#x", before, after)
	}
	if free == 0 || total < free {
		t.Fatalf("mem info %d/%d", free, total)
	}
}

// Many goroutines keep transfers in flight at once on a few streams; every
// byte is checked after the round trip.
func TestCopyManyGoroutines(t *testing.T) {
	ctx := gpuContext(t)
	const (
		workers   = 64
		chunks    = 4 // transfers in flight per worker
		chunkSize = 256 << 10
		span      = chunks * chunkSize
	)
	dst := must[*cuda.DeviceMem](t)(ctx.Alloc(workers * span))
	defer dst.Free()
	var streams []*cuda.Stream
	for _, p := range []cuda.WaitPolicy{cuda.WaitBlockingSync, cuda.WaitSpin, cuda.WaitPoll, cuda.WaitBlockingSync} {
		streams = append(streams, must[*cuda.Stream](t)(ctx.NewStreamWith(cuda.StreamOptions{Wait: p})))
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			hm, err := ctx.AllocHost(span)
			if err != nil {
				errs <- err
				return
			}
			copy(hm.Bytes(), randomBytes(uint64(w), span))
			s := streams[w%len(streams)]
			var trs []*cuda.Transfer
			for c := 0; c < chunks; c++ {
				tr, err := s.CopyHtoD(dst, w*span+c*chunkSize, hm, c*chunkSize, chunkSize)
				if err != nil {
					errs <- err
					return
				}
				trs = append(trs, tr)
			}
			for _, tr := range trs {
				select {
				case <-tr.Done():
					if tr.Err() != nil {
						errs <- tr.Err()
						return
					}
				case <-time.After(30 * time.Second):
					errs <- errors.New("transfer timed out")
					return
				}
			}
			if err := hm.Free(); err != nil {
				errs <- fmt.Errorf("free after done: %w", err)
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	el := time.Since(start)
	got := make([]byte, workers*span)
	must[int](t)(dst.ReadAt(got, 0))
	for w := 0; w < workers; w++ {
		if !bytes.Equal(got[w*span:(w+1)*span], randomBytes(uint64(w), span)) {
			t.Errorf("worker %d: data mismatch", w)
		}
	}
	for _, s := range streams {
		if n := s.InFlight(); n != 0 {
			t.Errorf("stream %s: %d in flight", s.Policy(), n)
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d workers x %d transfers of %d KiB on %d streams: %v (incl. pinned alloc)", workers, chunks, chunkSize>>10, len(streams), el)
}

func TestFreeWhileBusy(t *testing.T) {
	ctx := gpuContext(t)
	const size = 512 * MiB
	hm := must[*cuda.HostMem](t)(ctx.AllocHost(size))
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(size))
	s := must[*cuda.Stream](t)(ctx.NewStream())
	var trs []*cuda.Transfer
	for i := 0; i < 4; i++ {
		trs = append(trs, must[*cuda.Transfer](t)(s.CopyHtoD(dm, 0, hm, 0, size)))
	}
	if err := dm.Free(); !errors.Is(err, cuda.ErrBusy) {
		t.Errorf("DeviceMem.Free in flight: %v, want ErrBusy", err)
	}
	if err := hm.Free(); !errors.Is(err, cuda.ErrBusy) {
		t.Errorf("HostMem.Free in flight: %v, want ErrBusy", err)
	}
	if err := s.Close(); !errors.Is(err, cuda.ErrBusy) {
		t.Errorf("Stream.Close in flight: %v, want ErrBusy", err)
	}
	if err := ctx.Close(); !errors.Is(err, cuda.ErrBusy) {
		t.Errorf("Context.Close with live objects: %v, want ErrBusy", err)
	}
	t.Logf("busy: device %d, host %d, stream %d in flight", dm.Busy(), hm.Busy(), s.InFlight())
	// A cancelled wait returns at once and leaves the transfer in flight.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := trs[3].Wait(cctx); err != context.Canceled && err != nil {
		t.Errorf("cancelled wait: %v", err)
	}
	if err := s.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tr := range trs {
		if tr.Err() != nil {
			t.Fatal(tr.Err())
		}
	}
	if err := dm.Free(); err != nil {
		t.Errorf("free after wait: %v", err)
	}
	if err := dm.Free(); !errors.Is(err, cuda.ErrFreed) {
		t.Errorf("second free: %v, want ErrFreed", err)
	}
	if _, err := s.CopyHtoD(dm, 0, hm, 0, 1); !errors.Is(err, cuda.ErrFreed) {
		t.Errorf("copy into freed memory: %v, want ErrFreed", err)
	}
	if _, err := dm.ReadAt(make([]byte, 1), 0); !errors.Is(err, cuda.ErrFreed) {
		t.Errorf("read freed memory: %v, want ErrFreed", err)
	}
	if err := hm.Free(); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestRangeChecks(t *testing.T) {
	ctx := gpuContext(t)
	hm := must[*cuda.HostMem](t)(ctx.AllocHost(4096))
	defer hm.Free()
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(4096))
	defer dm.Free()
	s := must[*cuda.Stream](t)(ctx.NewStream())
	defer s.Close()
	for _, c := range [][3]int{{0, 0, 4097}, {1, 0, 4096}, {0, 1, 4096}, {-1, 0, 1}} {
		if _, err := s.CopyHtoD(dm, c[0], hm, c[1], c[2]); !errors.Is(err, cuda.ErrRange) {
			t.Errorf("CopyHtoD%v: %v, want ErrRange", c, err)
		}
	}
	if _, err := dm.ReadAt(make([]byte, 10), 4090); !errors.Is(err, cuda.ErrRange) {
		t.Errorf("ReadAt past end: %v", err)
	}
	if hm.Busy() != 0 || dm.Busy() != 0 {
		t.Errorf("failed copies left buffers busy")
	}
}

func TestStreamOpsAndSyncOps(t *testing.T) {
	ctx := gpuContext(t)
	const n = 8 * MiB
	a := must[*cuda.DeviceMem](t)(ctx.Alloc(n))
	defer a.Free()
	b := must[*cuda.DeviceMem](t)(ctx.Alloc(n))
	defer b.Free()
	hm := must[*cuda.HostMem](t)(ctx.AllocHost(n))
	defer hm.Free()
	s := must[*cuda.Stream](t)(ctx.NewStream())
	defer s.Close()

	must[*cuda.Transfer](t)(s.MemsetD8(a, 0, n, 0xAB))
	must[*cuda.Transfer](t)(s.CopyDtoD(b, 0, a, 0, n))
	wait(t, must[*cuda.Transfer](t)(s.CopyDtoH(hm, 0, b, 0, n)))
	if !bytes.Equal(hm.Bytes(), bytes.Repeat([]byte{0xAB}, n)) {
		t.Fatal("stream memset/DtoD/DtoH mismatch")
	}

	if err := cuda.MemsetD8(a, 100, 1000, 0x11); err != nil {
		t.Fatal(err)
	}
	if err := cuda.CopyDtoD(b, 0, a, 0, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	must[int](t)(b.ReadAt(got, 0))
	want := bytes.Repeat([]byte{0xAB}, 4096)
	copy(want[100:1100], bytes.Repeat([]byte{0x11}, 1000))
	if !bytes.Equal(got, want) {
		t.Fatal("sync memset/DtoD mismatch")
	}
	src := randomBytes(7, 12345)
	must[int](t)(a.WriteAt(src, 777))
	got = make([]byte, len(src))
	must[int](t)(a.ReadAt(got, 777))
	if !bytes.Equal(got, src) {
		t.Fatal("WriteAt/ReadAt mismatch")
	}
}

func TestWrapDevicePtr(t *testing.T) {
	ctx := gpuContext(t)
	owner := must[*cuda.DeviceMem](t)(ctx.Alloc(MiB))
	w := must[*cuda.DeviceMem](t)(ctx.WrapDevicePtr(owner.Ptr()+4096, 8192))
	if w.Owned() {
		t.Error("wrapped memory claims ownership")
	}
	if _, err := ctx.WrapDevicePtr(owner.Ptr()+MiB-100, 200); !errors.Is(err, cuda.ErrRange) {
		t.Errorf("wrap past the allocation: %v, want ErrRange", err)
	}
	if _, err := ctx.WrapDevicePtr(0x1000, 16); err == nil {
		t.Errorf("wrapping a non-device pointer succeeded")
	} else {
		t.Logf("wrap bogus pointer: %v", err)
	}
	data := randomBytes(3, 8192)
	must[int](t)(w.WriteAt(data, 0))
	got := make([]byte, 8192)
	must[int](t)(owner.ReadAt(got, 4096))
	if !bytes.Equal(got, data) {
		t.Fatal("write through wrapper not seen by owner")
	}
	if err := w.Free(); err != nil {
		t.Fatal(err)
	}
	must[int](t)(owner.ReadAt(got, 4096)) // still allocated
	if err := owner.Free(); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterHost(t *testing.T) {
	ctx := gpuContext(t)
	const n = 8 * MiB
	buf, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(buf)
	copy(buf, randomBytes(11, n))
	hm := must[*cuda.HostMem](t)(ctx.RegisterHost(buf))
	dp := must[uintptr](t)(hm.DevicePtr())
	canUse := must[bool](t)(ctx.Device().CanUseHostPointerForRegisteredMem())
	t.Logf("registered %#x, device pointer %#x, CanUseHostPointerForRegisteredMem=%v", hm.Ptr(), dp, canUse)
	if canUse && dp != hm.Ptr() {
		t.Errorf("device pointer %#x != host pointer %#x", dp, hm.Ptr())
	}
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(n))
	defer dm.Free()
	s := must[*cuda.Stream](t)(ctx.NewStream())
	defer s.Close()
	wait(t, must[*cuda.Transfer](t)(s.CopyHtoD(dm, 0, hm, 0, n)))
	got := make([]byte, n)
	must[int](t)(dm.ReadAt(got, 0))
	if !bytes.Equal(got, buf) {
		t.Fatal("registered-host copy mismatch")
	}
	if err := hm.Free(); err != nil {
		t.Fatal(err)
	}
	// Unregistered, the buffer can be registered again.
	h2 := must[*cuda.HostMem](t)(ctx.RegisterHost(buf[:4096]))
	if err := h2.Free(); err != nil {
		t.Fatal(err)
	}
}

func TestEventTiming(t *testing.T) {
	ctx := gpuContext(t)
	const n = 256 * MiB
	hm := must[*cuda.HostMem](t)(ctx.AllocHost(n))
	defer hm.Free()
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(n))
	defer dm.Free()
	s := must[*cuda.Stream](t)(ctx.NewStream())
	defer s.Close()
	start := must[*cuda.Event](t)(ctx.NewEvent(cuda.EventDefault))
	defer start.Destroy()
	end := must[*cuda.Event](t)(ctx.NewEvent(cuda.EventBlockingSync))
	defer end.Destroy()
	for i := 0; i < 2; i++ { // the first round warms up
		if err := start.Record(s); err != nil {
			t.Fatal(err)
		}
		tr := must[*cuda.Transfer](t)(s.CopyHtoD(dm, 0, hm, 0, n))
		if err := end.Record(s); err != nil {
			t.Fatal(err)
		}
		if err := end.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if done, err := end.Query(); err != nil || !done {
			t.Fatalf("query after synchronize: %v %v", done, err)
		}
		wait(t, tr)
		el := must[time.Duration](t)(cuda.ElapsedTime(start, end))
		if el <= 0 {
			t.Fatalf("elapsed %v", el)
		}
		t.Logf("H2D %d MiB pinned: %v GPU time = %.1f GB/s", n>>20, el, float64(n)/el.Seconds()/1e9)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWaitPolicies measures what completion detection costs: the latency of
// a small copy from issue to Wait returning, and the throughput and CPU use
// of many large copies in flight, for each policy.
func TestWaitPolicies(t *testing.T) {
	ctx := gpuContext(t)
	const (
		big     = 8 * MiB
		nBig    = 256
		streams = 4
		small   = 4096
		nSmall  = 2000
	)
	hm := must[*cuda.HostMem](t)(ctx.AllocHost(big * streams))
	defer hm.Free()
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(big * streams))
	defer dm.Free()
	for _, p := range []cuda.WaitPolicy{cuda.WaitBlockingSync, cuda.WaitSpin, cuda.WaitPoll} {
		var ss []*cuda.Stream
		for i := 0; i < streams; i++ {
			ss = append(ss, must[*cuda.Stream](t)(ctx.NewStreamWith(cuda.StreamOptions{Wait: p})))
		}
		// Latency: one small copy at a time.
		wait(t, must[*cuda.Transfer](t)(ss[0].CopyHtoD(dm, 0, hm, 0, small)))
		c0, t0 := cpuTime(), time.Now()
		for i := 0; i < nSmall; i++ {
			wait(t, must[*cuda.Transfer](t)(ss[0].CopyHtoD(dm, 0, hm, 0, small)))
		}
		lat := time.Since(t0) / nSmall
		latCPU := float64(cpuTime()-c0) / float64(time.Since(t0))

		// Throughput: 4 goroutines, one per stream, 4 copies in flight each.
		c0, t0 = cpuTime(), time.Now()
		var wg sync.WaitGroup
		for g := 0; g < streams; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				var q []*cuda.Transfer
				for i := 0; i < nBig/streams; i++ {
					tr, err := ss[g].CopyHtoD(dm, g*big, hm, g*big, big)
					if err != nil {
						t.Error(err)
						return
					}
					q = append(q, tr)
					if len(q) == 4 {
						if err := q[0].Wait(context.Background()); err != nil {
							t.Error(err)
						}
						q = q[1:]
					}
				}
				for _, tr := range q {
					tr.Wait(context.Background())
				}
			}(g)
		}
		wg.Wait()
		el := time.Since(t0)
		thrCPU := float64(cpuTime()-c0) / float64(el)
		t.Logf("policy %-13s small-copy round trip %7.1fµs (%.2f cores busy); %d x 8 MiB on %d streams: %5.1f GB/s (%.2f cores busy)",
			p, float64(lat)/1e3, latCPU, nBig, streams, float64(nBig*big)/el.Seconds()/1e9, thrCPU)
		for _, s := range ss {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
	}
	// Baseline without the poller: the calling thread synchronizes the
	// stream itself.
	s := must[*cuda.Stream](t)(ctx.NewStream())
	defer s.Close()
	t0 := time.Now()
	for i := 0; i < nSmall; i++ {
		tr := must[*cuda.Transfer](t)(s.CopyHtoD(dm, 0, hm, 0, small))
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		wait(t, tr)
	}
	t.Logf("baseline cuStreamSynchronize on the caller + Wait: %7.1fµs per small copy", float64(time.Since(t0)/nSmall)/1e3)
}

func TestCuFile(t *testing.T) {
	cudatest.RequireGPU(t)
	info, err := cuda.CuFileStatus()
	t.Logf("CuFileStatus: mode=%s\n  reason: %s\n  library=%s version=%d nvidia-fs=%v udev=%v config=%s allow_compat=%v force_compat=%v p2pdma=%v",
		info.Mode, info.Reason, info.Library, info.Version, info.NvidiaFS, info.UdevData, info.ConfigPath, info.AllowCompat, info.ForceCompat, info.PCIP2PDMA)
	if info.Props != nil {
		t.Logf("  props: %+v filesystems=%v", *info.Props, info.Props.Filesystems())
	}
	if _, statErr := os.Stat("/proc/driver/nvidia-fs"); statErr != nil && info.Mode == cuda.CuFileNative {
		t.Errorf("mode native without /proc/driver/nvidia-fs")
	}
	if info.Mode == cuda.CuFileAbsent {
		if !errors.Is(err, cuda.ErrUnavailable) {
			t.Errorf("absent without ErrUnavailable: %v", err)
		}
		t.Skipf("cuFile absent: %s", info.Reason)
	}
	if err != nil {
		t.Fatalf("mode %s with error %v", info.Mode, err)
	}

	// cuFile refuses files whose block device it cannot identify (udev):
	// probe a disk directory and tmpfs, and read from the first that works.
	var dir string
	for _, d := range []string{diskTempDir(t), "/dev/shm"} {
		var st syscall.Statfs_t
		syscall.Statfs(d, &st)
		err := cuda.CuFileProbe(d)
		t.Logf("CuFileProbe(%s) (fs magic %#x): %v", d, st.Type, err)
		if err == nil && dir == "" {
			dir = d
		}
	}
	if dir == "" {
		t.Skip("cuFile registers no file here (see the probes above)")
	}

	ctx := gpuContext(t)
	const size = 16 * MiB
	data := randomBytes(99, size)
	f, err := os.CreateTemp(dir, "weights-*.bin")
	if err != nil {
		t.Fatal(err)
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECT, 0)
	direct := err == nil
	if err != nil {
		t.Logf("O_DIRECT open failed (%v); using a buffered fd", err)
		if fd, err = syscall.Open(path, syscall.O_RDONLY, 0); err != nil {
			t.Fatal(err)
		}
	}
	defer syscall.Close(fd)
	fh := must[*cuda.FileHandle](t)(cuda.HandleRegister(fd))
	dm := must[*cuda.DeviceMem](t)(ctx.Alloc(size))
	if err := cuda.BufRegister(dm); err != nil {
		t.Errorf("BufRegister: %v (reading unregistered)", err)
	}
	// Four concurrent reads of 4 MiB each, at 1 MiB-aligned offsets.
	const part = 4 * MiB
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n, err := fh.Read(dm, part, int64(i*part), i*part)
			if err != nil || n != part {
				t.Errorf("read %d: n=%d err=%v", i, n, err)
			}
		}(i)
	}
	wg.Wait()
	el := time.Since(t0)
	got := make([]byte, size)
	must[int](t)(dm.ReadAt(got, 0))
	if !bytes.Equal(got, data) {
		t.Fatal("cuFileRead data mismatch")
	}
	// A short read at the end of the file.
	n, err := fh.Read(dm, 2*MiB, size-MiB, 0)
	if err != nil || n != MiB {
		t.Errorf("read across EOF: n=%d err=%v, want %d", n, err, MiB)
	}
	t.Logf("cuFileRead from %s (O_DIRECT=%v): 16 MiB in 4 concurrent reads in %v", dir, direct, el)
	if err := fh.Close(); err != nil {
		t.Error(err)
	}
	if _, err := fh.Read(dm, 1, 0, 0); !errors.Is(err, cuda.ErrFreed) {
		t.Errorf("read on closed handle: %v", err)
	}
	if err := dm.Free(); err != nil { // deregisters from cuFile
		t.Error(err)
	}
	if err := cuda.FileDriverClose(); err != nil {
		t.Errorf("FileDriverClose: %v", err)
	}
}

// diskTempDir prefers a directory on the working directory's file system
// (a real disk, where O_DIRECT works) over $TMPDIR (often tmpfs).
func diskTempDir(t *testing.T) string {
	if d := os.Getenv("KYLIX_TEST_DIR"); d != "" {
		return d
	}
	d, err := os.MkdirTemp(".", ".cufile-test-")
	if err != nil {
		return t.TempDir()
	}
	abs, _ := filepath.Abs(d)
	t.Cleanup(func() { os.RemoveAll(abs) })
	return abs
}

func BenchmarkCopyHtoD(b *testing.B) {
	ctx := gpuContext(b)
	const n = 8 * MiB
	hm := must[*cuda.HostMem](b)(ctx.AllocHost(n))
	defer hm.Free()
	dm := must[*cuda.DeviceMem](b)(ctx.Alloc(n))
	defer dm.Free()
	s := must[*cuda.Stream](b)(ctx.NewStream())
	defer s.Close()
	b.SetBytes(n)
	var q []*cuda.Transfer
	for i := 0; i < b.N; i++ {
		q = append(q, must[*cuda.Transfer](b)(s.CopyHtoD(dm, 0, hm, 0, n)))
		if len(q) == 4 {
			q[0].Wait(context.Background())
			q = q[1:]
		}
	}
	s.Wait(context.Background())
}
