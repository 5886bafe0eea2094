package cuda_test

import (
	"context"
	"errors"
	"sort"
	"testing"

	"github.com/kylix/kylix/cuda"
)

// entryPoints calls every exported function and method the way a caller on
// a machine without CUDA could reach them: package functions, and methods on
// the zero/nil values such a caller would hold after a failed constructor.
func entryPoints() map[string]func() error {
	var (
		dev  cuda.Device
		ctx  *cuda.Context
		dm   *cuda.DeviceMem
		hm   *cuda.HostMem
		st   *cuda.Stream
		tr   *cuda.Transfer
		ev   *cuda.Event
		fh   *cuda.FileHandle
		bg   = context.Background()
		buf  = make([]byte, 16)
		err1 = func(_ any, err error) error { return err }
	)
	return map[string]func() error{
		"Available":             cuda.Available,
		"LibraryPath":           func() error { return err1(cuda.LibraryPath()) },
		"DriverVersion":         func() error { return err1(cuda.DriverVersion()) },
		"DeviceCount":           func() error { return err1(cuda.DeviceCount()) },
		"GetDevice":             func() error { return err1(cuda.GetDevice(0)) },
		"Device.Name":           func() error { return err1(dev.Name()) },
		"Device.TotalMem":       func() error { return err1(dev.TotalMem()) },
		"Device.PCIBusID":       func() error { return err1(dev.PCIBusID()) },
		"Device.Attribute":      func() error { return err1(dev.Attribute(cuda.AttrIntegrated)) },
		"Device.ComputeCap":     func() error { _, _, err := dev.ComputeCapability(); return err },
		"Device.Unified":        func() error { return err1(dev.UnifiedAddressing()) },
		"Device.Integrated":     func() error { return err1(dev.Integrated()) },
		"Device.CanMapHost":     func() error { return err1(dev.CanMapHostMemory()) },
		"Device.CanUseHostPtr":  func() error { return err1(dev.CanUseHostPointerForRegisteredMem()) },
		"Device.Info":           func() error { return err1(dev.Info()) },
		"Device.PrimaryContext": func() error { return err1(dev.PrimaryContext()) },
		"Context.Close":         func() error { return ctx.Close() },
		"Context.MemInfo":       func() error { _, _, err := ctx.MemInfo(); return err },
		"Context.Alloc":         func() error { return err1(ctx.Alloc(1)) },
		"Context.WrapDevicePtr": func() error { return err1(ctx.WrapDevicePtr(1, 1)) },
		"Context.AllocHost":     func() error { return err1(ctx.AllocHost(1)) },
		"Context.RegisterHost":  func() error { return err1(ctx.RegisterHost(buf)) },
		"Context.NewStream":     func() error { return err1(ctx.NewStream()) },
		"Context.NewStreamWith": func() error { return err1(ctx.NewStreamWith(cuda.StreamOptions{Wait: cuda.WaitPoll})) },
		"Context.NewEvent":      func() error { return err1(ctx.NewEvent(cuda.EventDefault)) },
		"DeviceMem.Free":        func() error { return dm.Free() },
		"DeviceMem.ReadAt":      func() error { return err1(dm.ReadAt(buf, 0)) },
		"DeviceMem.WriteAt":     func() error { return err1(dm.WriteAt(buf, 0)) },
		"CopyDtoD":              func() error { return cuda.CopyDtoD(dm, 0, dm, 0, 1) },
		"MemsetD8":              func() error { return cuda.MemsetD8(dm, 0, 1, 0) },
		"HostMem.Free":          func() error { return hm.Free() },
		"HostMem.DevicePtr":     func() error { return err1(hm.DevicePtr()) },
		"Stream.CopyHtoD":       func() error { return err1(st.CopyHtoD(dm, 0, hm, 0, 1)) },
		"Stream.CopyDtoH":       func() error { return err1(st.CopyDtoH(hm, 0, dm, 0, 1)) },
		"Stream.CopyDtoD":       func() error { return err1(st.CopyDtoD(dm, 0, dm, 0, 1)) },
		"Stream.MemsetD8":       func() error { return err1(st.MemsetD8(dm, 0, 1, 0)) },
		"Stream.Wait":           func() error { return st.Wait(bg) },
		"Stream.Synchronize":    func() error { return st.Synchronize() },
		"Stream.Close":          func() error { return st.Close() },
		"Transfer.Wait":         func() error { return tr.Wait(bg) },
		"Transfer.Err":          func() error { return tr.Err() },
		"Event.Record":          func() error { return ev.Record(st) },
		"Event.Query":           func() error { return err1(ev.Query()) },
		"Event.Synchronize":     func() error { return ev.Synchronize() },
		"Event.Destroy":         func() error { return ev.Destroy() },
		"ElapsedTime":           func() error { return err1(cuda.ElapsedTime(ev, ev)) },
		"CuFileStatus":          func() error { return err1(cuda.CuFileStatus()) },
		"CuFileProbe":           func() error { return cuda.CuFileProbe(".") },
		"FileDriverOpen":        cuda.FileDriverOpen,
		"FileDriverClose":       cuda.FileDriverClose,
		"FileDriverProperties":  func() error { return err1(cuda.FileDriverProperties()) },
		"HandleRegister":        func() error { return err1(cuda.HandleRegister(0)) },
		"BufRegister":           func() error { return cuda.BufRegister(dm) },
		"BufDeregister":         func() error { return cuda.BufDeregister(dm) },
		"FileHandle.Read":       func() error { return err1(fh.Read(dm, 1, 0, 0)) },
		"FileHandle.Close":      func() error { return fh.Close() },
	}
}

func checkAllUnavailable(t *testing.T) {
	t.Helper()
	eps := entryPoints()
	names := make([]string, 0, len(eps))
	for n := range eps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", n, r)
				}
			}()
			err := eps[n]()
			if !errors.Is(err, cuda.ErrUnavailable) {
				t.Errorf("%s: got %v, want an error wrapping ErrUnavailable", n, err)
			}
		}()
	}
	var tr *cuda.Transfer
	select {
	case <-tr.Done():
	default:
		t.Errorf("nil Transfer's Done channel is not closed")
	}
}

// TestUnavailable runs everywhere: it simulates a machine without CUDA.
func TestUnavailable(t *testing.T) {
	restore := cuda.SetUnavailableForTest("simulated: no libcuda")
	defer restore()
	checkAllUnavailable(t)
	info, err := cuda.CuFileStatus()
	if info.Mode != cuda.CuFileAbsent || info.Reason == "" || err == nil {
		t.Errorf("CuFileStatus = %+v, %v; want absent with a reason", info, err)
	}
}

// TestNoGPUHere checks the real loader on a machine without CUDA: the
// reason must name what is missing.
func TestNoGPUHere(t *testing.T) {
	err := cuda.Available()
	if err == nil {
		t.Skip("CUDA is available here")
	}
	t.Logf("Available: %v", err)
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("Available() = %v, want ErrUnavailable", err)
	}
	checkAllUnavailable(t)
	info, _ := cuda.CuFileStatus()
	t.Logf("CuFileStatus: mode=%s reason=%s", info.Mode, info.Reason)
	if info.Mode != cuda.CuFileAbsent {
		t.Errorf("mode %q without CUDA", info.Mode)
	}
}
