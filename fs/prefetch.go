package fs

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"sync"

	"github.com/kylix/kylix/chunkstore"
)

// Directory prefetch on a read-only mount (docs/design/fs.md, "The first
// pass after a node start"). After a node start the kernel's page cache of
// the mount is empty, and a program that walks a directory of small files
// waits, file after file, for one READ round trip with a pack read, a hash
// and a copy behind it (docs/bench.md, "Where the first pass after a node
// start goes"). So the first read of a file at offset 0 in a directory
// starts, once per directory and node run, a background pass that reads
// the directory's other small files (verified, as every read is) and
// stores their bytes in the kernel's page cache (FUSE_NOTIFY_STORE); the
// reader's next files then open and read without a round trip.
//
// Only on read-only mounts: there a file node's committed version never
// changes (a changed file is a new node with a new kernel inode: adopt,
// Reconcile), the kernel keeps a no-open file's pages (FOPEN_KEEP_CACHE
// is its default), and go-fuse never reuses a node ID, so bytes stored for
// an inode are that inode's bytes for as long as the kernel has it.
// Files in a link set are skipped (their node's version follows the
// set's), and so are files with a chunk not stored here: a pass never
// fetches from peers.

const (
	// PrefetchMaxFile: larger files are left to the kernel's readahead.
	PrefetchMaxFile = 1 << 20
	// PrefetchDirBudget bounds the bytes one directory's pass stores.
	PrefetchDirBudget = 64 << 20
	// A pass opens its files' versions in batches of prefetchFirstBatch,
	// doubling up to prefetchMaxBatch.
	prefetchFirstBatch = 8
	prefetchMaxBatch   = 64
)

// prefetcher runs the directory passes of one file system.
type prefetcher struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{} // files being read, all passes together
	mu     sync.Mutex
	idle   *sync.Cond // running fell to 0
	// running counts the passes under way; done: the file system is
	// stopping and starts no more.
	running int
	done    bool
}

func (p *prefetcher) init() {
	p.once.Do(func() {
		p.ctx, p.cancel = context.WithCancel(context.Background())
		p.sem = make(chan struct{}, min(8, max(2, runtime.GOMAXPROCS(0)/2)))
		p.idle = sync.NewCond(&p.mu)
	})
}

// start runs fn in the background unless the file system is stopping.
func (p *prefetcher) start(fn func(ctx context.Context)) {
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.running++
	go func() {
		fn(p.ctx)
		p.mu.Lock()
		if p.running--; p.running == 0 {
			p.idle.Broadcast()
		}
		p.mu.Unlock()
	}()
}

// wait returns once no pass is under way.
func (p *prefetcher) wait() {
	p.init()
	p.mu.Lock()
	for p.running > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
}

// stop ends the passes under way and waits for them (before unmounting).
func (p *prefetcher) stop() {
	p.init()
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.cancel()
	p.wait()
}

// prefetchSiblings starts the pass of n's directory, the first time one of
// its files is read there in this node run.
func (n *fileNode) prefetchSiblings() {
	f := n.fsys
	if !f.opts.ReadOnly {
		return
	}
	f.nsMu.RLock()
	d, name := n.parent, n.name
	f.nsMu.RUnlock()
	if d == nil || !d.prefetched.CompareAndSwap(false, true) {
		return
	}
	f.pf.start(func(ctx context.Context) { f.prefetchDir(ctx, d, name) })
}

// prefetchDir stores the bytes of d's small files in the kernel's page
// cache, the names after first (the one being read) first, in name order.
func (f *FS) prefetchDir(ctx context.Context, d *dirNode, first string) {
	type item struct {
		name string
		n    *fileNode
	}
	var items []item
	f.nsMu.RLock()
	for name, ch := range d.Children() {
		if c, ok := ch.Operations().(*fileNode); ok && c.parent == d && name != first {
			items = append(items, item{name, c})
		}
	}
	f.nsMu.RUnlock()
	slices.SortFunc(items, func(a, b item) int {
		if (a.name > first) != (b.name > first) {
			if a.name > first {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.name, b.name)
	})
	type open struct {
		n    *fileNode
		id   chunkstore.ID
		size int64
	}
	var todo []open
	budget := int64(PrefetchDirBudget)
	for _, it := range items {
		id, size, ok := it.n.prefetchable()
		if !ok || size > budget {
			continue
		}
		budget -= size
		todo = append(todo, open{it.n, id, size})
	}
	// The versions are opened a batch at a time, in one index transaction
	// each (Store.OpenFiles); the first batches are small, so that the
	// first stores are not held up behind many opens.
	var wg sync.WaitGroup
	defer wg.Wait()
	for batch := prefetchFirstBatch; len(todo) > 0; batch = min(2*batch, prefetchMaxBatch) {
		b := todo[:min(batch, len(todo))]
		todo = todo[len(b):]
		ids := make([]chunkstore.ID, len(b))
		for i, o := range b {
			ids[i] = o.id
		}
		files, errs := f.s.OpenFiles(ids)
		for i, o := range b {
			if errs[i] != nil {
				continue // the reader's own READ meets it and reports it
			}
			select {
			case f.pf.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-f.pf.sem; wg.Done() }()
				f.prefetchFile(ctx, o.n, files[i], o.id, o.size)
			}()
		}
	}
}

// prefetchable returns the committed version and size of a file whose
// bytes a directory pass may store.
func (n *fileNode) prefetchable() (chunkstore.ID, int64, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// A file the node has read (st.file) is in the kernel's cache already,
	// or being read into it.
	ok := n.inStore && !n.id.IsZero() && n.size > 0 && n.size <= PrefetchMaxFile &&
		n.link.Load() == 0 && !n.hasLocalLocked() && (n.state() == nil || n.state().file == nil)
	// A node the kernel has forgotten gets ENOENT from the store, and its
	// node ID is never given to another (go-fuse counts them up).
	return n.id, n.size, ok
}

// prefetchFile reads version id of n, opened as sf (every chunk
// verified), and stores it in the kernel's page cache for n's inode. A
// failure stores nothing: the reader's own READ then meets it and reports
// it (EIO, logged).
func (f *FS) prefetchFile(ctx context.Context, n *fileNode, sf *chunkstore.File, id chunkstore.ID, size int64) {
	if sf.Size() != size || !sf.Local() {
		return // a chunk on a peer is fetched when a reader asks for it
	}
	if cur, _, ok := n.prefetchable(); !ok || cur != id {
		return // read by the node since the pass opened it, or replaced
	}
	// One chunk (most small files): the verified chunk itself, no copy.
	buf, one, err := sf.ReadSlice(ctx, 0, int(size))
	if !one {
		buf = make([]byte, size)
		var m int
		m, err = sf.ReadAtContext(ctx, buf, 0)
		buf = buf[:m]
	}
	if err != nil || int64(len(buf)) != size {
		return
	}
	if cur, _, ok := n.prefetchable(); !ok || cur != id {
		return
	}
	if n.WriteCache(0, buf) == 0 {
		f.stats.prefetched.Add(1)
		f.stats.prefetchedBytes.Add(size)
	}
}
