package node

// The KV-cache tier (docs/design/kv.md): a kvstore.Store the node opens
// when Config.KV gives it a host-memory budget, served on the client socket
// (KV_PUT, KV_GET, KV_CONTAINS, KV_STATS, KV_CLEAR of package clientproto;
// the namespace is the caller's uid) and to the node's user on the admin
// socket (OpKVStats, OpKVClear).

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/clientproto"
	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/node/kvstore"
)

// Defaults and limits of KVConfig.
const (
	// DefaultKVBlockSize is the block size when KVConfig.BlockSize is 0.
	DefaultKVBlockSize = 2 << 20
	// MaxKVBlockSize bounds a block (one read of a buffer per block).
	MaxKVBlockSize = 1 << 30
	// KVDirName is the disk tier's directory in the data directory, apart
	// from the packs: model GC and KV eviction never meet.
	KVDirName = "kv"
)

// KVConfig is the KV-cache store of a node (Config.KV).
type KVConfig struct {
	// BlockSize is the size of every block; 0: DefaultKVBlockSize.
	BlockSize int
	// MemBudget is the host tier's bytes; 0: no KV store at all (every
	// KV request is refused, saying so).
	MemBudget int64
	// DiskBudget is the disk tier's bytes (DATA/kv); 0: none.
	DiskBudget int64
}

// KVStatsReply is the reply of OpKVStats.
type KVStatsReply struct {
	// Enabled: the node has a KV store; else Note says why not.
	Enabled bool           `json:"enabled"`
	Note    string         `json:"note,omitempty"`
	Stats   *kvstore.Stats `json:"stats,omitempty"`
}

// KVClearRequest is OpKVClear: the blocks of one uid, or All.
type KVClearRequest struct {
	UID uint32 `json:"uid"`
	All bool   `json:"all"`
}

// KVClearReply is the reply of OpKVClear.
type KVClearReply struct {
	Blocks int `json:"blocks"`
}

// errNoKV: a KV request to a node without a KV store.
var errNoKV = fmt.Errorf("this node has no KV store (start it with kylix serve --kv-mem SIZE): %w", syscall.EOPNOTSUPP)

// openKV opens the node's KV store (nil when cfg has no memory budget).
func openKV(cfg KVConfig, dataDir string, log *slog.Logger) (*kvstore.Store, error) {
	if cfg.MemBudget <= 0 {
		return nil, nil
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultKVBlockSize
	}
	if cfg.BlockSize < 0 || cfg.BlockSize > MaxKVBlockSize {
		return nil, fmt.Errorf("serve: KV block size %d: it must be between 1 byte and %s", cfg.BlockSize, human(MaxKVBlockSize))
	}
	s, err := kvstore.Open(kvstore.Options{BlockSize: cfg.BlockSize, MemBudget: cfg.MemBudget, DiskBudget: cfg.DiskBudget,
		Dir: filepath.Join(dataDir, KVDirName), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return s, nil
}

// KVStats is OpKVStats.
func (n *Node) KVStats() KVStatsReply {
	if n.kv == nil {
		return KVStatsReply{Note: errNoKV.Error()}
	}
	st := n.kv.Stats()
	return KVStatsReply{Enabled: true, Stats: &st}
}

// KVClear is OpKVClear.
func (n *Node) KVClear(r KVClearRequest) (KVClearReply, error) {
	if n.kv == nil {
		return KVClearReply{}, errNoKV
	}
	return KVClearReply{Blocks: n.kv.Clear(r.UID, r.All)}, nil
}

// kvRequest answers a KV op of the client socket. The namespace is the
// caller's uid: a request can only name the caller's own blocks.
func (c *clientServer) kvRequest(op uint16, body []byte, fds []int, p peer) reply {
	kv := c.kv
	if kv == nil {
		return refuse(errNoKV)
	}
	if !p.ok {
		return refuse(fmt.Errorf("the caller's uid could not be read (SO_PEERCRED), and KV blocks are kept per uid: %w", syscall.EPERM))
	}
	wantFds := func(n int) error {
		if len(fds) != n {
			return fmt.Errorf("this KV request carries %d fds (SCM_RIGHTS), got %d: %w", n, len(fds), syscall.EBADF)
		}
		return nil
	}
	bs := uint32(kv.BlockSize())
	switch op {
	case clientproto.OpKVStats, clientproto.OpKVClear:
		if err := wantFds(0); err != nil {
			return refuse(err)
		}
		if len(body) != 0 {
			return refuse(fmt.Errorf("op %d takes an empty body: %w", op, syscall.EINVAL))
		}
		var cleared int
		if op == clientproto.OpKVClear {
			cleared = kv.Clear(p.uid, false)
		}
		st := kv.Stats()
		mine, mineDisk := kv.NSStats(p.uid)
		r := clientproto.KVStatsReply{BlockSize: bs, MemBudget: uint64(st.Memory.Budget), MemBytes: uint64(st.Memory.Bytes),
			DiskBudget: uint64(st.Disk.Budget), DiskBytes: uint64(st.Disk.Bytes), MyMemBlocks: uint64(mine), MyDiskBlocks: uint64(mineDisk), Cleared: uint64(cleared)}
		if st.Disk.Budget > 0 {
			r.Flags |= clientproto.KVStatsDisk
		}
		return reply{fields: r.Append(nil)}
	case clientproto.OpKVContains:
		if err := wantFds(0); err != nil {
			return refuse(err)
		}
		keys, err := clientproto.ParseKVKeys(body)
		if err != nil {
			return refuse(err)
		}
		tiers := make([]byte, len(keys))
		for i, k := range keys {
			tiers[i] = byte(kv.Contains(kvstore.Key{NS: p.uid, ID: k}))
		}
		return reply{fields: clientproto.AppendKVTiers(nil, bs, tiers)}
	}
	r, err := clientproto.ParseKVBlocks(body)
	if err != nil {
		return refuse(err)
	}
	var read, write func(i int, b []byte) error // block i from / into the caller's memory
	if r.GPU() {
		if err := wantFds(0); err != nil {
			return refuse(err)
		}
		mem, done, err := c.kvOpenGPU(r, uint64(bs))
		if err != nil {
			return refuse(err)
		}
		defer done()
		read = func(i int, b []byte) error { _, err := mem.ReadAt(b, int64(r.Offsets[i])); return err }
		write = func(i int, b []byte) error { _, err := mem.WriteAt(b, int64(r.Offsets[i])); return err }
	} else {
		if err := wantFds(1); err != nil {
			return refuse(err)
		}
		fd := fds[0]
		if err := checkKVBuffer(fd, op == clientproto.OpKVGet, r.BufOffset, uint64(len(r.Keys))*uint64(bs)); err != nil {
			return refuse(err)
		}
		at := func(i int) int64 { return int64(r.BufOffset) + int64(i)*int64(bs) }
		read = func(i int, b []byte) error { return preadFull(fd, b, at(i)) }
		write = func(i int, b []byte) error { return pwriteFull(fd, b, at(i)) }
	}
	if op == clientproto.OpKVPut {
		status := make([]int32, len(r.Keys))
		err := eachKey(len(r.Keys), func(i int) error {
			b := make([]byte, bs)
			if err := read(i, b); err != nil {
				return fmt.Errorf("reading block %d from the caller's memory: %w", i, errnoOr(err, syscall.EIO))
			}
			if err := kv.Put(kvstore.Key{NS: p.uid, ID: r.Keys[i]}, b); err != nil {
				status[i] = -int32(kvErrno(err))
			}
			return nil
		})
		if err != nil {
			return refuse(err)
		}
		return reply{fields: clientproto.AppendKVPut(nil, bs, status)}
	}
	tiers := make([]byte, len(r.Keys))
	err = eachKey(len(r.Keys), func(i int) error {
		t, err := kv.Get(kvstore.Key{NS: p.uid, ID: r.Keys[i]}, func(b []byte) error { return write(i, b) })
		if err != nil {
			return fmt.Errorf("writing block %d into the caller's memory: %w", i, errnoOr(err, syscall.EIO))
		}
		tiers[i] = byte(t)
		return nil
	})
	if err != nil {
		return refuse(err)
	}
	return reply{fields: clientproto.AppendKVTiers(nil, bs, tiers)}
}

// kvOpenGPU opens the caller's CUDA allocation of a KV request (its IPC
// handle, on the device's context that FILL holds: fill.go) and checks
// every block against the allocation's size as the driver reports it,
// never the caller's word, before any byte moves. done gives the mapping
// and the device back.
func (c *clientServer) kvOpenGPU(r clientproto.KVBlocksRequest, bs uint64) (*cuda.DeviceMem, func(), error) {
	if c.fill == nil {
		return nil, nil, fmt.Errorf("this node serves no GPU: %w", syscall.ENODEV)
	}
	d, err := c.fill.acquire(int(r.Device))
	if err != nil {
		return nil, nil, err
	}
	mem, err := d.dev.Context().OpenIPCMem(r.IPCHandle)
	if err != nil {
		c.fill.release(d)
		return nil, nil, fmt.Errorf("cannot open the CUDA IPC handle on cuda:%d (from cuIpcGetMemHandle of an allocation on that device, in another process): %v: %w", r.Device, err, syscall.EINVAL)
	}
	done := func() { mem.Free(); c.fill.release(d) }
	alloc := uint64(mem.Size())
	for i, off := range r.Offsets {
		if off > alloc || bs > alloc-off {
			done()
			return nil, nil, fmt.Errorf("block %d at offset %d (%d bytes) does not fit the allocation's %d bytes: %w", i, off, bs, alloc, syscall.EFAULT)
		}
	}
	return mem, done, nil
}

// kvWorkers bounds the keys of one request handled at once: a put hashes
// each block (BLAKE3, about 3 GB/s a core) and a disk hit reads and
// verifies it, so the keys of a batch go to several cores.
const kvWorkers = 8

// eachKey runs fn(i) for i in [0, n) on up to min(kvWorkers, GOMAXPROCS)
// goroutines; the first error is returned (the others still run).
func eachKey(n int, fn func(i int) error) error {
	workers := min(n, kvWorkers, runtime.GOMAXPROCS(0))
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	wg.Wait()
	return first
}

// kvErrno is the per-key status of a refused put.
func kvErrno(err error) syscall.Errno {
	switch {
	case errors.Is(err, kvstore.ErrFull):
		return syscall.ENOSPC
	case errors.Is(err, kvstore.ErrSize):
		return syscall.EINVAL
	case errors.Is(err, kvstore.ErrClosed):
		return syscall.ESHUTDOWN
	}
	return syscall.EIO
}

// checkKVBuffer checks the caller's buffer fd: a regular file on tmpfs
// (memfd_create or /dev/shm: never a pipe, socket or FUSE file that could
// stall the node), opened for reading (put) or writing (get; the fd's own
// access mode is what lets the node write, never the node's rights), and
// at least off+n bytes long (the node does not grow it).
func checkKVBuffer(fd int, write bool, off, n uint64) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("KV buffer fd: %w", err)
	}
	acc := fl & unix.O_ACCMODE
	switch {
	case fl&unix.O_PATH != 0:
		return fmt.Errorf("KV buffer fd is an O_PATH fd: %w", syscall.EBADF)
	case write && acc == unix.O_RDONLY:
		return fmt.Errorf("KV_GET writes into the buffer: its fd must be open for writing: %w", syscall.EBADF)
	case !write && acc == unix.O_WRONLY:
		return fmt.Errorf("KV_PUT reads the buffer: its fd must be open for reading: %w", syscall.EBADF)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("KV buffer fd: %w", err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("KV buffer fd: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || sfs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("KV buffer must be a regular file in memory (memfd_create or /dev/shm): %w", syscall.EINVAL)
	}
	if size := uint64(st.Size); off > size || n > size-off {
		return fmt.Errorf("KV blocks at %d..+%d lie past the buffer's %d bytes: %w", off, n, size, syscall.EFAULT)
	}
	return nil
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("the buffer ended early: %w", syscall.EFAULT)
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
