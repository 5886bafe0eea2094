package node

// The KV-cache tier (docs/design/kv.md): a kvstore.Store the node opens
// when Config.KV gives it a host-memory budget, served on the client socket
// (KV_PUT, KV_GET, KV_CONTAINS, KV_STATS, KV_CLEAR of package clientproto;
// the namespace is the caller's uid) and to the node's user on the admin
// socket (OpKVStats, OpKVClear).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	// Members: the members tier, on a node in a cluster.
	Members *KVMemberStats `json:"members,omitempty"`
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
	r := KVStatsReply{Enabled: true, Stats: &st}
	r.Members = n.kvm.Load().stats()
	return r
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
		c.kvm.contains(p.uid, keys, tiers)
		return reply{fields: clientproto.AppendKVTiers(nil, bs, tiers)}
	}
	r, err := clientproto.ParseKVBlocks(body)
	if err != nil {
		return refuse(err)
	}
	if r.GPU() {
		if err := wantFds(0); err != nil {
			return refuse(err)
		}
		return c.kvGPU(op, r, p)
	}
	if err := wantFds(1); err != nil {
		return refuse(err)
	}
	fd := fds[0]
	if err := checkKVBuffer(fd, op == clientproto.OpKVGet, r.BufOffset, uint64(len(r.Keys))*uint64(bs)); err != nil {
		return refuse(err)
	}
	at := func(i int) int64 { return int64(r.BufOffset) + int64(i)*int64(bs) }
	if op == clientproto.OpKVPut {
		return c.kvPut(p.uid, r.Keys, func(i int, dst []byte) error { return preadFull(fd, dst, at(i)) })
	}
	tiers := make([]byte, len(r.Keys))
	err = eachKey(len(r.Keys), func(i int) error {
		hit := c.kvm.hold(kv, kvstore.Key{NS: p.uid, ID: r.Keys[i]})
		if hit.tier == 0 {
			return nil
		}
		err := pwriteFull(fd, hit.b, at(i))
		hit.release()
		if err != nil {
			return fmt.Errorf("writing block %d into the caller's memory: %w", i, errnoOr(err, syscall.EIO))
		}
		tiers[i] = hit.tier
		return nil
	})
	if err != nil {
		return refuse(err)
	}
	return reply{fields: clientproto.AppendKVTiers(nil, bs, tiers)}
}

// kvPut stores the blocks of a KV_PUT: read(i, dst) brings block i from
// the caller's memory straight into the host-tier slot that will keep it.
// A block the store refuses (full, closed) gets its status; a block that
// cannot be read from the caller fails the request. In a cluster, each
// block stored is copied to its home member behind the reply.
func (c *clientServer) kvPut(ns uint32, keys [][32]byte, read func(i int, dst []byte) error) reply {
	kv := c.kv
	status := make([]int32, len(keys))
	// The keys take their slots in their order (the copies and hashes
	// still run in parallel), so a batch lands in adjacent slots where
	// the tier has them free (the arena gives the lowest first) and its
	// get is a few long copies (kvRuns).
	turn := newKVTurns()
	err := eachKey(len(keys), func(i int) error {
		var rerr error
		k := kvstore.Key{NS: ns, ID: keys[i]}
		turn.wait(i)
		err := kv.PutFrom(k, func(dst []byte) error {
			turn.done(i) // the slot is taken: the next key may take its own
			rerr = read(i, dst)
			return rerr
		})
		turn.done(i) // refused: no slot was taken
		switch {
		case rerr != nil:
			return fmt.Errorf("reading block %d from the caller's memory: %w", i, errnoOr(rerr, syscall.EIO))
		case err != nil:
			status[i] = -int32(kvErrno(err))
		default:
			c.kvm.put(k)
		}
		return nil
	})
	if err != nil {
		return refuse(err)
	}
	return reply{fields: clientproto.AppendKVPut(nil, uint32(kv.BlockSize()), status)}
}

// kvTurns lets the keys of a request take a step in their order: key i
// waits until every key before it is done with it. Keys are handed to the
// workers in order (eachKey), so a wait is short.
type kvTurns struct {
	mu   sync.Mutex
	cond *sync.Cond
	next int
}

func newKVTurns() *kvTurns {
	t := &kvTurns{}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// wait blocks until every key before i is done.
func (t *kvTurns) wait(i int) {
	t.mu.Lock()
	for t.next < i {
		t.cond.Wait()
	}
	t.mu.Unlock()
}

// done ends key i's turn (a second call does nothing).
func (t *kvTurns) done(i int) {
	t.mu.Lock()
	if t.next == i {
		t.next++
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// kvGPU answers KV_PUT and KV_GET into the caller's GPU memory. With the
// host tier page-locked on the device's context (kvDev), the blocks move
// by the copy engine straight between their slots and the caller's
// allocation, several in flight on a few streams; a get lends each block
// (kvstore.Hold) until its copy is done. Where page-locking failed, the
// copies are pageable (cuMemcpy, synchronous), as stats and the log say.
func (c *clientServer) kvGPU(op uint16, r clientproto.KVBlocksRequest, p peer) reply {
	ns := p.uid
	kv := c.kv
	bs := kv.BlockSize()
	opening := time.Now()
	mem, d, reused, err := c.kvOpenGPU(r, uint64(bs), p.kvMaps)
	if err != nil {
		return refuse(err)
	}
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		mapping := "opened"
		if reused {
			mapping = "kept"
		}
		c.log.Debug("kv: GPU request", "op", op, "blocks", len(r.Keys), "mapping", mapping, "open", time.Since(opening))
	}
	host, streams := d.kv.pin(d, kv, c.log)
	ctx := context.Background()
	stream := func(i int) *cuda.Stream { return streams[i%len(streams)] }
	if op == clientproto.OpKVPut {
		return c.kvPut(ns, r.Keys, func(i int, dst []byte) error {
			if off, ok := kv.ArenaOffset(dst); ok && host != nil {
				t, err := stream(i).CopyDtoH(host, int(off), mem, int(r.Offsets[i]), bs)
				if err != nil {
					return err
				}
				return t.Wait(ctx)
			}
			_, err := mem.ReadAt(dst, int64(r.Offsets[i]))
			return err
		})
	}
	n := len(r.Keys)
	tiers := make([]byte, n)
	held := make([]kvHit, n)
	// Blocks in the page-locked host tier are copied after every key is
	// held, as runs: blocks adjacent both in the arena and in the
	// caller's allocation (a batch put together and got back together)
	// go in one copy.
	blocks := make([]kvCopy, n)
	start := time.Now()
	err = eachKey(n, func(i int) error {
		h := c.kvm.hold(kv, kvstore.Key{NS: ns, ID: r.Keys[i]})
		if h.tier == 0 {
			return nil
		}
		held[i] = h
		if off, ok := kv.ArenaOffset(h.b); ok && host != nil {
			blocks[i] = kvCopy{dst: int64(r.Offsets[i]), src: off, n: int64(bs)}
		} else if _, err := mem.WriteAt(h.b, int64(r.Offsets[i])); err != nil {
			return fmt.Errorf("writing block %d into the caller's GPU memory: %w", i, errnoOr(err, syscall.EIO))
		}
		tiers[i] = h.tier
		return nil
	})
	held1 := time.Now()
	var runs []kvCopy
	if err == nil {
		runs = kvRuns(blocks, kvRunMax)
	}
	copies := make([]*cuda.Transfer, 0, len(runs))
	for i, run := range runs {
		t, cerr := stream(i).CopyHtoD(mem, int(run.dst), host, int(run.src), int(run.n))
		if cerr != nil {
			err = fmt.Errorf("copying blocks into the caller's GPU memory at offset %d: %w", run.dst, errnoOr(cerr, syscall.EIO))
			break
		}
		copies = append(copies, t)
	}
	issued := time.Now()
	// Every copy issued is waited for before its blocks go back, also
	// after an error: a copy in flight still reads its slots.
	for _, t := range copies {
		if werr := t.Wait(ctx); werr != nil && err == nil {
			err = fmt.Errorf("copying blocks into the caller's GPU memory: %w", errnoOr(werr, syscall.EIO))
		}
	}
	for _, h := range held {
		h.release()
	}
	c.log.Debug("kv: get into GPU memory", "blocks", n, "copies", len(runs),
		"hold", held1.Sub(start), "issue", issued.Sub(held1), "wait", time.Since(issued))
	if err != nil {
		return refuse(err)
	}
	return reply{fields: clientproto.AppendKVTiers(nil, uint32(bs), tiers)}
}

// kvCopy is one host-to-device copy of a KV get: n bytes from offset src
// of the host tier's arena to offset dst of the caller's allocation; n
// is 0 for a block that is not copied this way.
type kvCopy struct{ dst, src, n int64 }

// kvRunMax bounds one copy of adjacent blocks: large enough that a copy's
// issue cost is small against its transfer (64 MiB: about 1.2 ms at
// 55 GB/s), small enough that the runs of a large get spread over the
// streams.
const kvRunMax = 64 << 20

// kvRuns merges the copies of c (in any order; those with n 0 are left
// out) that are adjacent both in the caller's allocation and in the
// arena into runs of at most max bytes, in the order of their
// destination.
func kvRuns(c []kvCopy, max int64) []kvCopy {
	var s []kvCopy
	for _, x := range c {
		if x.n > 0 {
			s = append(s, x)
		}
	}
	slices.SortFunc(s, func(a, b kvCopy) int { return cmp.Compare(a.dst, b.dst) })
	var out []kvCopy
	for _, x := range s {
		if k := len(out) - 1; k >= 0 && out[k].dst+out[k].n == x.dst && out[k].src+out[k].n == x.src && out[k].n+x.n <= max {
			out[k].n += x.n
			continue
		}
		out = append(out, x)
	}
	return out
}

// kvStreams is how many streams of a device carry KV copies: a 2 MiB
// block crosses PCIe in about 40 µs, so a few streams with several copies
// each keep the copy engines busy.
const kvStreams = 4

// kvDev is the KV store's host tier page-locked on one device's context
// (cuMemHostRegister of kvstore.Store.Arena, portable), made at the first
// GPU KV request there and given back with the context (fillService
// closeDev). Page-locking costs the whole budget in locked memory at once
// (the arena's pages are touched then), the price of copies at the copy
// engine's rate.
type kvDev struct {
	mu      sync.Mutex
	tried   bool
	kv      *kvstore.Store
	host    *cuda.HostMem
	streams []*cuda.Stream
}

// pin page-locks kv's arena on d's context at the first call; it returns
// nil when that failed (the copies are then pageable; the log and kylix
// kv stats say why) and the streams for the copies either way.
func (k *kvDev) pin(d *fillDev, kv *kvstore.Store, log *slog.Logger) (*cuda.HostMem, []*cuda.Stream) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tried {
		return k.host, k.streams
	}
	k.tried, k.kv = true, kv
	ctx := d.dev.Context()
	for range kvStreams {
		s, err := ctx.NewStream()
		if err != nil {
			break // fewer streams; pageable copies need none
		}
		k.streams = append(k.streams, s)
	}
	start := time.Now()
	host, err := ctx.RegisterHost(kv.Arena())
	if err == nil && len(k.streams) == 0 {
		err = errors.Join(errors.New("no CUDA stream could be made"), host.Free())
	}
	if err != nil {
		what := fmt.Sprintf("pageable: page-locking it for cuda:%d failed: %v", d.ord, err)
		kv.SetHostMemory(what)
		log.Warn("kv: the host tier stays pageable; its copies to and from this GPU are synchronous", "device", d.ord, "err", err)
		return nil, k.streams
	}
	k.host = host
	kv.SetHostMemory(fmt.Sprintf("pinned for cuda:%d", d.ord))
	log.Info("kv: host tier page-locked for the GPU", "device", d.ord, "bytes", len(kv.Arena()), "took", time.Since(start))
	return k.host, k.streams
}

// close gives the streams and the page-locking back (before the context).
func (k *kvDev) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs []error
	for _, s := range k.streams {
		errs = append(errs, s.Close())
	}
	if k.host != nil {
		errs = append(errs, k.host.Free())
		k.kv.SetHostMemory(kvstore.HostMemory)
	}
	k.tried, k.host, k.streams = false, nil, nil
	return errors.Join(errs...)
}

// kvOpenGPU finds the caller's CUDA allocation of a KV request among
// those its connection keeps mapped, or opens it (its IPC handle, on the
// device's context that FILL holds: fill.go; kv_ipc.go), and checks every
// block against the allocation's size as the driver reports it, never
// the caller's word, before any byte moves. reused says the connection
// had it mapped already.
func (c *clientServer) kvOpenGPU(r clientproto.KVBlocksRequest, bs uint64, maps *kvMaps) (mem *cuda.DeviceMem, d *fillDev, reused bool, err error) {
	if c.fill == nil || maps == nil {
		return nil, nil, false, fmt.Errorf("this node serves no GPU: %w", syscall.ENODEV)
	}
	km, reused, err := maps.get(int(r.Device), r.IPCHandle)
	if err != nil {
		return nil, nil, false, err
	}
	alloc := uint64(km.mem.Size())
	for i, off := range r.Offsets {
		if off > alloc || bs > alloc-off {
			return nil, nil, false, fmt.Errorf("block %d at offset %d (%d bytes) does not fit the allocation's %d bytes: %w", i, off, bs, alloc, syscall.EFAULT)
		}
	}
	return km.mem, km.d, reused, nil
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
