//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// dlopenFirst opens the first library of names that loads (RTLD_NOW |
// RTLD_GLOBAL, so that libcufile later finds libcuda's symbols). A name
// without a slash is searched the way the dynamic loader searches
// (LD_LIBRARY_PATH, ld.so.cache, default paths).
func dlopenFirst(names []string) (handle uintptr, path string, err error) {
	var msgs []string
	for _, n := range names {
		h, e := lockedDl(func() (uintptr, error) { return purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL) })
		if e == nil {
			return h, n, nil
		}
		msgs = append(msgs, e.Error())
	}
	if len(msgs) == 0 {
		return 0, "", errors.New("no candidate library")
	}
	return 0, "", errors.New(strings.Join(msgs, "; "))
}

// bindSymbols resolves every symbol and registers it with purego. A missing
// required symbol is an error (purego.RegisterLibFunc would panic instead).
func bindSymbols(h uintptr, syms []symbol) error {
	for _, s := range syms {
		var addr uintptr
		for _, n := range s.names {
			if a, err := lockedDl(func() (uintptr, error) { return purego.Dlsym(h, n) }); err == nil && a != 0 {
				addr = a
				break
			}
		}
		if addr == 0 {
			if s.optional {
				continue
			}
			return fmt.Errorf("missing symbol %s", s.names[0])
		}
		purego.RegisterFunc(s.fptr, addr)
	}
	return nil
}

// lookupSymbol returns a symbol's address, or 0.
func lookupSymbol(h uintptr, name string) uintptr {
	a, err := lockedDl(func() (uintptr, error) { return purego.Dlsym(h, name) })
	if err != nil {
		return 0
	}
	return a
}

// lockedDl runs a purego dlopen or dlsym with the goroutine locked to its OS
// thread. On failure purego calls dlerror in a second C call, and dlerror's
// message belongs to the thread that failed: if the goroutine moved between
// the two, the error read is empty or another call's (issue 10: doctor lost
// the CUDA driver's dlopen error in 9 of 200 runs).
func lockedDl(f func() (uintptr, error)) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return f()
}

var (
	errnoOnce sync.Once
	// errnoLocation is libc's __errno_location: purego's SyscallN does
	// not capture errno on Linux, so callErrno reads it itself.
	errnoLocation func() unsafe.Pointer
)

// callErrno calls a C function with integer arguments and returns its
// result and the errno it left, read on the same (locked) OS thread right
// after the call.
func callErrno(fn uintptr, args ...uintptr) (r1 uintptr, errno uintptr) {
	errnoOnce.Do(func() {
		h, err := lockedDl(func() (uintptr, error) { return purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL) })
		if err != nil {
			return
		}
		if a := lookupSymbol(h, "__errno_location"); a != 0 {
			purego.RegisterFunc(&errnoLocation, a)
		}
	})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if errnoLocation != nil {
		*(*int32)(errnoLocation()) = 0
	}
	r1, _, _ = purego.SyscallN(fn, args...)
	if errnoLocation != nil {
		errno = uintptr(*(*int32)(errnoLocation()))
	}
	return r1, errno
}

const oDirect = syscall.O_DIRECT
