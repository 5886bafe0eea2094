//go:build !(linux && (amd64 || arm64))

package cuda

import (
	"errors"
	"runtime"
)

var errUnsupportedPlatform = errors.New("CUDA binding not supported on " + runtime.GOOS + "/" + runtime.GOARCH)

func dlopenFirst(names []string) (uintptr, string, error) {
	return 0, "", errUnsupportedPlatform
}

func bindSymbols(h uintptr, syms []symbol) error { return errUnsupportedPlatform }

func lookupSymbol(h uintptr, name string) uintptr { return 0 }

func callErrno(fn uintptr, args ...uintptr) (uintptr, uintptr) { return ^uintptr(0), 0 }

const oDirect = 0
