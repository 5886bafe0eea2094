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
// and the node may see a forwarded CLI command first. A FLUSH of the only
// writing handle (which is what the last close sends first) marks the file
// as closing; Sync, which the CLI runs before every forwarded command,
// waits up to closeGrace for the RELEASE of files marked so before it
// waits for the committer. A write after the FLUSH (the descriptor was a
// duplicate) clears the mark. The one exception is a nearly full disk:
// then the last FLUSH commits and waits, so that close(2) can report a
// commit that does not fit (space.md); a duplicate's close commits then too.

// closeGrace bounds how long Sync waits for RELEASEs that a FLUSH announced.
// A RELEASE follows its FLUSH within microseconds on an idle machine; the
// bound only matters for a descriptor that was a duplicate and stays open.
const closeGrace = 500 * time.Millisecond

// closeTracker counts files marked closing (fileState.closing).
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

// wait returns when no file is marked closing, or after d.
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

// markClosingLocked marks the file as closed by its last writer, RELEASE
// pending. Callers hold n.mu.
func (n *fileNode) markClosingLocked(st *fileState) {
	if !st.closing {
		st.closing = true
		n.fsys.closes.add()
	}
}

// clearClosingLocked drops the mark (a write came after all, or RELEASE
// arrived) and says whether there was one; the caller calls
// n.fsys.closes.done() for it once the file is handed off. Callers hold n.mu.
func (n *fileNode) clearClosingLocked(st *fileState) bool {
	was := st.closing
	st.closing = false
	return was
}
