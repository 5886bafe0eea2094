package node

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kylix/kylix/chunkstore"
)

// The high watermark (docs/design/space.md, "The high watermark: kept
// copies of others' chunks"). A cluster member stores, besides the chunks
// it owns, copies of chunks others own: in its peer cache (evicted by
// itself, least recently used first, to keep the mount's reserve free)
// and in its packs, for the files made local here (KYLIX_IOC_MAKE_LOCAL,
// recorded as kept). When the data directory's file system is fuller than
// the high watermark, the node releases kept files, least recently read
// first, until the copies they hold that others own would bring it under
// the low watermark (high less lowGap); rebalance then drops those copies,
// each once its homes confirm they hold it (never the last copy), and a
// GC gives their room back. Pinned paths are never released. Only a
// cluster member has kept files.

// DefaultHighWatermark is serve --high-watermark: percent of the data file
// system in use past which kept copies of others' chunks are released.
const DefaultHighWatermark = 90

// lowGap: the node releases until the use would be this many percent under
// the high watermark, so that it does not release one file at a time as
// the disk hovers around it.
const lowGap = 5

// watermarkEvery is how often the node looks at its disk's use (a statfs).
const watermarkEvery = 2 * time.Second

// watermark is the node's state of the policy.
type watermark struct {
	high int // percent; 0: off

	mu sync.Mutex
	// awaiting: bytes of copies released (estimated) that no GC has given
	// back yet; more is released only once they are, or past them.
	awaiting int64
	// droppedAt: placement's DroppedBytes when the last GC ran here.
	droppedAt int64
	stats     WatermarkStatus
	saidNone  bool // "nothing to release" logged since the use last fell
	// gcAfter: a GC that failed (a full disk, a member whose namespace
	// cannot be merged) is not tried again before then.
	gcAfter time.Time
}

// gcRetry is how long the node waits after a failed GC before the next.
const gcRetry = 30 * time.Second

// WatermarkStatus is what kylix node says about the high watermark.
type WatermarkStatus struct {
	HighPercent int `json:"high_percent"`
	// UsedPercent: the data file system's use at the last look.
	UsedPercent float64 `json:"used_percent"`
	// Released: kept files released (least recently read first), and the
	// bytes of copies of others' chunks they held here.
	Released      int64    `json:"released_files"`
	ReleasedBytes int64    `json:"released_bytes"`
	Recent        []string `json:"recent_released,omitempty"` // the last few, newest last
	// GCs run to give the dropped copies' room back, and what they freed.
	GCs       int64  `json:"gcs"`
	GCFreed   int64  `json:"gc_freed_bytes"`
	LastError string `json:"last_error,omitempty"`
}

// watermarkLoop looks at the disk every watermarkEvery until ctx ends.
func (n *Node) watermarkLoop(ctx context.Context) {
	t := time.NewTicker(watermarkEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := n.watermarkPass(ctx); err != nil && ctx.Err() == nil {
			n.wm.mu.Lock()
			n.wm.stats.LastError = err.Error()
			n.wm.mu.Unlock()
			n.log.Warn("high watermark: will retry", "err", err)
		}
	}
}

// keptUse is a kept file and when it was last used: last, the later of
// when it was kept and its last read here (the store keeps the day:
// chunkstore.LastRead counts a read until the end of its day, UTC).
type keptUse struct {
	path        string
	last, added time.Time
}

// watermarkPass is one look: past the high watermark, run a GC if
// rebalance dropped copies since the last one, else release kept files.
func (n *Node) watermarkPass(ctx context.Context) error {
	w := &n.wm
	total, free, err := diskSpace(n.s.Dir())
	if err != nil || total <= 0 {
		return err
	}
	used := total - free
	w.mu.Lock()
	w.stats.HighPercent = w.high
	w.stats.UsedPercent = 100 * float64(used) / float64(total)
	if used*100 <= int64(w.high)*total {
		w.awaiting, w.saidNone = 0, false
		w.mu.Unlock()
		return nil
	}
	deficit := used - int64(w.high-lowGap)*total/100
	dropped := n.peers.Placement().DroppedBytes
	gcDue := dropped > w.droppedAt && !time.Now().Before(w.gcAfter)
	w.mu.Unlock()

	if gcDue {
		// The copies rebalance dropped are still in the packs: the GC
		// removes the packs left empty and compacts the rest.
		res, err := n.s.Collect(ctx, chunkstore.GCOptions{Compact: true})
		if err != nil {
			w.mu.Lock()
			w.gcAfter = time.Now().Add(gcRetry)
			w.mu.Unlock()
			return fmt.Errorf("giving the room of the dropped copies back (gc; again in %s): %w", gcRetry, err)
		}
		w.mu.Lock()
		w.droppedAt = dropped
		w.awaiting = max(0, w.awaiting-res.BytesFreed)
		w.stats.GCs++
		w.stats.GCFreed += res.BytesFreed
		w.mu.Unlock()
		n.log.Info("high watermark: gc gave back the room of copies owned elsewhere (pins it moved follow: pins.go)", "freed", res.BytesFreed, "packs_removed", res.PacksRemoved, "packs_compacted", res.PacksCompacted)
		return nil
	}
	w.mu.Lock()
	awaiting := w.awaiting
	w.mu.Unlock()
	if awaiting >= deficit {
		n.peers.Rebalance() // what was released waits for its homes' word
		return nil
	}
	kept := n.keptByUse()
	var released []string
	var bytes int64
	for _, k := range kept {
		if awaiting+bytes >= deficit {
			break
		}
		refs, err := n.s.ChunksBelow(ctx, k.path)
		if err != nil {
			continue // gone from the namespace: nothing held for it
		}
		b := n.peers.NotOwnedHere(refs)
		if b == 0 {
			continue
		}
		ok, err := n.pins.release(k.path)
		if err != nil {
			return fmt.Errorf("releasing kept file %s: %w", ShownPath(k.path), err)
		}
		if !ok {
			continue // unpinned meanwhile
		}
		released = append(released, k.path)
		bytes += b
		n.log.Info("high watermark: released a kept file, least recently read first; its copies of chunks owned elsewhere go once their owners confirm them",
			"path", ShownPath(k.path), "bytes", b, "used_percent", fmt.Sprintf("%.1f", 100*float64(used)/float64(total)), "high_percent", w.high)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.awaiting += bytes
	w.stats.Released += int64(len(released))
	w.stats.ReleasedBytes += bytes
	for _, p := range released {
		w.stats.Recent = append(w.stats.Recent, ShownPath(p))
	}
	if len(w.stats.Recent) > 8 {
		w.stats.Recent = slices.Clone(w.stats.Recent[len(w.stats.Recent)-8:])
	}
	if len(released) > 0 {
		n.peers.Rebalance()
	} else if w.awaiting == 0 && !w.saidNone {
		w.saidNone = true
		n.log.Warn("high watermark: the data file system is past it and no kept file holds copies of chunks owned elsewhere (pinned files are never released; kylix unpin, kylix evict and kylix gc free room)",
			"used_percent", fmt.Sprintf("%.1f", 100*float64(used)/float64(total)), "high_percent", w.high)
	}
	return nil
}

// keptByUse lists the kept files, least recently used first (keptUse);
// among files last used the same day, the one kept first goes first.
func (n *Node) keptByUse() []keptUse {
	n.pins.mu.Lock()
	var out []keptUse
	for p, added := range n.pins.kept {
		out = append(out, keptUse{path: p, last: added, added: added})
	}
	n.pins.mu.Unlock()
	for i := range out {
		if f, _, err := n.s.OpenPath(out[i].path); err == nil {
			if t, ok := n.s.LastRead(f.ID); ok && t.After(out[i].last) {
				out[i].last = t
			}
		}
	}
	slices.SortFunc(out, func(a, b keptUse) int {
		return cmp.Or(a.last.Compare(b.last), a.added.Compare(b.added), cmp.Compare(a.path, b.path))
	})
	return out
}

// status is what kylix node shows (nil when off).
func (w *watermark) status() *WatermarkStatus {
	if w.high == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats
	st.HighPercent = w.high
	st.Recent = slices.Clone(st.Recent)
	return &st
}
