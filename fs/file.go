package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
)

// fileNode is a regular file. Its committed content is the store version
// id. The node stays small (a mount may know millions of files): everything
// about open handles and writes lives in st, allocated while the file is
// open or has a working copy.
type fileNode struct {
	gofs.Inode
	base

	mu sync.Mutex
	// inStore: the namespace has an entry for this node (false for a file
	// created here and not committed yet).
	inStore bool
	// notPT: the committed version is known to have no whole-file pack
	// (not passthrough-eligible), so opens skip the check.
	notPT bool
	mode  iofs.FileMode // permission and special bits (chunkstore.EntryModeMask)
	uid   uint32
	gid   uint32
	size  int64 // committed size
	mtime int64
	id    chunkstore.ID // committed version (zero until the first commit)
	st    *fileState
}

// fileState is a file's open and write state. While it is being written, a
// working copy (tmp) holds the newest bytes; after the last writer closed
// it, the copy waits for the committer (committing) until the new version
// is in the store.
type fileState struct {
	// wmu is held shared by writes into the working copy and exclusively
	// while the copy is handed to the committer. Lock order: wmu, then
	// fileNode.mu.
	wmu        sync.RWMutex
	tmp        *tempFile
	committing *tempFile
	commitErr  error // last commit failure, reported by fsync
	file       *chunkstore.File
	writers    int // open handles that may write
	ptOpen     int // open passthrough handles
	cachedOpen int // open handles served by the daemon
}

var (
	_ = (gofs.NodeOpener)((*fileNode)(nil))
	_ = (gofs.NodeGetattrer)((*fileNode)(nil))
	_ = (gofs.NodeSetattrer)((*fileNode)(nil))
	_ = (gofs.NodeGetxattrer)((*fileNode)(nil))
	_ = (gofs.NodeListxattrer)((*fileNode)(nil))
	_ = (gofs.NodeSetxattrer)((*fileNode)(nil))
	_ = (gofs.NodeRemovexattrer)((*fileNode)(nil))
	_ = (gofs.NodeIoctler)((*fileNode)(nil))
	_ = (gofs.NodeFsyncer)((*fileNode)(nil))
)

func newFileNode(f *FS, parent *dirNode, name string, e chunkstore.Entry, inStore bool) *fileNode {
	n := &fileNode{inStore: inStore, mode: e.Mode & chunkstore.EntryModeMask, uid: e.UID, gid: e.GID, size: e.Size, mtime: e.MTime, id: e.ID}
	n.place(f, parent, name)
	return n
}

// stateLocked returns the file's state, making it.
func (n *fileNode) stateLocked() *fileState {
	if n.st == nil {
		n.st = &fileState{}
	}
	return n.st
}

// idleLocked drops the state of a file nobody has open and that has
// nothing waiting to be committed.
func (n *fileNode) idleLocked() {
	st := n.st
	if st != nil && st.tmp == nil && st.committing == nil && st.commitErr == nil &&
		st.writers == 0 && st.ptOpen == 0 && st.cachedOpen == 0 {
		n.st = nil
	}
}

// lockW takes the state's wmu (shared or not), then mu, and returns the
// state; the caller unlocks both.
func (n *fileNode) lockW(shared bool) *fileState {
	for {
		n.mu.Lock()
		st := n.stateLocked()
		n.mu.Unlock()
		if shared {
			st.wmu.RLock()
		} else {
			st.wmu.Lock()
		}
		n.mu.Lock()
		if n.st == st {
			return st
		}
		n.mu.Unlock()
		if shared {
			st.wmu.RUnlock()
		} else {
			st.wmu.Unlock()
		}
	}
}

// pending reports whether the node has no store entry yet.
func (n *fileNode) pending() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.inStore
}

// hasLocalLocked: the node's newest bytes are not in the store yet.
func (n *fileNode) hasLocalLocked() bool {
	return n.st != nil && (n.st.tmp != nil || n.st.committing != nil)
}

// adopt takes e (the store's entry at the node's name) if it is the same
// version the node has, refreshing metadata; false means the name now
// stands for different content and needs a new node.
func (n *fileNode) adopt(e chunkstore.Entry) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hasLocalLocked() {
		return true // ours is newer; the committer will write it
	}
	if e.ID != n.id {
		return false
	}
	n.mode, n.mtime, n.size, n.inStore = e.Mode&chunkstore.EntryModeMask, e.MTime, e.Size, true
	n.uid, n.gid = e.UID, e.GID
	return true
}

// stale reports whether the kernel's view of this node is out of date
// with store entry se (nil: gone).
func (n *fileNode) stale(se *chunkstore.Entry) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hasLocalLocked() || !n.inStore {
		return false
	}
	return se == nil || se.Kind != chunkstore.KindFile || se.ID != n.id ||
		se.Mode&chunkstore.EntryModeMask != n.mode || se.MTime != n.mtime ||
		se.UID != n.uid || se.GID != n.gid
}

func (n *fileNode) newestLocked() *tempFile {
	if n.st == nil {
		return nil
	}
	if n.st.tmp != nil {
		return n.st.tmp
	}
	return n.st.committing
}

func (n *fileNode) sizeLocked() int64 {
	if t := n.newestLocked(); t != nil {
		return t.size()
	}
	return n.size
}

func (n *fileNode) attrLocked(out *fuse.Attr) {
	size := n.sizeLocked()
	out.Mode = syscall.S_IFREG | chunkstore.UnixMode(n.mode)
	out.Size = uint64(size)
	out.Blocks = uint64(size+511) / 512
	out.Blksize = DefaultMaxIO
	out.Nlink = 1
	if n.gone.Load() {
		out.Nlink = 0
	}
	setTimes(out, n.mtime)
	out.Uid, out.Gid = n.fsys.owner(n.uid, n.gid)
}

func (n *fileNode) fillEntry(out *fuse.EntryOut) {
	n.mu.Lock()
	n.attrLocked(&out.Attr)
	n.mu.Unlock()
	out.SetEntryTimeout(n.fsys.opts.FileTimeout)
	out.SetAttrTimeout(n.fsys.opts.FileTimeout)
}

func (n *fileNode) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	n.attrLocked(&out.Attr)
	n.mu.Unlock()
	out.SetTimeout(n.fsys.opts.FileTimeout)
	return 0
}

func (n *fileNode) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	size, hasSize := in.GetSize()
	if hasSize {
		st := n.lockW(true)
		err := n.truncateLocked(st, int64(size))
		noWriters := st.writers == 0
		n.mu.Unlock()
		st.wmu.RUnlock()
		if err != nil {
			return toErrno(err)
		}
		if noWriters {
			n.handoff() // truncate(2) without an open file: commit now
		}
	}
	n.mu.Lock()
	meta := setMeta(n.fsys, in, &n.mode, &n.uid, &n.gid, &n.mtime)
	if n.fsys.dropsSGID(ctx, in, n.mode, n.uid, n.gid) {
		n.mode &^= iofs.ModeSetgid
		meta = true
	}
	n.attrLocked(&out.Attr)
	n.mu.Unlock()
	out.SetTimeout(n.fsys.opts.FileTimeout)
	if meta {
		n.fsys.com.enqueue(n)
	}
	return 0
}

// ensureTmpLocked makes the working copy, copying the current content into
// it (copy-up). Callers hold mu and st.wmu (shared).
func (n *fileNode) ensureTmpLocked(st *fileState) error {
	if st.tmp != nil {
		return nil
	}
	if st.ptOpen > 0 {
		return syscall.ETXTBSY
	}
	tf, err := n.fsys.newTemp()
	if err != nil {
		return err
	}
	switch {
	case st.committing != nil:
		_, err = io.Copy(tf.f, io.NewSectionReader(st.committing.f, 0, st.committing.size()))
	case !n.id.IsZero():
		var sf *chunkstore.File
		if sf, err = n.storeFileLocked(); err == nil {
			_, err = sf.WriteTo(context.Background(), tf.f, nil)
		}
	}
	if err != nil {
		tf.release()
		return fmt.Errorf("fs: copy version %s for writing: %w", n.id.Short(), err)
	}
	st.tmp = tf
	n.fsys.markDirty(n, true)
	return nil
}

func (n *fileNode) truncateLocked(st *fileState, size int64) error {
	if st.tmp == nil && size == 0 && st.ptOpen == 0 {
		tf, err := n.fsys.newTemp()
		if err != nil {
			return err
		}
		st.tmp = tf
		n.fsys.markDirty(n, true)
	} else if err := n.ensureTmpLocked(st); err != nil {
		return err
	}
	if err := st.tmp.f.Truncate(size); err != nil {
		return fmt.Errorf("fs: truncate: %w", err)
	}
	n.mtime = time.Now().UnixNano()
	return nil
}

// storeFileLocked opens (once per open period) the committed version.
func (n *fileNode) storeFileLocked() (*chunkstore.File, error) {
	st := n.stateLocked()
	if st.file != nil && st.file.ID == n.id {
		return st.file, nil
	}
	f, err := n.fsys.s.OpenFile(n.id)
	if err != nil {
		return nil, err
	}
	st.file = f
	return f, nil
}

// handoff gives the working copy to the committer.
func (n *fileNode) handoff() {
	st := n.lockW(false)
	if st.tmp == nil {
		n.idleLocked()
		n.mu.Unlock()
		st.wmu.Unlock()
		return
	}
	if st.committing != nil {
		st.committing.release() // superseded before it was committed
	}
	st.committing, st.tmp = st.tmp, nil
	n.mu.Unlock()
	st.wmu.Unlock()
	n.fsys.com.enqueue(n)
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	if write {
		n.waitPassthroughClosed()
		st := n.lockW(true)
		defer st.wmu.RUnlock()
		defer n.mu.Unlock()
		if st.ptOpen > 0 {
			// The kernel cannot mix passthrough and cached opens of
			// one inode; the readers hold the committed version.
			return nil, 0, syscall.ETXTBSY
		}
		if flags&syscall.O_TRUNC != 0 {
			if err := n.truncateLocked(st, 0); err != nil {
				return nil, 0, toErrno(err)
			}
		}
		return n.openLocked(true), fuse.FOPEN_KEEP_CACHE, 0
	}
	// Read-only: the kernel may keep the cached pages (the content of an
	// inode only changes through the kernel), and close(2) need not ask
	// us anything (no FLUSH).
	const roFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
	if h := n.tryPassthrough(ctx); h != nil {
		return h, roFlags, 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	// The committed version is opened in the store at the first read:
	// reads the kernel answers from its cache never need it.
	return n.openLocked(false), roFlags, 0
}

// waitPassthroughClosed gives passthrough handles that were just closed
// time to be released: the kernel sends RELEASE after close(2) returns.
func (n *fileNode) waitPassthroughClosed() {
	for i := 0; i < 100; i++ {
		n.mu.Lock()
		busy := n.st != nil && n.st.ptOpen > 0
		n.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tryPassthrough opens the file for FUSE passthrough if a pack holds
// exactly its bytes and that pack passed its check (chunkstore
// OpenPassthrough: hashed whole at its first open after a boot or after it
// changed). The check runs without n.mu (it reads the whole pack), so the
// node's state is checked again after it.
func (n *fileNode) tryPassthrough(ctx context.Context) gofs.FileHandle {
	n.mu.Lock()
	st := n.stateLocked()
	if !n.fsys.passthrough || n.notPT || n.hasLocalLocked() || st.cachedOpen != 0 || n.id.IsZero() {
		n.mu.Unlock()
		return nil
	}
	sf, err := n.storeFileLocked()
	n.mu.Unlock()
	if err != nil {
		return nil
	}
	pf, err := n.fsys.s.OpenPassthrough(ctx, sf)
	if err != nil {
		if errors.Is(err, chunkstore.ErrNotWholeFile) {
			n.mu.Lock()
			if n.id == sf.ID {
				n.notPT = true
			}
			n.mu.Unlock()
		}
		n.fsys.stats.ptRefused.Add(1)
		return nil
	}
	defer pf.Close()
	n.mu.Lock()
	defer n.mu.Unlock()
	st = n.stateLocked()
	if n.id != sf.ID || n.hasLocalLocked() || st.cachedOpen != 0 {
		return nil
	}
	// The handle keeps its own descriptor of the checked pack file (the
	// *os.File would close it when collected).
	fd, err := unix.FcntlInt(pf.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	st.ptOpen++
	n.fsys.stats.ptOpens.Add(1)
	return &ptHandle{n: n, fd: fd}
}

func (n *fileNode) openLocked(write bool) *handle {
	st := n.stateLocked()
	if write {
		st.writers++
	}
	st.cachedOpen++
	n.fsys.stats.daemonOpens.Add(1)
	return &handle{n: n, write: write}
}

// source returns what a read at this moment reads: the newest working copy
// (with a reference the caller releases) or the committed version.
func (n *fileNode) source() (*tempFile, *chunkstore.File, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.newestLocked(); t != nil {
		t.ref()
		return t, nil, nil
	}
	if n.id.IsZero() {
		return nil, nil, nil
	}
	f, err := n.storeFileLocked()
	if err != nil {
		return nil, nil, err
	}
	return nil, f, nil
}

// PrefetchBytes is how far past a sequential read the node reads ahead
// (chunkstore.File.Prefetch, into the store's chunk cache).
const PrefetchBytes = 8 << 20

// readAt reads the node's current bytes. Committed bytes come through the
// store's chunk-access seam (one verified cache, single flight); a corrupt
// or missing chunk fails once, as EIO, naming the file (docs/design/access.md).
func (n *fileNode) readAt(ctx context.Context, p []byte, off int64, seq bool) (int, error) {
	n.fsys.stats.reads.Add(1)
	n.fsys.stats.readBytes.Add(int64(len(p)))
	tf, sf, err := n.source()
	if err != nil {
		return 0, err
	}
	switch {
	case tf != nil:
		defer tf.release()
		m, err := tf.f.ReadAt(p, off)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return m, err
	case sf != nil:
		if seq {
			// Started first so that it overlaps this read.
			sf.Prefetch(off+int64(len(p)), PrefetchBytes)
		}
		m, err := sf.ReadAtContext(ctx, p, off)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		if err != nil {
			n.fsys.nsMu.RLock()
			path, ok := n.path()
			n.fsys.nsMu.RUnlock()
			if ok {
				err = chunkstore.WithPath(err, "/"+path)
			}
		}
		return m, err
	}
	return 0, nil
}

func (n *fileNode) release(h *handle) {
	n.mu.Lock()
	st := n.st
	if h.write {
		st.writers--
	}
	st.cachedOpen--
	last := st.writers == 0 && st.tmp != nil
	if st.cachedOpen == 0 && st.ptOpen == 0 {
		st.file = nil
	}
	if !last {
		n.idleLocked()
	}
	n.mu.Unlock()
	if last {
		n.handoff()
	}
}

func (n *fileNode) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	n.handoff()
	if err := n.fsys.Sync(); err != nil {
		return toErrno(err)
	}
	n.mu.Lock()
	var err error
	if n.st != nil {
		err = n.st.commitErr
	}
	n.mu.Unlock()
	if err != nil {
		n.fsys.log.Error("fsync: commit failed", "err", err)
		return syscall.EIO
	}
	return 0
}

// handle is an open file served by the daemon.
type handle struct {
	n     *fileNode
	write bool
	next  atomic.Int64 // where the last read ended
}

var (
	_ = (gofs.FileReader)((*handle)(nil))
	_ = (gofs.FileWriter)((*handle)(nil))
	_ = (gofs.FileFlusher)((*handle)(nil))
	_ = (gofs.FileReleaser)((*handle)(nil))
	_ = (gofs.FileFsyncer)((*handle)(nil))
	_ = (gofs.FileAllocater)((*handle)(nil))
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	// Sequential: near where the last read ended (the kernel's readahead
	// requests arrive concurrently, a little out of order).
	next := h.next.Load()
	seq := off >= next-PrefetchBytes && off <= next+DefaultMaxIO
	h.next.Store(off + int64(len(dest)))
	m, err := h.n.readAt(ctx, dest, off, seq)
	if err != nil {
		logReadError(h.n.fsys.log, h.n.id, off, err)
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.write {
		return 0, syscall.EBADF
	}
	n := h.n
	st := n.lockW(true)
	defer st.wmu.RUnlock()
	if err := n.ensureTmpLocked(st); err != nil {
		n.mu.Unlock()
		return 0, toErrno(err)
	}
	tf := st.tmp
	n.mtime = time.Now().UnixNano()
	n.mu.Unlock()
	m, err := tf.f.WriteAt(data, off)
	if err != nil {
		return uint32(m), toErrno(err)
	}
	return uint32(m), 0
}

func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if !h.write {
		return syscall.EBADF
	}
	n := h.n
	st := n.lockW(true)
	defer st.wmu.RUnlock()
	defer n.mu.Unlock()
	if err := n.ensureTmpLocked(st); err != nil {
		return toErrno(err)
	}
	return toErrno(unix.Fallocate(int(st.tmp.f.Fd()), mode, int64(off), int64(size)))
}

// Flush runs at every close(2): the last writer's close hands the working
// copy to the committer, so the next open (here or, once committed,
// anywhere) sees the new version.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	if !h.write {
		return 0
	}
	n := h.n
	n.mu.Lock()
	last := n.st != nil && n.st.writers == 1 && n.st.tmp != nil
	n.mu.Unlock()
	if last {
		n.handoff()
	}
	return 0
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.n.release(h)
	return 0
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.n.Fsync(ctx, h, flags)
}

// ptHandle is an open file served by FUSE passthrough from its pack.
type ptHandle struct {
	n    *fileNode
	fd   int
	once sync.Once
}

var (
	_ = (gofs.FilePassthroughFder)((*ptHandle)(nil))
	_ = (gofs.FileReader)((*ptHandle)(nil))
	_ = (gofs.FileReleaser)((*ptHandle)(nil))
)

func (h *ptHandle) PassthroughFd() (int, bool) { return h.fd, true }

// Read serves reads the kernel still sends (it should not while
// passthrough is on), clipped to the file's size.
func (h *ptHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	m, err := h.n.readAt(ctx, dest, off, false)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (h *ptHandle) Release(ctx context.Context) syscall.Errno {
	h.once.Do(func() {
		unix.Close(h.fd)
		n := h.n
		n.mu.Lock()
		n.st.ptOpen--
		if n.st.cachedOpen == 0 && n.st.ptOpen == 0 {
			n.st.file = nil
		}
		n.idleLocked()
		n.mu.Unlock()
	})
	return 0
}

// tempFile is a working copy: an unlinked file under TempDir, shared by
// the writers and readers of one node and by the committer, freed when the
// last of them lets go.
type tempFile struct {
	f    *os.File
	refs atomic.Int32
}

func (f *FS) newTemp() (*tempFile, error) {
	file, err := os.CreateTemp(f.opts.TempDir, "w-*")
	if err != nil {
		return nil, fmt.Errorf("fs: working copy: %w", err)
	}
	os.Remove(file.Name())
	t := &tempFile{f: file}
	t.refs.Store(1)
	return t, nil
}

func (t *tempFile) ref() { t.refs.Add(1) }

func (t *tempFile) release() {
	if t.refs.Add(-1) == 0 {
		t.f.Close()
	}
}

func (t *tempFile) size() int64 {
	st, err := t.f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}
