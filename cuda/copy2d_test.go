package cuda

import (
	"testing"
	"unsafe"
)

// The CUDA_MEMCPY2D layout from cuda.h on 64-bit platforms.
func TestMemcpy2DLayout(t *testing.T) {
	var p memcpy2D
	if unsafe.Sizeof(p) != 128 {
		t.Fatalf("size %d, want 128", unsafe.Sizeof(p))
	}
	for name, got := range map[string]uintptr{
		"srcMemoryType": unsafe.Offsetof(p.srcMemoryType), "srcHost": unsafe.Offsetof(p.srcHost),
		"srcPitch": unsafe.Offsetof(p.srcPitch), "dstMemoryType": unsafe.Offsetof(p.dstMemoryType),
		"dstDevice": unsafe.Offsetof(p.dstDevice), "dstPitch": unsafe.Offsetof(p.dstPitch), "height": unsafe.Offsetof(p.height),
	} {
		want := map[string]uintptr{"srcMemoryType": 16, "srcHost": 24, "srcPitch": 48, "dstMemoryType": 72, "dstDevice": 88, "dstPitch": 104, "height": 120}[name]
		if got != want {
			t.Errorf("%s at %d, want %d", name, got, want)
		}
	}
}
