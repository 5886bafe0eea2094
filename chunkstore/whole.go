package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Whole copies (docs/design/whole.md). A file that shares most of its
// chunks with others (a fine-tune of a stored base) has no pack holding
// exactly its bytes, so the mount cannot hand it to FUSE passthrough and
// the node serves every read. MakeWhole writes a new pack holding every
// byte of one file version at its own offset: the chunks only that file's
// own pack or the shared packs held move into it (their index locations
// change, as compaction moves chunks), the chunks other files' whole packs
// hold are stored a second time. The new pack is flagged packWhole, so it
// is the file's passthrough candidate (PassthroughCandidate) whatever
// share of the file its moved chunks are, and compaction keeps it whole
// while it is (compact.go). Its second copies are dead bytes to GC's
// accounting. DropWhole clears the flag: the pack is then an ordinary one,
// its second copies given back by the next compaction.
//
// Crash safety is compaction's: the pack is an intent until one commit
// logs it with the relocations; a crash before leaves the old layout and
// the next open removes the pack file.

// packWhole: the pack holds every byte of one file at its own offset (a
// whole copy, MakeWhole); the index locates some of them in it.
// packWholeDropped: it was one (DropWhole): no file's passthrough pack any
// more, an ordinary pack to compaction, and its chunks may move into a
// new whole copy.
const (
	packWhole        = 2
	packWholeDropped = 4
)

// MinWholeSize: smaller files are not given whole copies (they fit one
// read; what they cost is the open, which passthrough does not save).
const MinWholeSize = 1 << 20

// ErrNoWholeAnchor: every chunk of the file lies in another file's pack of
// its own, so a whole copy would hold no chunk the index locates in it and
// nothing would keep it.
var ErrNoWholeAnchor = errors.New("every chunk of it lies in other files' packs")

// WholeResult is what MakeWhole did.
type WholeResult struct {
	Pack uint64 `json:"pack"`
	Path string `json:"path"`
	// Bytes: the pack's size, the file's.
	Bytes int64 `json:"bytes"`
	// Moved, MovedBytes: chunks whose index location moved into the pack.
	Moved      int   `json:"chunks_moved"`
	MovedBytes int64 `json:"moved_bytes"`
	// CopyBytes: bytes stored a second time (Bytes - MovedBytes).
	CopyBytes int64         `json:"copy_bytes"`
	Elapsed   time.Duration `json:"elapsed_ns"`
}

// MakeWhole writes a whole copy of file version id (above). It fails with
// ErrNotWholeFile's opposite, ErrAlreadyWhole, when the file already has a
// passthrough candidate; ErrNotLocal when a chunk is not stored here;
// ErrNoWholeAnchor (above); ErrCorrupt, naming the chunk, when a chunk does
// not verify (nothing is committed). progress, if set, is told the bytes
// written so far.
func (s *Store) MakeWhole(ctx context.Context, id ID, progress func(done, total int64)) (WholeResult, error) {
	start := time.Now()
	var res WholeResult
	// Like an import: GC (which moves chunks) waits; imports, which only
	// add chunks and never move one, go on.
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	s.wholeMu.Lock()
	defer s.wholeMu.Unlock()
	f, err := s.OpenFile(id)
	if err != nil {
		return res, err
	}
	if f.Size() < MinWholeSize {
		return res, fmt.Errorf("whole copy of %s: %d bytes, under %d: not worth one", id.Short(), f.Size(), MinWholeSize)
	}
	if _, _, ok := f.PassthroughCandidate(); ok {
		return res, fmt.Errorf("whole copy of %s: %w", id.Short(), ErrAlreadyWhole)
	}
	info := map[uint64]packInfo{}
	if err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPacks)
		for i, l := range f.locs {
			if l.Pack == 0 {
				return fmt.Errorf("chunk %s at offset %d: %w", f.M.Chunks[i].ID.Short(), f.offs[i], ErrNotLocal)
			}
			if _, ok := info[l.Pack]; ok {
				continue
			}
			v := b.Get(packKey(l.Pack))
			if v == nil {
				return fmt.Errorf("pack %016x of chunk %s: %w", l.Pack, f.M.Chunks[i].ID.Short(), ErrNotFound)
			}
			pi, err := decodePackInfo(v)
			if err != nil {
				return err
			}
			info[l.Pack] = pi
		}
		return nil
	}); err != nil {
		return res, fmt.Errorf("whole copy of %s: %w", id.Short(), err)
	}
	// Chunks in a shared pack move, and those in an exclusive pack that
	// cannot be any file's whole pack: an import's pack that its file's
	// duplicates cut short (put.go), whose size is no live file's, or a
	// dropped whole copy (this file's, damaged or pushed out). Those
	// in a pack of a live file's size stay where they are: moving them
	// could take that file's pack from it.
	sizes, err := s.liveFileSizes(ctx)
	if err != nil {
		return res, fmt.Errorf("whole copy of %s: %w", id.Short(), err)
	}
	movable := func(i int) bool {
		pi := info[f.locs[i].Pack]
		return pi.Flags&packExclusive == 0 || pi.Flags&packWholeDropped != 0 || (pi.Flags&packWhole == 0 && !sizes[pi.Size])
	}
	moved := map[ID]bool{}
	for i := range f.locs {
		if movable(i) {
			moved[f.M.Chunks[i].ID] = false
		}
	}
	if len(moved) == 0 {
		return res, fmt.Errorf("whole copy of %s: %w", id.Short(), ErrNoWholeAnchor)
	}
	pf, pack, err := s.createPack(packExclusive | packWhole)
	if err != nil {
		return res, err
	}
	committed := false
	defer func() {
		if !committed {
			pf.Close()
			s.fs.Remove(pf.Name()) // its intent makes the next open remove it if this fails
		}
	}()
	w := newPackWriter(pf, 0)
	var recs []record
	buf := make([]byte, 0, 4<<20)
	for i, l := range f.locs {
		if err := ctxErr(ctx); err != nil {
			return res, err
		}
		c := f.M.Chunks[i]
		buf = buf[:c.Len]
		ls, err := s.packs.acquire(l.Pack)
		if err != nil {
			return res, fmt.Errorf("whole copy of %s: pack %s: %w", id.Short(), s.PackPath(l.Pack), err)
		}
		n, err := unix.Pread(ls.Fd(), buf, l.Off)
		ls.Release()
		switch {
		case err != nil:
			return res, fmt.Errorf("whole copy of %s: reading chunk %s from %s: %w", id.Short(), c.ID.Short(), s.PackPath(l.Pack), err)
		case n != len(buf) || Sum(buf) != c.ID:
			return res, fmt.Errorf("whole copy of %s: chunk %s at offset %d of %s: %w (kylix verify names the files it affects)", id.Short(), c.ID.Short(), l.Off, s.PackPath(l.Pack), ErrCorrupt)
		}
		if w.off != f.offs[i] {
			return res, fmt.Errorf("whole copy of %s: writing at %d, chunk %d starts at %d", id.Short(), w.off, i, f.offs[i])
		}
		if err := w.write(buf); err != nil {
			return res, err
		}
		if done, ok := moved[c.ID]; ok && !done {
			moved[c.ID] = true
			recs = append(recs, record{kind: recRelocate, id: c.ID, loc: Location{Pack: pack, Off: f.offs[i], Len: c.Len}})
			res.Moved++
			res.MovedBytes += int64(c.Len)
		}
		if progress != nil {
			progress(w.off, f.Size())
		}
	}
	if err := w.flush(); err != nil {
		return res, err
	}
	if err := pf.Sync(); err != nil {
		return res, fmt.Errorf("sync pack %s: %w", pf.Name(), err)
	}
	if err := s.fs.SyncDir(s.packsDir()); err != nil {
		return res, fmt.Errorf("sync %s: %w", s.packsDir(), err)
	}
	recs = append([]record{{kind: recPack, pack: pack, info: packInfo{Size: w.off, Flags: packExclusive | packWhole}}}, recs...)
	if err := pf.Close(); err != nil {
		return res, fmt.Errorf("close pack %s: %w", pf.Name(), err)
	}
	if err := s.commit(recs); err != nil {
		return res, err
	}
	committed = true
	s.relocs.Add(1)
	res.Pack, res.Path, res.Bytes = pack, s.PackPath(pack), w.off
	res.CopyBytes = res.Bytes - res.MovedBytes
	res.Elapsed = time.Since(start)
	// Every byte written was hashed on its way in: that is the pack's
	// check for passthrough (docs/design/verification.md), under the
	// identity it has now.
	var st unix.Stat_t
	if unix.Stat(res.Path, &st) == nil {
		s.record(packFileKey{pack, id}, &PackCheck{Pack: pack, Path: res.Path, File: id, Identity: identityOf(&st),
			Chunks: len(f.M.Chunks), Bytes: res.Bytes, Elapsed: res.Elapsed, At: start, ByReads: true}, nil)
	}
	return res, nil
}

// DropWhole clears the whole flag of pack: it stops being any file's
// passthrough candidate now, and its second copies become ordinary dead
// bytes, given back by the next compaction (kylix gc).
func (s *Store) DropWhole(pack uint64) error {
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	var pi packInfo
	if err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketPacks).Get(packKey(pack))
		if v == nil {
			return fmt.Errorf("pack %016x: %w", pack, ErrNotFound)
		}
		var err error
		pi, err = decodePackInfo(v)
		return err
	}); err != nil {
		return err
	}
	if pi.Flags&packWhole == 0 {
		return fmt.Errorf("pack %016x is not a whole copy", pack)
	}
	pi.Flags = pi.Flags&^packWhole | packWholeDropped
	if err := s.commit([]record{{kind: recPack, pack: pack, info: pi}}); err != nil {
		return err
	}
	s.relocs.Add(1)
	return nil
}

// dropFailedWhole drops pack's whole flag if it has one (a failed check).
func (s *Store) dropFailedWhole(pack uint64) {
	var whole bool
	s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketPacks).Get(packKey(pack)); v != nil {
			pi, err := decodePackInfo(v)
			whole = err == nil && pi.Flags&packWhole != 0
		}
		return nil
	})
	if !whole {
		return
	}
	if err := s.DropWhole(pack); err != nil {
		s.log.Warn("a whole copy failed its check and could not be dropped", "pack", s.PackPath(pack), "err", err)
		return
	}
	s.log.Warn("a whole copy failed its check: dropped (its file is served by the node; kylix gc gives its space back)", "pack", s.PackPath(pack))
}

// WholeCopy is one whole copy in the store.
type WholeCopy struct {
	Pack uint64 `json:"pack"`
	Path string `json:"path"`
	// Bytes: the pack's size; LiveBytes: the chunks the index locates in
	// it (the rest are second copies: Bytes - LiveBytes).
	Bytes     int64 `json:"bytes"`
	LiveBytes int64 `json:"live_bytes"`
}

// SecondCopyBytes is what c stores a second time: the bytes of its file
// that the index locates elsewhere.
func (c WholeCopy) SecondCopyBytes() int64 { return c.Bytes - c.LiveBytes }

// WholeUsage is the number of whole copies and the bytes they store a
// second time (WholeCopies, added up). Counting reads the whole chunk
// index, so for reports (kylix node, du) a count is reused for
// wholeUsageFor while the set of whole packs (read from the small pack
// table) and the chunks' locations (compaction, MakeWhole) are unchanged;
// a store without whole copies reads no chunk.
func (s *Store) WholeUsage() (copies int, secondBytes int64, err error) {
	key := fmt.Sprint(s.relocs.Load(), s.wholePacks())
	u := &s.wholeUsage
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.key == key && time.Since(u.at) < wholeUsageFor {
		return u.n, u.b, nil
	}
	cs, err := s.WholeCopies()
	if err != nil {
		return 0, 0, err
	}
	for _, c := range cs {
		secondBytes += c.SecondCopyBytes()
	}
	u.key, u.at, u.n, u.b = key, time.Now(), len(cs), secondBytes
	return len(cs), secondBytes, nil
}

// wholeUsageFor: how long WholeUsage reuses a count.
const wholeUsageFor = 30 * time.Second

// wholeUsageCache is WholeUsage's last count.
type wholeUsageCache struct {
	mu  sync.Mutex
	key string
	at  time.Time
	n   int
	b   int64
}

// wholePacks is the ids of the packs flagged whole.
func (s *Store) wholePacks() []uint64 {
	var ids []uint64
	s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
			if pi, err := decodePackInfo(v); err == nil && pi.Flags&packWhole != 0 && len(k) == 8 {
				ids = append(ids, beUint64(k))
			}
			return nil
		})
	})
	return ids
}

// WholeCopies lists the store's whole copies. It reads the whole chunk
// index (to count what each holds live), so it is for reports and
// budgets, not for every read.
func (s *Store) WholeCopies() ([]WholeCopy, error) {
	var out []WholeCopy
	at := map[uint64]int{}
	err := s.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
			pi, err := decodePackInfo(v)
			if err != nil || pi.Flags&packWhole == 0 || len(k) != 8 {
				return err
			}
			id := beUint64(k)
			at[id] = len(out)
			out = append(out, WholeCopy{Pack: id, Path: s.PackPath(id), Bytes: pi.Size})
			return nil
		}); err != nil || len(out) == 0 {
			return err
		}
		return tx.Bucket(bucketChunks).ForEach(func(_, v []byte) error {
			l, err := decodeLocation(v)
			if err != nil {
				return err
			}
			if i, ok := at[l.Pack]; ok {
				out[i].LiveBytes += int64(l.Len)
			}
			return nil
		})
	})
	return out, err
}

// WholeCopy reports whether f has a whole copy (MakeWhole), which is then
// its passthrough candidate.
func (f *File) WholeCopy() bool {
	var p uint64
	f.s.db.View(func(tx *bolt.Tx) error {
		packs := tx.Bucket(bucketPacks)
		p = wholePack(f.M.Size, f.offs, f.locs, func(id uint64) (packInfo, bool) {
			v := packs.Get(packKey(id))
			if v == nil {
				return packInfo{}, false
			}
			pi, err := decodePackInfo(v)
			return pi, err == nil
		})
		return nil
	})
	return p != 0
}

// wholePack is the whole copy of a file among the packs holding its chunks
// at their own offsets (0: none): a pack flagged packWhole of the file's
// size. info looks a pack's record up.
func wholePack(size int64, offs []int64, locs []Location, info func(uint64) (packInfo, bool)) uint64 {
	seen := map[uint64]bool{}
	for i, l := range locs {
		if l.Pack == 0 || l.Off != offs[i] || seen[l.Pack] {
			continue
		}
		seen[l.Pack] = true
		if pi, ok := info(l.Pack); ok && pi.Flags&packWhole != 0 && pi.Size == size {
			return l.Pack
		}
	}
	return 0
}

// liveFileSizes is the set of the sizes of the files every head reaches.
func (s *Store) liveFileSizes(ctx context.Context) (map[int64]bool, error) {
	heads, err := s.Heads()
	if err != nil {
		return nil, err
	}
	sizes := map[int64]bool{}
	seen := map[ID]bool{}
	var walk func(dir ID) error
	walk = func(dir ID) error {
		if seen[dir] {
			return nil
		}
		seen[dir] = true
		if err := ctxErr(ctx); err != nil {
			return err
		}
		d, err := s.dirAt(dir)
		if err != nil {
			return err
		}
		for _, e := range d.Entries {
			switch {
			case e.Deleted:
			case e.Kind == KindFile:
				sizes[e.Size] = true
			case e.Kind == KindDir:
				if err := walk(e.ID); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, h := range heads {
		if err := walk(h.Root); err != nil {
			return nil, fmt.Errorf("reading the namespace: %w", err)
		}
	}
	return sizes, nil
}
