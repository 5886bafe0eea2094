//go:build !linux

package storeio

import "fmt"

// UringOptions configures NewUring.
type UringOptions struct {
	// Depth is the most reads in flight at once, over all callers
	// (DefaultDepth when <= 0, at most MaxDepth).
	Depth int
}

// MaxDepth caps UringOptions.Depth.
const MaxDepth = 4096

// NewUring always fails with ErrUnavailable: io_uring is Linux only.
func NewUring(opts UringOptions) (Reader, error) { return nil, Probe() }

// Probe reports why io_uring cannot run: it is Linux only.
func Probe() error { return fmt.Errorf("io_uring is Linux only: %w", ErrUnavailable) }
