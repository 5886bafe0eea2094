package node

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/kylix/kylix/cuda"
)

// kvMaps keeps the CUDA allocations that one client connection's KV
// requests named mapped between its requests (docs/design/kv.md,
// "Mappings kept per connection"): opening an IPC handle
// (cuIpcOpenMemHandle) and closing it again cost more per request than
// copying hundreds of MiB, and a serving engine names the same few
// allocations, its KV cache, in every request. An IPC handle names one
// allocation for its whole life: the driver gives a new allocation a new
// handle even at the same address, so a mapping found by its handle is
// the allocation the caller names. A connection keeps at most
// kvMapsPerConn, the least recently used let go first, and all of them
// when it closes. The mappings themselves are the node's (kvMapped), one
// per allocation however many connections name it: a handle is opened
// once per context.
type kvMaps struct {
	mu     sync.Mutex
	open   []*kvMap // least recently used first
	shared *kvMapped
}

// kvMapsPerConn bounds the allocations one connection keeps mapped.
const kvMapsPerConn = 8

// kvMapped is the node's open IPC mappings of KV requests, each counted
// by the connections that keep it. Each holds its device's context open
// (FILL keeps it the same way while it runs), so --gpu-idle counts from
// the last one's release.
type kvMapped struct {
	mu   sync.Mutex
	m    map[kvMapKey]*kvMap
	fill *fillService
}

type kvMapKey struct {
	dev    int
	handle [cuda.IPCHandleSize]byte
}

type kvMap struct {
	key  kvMapKey
	mem  *cuda.DeviceMem
	d    *fillDev
	refs int // connections keeping it (kvMapped.mu)
}

func newKVMapped(fill *fillService) *kvMapped {
	return &kvMapped{m: map[kvMapKey]*kvMap{}, fill: fill}
}

// acquire returns the mapping of k, opening it when no connection keeps
// it, and counts one more keeper.
func (s *kvMapped) acquire(k kvMapKey) (*kvMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if km := s.m[k]; km != nil {
		km.refs++
		return km, nil
	}
	d, err := s.fill.acquire(k.dev)
	if err != nil {
		return nil, err
	}
	mem, err := d.dev.Context().OpenIPCMem(k.handle)
	if err != nil {
		s.fill.release(d)
		return nil, fmt.Errorf("cannot open the CUDA IPC handle on cuda:%d (from cuIpcGetMemHandle of an allocation on that device, in another process): %v: %w", k.dev, err, syscall.EINVAL)
	}
	km := &kvMap{key: k, mem: mem, d: d, refs: 1}
	s.m[k] = km
	return km, nil
}

// release counts one keeper less; the last one unmaps it.
func (s *kvMapped) release(km *kvMap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	km.refs--
	if km.refs > 0 {
		return
	}
	delete(s.m, km.key)
	km.mem.Free()
	s.fill.release(km.d)
}

func newKVMaps(shared *kvMapped) *kvMaps { return &kvMaps{shared: shared} }

// get returns the mapping of handle on device dev, keeping it for this
// connection when it did not; reused says it did. The caller uses it
// until its request is done (one request at a time per connection).
func (m *kvMaps) get(dev int, handle [cuda.IPCHandleSize]byte) (km *kvMap, reused bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := kvMapKey{dev, handle}
	for i, x := range m.open {
		if x.key == k {
			copy(m.open[i:], m.open[i+1:])
			m.open[len(m.open)-1] = x
			return x, true, nil
		}
	}
	km, err = m.shared.acquire(k)
	if err != nil {
		return nil, false, err
	}
	m.open = append(m.open, km)
	if len(m.open) > kvMapsPerConn {
		m.shared.release(m.open[0])
		m.open = m.open[1:]
	}
	return km, false, nil
}

// close lets go of every allocation the connection kept (it ended).
func (m *kvMaps) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, km := range m.open {
		m.shared.release(km)
	}
	m.open = nil
}
