package gpuio

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
	"unsafe"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// HostDevice is a Device backed by host memory. Its copies really are
// asynchronous: each stream performs them on a goroutine, in order, after a
// random short delay, reading the source only then. A loader that reuses a
// pinned buffer before its transfer completes therefore places wrong bytes,
// and the tests that compare every byte catch it. It is for tests and for
// machines without a GPU, selected explicitly (kylix load --device host).
type HostDevice struct {
	// Unified makes the device claim CPU and GPU share memory.
	Unified bool
	// MaxDelay bounds the random delay of each copy (default 200µs).
	MaxDelay time.Duration
	// Reuse keeps freed memory for later allocations (the smallest that
	// fits, at most twice the size asked), not cleared, as GPU caching
	// allocators do (torch's): a process that loads the same files again
	// then writes into memory it touched before, as a GPU load does,
	// instead of paying for new host pages each time. Close drops it.
	Reuse bool

	mu     sync.Mutex
	allocs int
	free   [][]byte // Reuse: freed buffers
}

var _ Device = (*HostDevice)(nil)

func (d *HostDevice) String() string {
	if d.Unified {
		return "host (unified test device)"
	}
	return "host (test device)"
}

// Integrated implements Device.
func (d *HostDevice) Integrated() bool { return d.Unified }

// Close implements Device.
func (d *HostDevice) Close() error {
	d.mu.Lock()
	d.free = nil
	d.mu.Unlock()
	return nil
}

// Live returns the number of allocations not yet freed.
func (d *HostDevice) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allocs
}

func (d *HostDevice) track(n int) {
	d.mu.Lock()
	d.allocs += n
	d.mu.Unlock()
}

type hostMem struct {
	d     *HostDevice
	b     []byte
	mu    sync.Mutex
	busy  int
	freed bool
}

func (m *hostMem) Ptr() uintptr {
	if len(m.b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&m.b[0]))
}
func (m *hostMem) Size() int64      { return int64(len(m.b)) }
func (m *hostMem) Bytes() []byte    { return m.b }
func (m *hostMem) HostView() []byte { return m.b }

func (m *hostMem) CopyToHost(dst []byte, off int64) error {
	if off < 0 || off+int64(len(dst)) > int64(len(m.b)) {
		return fmt.Errorf("host device: copy to host [%d,+%d) outside %d bytes", off, len(dst), len(m.b))
	}
	copy(dst, m.b[off:])
	return nil
}

func (m *hostMem) Free() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return errors.New("host device: double free")
	}
	if m.busy > 0 {
		return fmt.Errorf("host device: free with %d transfers in flight", m.busy)
	}
	m.freed = true
	m.d.track(-1)
	if m.d.Reuse && cap(m.b) > 0 {
		m.d.mu.Lock()
		m.d.free = append(m.d.free, m.b[:cap(m.b)])
		m.d.mu.Unlock()
	}
	return nil
}

func (m *hostMem) hold() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return errors.New("host device: use after free")
	}
	m.busy++
	return nil
}

func (m *hostMem) release() {
	m.mu.Lock()
	m.busy--
	m.mu.Unlock()
}

// Alloc implements Device.
func (d *HostDevice) Alloc(n int64) (DeviceMem, error) {
	if n < 0 {
		return nil, fmt.Errorf("host device: alloc %d bytes", n)
	}
	d.track(1)
	if b := d.reuse(n); b != nil {
		return &hostMem{d: d, b: b}, nil
	}
	return &hostMem{d: d, b: storeio.AlignedBuffer(int(n))[:n]}, nil
}

// reuse takes the smallest freed buffer of n to 2n bytes (Reuse), or nil.
func (d *HostDevice) reuse(n int64) []byte {
	if !d.Reuse || n == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	best := -1
	for i, b := range d.free {
		if c := int64(len(b)); c >= n && c <= 2*n && (best < 0 || c < int64(len(d.free[best]))) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := d.free[best]
	d.free = append(d.free[:best], d.free[best+1:]...)
	return b[:n]
}

// AllocPinned implements Device.
func (d *HostDevice) AllocPinned(n int) (PinnedMem, error) {
	m, err := d.Alloc(int64(n))
	if err != nil {
		return nil, err
	}
	return m.(*hostMem), nil
}

// NewStream implements Device.
func (d *HostDevice) NewStream() (Stream, error) {
	maxDelay := d.MaxDelay
	if maxDelay == 0 {
		maxDelay = 200 * time.Microsecond
	}
	s := &hostStream{q: make(chan func(), 64), maxDelay: maxDelay}
	go s.run()
	return s, nil
}

type hostStream struct {
	q        chan func()
	maxDelay time.Duration
	once     sync.Once
}

func (s *hostStream) run() {
	for f := range s.q {
		// Delay one operation in eight, so that a consumer that does not
		// wait for completion sees stale bytes, without making every test
		// slow.
		if rand.IntN(8) == 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(s.maxDelay) + 1)))
		}
		f()
	}
}

type hostTransfer struct{ done chan struct{} }

func (t *hostTransfer) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func asHost(x any) (*hostMem, error) {
	m, ok := x.(*hostMem)
	if !ok {
		return nil, fmt.Errorf("host device: memory %T is not from a HostDevice", x)
	}
	return m, nil
}

// enqueue checks ranges, holds both buffers and queues fn.
func (s *hostStream) enqueue(dst, src *hostMem, dstEnd, srcEnd int64, fn func()) (Transfer, error) {
	if dstEnd > int64(len(dst.b)) || srcEnd > int64(len(src.b)) {
		return nil, fmt.Errorf("host device: copy out of range (dst end %d of %d, src end %d of %d)", dstEnd, len(dst.b), srcEnd, len(src.b))
	}
	if err := dst.hold(); err != nil {
		return nil, err
	}
	if err := src.hold(); err != nil {
		dst.release()
		return nil, err
	}
	t := &hostTransfer{done: make(chan struct{})}
	s.q <- func() {
		fn()
		dst.release()
		src.release()
		close(t.done)
	}
	return t, nil
}

func (s *hostStream) CopyHtoD(dst DeviceMem, dstOff int64, src PinnedMem, srcOff, n int) (Transfer, error) {
	d, err := asHost(dst)
	if err != nil {
		return nil, err
	}
	p, err := asHost(src)
	if err != nil {
		return nil, err
	}
	if dstOff < 0 || srcOff < 0 || n < 0 {
		return nil, fmt.Errorf("host device: negative copy range")
	}
	return s.enqueue(d, p, dstOff+int64(n), int64(srcOff+n), func() { copy(d.b[dstOff:dstOff+int64(n)], p.b[srcOff:srcOff+n]) })
}

func (s *hostStream) Copy2DHtoD(dst DeviceMem, dstOff int64, dstPitch int, src PinnedMem, srcOff, srcPitch, width, rows int) (Transfer, error) {
	return s.copy2D(dst, dstOff, dstPitch, src, int64(srcOff), srcPitch, width, rows)
}

func (s *hostStream) Copy2DDtoD(dst DeviceMem, dstOff int64, dstPitch int, src DeviceMem, srcOff int64, srcPitch, width, rows int) (Transfer, error) {
	return s.copy2D(dst, dstOff, dstPitch, src, srcOff, srcPitch, width, rows)
}

func (s *hostStream) copy2D(dst DeviceMem, dstOff int64, dstPitch int, src any, srcOff64 int64, srcPitch, width, rows int) (Transfer, error) {
	srcOff := int(srcOff64)
	d, err := asHost(dst)
	if err != nil {
		return nil, err
	}
	p, err := asHost(src)
	if err != nil {
		return nil, err
	}
	if rows == 0 {
		return &hostTransfer{done: closedChan}, nil
	}
	if width > dstPitch || width > srcPitch || dstOff < 0 || srcOff < 0 {
		return nil, fmt.Errorf("host device: bad 2D copy (width %d, pitches %d/%d)", width, dstPitch, srcPitch)
	}
	dEnd := dstOff + int64((rows-1)*dstPitch+width)
	sEnd := int64(srcOff + (rows-1)*srcPitch + width)
	return s.enqueue(d, p, dEnd, sEnd, func() {
		for r := range rows {
			copy(d.b[dstOff+int64(r*dstPitch):][:width], p.b[srcOff+r*srcPitch:][:width])
		}
	})
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (s *hostStream) CopyDtoD(dst DeviceMem, dstOff int64, src DeviceMem, srcOff int64, n int) (Transfer, error) {
	d, err := asHost(dst)
	if err != nil {
		return nil, err
	}
	p, err := asHost(src)
	if err != nil {
		return nil, err
	}
	return s.enqueue(d, p, dstOff+int64(n), srcOff+int64(n), func() { copy(d.b[dstOff:dstOff+int64(n)], p.b[srcOff:srcOff+int64(n)]) })
}

func (s *hostStream) Close() error {
	s.once.Do(func() { close(s.q) })
	return nil
}

// RegisterReadOnly implements HostRegisterer.
func (d *HostDevice) RegisterReadOnly(b []byte) (PinnedMem, error) {
	d.track(1)
	return &hostMem{d: d, b: b}, nil
}

// VerifyAsync implements DeviceVerifier: the stream's goroutine hashes the
// messages in order with the copies queued before them.
func (d *HostDevice) VerifyAsync(s Stream, mem DeviceMem, msgs []VerifyMsg) (VerifyWait, error) {
	hs, ok := s.(*hostStream)
	if !ok {
		return nil, fmt.Errorf("host device: stream %T is not from a HostDevice", s)
	}
	m, err := asHost(mem)
	if err != nil {
		return nil, err
	}
	for _, g := range msgs {
		if g.Off < 0 || g.Len < 0 || g.Off+g.Len > int64(len(m.b)) {
			return nil, fmt.Errorf("host device: verify [%d,+%d) outside %d bytes", g.Off, g.Len, len(m.b))
		}
	}
	if err := m.hold(); err != nil {
		return nil, err
	}
	w := &hostVerify{done: make(chan struct{})}
	hs.q <- func() {
		for i, g := range msgs {
			if blake3.Sum256(m.b[g.Off:g.Off+g.Len]) != g.Want {
				w.bad = append(w.bad, i)
			}
		}
		m.release()
		close(w.done)
	}
	return w, nil
}

type hostVerify struct {
	done chan struct{}
	bad  []int
}

func (w *hostVerify) Wait(ctx context.Context) ([]int, error) {
	select {
	case <-w.done:
		return w.bad, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
