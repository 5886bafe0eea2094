// Package fstest mounts a Kylix file system in-process for tests.
package fstest

import (
	"os"
	"testing"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/internal/testneeds"
)

// RequireFUSE skips t unless it runs as root, and fails it (through
// testneeds) where /dev/fuse is missing.
func RequireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("FUSE mount tests need root (DirectMount and passthrough); CI runs them as root")
	}
	testneeds.FUSE(t)
}

// Mounted is a store with its namespace mounted.
type Mounted struct {
	Store *chunkstore.Store
	FS    *kfs.FS
	Dir   string // the mount point
	Data  string // the data directory
}

// Mount opens a fresh store in a temporary directory and mounts it; the
// cleanup unmounts and closes.
func Mount(t testing.TB, opts kfs.Options) *Mounted {
	t.Helper()
	RequireFUSE(t)
	data := t.TempDir()
	return MountStore(t, data, opts)
}

// MountStore opens the store in data and mounts it.
func MountStore(t testing.TB, data string, opts kfs.Options) *Mounted {
	t.Helper()
	RequireFUSE(t)
	s, err := chunkstore.Open(chunkstore.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := kfs.New(s, opts)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := fsys.Mount(mnt); err != nil {
		s.Close()
		t.Fatal(err)
	}
	m := &Mounted{Store: s, FS: fsys, Dir: mnt, Data: data}
	t.Cleanup(func() {
		if err := fsys.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		s.Close()
	})
	return m
}
