package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore/chunking"
	"github.com/kylix/kylix/chunkstore/internal/vfs"
)

// PutResult describes one file written by Importer.PutFile.
type PutResult struct {
	ID     ID // the file manifest
	Size   int64
	Format Format
	// FormatNote explains a fallback: a ".safetensors" file whose header was
	// rejected is stored byte for byte with content-defined chunking, and
	// this says why.
	FormatNote string
	Chunks     int
	NewChunks  int
	NewBytes   int64 // bytes written to packs
	DedupBytes int64 // bytes already in the store (or earlier in this file)
	// DupCopyBytes: duplicate bytes stored again, in place, so that the
	// file's pack holds exactly the file (FUSE passthrough); see
	// exclusiveSink.
	DupCopyBytes int64
}

// Importer writes files into the store. Data it writes becomes durable and
// visible to other readers of the index at Flush (PutFile flushes after
// every large file, and small files in batches); Close flushes. An Importer
// is used by one goroutine at a time; several Importers may run at once.
//
// Until its data is referenced from a head, an Importer holds off garbage
// collection, so the caller must Close it after linking what it wrote into
// the namespace (or giving up).
type Importer struct {
	s *Store

	pending      map[ID]Location
	pendingPacks map[uint64]packInfo
	pendingObjs  [][]byte
	pendingBytes int64
	dirty        []vfs.File // packs with unsynced writes
	ownFiles     []vfs.File // exclusive pack writers to close after sync
	newFiles     bool       // a pack file was created: sync the directory
	closed       bool
	onChunk      func(ID, []byte) // ImportOptions.OnChunk
	received     []ID             // stored by PutReceived, not yet committed
}

// Flush thresholds for batches of small files.
const (
	flushPendingBytes = 64 << 20
	flushPendingObjs  = 4096
)

// NewImporter starts an import.
func (s *Store) NewImporter() *Importer {
	s.gcMu.RLock()
	return &Importer{
		s:            s,
		pending:      map[ID]Location{},
		pendingPacks: map[uint64]packInfo{},
	}
}

// Close flushes and ends the import.
func (im *Importer) Close() error {
	if im.closed {
		return nil
	}
	err := im.Flush()
	im.closed = true
	im.s.gcMu.RUnlock()
	return err
}

// Abort ends the import without committing what is pending: those bytes stay
// as garbage in packs until cut off at the next open or collected by GC.
func (im *Importer) Abort() {
	if im.closed {
		return
	}
	for _, f := range im.ownFiles {
		// Exclusive packs not yet flushed hold nothing committed: remove
		// them now rather than at the next open (their intent records
		// make that open find nothing left to do). A failed close or
		// remove loses nothing; the next open removes what is left.
		_ = f.Close()
		if err := im.s.fs.Remove(f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			im.s.log.Warn("removing pack of an aborted import; the next open removes it", "pack", f.Name(), "err", err)
		}
	}
	im.closed = true
	im.s.gcMu.RUnlock()
}

// PutFile stores the regular file f (named name, for format detection) and
// returns its manifest. The manifest is committed with the next Flush.
func (im *Importer) PutFile(ctx context.Context, f *os.File, name string, progress func(int64)) (PutResult, error) {
	if im.closed {
		return PutResult{}, fmt.Errorf("put %s: importer closed", name)
	}
	st, err := f.Stat()
	if err != nil {
		return PutResult{}, fmt.Errorf("put %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return PutResult{}, fmt.Errorf("put %s: not a regular file", name)
	}
	return im.PutReader(ctx, f, st.Size(), name, progress)
}

// PutReader stores the size bytes of r (named name, for format detection)
// as PutFile stores a file: r is read once, front to back in spans, and
// must not change meanwhile. The manifest is committed with the next Flush.
func (im *Importer) PutReader(ctx context.Context, f io.ReaderAt, size int64, name string, progress func(int64)) (PutResult, error) {
	if im.closed {
		return PutResult{}, fmt.Errorf("put %s: importer closed", name)
	}
	plan, err := planChunks(f, name, size)
	if err != nil {
		return PutResult{Size: size}, fmt.Errorf("put %s: %w", name, err)
	}
	return im.putPlanned(ctx, f, size, name, plan, progress)
}

// PutSafetensorsSpans stores the size bytes of r, a safetensors file, cut
// at the given spans (which must tile [0, size), none longer than
// MaxChunkLen) instead of at TensorSpans': a file made of pieces of
// another (a rank layout) cuts where that file's chunks are cut, so the
// pieces share their chunks.
func (im *Importer) PutSafetensorsSpans(ctx context.Context, f io.ReaderAt, size int64, name string, spans []chunking.Span, progress func(int64)) (PutResult, error) {
	if im.closed {
		return PutResult{}, fmt.Errorf("put %s: importer closed", name)
	}
	var at int64
	for _, sp := range spans {
		if sp.Off != at || sp.Len <= 0 || sp.Len > MaxChunkLen {
			return PutResult{Size: size}, fmt.Errorf("put %s: span [%d, +%d) does not follow [0, %d) or is out of range", name, sp.Off, sp.Len, at)
		}
		at += sp.Len
	}
	if at != size {
		return PutResult{Size: size}, fmt.Errorf("put %s: spans cover %d of %d bytes", name, at, size)
	}
	return im.putPlanned(ctx, f, size, name, chunkPlan{format: FormatSafetensors, spans: spans}, progress)
}

// putPlanned stores f cut as plan says.
func (im *Importer) putPlanned(ctx context.Context, f io.ReaderAt, size int64, name string, plan chunkPlan, progress func(int64)) (PutResult, error) {
	res := PutResult{Size: size, Format: plan.format, FormatNote: plan.note}

	var w chunkSink
	if size >= im.s.opts.LargeFileMin {
		w = &exclusiveSink{im: im, size: size}
	} else {
		w = &sharedSink{im: im}
	}
	m := &FileManifest{Size: size, Format: plan.format}
	seen := map[ID]bool{}
	err := forEachChunk(ctx, f, size, plan, progress, func(id ID, data []byte) error {
		if im.onChunk != nil {
			im.onChunk(id, data)
		}
		m.Chunks = append(m.Chunks, ChunkRef{ID: id, Len: uint32(len(data))})
		res.Chunks++
		have := seen[id]
		if !have {
			var err error
			if have, err = im.has(id); err != nil {
				return err
			}
		}
		if have {
			res.DedupBytes += int64(len(data))
			return w.dup(data)
		}
		seen[id] = true
		res.NewChunks++
		res.NewBytes += int64(len(data))
		return w.write(id, data)
	})
	if err == nil {
		err = w.finish()
	}
	if e, ok := w.(*exclusiveSink); ok && !e.dedup {
		res.DupCopyBytes = e.dupBytes
	}
	if err != nil {
		w.abort()
		return res, fmt.Errorf("put %s: %w", name, err)
	}
	obj := m.Encode()
	res.ID = Sum(obj)
	im.pendingObjs = append(im.pendingObjs, obj)
	im.pendingBytes += res.NewBytes
	if size >= im.s.opts.LargeFileMin || im.pendingBytes >= flushPendingBytes || len(im.pendingObjs) >= flushPendingObjs {
		if err := im.Flush(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// PutObject queues an encoded manifest for the next Flush and returns its ID.
func (im *Importer) PutObject(obj []byte) ID {
	im.pendingObjs = append(im.pendingObjs, obj)
	return Sum(obj)
}

// has reports whether chunk id is stored or pending in this import.
func (im *Importer) has(id ID) (bool, error) {
	if _, ok := im.pending[id]; ok {
		return true, nil
	}
	found := false
	err := im.s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketChunks).Get(id[:]) != nil
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("index lookup %s: %w", id.Short(), err)
	}
	return found, nil
}

// Flush makes everything written so far durable and commits it: first the
// pack bytes (fdatasync), then one metadata-log frame (appended and
// fdatasynced), then one index transaction caching the same records. A crash
// anywhere leaves either no trace of the commit or the whole of it in the
// log, which the next open applies to the index (docs/design/index.md).
func (im *Importer) Flush() error {
	if len(im.pending) == 0 && len(im.pendingObjs) == 0 {
		return nil
	}
	for _, f := range im.dirty {
		if err := f.Sync(); err != nil {
			im.s.retireShared(f)
			return fmt.Errorf("sync pack %s: %w", f.Name(), err)
		}
	}
	if im.newFiles {
		if err := im.s.fs.SyncDir(im.s.packsDir()); err != nil {
			return fmt.Errorf("sync %s: %w", im.s.packsDir(), err)
		}
	}
	var cerr error
	for _, f := range im.ownFiles {
		// Close after a successful fdatasync cannot lose data, but an
		// error here still means something is wrong with the disk.
		if err := f.Close(); err != nil && cerr == nil {
			cerr = fmt.Errorf("close pack %s: %w", f.Name(), err)
		}
	}
	im.dirty, im.ownFiles, im.newFiles = nil, nil, false
	if cerr != nil {
		return cerr
	}
	recs := make([]record, 0, len(im.pending)+len(im.pendingPacks)+len(im.pendingObjs))
	for pid, pi := range im.pendingPacks {
		recs = append(recs, record{kind: recPack, pack: pid, info: pi})
	}
	for id, loc := range im.pending {
		recs = append(recs, record{kind: recChunk, id: id, loc: loc})
	}
	for _, o := range im.pendingObjs {
		recs = append(recs, record{kind: recObject, obj: o, id: Sum(o)})
	}
	if err := im.s.commit(recs); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	im.s.noteReceived(im.received)
	im.received = im.received[:0]
	clear(im.pending)
	clear(im.pendingPacks)
	im.pendingObjs = im.pendingObjs[:0]
	im.pendingBytes = 0
	return nil
}

// allocPack returns a fresh pack id.
func (s *Store) allocPack() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nextPack == 0 {
		s.nextPack = 1 // 0 means "no pack"
	}
	id := s.nextPack
	s.nextPack++
	return id
}

// chunkSink receives a file's chunks in order: new ones through write,
// ones already stored (or earlier in the file) through dup.
type chunkSink interface {
	write(id ID, data []byte) error
	dup(data []byte) error
	finish() error
	abort()
}

// DupInPlaceMaxPercent: a large file whose duplicate bytes (chunks already
// stored, or repeated inside the file) are at most this share of its size
// is written whole into its own pack, duplicates included, so that the
// pack is exactly the file and FUSE passthrough serves it (the index keeps
// the chunk's first location; the second copy is proven by the pack check
// before any passthrough open, packverify.go). The price is those bytes
// stored twice: at most this share of the file. A file with more
// duplicates (a fine-tune sharing its base's tensors) is deduplicated and
// served by the node from several extents. Why 10% (docs/bench.md,
// "Passthrough verification and duplicates"): passthrough reads at the
// pack's speed, the node 2.3x slower on the H200 and 0.5-0.6x cold on the
// CPU machine, with a second copy in the page cache; a tenth more disk for
// that is taken, more is a derivative file that deduplication is for.
const DupInPlaceMaxPercent = 10

// exclusiveSink writes a large file into a pack of its own, contiguously
// from offset 0: its new chunks, and its duplicates too while they stay
// within DupInPlaceMaxPercent of the file's size. Once they pass it the
// file cannot be whole, so later duplicates are skipped and the space of
// the copies already written is given back (hole punched).
type exclusiveSink struct {
	im   *Importer
	size int64 // the file's size
	pack uint64
	f    vfs.File
	w    *packWriter
	locs map[ID]Location

	dedup    bool       // duplicates are no longer written
	dupBytes int64      // duplicate bytes seen (all written while !dedup)
	copies   [][2]int64 // pack ranges of the duplicate copies written
}

func (e *exclusiveSink) open() error {
	if e.f != nil {
		return nil
	}
	f, id, err := e.im.s.createPack(packExclusive)
	if err != nil {
		return err
	}
	e.pack = id
	e.f = f
	e.w = newPackWriter(f, 0)
	e.locs = map[ID]Location{}
	return nil
}

func (e *exclusiveSink) write(id ID, data []byte) error {
	if err := e.open(); err != nil {
		return err
	}
	off := e.w.off
	if err := e.w.write(data); err != nil {
		return err
	}
	e.locs[id] = Location{Pack: e.pack, Off: off, Len: uint32(len(data))}
	return nil
}

func (e *exclusiveSink) dup(data []byte) error {
	if e.dedup {
		return nil
	}
	e.dupBytes += int64(len(data))
	if e.dupBytes*100 > e.size*DupInPlaceMaxPercent {
		e.dedup = true
		return e.dropCopies()
	}
	if err := e.open(); err != nil {
		return err
	}
	off := e.w.off
	if err := e.w.write(data); err != nil {
		return err
	}
	e.copies = append(e.copies, [2]int64{off, int64(len(data))})
	return nil
}

// dropCopies punches holes over the duplicate copies written so far (the
// 4 KiB blocks wholly inside them) and writes zeros over what is left of
// them (the partial blocks at their ends, or all of it where the file
// system cannot punch holes): no index entry points there, and a pack
// handed out as shared must hold no byte that no live file names there
// (docs/design/client.md: zeros and holes are no one's bytes).
func (e *exclusiveSink) dropCopies() error {
	if e.f == nil || len(e.copies) == 0 {
		return nil
	}
	if err := e.w.flush(); err != nil {
		return err
	}
	// Copies written back to back are one range: fewer partial blocks.
	var rs [][2]int64 // [start, end)
	for _, c := range e.copies {
		if k := len(rs) - 1; k >= 0 && rs[k][1] == c[0] {
			rs[k][1] = c[0] + c[1]
			continue
		}
		rs = append(rs, [2]int64{c[0], c[0] + c[1]})
	}
	var zeros []byte
	zero := func(a, b int64) error {
		for a < b {
			n := min(b-a, 1<<20)
			if int64(len(zeros)) < n {
				zeros = make([]byte, n)
			}
			if err := writeFull(e.f, zeros[:n], a); err != nil {
				return err
			}
			a += n
		}
		return nil
	}
	for _, r := range rs {
		start, end := alignUp(r[0]), r[1]&^(packAlign-1)
		if end > start && unix.Fallocate(int(e.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, start, end-start) == nil {
			if err := zero(r[0], start); err != nil {
				return err
			}
			if err := zero(end, r[1]); err != nil {
				return err
			}
			continue
		}
		if err := zero(r[0], r[1]); err != nil {
			return err
		}
	}
	e.copies = nil
	return nil
}

func (e *exclusiveSink) finish() error {
	if e.f == nil {
		return nil
	}
	if len(e.locs) == 0 {
		// Nothing new (the file was stored before): the pack holds only
		// copies nobody needs.
		e.abort()
		return nil
	}
	if err := e.w.flush(); err != nil {
		return err
	}
	im := e.im
	for id, l := range e.locs {
		im.pending[id] = l
	}
	im.pendingPacks[e.pack] = packInfo{Size: e.w.off, Flags: packExclusive}
	im.dirty = append(im.dirty, e.f)
	im.ownFiles = append(im.ownFiles, e.f)
	im.newFiles = true
	return nil
}

func (e *exclusiveSink) abort() {
	if e.f != nil {
		// Best effort: the pack has an intent record and no commit, so
		// the next open removes it if this does not.
		_ = e.f.Close()
		if err := e.im.s.fs.Remove(e.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.im.s.log.Warn("removing pack of a failed write; the next open removes it", "pack", e.f.Name(), "err", err)
		}
	}
}

// sharedSink collects a small file's new chunks in memory and appends them to
// the current shared pack as one 4 KiB-aligned region.
type sharedSink struct {
	im     *Importer
	ids    []ID
	chunks [][]byte
	n      int64
}

func (w *sharedSink) write(id ID, data []byte) error {
	w.ids = append(w.ids, id)
	w.chunks = append(w.chunks, append([]byte(nil), data...))
	w.n += int64(len(data))
	return nil
}

func (w *sharedSink) finish() error {
	if len(w.ids) == 0 {
		return nil
	}
	s := w.im.s
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	sp, err := s.sharedPackFor(w.n)
	if err != nil {
		return err
	}
	start := alignUp(sp.size)
	pw := newPackWriter(sp.f, start)
	for _, c := range w.chunks {
		if err := pw.write(c); err != nil {
			return err
		}
	}
	if err := pw.flush(); err != nil {
		return err
	}
	sp.size = pw.off
	off := start
	for i, id := range w.ids {
		w.im.pending[id] = Location{Pack: sp.id, Off: off, Len: uint32(len(w.chunks[i]))}
		off += int64(len(w.chunks[i]))
	}
	w.im.pendingPacks[sp.id] = packInfo{Size: pw.off}
	w.im.dirty = append(w.im.dirty, sp.f)
	return nil
}

func (w *sharedSink) dup([]byte) error { return nil }

func (w *sharedSink) abort() {}

// sharedPackFor returns the shared pack to append n bytes to, opening a new
// one when the current one would grow past SharedPackMax. Caller holds sharedMu.
func (s *Store) sharedPackFor(n int64) (*sharedPack, error) {
	s.mu.Lock()
	sp := s.shared
	s.mu.Unlock()
	if sp != nil && alignUp(sp.size)+n <= s.opts.SharedPackMax {
		return sp, nil
	}
	f, id, err := s.createPack(0)
	if err != nil {
		return nil, err
	}
	if err := s.fs.SyncDir(s.packsDir()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("sync %s: %w", s.packsDir(), err)
	}
	s.mu.Lock()
	// The previous shared pack's file is not closed here: importers that
	// appended to it still hold it in their dirty list and sync it at their
	// next Flush (closing it made that Flush fail with EBADF). It is closed
	// by its finalizer once they let go of it.
	s.shared = &sharedPack{id: id, f: f}
	sp = s.shared
	s.mu.Unlock()
	return sp, nil
}

// retireShared stops appends to f if it is the current shared pack: after a
// failed fdatasync the kernel may have dropped its dirty pages while a later
// fdatasync reports success, so nothing more is committed in that file.
func (s *Store) retireShared(f vfs.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared != nil && s.shared.f == f {
		s.shared = nil
	}
}

// createPack allocates a pack id, records the intent to create it in the
// metadata log (synced), and only then creates the file. So a pack file the
// index does not know is removed at open only when the log proves it was
// begun and never committed.
func (s *Store) createPack(flags uint8) (vfs.File, uint64, error) {
	id := s.allocPack()
	if err := s.logIntent(id, flags); err != nil {
		return nil, 0, err
	}
	f, err := s.fs.OpenFile(s.PackPath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return nil, 0, fmt.Errorf("create pack: %w", err)
	}
	return f, id, nil
}

const packAlign = 4096

func alignUp(n int64) int64 { return (n + packAlign - 1) &^ (packAlign - 1) }

// packWriter buffers sequential writes to a pack at increasing offsets. It
// starts the writeback of what it wrote as it goes (sync_file_range), so the
// fdatasync before the commit finds most bytes on disk already and the disk
// works while the next chunks are read and hashed.
type packWriter struct {
	f       vfs.File
	off     int64 // offset of the next byte written (buffered or not)
	buf     []byte
	flushed int64 // bytes before this offset have been handed to writeback
}

// writebackEvery is how many written bytes start one writeback request.
const writebackEvery = 16 << 20

// startWriteback asks the kernel to start writing [w.flushed, upTo) to disk
// without waiting. Failure is harmless: fdatasync still does the work.
func (w *packWriter) startWriteback(upTo int64) {
	if upTo-w.flushed < writebackEvery {
		return
	}
	if fd := w.f.Fd(); fd != ^uintptr(0) {
		_ = unix.SyncFileRange(int(fd), w.flushed, upTo-w.flushed, unix.SYNC_FILE_RANGE_WRITE)
	}
	w.flushed = upTo
}

const packWriteBuf = 8 << 20

func newPackWriter(f vfs.File, off int64) *packWriter {
	return &packWriter{f: f, off: off, flushed: off}
}

func (w *packWriter) write(p []byte) error {
	if len(w.buf)+len(p) > packWriteBuf {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if len(p) >= packWriteBuf/2 {
		if err := w.flush(); err != nil {
			return err
		}
		if err := writeFull(w.f, p, w.off); err != nil {
			return err
		}
		w.off += int64(len(p))
		w.startWriteback(w.off)
		return nil
	}
	if cap(w.buf)-len(w.buf) < len(p) {
		// Grown to what is written, up to packWriteBuf: a small file's
		// few KiB must not cost an 8 MiB buffer the runtime zeroes
		// (each small file's import allocated one: docs/bench.md,
		// "Importing many small files").
		nb := make([]byte, len(w.buf), min(packWriteBuf, max(2*cap(w.buf), len(w.buf)+len(p), 64<<10)))
		copy(nb, w.buf)
		w.buf = nb
	}
	w.buf = append(w.buf, p...)
	w.off += int64(len(p))
	return nil
}

func (w *packWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if err := writeFull(w.f, w.buf, w.off-int64(len(w.buf))); err != nil {
		return err
	}
	w.startWriteback(w.off)
	w.buf = w.buf[:0]
	return nil
}

func writeFull(f vfs.File, p []byte, off int64) error {
	n, err := f.WriteAt(p, off)
	if err == nil && n != len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("write pack %s at %d: %w", f.Name(), off, err)
	}
	return nil
}

// chunkPlan says how to cut one file.
type chunkPlan struct {
	format Format
	note   string
	spans  []chunking.Span // tensor-aware spans; nil means content-defined
}

func planChunks(f io.ReaderAt, name string, size int64) (chunkPlan, error) {
	format, hdr, err := chunking.Detect(name, f, size)
	if err != nil {
		// A file named .safetensors whose header is malformed is still a
		// file the user wants stored byte for byte: say why it is not cut
		// at tensor boundaries.
		return chunkPlan{format: FormatOpaque, note: fmt.Sprintf("content-defined chunking: %v", err)}, nil
	}
	var spans func(io.ReaderAt, int64, *chunking.CDC) ([]chunking.Span, error)
	switch format {
	case chunking.FormatSafetensors:
		return chunkPlan{format: FormatSafetensors, spans: chunking.TensorSpans(hdr, size, chunking.DefaultTensorChunk)}, nil
	case chunking.FormatTar:
		spans = chunking.TarSpans
	case chunking.FormatLines:
		spans = chunking.LineSpans
	case chunking.FormatParquet:
		spans = chunking.ParquetSpans
	case chunking.FormatArrow:
		spans = chunking.ArrowSpans
	default:
		return chunkPlan{format: FormatOpaque}, nil
	}
	// Cut at records (docs/design/chunking.md, "Data sets"). The manifest
	// still says opaque: its format tells readers how to read the chunks,
	// and these are plain bytes to every reader.
	sp, err := spans(f, size, chunking.DefaultCDC())
	if errors.Is(err, chunking.ErrBadTar) || errors.Is(err, chunking.ErrBadParquet) || errors.Is(err, chunking.ErrBadArrow) {
		return chunkPlan{format: FormatOpaque, note: fmt.Sprintf("content-defined chunking: %v", err)}, nil
	}
	if err != nil {
		return chunkPlan{}, err
	}
	return chunkPlan{format: FormatOpaque, spans: sp}, nil
}

// chunkJob is one chunk moving through the import pipeline.
type chunkJob struct {
	buf  *[]byte
	data []byte
	id   ID
	done chan struct{}
}

// bufPool holds chunk buffers for reuse (putBuf keeps those up to 16
// MiB). getBuf makes a new one at the largest chunk either chunker cuts
// for a chunk of at least the content-defined minimum (so that buffers of
// a large file's chunks are reused whatever their length), and at the
// size asked for below it: a small file's only chunk must not cost a
// 4 MiB buffer the runtime zeroes.
var bufPool = sync.Pool{New: func() any {
	b := []byte(nil)
	return &b
}}

func getBuf(n int) *[]byte {
	b := bufPool.Get().(*[]byte)
	if cap(*b) < n {
		c := n
		if cdcMin, _, cdcMax := chunking.DefaultCDC().Sizes(); n >= cdcMin {
			c = max(n, int(chunking.DefaultTensorChunk), cdcMax)
		}
		nb := make([]byte, n, c)
		return &nb
	}
	*b = (*b)[:n]
	return b
}

func putBuf(b *[]byte) {
	if cap(*b) <= 16<<20 {
		bufPool.Put(b)
	}
}

// forEachChunk reads f, cuts it per plan, hashes chunks on all cores, and calls
// fn for each chunk in file order. fn's data is valid only during the call.
func forEachChunk(ctx context.Context, f io.ReaderAt, size int64, plan chunkPlan, progress func(int64), fn func(ID, []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const inflight = 8 // chunks read ahead of the writer: bounds memory to 8 x 16 MiB
	order := make(chan *chunkJob, inflight)
	hashq := make(chan *chunkJob, inflight)
	var readErr error
	go func() {
		defer close(order)
		defer close(hashq)
		emit := func(j *chunkJob) bool {
			j.done = make(chan struct{})
			select {
			case order <- j:
			case <-ctx.Done():
				return false
			}
			hashq <- j
			return true
		}
		readErr = produceChunks(ctx, f, size, plan, emit)
	}()
	workers := max(1, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range hashq {
				j.id = Sum(j.data)
				close(j.done)
			}
		}()
	}
	var err error
	for j := range order {
		<-j.done
		if err == nil {
			err = fn(j.id, j.data)
			if progress != nil {
				progress(int64(len(j.data)))
			}
			if err == nil {
				err = ctxErr(ctx)
			}
			if err != nil {
				cancel()
			}
		}
		putBuf(j.buf)
	}
	wg.Wait()
	if err != nil {
		return err
	}
	return readErr
}

// produceChunks reads f and emits its chunks in order.
func produceChunks(ctx context.Context, f io.ReaderAt, size int64, plan chunkPlan, emit func(*chunkJob) bool) error {
	if plan.spans != nil {
		for _, sp := range plan.spans {
			if sp.Len == 0 {
				continue
			}
			b := getBuf(int(sp.Len))
			if _, err := f.ReadAt(*b, sp.Off); err != nil {
				putBuf(b)
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("file shrank while being read (at %d): %w", sp.Off, io.ErrUnexpectedEOF)
				}
				return err
			}
			if !emit(&chunkJob{buf: b, data: *b}) {
				putBuf(b)
				return ctx.Err()
			}
		}
		return nil
	}
	cdc := chunking.DefaultCDC()
	_, _, maxLen := cdc.Sizes()
	// The window holds up to four of the longest chunks, and no more
	// than the file and one byte (which finds its end, or that it grew):
	// a small file's import must not zero a 16 MiB window.
	win := make([]byte, 0, min(int64(4*maxLen), size+1))
	var off int64
	eof := false
	for {
		for !eof && len(win) < 2*maxLen {
			if len(win) == cap(win) {
				// The file grew past its size: widen the window, and
				// the check after the loop reports the change.
				win = slices.Grow(win, 4*maxLen-len(win))
			}
			n, err := f.ReadAt(win[len(win):cap(win)], off)
			win = win[:len(win)+n]
			off += int64(n)
			if errors.Is(err, io.EOF) {
				eof = true
			} else if err != nil {
				return err
			}
		}
		if len(win) == 0 {
			break
		}
		n := cdc.Cut(win, eof)
		if n <= 0 {
			if eof {
				n = len(win)
			} else {
				continue
			}
		}
		b := getBuf(n)
		copy(*b, win[:n])
		if !emit(&chunkJob{buf: b, data: *b}) {
			putBuf(b)
			return ctx.Err()
		}
		win = win[:copy(win, win[n:])]
	}
	if off != size {
		return fmt.Errorf("file changed size while being read (%d, then %d)", size, off)
	}
	return nil
}

// PutChunk stores a chunk that came from elsewhere (a replica the peer
// layer places here), after checking it against id, in the shared packs;
// it is committed with the next Flush. A chunk already stored is skipped.
func (im *Importer) PutChunk(id ID, data []byte) error {
	_, err := im.putChunk(id, data)
	return err
}

// PutReceived is PutChunk for a chunk another member pushed here before
// any namespace here names it: GC keeps it for the grace
// (Options.ReceivedGrace) after its commit, or while a member's lease
// holds it, even while no head names it (received.go).
func (im *Importer) PutReceived(id ID, data []byte) error {
	stored, err := im.putChunk(id, data)
	if stored {
		im.received = append(im.received, id)
	}
	return err
}

// putChunk is PutChunk; stored says the chunk was new here.
func (im *Importer) putChunk(id ID, data []byte) (bool, error) {
	if im.closed {
		return false, fmt.Errorf("store chunk %s: importer closed", id.Short())
	}
	if Sum(data) != id {
		return false, &CorruptError{Chunk: id, Reason: "bytes to store fail their hash"}
	}
	if have, err := im.has(id); err != nil || have {
		return false, err
	}
	w := &sharedSink{im: im}
	w.write(id, data)
	if err := w.finish(); err != nil {
		return false, fmt.Errorf("store chunk %s: %w", id.Short(), err)
	}
	im.pendingBytes += int64(len(data))
	return true, nil
}

// PendingBytes is the bytes written and not yet committed (Flush).
func (im *Importer) PendingBytes() int64 { return im.pendingBytes }

// HasChunk reports whether chunk id is in the index (stored here).
func (s *Store) HasChunk(id ID) bool {
	found := false
	s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketChunks).Get(id[:]) != nil
		return nil
	})
	return found
}
