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
// id. The node stays small (a mount may know millions of files: 256 bytes,
// a size class, with go-fuse's Inode of 128; TestFileNodeSize): what only
// some files have lives in x, allocated when needed (fileExtra).
type fileNode struct {
	gofs.Inode
	base

	mu sync.Mutex
	// inStore: the namespace has an entry for this node (false for a file
	// created here and not committed yet).
	inStore bool
	// notPT: the committed version is known to have no whole-file pack
	// (not passthrough-eligible), so opens skip the check (until
	// FS.PassthroughChanged: a whole copy was made).
	notPT bool
	// ctimeM: the change time is mtime (a write sets both), so that a
	// file written here needs no x for it (setTimesLocked).
	ctimeM bool
	mode   iofs.FileMode // permission and special bits (chunkstore.EntryModeMask)
	uid    uint32
	gid    uint32
	size   int64 // committed size
	mtime  int64
	id     chunkstore.ID // committed version (zero until the first commit)
	// x: nil for a file the kernel merely knows (trimLocked).
	x *fileExtra
}

// fileExtra is what only some files have: a change time that is not the
// mtime (a rename, chmod or link here or in the store), an access time,
// metadata changed here, open and write state.
type fileExtra struct {
	ctime int64 // 0: none recorded (stat shows mtime), unless fileNode.ctimeM
	atime int64 // 0: none recorded (stat shows mtime)
	// metaSeq counts changes of mode, owner and times made here;
	// metaDone is the last one the committer wrote. While they differ
	// the node's metadata is newer than the store's, and a lookup that
	// reads the store's entry must not take it back. Once metaSeq is
	// not 0 the node keeps x, so the count never starts again under a
	// commit in flight.
	metaSeq, metaDone uint64
	// st: allocated while the file is open or has a working copy.
	st *fileState
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
	// flushed: how many writing handles were flushed (their close(2))
	// since they last wrote, RELEASE on its way (closer.go).
	flushed int
	// commitErr is the last failure to commit or write the file that no
	// fsync or close has reported yet; the next one reports it.
	commitErr  error
	file       *chunkstore.File
	writers    int // open handles that may write
	ptOpen     int // open passthrough handles
	cachedOpen int // open handles served by the daemon
	// whandles are the open handles that may write: a failure marks them
	// (handle.failed) so none of them can build a version on top of the
	// bytes that were lost.
	whandles map[*handle]struct{}
	// lost: the newest bytes were discarded after a failure and the file
	// has no committed version, so its name goes once no writer has it
	// open. inval: the kernel may cache bytes that are no longer the
	// file's; both are settled by finishFailure.
	lost, inval bool
	// cmtime is the committed version's mtime while a working copy or a
	// commit is in flight (0: none), restored when they are discarded.
	cmtime int64
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
	_ = (gofs.NodeStatfser)((*fileNode)(nil))
)

func newFileNode(f *FS, parent *dirNode, name string, e chunkstore.Entry, inStore bool) *fileNode {
	n := &fileNode{inStore: inStore, mode: e.Mode & chunkstore.EntryModeMask, uid: e.UID, gid: e.GID, size: e.Size, id: e.ID}
	n.setTimesLocked(e.MTime, e.CTime, e.ATime)
	n.place(f, parent, name)
	n.setLinks(e)
	return n
}

// state returns the file's open and write state, nil when it has none.
// Callers hold mu.
func (n *fileNode) state() *fileState {
	if n.x == nil {
		return nil
	}
	return n.x.st
}

// extraLocked returns x, making it.
func (n *fileNode) extraLocked() *fileExtra {
	if n.x == nil {
		n.x = &fileExtra{}
	}
	return n.x
}

// stateLocked returns the file's state, making it.
func (n *fileNode) stateLocked() *fileState {
	x := n.extraLocked()
	if x.st == nil {
		x.st = &fileState{}
	}
	return x.st
}

// idleLocked drops the state of a file nobody has open and that has
// nothing waiting to be committed.
func (n *fileNode) idleLocked() {
	st := n.state()
	if st != nil && st.tmp == nil && st.committing == nil && st.commitErr == nil &&
		!st.lost && !st.inval && st.writers == 0 && st.ptOpen == 0 && st.cachedOpen == 0 {
		n.x.st = nil
	}
	n.trimLocked()
}

// trimLocked drops x when it holds nothing: no state, times or metadata
// changes of its own.
func (n *fileNode) trimLocked() {
	if x := n.x; x != nil && x.st == nil && x.ctime == 0 && x.atime == 0 && x.metaSeq == 0 {
		n.x = nil
	}
}

// ctimeLocked is the change time (0: none recorded).
func (n *fileNode) ctimeLocked() int64 {
	if n.ctimeM {
		return n.mtime
	}
	if n.x != nil {
		return n.x.ctime
	}
	return 0
}

// atimeLocked is the access time (0: none recorded).
func (n *fileNode) atimeLocked() int64 {
	if n.x != nil {
		return n.x.atime
	}
	return 0
}

// setTimesLocked sets the modification, change and access times; every
// change of them goes through here, so a change time equal to the mtime
// is kept as ctimeM and the others in x.
func (n *fileNode) setTimesLocked(m, c, a int64) {
	n.mtime = m
	if n.ctimeM = c == m; n.ctimeM {
		c = 0
	}
	if c != 0 || a != 0 {
		x := n.extraLocked()
		x.ctime, x.atime = c, a
	} else if n.x != nil {
		n.x.ctime, n.x.atime = 0, 0
		n.trimLocked()
	}
}

// metaPendingLocked: a change of metadata made here is not in the store
// yet.
func (n *fileNode) metaPendingLocked() bool {
	return n.x != nil && n.x.metaSeq != n.x.metaDone
}

// metaSeqLocked is the count of metadata changes made here.
func (n *fileNode) metaSeqLocked() uint64 {
	if n.x == nil {
		return 0
	}
	return n.x.metaSeq
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
		if n.state() == st {
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
	st := n.state()
	return st != nil && (st.tmp != nil || st.committing != nil)
}

// adopt takes e (the store's entry at the node's name) if it is the same
// version the node has, refreshing metadata; false means the name now
// stands for different content and needs a new node.
func (n *fileNode) adopt(e chunkstore.Entry) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.Link != n.link.Load() {
		return false // another inode
	}
	n.nlink.Store(e.Nlink)
	if n.hasLocalLocked() {
		return true // ours is newer; the committer will write it
	}
	if e.ID != n.id {
		return false
	}
	if n.metaPendingLocked() {
		n.inStore = true
		return true // a chmod, chown or utimes here waits for the committer
	}
	n.mode, n.size, n.inStore = e.Mode&chunkstore.EntryModeMask, e.Size, true
	n.setTimesLocked(e.MTime, e.CTime, e.ATime)
	n.uid, n.gid = e.UID, e.GID
	return true
}

// stale reports whether the kernel's view of this node is out of date
// with store entry se (nil: gone).
func (n *fileNode) stale(se *chunkstore.Entry) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hasLocalLocked() || !n.inStore || n.metaPendingLocked() {
		return false
	}
	return se == nil || se.Kind != chunkstore.KindFile || se.ID != n.id || se.Link != n.link.Load() || se.Nlink != n.nlink.Load() ||
		se.Mode&chunkstore.EntryModeMask != n.mode || se.MTime != n.mtime ||
		se.UID != n.uid || se.GID != n.gid
}

func (n *fileNode) newestLocked() *tempFile {
	st := n.state()
	if st == nil {
		return nil
	}
	if st.tmp != nil {
		return st.tmp
	}
	return st.committing
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
	out.Nlink = n.nlinks()
	setTimes(out, n.mtime, n.ctimeLocked(), n.atimeLocked())
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
		var err error
		if h, ok := fh.(*handle); ok && h.failed != nil {
			err = h.failed // ftruncate on a handle whose version was lost
		} else {
			err = n.resizeLocked(st, int64(size), privileged(ctx))
		}
		noWriters := st.writers == 0
		n.mu.Unlock()
		st.wmu.RUnlock()
		if err != nil {
			if _, ok := fh.(*handle); ok {
				return failErrno(err)
			}
			return toErrno(err)
		}
		if noWriters {
			n.handoff() // truncate(2) without an open file: commit now
		}
	}
	n.mu.Lock()
	mt, ct, at := n.mtime, n.ctimeLocked(), n.atimeLocked()
	meta := setMeta(n.fsys, in, &n.mode, &n.uid, &n.gid, &mt, &ct, &at)
	n.setTimesLocked(mt, ct, at)
	if n.fsys.dropsSGID(ctx, in, n.mode, n.uid, n.gid) {
		n.mode &^= iofs.ModeSetgid
		meta = true
	}
	if meta {
		n.extraLocked().metaSeq++
	}
	n.attrLocked(&out.Attr)
	n.mu.Unlock()
	// go-fuse fills the inode number into GETATTR replies, not SETATTR
	// ones, and the kernel takes i_ino from every attribute reply: without
	// this a chmod made the file's st_ino 0.
	out.Ino = n.StableAttr().Ino
	out.SetTimeout(n.fsys.opts.FileTimeout)
	if meta {
		n.fsys.com.enqueue(n)
	}
	return 0
}

// ensureTmpLocked makes the working copy, copying the current content into
// it (copy-up), which needs the space of the copy and of its commit.
// Callers hold mu and st.wmu (shared).
func (n *fileNode) ensureTmpLocked(st *fileState, priv bool) error {
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
	var size int64
	switch {
	case st.committing != nil:
		size = st.committing.size()
	case !n.id.IsZero():
		size = n.size
	}
	if err := n.fsys.space.admit(tf, size, priv); err != nil {
		tf.release()
		return fmt.Errorf("copy %s for writing: %w", n.name, err)
	}
	switch {
	case st.committing != nil:
		_, err = io.Copy(tf.f, io.NewSectionReader(st.committing.f, 0, size))
	case !n.id.IsZero():
		var sf *chunkstore.File
		if sf, err = n.storeFileLocked(); err == nil {
			_, err = sf.WriteTo(context.Background(), tf.f, nil)
		}
	}
	n.fsys.space.done(tf, size)
	if err != nil {
		tf.release()
		return fmt.Errorf("copy version %s for writing: %w", n.id.Short(), err)
	}
	n.newTmpLocked(st, tf)
	return nil
}

// newTmpLocked installs a new working copy.
func (n *fileNode) newTmpLocked(st *fileState, tf *tempFile) {
	if st.committing == nil && st.cmtime == 0 {
		st.cmtime = n.mtime
	}
	st.tmp = tf
	n.fsys.markDirty(n, true)
}

// truncateLocked truncates for an open with O_TRUNC.
func (n *fileNode) truncateLocked(st *fileState, size int64) error {
	return n.resizeLocked(st, size, false)
}

// resizeLocked sets the working copy's size. Growing it is sparse and
// takes no space, so only a copy-up is admitted against the free space.
func (n *fileNode) resizeLocked(st *fileState, size int64, priv bool) error {
	if st.tmp == nil && size == 0 && st.ptOpen == 0 {
		tf, err := n.fsys.newTemp()
		if err != nil {
			return err
		}
		n.newTmpLocked(st, tf)
	} else if err := n.ensureTmpLocked(st, priv); err != nil {
		return err
	}
	if err := st.tmp.f.Truncate(size); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	n.fsys.space.done(st.tmp, 0)
	now := time.Now().UnixNano()
	n.setTimesLocked(now, now, n.atimeLocked())
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
	n.fsys.s.NoteRead(n.id) // serve --cold-after counts from here (chunkstore/lastread.go)
	st.file = f
	return f, nil
}

// handoff gives the working copy to the committer and returns the
// committer's ticket for it (0: there was nothing to commit).
func (n *fileNode) handoff() uint64 {
	st := n.lockW(false)
	if st.tmp == nil {
		n.idleLocked()
		n.mu.Unlock()
		st.wmu.Unlock()
		return 0
	}
	if st.committing != nil {
		st.committing.release() // superseded before it was committed
	}
	st.committing, st.tmp = st.tmp, nil
	n.mu.Unlock()
	st.wmu.Unlock()
	return n.fsys.com.enqueue(n)
}

// discardLocked drops the file's working copy after a write into it or
// its commit failed with err: the file is back at its committed version
// (one that never had one loses its name once its writers closed it), the
// copy's space is freed now, and every handle open for writing gets err
// at its next write, fsync or close, so no later write can turn part of
// the lost bytes into a version. Callers hold mu.
func (n *fileNode) discardLocked(st *fileState, err error) {
	if st.tmp != nil {
		st.tmp.release()
		st.tmp = nil
	}
	for h := range st.whandles {
		if h.failed == nil {
			h.failed = err
		}
	}
	if st.commitErr == nil {
		st.commitErr = err
	}
	if !n.inStore && st.committing == nil {
		st.lost = true
	}
	st.inval = true
	if st.committing == nil {
		n.fsys.markDirty(n, false)
		if st.cmtime != 0 {
			n.setTimesLocked(st.cmtime, n.ctimeLocked(), n.atimeLocked())
			st.cmtime = 0
		}
	}
}

// finishFailure settles a failure once the kernel can take it: it drops
// the kernel's cached pages and attributes of the file (they may hold the
// lost bytes: readers must see the committed version, not phantom bytes)
// and, when no writer other than the caller's own mine handles has the
// file open, removes the name of a file whose only version was lost. It
// runs without locks held: the kernel locks pages and the parent
// directory to do this, and a write request holds its pages locked until
// its reply, so it never runs inside a write.
//
// The committer calls it with idle set: it then does nothing while a
// writer has the file open, because a writer's write request holds pages
// locked while it waits for the committer to make room (waitForRoom); the
// writers' close settles it instead.
func (n *fileNode) finishFailure(mine int, idle bool) {
	f := n.fsys
	f.nsMu.Lock()
	n.mu.Lock()
	st := n.state()
	if st == nil || (!st.lost && !st.inval) || (idle && st.writers > 0) {
		n.mu.Unlock()
		f.nsMu.Unlock()
		return
	}
	inval := st.inval
	st.inval = false
	var parent *gofs.Inode
	var name string
	if st.lost && st.writers <= mine {
		st.lost = false
		if !n.inStore && n.newestLocked() == nil && n.parent != nil && !n.gone.Load() {
			parent, name = n.parent.EmbeddedInode(), n.name
			orphan(n.EmbeddedInode())
		}
	}
	n.idleLocked()
	n.mu.Unlock()
	f.nsMu.Unlock()
	if inval {
		n.NotifyContent(0, 0)
	}
	if parent != nil {
		parent.NotifyEntry(name)
		parent.NotifyContent(0, 0) // its cached listing (dir.go, OpendirHandle)
	}
}

// takeErr returns the failure to report to a close or fsync through h
// (nil: not a handle of ours): h's own, or the file's unreported one,
// which is then reported.
func (n *fileNode) takeErr(h *handle) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	if h != nil {
		err = h.failed
	}
	if st := n.state(); st != nil && st.commitErr != nil {
		if err == nil {
			err = st.commitErr
		}
		st.commitErr = nil
		n.idleLocked()
	}
	return err
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
		h := n.openLocked(true)
		h.read = flags&syscall.O_ACCMODE != syscall.O_WRONLY
		return h, fuse.FOPEN_KEEP_CACHE, 0
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
	h := n.openLocked(false)
	h.read = true
	return h, roFlags, 0
}

// waitPassthroughClosed gives passthrough handles that were just closed
// time to be released: the kernel sends RELEASE after close(2) returns.
func (n *fileNode) waitPassthroughClosed() {
	for i := 0; i < 100; i++ {
		n.mu.Lock()
		st := n.state()
		busy := st != nil && st.ptOpen > 0
		n.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tryPassthrough opens the file for FUSE passthrough if a pack holds
// exactly its bytes and that pack passed its check (chunkstore
// TryOpenPassthrough: a large pack not checked since the boot or since it
// changed is checked in the background while this open is served by the
// node; a small one is hashed inline). The store is asked without n.mu,
// so the node's state is checked again after it.
func (n *fileNode) tryPassthrough(ctx context.Context) gofs.FileHandle {
	n.mu.Lock()
	st := n.stateLocked()
	if !n.fsys.passthrough || n.notPT || n.hasLocalLocked() || st.cachedOpen != 0 || n.id.IsZero() {
		id, size, served := n.id, n.size, n.notPT && n.fsys.passthrough && !n.hasLocalLocked()
		n.mu.Unlock()
		if served && n.fsys.opts.OpenedForRead != nil {
			n.fsys.opts.OpenedForRead(id, size, false)
		}
		return nil
	}
	sf, err := n.storeFileLocked()
	n.mu.Unlock()
	if err != nil {
		return nil
	}
	pf, err := n.fsys.s.TryOpenPassthrough(ctx, sf, n.fsys.backgroundCheckRate())
	if errors.Is(err, chunkstore.ErrPackUnchecked) {
		// Not waited for: this open is served by the node (every chunk
		// hashed, its reads also count as the pack's check) while the
		// pack is checked in the background; later opens get passthrough
		// once it passed (ptstate.go).
		return nil
	}
	if err != nil {
		if errors.Is(err, chunkstore.ErrNotWholeFile) {
			n.mu.Lock()
			if n.id == sf.ID {
				n.notPT = true
			}
			n.mu.Unlock()
			if n.fsys.opts.OpenedForRead != nil {
				n.fsys.opts.OpenedForRead(sf.ID, sf.Size(), false)
			}
		}
		n.fsys.stats.ptRefused.Add(1)
		return nil
	}
	defer pf.Close()
	h := n.ptHandle(sf, pf)
	if h != nil && n.fsys.opts.OpenedForRead != nil {
		n.fsys.opts.OpenedForRead(sf.ID, sf.Size(), true)
	}
	return h
}

// ptHandle makes the passthrough handle of sf's checked pack pf, unless
// the node changed meanwhile (nil).
func (n *fileNode) ptHandle(sf *chunkstore.File, pf *os.File) gofs.FileHandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.stateLocked()
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
	n.fsys.stats.ptOpenBytes.Add(sf.Size())
	n.fsys.stats.openFiles.Add(1)
	return &ptHandle{n: n, fd: fd}
}

func (n *fileNode) openLocked(write bool) *handle {
	st := n.stateLocked()
	h := &handle{n: n, write: write}
	if write {
		st.writers++
		if st.whandles == nil {
			st.whandles = map[*handle]struct{}{}
		}
		st.whandles[h] = struct{}{}
	}
	st.cachedOpen++
	n.fsys.stats.daemonOpens.Add(1)
	n.fsys.stats.openFiles.Add(1)
	return h
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

// readAt reads the node's current bytes at off, up to len(p), and returns
// them: in p, or (a read inside one chunk of the committed version) a
// slice of the store's cached chunk, which saves a copy per read; callers
// only pass the result to the kernel. Committed bytes come through the
// store's chunk-access seam (one verified cache, single flight); a corrupt
// or missing chunk fails once, as EIO, naming the file (docs/design/access.md).
func (n *fileNode) readAt(ctx context.Context, p []byte, off int64, seq bool) ([]byte, error) {
	n.fsys.stats.reads.Add(1)
	b, err := n.readSource(ctx, p, off, seq)
	n.fsys.stats.readBytes.Add(int64(len(b)))
	return b, err
}

func (n *fileNode) readSource(ctx context.Context, p []byte, off int64, seq bool) ([]byte, error) {
	tf, sf, err := n.source()
	if err != nil {
		return nil, err
	}
	switch {
	case tf != nil:
		defer tf.release()
		m, err := tf.f.ReadAt(p, off)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return p[:m], err
	case sf != nil:
		if seq {
			// Started first so that it overlaps this read.
			sf.Prefetch(off+int64(len(p)), PrefetchBytes)
		}
		b, one, err := sf.ReadSlice(ctx, off, len(p))
		if !one {
			var m int
			m, err = sf.ReadAtContext(ctx, p, off)
			if errors.Is(err, io.EOF) {
				err = nil
			}
			b = p[:m]
		}
		if err != nil {
			n.fsys.nsMu.RLock()
			path, ok := n.path()
			n.fsys.nsMu.RUnlock()
			if ok {
				err = chunkstore.WithPath(err, "/"+path)
			}
			return nil, err
		}
		return b, nil
	}
	return nil, nil
}

func (n *fileNode) release(h *handle) {
	if n.fsys.beforeRelease != nil {
		if after := n.fsys.beforeRelease(h.write); after != nil {
			defer after()
		}
	}
	n.mu.Lock()
	st := n.state()
	if h.write {
		st.writers--
		delete(st.whandles, h)
	}
	st.cachedOpen--
	n.fsys.stats.openFiles.Add(-1)
	last := st.writers == 0 && st.tmp != nil
	settle := st.writers == 0 && (st.lost || st.inval)
	closing := n.clearFlushedLocked(st, h)
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
	if closing {
		n.fsys.closes.done() // after the handoff: Sync's barrier covers it
	}
	if settle {
		n.finishFailure(0, false)
	}
}

// Fsync waits for the file's commit and reports its failure (ENOSPC or
// EIO), or one no close or fsync has reported yet.
func (n *fileNode) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	h, _ := fh.(*handle)
	n.handoff()
	if err := n.fsys.Sync(); err != nil {
		return toErrno(err)
	}
	n.finishFailure(0, false)
	return failErrno(n.takeErr(h))
}

// handle is an open file served by the daemon.
type handle struct {
	n     *fileNode
	write bool
	// read: opened O_RDONLY or O_RDWR, so the kernel checked read
	// permission (the layout ioctls answer only such handles: ioctl.go).
	read bool
	next atomic.Int64 // where the last read ended
	// failed: the bytes written through this handle were lost (a write
	// or the commit failed); its writes, fsync and close answer it.
	// Guarded by n.mu.
	failed error
	// flushed: a close(2) of the handle came after its last write, and
	// its RELEASE is pending (closer.go). Guarded by n.mu.
	flushed bool
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
	b, err := h.n.readAt(ctx, dest, off, seq)
	if err != nil {
		logReadError(h.n.fsys.log, h.n.id, off, err)
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(b), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.write {
		return 0, syscall.EBADF
	}
	n := h.n
	priv := privileged(ctx)
	n.fsys.waitForRoom(int64(len(data)), priv)
	st := n.lockW(true)
	defer st.wmu.RUnlock()
	if h.failed != nil {
		n.mu.Unlock()
		return 0, failErrno(h.failed)
	}
	if n.clearFlushedLocked(st, h) {
		// The FLUSH was a duplicate's close: the writer goes on.
		n.fsys.closes.done()
	}
	err := n.ensureTmpLocked(st, priv)
	if err == nil {
		err = n.fsys.space.admit(st.tmp, int64(len(data)), priv)
	}
	if errors.Is(err, syscall.ETXTBSY) {
		n.mu.Unlock()
		return 0, syscall.ETXTBSY
	}
	if err != nil {
		// A version without this write would be torn: the file goes back
		// to its committed version and the writer hears it at close.
		n.failWriteLocked(st, "write", err)
		n.mu.Unlock()
		return 0, failErrno(err)
	}
	tf := st.tmp
	tf.ref()
	now := time.Now().UnixNano()
	n.setTimesLocked(now, now, n.atimeLocked())
	n.mu.Unlock()
	m, err := tf.f.WriteAt(data, off)
	n.fsys.space.done(tf, int64(len(data)))
	if err != nil {
		n.mu.Lock()
		if st.tmp == tf {
			n.failWriteLocked(st, "write", err)
		}
		n.mu.Unlock()
	}
	tf.release()
	if err != nil {
		return uint32(m), failErrno(err)
	}
	return uint32(m), 0
}

// failWriteLocked discards the working copy after a failed write and logs
// it (one line per lost version). Callers hold mu.
func (n *fileNode) failWriteLocked(st *fileState, op string, err error) {
	err = fmt.Errorf("%s %s: %w", op, n.name, err)
	n.fsys.log.Error("write failed; the file keeps its last committed version", "name", n.name, "err", err)
	n.discardLocked(st, err)
}

func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if !h.write {
		return syscall.EBADF
	}
	n := h.n
	priv := privileged(ctx)
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) == 0 {
		n.fsys.waitForRoom(int64(size), priv)
	}
	st := n.lockW(true)
	defer st.wmu.RUnlock()
	defer n.mu.Unlock()
	if h.failed != nil {
		return failErrno(h.failed)
	}
	if err := n.ensureTmpLocked(st, priv); err != nil {
		return toErrno(err)
	}
	// Modes that free or move blocks need no space; the others may
	// allocate size bytes, which the commit may need again. A refused
	// fallocate changes nothing, so unlike a write it loses nothing.
	var grow int64
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) == 0 {
		grow = int64(size)
	}
	if err := n.fsys.space.admit(st.tmp, grow, priv); err != nil {
		return syscall.ENOSPC
	}
	err := unix.Fallocate(int(st.tmp.f.Fd()), mode, int64(off), int64(size))
	n.fsys.space.done(st.tmp, grow)
	return toErrno(err)
}

// Flush runs at every close(2): the last writer's close hands the working
// copy to the committer, so the next open (here or, once committed,
// anywhere) sees the new version. When free space is low it also waits for
// that commit, so that a close that returns 0 means committed; otherwise
// the commit is asynchronous (close is not durability; fsync is) and the
// space the commit needs was set aside when the bytes were written.
// A close reports a failed write or commit through this handle (ENOSPC or
// EIO), or one of the file that nobody was told of yet.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	if !h.write {
		return 0
	}
	n := h.n
	// The file is committed at RELEASE (closer.go), except on a nearly
	// full disk: then here, so that close(2) hears whether it fitted.
	low := n.fsys.space.lowNow()
	n.mu.Lock()
	st := n.state()
	last := st != nil && st.writers == 1
	commitNow := false
	if st != nil {
		// Marked also when the file has no working copy (an fsync
		// committed it): this writer is closed all the same, and a
		// later writer's close must not wait on its RELEASE to count
		// as the last (TestDiskFullAtCommit held that RELEASE back).
		n.markFlushedLocked(st, h)
		// Every writer closed since it last wrote: on a nearly full
		// disk the file is committed now.
		commitNow = low && st.tmp != nil && st.flushed == st.writers
	}
	n.mu.Unlock()
	if commitNow {
		if t := n.handoff(); t != 0 && n.fsys.space.lowNow() {
			if err := n.fsys.com.wait(t); err != nil {
				return toErrno(err)
			}
		}
	}
	mine := 0
	if last {
		mine = 1
	}
	n.finishFailure(mine, false)
	return failErrno(n.takeErr(h))
}

// Statfs answers statfs(2) on a file in the mount as on a directory.
func (n *fileNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.fsys.statfs(out)
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
	b, err := h.n.readAt(ctx, dest, off, false)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(b), 0
}

func (h *ptHandle) Release(ctx context.Context) syscall.Errno {
	h.once.Do(func() {
		unix.Close(h.fd)
		n := h.n
		n.fsys.stats.openFiles.Add(-1)
		n.mu.Lock()
		st := n.state()
		st.ptOpen--
		if st.cachedOpen == 0 && st.ptOpen == 0 {
			st.file = nil
		}
		n.idleLocked()
		n.mu.Unlock()
	})
	return 0
}

// tempFile is a working copy: an unlinked file under TempDir, shared by
// the writers and readers of one node and by the committer, freed when the
// last of them lets go (its space and its reservation go with it).
type tempFile struct {
	f    *os.File
	sp   *space
	refs atomic.Int32
	// res is the space set aside for this copy's commit; alloc the bytes
	// the copy held when res was last set. Guarded by sp.mu.
	res, alloc int64
}

func (f *FS) newTemp() (*tempFile, error) {
	file, err := os.CreateTemp(f.opts.TempDir, "w-*")
	if err != nil {
		return nil, fmt.Errorf("working copy: %w", err)
	}
	os.Remove(file.Name())
	t := &tempFile{f: file, sp: f.space}
	t.refs.Store(1)
	return t, nil
}

func (t *tempFile) ref() { t.refs.Add(1) }

func (t *tempFile) release() {
	if t.refs.Add(-1) == 0 {
		t.f.Close()
		t.sp.free(t)
	}
}

// allocated returns the bytes the copy holds on disk (-1: unknown).
func (t *tempFile) allocated() int64 {
	var st unix.Stat_t
	if err := unix.Fstat(int(t.f.Fd()), &st); err != nil {
		return -1
	}
	return st.Blocks * 512
}

func (t *tempFile) size() int64 {
	st, err := t.f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}
