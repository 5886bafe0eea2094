package chunkstore

import "errors"

// Sentinel errors. Callers test with errors.Is; every error the store returns
// wraps one of these or an error from the operating system.
var (
	// ErrNotFound: no chunk, object, head or path of that name.
	ErrNotFound = errors.New("not found")
	// ErrCorrupt: bytes read back do not hash to their ID, or an index record
	// or manifest cannot be decoded.
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
)
