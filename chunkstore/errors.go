package chunkstore

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers test with errors.Is; every error the store returns
// wraps one of these or an error from the operating system. Each sentinel
// means one condition (docs/design/access.md).
var (
	// ErrNotFound: no object, head or namespace path of that name. It never
	// means "a chunk is not here": that is ErrNotLocal.
	ErrNotFound = errors.New("not found")
	// ErrNotLocal: a chunk a file needs is not stored on this node (and no
	// Fetcher could bring it). Readers see it as EIO, never ENOENT: the
	// file exists, its bytes cannot be read here.
	ErrNotLocal = errors.New("chunk not stored locally")
	// ErrCorrupt: bytes read back do not hash to their ID, a pack holds
	// fewer bytes than the index says, or an index record or manifest
	// cannot be decoded. Chunk read failures are *CorruptError values that
	// name the chunk and where it was read.
	ErrCorrupt = errors.New("corrupt data")
	// ErrLocked: another process holds the store's lock.
	ErrLocked = errors.New("store is locked by another process")
	// ErrInvalidPath: a namespace path that is empty where a name is needed,
	// escapes the namespace (".."), or holds a NUL or an over-long name.
	ErrInvalidPath = errors.New("invalid namespace path")
	// ErrNotDir: a path component that should be a directory is not one.
	ErrNotDir = errors.New("not a directory")
	// ErrIsDir: a file operation on a directory.
	ErrIsDir = errors.New("is a directory")
	// ErrExists: the path exists and the operation would replace it.
	ErrExists = errors.New("already exists")
	// ErrNotEmpty: removing a directory that still has entries.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrIndexDamaged: the index (index.db) is missing, empty, truncated or
	// unreadable while the data directory holds packs. Nothing was deleted;
	// the index is rebuilt from the packs' metadata log by
	// `kylix fsck --rebuild-index` (RebuildIndex).
	ErrIndexDamaged = errors.New("index missing or damaged")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store is closed")
	// ErrNotWholeFile: no pack holds exactly the file's bytes, so it cannot
	// be served by FUSE passthrough (the node serves it).
	ErrNotWholeFile = errors.New("no pack holds exactly the file")
	// ErrAlreadyWhole: the file has a pack that can back passthrough
	// already; MakeWhole has nothing to do.
	ErrAlreadyWhole = errors.New("a pack holds exactly the file already")
	// ErrPackUnchecked: the file's pack has no valid check yet; the check
	// runs in the background (Store.TryOpenPassthrough) and the open is
	// served by the node, which hashes every chunk, until it passes.
	ErrPackUnchecked = errors.New("served by the node until the pack check finishes")
	// ErrUnsafeSymlink: export, run as root, met a symlink owned by
	// another user on the way to its destination, and did not follow it:
	// that user could point it anywhere (docs/design/rootops.md).
	ErrUnsafeSymlink = errors.New("symlink owned by another user")
	// ErrSourceChanged: an import source file was replaced between its
	// fstat and the open that reads it (only where /proc is not mounted and
	// the file must be opened again by name; docs/design/rootops.md).
	ErrSourceChanged = errors.New("changed while being imported")
	// ErrFileChanged: a file whose content changed while it was being
	// converted (coded or made warm again); nothing of it was changed.
	ErrFileChanged = errors.New("file changed during the conversion; run it again")
)

// CorruptError is a chunk whose stored bytes cannot be used: they do not hash
// to its ID, or the pack holds fewer of them than the index says. It matches
// ErrCorrupt with errors.Is and names everything an operator needs to find
// the damage (kylix verify lists the files that use the chunk).
type CorruptError struct {
	Chunk   ID
	Pack    uint64 // 0: not read from a pack (a fetched chunk)
	PackOff int64
	Path    string // the file being read, when the caller knows it
	Reason  string // "hash mismatch", "pack holds 12 of its 4096 bytes", ...
}

func (e *CorruptError) Error() string {
	where := "fetched copy"
	if e.Pack != 0 {
		where = fmt.Sprintf("pack %016x at %d", e.Pack, e.PackOff)
	}
	s := fmt.Sprintf("chunk %s (%s): %s", e.Chunk.Short(), where, e.Reason)
	if e.Path != "" {
		s = e.Path + ": " + s
	}
	return s + ": " + ErrCorrupt.Error()
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// WithPath returns err with path recorded in the first *CorruptError it
// wraps (a copy: the original may be shared by other readers of the chunk).
// Other errors are returned unchanged.
func WithPath(err error, path string) error {
	var ce *CorruptError
	if path == "" || !errors.As(err, &ce) || ce.Path != "" {
		return err
	}
	c := *ce
	c.Path = path
	return &c
}

// ReadError is a chunk whose pack could not be read (an I/O error from the
// disk). It names the chunk and where it was read, and wraps the error (a
// syscall.Errno such as EIO), so errors.Is(err, syscall.EIO) works.
type ReadError struct {
	Chunk   ID
	Pack    uint64
	PackOff int64
	Err     error
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("chunk %s (pack %016x at %d): read: %v", e.Chunk.Short(), e.Pack, e.PackOff, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }

// Logged reports whether err is a chunk failure the store has already logged
// when it happened (corrupt, not local, unreadable): callers that pass it on
// need not log it again for every request that meets it.
func Logged(err error) bool {
	var re *ReadError
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotLocal) || errors.As(err, &re)
}

// PathError is an error about a namespace path: what was being done, the
// path, and what went wrong (ErrNotFound, ErrNotDir, ErrIsDir, ErrNotEmpty,
// ...: errors.Is sees through it). Front ends word it for their users from
// these fields (kylix: "models/x: no such file or directory in the store").
type PathError struct {
	Op   string // lookup, list, remove, rename, open
	Path string // the namespace path the error is about
	Err  error
}

func (e *PathError) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }

func (e *PathError) Unwrap() error { return e.Err }
