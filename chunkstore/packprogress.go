package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/internal/pace"
)

// The first open does not wait for the whole-pack hash
// (docs/design/verification.md, "The first open after a start").
//
// TryOpenPassthrough hands out a pack only when its check record is valid
// now. Otherwise it starts the pack's check in the background (one flight
// per pack and file, paced) and says ErrPackUnchecked: the caller serves
// that open through the node, which hashes every chunk it reads. While the
// flight runs, the node's own verified reads of the pack are recorded in a
// bitmap of chunks (packProgress); when every chunk of the file has been
// read from the pack and hashed, and the pack's identity is still the one
// taken before the first of those reads, the check is recorded as passed
// as if the whole-pack hash had run, and the background hash stops.

// InlineCheckMax is the largest pack TryOpenPassthrough checks inline
// before answering: one verification batch, a few tens of milliseconds of
// hashing, is cheaper than serving the open through the node.
const InlineCheckMax = verifyWindow

// errSuperseded: a background check stopped because the node's own reads
// proved the pack meanwhile.
var errSuperseded = errors.New("pack proven by the node's reads")

// packProgress is the record of one pack's chunks that the node read from
// it and hashed while its check runs: bits[i] is chunk i of the file. It
// only exists for a pack that holds every chunk of the file at the
// chunk's own offset (no second copies: the node reads those elsewhere).
type packProgress struct {
	file  ID
	id    PackIdentity // taken before any read that counts
	gen   uint64       // progressTable.gen when registered
	at    time.Time
	index map[int64]int // pack offset (= file offset) -> chunk index
	ids   []ID
	lens  []uint32
	bits  []uint64
	left  int
	size  int64
}

// progressTable holds the packs whose chunks the node's reads record.
type progressTable struct {
	mu sync.Mutex
	n  atomic.Int32 // len(m), read without mu on every chunk read
	// gen counts registrations; a read notes the value before it starts,
	// so a read begun before a record existed (its bytes may predate the
	// identity the record took) never counts for it.
	gen atomic.Uint64
	m   map[uint64]*packProgress
}

// backgroundState is what the store keeps for background checks.
type backgroundState struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
}

func (b *backgroundState) init() {
	b.once.Do(func() { b.ctx, b.cancel = context.WithCancel(context.Background()) })
}

// stopBackground cancels the background checks and waits for them; the
// store calls it when it closes.
func (s *Store) stopBackground() {
	b := &s.pverify.bg
	b.init()
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// WaitPackChecks waits until no background pack check runs (or ctx ends).
func (s *Store) WaitPackChecks(ctx context.Context) error {
	for {
		v := &s.pverify
		v.mu.Lock()
		var fl *verifyFlight
		for _, f := range v.flights {
			fl = f
			break
		}
		v.mu.Unlock()
		if fl == nil {
			return nil
		}
		select {
		case <-fl.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// TryOpenPassthrough is OpenPassthrough for an open that must not wait for
// a whole-pack hash: a pack with a valid record is handed out at once, a
// pack that failed is refused (ErrCorrupt / ErrNotWholeFile), and a pack
// not checked yet (or changed since) of more than InlineCheckMax bytes
// gets its check started in the background, paced at rate bytes per
// second (0: unpaced), and the answer ErrPackUnchecked.
func (s *Store) TryOpenPassthrough(ctx context.Context, f *File, rate int64) (*os.File, error) {
	if f.M.Size <= InlineCheckMax {
		return s.OpenPassthrough(ctx, f)
	}
	pack, fh, verity, err := s.openCandidate(f)
	if err != nil {
		return nil, err
	}
	path, ok := fh.Name(), false
	defer func() {
		if !ok {
			fh.Close()
		}
	}()
	id, err := candidateIdentity(fh, f)
	if err != nil {
		return nil, err
	}
	key := packFileKey{pack, f.ID}
	v := &s.pverify
	v.mu.Lock()
	s.loadChecksLocked()
	if done, err := s.useRecordLocked(key, id, f, verity); done {
		v.mu.Unlock()
		if err != nil {
			return nil, err
		}
		ok = true
		return fh, nil
	}
	if v.flights[key] == nil {
		// The progress is registered before the flight exists and before
		// this open returns, so every read the node makes for it counts.
		s.trackProgress(pack, f, id)
		if !s.startCheckLocked(key, path, f, rate) {
			s.dropProgress(pack, f.ID)
		}
	}
	v.mu.Unlock()
	v.deferred.Add(1)
	return nil, fmt.Errorf("passthrough %s: %w", f.ID.Short(), ErrPackUnchecked)
}

// startCheckLocked starts the background check of key's pack (caller
// holds v.mu; false: the store is closing).
func (s *Store) startCheckLocked(key packFileKey, path string, f *File, rate int64) bool {
	v := &s.pverify
	b := &v.bg
	b.init()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.wg.Add(1)
	b.mu.Unlock()
	fl := &verifyFlight{done: make(chan struct{})}
	fl.pctx, fl.pcancel = context.WithCancel(b.ctx)
	if v.flights == nil {
		v.flights = map[packFileKey]*verifyFlight{}
	}
	v.flights[key] = fl
	go func() {
		defer b.wg.Done()
		defer fl.pcancel()
		fl.check, fl.err = s.backgroundCheck(b.ctx, fl, key, path, f, rate)
		if errors.Is(fl.err, errSuperseded) {
			fl.check, fl.err = nil, nil
		}
		s.record(key, fl.check, fl.err)
		if fl.err != nil && b.ctx.Err() == nil && !errors.Is(fl.err, errPackChanged) {
			s.log.Warn("background pack check failed; the file stays served by the node", "pack", path, "err", fl.err)
		}
		s.dropProgress(key.pack, key.file)
		v.mu.Lock()
		delete(v.flights, key)
		v.mu.Unlock()
		close(fl.done)
	}()
	return true
}

// backgroundCheck hashes the pack at rate, until done, superseded by the
// node's reads (errSuperseded) or hurried by an opener that waits
// (OpenPassthrough: unpaced from then on).
func (s *Store) backgroundCheck(ctx context.Context, fl *verifyFlight, key packFileKey, path string, f *File, rate int64) (*PackCheck, error) {
	pacer := pace.New(rate)
	paced := func(n int64) error {
		for {
			switch {
			case fl.superseded.Load():
				return errSuperseded
			case fl.hurry.Load():
				return ctx.Err()
			}
			err := pacer.Wait(fl.pctx, n)
			if err == nil || ctx.Err() != nil {
				return err
			}
			// fl.pctx was cancelled by hurry or superseded: look again.
			n = 0
		}
	}
	// The first batch's share is waited for before anything is read, so
	// the check does not race the open's own first reads for the disk.
	first := min(f.M.Size, int64(verifyWindow))
	if err := paced(first); err != nil {
		return nil, err
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return s.checkPack(ctx, fh, key.pack, f, paced)
}

// trackProgress starts recording the node's verified reads of pack for f,
// if the pack holds every chunk of f at its own offset.
func (s *Store) trackProgress(pack uint64, f *File, id PackIdentity) {
	p := &packProgress{file: f.ID, id: id, at: time.Now(), index: make(map[int64]int, len(f.locs)),
		ids: make([]ID, len(f.locs)), lens: make([]uint32, len(f.locs)),
		bits: make([]uint64, (len(f.locs)+63)/64), left: len(f.locs), size: f.M.Size}
	for i, l := range f.locs {
		if l.Pack != pack || l.Off != f.offs[i] {
			return // a second copy: the node's reads do not see it
		}
		if _, dup := p.index[l.Off]; dup {
			return
		}
		p.index[l.Off] = i
		p.ids[i], p.lens[i] = f.M.Chunks[i].ID, f.M.Chunks[i].Len
	}
	if p.left == 0 {
		return
	}
	t := &s.pverify.prog
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[uint64]*packProgress{}
	}
	if _, ok := t.m[pack]; !ok {
		t.n.Add(1)
	}
	p.gen = t.gen.Add(1)
	t.m[pack] = p
}

// dropProgress forgets pack's record of verified chunks for file.
func (s *Store) dropProgress(pack uint64, file ID) {
	t := &s.pverify.prog
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.m[pack]; p != nil && p.file == file {
		delete(t.m, pack)
		t.n.Add(-1)
	}
}

// noteVerifiedChunk is told by the store's reader (access.go) that the
// chunk id of n bytes at off of pack, read through fd by a read begun when
// progressTable.gen was gen, hashed right. A chunk counts only when the
// read began after the record was registered, fd is the pack whose identity the record was
// started with and that identity still holds after the read; any other
// identity drops the record (the background check then decides).
func (s *Store) noteVerifiedChunk(gen, pack uint64, fd int, off int64, n uint32, id ID) {
	t := &s.pverify.prog
	if t.n.Load() == 0 {
		return
	}
	t.mu.Lock()
	p := t.m[pack]
	i, ok := 0, false
	if p != nil {
		i, ok = p.index[off]
	}
	if !ok || gen < p.gen || p.ids[i] != id || p.lens[i] != n || p.bits[i/64]&(1<<(i%64)) != 0 {
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	cur := identityOf(&st)
	t.mu.Lock()
	if t.m[pack] != p {
		t.mu.Unlock()
		return
	}
	if cur != p.id {
		delete(t.m, pack)
		t.n.Add(-1)
		t.mu.Unlock()
		s.pverify.progDropped.Add(1)
		return
	}
	if p.bits[i/64]&(1<<(i%64)) != 0 {
		t.mu.Unlock()
		return
	}
	p.bits[i/64] |= 1 << (i % 64)
	p.left--
	done := p.left == 0
	if done {
		delete(t.m, pack)
		t.n.Add(-1)
	}
	t.mu.Unlock()
	if done {
		s.recordByReads(pack, p)
	}
}

// recordByReads records p's pack as checked: every chunk was read from
// it and hashed by the node under one unchanged identity.
func (s *Store) recordByReads(pack uint64, p *packProgress) {
	c := &PackCheck{Pack: pack, Path: s.PackPath(pack), File: p.file, Identity: p.id,
		Chunks: len(p.ids), Bytes: p.size, Elapsed: time.Since(p.at), At: p.at, ByReads: true}
	key := packFileKey{pack, p.file}
	s.record(key, c, nil)
	v := &s.pverify
	v.byReads.Add(1)
	v.mu.Lock()
	fl := v.flights[key]
	v.mu.Unlock()
	if fl != nil {
		fl.superseded.Store(true)
		fl.pcancel()
	}
}

// VerifiedReadGen is sampled by a reader outside the store (gpuio) before
// it reads pieces of f from their pack, for NoteVerifiedPieces.
func (f *File) VerifiedReadGen() uint64 { return f.s.pverify.prog.gen.Load() }

// NoteVerifiedPieces tells the store that a reader outside it read the
// pieces of pack through fd, by a read begun when VerifiedReadGen was gen,
// and hashed every one of them right (on the CPU or the device): they
// count toward the pack's check like the node's own reads.
func (f *File) NoteVerifiedPieces(gen, pack uint64, fd int, pcs []Piece) {
	for _, pc := range pcs {
		if pc.Pack == pack && pc.Len > 0 && pc.Len <= 1<<32-1 {
			f.s.noteVerifiedChunk(gen, pack, fd, pc.PackOff, uint32(pc.Len), pc.ID)
		}
	}
}
