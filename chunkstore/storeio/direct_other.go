//go:build !linux

package storeio

import (
	"fmt"
	"os"
)

// OpenDirect fails with ErrNoDirect: O_DIRECT is Linux only here.
func OpenDirect(path string) (*os.File, error) {
	return nil, fmt.Errorf("open %s: O_DIRECT is Linux only: %w", path, ErrNoDirect)
}

// ProbeDirect fails with ErrNoDirect: O_DIRECT is Linux only here.
func ProbeDirect(dir string) error {
	return fmt.Errorf("%s: O_DIRECT is Linux only: %w", dir, ErrNoDirect)
}
