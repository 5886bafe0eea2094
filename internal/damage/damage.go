// Package damage breaks files on purpose, for tests that check what Kylix
// does with bytes that changed on disk behind its back: every such test
// flips bytes the same way and fails loudly if it could not (a test whose
// corruption silently did not happen would pass for the wrong reason).
package damage

import (
	"os"
	"testing"
)

// FlipByte inverts some bits of the byte at off in the file at path and
// returns the byte as it was. It fails tb if the file cannot be changed.
func FlipByte(tb testing.TB, path string, off int64) (old byte) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		tb.Fatalf("damage: %v", err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		tb.Fatalf("damage: read %s at %d: %v", path, off, err)
	}
	old = b[0]
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		tb.Fatalf("damage: write %s at %d: %v", path, off, err)
	}
	return old
}
