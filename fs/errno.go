package fs

import (
	"context"
	"errors"
	"io"
	"syscall"

	"github.com/kylix/kylix/chunkstore"
)

// toErrno is the one mapping from Go errors to the errno a FUSE request
// answers with.
func toErrno(err error) syscall.Errno {
	if err == nil || errors.Is(err, io.EOF) {
		return 0
	}
	var en syscall.Errno
	switch {
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
	// ErrCorrupt, ErrClosed and everything unexpected.
	return syscall.EIO
}
