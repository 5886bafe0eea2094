package cuda_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/kylix/kylix/cuda"
)

// TestOpenIPCMem runs against the stub driver only (a real driver refuses
// to open a handle in the process that exported it; scripts/gpu-onramp.sh
// tests IPC between processes on the GPU machine). It checks the 64-byte
// handle travels by value through purego, that the mapping's size is the
// allocation's as the driver reports it, that copies past it are refused,
// and that Free closes the mapping exactly once.
func TestOpenIPCMem(t *testing.T) {
	if os.Getenv("KYLIX_CUDA_STUB") == "" {
		t.Skip("stub driver only (TestStubDriver runs it)")
	}
	ctx := gpuContext(t)
	owner := must[*cuda.DeviceMem](t)(ctx.Alloc(MiB))
	var h [cuda.IPCHandleSize]byte
	binary.LittleEndian.PutUint64(h[:], uint64(owner.Ptr()))
	copy(h[8:], "KYLXIPC")
	m := must[*cuda.DeviceMem](t)(ctx.OpenIPCMem(h))
	if m.Size() != MiB || m.Owned() {
		t.Fatalf("IPC mapping: size %d owned %v, want %d and not owned", m.Size(), m.Owned(), MiB)
	}
	data := randomBytes(5, 4096)
	must[int](t)(m.WriteAt(data, MiB-4096))
	if _, err := m.WriteAt(data, MiB-100); !errors.Is(err, cuda.ErrRange) {
		t.Errorf("write past the exported allocation: %v, want ErrRange", err)
	}
	got := make([]byte, 4096)
	must[int](t)(owner.ReadAt(got, MiB-4096))
	if !bytes.Equal(got, data) {
		t.Fatal("write through the IPC mapping not seen by the owner")
	}
	if err := m.Free(); err != nil {
		t.Fatalf("close IPC mapping: %v", err)
	}
	if err := m.Free(); !errors.Is(err, cuda.ErrFreed) {
		t.Errorf("second close: %v, want ErrFreed", err)
	}
	h[8] = 'X'
	if _, err := ctx.OpenIPCMem(h); err == nil {
		t.Error("a garbage handle opened")
	}
	if err := owner.Free(); err != nil {
		t.Fatal(err)
	}
}
