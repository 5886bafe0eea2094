package vfs

import (
	"fmt"
	"io/fs"
	"sync"
	"syscall"
)

// Op is a kind of file operation, for injection.
type Op int

// Operation kinds counted by the injector.
const (
	OpCreate   Op = iota // OpenFile with O_CREATE
	OpOpen               // OpenFile without O_CREATE
	OpWrite              // Write and WriteAt
	OpSync               // File.Sync and SyncDir
	OpTruncate           // File.Truncate and FS.Truncate
	OpRename
	OpRemove
	OpReadDir
	OpStat
	OpRead // ReadAt
	OpChmod
	OpMkdir
	OpClose
	numOps
)

var opNames = [...]string{"create", "open", "write", "sync", "truncate", "rename", "remove", "readdir", "stat", "read", "chmod", "mkdir", "close"}

func (o Op) String() string {
	if o >= 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op%d", int(o))
}

// Fault says which operation fails and how.
type Fault struct {
	Op Op
	// N: the Nth operation of kind Op (counting from 1) fails.
	N int
	// Err is returned (wrapped in an *fs.PathError); default EIO.
	Err error
	// Short: a write writes half its bytes before failing (a torn write).
	Short bool
	// Path, if set, limits counting to operations on names ending with it
	// (".pack", ".meta", ...).
	Path string
	// Crash: from the failing operation on, every operation of every kind
	// fails, as if the process had been killed there (kill -9: what was
	// written before stays in the page cache and reaches the disk; nothing
	// after happens).
	Crash bool
}

// Injector wraps an FS and fails one chosen operation. It counts every
// operation by kind (Count) so a test can first run a workload cleanly,
// read the counts, then fail each operation in turn.
type Injector struct {
	FS      FS
	mu      sync.Mutex
	fault   *Fault
	count   [numOps]int
	fired   bool
	crashed bool
}

// Arm sets the fault (nil: none) and restarts the counts, so operations
// made before (opening the store, say) do not count.
func (in *Injector) Arm(f *Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.fault, in.count, in.fired, in.crashed = f, [numOps]int{}, false, false
}

// NewInjector wraps fsys (Default if nil) with fault f (nil: count only).
func NewInjector(fsys FS, f *Fault) *Injector {
	if fsys == nil {
		fsys = Default
	}
	return &Injector{FS: fsys, fault: f}
}

// Count returns how many operations of kind op were made.
func (in *Injector) Count(op Op) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.count[op]
}

// Fired reports whether the fault was injected.
func (in *Injector) Fired() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.fired
}

// hit counts an operation and says whether it must fail.
func (in *Injector) hit(op Op, name string) *Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	f := in.fault
	if in.crashed {
		return f
	}
	if f != nil && f.Path != "" && !hasSuffix(name, f.Path) {
		return nil
	}
	in.count[op]++
	if f == nil || f.Op != op || in.count[op] != f.N {
		return nil
	}
	in.fired = true
	in.crashed = f.Crash
	return f
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

func (f *Fault) err(op Op, name string) error {
	e := f.Err
	if e == nil {
		e = syscall.EIO
	}
	return &fs.PathError{Op: "injected " + op.String(), Path: name, Err: e}
}

func (in *Injector) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	op := OpOpen
	if flag&syscall.O_CREAT != 0 {
		op = OpCreate
	}
	if f := in.hit(op, name); f != nil {
		return nil, f.err(op, name)
	}
	file, err := in.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &injFile{File: file, in: in}, nil
}

func (in *Injector) Remove(name string) error {
	if f := in.hit(OpRemove, name); f != nil {
		return f.err(OpRemove, name)
	}
	return in.FS.Remove(name)
}

func (in *Injector) Rename(from, to string) error {
	if f := in.hit(OpRename, to); f != nil {
		return f.err(OpRename, to)
	}
	return in.FS.Rename(from, to)
}

func (in *Injector) ReadDir(name string) ([]fs.DirEntry, error) {
	if f := in.hit(OpReadDir, name); f != nil {
		return nil, f.err(OpReadDir, name)
	}
	return in.FS.ReadDir(name)
}

func (in *Injector) Stat(name string) (fs.FileInfo, error) {
	if f := in.hit(OpStat, name); f != nil {
		return nil, f.err(OpStat, name)
	}
	return in.FS.Stat(name)
}

func (in *Injector) Truncate(name string, size int64) error {
	if f := in.hit(OpTruncate, name); f != nil {
		return f.err(OpTruncate, name)
	}
	return in.FS.Truncate(name, size)
}

func (in *Injector) Chmod(name string, mode fs.FileMode) error {
	if f := in.hit(OpChmod, name); f != nil {
		return f.err(OpChmod, name)
	}
	return in.FS.Chmod(name, mode)
}

func (in *Injector) MkdirAll(name string, perm fs.FileMode) error {
	if f := in.hit(OpMkdir, name); f != nil {
		return f.err(OpMkdir, name)
	}
	return in.FS.MkdirAll(name, perm)
}

func (in *Injector) SyncDir(name string) error {
	if f := in.hit(OpSync, name); f != nil {
		return f.err(OpSync, name)
	}
	return in.FS.SyncDir(name)
}

type injFile struct {
	File
	in *Injector
}

func (f *injFile) write(p []byte, fn func([]byte) (int, error)) (int, error) {
	if fl := f.in.hit(OpWrite, f.Name()); fl != nil {
		n := 0
		if fl.Short && len(p) > 1 {
			n, _ = fn(p[:len(p)/2])
		}
		return n, fl.err(OpWrite, f.Name())
	}
	return fn(p)
}

func (f *injFile) Write(p []byte) (int, error) { return f.write(p, f.File.Write) }

func (f *injFile) WriteAt(p []byte, off int64) (int, error) {
	return f.write(p, func(b []byte) (int, error) { return f.File.WriteAt(b, off) })
}

func (f *injFile) ReadAt(p []byte, off int64) (int, error) {
	if fl := f.in.hit(OpRead, f.Name()); fl != nil {
		n := 0
		if fl.Short && len(p) > 1 {
			n, _ = f.File.ReadAt(p[:len(p)/2], off)
		}
		return n, fl.err(OpRead, f.Name())
	}
	return f.File.ReadAt(p, off)
}

func (f *injFile) Sync() error {
	if fl := f.in.hit(OpSync, f.Name()); fl != nil {
		return fl.err(OpSync, f.Name())
	}
	return f.File.Sync()
}

func (f *injFile) Close() error {
	if fl := f.in.hit(OpClose, f.Name()); fl != nil {
		_ = f.File.Close() // the descriptor is gone either way
		return fl.err(OpClose, f.Name())
	}
	return f.File.Close()
}

func (f *injFile) Truncate(size int64) error {
	if fl := f.in.hit(OpTruncate, f.Name()); fl != nil {
		return fl.err(OpTruncate, f.Name())
	}
	return f.File.Truncate(size)
}
