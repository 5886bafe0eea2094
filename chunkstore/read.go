package chunkstore

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// File is an open stored file: its manifest and where each chunk lives. It is
// safe for concurrent use. Locations are resolved at open; a chunk that is not
// stored locally has Pack 0 and reads of it go to the store's Fetcher (which,
// alone, fails with ErrNotLocal). Reads go through the chunk-access seam
// (access.go): the one cache, leases on packs, bounded failures.
type File struct {
	s    *Store
	ID   ID
	M    *FileManifest
	offs []int64 // offs[i] = file offset of chunk i; offs[len] = size
	locs []Location
	// epoch is the store's relocation count when locs were read (Fresh).
	epoch uint64
	// ra follows the reader to fetch missing chunks ahead (readahead.go).
	ra *readAhead
}

// OpenFile opens the file whose manifest is id.
func (s *Store) OpenFile(id ID) (*File, error) {
	files, errs := s.OpenFiles([]ID{id})
	return files[0], errs[0]
}

// OpenFiles opens the files whose manifests are ids, each as OpenFile
// would (files[i] or errs[i]), reading every manifest and every chunk's
// location in one index transaction: a directory's small files opened
// together (the mount's directory prefetch) cost one transaction, not one
// a file (docs/design/fs.md, "The first pass after a node start").
func (s *Store) OpenFiles(ids []ID) (files []*File, errs []error) {
	files, errs = make([]*File, len(ids)), make([]error, len(ids))
	// Read before anything else: an entry of the open cache, or one made
	// now, is only ever used at the count of commits it was read at.
	commits := s.commits.Load()
	todo := make([]int, 0, len(ids))
	for i, id := range ids {
		if f := s.opened.get(id, commits); f != nil {
			files[i] = f
		} else {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return files, errs
	}
	// Read before the locations: a compaction racing this open leaves
	// the File marked stale, never fresh with old locations.
	epoch := s.relocs.Load()
	complete := make([]bool, len(ids))
	err := s.db.View(func(tx *bolt.Tx) error {
		objs, chunks := tx.Bucket(bucketObjects), tx.Bucket(bucketChunks)
		for _, i := range todo {
			files[i], complete[i], errs[i] = s.openIn(objs, chunks, ids[i], epoch)
		}
		return nil
	})
	for _, i := range todo {
		switch {
		case err != nil:
			files[i], errs[i] = nil, err
		case errs[i] != nil:
			files[i] = nil
		case complete[i]:
			s.opened.put(files[i], commits)
		}
	}
	return files, errs
}

// openIn opens version id from the index buckets of one transaction:
// its manifest (verified against its ID) and its chunks' locations;
// complete is false when a chunk is not stored here.
func (s *Store) openIn(objs, chunks *bolt.Bucket, id ID, epoch uint64) (f *File, complete bool, err error) {
	b, err := objectIn(objs, id)
	if err != nil {
		return nil, false, err
	}
	m, err := DecodeFileManifest(b)
	if err != nil {
		return nil, false, fmt.Errorf("object %s: %w", id.Short(), err)
	}
	f = &File{s: s, ID: id, M: m, offs: make([]int64, len(m.Chunks)+1), locs: make([]Location, len(m.Chunks)), epoch: epoch, ra: &readAhead{}}
	var off int64
	for i, c := range m.Chunks {
		f.offs[i] = off
		off += int64(c.Len)
	}
	f.offs[len(m.Chunks)] = off
	complete = true
	for i, c := range m.Chunks {
		v := chunks.Get(c.ID[:])
		if v == nil {
			complete = false
			continue
		}
		l, err := decodeLocation(v)
		if err != nil {
			return nil, false, fmt.Errorf("open file %s: chunk %s: %w", id.Short(), c.ID.Short(), err)
		}
		if l.Len != c.Len {
			return nil, false, fmt.Errorf("open file %s: chunk %s: index says %d bytes, manifest %d: %w", id.Short(), c.ID.Short(), l.Len, c.Len, ErrCorrupt)
		}
		f.locs[i] = l
	}
	return f, complete, nil
}

// The open cache: opening a file reads every chunk's location from the
// index, one lookup a chunk (a 256 MiB tar shard of 10 000 small files'
// chunks: 12-45 ms), and the mount opens the version again at each
// open(2) once the file's handles have all closed. So the last files
// opened that have at least openCacheMinChunks chunks are kept, and
// reused while the index has not changed since they were read (any
// commit, which every move and removal of a chunk is, drops them all);
// a file with a chunk not stored here is not kept (it may arrive).
var (
	openCacheMinChunks = 256
	// openCacheMaxChunks bounds the locations kept (about 32 bytes each),
	// openCacheFiles the files.
	openCacheMaxChunks = 1 << 20
	openCacheFiles     = 16
)

type openCache struct {
	mu      sync.Mutex
	files   []*File // oldest first; ra nil (each get makes its own)
	commits uint64  // the count the entries were read at
	chunks  int
}

// get returns a File of version id read at commits, or nil. Each caller
// gets its own read-ahead state; the rest is shared and never changed.
func (c *openCache) get(id ID, commits uint64) *File {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.commits != commits {
		if commits > c.commits {
			c.files, c.chunks, c.commits = nil, 0, commits
		}
		return nil
	}
	for i, f := range c.files {
		if f.ID == id {
			c.files = append(append(c.files[:i:i], c.files[i+1:]...), f) // newest last
			cp := *f
			cp.ra = &readAhead{}
			return &cp
		}
	}
	return nil
}

// put keeps f, read at commits, if it is large enough to be worth it.
func (c *openCache) put(f *File, commits uint64) {
	n := len(f.M.Chunks)
	if n < openCacheMinChunks || n > openCacheMaxChunks {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.commits != commits {
		if commits < c.commits {
			return // read before the entries' count: already old
		}
		c.files, c.chunks, c.commits = nil, 0, commits
	}
	for _, e := range c.files {
		if e.ID == f.ID {
			return
		}
	}
	for len(c.files) > 0 && (c.chunks+n > openCacheMaxChunks || len(c.files) >= openCacheFiles) {
		c.chunks -= len(c.files[0].M.Chunks)
		c.files = c.files[1:]
	}
	cp := *f
	cp.ra = nil
	c.files = append(c.files, &cp)
	c.chunks += n
}

// Fresh returns f, or f opened again when GC's compaction has moved chunks
// since f was opened. Reads (ReadAt, WriteTo) find moved chunks by
// themselves; a Plan reports them as not local, because a plan's packs must
// match the File's Extents (the layout ioctl's pack table). A planner that
// needs every local chunk local (a GPU fill) plans on f.Fresh().
func (f *File) Fresh() (*File, error) {
	if f.s.relocs.Load() == f.epoch {
		return f, nil
	}
	return f.s.OpenFile(f.ID)
}

// OpenPath opens the file at a namespace path.
func (s *Store) OpenPath(path string) (*File, Entry, error) {
	e, err := s.Lookup(path)
	if err != nil {
		return nil, e, err
	}
	if e.Kind != KindFile {
		return nil, e, &PathError{Op: "open", Path: path, Err: ErrIsDir}
	}
	f, err := s.OpenFile(e.ID)
	return f, e, err
}

// Size is the file's length in bytes.
func (f *File) Size() int64 { return f.M.Size }

// Local reports whether every chunk of the file was stored here when it
// was opened (none would be fetched from a peer).
func (f *File) Local() bool {
	for _, l := range f.locs {
		if l.Pack == 0 {
			return false
		}
	}
	return true
}

// Extent is a run of a file stored contiguously in one pack.
type Extent struct {
	FileOff  int64  `json:"file_offset"`
	Len      int64  `json:"length"`
	Pack     uint64 `json:"pack"` // 0: not stored locally
	PackPath string `json:"pack_path,omitempty"`
	PackOff  int64  `json:"pack_offset"`
}

// Extents returns the file's extents, merging chunks that lie back to back in
// one pack.
func (f *File) Extents() []Extent {
	var out []Extent
	for i, l := range f.locs {
		n := int64(f.M.Chunks[i].Len)
		if k := len(out) - 1; k >= 0 && out[k].Pack == l.Pack && (l.Pack == 0 || out[k].PackOff+out[k].Len == l.Off) {
			out[k].Len += n
			continue
		}
		e := Extent{FileOff: f.offs[i], Len: n, Pack: l.Pack, PackOff: l.Off}
		if l.Pack != 0 {
			e.PackPath = f.s.PackPath(l.Pack)
		}
		out = append(out, e)
	}
	return out
}

// WholeFilePack returns the path of a pack that holds exactly this file's
// bytes from offset 0 and nothing else, if there is one. Only such a pack may
// back FUSE passthrough: the kernel does not clip passthrough reads at the
// FUSE file's size.
func (f *File) WholeFilePack() (string, bool) {
	ex := f.Extents()
	if len(ex) != 1 || ex[0].Pack == 0 || ex[0].PackOff != 0 || ex[0].Len != f.M.Size {
		return "", false
	}
	var pi packInfo
	err := f.s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketPacks).Get(packKey(ex[0].Pack))
		if v == nil {
			return ErrNotFound
		}
		var err error
		pi, err = decodePackInfo(v)
		return err
	})
	if err != nil || pi.Flags&packExclusive == 0 || pi.Flags&packWholeDropped != 0 || pi.Size != f.M.Size {
		return "", false
	}
	return ex[0].PackPath, true
}

// ReadAt implements io.ReaderAt. Every chunk it touches is read whole and
// verified against its ID before any of its bytes are copied into p.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at %d: negative offset", off)
	}
	if off >= f.M.Size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), f.M.Size)
	first, last := f.ChunkAt(off), f.ChunkAt(end-1)
	f.readingAhead(first, last)
	chunks, err := f.s.readChunks(ctx, f.M.Chunks[first:last+1], f.locs[first:last+1], end-off < f.offs[last+1]-f.offs[first])
	if err != nil {
		return 0, fmt.Errorf("read %s at %d: %w", f.ID.Short(), off, err)
	}
	n := 0
	for k, data := range chunks {
		i := first + k
		s := max(off, f.offs[i]) - f.offs[i]
		t := min(end, f.offs[i+1]) - f.offs[i]
		n += copy(p[n:], data[s:t])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ReadSlice returns the file's bytes in [off, off+n) without copying them
// when they lie in one chunk: a slice of the store's verified chunk, which
// the caller must not modify (the chunk cache never reuses the memory of a
// chunk, so the slice stays valid as long as the caller holds it). ok is
// false, and nothing is read, when the range spans chunks: use
// ReadAtContext. Past the end of the file the slice is short (empty at or
// beyond it) and err is nil.
func (f *File) ReadSlice(ctx context.Context, off int64, n int) (b []byte, ok bool, err error) {
	if off < 0 {
		return nil, false, fmt.Errorf("read at %d: negative offset", off)
	}
	if off >= f.M.Size || n <= 0 {
		return nil, true, nil
	}
	end := min(off+int64(n), f.M.Size)
	i := f.ChunkAt(off)
	if f.ChunkAt(end-1) != i {
		return nil, false, nil
	}
	f.readingAhead(i, i)
	chunks, err := f.s.readChunks(ctx, f.M.Chunks[i:i+1], f.locs[i:i+1], end-off < f.offs[i+1]-f.offs[i])
	if err != nil {
		return nil, true, fmt.Errorf("read %s at %d: %w", f.ID.Short(), off, err)
	}
	s, t := off-f.offs[i], end-f.offs[i]
	return chunks[0][s:t:t], true, nil
}

// parallelFor runs fn(0..n-1) on all cores.
func parallelFor(n int, fn func(int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for k := range n {
			fn(k)
		}
		return
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int(next.Add(1) - 1); k < n; k = int(next.Add(1) - 1) {
				fn(k)
			}
		}()
	}
	wg.Wait()
}

// ReadChunk returns the verified bytes of chunk id.
func (s *Store) ReadChunk(ctx context.Context, id ID) ([]byte, error) {
	var loc Location
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketChunks).Get(id[:])
		if v == nil {
			return fmt.Errorf("chunk %s: %w", id.Short(), ErrNotLocal)
		}
		var err error
		loc, err = decodeLocation(v)
		return err
	})
	if err != nil {
		return nil, err
	}
	out, err := s.readChunks(ctx, []ChunkRef{{ID: id, Len: loc.Len}}, []Location{loc}, false)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", id.Short(), err)
	}
	return out[0], nil
}

// WriteTo writes the whole file to w, verifying every chunk. Two 32 MiB
// windows are read and verified at once, ahead of the window being written, so
// reading, hashing and writing overlap. progress (may be nil) is called with
// bytes written.
func (f *File) WriteTo(ctx context.Context, w io.Writer, progress func(int64)) (int64, error) {
	const (
		window = 32 << 20
		ahead  = 2 // windows read and verified concurrently
	)
	type batch struct {
		data [][]byte
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// futures carries, in file order, one channel per window; each is
	// filled by its own goroutine. Its capacity bounds the windows in flight.
	futures := make(chan chan batch, ahead)
	go func() {
		defer close(futures)
		for i := 0; i < len(f.M.Chunks); {
			j, n := i, int64(0)
			for j < len(f.M.Chunks) && (j == i || n+int64(f.M.Chunks[j].Len) <= window) {
				n += int64(f.M.Chunks[j].Len)
				j++
			}
			fut := make(chan batch, 1)
			select {
			case futures <- fut:
			case <-ctx.Done():
				return
			}
			go func(i, j int) {
				d, err := f.s.readChunks(ctx, f.M.Chunks[i:j], f.locs[i:j], false)
				if err != nil {
					err = fmt.Errorf("read %s at %d: %w", f.ID.Short(), f.offs[i], err)
				}
				fut <- batch{d, err}
			}(i, j)
			i = j
		}
	}()
	var total int64
	for fut := range futures {
		b := <-fut
		if b.err != nil {
			return total, b.err
		}
		for _, d := range b.data {
			n, err := w.Write(d)
			total += int64(n)
			if err != nil {
				return total, err
			}
			if progress != nil {
				progress(int64(n))
			}
		}
	}
	if err := ctxErr(ctx); err != nil {
		return total, err
	}
	return total, nil
}

// ReadChunkUnverified returns the stored bytes of chunk id without hashing
// them. It is for a sender whose receiver checks every chunk against its id
// before anyone sees it (the peer data plane, docs/design/peers.md): it
// skips the one cost the receiver repeats. Never hand its result to a
// reader here. ErrNotLocal when the chunk is not stored here; a pack
// holding fewer bytes than the index says is ErrCorrupt.
func (s *Store) ReadChunkUnverified(id ID) ([]byte, error) {
	sp, err := s.LeaseChunk(id)
	if err != nil {
		return nil, err
	}
	defer sp.Release()
	buf := make([]byte, sp.Len)
	if err := sp.ReadInto(buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// ChunkSpan is where a stored chunk's bytes are: Len bytes at Off in the
// leased pack (Lease.Fd, read with pread or sendfile at an explicit
// offset). Release it when done; until then GC neither closes nor deletes
// the pack. The bytes are not verified (see ReadChunkUnverified).
type ChunkSpan struct {
	ID ID
	*Lease
	Off int64
	Len uint32
}

// ReadInto reads the span's bytes into buf, which must be Len bytes long.
// A pack holding fewer bytes than the index says is ErrCorrupt.
func (sp ChunkSpan) ReadInto(buf []byte) error {
	if len(buf) != int(sp.Len) {
		return fmt.Errorf("chunk %s: a buffer of %d bytes for %d", sp.ID.Short(), len(buf), sp.Len)
	}
	for n := 0; n < len(buf); {
		m, err := unix.Pread(sp.Fd(), buf[n:], sp.Off+int64(n))
		if err != nil {
			return &ReadError{Chunk: sp.ID, Pack: sp.Pack(), PackOff: sp.Off, Err: err}
		}
		if m == 0 {
			return &CorruptError{Chunk: sp.ID, Pack: sp.Pack(), PackOff: sp.Off,
				Reason: fmt.Sprintf("pack holds %d of its %d bytes", n, len(buf))}
		}
		n += m
	}
	return nil
}

// LeaseChunk finds the stored chunk id and leases its pack, for a sender
// that moves the bytes itself (the peer data plane reads them into a
// reused buffer, or sends them from the pack with sendfile). ErrNotLocal
// when the chunk is not stored here.
func (s *Store) LeaseChunk(id ID) (ChunkSpan, error) {
	var loc Location
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketChunks).Get(id[:])
		if v == nil {
			return fmt.Errorf("chunk %s: %w", id.Short(), ErrNotLocal)
		}
		var err error
		loc, err = decodeLocation(v)
		return err
	})
	if err != nil {
		return ChunkSpan{}, err
	}
	ls, err := s.packs.acquire(loc.Pack)
	if err != nil {
		return ChunkSpan{}, err
	}
	return ChunkSpan{ID: id, Lease: ls, Off: loc.Off, Len: loc.Len}, nil
}

// CachedChunk returns chunk id's verified bytes when they are in the
// store's memory cache (read or fetched recently), without any storage
// read; false otherwise. The bytes are shared: do not modify them.
func (s *Store) CachedChunk(id ID) ([]byte, bool) {
	return s.cache.cached(id)
}
