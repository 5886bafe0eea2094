package storeio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// constructors is the matrix every Reader test runs over.
var constructors = []struct {
	name string
	new  func() (Reader, error)
}{
	{"pread-1", func() (Reader, error) { return NewPread(1), nil }},
	{"pread-4", func() (Reader, error) { return NewPread(4), nil }},
	{"pread-16", func() (Reader, error) { return NewPread(16), nil }},
	{"io_uring-1", func() (Reader, error) { return NewUring(UringOptions{Depth: 1}) }},
	{"io_uring-4", func() (Reader, error) { return NewUring(UringOptions{Depth: 4}) }},
	{"io_uring-64", func() (Reader, error) { return NewUring(UringOptions{}) }},
	{"auto", func() (Reader, error) { return New(Auto, 8) }},
}

// forEachReader runs f as a subtest for every constructor, skipping io_uring
// with the reason where the kernel refuses it.
func forEachReader(t *testing.T, f func(t *testing.T, r Reader)) {
	for _, c := range constructors {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.new()
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("io_uring unavailable: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			f(t, r)
		})
	}
}

// testFile writes size random bytes to a new file in dir and returns its path
// and contents.
func testFile(t testing.TB, dir string, size int, seed uint64) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 0x6b796c6978))
	for i := 0; i < size; i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < size; j++ {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	path := filepath.Join(dir, fmt.Sprintf("data-%d-%d", size, seed))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func openRead(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// check verifies every request against the file contents.
func check(t testing.TB, data []byte, reqs []*Request) {
	t.Helper()
	for i, r := range reqs {
		if r.Err != nil {
			t.Fatalf("request %d (off %d len %d): %v", i, r.Off, len(r.Buf), r.Err)
		}
		want := 0
		if r.Off < int64(len(data)) {
			want = min(len(r.Buf), len(data)-int(r.Off))
		}
		if r.N != want {
			t.Fatalf("request %d (off %d len %d): N = %d, want %d", i, r.Off, len(r.Buf), r.N, want)
		}
		if want > 0 && !bytes.Equal(r.Buf[:want], data[r.Off:r.Off+int64(want)]) {
			t.Fatalf("request %d (off %d len %d): bytes differ from the file", i, r.Off, len(r.Buf))
		}
	}
}

// randomRequests returns n unaligned requests on fd, some reaching or passing
// end of file.
func randomRequests(rng *rand.Rand, fd, size, n, maxLen int) []*Request {
	reqs := make([]*Request, n)
	for i := range reqs {
		off := rng.IntN(size + size/8) // about 1 in 9 starts past EOF
		reqs[i] = &Request{Fd: fd, Off: int64(off), Buf: make([]byte, 1+rng.IntN(maxLen))}
	}
	return reqs
}

func TestReadRandomUnaligned(t *testing.T) {
	const size = 3<<20 + 1234
	path, data := testFile(t, t.TempDir(), size, 1)
	f := openRead(t, path)
	forEachReader(t, func(t *testing.T, r Reader) {
		rng := rand.New(rand.NewPCG(2, 3))
		for range 5 {
			reqs := randomRequests(rng, int(f.Fd()), size, 300, 256<<10) // far more than any depth
			if err := r.Read(context.Background(), reqs); err != nil {
				t.Fatal(err)
			}
			check(t, data, reqs)
		}
	})
}

func TestReadEdges(t *testing.T) {
	const size = 10*BlockSize + 100
	path, data := testFile(t, t.TempDir(), size, 4)
	f := openRead(t, path)
	fd := int(f.Fd())
	forEachReader(t, func(t *testing.T, r Reader) {
		reqs := []*Request{
			{Fd: fd, Off: 0, Buf: make([]byte, size)},            // whole file
			{Fd: fd, Off: 0, Buf: make([]byte, size+5000)},       // past EOF
			{Fd: fd, Off: size - 1, Buf: make([]byte, 10)},       // last byte
			{Fd: fd, Off: size, Buf: make([]byte, 10)},           // at EOF
			{Fd: fd, Off: size + 1<<20, Buf: make([]byte, 4096)}, // far past EOF
			{Fd: fd, Off: 123, Buf: nil},                         // empty
			{Fd: fd, Off: 7, Buf: make([]byte, 1)},
		}
		for _, q := range reqs {
			q.N, q.Err = -1, errors.New("stale") // Read resets them
		}
		if err := r.Read(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
		check(t, data, reqs)
		if err := r.Read(context.Background(), nil); err != nil {
			t.Fatalf("empty batch: %v", err)
		}
	})
}

func TestReadErrors(t *testing.T) {
	path, data := testFile(t, t.TempDir(), 64<<10, 5)
	f := openRead(t, path)
	// Not the number of a closed file: it could be reused by then (by a
	// ring, say) and a read from it could block.
	const badFd = 1 << 24
	forEachReader(t, func(t *testing.T, r Reader) {
		good := &Request{Fd: int(f.Fd()), Off: 100, Buf: make([]byte, 1000)}
		bad := &Request{Fd: badFd, Off: 4096, Buf: make([]byte, 512)}
		neg := &Request{Fd: int(f.Fd()), Off: -1, Buf: make([]byte, 1)}
		err := r.Read(context.Background(), []*Request{good, bad, neg})
		if !errors.Is(err, syscall.EBADF) {
			t.Fatalf("Read = %v, want EBADF", err)
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("fd %d off 4096", badFd)) || !strings.Contains(msg, r.Name()) {
			t.Errorf("error %q does not name the reader, fd and offset", msg)
		}
		if !errors.Is(bad.Err, syscall.EBADF) || !errors.Is(neg.Err, syscall.EINVAL) {
			t.Errorf("per-request errors: bad %v, negative offset %v", bad.Err, neg.Err)
		}
		check(t, data, []*Request{good})
		if err := r.Read(context.Background(), []*Request{good, nil}); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("nil request: %v", err)
		}
	})
}

func TestReadConcurrent(t *testing.T) {
	const size = 2<<20 + 77
	dir := t.TempDir()
	path, data := testFile(t, dir, size, 6)
	path2, data2 := testFile(t, dir, size/3, 7)
	f, f2 := openRead(t, path), openRead(t, path2)
	forEachReader(t, func(t *testing.T, r Reader) {
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				for range 4 {
					fd, sz, d := int(f.Fd()), size, data
					if g%2 == 1 {
						fd, sz, d = int(f2.Fd()), size/3, data2
					}
					reqs := randomRequests(rng, fd, sz, 1+rng.IntN(100), 64<<10)
					if err := r.Read(context.Background(), reqs); err != nil {
						errs <- err
						return
					}
					for i, q := range reqs {
						want := 0
						if q.Off < int64(sz) {
							want = min(len(q.Buf), sz-int(q.Off))
						}
						if q.N != want || (want > 0 && !bytes.Equal(q.Buf[:q.N], d[q.Off:q.Off+int64(q.N)])) {
							errs <- fmt.Errorf("goroutine %d request %d: wrong bytes (N=%d want %d)", g, i, q.N, want)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestReadCanceled(t *testing.T) {
	const size = 8 << 20
	path, data := testFile(t, t.TempDir(), size, 8)
	f := openRead(t, path)
	forEachReader(t, func(t *testing.T, r Reader) {
		// Canceled before the call: nothing runs.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		reqs := []*Request{{Fd: int(f.Fd()), Off: 0, Buf: make([]byte, 10)}, {Fd: int(f.Fd()), Off: 5, Buf: make([]byte, 10)}}
		if err := r.Read(ctx, reqs); !errors.Is(err, context.Canceled) {
			t.Fatalf("Read with canceled ctx = %v", err)
		}
		for _, q := range reqs {
			if !errors.Is(q.Err, context.Canceled) || q.N != 0 {
				t.Fatalf("request after cancel: N %d err %v", q.N, q.Err)
			}
		}
	})

	// Canceled in the middle of a large batch: every request either completed
	// correctly or reports the cancellation having read only its first N
	// bytes, and no buffer changes after Read returns. A fresh reader per
	// round, so that Close can be used to wait for anything still in flight.
	// Plus a pread reader on a slow disk: each read takes 5 ms before it
	// copies, so a read in flight at the cancel surely writes its buffer and
	// sets N after a Read that returned without waiting for it has returned.
	slow := func(fd int, p []byte, off int64) (int, error) {
		time.Sleep(5 * time.Millisecond) // the disk's latency, not synchronisation
		return pread(fd, p, off)
	}
	matrix := append(constructors[:len(constructors):len(constructors)], struct {
		name string
		new  func() (Reader, error)
	}{"pread-4-slow", func() (Reader, error) { return newPread(4, slow), nil }})
	for _, c := range matrix {
		t.Run("mid-batch/"+c.name, func(t *testing.T) {
			for round := range 3 {
				r, err := c.new()
				if errors.Is(err, ErrUnavailable) {
					t.Skipf("io_uring unavailable: %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close() // on failure; Close is idempotent
				reqs := make([]*Request, 2048)
				for i := range reqs {
					reqs[i] = &Request{Fd: int(f.Fd()), Off: int64(i * 4096), Buf: bytes.Repeat([]byte{0xAA}, 4096)}
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() {
					// Not synchronisation but a fault point: the cancel
					// lands somewhere in the batch (or after it), the
					// rounds spread it, and every check below holds
					// wherever it lands.
					time.Sleep(time.Duration(round*200) * time.Microsecond)
					cancel()
				}()
				err = r.Read(ctx, reqs)
				type result struct {
					n   int
					err error
				}
				results := make([]result, len(reqs))
				for i, q := range reqs {
					results[i] = result{q.N, q.Err}
				}
				snap := make([][]byte, len(reqs))
				for i, q := range reqs {
					snap[i] = bytes.Clone(q.Buf)
				}
				// Close waits for every read the reader still has in
				// flight: one that outlived Read has written its buffer
				// by the time Close returns, and the comparison below
				// sees it (instead of hoping a sleep was long enough).
				if err := r.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				for i, q := range reqs {
					if !bytes.Equal(q.Buf, snap[i]) || q.N != results[i].n || q.Err != results[i].err {
						t.Fatalf("round %d, request %d: buffer or result written after Read returned", round, i)
					}
				}
				ok, canceled := 0, 0
				for i, q := range reqs {
					want := data[i*4096 : (i+1)*4096]
					switch {
					case q.Err == nil:
						ok++
						if q.N != 4096 || !bytes.Equal(q.Buf, want) {
							t.Fatalf("round %d, request %d: wrong bytes", round, i)
						}
					case errors.Is(q.Err, context.Canceled):
						canceled++
						if q.N < 0 || q.N > 4096 || !bytes.Equal(q.Buf[:q.N], want[:q.N]) ||
							!bytes.Equal(q.Buf[q.N:], bytes.Repeat([]byte{0xAA}, 4096-q.N)) {
							t.Fatalf("round %d, request %d: canceled with N = %d, but its buffer is not the first N bytes followed by what it held", round, i, q.N)
						}
					default:
						t.Fatalf("round %d, request %d: %v", round, i, q.Err)
					}
				}
				if canceled > 0 && !errors.Is(err, context.Canceled) {
					t.Fatalf("round %d: Read = %v with %d requests canceled", round, err, canceled)
				}
				t.Logf("round %d: %d read, %d canceled", round, ok, canceled)
			}
		})
	}
}

func TestReadAfterClose(t *testing.T) {
	path, _ := testFile(t, t.TempDir(), 4096, 10)
	f := openRead(t, path)
	forEachReader(t, func(t *testing.T, r Reader) {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		q := &Request{Fd: int(f.Fd()), Buf: make([]byte, 10)}
		if err := r.Read(context.Background(), []*Request{q}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Read after Close = %v, want ErrClosed", err)
		}
	})
}

// directDir returns a directory on a filesystem doing real O_DIRECT, or skips.
func directDir(t testing.TB) string {
	t.Helper()
	var reasons []string
	for _, base := range []string{os.TempDir(), "/var/tmp", "."} {
		dir, err := os.MkdirTemp(base, "storeio-direct-")
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		err = ProbeDirect(dir)
		if err == nil {
			return dir
		}
		reasons = append(reasons, err.Error())
	}
	t.Skipf("no directory with O_DIRECT: %s", strings.Join(reasons, "; "))
	return ""
}

func TestReadDirect(t *testing.T) {
	dir := directDir(t)
	const size = 2<<20 + 3000 // not a multiple of BlockSize: the last read ends at an unaligned EOF
	path, data := testFile(t, dir, size, 11)
	f, err := OpenDirect(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	forEachReader(t, func(t *testing.T, r Reader) {
		rng := rand.New(rand.NewPCG(12, 13))
		var reqs []*Request
		for range 200 {
			off := AlignDown(int64(rng.IntN(size + 64<<10)))
			reqs = append(reqs, &Request{Fd: fd, Off: off, Buf: AlignedBuffer(1 + rng.IntN(256<<10))})
		}
		reqs = append(reqs,
			&Request{Fd: fd, Off: 0, Buf: AlignedBuffer(size)},                        // whole file, EOF unaligned
			&Request{Fd: fd, Off: AlignDown(size), Buf: AlignedBuffer(BlockSize)},     // last partial block
			&Request{Fd: fd, Off: AlignUp(size), Buf: AlignedBuffer(BlockSize)},       // at aligned EOF+
			&Request{Fd: fd, Off: AlignUp(size) + 1<<20, Buf: AlignedBuffer(1 << 20)}, // far past EOF
		)
		for _, q := range reqs {
			if !IsAligned(q.Buf) {
				t.Fatal("AlignedBuffer returned an unaligned buffer")
			}
		}
		if err := r.Read(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
		check(t, data, reqs)

		// The kernel's alignment rule surfaces as EINVAL, per request.
		buf := AlignedBuffer(2 * BlockSize)
		bad := &Request{Fd: fd, Off: 1, Buf: buf[:BlockSize]}
		good := &Request{Fd: fd, Off: BlockSize, Buf: buf[BlockSize:]}
		if err := r.Read(context.Background(), []*Request{good, bad}); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("unaligned O_DIRECT read = %v, want EINVAL", err)
		}
		check(t, data, []*Request{good})
	})
}

func TestNew(t *testing.T) {
	for _, name := range []string{Auto, "", NamePread, NameUring} {
		r, err := New(name, 0)
		if name == NameUring && errors.Is(err, ErrUnavailable) {
			t.Logf("io_uring: %v", err)
			continue
		}
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		probe := Probe()
		switch {
		case name == NamePread:
			if r.Name() != NamePread || FallbackReason(r) != nil {
				t.Errorf("New(pread): %s, fallback %v", r.Name(), FallbackReason(r))
			}
		case probe == nil:
			if r.Name() != NameUring || FallbackReason(r) != nil {
				t.Errorf("New(%q) with io_uring available: %s, fallback %v", name, r.Name(), FallbackReason(r))
			}
		default:
			if r.Name() != NamePread || !errors.Is(FallbackReason(r), ErrUnavailable) {
				t.Errorf("New(%q) without io_uring (%v): %s, fallback %v", name, probe, r.Name(), FallbackReason(r))
			}
		}
		t.Logf("New(%q) = %s (probe: %v)", name, r.Name(), probe)
		r.Close()
	}
	if _, err := New("mmap", 0); err == nil {
		t.Error("New(mmap) succeeded")
	}
}

func TestAlign(t *testing.T) {
	for _, n := range []int{0, 1, BlockSize - 1, BlockSize, BlockSize + 1, 1 << 20, 3<<20 + 5} {
		b := AlignedBuffer(n)
		if !IsAligned(b) || len(b) != int(AlignUp(int64(n))) || len(b) < n || cap(b) != len(b) {
			t.Errorf("AlignedBuffer(%d): len %d cap %d aligned %v", n, len(b), cap(b), IsAligned(b))
		}
	}
	for _, c := range []struct{ x, down, up int64 }{{0, 0, 0}, {1, 0, 4096}, {4095, 0, 4096}, {4096, 4096, 4096}, {4097, 4096, 8192}} {
		if AlignDown(c.x) != c.down || AlignUp(c.x) != c.up {
			t.Errorf("Align(%d) = %d, %d", c.x, AlignDown(c.x), AlignUp(c.x))
		}
	}
}

func TestProbeDirect(t *testing.T) {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != 0x01021994 {
		t.Skip("/dev/shm is not tmpfs here")
	}
	if err := ProbeDirect("/dev/shm"); !errors.Is(err, ErrNoDirect) {
		t.Errorf("ProbeDirect(tmpfs) = %v, want ErrNoDirect", err)
	}
	if err := ProbeDirect(filepath.Join(t.TempDir(), "missing")); err == nil || errors.Is(err, ErrNoDirect) {
		t.Errorf("ProbeDirect(missing dir) = %v", err)
	}
}
