package storeio

// A minimal io_uring binding: only what the reader needs (setup without flags,
// the SQ and CQ rings mapped through golang.org/x/sys/unix, io_uring_enter,
// the opcode probe, NOP and READ SQEs). It replaces giouring, whose
// //go:linkname to syscall.mmap makes Go 1.26 refuse to link without
// -ldflags=-checklinkname=0 (docs/design/storeio.md).
//
// Concurrency: one goroutine at a time may use the submission side (getSQE,
// submit; the reader holds sqMu) and one other the completion side (waitCQE,
// the reaper). The two share nothing but the kernel's rings, which are read
// and written with atomics as liburing does with acquire/release.

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel ABI constants (include/uapi/linux/io_uring.h).
const (
	opNop  = 0  // IORING_OP_NOP
	opRead = 22 // IORING_OP_READ (Linux 5.6)

	offSQRing = 0          // IORING_OFF_SQ_RING
	offCQRing = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

	registerProbe  = 8      // IORING_REGISTER_PROBE
	opSupported    = 1 << 0 // IO_URING_OP_SUPPORTED
	probeOpsMax    = 256    // room for every opcode in the probe
	sizeofSQE      = 64
	sizeofCQE      = 16
	sizeofParams   = 120
	sizeofProbeHdr = 16
	sizeofProbeOp  = 8
)

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// sqe is struct io_uring_sqe, with the unions named after the fields we use.
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

// cqe is struct io_uring_cqe (without the CQE32 extension, which we never ask for).
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// Compile-time checks that the structs match the kernel's sizes.
var (
	_ [sizeofSQE - unsafe.Sizeof(sqe{})]struct{}
	_ [unsafe.Sizeof(sqe{}) - sizeofSQE]struct{}
	_ [sizeofCQE - unsafe.Sizeof(cqe{})]struct{}
	_ [unsafe.Sizeof(cqe{}) - sizeofCQE]struct{}
	_ [sizeofParams - unsafe.Sizeof(uringParams{})]struct{}
	_ [unsafe.Sizeof(uringParams{}) - sizeofParams]struct{}
)

// ring is one io_uring instance.
type ring struct {
	fd int

	sqMem, cqMem, sqeMem []byte // the mappings (cqMem is nil with a single mmap)

	sqHead, sqTail *uint32 // kernel's SQ head (kernel writes), tail (we write)
	sqMask         uint32
	sqEntries      uint32
	sqes           []sqe
	sqeTail        uint32 // next free SQE; published to *sqTail by submit

	cqHead, cqTail *uint32 // CQ head (we write), tail (kernel writes)
	cqMask         uint32
	cqes           []cqe
}

// newRing sets up a ring with at least entries SQEs (the kernel rounds up to a
// power of two) and twice as many CQEs. Errors are the raw errno from
// io_uring_setup (for unavailable) or a wrapped mmap error.
func newRing(entries uint32) (*ring, error) {
	var p uringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, errno
	}
	r := &ring{fd: int(fd)}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mmap(p *uringParams) error {
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*sizeofCQE
	single := p.features&featSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	const prot, flags = unix.PROT_READ | unix.PROT_WRITE, unix.MAP_SHARED | unix.MAP_POPULATE
	var err error
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, prot, flags); err != nil {
		return fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	cq := r.sqMem
	if !single {
		if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, prot, flags); err != nil {
			return fmt.Errorf("mmap io_uring CQ ring: %w", err)
		}
		cq = r.cqMem
	}
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sizeofSQE, prot, flags); err != nil {
		return fmt.Errorf("mmap io_uring SQEs: %w", err)
	}

	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail = u32(r.sqMem, p.sqOff.head), u32(r.sqMem, p.sqOff.tail)
	r.sqMask, r.sqEntries = *u32(r.sqMem, p.sqOff.ringMask), *u32(r.sqMem, p.sqOff.ringEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	// The SQ array maps ring slots to SQE indexes; map slot i to SQE i once,
	// as liburing does, so submitting is only a tail update.
	array := unsafe.Slice(u32(r.sqMem, p.sqOff.array), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqeTail = atomic.LoadUint32(r.sqTail)

	r.cqHead, r.cqTail = u32(cq, p.cqOff.head), u32(cq, p.cqOff.tail)
	r.cqMask = *u32(cq, p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&cq[p.cqOff.cqes])), p.cqEntries)
	return nil
}

// close unmaps the rings and closes the ring's fd. No read may be in flight.
func (r *ring) close() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.sqMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	unix.Close(r.fd)
}

// getSQE returns the next free SQE, zeroed, or nil when the SQ is full.
// Submission side only.
func (r *ring) getSQE() *sqe {
	head := atomic.LoadUint32(r.sqHead)
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	s := &r.sqes[r.sqeTail&r.sqMask]
	r.sqeTail++
	*s = sqe{}
	return s
}

// prepRead makes s read len bytes at off of fd into addr.
func (s *sqe) prepRead(fd int, addr unsafe.Pointer, n uint32, off uint64, userData uint64) {
	*s = sqe{opcode: opRead, fd: int32(fd), off: off, addr: uint64(uintptr(addr)), len: n, userData: userData}
}

// prepNop makes s a NOP.
func (s *sqe) prepNop(userData uint64) {
	*s = sqe{opcode: opNop, userData: userData}
}

// submit publishes the SQEs taken since the last submit and passes every SQE
// the kernel has not consumed yet to io_uring_enter. It returns how many the
// kernel consumed. Submission side only.
func (r *ring) submit() (int, error) {
	// The store publishes the SQE contents written before it (Go's atomics
	// are sequentially consistent: at least a release).
	atomic.StoreUint32(r.sqTail, r.sqeTail)
	pending := r.sqeTail - atomic.LoadUint32(r.sqHead)
	if pending == 0 {
		return 0, nil
	}
	n, err := r.enter(pending, 0, 0)
	return int(n), err
}

// waitCQE waits for a completion and returns it, consuming it.
// Completion side only.
func (r *ring) waitCQE() (userData uint64, res int32, err error) {
	for {
		head := atomic.LoadUint32(r.cqHead)
		if head != atomic.LoadUint32(r.cqTail) {
			c := &r.cqes[head&r.cqMask]
			userData, res = c.userData, c.res
			atomic.StoreUint32(r.cqHead, head+1)
			return userData, res, nil
		}
		// GETEVENTS also flushes CQEs the kernel kept aside on overflow.
		if _, err := r.enter(0, 1, enterGetEvents); err != nil {
			return 0, 0, err
		}
	}
}

// enter is io_uring_enter(2). unix.Syscall6 tells the scheduler the thread may
// block, so a waiting reaper does not hold a P.
func (r *ring) enter(toSubmit, minComplete, flags uint32) (uint32, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return uint32(n), nil
}

// supports reports whether the kernel implements opcode op
// (IORING_REGISTER_PROBE, Linux 5.6; older kernels answer EINVAL).
func (r *ring) supports(op uint8) (bool, error) {
	// struct io_uring_probe: last_op u8, ops_len u8, resv u16, resv2 [3]u32,
	// then ops_len of struct io_uring_probe_op {op u8, resv u8, flags u16, resv2 u32}.
	// The kernel wants it zeroed.
	buf := make([]byte, sizeofProbeHdr+probeOpsMax*sizeofProbeOp)
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerProbe, uintptr(unsafe.Pointer(&buf[0])), probeOpsMax, 0, 0)
	if errno != 0 {
		return false, errno
	}
	opsLen := buf[1]
	if op >= opsLen {
		return false, nil
	}
	o := buf[sizeofProbeHdr+int(op)*sizeofProbeOp:]
	flags := *(*uint16)(unsafe.Pointer(&o[2])) // native byte order, as the kernel wrote it
	return flags&opSupported != 0, nil
}
