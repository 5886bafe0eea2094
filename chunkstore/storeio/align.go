package storeio

import "unsafe"

// AlignedBuffer returns a zeroed buffer whose address is a multiple of
// BlockSize and whose length is n rounded up to a multiple of BlockSize, as
// O_DIRECT reads need. It is ordinary Go memory (over-allocated by one block
// and sliced), so the garbage collector frees it; the Go heap does not move
// objects, so its address is stable while the kernel writes into it.
func AlignedBuffer(n int) []byte {
	if n < 0 {
		panic("storeio: AlignedBuffer: negative size")
	}
	size := int(AlignUp(int64(n)))
	if size == 0 {
		return []byte{}
	}
	raw := make([]byte, size+BlockSize-1)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) & (BlockSize - 1)); r != 0 {
		skip = BlockSize - r
	}
	return raw[skip : skip+size : skip+size]
}

// AlignDown rounds x down to a multiple of BlockSize (x >= 0).
func AlignDown(x int64) int64 { return x &^ (BlockSize - 1) }

// AlignUp rounds x up to a multiple of BlockSize (x >= 0).
func AlignUp(x int64) int64 { return (x + BlockSize - 1) &^ (BlockSize - 1) }

// IsAligned reports whether b's address and length are multiples of BlockSize,
// as O_DIRECT needs (an empty slice is aligned).
func IsAligned(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	return uintptr(unsafe.Pointer(&b[0]))&(BlockSize-1) == 0 && len(b)&(BlockSize-1) == 0
}
