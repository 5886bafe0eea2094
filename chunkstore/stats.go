package chunkstore

import (
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Stats describes the store's size.
type Stats struct {
	Dir string `json:"data_dir"`
	// LogicalBytes: the sizes of all files in the namespace added up, as
	// a user counting files would (a file under two names counts twice).
	LogicalBytes int64 `json:"logical_bytes"`
	Files        int64 `json:"files"`
	Dirs         int64 `json:"dirs"`
	// UniqueBytes: the bytes of distinct chunks in the index.
	UniqueBytes int64 `json:"unique_bytes"`
	Chunks      int64 `json:"chunks"`
	// StoredBytes: disk space the packs take (alignment padding and dead
	// bytes included).
	StoredBytes int64 `json:"stored_bytes"`
	// DiskBytes: the blocks the pack files take (du); less than
	// StoredBytes where holes were punched.
	DiskBytes int64 `json:"disk_bytes"`
	// DeadBytes: bytes of packs no indexed chunk occupies (removed files'
	// chunks not yet compacted, alignment, in-place duplicates of
	// whole-file packs); kylix gc compacts packs where they pass its
	// threshold (docs/design/gc.md).
	DeadBytes int64 `json:"dead_bytes"`
	// LastGC is the last completed kylix gc, if any.
	LastGC     *LastGC `json:"last_gc,omitempty"`
	Packs      int64   `json:"packs"`
	IndexBytes int64   `json:"index_bytes"`
	// DedupRatio is LogicalBytes / StoredBytes.
	DedupRatio float64 `json:"dedup_ratio"`
	IO         string  `json:"io"`
}

// String is a one-line summary.
func (s *Stats) String() string {
	return fmt.Sprintf("logical %d, stored %d, ratio %.2f", s.LogicalBytes, s.StoredBytes, s.DedupRatio)
}

// Stats returns the store's sizes.
func (s *Store) Stats() (*Stats, error) {
	st := &Stats{Dir: s.dir, IO: s.ioNote}
	// Sizes per directory manifest, memoised: a tree imported twice is
	// walked once.
	type sum struct{ bytes, files, dirs int64 }
	memo := map[ID]sum{}
	var dirSum func(id ID) (sum, error)
	dirSum = func(id ID) (sum, error) {
		if v, ok := memo[id]; ok {
			return v, nil
		}
		d, err := s.dirAt(id)
		if err != nil {
			return sum{}, err
		}
		var t sum
		for _, e := range d.Live() {
			switch e.Kind {
			case KindFile:
				t.bytes += e.Size
				t.files++
			case KindDir:
				c, err := dirSum(e.ID)
				if err != nil {
					return sum{}, err
				}
				t.bytes += c.bytes
				t.files += c.files
				t.dirs += c.dirs + 1
			}
		}
		memo[id] = t
		return t, nil
	}
	root, _, err := s.Root()
	if err != nil {
		return nil, err
	}
	t, err := dirSum(root)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	st.LogicalBytes, st.Files, st.Dirs = t.bytes, t.files, t.dirs
	err = s.db.View(func(tx *bolt.Tx) error {
		st.IndexBytes = tx.Size()
		live := map[uint64]int64{}
		if err := tx.Bucket(bucketChunks).ForEach(func(k, v []byte) error {
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			live[l.Pack] += int64(l.Len)
			st.UniqueBytes += int64(l.Len)
			st.Chunks++
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
			st.Packs++
			if fi, err := os.Stat(s.PackPath(beUint64(k))); err == nil {
				st.StoredBytes += fi.Size()
				st.DiskBytes += allocatedOf(fi)
				st.DeadBytes += max(0, fi.Size()-live[beUint64(k)])
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	st.LastGC = s.lastGC()
	if st.StoredBytes > 0 {
		st.DedupRatio = float64(st.LogicalBytes) / float64(st.StoredBytes)
	}
	return st, nil
}
