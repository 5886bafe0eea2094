// Package storeio is the chunk store's storage I/O layer: batches of positional
// reads submitted together so that many are in flight at once.
//
// Two implementations sit behind the one Reader interface: an io_uring reader
// (on a small binding of its own, ring_linux.go; deep queues, O_DIRECT-friendly)
// and a plain pread reader with a pool of goroutines, for tests and for kernels
// without io_uring. io_uring is used only inside this package. New picks one and never falls back silently: the reader's
// Name says what runs, and FallbackReason (or Probe) says why io_uring does not.
//
// Buffers for O_DIRECT reads come from AlignedBuffer; files are opened for
// O_DIRECT with OpenDirect, and ProbeDirect tells whether a directory's
// filesystem does direct I/O at all. Design notes and measurements are in
// docs/design/storeio.md.
package storeio

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// BlockSize is the alignment O_DIRECT needs for buffer addresses, file offsets
// and lengths on the disks we run on.
const BlockSize = 4096

// DefaultDepth is the number of reads an io_uring reader keeps in flight when
// UringOptions.Depth is zero, and what New uses for depth <= 0. Chosen from the
// measurements in docs/design/storeio.md.
const DefaultDepth = 64

// Errors returned by this package. Errors from a read wrap the errno (a
// syscall.Errno) or the context's error, so errors.Is works on them.
var (
	// ErrUnavailable reports that an implementation cannot run on this system
	// (for example io_uring disabled by the kernel or a seccomp policy).
	ErrUnavailable = errors.New("not available on this system")

	// ErrNoDirect reports that a filesystem refuses O_DIRECT, or accepts the
	// flag without doing direct I/O (tmpfs).
	ErrNoDirect = errors.New("filesystem does not do O_DIRECT")

	// ErrClosed reports a Read on a closed Reader, or requests that did not run
	// because the Reader was closed while they waited.
	ErrClosed = errors.New("storage reader closed")
)

// Request is one positional read. Fd is any readable file descriptor; when it was
// opened with O_DIRECT, Off, len(Buf) and the address of Buf must be multiples of
// BlockSize (see AlignedBuffer). A read that reaches end of file sets N < len(Buf)
// and leaves Err nil; short reads before end of file are retried internally.
//
// A Request may appear only once in a batch and in one Read at a time. Buf
// must not be touched by anyone else until Read returns: the kernel writes
// into it. The file behind Fd must stay open until Read returns (keep the
// *os.File reachable: its finalizer closes the descriptor).
type Request struct {
	Fd  int
	Off int64
	Buf []byte

	N   int   // bytes read, set by Read
	Err error // per-request error, set by Read
}

// Reader runs batches of reads with many in flight. Implementations are safe for
// concurrent use by several goroutines.
type Reader interface {
	// Read runs every request in reqs, possibly concurrently and in any order,
	// and returns when all have finished. It resets N and Err of every request
	// first and returns the error of the first request (in slice order) whose
	// Err is set, or nil when all succeeded.
	//
	// When ctx is done, requests not yet started are not started (their Err
	// wraps ctx.Err()); reads already in flight are waited for, never
	// abandoned, so no buffer is written to after Read returns.
	Read(ctx context.Context, reqs []*Request) error
	// Name is "io_uring" or "pread": what actually runs, for reports.
	Name() string
	// Close waits for reads in flight, makes later Reads fail with ErrClosed
	// and releases the reader's resources.
	Close() error
}

// Names accepted by New.
const (
	Auto      = "auto"
	NameUring = "io_uring"
	NamePread = "pread"
)

// New returns the Reader named by prefer: "io_uring", "pread" or "auto" (also
// ""). depth is the io_uring queue depth, or the number of pread workers;
// depth <= 0 means DefaultDepth for io_uring and DefaultPreadWorkers for pread.
//
// "auto" returns io_uring when the kernel allows it and otherwise falls back to
// pread, but only when io_uring is unavailable (ErrUnavailable); any other
// failure is returned. The fallback is never silent: Name reports "pread" and
// FallbackReason(r) returns the reason.
func New(prefer string, depth int) (Reader, error) {
	switch prefer {
	case NameUring:
		return newUringFn(UringOptions{Depth: depth})
	case NamePread:
		return NewPread(preadWorkers(depth)), nil
	case Auto, "":
		r, err := newUringFn(UringOptions{Depth: depth})
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		p := newPread(preadWorkers(depth), pread)
		p.fallback = err
		return p, nil
	default:
		return nil, fmt.Errorf("unknown reader %q (want %q, %q or %q)", prefer, Auto, NameUring, NamePread)
	}
}

// newUringFn is NewUring; tests substitute a refusing one.
var newUringFn = NewUring

// FallbackReason returns why New("auto", ...) returned a pread reader instead
// of io_uring (an error wrapping ErrUnavailable), or nil when r is what was
// asked for.
func FallbackReason(r Reader) error {
	if p, ok := r.(*preadReader); ok {
		return p.fallback
	}
	return nil
}

// preadWorkers maps New's depth to a pread worker count.
func preadWorkers(depth int) int {
	if depth <= 0 {
		return DefaultPreadWorkers
	}
	return min(depth, maxPreadWorkers)
}

// resetRequests clears N and Err and rejects nil requests.
func resetRequests(reqs []*Request) error {
	for i, r := range reqs {
		if r == nil {
			return fmt.Errorf("request %d is nil: %w", i, syscall.EINVAL)
		}
		r.N, r.Err = 0, nil
	}
	return nil
}

// needsIO reports whether r must go to the kernel; requests that need not have
// their result set (empty buffer: done; negative offset: EINVAL).
func needsIO(name string, r *Request) bool {
	if r.Off < 0 {
		r.Err = readError(name, r, 0, syscall.EINVAL)
		return false
	}
	return len(r.Buf) > 0
}

// readError is the one format of per-request errors: it names the
// implementation, the descriptor, the request's offset and length and, after a
// partial read, how far it got.
func readError(name string, r *Request, done int, err error) error {
	if done > 0 {
		return fmt.Errorf("%s read fd %d off %d len %d (failed after %d bytes): %w",
			name, r.Fd, r.Off, len(r.Buf), done, err)
	}
	return fmt.Errorf("%s read fd %d off %d len %d: %w", name, r.Fd, r.Off, len(r.Buf), err)
}

// firstError returns the Err of the first failed request.
func firstError(reqs []*Request) error {
	for _, r := range reqs {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// retryable reports errnos after which a read is simply issued again.
func retryable(err error) bool {
	return errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN)
}

// maxRetries bounds consecutive retryable errors without progress on one request.
const maxRetries = 100
