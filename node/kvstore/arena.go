package kvstore

import (
	"container/heap"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The host tier's memory. Blocks live in one anonymous mapping of
// MemBudget bytes (rounded down to whole blocks) cut into slots of one
// block each, not on the Go heap: so the node can page-lock the whole tier
// once for a GPU (cuMemHostRegister of Arena) and let the copy engine read
// and write blocks in place, where pageable memory ran at 0.11x of pinned
// host-to-device copies on the H200 (docs/bench.md, "KV cache with CUDA
// tensors"). Pages are touched only as slots are first used.
//
// A slot is lent to readers (Get, Hold, the disk writer) by a reference
// count: a block evicted, cleared or replaced while lent keeps its slot
// until its last reader is done, so no copy in flight ever reads a slot
// that a new put is filling.
type arena struct {
	mem  []byte
	bs   int
	free freeSlots // slots holding nothing, the lowest taken first
	refs []int32   // readers of each slot
	// orphan: the slot's block left the store while readers held it; the
	// last of them frees it.
	orphan []bool
}

func newArena(budget int64, bs int) (*arena, error) {
	n := budget / int64(bs)
	if n < 1 {
		return nil, fmt.Errorf("kv: the host tier budget (%d bytes) must hold at least one block of %d bytes: %w", budget, bs, ErrFull)
	}
	if n > 1<<31-1 {
		return nil, fmt.Errorf("kv: the host tier budget holds %d blocks; at most %d: %w", n, 1<<31-1, ErrSize)
	}
	mem, err := unix.Mmap(-1, 0, int(n*int64(bs)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("kv: mapping the host tier (%d bytes): %w", n*int64(bs), err)
	}
	a := &arena{mem: mem, bs: bs, free: make(freeSlots, n), refs: make([]int32, n), orphan: make([]bool, n)}
	for i := range a.free {
		a.free[i] = int32(i) // ascending: already a heap
	}
	return a, nil
}

// bytes is slot i's block.
func (a *arena) bytes(i int32) []byte {
	off := int(i) * a.bs
	return a.mem[off : off+a.bs : off+a.bs]
}

// take returns a free slot, or false.
func (a *arena) take() (int32, bool) {
	if len(a.free) == 0 {
		return 0, false
	}
	return heap.Pop(&a.free).(int32), true
}

// release gives slot i back: now, or when its last reader is done.
func (a *arena) release(i int32) {
	if a.refs[i] > 0 {
		a.orphan[i] = true
		return
	}
	heap.Push(&a.free, i)
}

func (a *arena) hold(i int32) { a.refs[i]++ }

// unhold ends one reader of slot i.
func (a *arena) unhold(i int32) {
	a.refs[i]--
	if a.refs[i] == 0 && a.orphan[i] {
		a.orphan[i] = false
		heap.Push(&a.free, i)
	}
}

// offset returns where b starts in the arena, if b is a slot's block.
func (a *arena) offset(b []byte) (int64, bool) {
	if a == nil || len(b) == 0 || len(a.mem) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base+uintptr(len(b)) > uintptr(len(a.mem)) {
		return 0, false
	}
	return int64(p - base), true
}

func (a *arena) unmap() error {
	if a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem = nil
	return err
}

// freeSlots is a min-heap of free slots (container/heap). The lowest free
// slot is taken first, so the blocks of a batch put together land in
// adjacent slots wherever eviction freed a run of them, and a get of the
// batch copies them to a GPU as one run (node: kvRuns), not block by block.
type freeSlots []int32

func (h freeSlots) Len() int           { return len(h) }
func (h freeSlots) Less(i, j int) bool { return h[i] < h[j] }
func (h freeSlots) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *freeSlots) Push(x any)        { *h = append(*h, x.(int32)) }
func (h *freeSlots) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
