package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore/storeio"
)

// Passthrough verification.
//
// A file served by FUSE passthrough is read by the kernel straight from its
// pack: no Kylix code sees those bytes, so nothing hashes them per read.
// Where the file system has fs-verity the kernel checks every page against
// a Merkle tree (verity.go). Where it does not (our machines' kernels), a
// pack is hashed whole against the file's manifest before the node hands
// it out for the first time after a boot or after the pack file
// changed (device, inode, size, mtime or ctime differ), and re-hashed by a
// rate-limited background scrub. docs/design/verification.md states what
// this does and does not guarantee.
//
// The record of checked packs is kept across node restarts within one
// boot (packverify_persist.go): after a reboot every pack is checked again.

// PackIdentity is one state of a pack file on disk. Any write to the file
// changes its mtime or ctime (ctime cannot be set back from user space),
// and a replaced file has another inode.
type PackIdentity struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
	CTime int64  `json:"ctime_ns"`
}

func identityOf(st *unix.Stat_t) PackIdentity {
	return PackIdentity{Dev: st.Dev, Ino: st.Ino, Size: st.Size,
		MTime: st.Mtim.Nano(), CTime: st.Ctim.Nano()}
}

func fileIdentity(f *os.File) (PackIdentity, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return PackIdentity{}, fmt.Errorf("stat pack %s: %w", f.Name(), err)
	}
	return identityOf(&st), nil
}

// BadChunk is a chunk whose bytes in the pack, at the chunk's place in the
// file, do not hash to its ID.
type BadChunk struct {
	ID      string `json:"id"`
	FileOff int64  `json:"file_offset"`
	Len     int64  `json:"length"`
	// Indexed: the index locates the chunk at this place of the pack, so
	// the store's only local copy is damaged. Otherwise the pack's bytes
	// here are a second copy (a duplicate stored in place so the pack is
	// the whole file) or the pack is not this file; daemon reads use the
	// indexed copy.
	Indexed bool   `json:"indexed"`
	Err     string `json:"error"`
}

// PackCheck is the result of hashing a pack against a file's manifest.
type PackCheck struct {
	Pack     uint64        `json:"pack"`
	Path     string        `json:"path"`
	File     ID            `json:"file"`
	Identity PackIdentity  `json:"identity"`
	Chunks   int           `json:"chunks"`
	Bytes    int64         `json:"bytes"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	At       time.Time     `json:"at"`
	// Verity: fs-verity is enabled on the pack, so the kernel also checks
	// every page read from it after this check.
	Verity bool `json:"verity"`
	// ByReads: not hashed by the check itself: the node read and hashed
	// every chunk of the file from this pack, under this identity
	// (packprogress.go).
	ByReads bool       `json:"by_reads,omitempty"`
	Bad     []BadChunk `json:"bad,omitempty"`
}

// OK reports whether every chunk matched.
func (c *PackCheck) OK() bool { return len(c.Bad) == 0 }

// Err describes a failed check with the sentinel a caller tests for:
// ErrCorrupt when an indexed chunk is damaged, ErrNotWholeFile when only
// second copies differ (the pack is not usable for passthrough, but the
// file's data is intact elsewhere).
func (c *PackCheck) Err() error {
	if c.OK() {
		return nil
	}
	b := c.Bad[0]
	for _, x := range c.Bad {
		if x.Indexed {
			b = x
			break
		}
	}
	what := ErrNotWholeFile
	if b.Indexed {
		what = ErrCorrupt
	}
	return fmt.Errorf("pack %s: chunk %.12s at file offset %d (%d bad of %d chunks): %s: %w",
		c.Path, b.ID, b.FileOff, len(c.Bad), c.Chunks, b.Err, what)
}

// PackVerifyStats counts pack verifications in this run of the store.
type PackVerifyStats struct {
	Verified     int64 `json:"verified"`      // checks that passed
	Failed       int64 `json:"failed"`        // checks that found a bad chunk
	Bytes        int64 `json:"bytes"`         // bytes hashed
	ScrubPasses  int64 `json:"scrub_passes"`  // completed scrub passes
	ScrubBytes   int64 `json:"scrub_bytes"`   // bytes the scrub hashed
	ScrubFailed  int64 `json:"scrub_failed"`  // packs the scrub found bad
	VerityOpened int64 `json:"verity_opened"` // passthrough opens of fs-verity packs
	// Deferred: opens answered ErrPackUnchecked (served by the node while
	// the pack's check runs in the background).
	Deferred int64 `json:"deferred"`
	// ByReads: checks recorded because the node's own reads hashed every
	// chunk of the pack (counted in Verified too, not in Bytes).
	ByReads int64 `json:"by_reads"`
	// ProgressDropped: records of verified chunks dropped because the pack
	// changed while the node read it.
	ProgressDropped int64 `json:"progress_dropped"`
}

// packVerifier holds the record of verified packs; its zero value is ready.
type packVerifier struct {
	mu      sync.Mutex
	recs    map[packFileKey]*PackCheck
	flights map[packFileKey]*verifyFlight

	verified, failed, bytes                     atomic.Int64
	scrubPasses, scrubBytes, scrubFailed, verOp atomic.Int64
	deferred, byReads, progDropped              atomic.Int64

	prog progressTable   // the node's verified reads of packs being checked
	bg   backgroundState // background checks (packprogress.go)

	verityOnce sync.Once
	verityErr  error

	loaded   bool       // the persisted record was read (packverify_persist.go)
	logBoot  string     // boot id of the persisted record
	logLines int        // check lines in it
	saveMu   sync.Mutex // orders writes of the persisted record
}

type packFileKey struct {
	pack uint64
	file ID
}

type verifyFlight struct {
	done  chan struct{}
	check *PackCheck
	err   error
	// Background checks only (packprogress.go): pctx ends their pacing
	// waits; hurry: an opener waits, go unpaced; superseded: the node's
	// reads proved the pack, stop.
	pctx              context.Context
	pcancel           context.CancelFunc
	hurry, superseded atomic.Bool
}

// PackVerifyStats returns the counters.
func (s *Store) PackVerifyStats() PackVerifyStats {
	v := &s.pverify
	return PackVerifyStats{Verified: v.verified.Load(), Failed: v.failed.Load(), Bytes: v.bytes.Load(),
		ScrubPasses: v.scrubPasses.Load(), ScrubBytes: v.scrubBytes.Load(), ScrubFailed: v.scrubFailed.Load(),
		VerityOpened: v.verOp.Load(), Deferred: v.deferred.Load(), ByReads: v.byReads.Load(),
		ProgressDropped: v.progDropped.Load()}
}

// PassthroughCandidate returns the pack that may hold exactly this file's
// bytes from offset 0: an exclusive pack of the file's size holding at
// least half of the file's bytes at their own file offsets. A file stored
// with its duplicates in place (put.go, exclusiveSink) has chunks whose
// index location is elsewhere, so File.WholeFilePack, which trusts the
// index alone, does not see it; the bytes are then proven by VerifyPack
// before any passthrough open.
func (f *File) PassthroughCandidate() (pack uint64, path string, ok bool) {
	size := f.M.Size
	if size == 0 {
		return 0, "", false
	}
	f.s.db.View(func(tx *bolt.Tx) error {
		packs := tx.Bucket(bucketPacks)
		info := func(p uint64) (packInfo, bool) {
			v := packs.Get(packKey(p))
			if v == nil {
				return packInfo{}, false
			}
			pi, err := decodePackInfo(v)
			return pi, err == nil
		}
		// A whole copy (whole.go) holds every byte: it comes first.
		if pack = wholePack(size, f.offs, f.locs, info); pack != 0 {
			return nil
		}
		pack = candidatePack(size, f.offs, f.locs)
		if pi, ok := info(pack); pack != 0 && (!ok || pi.Flags&packExclusive == 0 || pi.Flags&packWholeDropped != 0 || pi.Size != size) {
			pack = 0
		}
		return nil
	})
	if pack == 0 {
		return 0, "", false
	}
	return pack, f.s.PackPath(pack), true
}

// candidatePack is the pack holding the most of a file's bytes at their own
// file offsets, if it holds at least half of them (0: none). offs[i] is
// chunk i's file offset, locs[i] its index location. GC's compaction uses
// the same rule to keep such packs whole (compact.go).
func candidatePack(size int64, offs []int64, locs []Location) (pack uint64) {
	if size == 0 {
		return 0
	}
	at := map[uint64]int64{}
	for i, l := range locs {
		if l.Pack != 0 && l.Off == offs[i] {
			at[l.Pack] += int64(l.Len)
		}
	}
	for p, n := range at {
		if n > at[pack] || (n == at[pack] && p < pack) {
			pack = p
		}
	}
	if pack == 0 || 2*at[pack] < size {
		return 0
	}
	return pack
}

// PackState says what is known about f's candidate pack in this run:
// its last check (nil: not checked yet, or the pack changed since).
func (s *Store) PackState(f *File) (pack uint64, check *PackCheck, ok bool) {
	pack, path, ok := f.PassthroughCandidate()
	if !ok {
		return 0, nil, false
	}
	fh, err := os.Open(path)
	if err != nil {
		return pack, nil, true
	}
	defer fh.Close()
	id, err := fileIdentity(fh)
	if err != nil {
		return pack, nil, true
	}
	v := &s.pverify
	v.mu.Lock()
	s.loadChecksLocked()
	c := v.recs[packFileKey{pack, f.ID}]
	v.mu.Unlock()
	if c == nil || c.Identity != id {
		return pack, nil, true
	}
	return pack, c, true
}

// OpenPassthrough returns a read-only descriptor of the pack that holds
// exactly f, for FUSE passthrough, after proving its bytes: a pack not
// checked in this run (or changed since its check) is hashed whole against
// f's manifest first; concurrent opens of one pack share that check. The
// descriptor returned is the one whose identity was checked. Errors:
// ErrNotWholeFile (no such pack: serve f through the daemon), ErrCorrupt
// (the pack holds a damaged chunk: the daemon path verifies each chunk and
// fails only the damaged ranges).
func (s *Store) OpenPassthrough(ctx context.Context, f *File) (*os.File, error) {
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
	key := packFileKey{pack, f.ID}
	v := &s.pverify
	// A pack that changed while it was being checked is checked once
	// more, then refused.
	for round := 0; ; round++ {
		id, err := candidateIdentity(fh, f)
		if err != nil {
			return nil, err
		}
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
		fl := v.flights[key]
		if fl == nil && round >= 2 {
			v.mu.Unlock()
			return nil, fmt.Errorf("passthrough %s: pack %s keeps changing while it is verified: %w",
				f.ID.Short(), path, errPackChanged)
		}
		if fl == nil {
			fl = &verifyFlight{done: make(chan struct{})}
			if v.flights == nil {
				v.flights = map[packFileKey]*verifyFlight{}
			}
			v.flights[key] = fl
			v.mu.Unlock()
			// The check outlives an interrupted opener: others may wait on it.
			fl.check, fl.err = s.checkPack(context.WithoutCancel(ctx), fh, pack, f, nil)
			s.record(key, fl.check, fl.err)
			v.mu.Lock()
			delete(v.flights, key)
			v.mu.Unlock()
			close(fl.done)
		} else {
			v.mu.Unlock()
			if fl.pcancel != nil { // a paced background check: this open waits for it
				fl.hurry.Store(true)
				fl.pcancel()
			}
			select {
			case <-fl.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if fl.err != nil && !errors.Is(fl.err, errPackChanged) {
			return nil, fmt.Errorf("passthrough %s: verify pack: %w", f.ID.Short(), fl.err)
		}
	}
}

// openCandidate opens f's candidate pack for passthrough, enabling
// fs-verity on it first where the file system has it (verity: enabled).
func (s *Store) openCandidate(f *File) (pack uint64, fh *os.File, verity bool, err error) {
	pack, path, ok := f.PassthroughCandidate()
	if !ok {
		return 0, nil, false, fmt.Errorf("passthrough %s: %w", f.ID.Short(), ErrNotWholeFile)
	}
	if fh, err = os.Open(path); err != nil {
		return 0, nil, false, fmt.Errorf("passthrough %s: %w", f.ID.Short(), err)
	}
	if s.verityAvailable() {
		verity = sealVerity(fh, s.log)
	}
	return pack, fh, verity, nil
}

// candidateIdentity is the identity of f's candidate pack open as fh,
// refusing one that is not exactly f's size.
func candidateIdentity(fh *os.File, f *File) (PackIdentity, error) {
	id, err := fileIdentity(fh)
	if err != nil {
		return id, err
	}
	if id.Size != f.M.Size {
		return id, fmt.Errorf("passthrough %s: pack %s is %d bytes, the file %d: %w",
			f.ID.Short(), fh.Name(), id.Size, f.M.Size, ErrNotWholeFile)
	}
	return id, nil
}

// useRecordLocked (v.mu held) reports whether a check of key's pack at
// identity id is recorded; if so err is its verdict for an open (nil:
// passthrough may use the pack; counted as a verity open when verity).
func (s *Store) useRecordLocked(key packFileKey, id PackIdentity, f *File, verity bool) (done bool, err error) {
	c := s.pverify.recs[key]
	if c == nil || c.Identity != id {
		return false, nil
	}
	if err := c.Err(); err != nil {
		return true, fmt.Errorf("passthrough %s: %w", f.ID.Short(), err)
	}
	if verity {
		s.pverify.verOp.Add(1)
	}
	return true, nil
}

// record keeps a finished check and logs a failed one.
func (s *Store) record(key packFileKey, c *PackCheck, err error) {
	if err != nil || c == nil {
		return
	}
	v := &s.pverify
	v.mu.Lock()
	s.loadChecksLocked()
	old := v.recs[key]
	v.recs[key] = c
	v.mu.Unlock()
	if c.OK() || (old != nil && old.OK()) {
		s.persistCheck(c)
	}
	if !c.ByReads {
		v.bytes.Add(c.Bytes)
	}
	if c.OK() {
		v.verified.Add(1)
		return
	}
	v.failed.Add(1)
	// A whole copy that fails its check is no use for passthrough: it
	// stops being one (its file is served by the node, which may make a
	// new one; compaction gives the old one's space back). Not under the
	// caller's locks.
	go s.dropFailedWhole(c.Pack)
	if errors.Is(c.Err(), ErrCorrupt) {
		s.log.Error("pack failed verification: its file is served by the node, which hashes every chunk", "err", c.Err())
	} else {
		s.log.Info("pack is not exactly the file: served by the node", "err", c.Err())
	}
}

// VerifyPack hashes f's candidate pack whole against f's manifest, now,
// whatever the record says, and records the result.
func (s *Store) VerifyPack(ctx context.Context, f *File) (*PackCheck, error) {
	pack, path, ok := f.PassthroughCandidate()
	if !ok {
		return nil, fmt.Errorf("verify pack of %s: %w", f.ID.Short(), ErrNotWholeFile)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("verify pack of %s: %w", f.ID.Short(), err)
	}
	defer fh.Close()
	c, err := s.checkPack(ctx, fh, pack, f, nil)
	s.record(packFileKey{pack, f.ID}, c, err)
	return c, err
}

// checkedHook, when set (tests), runs after a pack was hashed and before
// its identity is read again.
var checkedHook func(path string)

// errPackChanged: the pack's identity changed while it was hashed.
var errPackChanged = errors.New("pack changed while it was verified")

// Verification reads this much of a pack per batch, with verifyAhead
// batches read while one is hashed.
const (
	verifyWindow = 32 << 20
	verifyAhead  = 2
)

// checkPack hashes fh, chunk by chunk at the file's offsets, against f's
// manifest. Chunks whose index location is elsewhere (second copies, or
// a pack that is not this file) are checked first: a pack that is not
// this file fails fast. pace (may be nil) is called after each batch
// with its byte count, to rate-limit a scrub.
func (s *Store) checkPack(ctx context.Context, fh *os.File, pack uint64, f *File, pace func(int64) error) (*PackCheck, error) {
	start := time.Now()
	before, err := fileIdentity(fh)
	if err != nil {
		return nil, err
	}
	c := &PackCheck{Pack: pack, Path: fh.Name(), File: f.ID, Identity: before, Chunks: len(f.M.Chunks), At: start}
	c.Verity = hasVerity(fh)
	if before.Size != f.M.Size {
		return nil, fmt.Errorf("pack %s is %d bytes, the file %d: %w", fh.Name(), before.Size, f.M.Size, ErrNotWholeFile)
	}
	unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	var foreign, own []int
	for i, l := range f.locs {
		if l.Pack == pack && l.Off == f.offs[i] {
			own = append(own, i)
		} else {
			foreign = append(foreign, i)
		}
	}
	indexed := func(i int) bool { return f.locs[i].Pack == pack && f.locs[i].Off == f.offs[i] }
	check := func(order []int, stopOnBad bool) error {
		type batch struct {
			idx  []int
			reqs []*storeio.Request
			err  error
		}
		ctx, cancel := context.WithCancel(ctx)
		// The reads must be over before check returns: the caller closes
		// fh then, and a read still running would use a closed (or
		// reused) descriptor.
		var wg sync.WaitGroup
		defer func() {
			cancel()
			wg.Wait()
		}()
		fd := int(fh.Fd())
		batches := make(chan chan batch, verifyAhead)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(batches)
			for k := 0; k < len(order); {
				j, n := k, int64(0)
				for j < len(order) && (j == k || n+int64(f.M.Chunks[order[j]].Len) <= verifyWindow) {
					n += int64(f.M.Chunks[order[j]].Len)
					j++
				}
				fut := make(chan batch, 1)
				select {
				case batches <- fut:
				case <-ctx.Done():
					return
				}
				b := batch{idx: order[k:j]}
				for _, i := range b.idx {
					b.reqs = append(b.reqs, &storeio.Request{Fd: fd, Off: f.offs[i], Buf: make([]byte, f.M.Chunks[i].Len)})
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					b.err = s.io.Read(ctx, b.reqs)
					fut <- b
				}()
				k = j
			}
		}()
		for fut := range batches {
			b := <-fut
			if err := ctxErr(ctx); err != nil {
				return err
			}
			bad := make([]string, len(b.reqs))
			parallelFor(len(b.reqs), func(k int) {
				rq := b.reqs[k]
				switch {
				case rq.Err != nil:
					bad[k] = rq.Err.Error()
				case rq.N != len(rq.Buf):
					bad[k] = fmt.Sprintf("pack holds %d of its %d bytes", rq.N, len(rq.Buf))
				case Sum(rq.Buf) != f.M.Chunks[b.idx[k]].ID:
					bad[k] = "hash mismatch: the bytes on disk are not the chunk's"
				}
			})
			if b.err != nil && !errors.Is(b.err, context.Canceled) {
				// Per-request errors are reported above; a batch error
				// with none of them is the reader's own failure.
				any := false
				for _, e := range bad {
					any = any || e != ""
				}
				if !any {
					return b.err
				}
			}
			var n int64
			for k, rq := range b.reqs {
				i := b.idx[k]
				n += int64(len(rq.Buf))
				if bad[k] != "" {
					c.Bad = append(c.Bad, BadChunk{ID: f.M.Chunks[i].ID.String(), FileOff: f.offs[i],
						Len: int64(f.M.Chunks[i].Len), Indexed: indexed(i), Err: bad[k]})
				}
			}
			c.Bytes += n
			if pace != nil {
				if err := pace(n); err != nil {
					return err
				}
			}
			if stopOnBad && !c.OK() {
				return nil
			}
		}
		return ctxErr(ctx)
	}
	if err := check(foreign, true); err != nil {
		return nil, err
	}
	// A pack that is not this file (its other chunks live elsewhere) is
	// known now: hashing the rest would only confirm it.
	if c.OK() {
		if err := check(own, false); err != nil {
			return nil, err
		}
	}
	if checkedHook != nil {
		checkedHook(fh.Name())
	}
	after, err := fileIdentity(fh)
	if err != nil {
		return nil, err
	}
	if after != before {
		return nil, fmt.Errorf("%s: %w", fh.Name(), errPackChanged)
	}
	c.Elapsed = time.Since(start)
	return c, nil
}
