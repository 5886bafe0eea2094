package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestInjectorFailsTheNthOperation(t *testing.T) {
	dir := t.TempDir()
	in := NewInjector(nil, &Fault{Op: OpWrite, N: 2, Err: syscall.ENOSPC, Short: true, Path: ".pack"})
	f, err := in.OpenFile(filepath.Join(dir, "a.pack"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Writes to other names are not counted.
	g, err := in.OpenFile(filepath.Join(dir, "b.meta"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := f.WriteAt([]byte("first"), 0); err != nil {
		t.Fatal(err)
	}
	n, err := f.WriteAt([]byte("second"), 5)
	if !errors.Is(err, syscall.ENOSPC) || n != 3 || !in.Fired() {
		t.Fatalf("second write: n=%d err=%v fired=%v", n, err, in.Fired())
	}
	b, _ := os.ReadFile(filepath.Join(dir, "a.pack"))
	if string(b) != "firstsec" {
		t.Fatalf("file holds %q, want the torn write %q", b, "firstsec")
	}
	if _, err := f.WriteAt([]byte("third"), 8); err != nil {
		t.Fatalf("only the chosen operation fails: %v", err)
	}
	if in.Count(OpWrite) != 3 {
		t.Fatalf("counted %d writes", in.Count(OpWrite))
	}
}

func TestInjectorCrashStopsEverything(t *testing.T) {
	dir := t.TempDir()
	in := NewInjector(nil, &Fault{Op: OpSync, N: 1, Crash: true})
	f, err := in.OpenFile(filepath.Join(dir, "a"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync: %v", err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a write after the crash: %v", err)
	}
	if err := in.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a rename after the crash: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
		t.Fatal("the rename happened")
	}
	in.Arm(nil)
	if err := in.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatalf("after Arm(nil): %v", err)
	}
}
