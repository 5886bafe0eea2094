package clientproto

import (
	"errors"
	"reflect"
	"syscall"
	"testing"
)

// TestKVLayouts pins the KV layouts the Python client mirrors, and the
// largest KV request against MaxRequest.
func TestKVLayouts(t *testing.T) {
	if n := len(KVBlocksRequest{Device: KVDeviceHost}.Append(nil)); n != KVBlocksFixedSize {
		t.Errorf("KV_PUT/KV_GET fixed part %d bytes", n)
	}
	if n := len(AppendKVKeys(nil, nil)); n != KVKeysFixedSize {
		t.Errorf("KV_CONTAINS fixed part %d bytes", n)
	}
	if n := len(KVStatsReply{}.Append(nil)); n != KVStatsReplySize {
		t.Errorf("KV_STATS reply %d bytes", n)
	}
	if n := HeaderSize + KVBlocksFixedSize + MaxKVKeys*KVKeySize; n > MaxRequest {
		t.Errorf("the largest KV request (%d bytes) is over MaxRequest", n)
	}
	if n := HeaderSize + KVBlocksFixedSize + 64 + MaxKVKeys*KVGPUEntrySize; n > MaxRequest {
		t.Errorf("the largest GPU KV request (%d bytes) is over MaxRequest", n)
	}
}

func TestKVRoundTrips(t *testing.T) {
	keys := [][32]byte{{1, 2, 3}, {31: 9}}
	r := KVBlocksRequest{Device: KVDeviceHost, BufOffset: 4096, Keys: keys}
	if g, err := ParseKVBlocks(r.Append(nil)); err != nil || !reflect.DeepEqual(g, r) {
		t.Errorf("KV blocks: %+v %v", g, err)
	}
	g := KVBlocksRequest{Device: 3, Keys: keys, Offsets: []uint64{0, 1 << 40}, IPCHandle: [64]byte{7, 63: 8}}
	if b := g.Append(nil); len(b) != KVBlocksFixedSize+64+2*KVGPUEntrySize {
		t.Errorf("GPU KV request of %d bytes", len(b))
	} else if got, err := ParseKVBlocks(b); err != nil || !reflect.DeepEqual(got, g) {
		t.Errorf("GPU KV blocks: %+v %v", got, err)
	}
	gb := g.Append(nil)
	le.PutUint64(gb[16:], 1) // buf_offset must be 0 on a GPU
	if _, err := ParseKVBlocks(gb); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("GPU KV request with a buf_offset: %v", err)
	}
	if _, err := ParseKVBlocks(g.Append(nil)[:KVBlocksFixedSize+64+KVGPUEntrySize]); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("GPU KV request cut short: %v", err)
	}
	if g, err := ParseKVKeys(AppendKVKeys(nil, keys)); err != nil || !reflect.DeepEqual(g, keys) {
		t.Errorf("KV keys: %+v %v", g, err)
	}
	if bs, tiers, err := ParseKVTiers(AppendKVTiers(nil, 1<<21, []byte{KVMiss, KVDisk})); err != nil || bs != 1<<21 || !reflect.DeepEqual(tiers, []byte{0, 2}) {
		t.Errorf("KV tiers: %d %v %v", bs, tiers, err)
	}
	st := []int32{0, -int32(syscall.ENOSPC)}
	if bs, g, err := ParseKVPut(AppendKVPut(nil, 7, st)); err != nil || bs != 7 || !reflect.DeepEqual(g, st) {
		t.Errorf("KV put: %v %v", g, err)
	}
	sr := KVStatsReply{BlockSize: 1, Flags: KVStatsDisk, MemBudget: 2, MemBytes: 3, DiskBudget: 4, DiskBytes: 5, MyMemBlocks: 6, MyDiskBlocks: 7, Cleared: 8}
	if g, err := ParseKVStats(sr.Append(nil)); err != nil || g != sr {
		t.Errorf("KV stats: %+v %v", g, err)
	}
}

func TestKVMalformed(t *testing.T) {
	good := KVBlocksRequest{Device: KVDeviceHost, Keys: [][32]byte{{1}}}.Append(nil)
	for name, b := range map[string][]byte{
		"short":        good[:KVBlocksFixedSize-1],
		"no keys":      KVBlocksRequest{}.Append(nil),
		"key cut":      good[:len(good)-1],
		"extra byte":   append(append([]byte{}, good...), 0),
		"flags":        func() []byte { b := append([]byte{}, good...); b[4] = 1; return b }(),
		"reserved":     func() []byte { b := append([]byte{}, good...); b[12] = 1; return b }(),
		"n over count": func() []byte { b := append([]byte{}, good...); b[8] = 2; return b }(),
	} {
		if _, err := ParseKVBlocks(b); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v", name, err)
		}
	}
	big := append([]byte{}, good...)
	le.PutUint32(big[8:], MaxKVKeys+1)
	if _, err := ParseKVBlocks(big); !errors.Is(err, syscall.E2BIG) {
		t.Errorf("too many keys: %v", err)
	}
	if _, err := ParseKVKeys([]byte{1, 0, 0, 0, 1, 0, 0, 0}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("KV_CONTAINS reserved: %v", err)
	}
	if _, _, err := ParseKVTiers([]byte{5, 0, 0, 0, 0, 0, 0, 0, 1}); err == nil {
		t.Error("KV tiers: n past the reply")
	}
}
