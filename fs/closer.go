package fs

import (
	"sync"
	"time"
)

// Which close commits a file.
//
// Every close(2) of a descriptor of a FUSE file is a FLUSH: also the close
// of a duplicate (dash runs `printf a >&3` as dup2(3, 1), printf, and a
// dup2 that closes that copy again) and the close a child process makes of
// a copy it inherited, when it exits or execs. Committing at FLUSH
// committed a half-written file each time: a version no writer closed,
// which a reader elsewhere or a restart after kill -9 would then see. So
// the node commits a file when the open file itself goes: at RELEASE, sent
// when the last descriptor of it is closed (TestChildCloseDoesNotCommit).
//
// RELEASE is asynchronous: the kernel queues it before close(2) returns,
// behind other background requests, and the node may see a forwarded CLI
// command, or the next open of the file, first. So every FLUSH of a
// writing handle marks that handle as closed (handle.flushed), also when
// an fsync left no working copy to commit; Sync, which the CLI runs
// before every forwarded command, waits up to closeGrace for the RELEASE
// of every handle marked so before it waits for the committer. A write through the handle after its
// FLUSH (the descriptor was a duplicate) clears the mark. The mark is per
// handle, not per file: a writer that closed, opened the file again, wrote
// and closed has two RELEASEs pending, and only the second one commits
// (TestCloseReopenBeforeRelease). The one exception is a nearly full disk:
// then the FLUSH that leaves no unflushed writer commits and waits, so that
// close(2) can report a commit that does not fit (space.md); a duplicate's
// close commits then too.

// closeGrace bounds how long Sync waits for RELEASEs that a FLUSH announced.
// A RELEASE follows its FLUSH within microseconds on an idle machine; the
// bound only matters for a descriptor that was a duplicate and stays open.
const closeGrace = 500 * time.Millisecond

// closeTracker counts writing handles marked closed (handle.flushed)
// whose RELEASE is pending.
type closeTracker struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int
}

func (c *closeTracker) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *closeTracker) done() {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
	c.cond.Broadcast()
}

// wait returns when no handle is marked closed, or after d.
func (c *closeTracker) wait(d time.Duration) {
	timer := time.AfterFunc(d, c.cond.Broadcast)
	defer timer.Stop()
	deadline := time.Now().Add(d)
	c.mu.Lock()
	for c.n > 0 && time.Now().Before(deadline) {
		c.cond.Wait()
	}
	c.mu.Unlock()
}

// markFlushedLocked marks h as closed by its close(2), RELEASE pending.
// Callers hold n.mu.
func (n *fileNode) markFlushedLocked(st *fileState, h *handle) {
	if !h.flushed {
		h.flushed = true
		st.flushed++
		n.fsys.closes.add()
	}
}

// clearFlushedLocked drops h's mark (a write came after all, or RELEASE
// arrived) and says whether there was one; the caller calls
// n.fsys.closes.done() for it once the file is handed off. Callers hold n.mu.
func (n *fileNode) clearFlushedLocked(st *fileState, h *handle) bool {
	if !h.flushed {
		return false
	}
	h.flushed = false
	st.flushed--
	return true
}
