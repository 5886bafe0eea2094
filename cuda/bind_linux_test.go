//go:build linux && (amd64 || arm64)

package cuda

import (
	"testing"

	"github.com/ebitengine/purego"
)

// TestSignaturesRegister registers every Go signature of the binding with
// purego (against a harmless libc symbol, never called), so that a type
// purego cannot marshal fails here rather than on the GPU machine.
func TestSignaturesRegister(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skipf("no libc.so.6: %v", err)
	}
	addr, err := purego.Dlsym(h, "getpid")
	if err != nil {
		t.Fatal(err)
	}
	var d driver
	var l cufileLib
	syms := append(d.symbols(), l.symbols()...)
	for _, s := range syms {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: %v", s.names[0], r)
				}
			}()
			purego.RegisterFunc(s.fptr, addr)
		}()
	}
	if d.cuInit == nil || l.getParameterBool == nil {
		t.Fatal("not registered")
	}
	// A missing required symbol is an error, not a panic.
	var f func() cuResult
	if err := bindSymbols(h, []symbol{{fptr: &f, names: []string{"cuNoSuchFunction"}}}); err == nil {
		t.Fatal("missing symbol bound")
	}
}
