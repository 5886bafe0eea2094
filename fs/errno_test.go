package fs

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/kylix/kylix/chunkstore"
)

// TestErrnoOfChunkFailures: a chunk that is corrupt or not stored here is
// EIO for the reader; ENOENT is only for names (issue 7: a missing chunk
// reached readers as ENOENT).
func TestErrnoOfChunkFailures(t *testing.T) {
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{fmt.Errorf("read: %w", chunkstore.ErrNotLocal), syscall.EIO},
		{fmt.Errorf("read: %w", &chunkstore.CorruptError{Reason: "hash mismatch"}), syscall.EIO},
		{&chunkstore.ReadError{Err: syscall.EIO}, syscall.EIO},
		{fmt.Errorf("lookup: %w", chunkstore.ErrNotFound), syscall.ENOENT},
	} {
		if got := toErrno(c.err); got != c.want {
			t.Errorf("toErrno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
