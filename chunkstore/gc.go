package chunkstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// GCResult sums up a garbage collection.
type GCResult struct {
	ChunksRemoved  int   `json:"chunks_removed"`
	BytesRemoved   int64 `json:"bytes_removed"`
	ObjectsRemoved int   `json:"objects_removed"`
	PacksRemoved   int   `json:"packs_removed"`
	// BytesFreed: disk space given back, by packs removed whole and by
	// compaction (blocks of the pack files, as du counts them).
	BytesFreed int64 `json:"bytes_freed"`
	// DeadBytes are bytes no chunk uses any more inside packs that still hold
	// live chunks, after compaction (docs/design/gc.md): what is left in
	// packs under the threshold, in whole-file packs, and past --max-bytes.
	DeadBytes int64 `json:"dead_bytes_in_live_packs"`
	// ReceivedKept: chunks no head names, kept because they were received
	// from another member within the grace (Options.ReceivedGrace) (the namespace merge that
	// names them may not have arrived yet).
	ReceivedKept int `json:"received_kept"`
	// RankLayoutsRemoved: rank layouts removed because no head reaches
	// the file version they were made from (ranklayout.go).
	RankLayoutsRemoved int `json:"rank_layouts_removed,omitempty"`
	Compaction
}

// SetBeforeGC installs what a GC runs before it marks, without the
// store's locks (nil: nothing): a cluster member merges every member's
// namespace there, and its error stops the GC (docs/design/gc.md,
// "Leases").
func (s *Store) SetBeforeGC(h func(context.Context) error) {
	if h == nil {
		s.beforeGC.Store(nil)
		return
	}
	s.beforeGC.Store(&h)
}

// SetAfterGC installs what a GC that removed or compacted packs runs
// after it, without the store's locks (nil: nothing): the node locks its
// pins again where their chunks are now, since mappings of a removed pack
// keep its room taken (docs/design/pin.md).
func (s *Store) SetAfterGC(h func(context.Context)) {
	if h == nil {
		s.afterGC.Store(nil)
		return
	}
	s.afterGC.Store(&h)
}

// GC removes every chunk and object that no head reaches, and deletes packs
// that no longer hold a live chunk. It waits for running imports to finish.
// It does not compact packs: Collect with GCOptions does.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	return s.Collect(ctx, GCOptions{})
}

// Collect is GC with options: with Compact set it also rewrites the packs
// whose dead share passes the threshold (compact.go, docs/design/gc.md).
func (s *Store) Collect(ctx context.Context, opts GCOptions) (GCResult, error) {
	if h := s.beforeGC.Load(); h != nil {
		if err := (*h)(ctx); err != nil {
			return GCResult{}, fmt.Errorf("gc: %w", err)
		}
	}
	res, err := s.collect(ctx, opts)
	if h := s.afterGC.Load(); h != nil && err == nil && (res.PacksRemoved > 0 || res.PacksCompacted > 0) {
		(*h)(ctx)
	}
	return res, err
}

// collect is Collect between its hooks.
func (s *Store) collect(ctx context.Context, opts GCOptions) (GCResult, error) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	var res GCResult
	var err error
	if res.RankLayoutsRemoved, err = s.pruneRankLayoutsLocked(ctx); err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	liveObj := map[ID]bool{Sum(emptyDir): true}
	liveChunk := map[ID]bool{}
	var liveFiles []*FileManifest
	heads, err := s.Heads()
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	var mark func(e Entry) error
	mark = func(e Entry) error {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		if e.Deleted || liveObj[e.ID] {
			return nil
		}
		switch e.Kind {
		case KindFile:
			m, err := s.FileManifest(e.ID)
			if err != nil {
				return err
			}
			liveObj[e.ID] = true
			liveFiles = append(liveFiles, m)
			for _, c := range m.Chunks {
				liveChunk[c.ID] = true
			}
			// A cold file's stripes need every shard (docs/design/erasure.md):
			// the data shards of other files' chunks and the parity.
			for _, r := range m.Stripes {
				for i := range r.Shards() {
					if id, _, ok := r.ShardID(i); ok {
						liveChunk[id] = true
					}
				}
			}
		case KindDir:
			d, err := s.dirAt(e.ID)
			if err != nil {
				return err
			}
			liveObj[e.ID] = true
			for _, c := range d.Entries {
				if err := mark(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, h := range heads {
		if err := mark(Entry{Kind: KindDir, ID: h.Root}); err != nil {
			// Refuse to collect from a tree we could not read whole: we
			// would delete what the unreadable part still uses.
			return res, fmt.Errorf("gc: mark from head %q: %w (run kylix verify)", h.Name, err)
		}
	}
	// Chunks received from members within the grace, or while a member's
	// lease holds, count as live: the namespace merge that names them may
	// not have arrived (received.go).
	cutoff := s.receivedCutoff()
	livePack := map[uint64]bool{}
	liveBytes := map[uint64]int64{}
	packSize := map[uint64]int64{}
	cin := compactInput{chunks: map[uint64][]chunkAt{}, locs: map[ID]Location{}, info: map[uint64]packInfo{}, files: liveFiles}
	var deadPacks []uint64
	deadOpen := false
	s.mu.Lock()
	cur := s.shared
	s.mu.Unlock()
	// Find what is dead in one read transaction, then remove it in one
	// commit (a metadata-log frame, then the index). gcMu and nsMu are held,
	// so nothing commits in between.
	var recs []record
	err = s.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketChunks).ForEach(func(k, v []byte) error {
			var id ID
			copy(id[:], k)
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			kept := !liveChunk[id] && s.receivedSince(id, cutoff)
			if kept {
				res.ReceivedKept++
			}
			if liveChunk[id] || kept {
				livePack[l.Pack] = true
				liveBytes[l.Pack] += int64(l.Len)
				if opts.Compact {
					cin.chunks[l.Pack] = append(cin.chunks[l.Pack], chunkAt{id, l})
					cin.locs[id] = l
				}
				return nil
			}
			recs = append(recs, record{kind: recDelChunk, id: id})
			res.BytesRemoved += int64(l.Len)
			res.ChunksRemoved++
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketObjects).ForEach(func(k, _ []byte) error {
			var id ID
			copy(id[:], k)
			if !liveObj[id] {
				recs = append(recs, record{kind: recDelObject, id: id})
				res.ObjectsRemoved++
			}
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("pack key of %d bytes: %w", len(k), ErrCorrupt)
			}
			id := beUint64(k)
			pi, err := decodePackInfo(v)
			if err != nil {
				// Deleting packs while the index is unreadable could
				// delete live data: stop and let verify say more.
				return fmt.Errorf("pack %016x: %w", id, err)
			}
			packSize[id] = pi.Size
			cin.info[id] = pi
			if !livePack[id] {
				// The open shared pack too: no import runs (gcMu is
				// held), so nothing is pending in it, and it is retired
				// (rotated out below) like any pack nothing lives in.
				// Kept, it held the bytes of every file removed since
				// it opened until it filled up, dead but not freed.
				deadOpen = deadOpen || (cur != nil && cur.id == id)
				recs = append(recs, record{kind: recDelPack, pack: id})
				deadPacks = append(deadPacks, id)
			}
			return nil
		})
	})
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	if deadOpen {
		// New appends go to a new shared pack (sharedPackFor).
		s.sharedMu.Lock()
		s.mu.Lock()
		if s.shared == cur {
			s.shared = nil
			cur.f.Close()
		}
		s.mu.Unlock()
		s.sharedMu.Unlock()
	}
	if len(recs) > 0 {
		if err := s.commit(recs); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
		for _, r := range recs {
			if r.kind == recDelChunk {
				s.cache.remove(r.id)
			}
		}
	}
	var removed []record
	for _, id := range deadPacks {
		// A pack a read still leases is deleted when that read releases
		// it (packs.go); it is counted as removed: it is out of the index
		// and nothing can lease it again. Its removal intent stays until
		// the next Open, which finds the file gone or removes it.
		res.BytesFreed += allocated(s.fs, s.PackPath(id))
		gone, err := s.packs.retire(id)
		if err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
		res.PacksRemoved++
		if gone {
			removed = append(removed, record{kind: recAbandon, pack: id})
		}
	}
	if len(removed) > 0 {
		// The files are gone: clear their intents (a crash before this
		// leaves them for the next open, which finds nothing to remove).
		if err := s.fs.SyncDir(s.packsDir()); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
		if err := s.commit(removed); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
	}
	if err := s.pruneReceived(cutoff, liveChunk); err != nil {
		// The grace list only ever delays collection: a stale one is
		// rewritten at the next GC.
		s.log.Warn("gc: rewriting the list of chunks received from members", "err", err)
	}
	compacted := false
	if opts.Compact {
		c, err := s.compact(ctx, opts, cin)
		res.Compaction = c
		res.BytesFreed += c.BytesFreed
		if err != nil {
			return res, fmt.Errorf("gc: compact packs: %w", err)
		}
		for _, v := range c.victims {
			delete(liveBytes, v)
		}
		compacted = c.PacksCompacted > 0
	}
	for id, live := range liveBytes {
		res.DeadBytes += max(0, packSize[id]-live)
	}
	if len(recs) > 0 || compacted {
		// The log still holds what was just removed: rewrite it.
		if err := s.compactLog(); err != nil {
			return res, fmt.Errorf("gc: %w", err)
		}
	}
	s.saveLastGC(res)
	return res, nil
}

// LastGC is what the last completed GC freed, kept in the data directory
// (gc.json) for kylix df.
type LastGC struct {
	At             time.Time `json:"at"`
	BytesFreed     int64     `json:"bytes_freed"`
	PacksRemoved   int       `json:"packs_removed"`
	PacksCompacted int       `json:"packs_compacted"`
	BytesMoved     int64     `json:"bytes_moved"`
}

func (s *Store) lastGCPath() string { return filepath.Join(s.dir, "gc.json") }

// saveLastGC records res for df. It is a report, not store state: a failure
// to write it is logged and changes nothing else.
func (s *Store) saveLastGC(res GCResult) {
	b, err := json.Marshal(LastGC{At: s.clock.now().UTC(), BytesFreed: res.BytesFreed, PacksRemoved: res.PacksRemoved,
		PacksCompacted: res.PacksCompacted, BytesMoved: res.BytesMoved})
	if err == nil {
		tmp := s.lastGCPath() + ".tmp"
		if err = os.WriteFile(tmp, b, filePerm); err == nil {
			err = os.Rename(tmp, s.lastGCPath())
		}
	}
	if err != nil {
		s.log.Warn("recording the gc summary for kylix df", "err", err)
	}
}

func (s *Store) lastGC() *LastGC {
	b, err := os.ReadFile(s.lastGCPath())
	if err != nil {
		return nil
	}
	var l LastGC
	if json.Unmarshal(b, &l) != nil {
		return nil
	}
	return &l
}
