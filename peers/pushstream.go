package peers

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// Push while the import reads (docs/design/peers.md, "Push on import"). An
// import on a member hands each chunk it reads to a PushStream
// (chunkstore.ImportOptions.OnChunk), which copies it into a batch for
// each of the chunk's owners; a full batch goes to its owner at once, while
// the import goes on reading. Each owner has at most streamInFlight batches
// sent and unanswered and one being filled: when they are all taken, Add
// waits, and so does the import, so a slow owner slows the import rather
// than making it buffer the file. An owner that fails a request is named in
// the result and sent nothing more; its chunks reach it by its own
// placement pass.

// streamBatch is the chunk bytes gathered for an owner before they are
// sent in one opPut (a chunk is at most 4 MiB, so a batch stays under
// streamBatch + 4 MiB).
const streamBatch = 8 << 20

// streamInFlight is the batches sent to one owner and not yet answered.
const streamInFlight = 4

// streamTimeout bounds one batch (opHas and opPut): an owner that stops
// answering (stopped, not dead) is named as failed rather than holding
// the import up for good.
const streamTimeout = 2 * time.Minute

// PushStream sends an import's chunks to their owners as the import reads
// them. Add is called from one goroutine (the import's); Close waits for
// every owner to answer.
type PushStream struct {
	n       *Node
	ctx     context.Context
	cancel  context.CancelFunc
	members []peer
	owners  map[string]*ownerStream // alive owners other than this member
	seen    map[chunkstore.ID]bool
	closed  bool
	release func() // the GC lease held while the stream is open (lease.go)
}

// ownerStream is what one owner is sent.
type ownerStream struct {
	p   peer
	cur []byte // the batch being filled (opPut payload)
	ids []chunkstore.ID
	sem chan struct{}
	wg  sync.WaitGroup

	mu     sync.Mutex
	err    error
	chunks int64
	bytes  int64
}

// NewPushStream starts a stream to the owners by the membership now
// (placement's members: alive ones and failed ones in their grace, which
// are skipped as Push skips them).
func (n *Node) NewPushStream(ctx context.Context) *PushStream {
	ctx, cancel := context.WithCancel(ctx)
	ps := &PushStream{n: n, ctx: ctx, cancel: cancel, members: n.placementMembers(),
		owners: map[string]*ownerStream{}, seen: map[chunkstore.ID]bool{}, release: n.holdGC()}
	for _, p := range n.livePeers() {
		ps.owners[p.name] = &ownerStream{p: p, sem: make(chan struct{}, streamInFlight)}
	}
	return ps
}

// Add queues chunk id (its bytes data, read only during the call) for its
// owners, and sends the batches it fills. It waits while an owner has
// streamInFlight batches unanswered.
func (ps *PushStream) Add(id chunkstore.ID, data []byte) {
	if ps.closed || ps.seen[id] || ps.ctx.Err() != nil {
		return
	}
	ps.seen[id] = true
	for _, o := range owners(id, ps.members, ps.n.cfg.Replicas) {
		ow := ps.owners[o.name]
		if ow == nil || ow.failed() {
			continue // this member, or one not alive
		}
		if len(ow.cur) > 0 && len(ow.cur)+36+len(data) > streamBatch {
			ps.send(ow)
		}
		if ow.cur == nil {
			ow.cur = make([]byte, 0, streamBatch+36+len(data))
		}
		n := len(ow.cur)
		ow.cur = appendPut(ow.cur, id, data)
		if ps.n.cfg.CorruptServed { // the test hook: this member sends wrong bytes
			ow.cur[n+36] ^= 0xff
		}
		ow.ids = append(ow.ids, id)
	}
}

// send hands ow's batch to a goroutine once one of its streamInFlight
// slots is free: it asks which chunks the owner holds (opHas) and sends
// the others (opPut).
func (ps *PushStream) send(ow *ownerStream) {
	b, ids := ow.cur, ow.ids
	ow.cur, ow.ids = nil, nil
	select {
	case ow.sem <- struct{}{}:
	case <-ps.ctx.Done():
		return
	}
	ow.wg.Add(1)
	go func() {
		defer func() { <-ow.sem; ow.wg.Done() }()
		if ow.failed() {
			return
		}
		ctx, cancel := context.WithTimeout(ps.ctx, streamTimeout)
		chunks, bytes, err := ps.n.putBatch(ctx, ow.p, b, ids)
		cancel()
		ow.mu.Lock()
		defer ow.mu.Unlock()
		ow.chunks += chunks
		ow.bytes += bytes
		if err != nil && ow.err == nil {
			ow.err = err
		}
	}()
}

func (ow *ownerStream) failed() bool {
	ow.mu.Lock()
	defer ow.mu.Unlock()
	return ow.err != nil
}

// putBatch sends p the chunks of the opPut payload b (ids in order) that
// it does not hold.
func (n *Node) putBatch(ctx context.Context, p peer, b []byte, ids []chunkstore.ID) (int64, int64, error) {
	refs := make([]chunkstore.ChunkRef, len(ids))
	for i, id := range ids {
		refs[i].ID = id
	}
	held, err := n.askHas(ctx, p, refs)
	if err != nil {
		return 0, 0, err
	}
	pc, err := decodePut(b)
	if err != nil {
		return 0, 0, err
	}
	var send []byte
	var chunks, bytes int64
	all := true
	for i, c := range pc {
		if held[i] {
			all = false
			continue
		}
		chunks++
		bytes += int64(len(c.data))
	}
	switch {
	case chunks == 0:
		return 0, 0, nil
	case all:
		send = b
	default:
		for i, c := range pc {
			if !held[i] {
				send = appendPut(send, c.id, c.data)
			}
		}
	}
	if _, err := n.request(ctx, p, request{op: opPut, raw: send}, 0); err != nil {
		return 0, 0, err
	}
	return chunks, bytes, nil
}

// Close sends what is left and waits until every owner answered; it
// returns what was sent and the owners that could not be reached. The
// stream takes no more chunks.
func (ps *PushStream) Close() (PushResult, error) {
	var res PushResult
	if ps.closed {
		return res, nil
	}
	ps.closed = true
	defer ps.cancel()
	defer ps.release()
	for _, ow := range ps.owners {
		if len(ow.cur) > 0 && !ow.failed() {
			ps.send(ow)
		}
	}
	for _, ow := range ps.owners {
		ow.wg.Wait()
		res.Chunks += ow.chunks
		res.Bytes += ow.bytes
		if ow.chunks > 0 {
			res.Members++
		}
		if ow.err != nil {
			res.Failed = append(res.Failed, fmt.Sprintf("%s: %v", ow.p.name, ow.err))
		}
	}
	sort.Strings(res.Failed)
	ps.n.place.mu.Lock()
	ps.n.place.stats.PushedChunks += res.Chunks
	ps.n.place.stats.PushedBytes += res.Bytes
	ps.n.place.mu.Unlock()
	return res, ps.ctx.Err()
}

// Abort stops the stream (the import failed): batches in flight are
// cancelled; what owners already stored is collected by their GC once
// the grace after the lease's end has passed (lease.go).
func (ps *PushStream) Abort() {
	if ps.closed {
		return
	}
	ps.closed = true
	ps.cancel()
	for _, ow := range ps.owners {
		ow.wg.Wait()
	}
	ps.release()
}
