package storeio

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pread reader retries short reads and EINTR until the buffer is full or
// a read returns 0.
func TestPreadShortReads(t *testing.T) {
	path, data := testFile(t, t.TempDir(), 1<<20+99, 30)
	f := openRead(t, path)
	calls := 0
	flaky := func(fd int, p []byte, off int64) (int, error) {
		calls++ // one worker: no race
		if calls%3 == 0 {
			return -1, syscall.EINTR
		}
		return pread(fd, p[:min(len(p), 1000+calls%5000)], off)
	}
	p := newPread(1, flaky)
	defer p.Close()
	reqs := []*Request{
		{Fd: int(f.Fd()), Off: 0, Buf: make([]byte, len(data)+10000)},
		{Fd: int(f.Fd()), Off: 12345, Buf: make([]byte, 100000)},
	}
	if err := p.Read(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	check(t, data, reqs)

	stuck := newPread(1, func(int, []byte, int64) (int, error) { return -1, syscall.EAGAIN })
	defer stuck.Close()
	if err := stuck.Read(context.Background(), []*Request{{Fd: 0, Buf: make([]byte, 1)}}); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("endless EAGAIN: %v", err)
	}
}

// New("auto") falls back to pread only when io_uring is unavailable, and says
// why.
func TestAutoFallback(t *testing.T) {
	defer func(f func(UringOptions) (Reader, error)) { newUringFn = f }(newUringFn)
	refused := errors.Join(ErrUnavailable, syscall.EPERM)
	newUringFn = func(UringOptions) (Reader, error) { return nil, refused }
	r, err := New(Auto, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Name() != NamePread || !errors.Is(FallbackReason(r), syscall.EPERM) {
		t.Fatalf("fallback: %s, reason %v", r.Name(), FallbackReason(r))
	}
	if _, err := New(NameUring, 4); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New(io_uring) = %v", err)
	}
	broken := errors.New("something else")
	newUringFn = func(UringOptions) (Reader, error) { return nil, broken }
	if _, err := New(Auto, 4); !errors.Is(err, broken) {
		t.Fatalf("auto with a failure that is not ErrUnavailable: %v", err)
	}
}

// A call with one request reads it in the caller's goroutine (retrying as
// the workers do) while a token is free, and through the workers once
// every token is taken; after Close both refuse with ErrClosed.
func TestPreadOneRequestInline(t *testing.T) {
	path, data := testFile(t, t.TempDir(), 300000, 31)
	f := openRead(t, path)
	var mu sync.Mutex
	calls := 0
	var p *preadReader
	held := map[int]int{} // inline tokens held during each pread -> count
	flaky := func(fd int, b []byte, off int64) (int, error) {
		mu.Lock()
		calls++
		c := calls
		if p != nil {
			held[len(p.inline)]++
		}
		mu.Unlock()
		if c%3 == 0 {
			return -1, syscall.EINTR
		}
		return pread(fd, b[:min(len(b), 777)], off)
	}
	p = newPread(2, flaky)
	// tokens returns what each pread of the last call saw held, and forgets.
	tokens := func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := held
		held = map[int]int{}
		return out
	}
	one := func() error {
		reqs := []*Request{{Fd: int(f.Fd()), Off: 4321, Buf: make([]byte, 100000)}, {Fd: int(f.Fd()), Off: 9}}
		err := p.Read(context.Background(), reqs)
		if err == nil {
			check(t, data, reqs[:1])
		}
		return err
	}
	require.NoError(t, one())
	seen := tokens()
	require.Len(t, seen, 1, "preads with other than one inline token held: %v", seen)
	require.Contains(t, seen, 1, "the read did not run inline (holding a token): %v", seen)
	for range cap(p.inline) {
		p.inline <- struct{}{}
	}
	require.NoError(t, one()) // every token taken: the workers read it
	seen = tokens()
	require.Len(t, seen, 1, "%v", seen)
	require.Contains(t, seen, cap(p.inline), "%v", seen)
	for range cap(p.inline) {
		<-p.inline
	}
	require.NoError(t, p.Close())
	require.ErrorIs(t, one(), ErrClosed)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q := newPread(1, flaky)
	defer q.Close()
	require.ErrorIs(t, q.Read(ctx, []*Request{{Fd: int(f.Fd()), Buf: make([]byte, 10)}}), context.Canceled)
}
