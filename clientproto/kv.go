package clientproto

// The KV-cache ops (docs/design/kv.md). They carry no fd of the mount:
// the namespace is the caller's uid (SO_PEERCRED), so a request names
// only the caller's own blocks. KV_PUT and KV_GET on the host device
// carry one fd, the caller's buffer: a regular file on tmpfs
// (memfd_create, or a file in /dev/shm) that the node reads the blocks
// from (pread) or writes them into (pwrite); block i is at buf_offset +
// i * block_size. On a CUDA device they carry no fd but the IPC handle of
// one allocation of the caller's, and each key its block's offset in it.

import (
	"fmt"
	"syscall"
)

// KV ops.
const (
	OpKVPut      = 4
	OpKVGet      = 5
	OpKVContains = 6
	OpKVStats    = 7
	OpKVClear    = 8
)

// IsKV reports whether op is a KV op.
func IsKV(op uint16) bool { return op >= OpKVPut && op <= OpKVClear }

// KV limits and layouts.
const (
	// MaxKVKeys bounds the keys of one KV request.
	MaxKVKeys = 2048
	// KVKeySize is one key.
	KVKeySize = 32
	// KVBlocksFixedSize is the fixed part of a KV_PUT or KV_GET body:
	// {u32 device; u32 flags; u32 n_keys; u32 reserved; u64 buf_offset}.
	KVBlocksFixedSize = 24
	// KVKeysFixedSize is the fixed part of a KV_CONTAINS body:
	// {u32 n_keys; u32 reserved}.
	KVKeysFixedSize = 8
	// KVDeviceHost is the device of a buffer in host memory; any other
	// device is a CUDA device ordinal.
	KVDeviceHost = 0xffffffff
	// KVGPUEntrySize is one key of a KV_PUT or KV_GET on a CUDA device:
	// {u8 key[32]; u64 offset}, after the fixed part and a 64-byte IPC
	// handle.
	KVGPUEntrySize = 40
	// KVStatsReplySize is an encoded KVStatsReply.
	KVStatsReplySize = 64
)

// Per-key answers. KV_GET and KV_CONTAINS: the tier, one byte per key.
// KV_PUT: an i32 per key, 0 stored or -errno (-ENOSPC: refused, no room
// that eviction can make; the block may be put again later).
const (
	KVMiss   = 0
	KVMemory = 1
	KVDisk   = 2
	// KVMember (KV_GET only): found on another member of the cluster
	// (and kept here since).
	KVMember = 3
)

// ErrTooManyKeys: n_keys above MaxKVKeys.
var ErrTooManyKeys = fmt.Errorf("more keys than a KV request takes (%d): %w", MaxKVKeys, syscall.E2BIG)

// KVBlocksRequest is a KV_PUT or KV_GET body. On the host device the
// blocks lie back to back from BufOffset in the buffer fd; on a CUDA
// device (BufOffset 0) block i lies at Offsets[i] in the allocation of
// IPCHandle.
type KVBlocksRequest struct {
	Device    uint32
	Flags     uint32
	BufOffset uint64
	Keys      [][32]byte
	IPCHandle [64]byte
	Offsets   []uint64
}

// GPU reports whether r names GPU memory (not the host buffer).
func (r KVBlocksRequest) GPU() bool { return r.Device != KVDeviceHost }

// Append encodes r.
func (r KVBlocksRequest) Append(b []byte) []byte {
	b = le.AppendUint32(b, r.Device)
	b = le.AppendUint32(b, r.Flags)
	b = le.AppendUint32(b, uint32(len(r.Keys)))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, r.BufOffset)
	if !r.GPU() {
		return appendKeys(b, r.Keys)
	}
	b = append(b, r.IPCHandle[:]...)
	for i, k := range r.Keys {
		b = append(b, k[:]...)
		var off uint64
		if i < len(r.Offsets) {
			off = r.Offsets[i]
		}
		b = le.AppendUint64(b, off)
	}
	return b
}

func appendKeys(b []byte, keys [][32]byte) []byte {
	for _, k := range keys {
		b = append(b, k[:]...)
	}
	return b
}

func parseKeys(b []byte, n uint32) ([][32]byte, error) {
	if n > MaxKVKeys {
		return nil, ErrTooManyKeys
	}
	if n == 0 || len(b) != int(n)*KVKeySize {
		return nil, ErrBody
	}
	keys := make([][32]byte, n)
	for i := range keys {
		copy(keys[i][:], b[i*KVKeySize:])
	}
	return keys, nil
}

// ParseKVBlocks decodes a KV_PUT or KV_GET body (layout only: the node
// checks the device and the buffer).
func ParseKVBlocks(b []byte) (KVBlocksRequest, error) {
	var r KVBlocksRequest
	if len(b) < KVBlocksFixedSize {
		return r, ErrBody
	}
	r.Device, r.Flags = le.Uint32(b), le.Uint32(b[4:])
	n, reserved := le.Uint32(b[8:]), le.Uint32(b[12:])
	r.BufOffset = le.Uint64(b[16:])
	if reserved != 0 || r.Flags != 0 {
		return r, ErrBody
	}
	if !r.GPU() {
		var err error
		r.Keys, err = parseKeys(b[KVBlocksFixedSize:], n)
		return r, err
	}
	if n > MaxKVKeys {
		return r, ErrTooManyKeys
	}
	rest := b[KVBlocksFixedSize:]
	if r.BufOffset != 0 || n == 0 || len(rest) != 64+int(n)*KVGPUEntrySize {
		return r, ErrBody
	}
	copy(r.IPCHandle[:], rest)
	r.Keys, r.Offsets = make([][32]byte, n), make([]uint64, n)
	for i := range r.Keys {
		e := rest[64+i*KVGPUEntrySize:]
		copy(r.Keys[i][:], e)
		r.Offsets[i] = le.Uint64(e[32:])
	}
	return r, nil
}

// AppendKVKeys encodes a KV_CONTAINS body.
func AppendKVKeys(b []byte, keys [][32]byte) []byte {
	b = le.AppendUint32(b, uint32(len(keys)))
	b = le.AppendUint32(b, 0)
	return appendKeys(b, keys)
}

// ParseKVKeys decodes a KV_CONTAINS body.
func ParseKVKeys(b []byte) ([][32]byte, error) {
	if len(b) < KVKeysFixedSize || le.Uint32(b[4:]) != 0 {
		return nil, ErrBody
	}
	return parseKeys(b[KVKeysFixedSize:], le.Uint32(b))
}

// AppendKVTiers encodes a KV_GET or KV_CONTAINS reply: {u32 n; u32
// block_size} + n × u8 tier.
func AppendKVTiers(b []byte, blockSize uint32, tiers []byte) []byte {
	b = le.AppendUint32(b, uint32(len(tiers)))
	b = le.AppendUint32(b, blockSize)
	return append(b, tiers...)
}

// ParseKVTiers decodes a KV_GET or KV_CONTAINS reply.
func ParseKVTiers(b []byte) (blockSize uint32, tiers []byte, err error) {
	if len(b) < 8 || uint64(len(b)-8) != uint64(le.Uint32(b)) || le.Uint32(b) > MaxKVKeys {
		return 0, nil, ErrBody
	}
	return le.Uint32(b[4:]), b[8:], nil
}

// AppendKVPut encodes a KV_PUT reply: {u32 n; u32 block_size} + n × i32
// status.
func AppendKVPut(b []byte, blockSize uint32, status []int32) []byte {
	b = le.AppendUint32(b, uint32(len(status)))
	b = le.AppendUint32(b, blockSize)
	for _, s := range status {
		b = le.AppendUint32(b, uint32(s))
	}
	return b
}

// ParseKVPut decodes a KV_PUT reply.
func ParseKVPut(b []byte) (blockSize uint32, status []int32, err error) {
	if len(b) < 8 || le.Uint32(b) > MaxKVKeys || uint64(len(b)-8) != 4*uint64(le.Uint32(b)) {
		return 0, nil, ErrBody
	}
	status = make([]int32, le.Uint32(b))
	for i := range status {
		status[i] = int32(le.Uint32(b[8+4*i:]))
	}
	return le.Uint32(b[4:]), status, nil
}

// KVStatsReply is the KV_STATS reply fields: the store's shape and use
// (all namespaces together), and the caller's own blocks.
type KVStatsReply struct {
	BlockSize  uint32
	Flags      uint32 // KVStatsDisk: the store has a disk tier
	MemBudget  uint64
	MemBytes   uint64
	DiskBudget uint64
	DiskBytes  uint64
	// MyMemBlocks, MyDiskBlocks: the caller's namespace's blocks per tier.
	MyMemBlocks  uint64
	MyDiskBlocks uint64
	// Cleared: KV_CLEAR's answer, the caller's blocks dropped.
	Cleared uint64
}

// KVStatsDisk is set in KVStatsReply.Flags when there is a disk tier.
const KVStatsDisk = 1

// Append encodes r.
func (r KVStatsReply) Append(b []byte) []byte {
	b = le.AppendUint32(b, r.BlockSize)
	b = le.AppendUint32(b, r.Flags)
	for _, v := range []uint64{r.MemBudget, r.MemBytes, r.DiskBudget, r.DiskBytes, r.MyMemBlocks, r.MyDiskBlocks, r.Cleared} {
		b = le.AppendUint64(b, v)
	}
	return b
}

// ParseKVStats decodes a KV_STATS or KV_CLEAR reply.
func ParseKVStats(b []byte) (KVStatsReply, error) {
	if len(b) != KVStatsReplySize {
		return KVStatsReply{}, ErrBody
	}
	u := func(i int) uint64 { return le.Uint64(b[8+8*i:]) }
	return KVStatsReply{BlockSize: le.Uint32(b), Flags: le.Uint32(b[4:]), MemBudget: u(0), MemBytes: u(1), DiskBudget: u(2),
		DiskBytes: u(3), MyMemBlocks: u(4), MyDiskBlocks: u(5), Cleared: u(6)}, nil
}
