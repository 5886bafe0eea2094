package chunkstore

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Last-read days (docs/design/erasure.md, "Tiers"): serve --cold-after
// moves files nobody read lately to the cold tier, so the store keeps,
// per file version (manifest id), the last day a user read it: the mount's
// open for reading, the client socket's (the shim, GPU fills) and kylix
// load call NoteRead; listings, stat and warm do not. A day at most once a
// day per file reaches the index, in the bucket lastread (not in the
// metadata log: a hint, which an index rebuilt from the log forgets, and a
// file then counts from its mtime). NoteRead keeps the days in memory and
// FlushLastRead (and Close) writes them.

var bucketLastRead = []byte("lastread")

// lastReadFlushAt is how many days noted in memory start a flush.
const lastReadFlushAt = 4096

type lastReads struct {
	mu sync.Mutex
	// today: the versions noted on day cur (emptied when the day changes:
	// about 60 bytes a file read that day); dirty: days noted and not in
	// the index yet.
	cur      uint32
	noted    map[ID]bool
	dirty    map[ID]uint32
	flushing bool
	now      func() time.Time // nil: time.Now (tests move it)
}

func (l *lastReads) today() uint32 {
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	return uint32(now().Unix() / 86400)
}

// NoteRead records that the file version id was read today.
func (s *Store) NoteRead(id ID) {
	l := &s.lastRead
	l.mu.Lock()
	d := l.today()
	if d != l.cur || l.noted == nil {
		l.cur, l.noted = d, map[ID]bool{}
	}
	if l.noted[id] {
		l.mu.Unlock()
		return
	}
	if l.dirty == nil {
		l.dirty = map[ID]uint32{}
	}
	l.noted[id], l.dirty[id] = true, d
	start := len(l.dirty) >= lastReadFlushAt && !l.flushing
	l.flushing = l.flushing || start
	l.mu.Unlock()
	if start {
		go func() {
			if err := s.FlushLastRead(); err != nil {
				// The days stay in memory for the next flush (and Close).
				s.log.Warn("could not record when files were last read; will retry", "err", err)
			}
			l.mu.Lock()
			l.flushing = false
			l.mu.Unlock()
		}()
	}
}

// FlushLastRead writes the days noted since the last flush to the index.
func (s *Store) FlushLastRead() error {
	l := &s.lastRead
	l.mu.Lock()
	dirty := l.dirty
	l.dirty = map[ID]uint32{}
	l.mu.Unlock()
	if len(dirty) == 0 {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketLastRead)
		if err != nil {
			return err
		}
		var v [4]byte
		for id, d := range dirty {
			binary.BigEndian.PutUint32(v[:], d)
			if err := b.Put(id[:], v[:]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		l.mu.Lock()
		for id, d := range dirty {
			if l.dirty[id] < d {
				l.dirty[id] = d
			}
		}
		l.mu.Unlock()
		return fmt.Errorf("recording the last-read days of %d files: %w", len(dirty), err)
	}
	return nil
}

// LastRead returns the end of the last day (UTC) the file version id was
// read: a read counts until its day ends, so a policy at day resolution
// never takes a file read since (false: never read, as far as this store
// knows).
func (s *Store) LastRead(id ID) (time.Time, bool) {
	l := &s.lastRead
	l.mu.Lock()
	d, ok := l.cur, l.noted[id]
	if !ok {
		d, ok = l.dirty[id]
	}
	l.mu.Unlock()
	if !ok {
		s.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(bucketLastRead); b != nil {
				if v := b.Get(id[:]); len(v) == 4 {
					d, ok = binary.BigEndian.Uint32(v), true
				}
			}
			return nil
		})
	}
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(int64(d+1)*86400, 0), true
}
