package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
)

// RebuildReport says what RebuildIndex found and did.
type RebuildReport struct {
	Log     string `json:"log"`
	Records int    `json:"records"`
	Chunks  int    `json:"chunks"`
	Objects int    `json:"objects"`
	Packs   int    `json:"packs"`
	Heads   int    `json:"heads"`
	// Dropped lists chunks whose bytes in their pack do not hash to their
	// ID (or cannot be read): they are left out of the new index, and
	// verify names the files that lose data.
	Dropped []string `json:"dropped_chunks"`
	// LogDamage says where the log could not be read further, if it could
	// not be read to its end; a copy of the whole log is kept at SavedLog.
	LogDamage string `json:"log_damage,omitempty"`
	SavedLog  string `json:"saved_log,omitempty"`
	// Unreferenced lists pack files that no log record mentions.
	Unreferenced []string `json:"unreferenced_packs"`
}

// RebuildIndex recreates the index of the data directory opts.Dir from the
// metadata log in its packs directory, the store's durable record (the old
// index.db is not read, so this works whatever state it is in). Every chunk's
// bytes are read from its pack and hashed; chunks that do not verify are left
// out and listed. The new index is written under a temporary name, synced and
// renamed over index.db, so an interrupted rebuild leaves the old one. The
// store must not be open elsewhere (the lock is taken).
func RebuildIndex(ctx context.Context, opts Options) (*RebuildReport, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	s := &Store{opts: opts, fs: opts.FS, dir: dir, log: opts.Logger}
	if _, err := os.Stat(s.packsDir()); err != nil {
		return nil, fmt.Errorf("rebuild index: %s is not a data directory: %w", dir, err)
	}
	if err := s.takeLock(); err != nil {
		return nil, err
	}
	defer s.lock.Close()
	gens, err := scanLogs(s.fs, s.packsDir())
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	if len(gens) == 0 {
		return nil, fmt.Errorf("rebuild index: %s holds no metadata log (packs/*.meta): the store was written by a kylix older than the log, or the log was removed; the index cannot be recreated from the packs alone", s.packsDir())
	}
	gen := gens[len(gens)-1]
	logPath := filepath.Join(s.packsDir(), logName(gen))
	rep := &RebuildReport{Log: logPath, Dropped: []string{}, Unreferenced: []string{}}

	tmp := filepath.Join(dir, "index.db.rebuild")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	db, err := bolt.Open(tmp, filePerm, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	ok := false
	defer func() {
		if db != nil {
			db.Close()
		}
		if !ok {
			os.Remove(tmp)
		}
	}()
	if err := initIndex(db); err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	good, bad, err := readFrames(s.fs, logPath, 0, func(p []byte, _ int64) error {
		return db.Update(func(tx *bolt.Tx) error {
			return decodeRecords(p, func(r record) error {
				rep.Records++
				return applyRecord(tx, r)
			})
		})
	})
	if err == nil && bad != nil && good < int64(len(logMagic)) {
		err = bad
	}
	if err != nil {
		return nil, fmt.Errorf("rebuild index: read %s: %w", logPath, err)
	}
	if bad != nil {
		// Keep the whole log as it was for inspection, then cut it where
		// it stops being readable: the new index follows the readable part.
		rep.LogDamage = bad.Error()
		rep.SavedLog = fmt.Sprintf("%s.damaged-%d", logPath, time.Now().Unix())
		if err := copyFile(logPath, rep.SavedLog); err != nil {
			return nil, fmt.Errorf("rebuild index: save damaged log: %w", err)
		}
		if err := s.fs.Truncate(logPath, good); err != nil {
			return nil, fmt.Errorf("rebuild index: %w", err)
		}
		s.log.Warn("metadata log damaged; rebuilt from the part before the damage", "log", logPath, "at", good, "why", bad, "saved", rep.SavedLog)
	}
	dropped, err := verifyIndexedChunks(ctx, s, db)
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	mlog, err := openLogFile(s.fs, s.packsDir(), gen)
	if err != nil {
		return nil, err
	}
	defer mlog.close()
	var recs []record
	for _, id := range dropped {
		rep.Dropped = append(rep.Dropped, id.String())
		recs = append(recs, record{kind: recDelChunk, id: id})
	}
	if len(recs) > 0 {
		// Record the removals in the log too, so a later import of the
		// same chunk (at a new, good location) is not shadowed by the bad
		// one on the next replay.
		var payload []byte
		for _, r := range recs {
			payload = appendRecord(payload, r)
		}
		if _, err := mlog.append(payload); err != nil {
			return nil, err
		}
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, r := range recs {
			if err := applyRecord(tx, r); err != nil {
				return err
			}
		}
		if err := putLogState(tx, logState{gen: gen, off: mlog.size}); err != nil {
			return err
		}
		rep.Chunks = tx.Bucket(bucketChunks).Stats().KeyN
		rep.Objects = tx.Bucket(bucketObjects).Stats().KeyN
		rep.Packs = tx.Bucket(bucketPacks).Stats().KeyN
		rep.Heads = tx.Bucket(bucketHeads).Stats().KeyN
		known := map[uint64]bool{}
		for _, b := range [][]byte{bucketPacks, bucketIntents} {
			if err := tx.Bucket(b).ForEach(func(k, _ []byte) error {
				known[beUint64(k)] = true
				return nil
			}); err != nil {
				return err
			}
		}
		ents, err := os.ReadDir(s.packsDir())
		if err != nil {
			return err
		}
		for _, e := range ents {
			if id, ok := parsePackName(e.Name()); ok && !known[id] {
				rep.Unreferenced = append(rep.Unreferenced, s.PackPath(id))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	if err := db.Sync(); err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	err = db.Close()
	db = nil
	if err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "index.db")); err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	if err := s.fs.SyncDir(dir); err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	ok = true
	return rep, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// verifyIndexedChunks reads every chunk the index db lists from its pack,
// on all cores, and returns those whose bytes do not hash to their ID.
func verifyIndexedChunks(ctx context.Context, s *Store, db *bolt.DB) ([]ID, error) {
	type item struct {
		id  ID
		loc Location
	}
	var items []item
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketChunks).ForEach(func(k, v []byte) error {
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			it := item{loc: l}
			copy(it.id[:], k)
			items = append(items, it)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i].loc, items[j].loc
		return a.Pack < b.Pack || (a.Pack == b.Pack && a.Off < b.Off)
	})
	var (
		mu      sync.Mutex
		files   = map[uint64]*os.File{}
		bad     []ID
		next    int
		wg      sync.WaitGroup
		openErr = map[uint64]error{}
	)
	open := func(p uint64) (*os.File, error) {
		mu.Lock()
		defer mu.Unlock()
		if f, ok := files[p]; ok {
			return f, nil
		}
		if err, ok := openErr[p]; ok {
			return nil, err
		}
		f, err := os.Open(s.PackPath(p))
		if err != nil {
			openErr[p] = err
			return nil, err
		}
		files[p] = f
		return f, nil
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for ctx.Err() == nil {
				mu.Lock()
				if next >= len(items) {
					mu.Unlock()
					return
				}
				it := items[next]
				next++
				mu.Unlock()
				ok := false
				if f, err := open(it.loc.Pack); err == nil {
					if cap(buf) < int(it.loc.Len) {
						buf = make([]byte, it.loc.Len)
					}
					buf = buf[:it.loc.Len]
					if _, err := f.ReadAt(buf, it.loc.Off); err == nil && Sum(buf) == it.id {
						ok = true
					}
				}
				if !ok {
					mu.Lock()
					bad = append(bad, it.id)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sort.Slice(bad, func(i, j int) bool { return bytes.Compare(bad[i][:], bad[j][:]) < 0 })
	return bad, nil
}

// FsckReport compares the index with the metadata log and the pack files.
type FsckReport struct {
	Log     string `json:"log"`
	Records int    `json:"records"`
	// Differences between the index and a replay of the log, per bucket.
	Missing   map[string]int `json:"missing_from_index"`
	Extra     map[string]int `json:"extra_in_index"`
	Different map[string]int `json:"different"`
	LogDamage string         `json:"log_damage,omitempty"`
	// Pack files no record mentions; packs the index lists that are
	// missing or shorter than committed.
	Unreferenced []string `json:"unreferenced_packs"`
	MissingPacks []string `json:"missing_packs"`
	ShortPacks   []string `json:"short_packs"`
}

// OK reports whether index, log and packs agree.
func (r *FsckReport) OK() bool {
	return len(r.Missing) == 0 && len(r.Extra) == 0 && len(r.Different) == 0 && r.LogDamage == "" &&
		len(r.Unreferenced) == 0 && len(r.MissingPacks) == 0 && len(r.ShortPacks) == 0
}

// Fsck replays the metadata log into a scratch index and compares it, record
// by record, with the store's index; and checks that every pack the index
// lists exists at its committed size and that every pack file is known. It
// changes nothing (kylix verify re-hashes the data itself).
func (s *Store) Fsck(ctx context.Context) (*FsckReport, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	rep := &FsckReport{Log: s.mlog.path(), Missing: map[string]int{}, Extra: map[string]int{}, Different: map[string]int{},
		Unreferenced: []string{}, MissingPacks: []string{}, ShortPacks: []string{}}
	scratch, err := os.CreateTemp(s.dir, "fsck-*.db")
	if err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	name := scratch.Name()
	scratch.Close()
	defer os.Remove(name)
	db, err := bolt.Open(name, filePerm, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	defer db.Close()
	if err := initIndex(db); err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	_, bad, err := readFrames(s.fs, s.mlog.path(), 0, func(p []byte, end int64) error {
		if end > s.mlog.size {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return db.Update(func(tx *bolt.Tx) error {
			return decodeRecords(p, func(r record) error {
				rep.Records++
				return applyRecord(tx, r)
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("fsck: read %s: %w", s.mlog.path(), err)
	}
	if bad != nil {
		rep.LogDamage = bad.Error()
	}
	err = db.View(func(ltx *bolt.Tx) error {
		return s.db.View(func(itx *bolt.Tx) error {
			for _, b := range [][]byte{bucketChunks, bucketPacks, bucketObjects, bucketHeads} {
				lb, ib := ltx.Bucket(b), itx.Bucket(b)
				if err := lb.ForEach(func(k, v []byte) error {
					iv := ib.Get(k)
					switch {
					case iv == nil:
						rep.Missing[string(b)]++
					case !bytes.Equal(iv, v):
						rep.Different[string(b)]++
					}
					return nil
				}); err != nil {
					return err
				}
				if err := ib.ForEach(func(k, _ []byte) error {
					if lb.Get(k) == nil {
						rep.Extra[string(b)]++
					}
					return nil
				}); err != nil {
					return err
				}
			}
			return itx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
				id := beUint64(k)
				pi, err := decodePackInfo(v)
				if err != nil {
					return err
				}
				st, err := os.Stat(s.PackPath(id))
				switch {
				case err != nil:
					rep.MissingPacks = append(rep.MissingPacks, s.PackPath(id))
				case st.Size() < pi.Size:
					rep.ShortPacks = append(rep.ShortPacks, fmt.Sprintf("%s (%d bytes, %d committed)", s.PackPath(id), st.Size(), pi.Size))
				}
				return nil
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	// Known packs: those the index lists, committed or begun.
	known := map[uint64]bool{}
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPacks, bucketIntents} {
			if err := tx.Bucket(b).ForEach(func(k, _ []byte) error {
				known[beUint64(k)] = true
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	for _, r := range s.mlog.unapplied {
		known[r.pack] = true
	}
	ents, err := os.ReadDir(s.packsDir())
	if err != nil {
		return nil, fmt.Errorf("fsck: %w", err)
	}
	for _, e := range ents {
		if id, ok := parsePackName(e.Name()); ok && !known[id] {
			rep.Unreferenced = append(rep.Unreferenced, s.PackPath(id))
		}
	}
	for _, m := range []map[string]int{rep.Missing, rep.Extra, rep.Different} {
		for k, v := range m {
			if v == 0 {
				delete(m, k)
			}
		}
	}
	return rep, nil
}
