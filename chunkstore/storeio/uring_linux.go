package storeio

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// UringOptions configures NewUring.
type UringOptions struct {
	// Depth is the most reads in flight at once, over all callers
	// (DefaultDepth when <= 0, at most MaxDepth).
	Depth int
}

// MaxDepth caps UringOptions.Depth.
const MaxDepth = 4096

// maxSQELen caps the length of one submitted read; a longer request is read in
// pieces, like a short read (a CQE's result is an int32).
const maxSQELen = 1 << 30

// user_data of a read is gen<<32 | slot (top bit clear); tags with the top bit
// set are the reader's own operations.
const (
	tagClose uint64 = 1<<63 | 1 // NOP that stops the reaper
	tagNop   uint64 = 1<<63 | 2 // a read turned into a NOP after a failed submission
)

// uringReader owns one ring shared by every caller.
//
// Structure: callers submit their own reads (a short critical section around
// GetSQE+io_uring_enter, no hop through another goroutine), and one reaper
// goroutine owns the completion side: it waits in io_uring_enter for CQEs,
// resubmits short reads and hands finished requests back to their batch. The
// depth is a pool of slot tokens, so all callers together keep at most Depth
// reads in flight, the CQ (2*Depth) can never overflow, and a slot's index in
// user_data finds its request. A second caller's reads enter the ring as soon
// as slots are free, instead of waiting for the first caller's whole batch (as
// a mutex around submit+reap would make it), and the reaper never needs waking
// for new work because it only ever waits for completions.
type uringReader struct {
	ring   *ring
	depth  int
	maxLen int // longest single SQE: maxSQELen; lowered by tests
	ops    []uringOp
	free   chan uint32 // slot tokens: a slot is in flight iff its token is out

	sqMu   sync.Mutex            // the submission side: GetSQE, prep, io_uring_enter
	broken atomic.Pointer[error] // the ring refused a submission: no more reads
	closed chan struct{}         // closed by Close: stop taking tokens

	closeOnce  sync.Once
	reaperDone chan struct{}
}

// uringOp is a slot: the read in flight under that slot's user_data. Fields are
// written by the caller before it publishes ud (atomic) and submits; from then
// until the slot's token is returned they belong to the reaper.
type uringOp struct {
	ud    atomic.Uint64
	gen   uint32
	req   *Request
	b     *batch
	done  int
	tries int
}

var _ Reader = (*uringReader)(nil)

// NewUring returns a Reader that runs reads through an io_uring ring of its own
// with up to opts.Depth reads in flight. When the kernel refuses io_uring
// (ENOSYS, EPERM, ...) or lacks IORING_OP_READ, the error wraps ErrUnavailable.
// Name is "io_uring".
//
// Reads that hit the page cache (no O_DIRECT) are copied inside
// io_uring_enter under the ring's submission lock, so they run on one core at
// a time; pread workers spread them over all cores (docs/design/storeio.md).
func NewUring(opts UringOptions) (Reader, error) {
	depth := opts.Depth
	if depth <= 0 {
		depth = DefaultDepth
	}
	depth = min(depth, MaxDepth)
	ring, err := setupRing(uint32(depth))
	if err != nil {
		return nil, err
	}
	u := &uringReader{
		ring:       ring,
		depth:      depth,
		maxLen:     maxSQELen,
		ops:        make([]uringOp, depth),
		free:       make(chan uint32, depth),
		closed:     make(chan struct{}),
		reaperDone: make(chan struct{}),
	}
	for i := range depth {
		u.free <- uint32(i)
	}
	go u.reap()
	return u, nil
}

// Probe reports whether io_uring can run reads here: nil, or an error wrapping
// ErrUnavailable that says why not (for kylix doctor). It sets up a small ring,
// checks that IORING_OP_READ is supported, runs one NOP through it and tears
// it down.
func Probe() error {
	rg, err := setupRing(2)
	if err != nil {
		return err
	}
	defer rg.close()
	rg.getSQE().prepNop(tagNop)
	for tries := 0; ; tries++ {
		_, err = rg.submit()
		if err == nil || !retryable(err) || tries >= maxRetries {
			break
		}
	}
	if err != nil {
		return unavailable("io_uring_enter", err)
	}
	for tries := 0; ; tries++ {
		var ud uint64
		ud, _, err = rg.waitCQE()
		if err == nil && ud != tagNop {
			err = fmt.Errorf("unexpected completion %#x", ud)
		}
		if err == nil || !retryable(err) || tries >= maxRetries {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("io_uring NOP did not complete (%w): %w", err, ErrUnavailable)
	}
	return nil
}

// setupRing creates a ring with entries SQEs and checks it can read.
func setupRing(entries uint32) (*ring, error) {
	rg, err := newRing(entries)
	if err != nil {
		return nil, unavailable("io_uring_setup", err)
	}
	ok, err := rg.supports(opRead)
	if err != nil || !ok {
		rg.close()
		why := "kernel lacks IORING_OP_READ (needs Linux 5.6)"
		if err != nil {
			why = fmt.Sprintf("io_uring probe: %v (Linux before 5.6?)", err)
		}
		return nil, fmt.Errorf("io_uring: %s: %w", why, ErrUnavailable)
	}
	return rg, nil
}

// unavailable wraps an io_uring setup/enter failure: refusals by the kernel or
// a policy wrap ErrUnavailable (and the errno); anything else wraps the errno.
func unavailable(op string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOSYS):
		return fmt.Errorf("%s: %w (kernel without io_uring): %w", op, err, ErrUnavailable)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		hint := "seccomp or container policy?"
		if b, rerr := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); rerr == nil {
			if v := strings.TrimSpace(string(b)); v != "0" {
				hint = "kernel.io_uring_disabled=" + v
			}
		}
		return fmt.Errorf("%s: %w (%s): %w", op, err, hint, ErrUnavailable)
	case errors.Is(err, syscall.ENOMEM):
		return fmt.Errorf("%s: %w (RLIMIT_MEMLOCK too low on kernels before 5.12?): %w", op, err, ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func (u *uringReader) Name() string { return NameUring }

func (u *uringReader) Read(ctx context.Context, reqs []*Request) error {
	if err := resetRequests(reqs); err != nil {
		return err
	}
	work := make([]*Request, 0, len(reqs))
	for _, r := range reqs {
		if needsIO(NameUring, r) {
			work = append(work, r)
		}
	}
	b := newBatch(ctx)
	var stop error
	slots := make([]uint32, 0, min(len(work), u.depth))
	for len(work) > 0 {
		if stop = u.stopped(ctx); stop != nil {
			break
		}
		// Wait for one slot, then take whatever else is free without waiting,
		// and submit them all with one io_uring_enter.
		slots = slots[:0]
		select {
		case s := <-u.free:
			slots = append(slots, s)
		case <-ctx.Done():
			continue
		case <-u.closed:
			continue
		}
	more:
		for len(slots) < len(work) {
			select {
			case s := <-u.free:
				slots = append(slots, s)
			default:
				break more
			}
		}
		u.submit(b, work[:len(slots)], slots)
		work = work[len(slots):]
	}
	for _, r := range work {
		r.Err = readError(NameUring, r, 0, stop)
	}
	b.wait()
	return firstError(reqs)
}

// stopped says why no more reads may be submitted, or nil.
func (u *uringReader) stopped(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-u.closed:
		return ErrClosed
	default:
	}
	if err := u.broken.Load(); err != nil {
		return *err
	}
	return nil
}

// submit starts reqs[i] in slots[i].
func (u *uringReader) submit(b *batch, reqs []*Request, slots []uint32) {
	u.sqMu.Lock()
	defer u.sqMu.Unlock()
	sqes := make([]*sqe, len(reqs))
	for i, r := range reqs {
		op := &u.ops[slots[i]]
		op.gen = (op.gen + 1) & 0x7fffffff
		op.req, op.b, op.done, op.tries = r, b, 0, 0
		b.add()
		ud := uint64(op.gen)<<32 | uint64(slots[i])
		sqes[i] = u.prepLocked(op, ud)
		// Publish the fields above to the reaper. The kernel sees the SQE
		// only at the flush below, so the reaper cannot see its CQE before
		// this store; the store/load pair tells the race detector so.
		op.ud.Store(ud)
	}
	if n, err := u.flushLocked(len(sqes)); err != nil {
		// sqes[n:] never reached the kernel: neutralise them and fail their reads.
		for i := n; i < len(sqes); i++ {
			neutralise(sqes[i])
			op := &u.ops[slots[i]]
			op.req.Err = readError(NameUring, op.req, 0, err)
			u.release(op, slots[i])
		}
	}
}

// prepLocked fills an SQE for the rest of op's read. sqMu is held, and the SQ
// has room: at most depth reads are in flight, every holder of sqMu flushes
// before releasing it, and the ring has at least depth SQEs.
func (u *uringReader) prepLocked(op *uringOp, ud uint64) *sqe {
	r := op.req
	rest := r.Buf[op.done:]
	n := min(len(rest), u.maxLen)
	s := u.ring.getSQE()
	if s == nil {
		panic("storeio: io_uring submission queue full") // invariant above broken
	}
	s.prepRead(r.Fd, unsafe.Pointer(&rest[0]), uint32(n), uint64(r.Off)+uint64(op.done), ud)
	return s
}

// neutralise turns an SQE the kernel has not taken into a NOP.
func neutralise(s *sqe) { s.prepNop(tagNop) }

// flushLocked submits the want SQEs queued since sqMu was taken, retrying
// EINTR/EAGAIN/EBUSY. It returns how many the kernel took. On a hard error
// the ring is marked broken: later Reads fail with that error.
func (u *uringReader) flushLocked(want int) (int, error) {
	got := 0
	for tries := 0; got < want; {
		n, err := u.ring.submit()
		got += n
		if err == nil {
			continue
		}
		if (retryable(err) || errors.Is(err, syscall.EBUSY)) && tries < 10000 {
			tries++
			time.Sleep(10 * time.Microsecond)
			continue
		}
		err = fmt.Errorf("io_uring_enter: %w", err)
		u.broken.CompareAndSwap(nil, &err)
		return got, err
	}
	return got, nil
}

// reap owns the completion queue until Close's NOP arrives.
func (u *uringReader) reap() {
	defer close(u.reaperDone)
	for {
		ud, res, err := u.ring.waitCQE()
		if err != nil {
			// EINTR from signals; nothing else is expected from a wait on a
			// healthy ring, and giving up would strand the callers waiting
			// for completions, so keep waiting.
			if !retryable(err) && !errors.Is(err, syscall.ETIME) {
				time.Sleep(time.Millisecond)
			}
			continue
		}
		switch ud {
		case tagClose:
			return
		case tagNop:
			continue
		}
		u.complete(ud, res)
	}
}

// complete handles one read's CQE (in the reaper).
func (u *uringReader) complete(ud uint64, res int32) {
	slot := uint32(ud)
	op := &u.ops[slot]
	if op.ud.Load() != ud {
		panic(fmt.Sprintf("storeio: io_uring completion for unknown user_data %#x", ud))
	}
	r := op.req
	switch {
	case res < 0:
		errno := syscall.Errno(-res)
		if err := op.b.ctx.Err(); err != nil && (errno == syscall.EINTR || errno == syscall.ECANCELED) {
			r.Err = readError(NameUring, r, op.done, err)
			break
		}
		if (retryable(errno) || errno == syscall.ECANCELED) && op.tries < maxRetries {
			op.tries++
			u.resubmit(op, ud, slot)
			return
		}
		r.Err = readError(NameUring, r, op.done, errno)
	case res == 0:
		// end of file
	default:
		op.done += int(res)
		op.tries = 0
		if op.done == len(r.Buf) {
			break
		}
		// Short read: not at EOF until a read returns 0.
		if err := op.b.ctx.Err(); err != nil {
			r.Err = readError(NameUring, r, op.done, err)
			break
		}
		u.resubmit(op, ud, slot)
		return
	}
	u.release(op, slot)
}

// resubmit issues the rest of op's read again under the same user_data.
func (u *uringReader) resubmit(op *uringOp, ud uint64, slot uint32) {
	u.sqMu.Lock()
	defer u.sqMu.Unlock()
	s := u.prepLocked(op, ud)
	if _, err := u.flushLocked(1); err != nil {
		neutralise(s)
		op.req.Err = readError(NameUring, op.req, op.done, err)
		u.release(op, slot)
	}
}

// release finishes op's request and returns its slot.
func (u *uringReader) release(op *uringOp, slot uint32) {
	r, b := op.req, op.b
	r.N = op.done
	op.req, op.b = nil, nil
	u.free <- slot
	b.finish()
}

// Close waits for every read in flight (by collecting all slot tokens), stops
// the reaper and releases the ring.
func (u *uringReader) Close() error {
	var err error
	u.closeOnce.Do(func() {
		close(u.closed)
		for range u.depth {
			<-u.free
		}
		u.sqMu.Lock()
		u.ring.getSQE().prepNop(tagClose)
		_, err = u.flushLocked(1)
		u.sqMu.Unlock()
		if err == nil {
			<-u.reaperDone
			u.ring.close()
		}
		// Otherwise the reaper is left blocked on a ring that cannot be woken:
		// keep the ring mapped rather than unmap memory it is reading.
	})
	return err
}
