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
	select {
	case err := <-done:
		t.Fatalf("Read returned after a short read: %v (N=%d)", err, q.N)
	case <-time.After(50 * time.Millisecond):
	}
	pw.Write(want[100:])
	if err := <-done; err != nil || q.N != len(want) || !bytes.Equal(q.Buf, want) {
		t.Fatalf("Read = %v, N = %d", err, q.N)
	}

	// End of file after a short read: N < len(Buf), no error.
	q = &Request{Fd: int(pr.Fd()), Buf: make([]byte, 100)}
	go func() { done <- u.Read(context.Background(), []*Request{q}) }()
	pw.Write(want[:30])
	time.Sleep(10 * time.Millisecond)
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
	time.Sleep(20 * time.Millisecond)
	cancel()
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
