// Package gpublake3 computes BLAKE3-256 hashes (default mode, no key,
// 32-byte output, as github.com/zeebo/blake3's Sum256) of many messages
// that are already in GPU memory, on the GPU, and compares them with
// expected values. Kylix uses it to check every chunk of model weights
// against its content ID while loading at PCIe speed, which the CPU's
// BLAKE3 cannot keep up with.
//
// Two kernels, compiled with NVRTC (cuda.Compile) once per process for the
// device's architecture: one thread per 1 KiB chunk computes the chunk
// chaining values; then one thread block per message merges them up the
// BLAKE3 tree and compares the root with the expected hash. A Verify call
// queues an upload of the message table, the two kernels and a download of
// the results on the caller's stream, and returns a *Pending. Many calls
// may be in flight on different streams; each owns its scratch memory,
// taken from the Hasher's pool and given back when the GPU is done.
//
// The design and the measurements are in docs/design/gpu-verify.md.
package gpublake3

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/kylix/kylix/cuda"
)

const (
	chunkLen = 1024
	// MaxMsgLen is the largest message Verify accepts (16 MiB).
	MaxMsgLen = 16 << 20

	jobSize     = 64 // sizeof(struct Job) in the kernel source
	resultWords = 9  // hash (8 words) + mismatch flag, per message

	chunkThreads = 128 // threads per block, blake3_chunks
	rootThreads  = 256 // threads per block, blake3_roots

	maxIdleScratch = 16
)

// Msg is one message inside a device buffer, and its expected hash.
type Msg struct {
	Off  int64    // byte offset in the buffer
	Len  int64    // length in bytes, 0..MaxMsgLen
	Want [32]byte // expected BLAKE3-256 hash
}

// Hasher holds the compiled kernels of one context. It is safe for
// concurrent use.
type Hasher struct {
	ctx    *cuda.Context
	mod    *cuda.Module
	chunks *cuda.Function
	roots  *cuda.Function
	arch   string
	image  string // "cubin" or "ptx"

	mu       sync.Mutex
	idle     []*scratch
	inflight int
	closed   bool
}

// image cache: NVRTC compiles once per architecture and process.
var (
	imgMu    sync.Mutex
	imgCache = map[string]cachedImage{}
)

type cachedImage struct {
	data []byte
	kind string
}

// New compiles the kernels for ctx's device (NVRTC; a CUBIN for its sm_XX,
// falling back to PTX that the driver compiles) and loads them. Without a
// GPU, the CUDA driver or NVRTC the error wraps cuda.ErrUnavailable.
func New(ctx *cuda.Context) (*Hasher, error) {
	if err := cuda.Available(); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, fmt.Errorf("GPU BLAKE3: nil context: %w", cuda.ErrInvalid)
	}
	if err := cuda.NVRTCAvailable(); err != nil {
		return nil, fmt.Errorf("GPU BLAKE3: %w", err)
	}
	arch, err := ctx.Device().Arch()
	if err != nil {
		return nil, fmt.Errorf("GPU BLAKE3: %w", err)
	}
	mod, kind, err := loadKernels(ctx, arch)
	if err != nil {
		return nil, err
	}
	h := &Hasher{ctx: ctx, mod: mod, arch: arch, image: kind}
	if h.chunks, err = mod.Function("blake3_chunks"); err == nil {
		h.roots, err = mod.Function("blake3_roots")
	}
	if err != nil {
		mod.Unload()
		return nil, fmt.Errorf("GPU BLAKE3: %w", err)
	}
	return h, nil
}

func loadKernels(ctx *cuda.Context, arch string) (*cuda.Module, string, error) {
	imgMu.Lock()
	defer imgMu.Unlock()
	if c, ok := imgCache[arch]; ok {
		m, err := ctx.LoadModule(c.data)
		if err == nil {
			return m, c.kind, nil
		}
		delete(imgCache, arch)
	}
	var errs []error
	for _, try := range []struct {
		kind string
		o    cuda.CompileOptions
	}{
		{"cubin", cuda.CompileOptions{Arch: arch, CUBIN: true}},
		{"ptx", cuda.CompileOptions{Arch: "compute_" + arch[len("sm_"):]}},
	} {
		img, _, err := cuda.Compile(kernelSource, "gpublake3.cu", try.o)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", try.kind, err))
			continue
		}
		m, err := ctx.LoadModule(img)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", try.kind, err))
			continue
		}
		imgCache[arch] = cachedImage{data: img, kind: try.kind}
		return m, try.kind, nil
	}
	return nil, "", fmt.Errorf("GPU BLAKE3: build kernels for %s: %w", arch, errors.Join(errs...))
}

// Arch returns the architecture the kernels were built for and how they
// were loaded ("cubin", or "ptx" when the driver compiled them).
func (h *Hasher) Arch() (arch, image string) {
	if h == nil {
		return "", ""
	}
	return h.arch, h.image
}

// scratch is one call's device and pinned memory: the message table, the
// results, and two CV arrays (chunk CVs, and the other half of the merge's
// ping-pong).
type scratch struct {
	msgs   int   // capacity in messages
	chunks int64 // capacity in chunks
	jobs   *cuda.DeviceMem
	out    *cuda.DeviceMem
	cvs    *cuda.DeviceMem
	tmp    *cuda.DeviceMem
	host   *cuda.HostMem // jobs (msgs*jobSize) then results (msgs*resultWords*4)
}

func (s *scratch) free() {
	for _, m := range []*cuda.DeviceMem{s.jobs, s.out, s.cvs, s.tmp} {
		if m != nil {
			m.Free()
		}
	}
	if s.host != nil {
		s.host.Free()
	}
}

func roundPow2(n int64, min int64) int64 {
	if n <= min {
		return min
	}
	return 1 << bits.Len64(uint64(n-1))
}

func (h *Hasher) newScratch(msgs int, chunks int64) (*scratch, error) {
	s := &scratch{msgs: int(roundPow2(int64(msgs), 64)), chunks: roundPow2(chunks, 1<<14)}
	var err error
	alloc := func(n int64) *cuda.DeviceMem {
		if err != nil {
			return nil
		}
		var m *cuda.DeviceMem
		m, err = h.ctx.Alloc(int(n))
		return m
	}
	s.jobs = alloc(int64(s.msgs) * jobSize)
	s.out = alloc(int64(s.msgs) * resultWords * 4)
	s.cvs = alloc(s.chunks * 32)
	s.tmp = alloc(s.chunks * 32)
	if err == nil {
		s.host, err = h.ctx.AllocHost(s.msgs * (jobSize + resultWords*4))
	}
	if err != nil {
		s.free()
		return nil, fmt.Errorf("GPU BLAKE3: scratch for %d messages, %d chunks: %w", msgs, chunks, err)
	}
	return s, nil
}

// getScratch takes idle scratch large enough, or allocates it; it counts
// the call as in flight.
func (h *Hasher) getScratch(msgs int, chunks int64) (*scratch, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, fmt.Errorf("GPU BLAKE3: verify: %w", cuda.ErrClosed)
	}
	h.inflight++
	for i, s := range h.idle {
		if s.msgs >= msgs && s.chunks >= chunks {
			h.idle = append(h.idle[:i], h.idle[i+1:]...)
			h.mu.Unlock()
			return s, nil
		}
	}
	h.mu.Unlock()
	s, err := h.newScratch(msgs, chunks)
	if err != nil {
		h.mu.Lock()
		h.inflight--
		h.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// putScratch ends a call: its scratch goes back to the pool (or is freed
// when the call failed or the pool is full).
func (h *Hasher) putScratch(s *scratch, ok bool) {
	h.mu.Lock()
	h.inflight--
	if ok && !h.closed && len(h.idle) < maxIdleScratch {
		h.idle = append(h.idle, s)
		s = nil
	}
	h.mu.Unlock()
	if s != nil {
		s.free()
	}
}

// Pending is a Verify call in flight.
type Pending struct {
	done chan struct{}
	bad  []int
	sums [][32]byte
	err  error
}

// Done is closed once the call's results (or its error) are available.
func (p *Pending) Done() <-chan struct{} {
	if p == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// Wait blocks until the GPU has finished the call or ctx ends. It returns
// the indexes (into the msgs passed to Verify, ascending) of the messages
// whose hash differs from Want: nil when all match. A cancelled Wait
// returns ctx.Err(); the call stays in flight and may be waited for again.
func (p *Pending) Wait(ctx context.Context) ([]int, error) {
	if p == nil {
		if err := cuda.Available(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("GPU BLAKE3: wait: nil Pending: %w", cuda.ErrInvalid)
	}
	select {
	case <-p.done:
		return p.bad, p.err
	default:
	}
	select {
	case <-p.done:
		return p.bad, p.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Sums returns the hashes the GPU computed, one per message, once Done is
// closed (nil before, or after an error).
func (p *Pending) Sums() [][32]byte {
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return p.sums
	default:
		return nil
	}
}

func donePending(err error) *Pending {
	p := &Pending{done: make(chan struct{}), err: err}
	close(p.done)
	return p
}

// Verify queues, on stream s, the hashing of each message within buf and
// its comparison with Want, and returns at once. Wait on the result for the
// list of mismatched messages.
//
// Stream order: the kernels run after work queued on s before the call
// (such as the CopyHtoD that filled buf), and work queued on s after the
// call runs after them. buf is held busy (Free returns cuda.ErrBusy) until
// the kernels are done; the caller must not overwrite the messages until
// then either (Wait, or order the overwrite after the call on s).
//
// Messages are 0..MaxMsgLen bytes, anywhere in buf (16-byte aligned offsets
// are read fastest); any number per call. Each call uses its own scratch
// memory (about 64 bytes of device memory per KiB hashed, pooled), so calls
// on different streams run concurrently.
func (h *Hasher) Verify(s *cuda.Stream, buf *cuda.DeviceMem, msgs []Msg) (*Pending, error) {
	if h == nil || h.ctx == nil {
		if err := cuda.Available(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("GPU BLAKE3: verify: nil Hasher: %w", cuda.ErrInvalid)
	}
	if s == nil || buf == nil {
		return nil, fmt.Errorf("GPU BLAKE3: verify: nil stream or buffer: %w", cuda.ErrInvalid)
	}
	if len(msgs) == 0 {
		return donePending(nil), nil
	}
	if len(msgs) > 1<<30 {
		return nil, fmt.Errorf("GPU BLAKE3: verify: %d messages: %w", len(msgs), cuda.ErrInvalid)
	}
	size := int64(buf.Size())
	var total int64
	for i, m := range msgs {
		if m.Len < 0 || m.Len > MaxMsgLen || m.Off < 0 || m.Off > size || m.Len > size-m.Off {
			return nil, fmt.Errorf("GPU BLAKE3: verify: message %d [%d, %d+%d) outside %d bytes or over %d: %w",
				i, m.Off, m.Off, m.Len, size, MaxMsgLen, cuda.ErrRange)
		}
		total += nChunks(m.Len)
	}
	sc, err := h.getScratch(len(msgs), total)
	if err != nil {
		return nil, err
	}

	encodeJobs(sc.host.Bytes(), msgs)
	resOff := sc.msgs * jobSize
	resLen := len(msgs) * resultWords * 4

	var issued []*cuda.Transfer
	fail := func(err error) (*Pending, error) {
		// Whatever was queued must finish before the scratch is reused.
		go func() {
			for _, t := range issued {
				t.Wait(context.Background())
			}
			h.putScratch(sc, false)
		}()
		return nil, fmt.Errorf("GPU BLAKE3: verify: %w", err)
	}
	t, err := s.CopyHtoD(sc.jobs, 0, sc.host, 0, len(msgs)*jobSize)
	if err != nil {
		return fail(err)
	}
	issued = append(issued, t)
	grid := uint32((total + chunkThreads - 1) / chunkThreads)
	t, err = s.Launch(h.chunks, cuda.LaunchConfig{Grid: cuda.Dim3{X: grid}, Block: cuda.Dim3{X: chunkThreads}},
		buf, sc.jobs, uint32(len(msgs)), uint64(total), sc.cvs)
	if err != nil {
		return fail(err)
	}
	issued = append(issued, t)
	t, err = s.Launch(h.roots, cuda.LaunchConfig{Grid: cuda.Dim3{X: uint32(len(msgs))}, Block: cuda.Dim3{X: rootThreads}},
		sc.jobs, sc.cvs, sc.tmp, sc.out)
	if err != nil {
		return fail(err)
	}
	issued = append(issued, t)
	t, err = s.CopyDtoH(sc.host, resOff, sc.out, 0, resLen)
	if err != nil {
		return fail(err)
	}
	issued = append(issued, t)

	p := &Pending{done: make(chan struct{})}
	go func() {
		// Transfers on one stream complete in order: once the last is
		// done, so are the others.
		for _, t := range issued {
			if err := t.Wait(context.Background()); err != nil && p.err == nil {
				p.err = fmt.Errorf("GPU BLAKE3: verify: %w", err)
			}
		}
		if p.err == nil {
			p.sums, p.bad = decodeResults(sc.host.Bytes()[resOff:resOff+resLen], len(msgs))
		}
		h.putScratch(sc, p.err == nil)
		close(p.done)
	}()
	return p, nil
}

// encodeJobs writes the message table into b in the kernel's struct Job
// layout and returns the total number of chunks.
func encodeJobs(b []byte, msgs []Msg) int64 {
	var chunk0 int64
	for i, m := range msgs {
		j := b[i*jobSize : (i+1)*jobSize]
		n := nChunks(m.Len)
		binary.LittleEndian.PutUint64(j[0:], uint64(m.Off))
		binary.LittleEndian.PutUint64(j[8:], uint64(m.Len))
		binary.LittleEndian.PutUint64(j[16:], uint64(chunk0))
		binary.LittleEndian.PutUint64(j[24:], uint64(n))
		copy(j[32:64], m.Want[:]) // little-endian words, as the kernel compares them
		chunk0 += n
	}
	return chunk0
}

// decodeResults reads the kernel's per-message results: 8 hash words
// (the hash's little-endian serialization) and a mismatch flag.
func decodeResults(res []byte, n int) (sums [][32]byte, bad []int) {
	sums = make([][32]byte, n)
	for i := range n {
		r := res[i*resultWords*4:]
		copy(sums[i][:], r[:32])
		if binary.LittleEndian.Uint32(r[32:]) != 0 {
			bad = append(bad, i)
		}
	}
	return sums, bad
}

// nChunks is the number of 1 KiB chunks of a message (1 for an empty one).
func nChunks(n int64) int64 {
	if n == 0 {
		return 1
	}
	return (n + chunkLen - 1) / chunkLen
}

// Close frees the pooled scratch memory and unloads the kernels. It
// returns cuda.ErrBusy while Verify calls are in flight.
func (h *Hasher) Close() error {
	if h == nil || h.ctx == nil {
		if err := cuda.Available(); err != nil {
			return err
		}
		return fmt.Errorf("GPU BLAKE3: close: nil Hasher: %w", cuda.ErrInvalid)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return fmt.Errorf("GPU BLAKE3: close: %w", cuda.ErrClosed)
	}
	if h.inflight > 0 {
		n := h.inflight
		h.mu.Unlock()
		return fmt.Errorf("GPU BLAKE3: close: %w (%d calls in flight)", cuda.ErrBusy, n)
	}
	h.closed = true
	idle := h.idle
	h.idle = nil
	h.mu.Unlock()
	for _, s := range idle {
		s.free()
	}
	return h.mod.Unload()
}
