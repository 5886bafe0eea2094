// Package vfs is the seam under the chunk store's pack and metadata-log file
// IO: an FS interface with the operations the store performs when it writes
// (create, open, write, sync, truncate, rename, remove, readdir, stat), the
// real operating-system implementation, and an error injector (errorfs.go)
// that fails the Nth operation of a kind. Fault tests are then ordinary,
// repeatable unit tests (the idea of pebble's vfs/errorfs) instead of random
// kill -9 runs.
//
// Reads of committed packs do not go through this seam: they are served by
// the store's storage reader (io_uring or pread on plain descriptors).
package vfs

import (
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// File is an open file of an FS.
type File interface {
	Name() string
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Write(p []byte) (int, error)
	// Sync makes the file's data durable (fdatasync).
	Sync() error
	Truncate(size int64) error
	Stat() (fs.FileInfo, error)
	Chmod(mode fs.FileMode) error
	Close() error
	// Fd returns the OS descriptor, or ^uintptr(0) when there is none
	// (used only for hints such as sync_file_range).
	Fd() uintptr
}

// FS is the set of file operations the store performs on packs and logs.
type FS interface {
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Remove(name string) error
	Rename(from, to string) error
	ReadDir(name string) ([]fs.DirEntry, error)
	Stat(name string) (fs.FileInfo, error)
	Truncate(name string, size int64) error
	Chmod(name string, mode fs.FileMode) error
	MkdirAll(name string, perm fs.FileMode) error
	// SyncDir makes the directory's entries (creations, renames,
	// removals) durable.
	SyncDir(name string) error
}

// Default is the operating system.
var Default FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Sync() error { return unix.Fdatasync(int(f.File.Fd())) }

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) Rename(from, to string) error                 { return os.Rename(from, to) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) Stat(name string) (fs.FileInfo, error)        { return os.Stat(name) }
func (osFS) Truncate(name string, size int64) error       { return os.Truncate(name, size) }
func (osFS) Chmod(name string, mode fs.FileMode) error    { return os.Chmod(name, mode) }
func (osFS) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(name, perm) }

func (osFS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
