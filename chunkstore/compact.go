package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
)

// Pack compaction (docs/design/gc.md). A pack whose chunks are partly dead
// (files removed, other files' chunks still in it) keeps its dead bytes until
// every chunk in it is dead. Compaction copies the live chunks of such a pack
// into a new one, verifying each against its hash as it is copied, makes the
// new pack durable, logs the relocations in one metadata-log frame together
// with the new pack's commit and the old pack's removal, applies them to the
// index, and retires the old pack through the lease table (readers in flight
// keep it until they are done). A crash at any point leaves either the old
// layout (the new pack is an intent without a commit, removed at the next
// open) or the new one.

// DefaultCompactThreshold: a pack is compacted when at least this share of
// its disk space holds no live chunk.
const DefaultCompactThreshold = 0.25

// GCOptions configure Collect.
type GCOptions struct {
	// Compact rewrites packs whose dead share is at least
	// CompactThreshold.
	Compact bool
	// CompactThreshold is the dead share (0 < t <= 1) from which a pack is
	// compacted; 0 means DefaultCompactThreshold.
	CompactThreshold float64
	// MaxBytes bounds the live bytes one run copies (0: no bound). Packs
	// are taken deadest first; a pack that would pass the bound is left
	// for a later run.
	MaxBytes int64
	// Progress, if set, is called with the live bytes copied so far and
	// the total the run plans to copy.
	Progress func(done, total int64)
}

// Compaction says what compaction did.
type Compaction struct {
	PacksCompacted int   `json:"packs_compacted"`
	PacksWritten   int   `json:"packs_written"`
	ChunksMoved    int   `json:"chunks_moved"`
	BytesMoved     int64 `json:"bytes_moved"`
	// BytesFreed: disk space given back by compaction (blocks of the packs
	// retired minus blocks of the packs written).
	BytesFreed int64 `json:"bytes_freed_by_compaction"`
	// WholeFileKept: packs holding exactly one live file (FUSE
	// passthrough serves them) that were left whole whatever their dead
	// share (their "dead" bytes are that file's in-place duplicates).
	WholeFileKept int `json:"whole_file_packs_kept"`
	// Deferred: packs past the threshold left for a later run by MaxBytes.
	Deferred int `json:"packs_deferred"`
	// Skipped: packs left as they are because a live chunk in them does
	// not verify; the damaged bytes are never copied (run kylix verify).
	Skipped []string `json:"packs_skipped"`
	// Retained: compacted packs a read still held; deleted at its end.
	Retained int `json:"packs_retained_by_reads"`

	victims []uint64
}

type chunkAt struct {
	id  ID
	loc Location
}

// compactInput is what GC's mark and sweep found: the live chunks by pack,
// every live chunk's location, pack records, and the live files.
type compactInput struct {
	chunks map[uint64][]chunkAt
	locs   map[ID]Location
	info   map[uint64]packInfo
	files  []*FileManifest
}

// testHookCompact, when set (tests only), runs at named steps of compaction.
var testHookCompact func(step string)

func hook(step string) {
	if testHookCompact != nil {
		testHookCompact(step)
	}
}

// allocated is the disk space a pack file takes (its blocks; its size
// where the file system does not say).
func allocated(fsys vfs.FS, path string) int64 {
	st, err := fsys.Stat(path)
	if err != nil {
		return 0
	}
	return allocatedOf(st)
}

func allocatedOf(st fs.FileInfo) int64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

type victim struct {
	pack  uint64
	alloc int64   // blocks of the pack file
	live  int64   // bytes of its live chunks
	need  int64   // what they take compacted (compactedSize, aligned)
	dead  float64 // share of alloc compaction gives back
}

// compactedSize is how many bytes the chunks cs (sorted by offset) take in a
// compacted pack: each run of chunks that lay back to back (a file's region,
// or what is left of it) starts 4 KiB-aligned, as import lays out a small
// file's region in a shared pack (docs/design/store.md).
func compactedSize(cs []chunkAt) int64 {
	var off int64
	prevEnd := int64(-1)
	for _, c := range cs {
		if c.loc.Off != prevEnd {
			off = alignUp(off)
		}
		off += int64(c.loc.Len)
		prevEnd = c.loc.Off + int64(c.loc.Len)
	}
	return off
}

// compact runs with gcMu and nsMu held (Collect), so nothing commits meanwhile.
func (s *Store) compact(ctx context.Context, opts GCOptions, in compactInput) (Compaction, error) {
	var res Compaction
	res.Skipped = []string{}
	th := opts.CompactThreshold
	if th <= 0 {
		th = DefaultCompactThreshold
	}
	// Packs that back a live file whole (FUSE passthrough) stay whole.
	pinned := map[uint64]bool{}
	for _, m := range in.files {
		offs := make([]int64, len(m.Chunks))
		locs := make([]Location, len(m.Chunks))
		var off int64
		for i, c := range m.Chunks {
			offs[i] = off
			locs[i] = in.locs[c.ID]
			off += int64(c.Len)
		}
		if p := candidatePack(m.Size, offs, locs); p != 0 {
			if pi := in.info[p]; pi.Flags&packExclusive != 0 && pi.Flags&packWholeDropped == 0 && pi.Size == m.Size {
				pinned[p] = true
			}
		}
		// A live file's whole copy (whole.go) too: its "dead" bytes are
		// the file's second copies.
		if p := wholePack(m.Size, offs, locs, func(p uint64) (packInfo, bool) { pi, ok := in.info[p]; return pi, ok }); p != 0 {
			pinned[p] = true
		}
	}
	var vs []victim
	for p, cs := range in.chunks {
		alloc := allocated(s.fs, s.PackPath(p))
		sort.Slice(cs, func(i, j int) bool { return cs[i].loc.Off < cs[j].loc.Off })
		var live int64
		for _, c := range cs {
			live += int64(c.loc.Len)
		}
		// Dead is what compaction would give back: the space the live
		// chunks take once compacted (aligned regions) is not, so a pack
		// compacted before is not compacted again for its padding.
		need := alignUp(compactedSize(cs))
		if alloc <= need {
			continue
		}
		dead := float64(alloc-need) / float64(alloc)
		if dead < th {
			continue
		}
		if pinned[p] {
			res.WholeFileKept++
			continue
		}
		vs = append(vs, victim{pack: p, alloc: alloc, live: live, need: need, dead: dead})
	}
	sort.Slice(vs, func(i, j int) bool {
		if vs[i].dead != vs[j].dead {
			return vs[i].dead > vs[j].dead
		}
		return vs[i].pack < vs[j].pack
	})
	var total int64
	keep := vs[:0]
	for _, v := range vs {
		if opts.MaxBytes > 0 && total+v.live > opts.MaxBytes {
			res.Deferred++
			continue
		}
		total += v.live
		keep = append(keep, v)
	}
	vs = keep
	if len(vs) == 0 {
		return res, nil
	}
	// The node's current shared pack takes new appends; it can be a
	// victim only once it takes no more (no import runs: gcMu is held).
	s.sharedMu.Lock()
	s.mu.Lock()
	if sp := s.shared; sp != nil {
		for _, v := range vs {
			if v.pack == sp.id {
				s.shared = nil
				sp.f.Close()
				break
			}
		}
	}
	s.mu.Unlock()
	s.sharedMu.Unlock()

	c := &compactor{s: s, ctx: ctx, res: &res, total: total, progress: opts.Progress}
	defer c.abort()
	for _, v := range vs {
		if err := ctxErr(ctx); err != nil {
			return res, err
		}
		cs := in.chunks[v.pack]
		if c.f != nil && alignUp(c.w.off)+v.need > s.opts.SharedPackMax {
			if err := c.commit(); err != nil {
				return res, err
			}
		}
		if err := c.move(v, cs); err != nil {
			return res, err
		}
	}
	if err := c.commit(); err != nil {
		return res, err
	}
	return res, nil
}

// compactor writes one destination pack at a time.
type compactor struct {
	s        *Store
	ctx      context.Context
	res      *Compaction
	total    int64
	done     int64
	progress func(done, total int64)

	f       vfs.File // destination pack, nil when none is open
	pack    uint64
	w       *packWriter
	recs    []record // relocations into f
	victims []victim // packs fully moved into f
}

// move copies the live chunks of v into the destination pack, each verified
// as it is read. A chunk that does not verify stops the move of this pack:
// what was copied of it is cut off again and the pack stays as it is.
func (c *compactor) move(v victim, cs []chunkAt) error {
	s := c.s
	if c.f == nil {
		f, id, err := s.createPack(0)
		if err != nil {
			return err
		}
		c.f, c.pack, c.w = f, id, newPackWriter(f, 0)
		hook("created")
	}
	ls, err := s.packs.acquire(v.pack)
	if errors.Is(err, ErrNotLocal) {
		// Missing from disk: nothing to copy; verify names what is lost.
		c.res.Skipped = append(c.res.Skipped, fmt.Sprintf("%s: %v", s.PackPath(v.pack), err))
		return nil
	}
	if err != nil {
		return fmt.Errorf("pack %s: %w", s.PackPath(v.pack), err)
	}
	defer ls.Release()
	start, nrec, done0 := c.w.off, len(c.recs), c.done
	var buf []byte
	prevEnd := int64(-1)
	for _, ch := range cs {
		if err := ctxErr(c.ctx); err != nil {
			return err
		}
		if ch.loc.Off != prevEnd {
			// A region starts: 4 KiB-aligned (compactedSize).
			if pad := alignUp(c.w.off) - c.w.off; pad > 0 {
				if err := c.w.write(make([]byte, pad)); err != nil {
					return err
				}
			}
		}
		prevEnd = ch.loc.Off + int64(ch.loc.Len)
		if cap(buf) < int(ch.loc.Len) {
			buf = make([]byte, ch.loc.Len)
		}
		buf = buf[:ch.loc.Len]
		n, err := unix.Pread(ls.Fd(), buf, ch.loc.Off)
		bad := ""
		switch {
		case err != nil:
			bad = err.Error()
		case n != len(buf):
			bad = fmt.Sprintf("pack holds %d of its %d bytes", n, len(buf))
		case Sum(buf) != ch.id:
			bad = "hash mismatch"
		}
		if bad != "" {
			s.log.Error("chunk does not verify; its pack is not compacted (run kylix verify to list the files affected)",
				"chunk", ch.id.String(), "pack", s.PackPath(v.pack), "pack_offset", ch.loc.Off, "why", bad)
			c.res.Skipped = append(c.res.Skipped, fmt.Sprintf("%s: chunk %s at offset %d: %s", s.PackPath(v.pack), ch.id.Short(), ch.loc.Off, bad))
			if err := c.w.flush(); err != nil {
				return err
			}
			if err := c.f.Truncate(start); err != nil {
				return fmt.Errorf("cut back %s: %w", c.f.Name(), err)
			}
			c.w = newPackWriter(c.f, start)
			c.recs = c.recs[:nrec]
			c.done = done0
			return nil
		}
		off := c.w.off
		if err := c.w.write(buf); err != nil {
			return err
		}
		c.recs = append(c.recs, record{kind: recRelocate, id: ch.id, loc: Location{Pack: c.pack, Off: off, Len: ch.loc.Len}})
		c.done += int64(len(buf))
		if c.progress != nil {
			c.progress(c.done, c.total)
		}
	}
	c.victims = append(c.victims, v)
	return nil
}

// commit makes the destination pack durable and commits it with its
// relocations and the removal of the packs moved into it, then retires
// those packs.
func (c *compactor) commit() error {
	s := c.s
	if c.f == nil {
		return nil
	}
	if len(c.victims) == 0 {
		// Nothing verified: the pack holds nothing committed.
		c.abort()
		return nil
	}
	if err := c.w.flush(); err != nil {
		return err
	}
	if err := c.f.Sync(); err != nil {
		return fmt.Errorf("sync pack %s: %w", c.f.Name(), err)
	}
	if err := s.fs.SyncDir(s.packsDir()); err != nil {
		return fmt.Errorf("sync %s: %w", s.packsDir(), err)
	}
	hook("synced")
	recs := append([]record{{kind: recPack, pack: c.pack, info: packInfo{Size: c.w.off}}}, c.recs...)
	for _, v := range c.victims {
		recs = append(recs, record{kind: recDelPack, pack: v.pack})
	}
	if err := c.f.Close(); err != nil {
		return fmt.Errorf("close pack %s: %w", c.f.Name(), err)
	}
	c.f = nil
	if err := s.commit(recs); err != nil {
		return err
	}
	s.relocs.Add(1)
	hook("committed")
	c.res.PacksWritten++
	c.res.ChunksMoved += len(c.recs)
	for _, r := range c.recs {
		c.res.BytesMoved += int64(r.loc.Len)
	}
	c.res.BytesFreed -= allocated(s.fs, s.PackPath(c.pack))
	var removed []record
	for _, v := range c.victims {
		c.res.victims = append(c.res.victims, v.pack)
		c.res.PacksCompacted++
		c.res.BytesFreed += v.alloc
		gone, err := s.packs.retire(v.pack)
		if err != nil {
			return err
		}
		if gone {
			removed = append(removed, record{kind: recAbandon, pack: v.pack})
		} else {
			c.res.Retained++
		}
	}
	c.recs, c.victims = nil, nil
	hook("retired")
	if len(removed) > 0 {
		if err := s.fs.SyncDir(s.packsDir()); err != nil {
			return fmt.Errorf("sync %s: %w", s.packsDir(), err)
		}
		if err := s.commit(removed); err != nil {
			return err
		}
	}
	return nil
}

// abort removes a destination pack not committed (its intent makes the next
// open remove it if this fails).
func (c *compactor) abort() {
	if c.f == nil {
		return
	}
	_ = c.f.Close()
	if err := c.s.fs.Remove(c.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.s.log.Warn("removing an uncommitted compaction pack; the next open removes it", "pack", c.f.Name(), "err", err)
	}
	c.f = nil
}
