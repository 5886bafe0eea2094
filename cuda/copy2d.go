package cuda

import (
	"fmt"
	"unsafe"
)

// memcpy2D is CUDA_MEMCPY2D (cuda.h) on 64-bit platforms: 128 bytes.
type memcpy2D struct {
	srcXInBytes, srcY uintptr
	srcMemoryType     uint32
	_                 uint32
	srcHost           unsafe.Pointer
	srcDevice         uintptr
	srcArray          uintptr
	srcPitch          uintptr
	dstXInBytes, dstY uintptr
	dstMemoryType     uint32
	_                 uint32
	dstHost           unsafe.Pointer
	dstDevice         uintptr
	dstArray          uintptr
	dstPitch          uintptr
	widthInBytes      uintptr
	height            uintptr
}

const (
	memoryTypeHost   = 1 // CU_MEMORYTYPE_HOST
	memoryTypeDevice = 2 // CU_MEMORYTYPE_DEVICE
)

// Copy2D copies rows rows of width bytes into dst (rows dstPitch bytes apart,
// from dstOff), asynchronously on s (cuMemcpy2DAsync). The source is either
// pinned host memory (srcHost) or device memory (srcDev), rows srcPitch bytes
// apart from srcOff. A tensor-parallel column share is one such copy.
func (s *Stream) Copy2D(dst *DeviceMem, dstOff, dstPitch int, srcHost *HostMem, srcDev *DeviceMem, srcOff, srcPitch, width, rows int) (*Transfer, error) {
	if s == nil || dst == nil || (srcHost == nil) == (srcDev == nil) {
		return nil, invalid("copy 2D")
	}
	if rows == 0 || width == 0 {
		return doneTransfer(), nil
	}
	if width < 0 || rows < 0 || width > dstPitch || width > srcPitch {
		return nil, fmt.Errorf("CUDA: copy 2D: width %d, pitches %d/%d, rows %d: %w", width, dstPitch, srcPitch, rows, ErrInvalid)
	}
	span := func(pitch int) int { return (rows-1)*pitch + width }
	if err := checkRange("copy 2D (dst)", dst.size, dstOff, span(dstPitch)); err != nil {
		return nil, err
	}
	p := &memcpy2D{dstMemoryType: memoryTypeDevice, dstDevice: dst.ptr + uintptr(dstOff), dstPitch: uintptr(dstPitch),
		srcPitch: uintptr(srcPitch), widthInBytes: uintptr(width), height: uintptr(rows)}
	holds := []*useCount{&dst.use}
	what := []string{"destination", "source"}
	if srcHost != nil {
		if err := checkRange("copy 2D (src)", srcHost.size, srcOff, span(srcPitch)); err != nil {
			return nil, err
		}
		p.srcMemoryType, p.srcHost = memoryTypeHost, unsafe.Add(srcHost.p, srcOff)
		holds = append(holds, &srcHost.use)
	} else {
		if err := checkRange("copy 2D (src)", srcDev.size, srcOff, span(srcPitch)); err != nil {
			return nil, err
		}
		p.srcMemoryType, p.srcDevice = memoryTypeDevice, srcDev.ptr+uintptr(srcOff)
		holds = append(holds, &srcDev.use)
	}
	d := s.ctx.d
	if d.cuMemcpy2DAsync == nil {
		return nil, fmt.Errorf("CUDA: cuMemcpy2DAsync_v2 not in this driver: %w", ErrUnavailable)
	}
	return s.issue("cuMemcpy2DAsync_v2", rows*width, what, holds, func() cuResult {
		return d.cuMemcpy2DAsync(unsafe.Pointer(p), s.h)
	})
}
