package gpuio

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/cuda/gpublake3"
)

// CUDADevice adapts package cuda to Device: device ordinal's primary context
// (so pointers PyTorch allocates in the same process are usable), cuMemAlloc,
// cuMemHostAlloc pinned buffers, non-blocking streams, and cuFile.
type CUDADevice struct {
	dev   cuda.Device
	ctx   *cuda.Context
	name  string
	integ bool

	gdsOnce   sync.Once
	gdsMode   string
	gdsReason string
	probeMu   sync.Mutex
	probes    map[string]error

	hashOnce sync.Once
	hasher   *gpublake3.Hasher
	hashErr  error
}

var _ DeviceVerifier = (*CUDADevice)(nil)

// CanVerify reports whether the device can hash chunks in its memory (the
// BLAKE3 kernels compile with NVRTC and load); the first call compiles them.
func (d *CUDADevice) CanVerify() error {
	d.hashOnce.Do(func() {
		d.hasher, d.hashErr = gpublake3.New(d.ctx)
	})
	return d.hashErr
}

// VerifyAsync implements DeviceVerifier with the BLAKE3 kernels of
// cuda/gpublake3.
func (d *CUDADevice) VerifyAsync(s Stream, mem DeviceMem, msgs []VerifyMsg) (VerifyWait, error) {
	if err := d.CanVerify(); err != nil {
		return nil, err
	}
	cs, ok := s.(*cudaStream)
	if !ok {
		return nil, fmt.Errorf("stream %T is not a CUDA stream", s)
	}
	m, err := devOf(mem)
	if err != nil {
		return nil, err
	}
	gm := make([]gpublake3.Msg, len(msgs))
	for i, v := range msgs {
		gm[i] = gpublake3.Msg{Off: v.Off, Len: v.Len, Want: v.Want}
	}
	p, err := d.hasher.Verify(cs.s, m, gm)
	if err != nil {
		return nil, err
	}
	return p, nil
}

var (
	_ Device    = (*CUDADevice)(nil)
	_ GDSDevice = (*CUDADevice)(nil)
)

// NewCUDADevice opens GPU ordinal. On a machine without CUDA it returns an
// error wrapping cuda.ErrUnavailable that says why.
func NewCUDADevice(ordinal int) (*CUDADevice, error) {
	dev, err := cuda.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", ordinal, err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", ordinal, err)
	}
	d := &CUDADevice{dev: dev, ctx: ctx}
	d.name, _ = dev.Name()
	d.integ, _ = dev.Integrated()
	return d, nil
}

// Context returns the CUDA context (for wrapping external device pointers).
func (d *CUDADevice) Context() *cuda.Context { return d.ctx }

func (d *CUDADevice) String() string { return fmt.Sprintf("%s (%s)", d.dev, d.name) }

// Integrated implements Device.
func (d *CUDADevice) Integrated() bool { return d.integ }

// Close releases the kernels and the primary context reference.
func (d *CUDADevice) Close() error {
	var errs []error
	if d.hasher != nil {
		errs = append(errs, d.hasher.Close())
	}
	return errors.Join(append(errs, d.ctx.Close())...)
}

// Alloc implements Device.
func (d *CUDADevice) Alloc(n int64) (DeviceMem, error) {
	m, err := d.ctx.Alloc(int(n))
	if err != nil {
		return nil, err
	}
	return &cudaMem{m}, nil
}

// Wrap makes device memory allocated elsewhere (PyTorch) a load target.
func (d *CUDADevice) Wrap(ptr uintptr, n int64) (DeviceMem, error) {
	m, err := d.ctx.WrapDevicePtr(ptr, int(n))
	if err != nil {
		return nil, err
	}
	return &cudaMem{m}, nil
}

// OpenIPC maps device memory another process exported (cuIpcGetMemHandle;
// torch: storage._share_cuda_()) as a load target: the node's FILL writes
// into its clients' tensors. Its Size is the whole exported allocation as
// the driver reports it, so ReadRange's bounds check is against the real
// allocation; Free unmaps it.
func (d *CUDADevice) OpenIPC(handle [cuda.IPCHandleSize]byte) (DeviceMem, error) {
	m, err := d.ctx.OpenIPCMem(handle)
	if err != nil {
		return nil, err
	}
	return &cudaMem{m}, nil
}

// MemInfo reports the device's free and total memory (cuMemGetInfo).
func (d *CUDADevice) MemInfo() (free, total uint64, err error) { return d.ctx.MemInfo() }

// AllocPinned implements Device.
func (d *CUDADevice) AllocPinned(n int) (PinnedMem, error) {
	h, err := d.ctx.AllocHost(n)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// NewStream implements Device.
func (d *CUDADevice) NewStream() (Stream, error) {
	s, err := d.ctx.NewStream()
	if err != nil {
		return nil, err
	}
	return &cudaStream{s}, nil
}

// CuFileMode implements GDSDevice.
func (d *CUDADevice) CuFileMode(dir string) (string, string, error) {
	mode, reason := d.cuFileStatus()
	if mode == "absent" {
		return mode, reason, fmt.Errorf("cuFile absent: %s", reason)
	}
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	if d.probes == nil {
		d.probes = map[string]error{}
	}
	err, ok := d.probes[dir]
	if !ok {
		err = cuda.CuFileProbe(dir)
		d.probes[dir] = err
	}
	return mode, reason, err
}

func (d *CUDADevice) cuFileStatus() (string, string) {
	d.gdsOnce.Do(func() {
		info, err := cuda.CuFileStatus()
		if err != nil {
			d.gdsMode, d.gdsReason = "absent", err.Error()
			return
		}
		d.gdsMode, d.gdsReason = string(info.Mode), info.Reason
		if info.Mode != cuda.CuFileAbsent {
			if err := cuda.FileDriverOpen(); err != nil {
				d.gdsMode, d.gdsReason = "absent", "cuFileDriverOpen: "+err.Error()
			}
		}
	})
	return d.gdsMode, d.gdsReason
}

// OpenGDS implements GDSDevice.
func (d *CUDADevice) OpenGDS(fd int) (GDSFile, error) {
	h, err := cuda.HandleRegister(fd)
	if err != nil {
		return nil, err
	}
	return &cudaGDSFile{h}, nil
}

type cudaMem struct{ m *cuda.DeviceMem }

func (c *cudaMem) Ptr() uintptr         { return c.m.Ptr() }
func (c *cudaMem) Size() int64          { return int64(c.m.Size()) }
func (c *cudaMem) Free() error          { return c.m.Free() }
func (c *cudaMem) Raw() *cuda.DeviceMem { return c.m }

func (c *cudaMem) CopyToHost(dst []byte, off int64) error {
	_, err := c.m.ReadAt(dst, off)
	return err
}

type cudaStream struct{ s *cuda.Stream }

func devOf(m DeviceMem) (*cuda.DeviceMem, error) {
	c, ok := m.(*cudaMem)
	if !ok {
		return nil, fmt.Errorf("memory %T is not CUDA device memory", m)
	}
	return c.m, nil
}

func hostOf(p PinnedMem) (*cuda.HostMem, error) {
	h, ok := p.(*cuda.HostMem)
	if !ok {
		return nil, fmt.Errorf("memory %T is not CUDA pinned memory", p)
	}
	return h, nil
}

type cudaTransfer struct{ t *cuda.Transfer }

func (t cudaTransfer) Wait(ctx context.Context) error { return t.t.Wait(ctx) }

func (s *cudaStream) CopyHtoD(dst DeviceMem, dstOff int64, src PinnedMem, srcOff, n int) (Transfer, error) {
	d, err := devOf(dst)
	if err != nil {
		return nil, err
	}
	h, err := hostOf(src)
	if err != nil {
		return nil, err
	}
	t, err := s.s.CopyHtoD(d, int(dstOff), h, srcOff, n)
	if err != nil {
		return nil, err
	}
	return cudaTransfer{t}, nil
}

// multiTransfer waits for several transfers.
type multiTransfer []Transfer

func (m multiTransfer) Wait(ctx context.Context) error {
	var first error
	for _, t := range m {
		if err := t.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *cudaStream) Copy2DHtoD(dst DeviceMem, dstOff int64, dstPitch int, src PinnedMem, srcOff, srcPitch, width, rows int) (Transfer, error) {
	d, err := devOf(dst)
	if err != nil {
		return nil, err
	}
	h, err := hostOf(src)
	if err != nil {
		return nil, err
	}
	t, err := s.s.Copy2D(d, int(dstOff), dstPitch, h, nil, srcOff, srcPitch, width, rows)
	if errors.Is(err, cuda.ErrUnavailable) {
		return s.rows(rows, func(r int) (Transfer, error) {
			return s.CopyHtoD(dst, dstOff+int64(r*dstPitch), src, srcOff+r*srcPitch, width)
		})
	}
	if err != nil {
		return nil, err
	}
	return cudaTransfer{t}, nil
}

// rows issues one copy per row (drivers without cuMemcpy2DAsync).
func (s *cudaStream) rows(n int, one func(r int) (Transfer, error)) (Transfer, error) {
	var ts multiTransfer
	for r := range n {
		t, err := one(r)
		if err != nil {
			ts.Wait(context.Background())
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

func (s *cudaStream) Copy2DDtoD(dst DeviceMem, dstOff int64, dstPitch int, src DeviceMem, srcOff int64, srcPitch, width, rows int) (Transfer, error) {
	d, err := devOf(dst)
	if err != nil {
		return nil, err
	}
	sm, err := devOf(src)
	if err != nil {
		return nil, err
	}
	t, err := s.s.Copy2D(d, int(dstOff), dstPitch, nil, sm, int(srcOff), srcPitch, width, rows)
	if errors.Is(err, cuda.ErrUnavailable) {
		return s.rows(rows, func(r int) (Transfer, error) {
			return s.CopyDtoD(dst, dstOff+int64(r*dstPitch), src, srcOff+int64(r*srcPitch), width)
		})
	}
	if err != nil {
		return nil, err
	}
	return cudaTransfer{t}, nil
}

func (s *cudaStream) CopyDtoD(dst DeviceMem, dstOff int64, src DeviceMem, srcOff int64, n int) (Transfer, error) {
	d, err := devOf(dst)
	if err != nil {
		return nil, err
	}
	sm, err := devOf(src)
	if err != nil {
		return nil, err
	}
	t, err := s.s.CopyDtoD(d, int(dstOff), sm, int(srcOff), n)
	if err != nil {
		return nil, err
	}
	return cudaTransfer{t}, nil
}

func (s *cudaStream) Close() error { return s.s.Close() }

type cudaGDSFile struct{ h *cuda.FileHandle }

func (g *cudaGDSFile) Read(dst DeviceMem, dstOff int64, fileOff int64, n int) (int, error) {
	d, err := devOf(dst)
	if err != nil {
		return 0, err
	}
	return g.h.Read(d, n, fileOff, int(dstOff))
}

func (g *cudaGDSFile) Close() error { return g.h.Close() }

// RegisterReadOnly implements HostRegisterer (cuMemHostRegister, read-only).
func (d *CUDADevice) RegisterReadOnly(b []byte) (PinnedMem, error) {
	h, err := d.ctx.RegisterHostReadOnly(b)
	if err != nil {
		return nil, err
	}
	return h, nil
}
