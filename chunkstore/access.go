package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// The chunk-access seam (docs/design/access.md). Every reader of stored
// bytes goes through here: File.Plan cuts a byte range into pieces, each a
// whole chunk that is either local (in a pack, with a lease on the pack that
// keeps GC from closing or deleting it) or missing (for the Fetcher). Readers
// that want bytes call File.ReadAt (or Store.ReadChunk); they read through
// the store's one chunk cache, which verifies every chunk before anyone sees
// it. Readers that move bytes themselves (gpuio, the layout ioctl) use the
// plan and hold its leases while they use the packs.

// Fetcher brings chunks that are not stored locally. The store verifies what
// it returns (length and hash) before anyone sees it; a fetcher need not
// (but see VerifiedFetcher).
// peers implements it; LocalOnly is the one for a node without peers.
type Fetcher interface {
	// Fetch returns the n bytes of chunk id, or an error wrapping
	// ErrNotLocal when no one has it. It must honour ctx.
	Fetch(ctx context.Context, id ID, n uint32) ([]byte, error)
}

// VerifiedFetcher is a Fetcher that checks every chunk it returns against
// its id (BLAKE3) itself, on every path to the bytes, so the store only
// checks the length and does not hash the chunk a second time (a hash is
// the largest share of a fetched chunk's cost on the receiving node).
// peers.Node is one: it hashes each chunk as it arrives, to know which
// member sent wrong bytes and ask another. A fetcher that cannot promise
// this for every chunk must not implement it.
type VerifiedFetcher interface {
	Fetcher
	// FetchVerifies is a marker: Fetch returns only bytes whose BLAKE3
	// is the id asked for.
	FetchVerifies()
}

// IntoFetcher is a VerifiedFetcher that can also bring a chunk straight
// into memory the caller provides (File.FetchPiecesInto): a load places
// fetched chunks without a chunk-sized buffer of their own in between.
// peers.Node is one.
type IntoFetcher interface {
	VerifiedFetcher
	// FetchInto fills dst, len(dst) the chunk's size, with the bytes of
	// chunk id, checked against id, or returns an error (wrapping
	// ErrNotLocal when no one has it). It must honour ctx, and must not
	// write into dst after it returns.
	FetchInto(ctx context.Context, id ID, dst []byte) error
}

// FetchNote travels in a caller's context (WithFetchNote) to the store's
// Fetcher: whether what is fetched for the caller may be kept on this
// node (peers keeps it in its peer cache, written behind the caller:
// docs/design/gpuio.md, "Chunks stored elsewhere"), and where the chunks
// came from, counted. A load reports these.
type FetchNote struct {
	// NoKeep: keep nothing fetched for this caller (kylix load --no-keep).
	NoKeep bool

	// Local, LocalBytes: chunks read from this node's copy of chunks
	// fetched earlier (the peer cache), not from the members.
	Local, LocalBytes atomic.Int64
	// Kept, KeptBytes: chunks fetched from the members and queued to be
	// written into the peer cache, behind the caller (a writer that then
	// finds no room above the disk's floor counts it in the cache's
	// not-kept count, `kylix peers`).
	Kept, KeptBytes atomic.Int64
	// NotKept: chunks fetched and not queued, though the caller allowed
	// it: the writers were behind by their whole queue.
	NotKept atomic.Int64
}

type fetchNoteKey struct{}

// WithFetchNote returns ctx carrying note.
func WithFetchNote(ctx context.Context, note *FetchNote) context.Context {
	return context.WithValue(ctx, fetchNoteKey{}, note)
}

// FetchNoteOf returns the note ctx carries; nil when none.
func FetchNoteOf(ctx context.Context) *FetchNote {
	n, _ := ctx.Value(fetchNoteKey{}).(*FetchNote)
	return n
}

// LocalOnly is the Fetcher of a store alone: nothing can be fetched.
type LocalOnly struct{}

// Fetch always fails with ErrNotLocal.
func (LocalOnly) Fetch(ctx context.Context, id ID, n uint32) ([]byte, error) {
	return nil, fmt.Errorf("chunk %s: %w", id.Short(), ErrNotLocal)
}

// Piece is one chunk of a planned range.
type Piece struct {
	ID      ID
	FileOff int64 // file offset of the chunk's first byte
	Len     int64 // the chunk's length
	// Pack is the pack holding the chunk, 0 when the chunk is missing
	// (not stored here: Fetcher territory). PackOff is its offset there.
	Pack    uint64
	PackOff int64
	// Lease is the plan's lease on Pack (shared by the pieces of one pack);
	// nil for missing pieces.
	Lease *Lease
}

// Local says whether the piece's bytes are in a local pack.
func (p Piece) Local() bool { return p.Lease != nil }

// Plan is a byte range of a file cut into pieces. Release it when done with
// the packs: until then GC neither closes nor deletes them.
type Plan struct {
	File   *File
	Off    int64 // the range planned, clipped to the file
	Len    int64
	Pieces []Piece // whole chunks overlapping [Off, Off+Len), in file order
	leases []*Lease
}

// Plan cuts [off, off+n) of f into pieces and leases the packs of the local
// ones. A chunk whose pack cannot be leased (missing from disk, just
// collected) is a missing piece. Errors are for things other than missing
// chunks (a closed store, an unreadable pack file).
func (f *File) Plan(off, n int64) (*Plan, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("plan [%d, +%d): negative range", off, n)
	}
	end := min(off+n, f.M.Size)
	p := &Plan{File: f, Off: min(off, f.M.Size)}
	p.Len = max(0, end-p.Off)
	if p.Len == 0 {
		return p, nil
	}
	first, last := f.ChunkAt(off), f.ChunkAt(end-1)
	byPack := map[uint64]*Lease{}
	for i := first; i <= last; i++ {
		c, l := f.M.Chunks[i], f.locs[i]
		pc := Piece{ID: c.ID, FileOff: f.offs[i], Len: int64(c.Len)}
		if l.Pack != 0 {
			ls, ok := byPack[l.Pack]
			if !ok {
				var err error
				ls, err = f.s.packs.acquire(l.Pack)
				if err != nil && !errors.Is(err, ErrNotLocal) {
					p.Release()
					return nil, err
				}
				byPack[l.Pack] = ls // nil: missing
				if ls != nil {
					p.leases = append(p.leases, ls)
				}
			}
			if ls != nil {
				pc.Pack, pc.PackOff, pc.Lease = l.Pack, l.Off, ls
			}
		}
		p.Pieces = append(p.Pieces, pc)
	}
	return p, nil
}

// Missing returns the pieces that are not stored locally.
func (p *Plan) Missing() []Piece {
	var out []Piece
	for _, pc := range p.Pieces {
		if !pc.Local() {
			out = append(out, pc)
		}
	}
	return out
}

// Release gives back the plan's leases. Idempotent.
func (p *Plan) Release() {
	for _, l := range p.leases {
		l.Release()
	}
	p.leases = nil
}

// readChunks returns the verified bytes of each chunk. Chunks cached or being
// read by another reader are shared (single flight); the rest are read here
// in one batch, verified on all cores, and handed to whoever waits. With
// keep the chunks read stay in the cache (the caller uses only part of them
// and will likely ask for the rest).
//
// Every chunk is attempted once: a failure (corrupt, missing, I/O error) is
// returned to every reader waiting for that chunk and remembered briefly
// (chunkCache), and is logged once, here, by the reader that made the
// attempt.
func (s *Store) readChunks(ctx context.Context, refs []ChunkRef, locs []Location, keep bool) ([][]byte, error) {
	entries := make([]*cacheEntry, len(refs))
	var mine []int
	for i, r := range refs {
		e, owner := s.cache.claim(r.ID)
		entries[i] = e
		if owner {
			mine = append(mine, i)
		}
	}
	if len(mine) > 0 {
		// Not tied to this caller's cancellation: other readers may be
		// waiting for the same chunks. Local reads are bounded by the disk.
		s.load(context.WithoutCancel(ctx), refs, locs, entries, mine, keep)
	}
	out := make([][]byte, len(refs))
	for i, e := range entries {
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err != nil {
			return nil, e.err
		}
		out[i] = e.data
	}
	return out, nil
}

// load reads, verifies and completes the entries at idx (owned by the
// caller). Every owned entry is completed, whatever fails.
func (s *Store) load(ctx context.Context, refs []ChunkRef, locs []Location, entries []*cacheEntry, idx []int, keep bool) {
	type pending struct {
		i  int
		rq *storeio.Request
	}
	var (
		reqs    []*storeio.Request
		pend    []pending
		fetches []int // chunks not stored here: for the Fetcher
		leases  = map[uint64]*Lease{}
	)
	defer func() {
		for _, l := range leases {
			if l != nil {
				l.Release()
			}
		}
	}()
	fail := func(i int, err error) {
		s.ctr.chunkFailed(err)
		s.logChunkFailure(refs[i].ID, locs[i], err)
		s.cache.finish(entries[i], nil, err, keep)
	}
	lease := func(pack uint64) (*Lease, error) {
		ls, ok := leases[pack]
		if ok {
			return ls, nil
		}
		ls, err := s.packs.acquire(pack)
		if err != nil && !errors.Is(err, ErrNotLocal) {
			leases[pack] = nil
			return nil, err
		}
		leases[pack] = ls // nil: the pack is gone, the chunk is not local
		return ls, nil
	}
	copied := false
	for _, i := range idx {
		l := locs[i]
		var ls *Lease
		if l.Pack != 0 {
			var err error
			ls, err = lease(l.Pack)
			if err == nil && ls == nil {
				// The pack is gone: GC's compaction may have moved the
				// chunk since the caller looked it up (docs/design/gc.md).
				if nl, ok := s.indexedAt(refs[i].ID); ok && nl.Pack != l.Pack && nl.Len == l.Len {
					if !copied {
						locs, copied = append([]Location(nil), locs...), true
					}
					locs[i], l = nl, nl
					ls, err = lease(l.Pack)
				}
			}
			if err != nil {
				fail(i, fmt.Errorf("read chunk %s: %w", refs[i].ID.Short(), err))
				continue
			}
		}
		if ls == nil {
			fetches = append(fetches, i)
			continue
		}
		rq := &storeio.Request{Fd: ls.Fd(), Off: l.Off, Buf: make([]byte, l.Len)}
		reqs = append(reqs, rq)
		pend = append(pend, pending{i, rq})
	}
	// Missing chunks are fetched in parallel (at most fetchInFlight at
	// once), while the local ones are read.
	var fetched sync.WaitGroup
	if len(fetches) > 0 {
		fetched.Add(1)
		go func() {
			defer fetched.Done()
			sem := make(chan struct{}, fetchInFlight)
			var wg sync.WaitGroup
			for _, i := range fetches {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					data, err := s.fetch(ctx, refs[i], locs[i])
					if err != nil {
						fail(i, err)
					} else {
						s.cache.finish(entries[i], data, nil, keep)
					}
				}()
			}
			wg.Wait()
		}()
	}
	defer fetched.Wait() // before the leases are released
	if len(reqs) == 0 {
		return
	}
	gen := s.pverify.prog.gen.Load() // packprogress.go: reads begun after this count
	s.io.Read(ctx, reqs)             // per-request errors are examined below
	errs := make([]error, len(pend))
	parallelFor(len(pend), func(k int) {
		p := pend[k]
		i, l := p.i, locs[p.i]
		switch {
		case p.rq.Err != nil:
			errs[k] = &ReadError{Chunk: refs[i].ID, Pack: l.Pack, PackOff: l.Off, Err: p.rq.Err}
		case p.rq.N != len(p.rq.Buf):
			errs[k] = &CorruptError{Chunk: refs[i].ID, Pack: l.Pack, PackOff: l.Off,
				Reason: fmt.Sprintf("pack holds %d of its %d bytes", p.rq.N, len(p.rq.Buf))}
		case Sum(p.rq.Buf) != refs[i].ID:
			errs[k] = &CorruptError{Chunk: refs[i].ID, Pack: l.Pack, PackOff: l.Off, Reason: "hash mismatch"}
		}
	})
	for k, p := range pend {
		if errs[k] != nil {
			fail(p.i, errs[k])
			continue
		}
		s.noteVerifiedChunk(gen, locs[p.i].Pack, p.rq.Fd, p.rq.Off, uint32(len(p.rq.Buf)), refs[p.i].ID)
		s.cache.finish(entries[p.i], p.rq.Buf, nil, keep)
	}
}

// indexedAt returns chunk id's location in the index now.
func (s *Store) indexedAt(id ID) (Location, bool) {
	var l Location
	ok := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketChunks).Get(id[:])
		if v == nil {
			return nil
		}
		var err error
		l, err = decodeLocation(v)
		ok = err == nil
		return nil
	})
	return l, ok
}

// fetch asks the Fetcher for a chunk that is not local and verifies it.
func (s *Store) fetch(ctx context.Context, r ChunkRef, l Location) ([]byte, error) {
	data, err := s.fetcher.Fetch(ctx, r.ID, r.Len)
	if err != nil {
		if errors.Is(err, ErrNotLocal) && l.Pack != 0 {
			return nil, fmt.Errorf("chunk %s: its pack %016x is missing: %w", r.ID.Short(), l.Pack, err)
		}
		return nil, fmt.Errorf("chunk %s: %w", r.ID.Short(), err)
	}
	if uint32(len(data)) != r.Len {
		return nil, &CorruptError{Chunk: r.ID, Reason: fmt.Sprintf("fetched %d bytes, want %d", len(data), r.Len)}
	}
	if _, verified := s.fetcher.(VerifiedFetcher); !verified && Sum(data) != r.ID {
		return nil, &CorruptError{Chunk: r.ID, Reason: "fetched bytes fail their hash"}
	}
	return data, nil
}

// logChunkFailure logs a failed chunk read: once per attempt, and an attempt
// is made at most once per DefaultFailTTL per chunk (chunkCache).
func (s *Store) logChunkFailure(id ID, l Location, err error) {
	if errors.Is(err, ErrClosed) || errors.Is(err, storeio.ErrClosed) {
		return // the store is closing: nothing is wrong with the chunk
	}
	args := []any{"chunk", id.String(), "err", err}
	if l.Pack != 0 {
		args = append(args, "pack", s.PackPath(l.Pack), "pack_offset", l.Off)
	}
	s.log.Error("chunk cannot be read; readers get EIO (run kylix verify to list the files affected)", args...)
}

// fetchInFlight bounds the chunks one batch asks the Fetcher for at once.
const fetchInFlight = 8

// prefetchInFlight bounds the background prefetches of the store.
const prefetchInFlight = 4

// Prefetch reads the chunks overlapping [off, off+n) into the cache in the
// background, for sequential readers. At most prefetchInFlight run at once;
// when that many are running the prefetch is skipped (it is a hint).
func (f *File) Prefetch(off, n int64) {
	if off >= f.M.Size || n <= 0 {
		return
	}
	end := min(off+n, f.M.Size)
	first, last := f.ChunkAt(off), f.ChunkAt(end-1)
	// Skip the chunks cached or being read, cheaply, before taking a slot.
	for first <= last && f.s.cache.present(f.M.Chunks[first].ID) {
		first++
	}
	if first > last {
		return
	}
	select {
	case f.s.prefetch <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-f.s.prefetch }()
		f.s.readChunks(context.Background(), f.M.Chunks[first:last+1], f.locs[first:last+1], true)
	}()
}

// ChunkAt returns the index in f.M.Chunks of the chunk holding byte off
// (0 <= off < f.Size()); len(f.M.Chunks) for an offset at or past the end.
func (f *File) ChunkAt(off int64) int {
	return sort.Search(len(f.M.Chunks), func(i int) bool { return f.offs[i+1] > off })
}

// ChunkOffset returns the file offset of chunk i's first byte, for i in
// [0, len(f.M.Chunks)]: ChunkOffset(len(f.M.Chunks)) is the file's size.
func (f *File) ChunkOffset(i int) int64 { return f.offs[i] }

// FetchPiecesInto writes the verified bytes of pieces of f's plan that are
// not stored here (Piece.Local false) into dsts (dsts[i] is pcs[i].Len
// bytes), brought by the Fetcher: on a cluster member, from the members,
// fetchInFlight at once. A chunk in the chunk cache is copied from there.
// An IntoFetcher writes each chunk straight into its dst; another fetcher's
// chunks go through the chunk cache (shared with other readers, not kept)
// and are copied. A store alone fails with ErrNotLocal. What was fetched is
// not written into the packs (the caller places the bytes elsewhere:
// gpuio's loads). On error, dsts may hold some of the bytes.
func (f *File) FetchPiecesInto(ctx context.Context, pcs []Piece, dsts [][]byte) error {
	if len(dsts) != len(pcs) {
		return fmt.Errorf("fetch: %d pieces into %d buffers", len(pcs), len(dsts))
	}
	for i, pc := range pcs {
		if pc.Len <= 0 || pc.Len > math.MaxUint32 || int64(len(dsts[i])) != pc.Len {
			return fmt.Errorf("chunk %s: a piece of %d bytes into %d", pc.ID.Short(), pc.Len, len(dsts[i]))
		}
	}
	ifx, ok := f.s.fetcher.(IntoFetcher)
	if !ok {
		refs := make([]ChunkRef, len(pcs))
		for i, pc := range pcs {
			refs[i] = ChunkRef{ID: pc.ID, Len: uint32(pc.Len)}
		}
		out, err := f.s.readChunks(ctx, refs, make([]Location, len(pcs)), false)
		if err != nil {
			return fmt.Errorf("read %s: %w", f.ID.Short(), err)
		}
		for i := range out {
			copy(dsts[i], out[i])
		}
		return nil
	}
	err := eachBounded(ctx, len(pcs), fetchInFlight, func(ctx context.Context, i int) error {
		pc := pcs[i]
		if b, ok := f.s.cache.cached(pc.ID); ok && int64(len(b)) == pc.Len {
			copy(dsts[i], b)
			return nil
		}
		if err := ifx.FetchInto(ctx, pc.ID, dsts[i]); err != nil {
			err = fmt.Errorf("chunk %s: %w", pc.ID.Short(), err)
			if ctx.Err() == nil {
				f.s.ctr.chunkFailed(err)
				f.s.logChunkFailure(pc.ID, Location{}, err)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", f.ID.Short(), err)
	}
	return nil
}

// eachBounded calls fn(ctx, i) for every i in [0, n), at most limit at
// once, each in a goroutine of its own. The first error cancels the ctx
// the others get, no new call starts after it, and it is returned once
// the calls under way are done (else ctx's error, if it ended).
func eachBounded(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, limit)
	)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctxErr(ctx)
	}
	return first
}
