package fs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kylix/kylix/chunkstore"
)

// committer turns closed working copies into store versions. It runs one
// batch at a time: every file closed while the previous batch was being
// written goes into the next one, which is imported with one Importer (one
// pack sync and one index transaction) and linked into the namespace with
// one namespace transaction. So a copy of many small files costs a few
// syncs per batch, not per file.
type committer struct {
	f      *FS
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []*fileNode
	queued map[*fileNode]bool
	issued uint64 // tickets handed out by enqueue
	done   uint64 // every ticket <= done is committed (or failed)
	// perm: the last ticket whose commit may change who may read bytes
	// the namespace already names (clientperm.go): an enqueue of a node
	// that has a store entry, or whose first commit is being written.
	// Only the first commit of a new file is left out: it adds a name.
	perm     uint64
	inflight map[*fileNode]bool // the batch being written
	closed   bool
	exited   chan struct{}
}

func newCommitter(f *FS) *committer {
	c := &committer{f: f, queued: map[*fileNode]bool{}, inflight: map[*fileNode]bool{}, exited: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	go c.loop()
	return c
}

// enqueue asks for n to be committed and returns a ticket for wait.
func (c *committer) enqueue(n *fileNode) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.issued++
	n.mu.Lock()
	named := n.inStore
	n.mu.Unlock()
	if named || c.inflight[n] {
		c.perm = c.issued
	}
	if !c.queued[n] {
		c.queued[n] = true
		c.queue = append(c.queue, n)
	}
	c.cond.Broadcast()
	return c.issued
}

// permBarrier returns a ticket that is done when every enqueued change
// that may change who may read a named file's bytes is (see perm).
func (c *committer) permBarrier() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.perm
}

// barrier returns a ticket that is done when everything enqueued so far is.
func (c *committer) barrier() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.issued
}

func (c *committer) wait(t uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.done < t {
		if c.closed && len(c.queue) == 0 {
			select {
			case <-c.exited:
				return errors.New("committer stopped")
			default:
			}
		}
		c.cond.Wait()
	}
	return nil
}

// busy reports whether commits are queued or being written.
func (c *committer) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done < c.issued
}

// close commits what is queued and stops.
func (c *committer) close() error {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	<-c.exited
	return nil
}

func (c *committer) loop() {
	defer close(c.exited)
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.closed {
			c.cond.Wait()
		}
		if len(c.queue) == 0 && c.closed {
			c.done = c.issued
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		batch := c.queue
		c.queue = nil
		clear(c.queued)
		for _, n := range batch {
			c.inflight[n] = true
		}
		upto := c.issued
		c.mu.Unlock()

		c.commit(batch)

		c.mu.Lock()
		clear(c.inflight)
		c.done = upto
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

type commitItem struct {
	n    *fileNode
	tf   *tempFile
	name string
	res  chunkstore.PutResult
	err  error
	ent  chunkstore.Entry
	put  bool // written into the namespace
	gone bool // the node has no name any more
	// metaSeq is the node's metadata change count the entry written
	// carries.
	metaSeq uint64
	nothg   bool // nothing to write yet (created, still open)
}

func (c *committer) commit(batch []*fileNode) {
	f := c.f
	if f.beforeCommit != nil {
		f.beforeCommit()
	}
	f.stats.commitBatches.Add(1)
	items := make([]*commitItem, len(batch))
	f.nsMu.RLock()
	for i, n := range batch {
		items[i] = &commitItem{n: n, name: n.name}
	}
	f.nsMu.RUnlock()
	for _, it := range items {
		it.n.mu.Lock()
		if st := it.n.state(); st != nil && st.committing != nil {
			it.tf = st.committing
			it.tf.ref()
		}
		it.n.mu.Unlock()
	}
	im := f.s.NewImporter()
	defer im.Abort()
	ctx := context.Background()
	for _, it := range items {
		if it.tf == nil {
			continue
		}
		it.res, it.err = im.PutFile(ctx, it.tf.f, it.name, nil)
	}
	flushErr := im.Flush()
	f.nsMu.Lock()
	var upErr error
	if flushErr == nil {
		upErr = f.update(func(tx *chunkstore.NSTx) error {
			for _, it := range items {
				if it.err != nil {
					continue
				}
				n := it.n
				n.mu.Lock()
				ent := chunkstore.Entry{Mode: n.mode, UID: n.uid, GID: n.gid, MTime: n.mtime, CTime: n.ctimeLocked(), ATime: n.atimeLocked(), ID: n.id, Size: n.size}
				inStore := n.inStore
				it.metaSeq = n.metaSeqLocked()
				n.mu.Unlock()
				if it.tf == nil && !inStore {
					it.nothg = true
					continue
				}
				e := chunkstore.Entry{Kind: chunkstore.KindFile, Mode: ent.Mode, UID: ent.UID, GID: ent.GID, MTime: ent.MTime, CTime: ent.CTime, ATime: ent.ATime, ID: ent.ID, Size: ent.Size}
				if it.tf != nil {
					e.ID, e.Size = it.res.ID, it.res.Size
				}
				var err error
				if link := n.link.Load(); link != 0 && n.gone.Load() {
					it.gone = true // its last name went
					continue
				} else if link != 0 {
					// A link set: its one entry, whichever names it has
					// now (fs/hardlink.go).
					err = tx.PutLinked(link, e)
				} else if p, ok := n.path(); ok {
					err = tx.Put(p, e)
				} else {
					it.gone = true
					continue
				}
				if err != nil {
					it.err = err
					continue
				}
				it.ent, it.put = e, true
			}
			return nil
		})
	}
	var failed []*fileNode
	for _, it := range items {
		n := it.n
		err := it.err
		if err == nil {
			err = flushErr
		}
		if err == nil {
			err = upErr
		}
		n.mu.Lock()
		st := n.state()
		switch {
		case err != nil:
			err = fmt.Errorf("commit %s: %w", it.name, err)
			f.log.Error("commit failed; the file keeps its last committed version", "name", it.name, "err", err)
			if st == nil {
				break
			}
			if it.tf == nil || st.committing != it.tf {
				// A newer copy (made from this one) is waiting: nothing
				// is lost yet; the next fsync or close hears of it.
				st.commitErr = err
				break
			}
			// Free the copy's space now rather than keep it for a retry
			// that would fail the same way; the writer is told.
			st.committing = nil
			it.tf.release() // the node's reference
			if st.tmp != nil {
				st.commitErr = err // the newer copy holds these bytes too
				break
			}
			n.discardLocked(st, err)
			failed = append(failed, n)
		case it.put:
			f.stats.commits.Add(1)
			n.id, n.size, n.inStore, n.notPT = it.ent.ID, it.ent.Size, true, false
			if x := n.x; x != nil { // kept while metaSeq is not 0
				x.metaDone = max(x.metaDone, it.metaSeq)
			}
			if st != nil {
				st.commitErr = nil
				st.cmtime = 0
				if st.tmp != nil {
					st.cmtime = it.ent.MTime // a newer copy builds on this version
				}
				if it.tf != nil && st.committing == it.tf {
					st.committing = nil
					it.tf.release() // the node's reference
				}
			}
		}
		clean := st == nil || (st.tmp == nil && (st.committing == nil || it.gone))
		n.idleLocked()
		n.mu.Unlock()
		if clean {
			f.markDirty(n, false)
		}
	}
	f.nsMu.Unlock()
	if flushErr == nil && upErr == nil {
		im.Close()
	}
	for _, it := range items {
		if it.tf != nil {
			it.tf.release()
		}
	}
	for _, n := range failed {
		n.finishFailure(0, true)
	}
}
