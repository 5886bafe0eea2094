package node

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/kylix/kylix/cuda"
)

// kvMaps keeps the CUDA allocations that one client connection's KV
// requests named mapped between its requests (docs/design/kv.md, "GPU
// copies"): opening an IPC handle (cuIpcOpenMemHandle) and closing it
// again cost more per request than copying hundreds of MiB, and a serving
// engine names the same few allocations, its KV cache, in every request.
// An IPC handle names one allocation for its whole life: the driver gives
// a new allocation a new handle even at the same address, so a mapping
// found by its handle is the allocation the caller names. A connection
// keeps at most kvMapsPerConn, the least recently used closed first, and
// all of them when it closes; each holds its device's context open (FILL
// keeps it the same way while it runs), so --gpu-idle counts from then.
type kvMaps struct {
	mu   sync.Mutex
	open []*kvMap // least recently used first
	fill *fillService
}

// kvMapsPerConn bounds the allocations one connection keeps mapped.
const kvMapsPerConn = 8

type kvMap struct {
	dev    int
	handle [cuda.IPCHandleSize]byte
	mem    *cuda.DeviceMem
	d      *fillDev
}

func newKVMaps(fill *fillService) *kvMaps { return &kvMaps{fill: fill} }

// get returns the mapping of handle on device dev, opening it when this
// connection has not; reused says which. The caller holds it until its
// request is done (one request at a time per connection).
func (m *kvMaps) get(dev int, handle [cuda.IPCHandleSize]byte) (km *kvMap, reused bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range m.open {
		if x.dev == dev && x.handle == handle {
			copy(m.open[i:], m.open[i+1:])
			m.open[len(m.open)-1] = x
			return x, true, nil
		}
	}
	d, err := m.fill.acquire(dev)
	if err != nil {
		return nil, false, err
	}
	mem, err := d.dev.Context().OpenIPCMem(handle)
	if err != nil {
		m.fill.release(d)
		return nil, false, fmt.Errorf("cannot open the CUDA IPC handle on cuda:%d (from cuIpcGetMemHandle of an allocation on that device, in another process): %v: %w", dev, err, syscall.EINVAL)
	}
	km = &kvMap{dev: dev, handle: handle, mem: mem, d: d}
	m.open = append(m.open, km)
	if len(m.open) > kvMapsPerConn {
		m.closeLocked(m.open[0])
		m.open = m.open[1:]
	}
	return km, false, nil
}

// close unmaps every allocation of the connection (it ended).
func (m *kvMaps) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, km := range m.open {
		m.closeLocked(km)
	}
	m.open = nil
}

func (m *kvMaps) closeLocked(km *kvMap) {
	km.mem.Free()
	m.fill.release(km.d)
}
