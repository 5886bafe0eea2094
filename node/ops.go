package node

// The node's typed operations (adminproto.go): each is a method, so a
// program that runs a node in-process (tests, an embedding service) calls
// it directly, and the admin socket calls the same method.

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/peers"
)

// Status is the node's status (kylix node). gc runs the Go garbage
// collector first.
func (n *Node) Status(gc bool) NodeStatus {
	if gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	out := NodeStatus{PID: os.Getpid(), DataDir: n.s.Dir(), Mount: n.mount, Started: n.start,
		RSSBytes: rss(), HeapBytes: int64(ms.HeapInuse), FS: n.fsys.Stats(), PackChecks: n.s.PackVerifyStats()}
	if n.client != nil {
		out.Clients = n.client.stats()
	}
	out.Pins = n.pins.status()
	out.Whole = n.whole.status()
	if n.peers != nil {
		out.Watermark = n.wm.status()
	}
	if n.kv != nil {
		st := n.kv.Stats()
		out.KV = &st
	}
	return out
}

// rss returns the process's resident set size from /proc/self/statm.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// errNotInCluster is the error of cluster ops on a single node.
func (n *Node) errNotInCluster(what string) error {
	return fmt.Errorf("the node serving %s is not in a cluster (it was started without --listen)%s", n.s.Dir(), what)
}

// PeersStatus is the cluster as this member sees it (kylix peers).
func (n *Node) PeersStatus() (PeersStatus, error) {
	p := n.peers
	if p == nil {
		return PeersStatus{}, n.errNotInCluster("")
	}
	out := PeersStatus{Self: p.Name(), Replicas: p.Replicas(), Placement: p.Placement(), Swarm: p.Swarm(), Members: p.Members(), StripeRebuilt: p.StripeReads()}
	if sh, err := p.StripeShape(); err != nil {
		out.StripeNote = err.Error()
	} else {
		out.StripeShape = fmt.Sprintf("%s (%.2fx)", sh, sh.Overhead())
	}
	sc := n.s.Counters()
	out.ReadAhead = ReadAheadStatus{Window: n.s.ReadAheadWindow(), Chunks: sc.ReadAheadChunks, Bytes: sc.ReadAheadBytes}
	return out, nil
}

// Replication is the replication of path ("" the namespace) as the alive
// members answer, or nil outside a cluster.
func (n *Node) Replication(ctx context.Context, path string) (*peers.Replication, error) {
	if n == nil || n.peers == nil {
		return nil, nil
	}
	r, err := n.peers.Replication(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("asking the cluster which members hold %q: %w", path, err)
	}
	return &r, nil
}

// Pin pins path (kylix pin). In a cluster the chunks of path not stored
// here are brought from the members first, reported to progress.
func (n *Node) Pin(ctx context.Context, path string, progress Progress) (PinReply, error) {
	clean, err := chunkstore.CleanPath(path)
	if err != nil {
		return PinReply{}, fmt.Errorf("pin %s: %w", path, err)
	}
	var cl *pinCluster
	if n.peers != nil {
		cl = &pinCluster{progress: progress}
	}
	p, got, err := n.pins.pin(ctx, clean, cl)
	if err != nil {
		return PinReply{}, err
	}
	st := n.pins.status()
	out := PinReply{Path: ShownPath(clean), Files: p.nfiles, Bytes: p.bytes, BudgetBytes: st.BudgetBytes, UsedBytes: st.LockedBytes, GPUNote: st.GPUNote,
		Cluster: cl != nil, FetchedChunks: got.chunks, FetchedBytes: got.bytes}
	for _, r := range p.locked {
		out.LockedBytes += r.Size()
	}
	return out, nil
}

// Unpin releases the pin of path, or the keep of a file made local by
// KYLIX_IOC_MAKE_LOCAL (kylix unpin).
func (n *Node) Unpin(path string) (UnpinReply, error) {
	clean, err := chunkstore.CleanPath(path)
	if err != nil {
		return UnpinReply{}, fmt.Errorf("unpin %s: %w", path, err)
	}
	np := n.pins
	np.mu.Lock()
	_, kept := np.kept[clean]
	kept = kept && np.pins[clean] == nil
	np.mu.Unlock()
	if err := np.unpin(clean); err != nil {
		return UnpinReply{}, err
	}
	st := np.status()
	return UnpinReply{Path: ShownPath(clean), Kept: kept, LockedBytes: st.LockedBytes, BudgetBytes: st.BudgetBytes}, nil
}

// UnpinRecorded removes path from the pin record of a data directory no
// node serves (the caller holds the store's lock). It returns the
// record's path.
func UnpinRecorded(dataDir, path string) (string, error) {
	clean, err := chunkstore.CleanPath(path)
	if err != nil {
		return "", fmt.Errorf("unpin %s: %w", path, err)
	}
	rec, err := readPinRecord(dataDir)
	if err != nil {
		return "", err
	}
	var names []string
	i := -1
	for k, r := range rec.Pins {
		names = append(names, r.Path)
		if r.Path == clean && i < 0 {
			i = k
		}
	}
	if i < 0 {
		return "", notPinned(clean, names)
	}
	rec.Pins = append(rec.Pins[:i], rec.Pins[i+1:]...)
	if err := writePinRecord(dataDir, rec); err != nil {
		return "", err
	}
	return pinRecordPath(dataDir), nil
}

// Evict drops a path's chunks (or, with All, every chunk) from the peer
// cache (kylix evict).
func (n *Node) Evict(ctx context.Context, req EvictRequest) (EvictReply, error) {
	if n.peers == nil {
		return EvictReply{}, n.errNotInCluster(": it has no peer cache")
	}
	var out EvictReply
	if req.All {
		out.Chunks, out.Bytes = n.peers.DropPeerCached(nil, true)
	} else {
		clean, err := chunkstore.CleanPath(req.Path)
		if err != nil {
			return out, fmt.Errorf("evict %s: %w", req.Path, err)
		}
		out.Path = ShownPath(clean)
		refs, err := n.s.ChunksBelow(ctx, clean)
		if err != nil {
			return out, fmt.Errorf("evict %s: %w", out.Path, err)
		}
		ids := make([]chunkstore.ID, len(refs))
		for i, r := range refs {
			ids[i] = r.ID
		}
		out.Chunks, out.Bytes = n.peers.DropPeerCached(ids, false)
	}
	c := n.peers.Swarm().Cache
	out.CacheBytes, out.CacheChunks = c.Bytes, c.Chunks
	return out, nil
}

// Warm reads path's chunks into the page cache, verified (kylix warm); on
// a cluster member the chunks not stored here are fetched.
func (n *Node) Warm(ctx context.Context, path string, progress Progress) (WarmReply, error) {
	return Warm(ctx, n.s, n.peers, path, progress)
}

// MetricsText is the node's registry in the Prometheus text format.
func (n *Node) MetricsText() (string, error) {
	return n.metrics.text()
}

// Import imports req.Src into the node's store at req.Dest (kylix
// import); in a cluster the chunks go to their owners as they are read
// (docs/design/peers.md, "Push on import"). The mount shows the result.
func (n *Node) Import(ctx context.Context, req ImportRequest, progress Progress) (ImportReply, error) {
	opts := chunkstore.ImportOptions{NoDereference: req.NoDereference}
	if progress != nil {
		opts.Progress = func(done, total int64) { progress("import", done, total) }
	}
	var push *peers.PushStream
	if n.peers != nil {
		push = n.peers.NewPushStream(ctx)
		defer push.Abort() // after Close: nothing; else the stream and its lease end
		opts.OnChunk = push.Add
	}
	if err := n.Sync(); err != nil {
		return ImportReply{}, fmt.Errorf("mount: %w", err)
	}
	res, err := n.s.Import(ctx, req.Src, req.Dest, opts)
	n.Reconcile()
	if err != nil {
		if push != nil {
			push.Abort()
		}
		return ImportReply{}, err
	}
	out := ImportReply{Result: res}
	if req.TPSize > 1 {
		if out.Layouts, out.LayoutOthers, err = gpuio.MakeRankLayoutsBelow(ctx, n.s, req.Dest, req.TPSize, func(_ string, done, total int64) {
			if progress != nil {
				progress("layout", done, total)
			}
		}); err != nil {
			err = fmt.Errorf("imported, but the rank layouts were not made: %w", err)
		}
	}
	// Wait until every owner answered the push, so that each chunk has
	// its replicas when the import returns. A member that could not be
	// reached is named: its own placement pass copies the chunks later.
	// The import itself is committed either way.
	if push != nil {
		pr, err := push.Close()
		if err != nil {
			out.PushError = err.Error()
		} else {
			out.PushFailed = pr.Failed
		}
	}
	return out, err
}
