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
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store is closed")
	// ErrNotWholeFile: no pack holds exactly the file's bytes, so it cannot
	// be served by FUSE passthrough (the node serves it).
	ErrNotWholeFile = errors.New("no pack holds exactly the file")
)
