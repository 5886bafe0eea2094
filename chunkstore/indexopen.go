package chunkstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// guard turns a panic (bbolt panics on some damaged pages, e.g. "invalid
// freelist page") or a memory fault (a page of the mmap beyond a truncated
// file) in the calling goroutine into an error. Use it at the boundary where
// the index is first opened and read whole.
func guard(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading it failed: %v", r)
		}
	}()
	return fn()
}

// damaged is the error Open returns for an index it cannot use.
func damaged(dir, reason string) error {
	return fmt.Errorf("the index of %s is unusable: %s. Nothing was deleted and the packs are intact; rebuild the index from them with `kylix fsck --rebuild-index --data %s`: %w",
		dir, reason, dir, ErrIndexDamaged)
}

func openBolt(path string) (db *bolt.DB, err error) {
	var file *os.File
	err = guard(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second,
			OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := os.OpenFile(name, flag, perm)
				file = f
				return f, err
			}})
		return err
	})
	if err != nil && db == nil && file != nil {
		// bbolt panicked inside Open: release what it held. Its mmap
		// keeps the file (and so bbolt's flock on it) alive after close,
		// so unmap it too, or the next open in this process times out.
		unmapFile(file)
		file.Close()
	}
	return db, err
}

// unmapFile unmaps every mapping of f's file in this process.
func unmapFile(f *os.File) {
	st, err := f.Stat()
	if err != nil {
		return
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode path
		fields := strings.Fields(line)
		if len(fields) < 6 || fields[4] != strconv.FormatUint(sys.Ino, 10) {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		_, _, _ = syscall.Syscall(syscall.SYS_MUNMAP, uintptr(start), uintptr(end-start), 0)
	}
}

// precheckBolt reads index.db's two meta pages and checks that the file
// holds every page the newest valid one says the database has: a truncated
// index is reported as such instead of faulting inside bbolt.
func precheckBolt(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	type meta struct {
		pageSize, pgid, freelist, txid uint64
	}
	read := func(off int64) (meta, bool) {
		var b [16 + 64]byte
		if _, err := f.ReadAt(b[:], off); err != nil {
			return meta{}, false
		}
		m := b[16:]
		le := binary.LittleEndian
		if le.Uint32(m[0:]) != 0xED0CDAED || le.Uint32(m[4:]) != 2 {
			return meta{}, false
		}
		h := fnv.New64a()
		h.Write(m[:56])
		if h.Sum64() != le.Uint64(m[56:]) {
			return meta{}, false
		}
		return meta{pageSize: uint64(le.Uint32(m[8:])), freelist: le.Uint64(m[32:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, true
	}
	m0, ok0 := read(0)
	var m1 meta
	ok1 := false
	if ok0 {
		m1, ok1 = read(int64(m0.pageSize))
	} else {
		for _, ps := range []int64{4096, 16384, 65536} {
			if m1, ok1 = read(ps); ok1 && m1.pageSize == uint64(ps) {
				break
			}
			ok1 = false
		}
	}
	var m meta
	switch {
	case ok0 && ok1:
		m = m0
		if m1.txid > m0.txid {
			m = m1
		}
	case ok0:
		m = m0
	case ok1:
		m = m1
	default:
		return fmt.Errorf("neither meta page is valid (overwritten or zeroed)")
	}
	if need := m.pgid * m.pageSize; uint64(st.Size()) < need {
		return fmt.Errorf("truncated: %d bytes, its pages need %d", st.Size(), need)
	}
	if m.freelist != ^uint64(0) && m.freelist >= m.pgid {
		return fmt.Errorf("freelist page %d is past the end (%d pages)", m.freelist, m.pgid)
	}
	return nil
}

// walkIndex reads every record of the index once, decoding each, so that a
// damaged page is found now (where guard catches it) rather than by a reader
// later.
func walkIndex(db *bolt.DB) error {
	return guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{bucketChunks, bucketPacks, bucketObjects, bucketHeads, bucketMeta} {
				if tx.Bucket(name) == nil {
					return fmt.Errorf("bucket %q is missing", name)
				}
			}
			err := tx.Bucket(bucketChunks).ForEach(func(k, v []byte) error {
				if len(k) != IDSize {
					return fmt.Errorf("chunk key of %d bytes: %w", len(k), ErrCorrupt)
				}
				_, err := decodeLocation(v)
				return err
			})
			if err != nil {
				return err
			}
			err = tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
				if len(k) != 8 {
					return fmt.Errorf("pack key of %d bytes: %w", len(k), ErrCorrupt)
				}
				_, err := decodePackInfo(v)
				return err
			})
			if err != nil {
				return err
			}
			err = tx.Bucket(bucketObjects).ForEach(func(k, v []byte) error {
				if len(k) != IDSize {
					return fmt.Errorf("object key of %d bytes: %w", len(k), ErrCorrupt)
				}
				return nil
			})
			if err != nil {
				return err
			}
			err = tx.Bucket(bucketHeads).ForEach(func(k, v []byte) error {
				_, err := decodeHead(string(k), v)
				return err
			})
			if err != nil {
				return err
			}
			if _, _, err := getLogState(tx); err != nil {
				return err
			}
			if b := tx.Bucket(bucketIntents); b != nil {
				return b.ForEach(func(k, v []byte) error {
					if len(k) != 8 || len(v) != 1 {
						return fmt.Errorf("intent record: %w", ErrCorrupt)
					}
					return nil
				})
			}
			return nil
		})
	})
}

func (s *Store) packsDir() string { return filepath.Join(s.dir, "packs") }

// openIndex opens index.db and brings it level with the metadata log. It
// never deletes anything when the index is missing or unreadable: it
// returns ErrIndexDamaged (a brand-new data directory, with neither packs
// nor log records, just gets a new index).
func (s *Store) openIndex() error {
	pdir := s.packsDir()
	ents, err := s.fs.ReadDir(pdir)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	packs := 0
	for _, e := range ents {
		if _, ok := parsePackName(e.Name()); ok {
			packs++
		}
		if strings.HasSuffix(e.Name(), ".meta.tmp") {
			// Only a log compaction writes these, and it renames the
			// file before anything depends on it: a leftover is an
			// interrupted compaction whose source log is still whole.
			if err := s.fs.Remove(filepath.Join(pdir, e.Name())); err != nil {
				return fmt.Errorf("open: %w", err)
			}
		}
	}
	gens, err := scanLogs(s.fs, pdir)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	var gen uint64
	logRecords := false
	if len(gens) > 0 {
		gen = gens[len(gens)-1]
		st, err := s.fs.Stat(filepath.Join(pdir, logName(gen)))
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		logRecords = st.Size() > int64(len(logMagic))
	}
	hasData := packs > 0 || logRecords
	dbPath := filepath.Join(s.dir, "index.db")
	st, err := os.Lstat(dbPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if hasData {
			return damaged(s.dir, fmt.Sprintf("%s is missing while %d packs are present", dbPath, packs))
		}
	case err != nil:
		return fmt.Errorf("open index: %w", err)
	case !st.Mode().IsRegular():
		return damaged(s.dir, dbPath+" is not a regular file")
	case st.Size() == 0:
		if hasData {
			return damaged(s.dir, fmt.Sprintf("%s is empty (0 bytes) while %d packs are present", dbPath, packs))
		}
		if err := os.Remove(dbPath); err != nil {
			return fmt.Errorf("open index: %w", err)
		}
	}
	if st != nil && st.Size() > 0 {
		if err := precheckBolt(dbPath); err != nil {
			return damaged(s.dir, fmt.Sprintf("%s: %v", dbPath, err))
		}
	}
	db, err := openBolt(dbPath)
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("open index %s: %w", dbPath, err)
		}
		return damaged(s.dir, fmt.Sprintf("%s cannot be opened: %v", dbPath, err))
	}
	s.db = db
	if err := guard(func() error { return initIndex(db) }); err != nil {
		return damaged(s.dir, fmt.Sprintf("%s: %v", dbPath, err))
	}
	if err := walkIndex(db); err != nil {
		return damaged(s.dir, fmt.Sprintf("%s: %v", dbPath, err))
	}
	var state logState
	var have bool
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		state, have, err = getLogState(tx)
		return err
	}); err != nil {
		return damaged(s.dir, fmt.Sprintf("%s: %v", dbPath, err))
	}
	switch {
	case !have && logRecords:
		return damaged(s.dir, fmt.Sprintf("%s does not record which metadata log it caches (was it replaced?)", dbPath))
	case !have:
		// A new store, or one written before the metadata log existed:
		// the index is all there is, so write it down as the log. An
		// index that knows no pack while packs exist is not that (it is
		// a new file where the real one was lost): writing it down would
		// make an empty store of them.
		known := 0
		if err := db.View(func(tx *bolt.Tx) error {
			known = tx.Bucket(bucketPacks).Stats().KeyN
			return nil
		}); err != nil {
			return damaged(s.dir, fmt.Sprintf("%s: %v", dbPath, err))
		}
		if packs > 0 && known == 0 {
			return damaged(s.dir, fmt.Sprintf("%s lists no packs while %d are present", dbPath, packs))
		}
		if packs > 0 {
			s.log.Warn("writing the metadata log from the index (store written by an older kylix)", "dir", s.dir)
		}
		return s.adoptSnapshot(gen + 1)
	case state.gen > gen:
		s.log.Warn("metadata log missing; writing it again from the index", "dir", pdir, "generation", state.gen)
		return s.adoptSnapshot(state.gen + 1)
	case state.gen < gen:
		// A compaction renamed a new generation in and stopped before
		// the index recorded it: replaying it whole changes nothing the
		// index has and adds nothing it lacks.
		return s.replay(gen, 0)
	default:
		return s.replay(gen, state.off)
	}
}

// adoptSnapshot writes the index's content as log generation gen, makes it
// the current log and removes older generations.
func (s *Store) adoptSnapshot(gen uint64) error {
	l, err := writeSnapshotLog(s.fs, s.packsDir(), gen, s.db)
	if err != nil {
		return err
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return putLogState(tx, logState{gen: gen, off: l.size}) }); err != nil {
		l.close()
		return fmt.Errorf("open index: %w", err)
	}
	s.setLog(l)
	return nil
}

// setLog makes l the current log and removes older generations.
func (s *Store) setLog(l *metaLog) {
	if s.mlog != nil && s.mlog != l {
		s.mlog.close()
	}
	s.mlog = l
	gens, err := scanLogs(s.fs, l.dir)
	if err != nil {
		s.log.Warn("listing old metadata logs", "err", err)
		return
	}
	for _, g := range gens {
		if g < l.gen {
			if err := s.fs.Remove(filepath.Join(l.dir, logName(g))); err != nil {
				s.log.Warn("removing old metadata log", "err", err)
			}
		}
	}
}

// replay applies log generation gen from offset from to the index. A torn
// frame at the end (a crash while appending: its commit never reached the
// index) is cut off.
func (s *Store) replay(gen uint64, from int64) error {
	l, err := openLogFile(s.fs, s.packsDir(), gen)
	if err != nil {
		return err
	}
	if from > l.size {
		l.close()
		s.log.Warn("metadata log is shorter than the index says; writing it again from the index", "log", l.path())
		return s.adoptSnapshot(gen + 1)
	}
	var recs []record
	good, bad, err := readFrames(s.fs, l.path(), from, func(p []byte, _ int64) error {
		return decodeRecords(p, func(r record) error {
			recs = append(recs, r)
			return nil
		})
	})
	if err == nil && bad != nil && good < int64(len(logMagic)) {
		err = bad
	}
	if err != nil {
		l.close()
		return fmt.Errorf("metadata log %s: %w", l.path(), err)
	}
	if bad != nil {
		s.log.Warn("cutting off the torn end of the metadata log (a commit interrupted before it reached the index)", "log", l.path(), "at", good, "size", l.size, "why", bad)
		if err := l.f.Truncate(good); err != nil {
			l.close()
			return fmt.Errorf("metadata log %s: %w", l.path(), err)
		}
		if err := l.f.Sync(); err != nil {
			l.close()
			return fmt.Errorf("metadata log %s: %w", l.path(), err)
		}
		l.size = good
	}
	if len(recs) > 0 || from != good {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, r := range recs {
				if err := applyRecord(tx, r); err != nil {
					return err
				}
			}
			return putLogState(tx, logState{gen: gen, off: good})
		})
		s.commits.Add(1)
		if err != nil {
			l.close()
			return fmt.Errorf("replay metadata log: %w", err)
		}
	}
	s.setLog(l)
	return nil
}

// commit appends recs to the metadata log as one frame, syncs it, then
// applies them (with any intents logged since the last commit) to the index
// in one transaction. If the index transaction fails the frame is cut off
// the log again, so the commit has no effect.
func (s *Store) commit(recs []record) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	var payload []byte
	for _, r := range recs {
		payload = appendRecord(payload, r)
	}
	start, err := s.mlog.append(payload)
	if err != nil {
		return err
	}
	if s.testHookBeforeIndex != nil {
		if err := s.testHookBeforeIndex(); err != nil {
			return err // a simulated crash: no undo
		}
	}
	all := append(s.mlog.unapplied, recs...)
	err = s.db.Update(func(tx *bolt.Tx) error {
		for _, r := range all {
			if err := applyRecord(tx, r); err != nil {
				return err
			}
		}
		return putLogState(tx, logState{gen: s.mlog.gen, off: s.mlog.size})
	})
	s.commits.Add(1) // after the transaction: Root reads the head again
	if err != nil {
		s.mlog.undo(start)
		return fmt.Errorf("commit to index: %w", err)
	}
	s.mlog.unapplied = nil
	return nil
}

// logIntent records, durably, that pack id is about to be created.
func (s *Store) logIntent(id uint64, flags uint8) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	r := record{kind: recIntent, pack: id, info: packInfo{Flags: flags}}
	if _, err := s.mlog.append(appendRecord(nil, r)); err != nil {
		return err
	}
	s.mlog.unapplied = append(s.mlog.unapplied, r)
	return nil
}

// compactLog rewrites the metadata log as a snapshot of the index (after GC
// removed records, the log holds what no longer exists). Crash-safe: the new
// generation is complete on disk before it is renamed in, and the index
// records it after that (openIndex handles a crash between).
func (s *Store) compactLog() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if len(s.mlog.unapplied) > 0 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, r := range s.mlog.unapplied {
				if err := applyRecord(tx, r); err != nil {
					return err
				}
			}
			return putLogState(tx, logState{gen: s.mlog.gen, off: s.mlog.size})
		})
		s.commits.Add(1)
		if err != nil {
			return fmt.Errorf("compact metadata log: %w", err)
		}
		s.mlog.unapplied = nil
	}
	gen := s.mlog.gen + 1
	l, err := writeSnapshotLog(s.fs, s.packsDir(), gen, s.db)
	if err != nil {
		return err
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return putLogState(tx, logState{gen: gen, off: l.size}) }); err != nil {
		l.close()
		// The new generation must go: open would follow it, and commits
		// made from now on go to the old one.
		if rerr := s.fs.Remove(l.path()); rerr != nil {
			s.mlog.err = errors.Join(s.mlog.err, rerr)
		}
		return fmt.Errorf("compact metadata log: %w", err)
	}
	s.setLog(l)
	return nil
}
