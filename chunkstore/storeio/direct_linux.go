package storeio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenDirect opens path read-only with O_DIRECT. When the filesystem refuses
// O_DIRECT (EINVAL from open), the error wraps ErrNoDirect. Requests on the
// file's Fd need aligned offsets, lengths and buffers (see AlignedBuffer).
//
// Note that tmpfs accepts O_DIRECT since Linux 6.6 without doing direct I/O;
// ProbeDirect reports that case.
func OpenDirect(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("%w: %w", ErrNoDirect, err)
		}
		return nil, err
	}
	return f, nil
}

// memoryFS names filesystems that accept O_DIRECT without doing direct I/O.
var memoryFS = map[int64]string{
	unix.TMPFS_MAGIC: "tmpfs",
	unix.RAMFS_MAGIC: "ramfs",
}

// ProbeDirect reports whether files in dir can be read with O_DIRECT: nil, or
// an error wrapping ErrNoDirect when the filesystem refuses it or only
// pretends (tmpfs), or another error when dir cannot be used at all. It writes,
// reads back and removes a small temporary file in dir. For kylix doctor.
func ProbeDirect(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if name, ok := memoryFS[int64(st.Type)]; ok {
		return fmt.Errorf("%s is on %s, which accepts O_DIRECT but serves it from memory: %w", dir, name, ErrNoDirect)
	}
	f, err := os.CreateTemp(dir, ".kylix-direct-probe-*")
	if err != nil {
		return fmt.Errorf("probe O_DIRECT: %w", err)
	}
	name := f.Name()
	defer os.Remove(name)
	want := make([]byte, 2*BlockSize)
	_, _ = rand.Read(want)
	_, err = f.Write(want)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("probe O_DIRECT: %w", err)
	}
	d, err := OpenDirect(name)
	if err != nil {
		return err
	}
	defer d.Close()
	buf := AlignedBuffer(BlockSize)
	n, err := unix.Pread(int(d.Fd()), buf, BlockSize)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("aligned O_DIRECT read in %s: %w: %w", dir, ErrNoDirect, err)
		}
		return fmt.Errorf("aligned O_DIRECT read in %s: %w", dir, err)
	}
	if n != BlockSize || !bytes.Equal(buf, want[BlockSize:]) {
		return fmt.Errorf("O_DIRECT read in %s returned %d bytes, not what was written", dir, n)
	}
	return nil
}
