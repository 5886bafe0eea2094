package chunkstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore/internal/vfs"
	"github.com/kylix/kylix/chunkstore/storeio"
)

// Defaults for Options.
const (
	// DefaultLargeFileMin: files at least this large get a pack of their own.
	// Smaller files share packs and are served by the daemon, never by
	// passthrough (a shared pack holds other files' bytes past their end).
	DefaultLargeFileMin = 1 << 20
	// DefaultSharedPackMax: a shared pack is closed for appends past this size.
	DefaultSharedPackMax = 256 << 20
	// DefaultCacheBytes: verified chunks kept in memory for partial reads.
	DefaultCacheBytes = 256 << 20
)

// Options configure Open. The zero value of each field means its default.
type Options struct {
	// Dir is the data directory; created if missing.
	Dir string
	// Logger receives warnings found while opening (orphan packs removed,
	// torn writes cut off). Default: discard.
	Logger *slog.Logger
	// IO selects the storage reader: "pread" (the default), "io_uring", or
	// "auto" (io_uring, else pread; IOName says which and why). The store
	// reads through the page cache, where io_uring performs each cached
	// copy inside the submitting call, on one core: a pool of pread workers
	// copies on every core (export of a 512 MiB model, 2 cores: 2.08 GB/s
	// with pread, 1.57 GB/s with io_uring; docs/design/store.md). io_uring
	// pays off for O_DIRECT reads, which the GPU path makes.
	IO string
	// IODepth is the number of reads kept in flight. Default 64.
	IODepth      int
	LargeFileMin int64
	// SharedPackMax bounds the size a shared (small-file) pack grows to.
	SharedPackMax int64
	// SealInterval: handing out the current shared pack rotates it (no
	// append after a hand-out, seal.go) at most once per this interval;
	// 0 means DefaultSealInterval, negative no bound.
	SealInterval time.Duration
	// CacheBytes bounds the in-memory cache of verified chunks (the one
	// cache every reader shares, docs/design/access.md).
	CacheBytes int64
	// Fetcher brings chunks that are not stored locally. Default LocalOnly.
	Fetcher Fetcher
	// ReadAheadChunks is how many chunks past a sequential reader are
	// asked of the Fetcher ahead of it (readahead.go): 0 means
	// DefaultReadAheadChunks, negative none.
	ReadAheadChunks int
	// Now is the wall clock (tests use a fake). Default time.Now.
	Now func() time.Time
	// ReceivedGrace is how long GC keeps a chunk received from another
	// member that no head names yet (received.go). Default
	// DefaultReceivedGrace; tests shorten it.
	ReceivedGrace time.Duration
	// FS is the file system under pack writes and the metadata log
	// (internal/vfs). Tests set an error injector here; nil means the
	// operating system.
	FS vfs.FS
}

// Store is an open chunk store. It is safe for concurrent use.
type Store struct {
	opts Options
	dir  string
	log  *slog.Logger
	lock *os.File
	fs   vfs.FS
	db   *bolt.DB
	// mlog is the metadata log the index caches; commitMu orders appends
	// to it with the index transactions that apply them (metalog.go).
	mlog     *metaLog
	commitMu sync.Mutex
	// lastRead: the last day each file version was read (lastread.go).
	lastRead lastReads
	// testHookBeforeIndex, when set (tests only), runs between a commit's
	// log append and its index transaction; an error returned stops the
	// commit there, as a crash would.
	testHookBeforeIndex func() error
	io                  storeio.Reader
	ioNote              string
	clock               *Clock
	cache               *chunkCache
	// packs is the one table of open pack files, with the leases that
	// keep GC off them (packs.go).
	packs   *packTable
	fetcher Fetcher
	// prefetch bounds the background prefetches in flight (File.Prefetch).
	prefetch chan struct{}

	// gcMu: imports hold it shared while they have uncommitted or
	// unreferenced data; GC holds it exclusively.
	gcMu sync.RWMutex
	// wholeMu: one MakeWhole at a time (whole.go).
	wholeMu sync.Mutex
	// madeHere: the rank layouts made on this member (ranklayout.go).
	madeHere layoutsMade
	// layoutDirAt: the rank layout directory of the current root.
	layoutDirAt layoutDirCache
	// wholeUsage: WholeUsage's last count (whole.go).
	wholeUsage wholeUsageCache
	// nsMu serialises namespace updates (read-modify-write of the tree).
	nsMu sync.Mutex

	mu       sync.Mutex
	closed   bool
	refs     int // extra references taken by Retain
	nextPack uint64
	shared   *sharedPack // current shared pack, nil when none is open
	sharedMu sync.Mutex  // held by the importer appending to shared
	seal     sealState   // hand-outs of the shared pack (seal.go); under mu

	pverify packVerifier // passthrough verification record (packverify.go)
	ctr     counters     // for metrics (counters.go)
	pchunks chunkChecks  // checks of a file's chunks in a shared pack (packchunks.go)

	// relocs counts compaction commits that moved chunks (File.Fresh).
	relocs atomic.Uint64
	// commits counts index transactions that applied records, bumped after
	// each one returns; root is the namespace head read at a count
	// (namespace.go: Root, which every path lookup of the mount asks).
	commits atomic.Uint64
	root    atomic.Pointer[cachedRoot]
	// opened keeps the last large files opened (read.go).
	opened openCache

	// recv: chunks received from members, kept by GC within
	// the grace (received.go).
	recv      receivedSet
	recvGrace time.Duration // Options.ReceivedGrace
	// beforeGC: what Collect runs first (SetBeforeGC).
	beforeGC atomic.Pointer[func(context.Context) error]
	afterGC  atomic.Pointer[func(context.Context)] // SetAfterGC
	// raReaders: the files being read, sharing the read-ahead budget
	// (readahead.go).
	raReaders raReaders
}

type sharedPack struct {
	id   uint64
	f    vfs.File
	size int64 // committed or written size; appends go at AlignUp(size)
}

// Open opens (creating if needed) the store in opts.Dir, takes its lock and
// repairs what a crash left: the index is brought level with the metadata
// log, bytes past a pack's committed size are cut off, and packs that the log
// proves were begun and never committed are removed. A missing or unreadable
// index with packs present is never repaired by deleting anything: Open
// returns ErrIndexDamaged, naming the command that rebuilds it.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("open: no data directory given")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.IO == "" {
		opts.IO = "pread"
	}
	if opts.IODepth <= 0 {
		opts.IODepth = 64
	}
	if opts.LargeFileMin <= 0 {
		opts.LargeFileMin = DefaultLargeFileMin
	}
	if opts.SharedPackMax <= 0 {
		opts.SharedPackMax = DefaultSharedPackMax
	}
	if opts.SealInterval == 0 {
		opts.SealInterval = DefaultSealInterval
	}
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.Fetcher == nil {
		opts.Fetcher = LocalOnly{}
	}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", opts.Dir, err)
	}
	if err := opts.FS.MkdirAll(filepath.Join(dir, "packs"), 0o700); err != nil {
		return nil, fmt.Errorf("open the data directory %s: %w", dir, err)
	}
	s := &Store{
		opts:  opts,
		fs:    opts.FS,
		dir:   dir,
		log:   opts.Logger,
		clock: NewClock(opts.Now),
		cache: newChunkCache(opts.CacheBytes, opts.Now),
		// A prefetch reads a window of chunks in one batch on all
		// cores; a few windows ahead keep the disk and the hashing busy.
		prefetch:  make(chan struct{}, prefetchInFlight),
		fetcher:   opts.Fetcher,
		recvGrace: cmp.Or(opts.ReceivedGrace, DefaultReceivedGrace),
	}
	s.packs = newPackTable(s)
	if err := s.takeLock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.closeAll()
		}
	}()
	if err := s.fixPerms(); err != nil {
		return nil, err
	}
	if err := s.openIndex(); err != nil {
		return nil, err
	}
	if err := s.recoverPacks(); err != nil {
		return nil, err
	}
	s.loadReceived()
	if err := s.observeHeads(); err != nil {
		return nil, err
	}
	s.io, s.ioNote, err = openReader(opts.IO, opts.IODepth)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	ok = true
	return s, nil
}

func openReader(prefer string, depth int) (storeio.Reader, string, error) {
	r, err := storeio.New(prefer, depth)
	if err != nil {
		return nil, "", err
	}
	note := r.Name()
	if prefer == "auto" && r.Name() != "io_uring" {
		if perr := storeio.Probe(); perr != nil {
			note = fmt.Sprintf("%s (io_uring unavailable: %v)", r.Name(), perr)
		}
	}
	return r, note, nil
}

// Dir returns the store's data directory (absolute).
func (s *Store) Dir() string { return s.dir }

// IOName says which storage reader runs, and why not io_uring if it does not.
func (s *Store) IOName() string { return s.ioNote }

// Reader returns the store's storage reader (shared; do not close it).
func (s *Store) Reader() storeio.Reader { return s.io }

// Clock returns the store's hybrid logical clock.
func (s *Store) Clock() *Clock { return s.clock }

func (s *Store) takeLock() error {
	path := filepath.Join(s.dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another process"
			if pid := strings.TrimSpace(string(holder)); pid != "" {
				who = "pid " + pid
			}
			return fmt.Errorf("%s is in use by %s: %w", s.dir, who, ErrLocked)
		}
		return fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid only makes the "in use by" message better: failing to
	// write it is worth a warning, not a refusal to open.
	if err := f.Truncate(0); err != nil {
		s.log.Warn("cannot record pid in lock file", "path", path, "err", err)
	} else if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		s.log.Warn("cannot record pid in lock file", "path", path, "err", err)
	}
	s.lock = f
	return nil
}

// Retain adds a reference to s: the next Close drops that reference
// instead of closing the store. A process that keeps the store open (the
// node) hands it to code that closes what it opens this way.
func (s *Store) Retain() {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
}

// Close releases the store (or drops a reference taken by Retain). Readers
// still in use get ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.refs > 0 {
		s.refs--
		s.mu.Unlock()
		return nil
	}
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	return s.closeAll()
}

func (s *Store) closeAll() error {
	var errs []error
	s.stopBackground() // background pack checks (packprogress.go)
	if s.db != nil {
		errs = append(errs, s.FlushLastRead())
	}
	s.packs.close()
	s.mu.Lock()
	if s.shared != nil {
		s.shared.f.Close()
		s.shared = nil
	}
	s.mu.Unlock()
	if s.mlog != nil {
		errs = append(errs, s.mlog.close())
	}
	if s.io != nil {
		errs = append(errs, s.io.Close())
	}
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// PackPath returns the path of pack id's file.
func (s *Store) PackPath(id uint64) string {
	return filepath.Join(s.dir, "packs", fmt.Sprintf("%016x.pack", id))
}

func parsePackName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ".pack")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	return id, err == nil
}

// recoverPacks reconciles pack files with the index (already level with the
// metadata log) after a crash. It removes only packs the log proves were
// begun and never committed (an intent record and no commit); a pack the
// index does not know without such proof is left alone and reported.
func (s *Store) recoverPacks() error {
	ents, err := s.fs.ReadDir(s.packsDir())
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	onDisk := map[uint64]bool{}
	for _, e := range ents {
		if id, ok := parsePackName(e.Name()); ok {
			onDisk[id] = true
			s.nextPack = max(s.nextPack, id+1)
		}
	}
	known := map[uint64]packInfo{}
	intents := map[uint64]bool{}
	err = s.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketPacks).ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("pack key of %d bytes: %w", len(k), ErrCorrupt)
			}
			pi, err := decodePackInfo(v)
			if err != nil {
				return err
			}
			id := beUint64(k)
			known[id] = pi
			s.nextPack = max(s.nextPack, id+1)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketIntents).ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return fmt.Errorf("intent key of %d bytes: %w", len(k), ErrCorrupt)
			}
			id := beUint64(k)
			intents[id] = true
			s.nextPack = max(s.nextPack, id+1)
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	var abandon []record
	for id := range intents {
		if _, ok := known[id]; ok {
			continue
		}
		if onDisk[id] {
			s.log.Warn("removing pack begun by a write that never committed", "pack", s.PackPath(id))
			if err := s.fs.Remove(s.PackPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("recover: %w", err)
			}
			delete(onDisk, id)
		}
		abandon = append(abandon, record{kind: recAbandon, pack: id})
	}
	if len(abandon) > 0 {
		if err := s.fs.SyncDir(s.packsDir()); err != nil {
			return fmt.Errorf("recover: %w", err)
		}
		if err := s.commit(abandon); err != nil {
			return fmt.Errorf("recover: %w", err)
		}
	}
	for id := range onDisk {
		path := s.PackPath(id)
		pi, ok := known[id]
		if !ok {
			s.log.Warn("pack unknown to the index and its metadata log; left in place (kylix fsck lists it)", "pack", path)
			continue
		}
		st, err := s.fs.Stat(path)
		if err != nil {
			return fmt.Errorf("recover: %w", err)
		}
		if st.Size() > pi.Size {
			s.log.Warn("cutting uncommitted bytes off pack", "pack", path, "size", st.Size(), "committed", pi.Size)
			if err := s.fs.Truncate(path, pi.Size); err != nil {
				return fmt.Errorf("recover: %w", err)
			}
		} else if st.Size() < pi.Size {
			s.log.Error("pack is shorter than committed; verify will list what is lost", "pack", path, "size", st.Size(), "committed", pi.Size)
		}
	}
	for id := range known {
		if !onDisk[id] {
			s.log.Error("pack missing; verify will list what is lost", "pack", s.PackPath(id))
		}
	}
	return nil
}

// Permission rule: the data directory and packs directory are 0700, every
// file in them 0600. Packs hold bytes of files the mount may refuse to show
// a user, and the index holds names from private directories; only the
// node's user reads them. Checked at every open: wrong modes are fixed and
// reported.
const (
	dirPerm  fs.FileMode = 0o700
	filePerm fs.FileMode = 0o600
)

func (s *Store) fixPerms() error {
	var fixed []string
	fix := func(path string, want fs.FileMode) error {
		stat := os.Lstat
		if want == dirPerm {
			// The data directory may be a symlink the admin made
			// (/var/lib/kylix -> /data/kylix): check what it names.
			stat = os.Stat
		}
		st, err := stat(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		if st.Mode()&os.ModeSymlink != 0 || st.Mode().Perm() == want {
			return nil
		}
		if err := s.fs.Chmod(path, want); err != nil {
			return fmt.Errorf("open: fix permissions of %s: %w", path, err)
		}
		fixed = append(fixed, fmt.Sprintf("%s (was %o)", path, st.Mode().Perm()))
		return nil
	}
	for _, p := range []string{s.dir, s.packsDir()} {
		if err := fix(p, dirPerm); err != nil {
			return err
		}
	}
	for _, name := range []string{"index.db", "LOCK"} {
		if err := fix(filepath.Join(s.dir, name), filePerm); err != nil {
			return err
		}
	}
	ents, err := s.fs.ReadDir(s.packsDir())
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := fix(filepath.Join(s.packsDir(), e.Name()), filePerm); err != nil {
				return err
			}
		}
	}
	if len(fixed) > 0 {
		ex := fixed[:min(len(fixed), 3)]
		s.log.Warn("data directory was readable by other users; permissions fixed (dirs 0700, files 0600)", "fixed", len(fixed), "examples", strings.Join(ex, ", "))
	}
	return nil
}

// observeHeads moves the clock past every stored head, so that updates made
// after a restart order after those made before it even if the wall clock
// stepped back.
func (s *Store) observeHeads() error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketHeads).ForEach(func(k, v []byte) error {
			h, err := decodeHead(string(k), v)
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			s.clock.Observe(h.HLC)
			return nil
		})
	})
}

func beUint64(b []byte) uint64 {
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// GetObject returns the bytes of a stored manifest, verified against id.
func (s *Store) GetObject(id ID) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = objectIn(tx.Bucket(bucketObjects), id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// objectIn returns a copy of object id from the objects bucket b of a
// transaction (its memory is not ours to keep), checked against its ID.
func objectIn(b *bolt.Bucket, id ID) ([]byte, error) {
	v := b.Get(id[:])
	if v == nil {
		return nil, fmt.Errorf("object %s: %w", id.Short(), ErrNotFound)
	}
	out := append([]byte(nil), v...)
	if Sum(out) != id {
		return nil, fmt.Errorf("object %s: hash mismatch: %w", id.Short(), ErrCorrupt)
	}
	return out, nil
}

// FileManifest loads and decodes the file manifest id.
func (s *Store) FileManifest(id ID) (*FileManifest, error) {
	b, err := s.GetObject(id)
	if err != nil {
		return nil, err
	}
	m, err := DecodeFileManifest(b)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", id.Short(), err)
	}
	return m, nil
}

// DirManifest loads and decodes the directory manifest id.
func (s *Store) DirManifest(id ID) (*DirManifest, error) {
	b, err := s.GetObject(id)
	if err != nil {
		return nil, err
	}
	m, err := DecodeDirManifest(b)
	if err != nil {
		return nil, fmt.Errorf("object %s: %w", id.Short(), err)
	}
	return m, nil
}

// GetHead returns the head name.
func (s *Store) GetHead(name string) (Head, error) {
	var h Head
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketHeads).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("head %q: %w", name, ErrNotFound)
		}
		var err error
		h, err = decodeHead(name, v)
		return err
	})
	return h, err
}

// Heads lists every head.
func (s *Store) Heads() ([]Head, error) {
	var hs []Head
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketHeads).ForEach(func(k, v []byte) error {
			h, err := decodeHead(string(k), v)
			if err != nil {
				return err
			}
			hs = append(hs, h)
			return nil
		})
	})
	return hs, err
}

// ctxErr is a cheap cancellation check for loops.
func ctxErr(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	default:
		return nil
	}
}
