package fs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"syscall"

	"github.com/kylix/kylix/chunkstore"
)

// toErrno is the one mapping from Go errors to the errno a FUSE request
// answers with (docs/design/access.md). A chunk that is corrupt or not
// stored here is EIO, never ENOENT: the file exists, its bytes cannot be
// read.
func toErrno(err error) syscall.Errno {
	if err == nil || errors.Is(err, io.EOF) {
		return 0
	}
	var en syscall.Errno
	switch {
	case errors.Is(err, chunkstore.ErrCorrupt), errors.Is(err, chunkstore.ErrNotLocal):
		return syscall.EIO
	case errors.Is(err, chunkstore.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, chunkstore.ErrNotDir):
		return syscall.ENOTDIR
	case errors.Is(err, chunkstore.ErrIsDir):
		return syscall.EISDIR
	case errors.Is(err, chunkstore.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, chunkstore.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, chunkstore.ErrInvalidPath):
		return syscall.EINVAL
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	case errors.As(err, &en):
		return en
	}
	// ErrClosed and everything unexpected.
	return syscall.EIO
}

// logReadError logs a failed read the store has not logged already: the
// store logs each failed chunk once (chunkstore's failure memory), so the
// retries the kernel and the application make add no line per request.
func logReadError(log *slog.Logger, version chunkstore.ID, off int64, err error) {
	if chunkstore.Logged(err) || errors.Is(err, context.Canceled) {
		log.Debug("read", "version", version.Short(), "off", off, "err", err)
		return
	}
	log.Error("read", "version", version.Short(), "off", off, "err", err)
}
