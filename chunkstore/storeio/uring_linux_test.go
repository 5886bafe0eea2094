package storeio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newTestUring(t *testing.T, depth int) *uringReader {
	t.Helper()
	r, err := NewUring(UringOptions{Depth: depth})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("io_uring unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r.(*uringReader)
}

// A read shorter than asked, not at end of file, is resubmitted for the rest:
// a pipe gives short reads on demand.
func TestUringShortReadPipe(t *testing.T) {
	u := newTestUring(t, 4)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	want := bytes.Repeat([]byte("kylix"), 40) // 200 bytes
	q := &Request{Fd: int(pr.Fd()), Buf: make([]byte, len(want))}
	done := make(chan error, 1)
	go func() { done <- u.Read(context.Background(), []*Request{q}) }()
	pw.Write(want[:100])
	// The ring is the pipe's only reader: once the pipe is empty, a read
	// has returned those 100 bytes alone (a short read), and the rest is
	// written after it. A Read that took the short read for the whole
	// request returns N = 100.
	waitPipeDrained(t, pr)
	pw.Write(want[100:])
	if err := <-done; err != nil || q.N != len(want) || !bytes.Equal(q.Buf, want) {
		t.Fatalf("Read = %v, N = %d (a short read was taken for the whole request?)", err, q.N)
	}

	// End of file after a short read: N < len(Buf), no error.
	q = &Request{Fd: int(pr.Fd()), Buf: make([]byte, 100)}
	go func() { done <- u.Read(context.Background(), []*Request{q}) }()
	pw.Write(want[:30])
	waitPipeDrained(t, pr) // a short read of 30 first, then EOF
	pw.Close()
	if err := <-done; err != nil || q.N != 30 || !bytes.Equal(q.Buf[:30], want[:30]) {
		t.Fatalf("Read at EOF = %v, N = %d", err, q.N)
	}
}

// Cancelling a Read waits for the read in flight: the buffer is the
// kernel's until Read returns.
func TestUringCancelWaitsForInflight(t *testing.T) {
	u := newTestUring(t, 1)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	path, _ := testFile(t, t.TempDir(), 1<<20, 20)
	f := openRead(t, path)
	blocked := &Request{Fd: int(pr.Fd()), Buf: make([]byte, 8)}
	var later []*Request // depth 1: these wait behind the blocked read
	for i := range 10 {
		later = append(later, &Request{Fd: int(f.Fd()), Off: int64(i) << 10, Buf: make([]byte, 1024)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Read(ctx, append([]*Request{blocked}, later...)) }()
	// Cancel once the blocked read holds the ring's only slot: Read submits
	// a read unconditionally once it has taken its slot, so from then on the
	// read is (or is about to be) in flight whatever the context says.
	deadline := time.Now().Add(10 * time.Second)
	for len(u.free) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pipe read did not take the ring's slot within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	// Not synchronisation: nothing may happen here. A Read that returned on
	// cancel without waiting for the kernel is caught here (it returns at
	// once), and below (the in-flight read's result is missing).
	select {
	case err := <-done:
		t.Fatalf("Read returned while a read was in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	pw.Write([]byte("12345678"))
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Read = %v, want context.Canceled", err)
	}
	if blocked.Err != nil || blocked.N != 8 || string(blocked.Buf) != "12345678" {
		t.Fatalf("in-flight read: N %d err %v", blocked.N, blocked.Err)
	}
}

// Requests longer than one SQE (and so, any short read) are read in pieces,
// on plain and O_DIRECT descriptors.
func TestUringPieces(t *testing.T) {
	const size = 1<<20 + 5000
	dir := t.TempDir()
	path, data := testFile(t, dir, size, 21)
	f := openRead(t, path)
	for _, maxLen := range []int{BlockSize, 3*BlockSize + 17} {
		t.Run(fmt.Sprint(maxLen), func(t *testing.T) {
			u := newTestUring(t, 8)
			u.maxLen = maxLen
			rng := rand.New(rand.NewPCG(22, 23))
			reqs := randomRequests(rng, int(f.Fd()), size, 50, 200<<10)
			if err := u.Read(context.Background(), reqs); err != nil {
				t.Fatal(err)
			}
			check(t, data, reqs)
		})
	}
	if err := ProbeDirect(dir); err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	d, err := OpenDirect(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	u := newTestUring(t, 8)
	u.maxLen = 2 * BlockSize
	reqs := []*Request{
		{Fd: int(d.Fd()), Off: 0, Buf: AlignedBuffer(size)},
		{Fd: int(d.Fd()), Off: BlockSize, Buf: AlignedBuffer(300 << 10)},
	}
	if err := u.Read(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	check(t, data, reqs)
}

func TestProbe(t *testing.T) {
	err := Probe()
	if err != nil && !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Probe = %v: not ErrUnavailable", err)
	}
	t.Logf("Probe: %v", err)
}

func TestUnavailableErrors(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSYS, syscall.EPERM, syscall.EACCES, syscall.ENOMEM} {
		err := unavailable("io_uring_setup", errno)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errno) {
			t.Errorf("%v: %v", errno, err)
		}
	}
	if err := unavailable("io_uring_setup", syscall.EINVAL); errors.Is(err, ErrUnavailable) {
		t.Errorf("EINVAL: %v", err)
	}
}

// waitPipeDrained waits until the pipe holds no unread bytes (FIONREAD), that
// is until a read has taken what was written into it.
func waitPipeDrained(t *testing.T, r *os.File) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := unix.IoctlGetInt(int(r.Fd()), unix.TIOCINQ) // FIONREAD
		if err != nil {
			t.Fatalf("FIONREAD on the pipe: %v", err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read took the %d bytes in the pipe within 10s", n)
		}
		time.Sleep(time.Millisecond)
	}
}
