package chunkstore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fs-verity (Documentation/filesystems/fsverity.rst): once enabled on a
// file, the file is read-only for good and the kernel checks every page
// read from it (read, passthrough, mmap) against a Merkle tree, failing the
// read with EIO. Kylix enables it on a whole-file pack at its first
// passthrough open, before hashing the pack against the manifest: the
// check then proves the bytes the tree was built from, and the kernel keeps
// them. It is done at open rather than at commit because the importer's
// write descriptor is closed only after the commit (ETXTBSY before), and a
// file never opened through passthrough does not need it.
//
// Untested on our machines: their kernels report EOPNOTSUPP (ext4 without
// the verity feature; /sys/fs/ext4/features has no "verity"). The probe
// keeps the code off where it does not work.

// ProbeVerity reports whether fs-verity can be enabled on files in dir: it
// creates a small file there, tries, and removes it.
func ProbeVerity(dir string) error {
	f, err := os.CreateTemp(dir, ".verity-probe-*")
	if err != nil {
		return fmt.Errorf("fs-verity probe in %s: %w", dir, err)
	}
	name := f.Name()
	defer os.Remove(name)
	_, err = f.Write(make([]byte, 4096))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fs-verity probe in %s: %w", dir, err)
	}
	r, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("fs-verity probe in %s: %w", dir, err)
	}
	defer r.Close()
	if err := enableVerity(r); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) {
			return fmt.Errorf("fs-verity is not supported on %s (kernel or file system; ext4 needs `tune2fs -O verity`): %w", dir, err)
		}
		return fmt.Errorf("fs-verity probe in %s: %w", dir, err)
	}
	return nil
}

func enableVerity(f *os.File) error {
	arg := unix.FsverityEnableArg{Version: 1, Hash_algorithm: unix.FS_VERITY_HASH_ALG_SHA256, Block_size: 4096}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.FS_IOC_ENABLE_VERITY, uintptr(unsafe.Pointer(&arg)))
	if errno != 0 {
		return errno
	}
	return nil
}

// hasVerity reports whether fs-verity is enabled on f.
func hasVerity(f *os.File) bool {
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	return err == nil && flags&unix.FS_VERITY_FL != 0
}

// verityAvailable probes the packs directory once per store.
func (s *Store) verityAvailable() bool {
	v := &s.pverify
	v.verityOnce.Do(func() { v.verityErr = ProbeVerity(s.dir) })
	return v.verityErr == nil
}

// VerityStatus says whether whole-file packs get fs-verity, and why not.
func (s *Store) VerityStatus() error {
	s.verityAvailable()
	return s.pverify.verityErr
}

// sealVerity enables fs-verity on a read-only pack descriptor unless it
// is on already, and reports whether it is on.
func sealVerity(f *os.File, log *slog.Logger) bool {
	if hasVerity(f) {
		return true
	}
	if err := enableVerity(f); err != nil && !errors.Is(err, unix.EEXIST) {
		log.Warn("fs-verity: cannot seal pack; it is verified at open and by the scrub instead", "pack", f.Name(), "err", err)
		return false
	}
	return true
}

// HasVerity reports whether fs-verity is enabled on the file at path.
func HasVerity(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return hasVerity(f)
}
