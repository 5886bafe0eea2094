package chunkstore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// GCResult sums up a garbage collection.
type GCResult struct {
	ChunksRemoved  int   `json:"chunks_removed"`
	BytesRemoved   int64 `json:"bytes_removed"`
	ObjectsRemoved int   `json:"objects_removed"`
	PacksRemoved   int   `json:"packs_removed"`
	// DeadBytes are bytes no chunk uses any more inside packs that still hold
	// live chunks; they are reclaimed only when the whole pack is unused.
	DeadBytes int64 `json:"dead_bytes_in_live_packs"`
}

// GC removes every chunk and object that no head reaches, and deletes packs
// that no longer hold a live chunk. It waits for running imports to finish.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	var res GCResult
	liveObj := map[ID]bool{Sum(emptyDir): true}
	liveChunk := map[ID]bool{}
	heads, err := s.Heads()
	if err != nil {
		return res, fmt.Errorf("chunkstore: gc: %w", err)
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
			for _, c := range m.Chunks {
				liveChunk[c.ID] = true
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
			return res, fmt.Errorf("chunkstore: gc: mark from head %q: %w (run kylix verify)", h.Name, err)
		}
	}
	livePack := map[uint64]bool{}
	liveBytes := map[uint64]int64{}
	packSize := map[uint64]int64{}
	var deadPacks []uint64
	err = s.db.Update(func(tx *bolt.Tx) error {
		cb := tx.Bucket(bucketChunks)
		var dead [][]byte
		err := cb.ForEach(func(k, v []byte) error {
			var id ID
			copy(id[:], k)
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			if liveChunk[id] {
				livePack[l.Pack] = true
				liveBytes[l.Pack] += int64(l.Len)
				return nil
			}
			dead = append(dead, append([]byte(nil), k...))
			res.BytesRemoved += int64(l.Len)
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range dead {
			if err := cb.Delete(k); err != nil {
				return err
			}
			var id ID
			copy(id[:], k)
			s.cache.remove(id)
		}
		res.ChunksRemoved = len(dead)
		ob := tx.Bucket(bucketObjects)
		var deadObj [][]byte
		ob.ForEach(func(k, _ []byte) error {
			var id ID
			copy(id[:], k)
			if !liveObj[id] {
				deadObj = append(deadObj, append([]byte(nil), k...))
			}
			return nil
		})
		for _, k := range deadObj {
			if err := ob.Delete(k); err != nil {
				return err
			}
		}
		res.ObjectsRemoved = len(deadObj)
		pb := tx.Bucket(bucketPacks)
		var deadPackKeys [][]byte
		err = pb.ForEach(func(k, v []byte) error {
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
			if !livePack[id] {
				deadPackKeys = append(deadPackKeys, append([]byte(nil), k...))
				deadPacks = append(deadPacks, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range deadPackKeys {
			if err := pb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("chunkstore: gc: %w", err)
	}
	s.mu.Lock()
	cur := s.shared
	s.mu.Unlock()
	for _, id := range deadPacks {
		if cur != nil && cur.id == id {
			// The open shared pack keeps its file; new appends go after it.
			continue
		}
		// A pack a read still leases is deleted when that read releases
		// it (packs.go); it is counted as removed: it is out of the index
		// and nothing can lease it again.
		if err := s.packs.retire(id); err != nil {
			return res, fmt.Errorf("chunkstore: gc: %w", err)
		}
		res.PacksRemoved++
	}
	for id, live := range liveBytes {
		res.DeadBytes += max(0, packSize[id]-live)
	}
	return res, nil
}
