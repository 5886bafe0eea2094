package chunkstore

import (
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ErrBusy: DropChunks did nothing because an import (or GC) is running;
// call again later.
var ErrBusy = errors.New("an import or gc is running")

// DropChunks removes the given chunks from this store's index even though
// the namespace may still name them: a cluster member drops the copies it
// no longer owns once their owners hold them (peers, rebalance). Reads of
// them then go to the Fetcher. The pack bytes stay until the next GC, which
// deletes packs left without a chunk and compacts the others. While an
// import or GC runs it drops nothing and returns ErrBusy (an import that
// found a chunk here must not lose it in between, and waiting would stall
// every import behind the one running). It returns the chunks and bytes dropped (ids not stored here are
// skipped).
func (s *Store) DropChunks(ctx context.Context, ids []ID) (int, int64, error) {
	if !s.gcMu.TryLock() {
		return 0, 0, ErrBusy
	}
	defer s.gcMu.Unlock()
	var recs []record
	var bytes int64
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketChunks)
		for _, id := range ids {
			if err := ctxErr(ctx); err != nil {
				return err
			}
			v := b.Get(id[:])
			if v == nil {
				continue
			}
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			recs = append(recs, record{kind: recDelChunk, id: id})
			bytes += int64(l.Len)
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("drop chunks: %w", err)
	}
	if len(recs) == 0 {
		return 0, 0, nil
	}
	if err := s.commit(recs); err != nil {
		return 0, 0, fmt.Errorf("drop chunks: %w", err)
	}
	return len(recs), bytes, nil
}
