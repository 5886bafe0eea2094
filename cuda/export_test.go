package cuda

import (
	"fmt"
	"unsafe"
)

// SetUnavailableForTest makes every entry point behave as on a machine
// without CUDA until the returned function is called.
func SetUnavailableForTest(reason string) (restore func()) {
	f := func() (*driver, error) {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, reason)
	}
	driverHook.Store(&f)
	return func() { driverHook.Store(nil) }
}

// CurrentContextForTest returns the calling thread's current CUcontext.
func CurrentContextForTest() (uintptr, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var c uintptr
	return c, d.err("cuCtxGetCurrent", d.cuCtxGetCurrent(&c))
}

var StripJSONCommentsForTest = stripJSONComments

func sizeofDescr() uintptr              { return unsafe.Sizeof(cufileDescr{}) }
func offsetofFd(d *cufileDescr) uintptr { return unsafe.Offsetof(d.fd) }
func offsetofDstatus() uintptr          { var p cufileDrvProps; return unsafe.Offsetof(p.dstatus) }
func offsetofFflags() uintptr           { var p cufileDrvProps; return unsafe.Offsetof(p.fflags) }
