package cuda

import (
	"fmt"
)

// DeviceAttribute is a CUdevice_attribute value (cuda.h).
type DeviceAttribute int32

// The attributes Kylix looks at. Any other CUdevice_attribute value can be
// passed to Device.Attribute as DeviceAttribute(n).
const (
	AttrIntegrated                        DeviceAttribute = 18  // CU_DEVICE_ATTRIBUTE_INTEGRATED: shares memory with the host (edge devices)
	AttrCanMapHostMemory                  DeviceAttribute = 19  // CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
	AttrPCIBusID                          DeviceAttribute = 33  // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
	AttrPCIDeviceID                       DeviceAttribute = 34  // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
	AttrAsyncEngineCount                  DeviceAttribute = 40  // CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT (copy engines)
	AttrUnifiedAddressing                 DeviceAttribute = 41  // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
	AttrPCIDomainID                       DeviceAttribute = 50  // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
	AttrComputeCapabilityMajor            DeviceAttribute = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	AttrComputeCapabilityMinor            DeviceAttribute = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	AttrManagedMemory                     DeviceAttribute = 83  // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
	AttrPageableMemoryAccess              DeviceAttribute = 88  // CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
	AttrConcurrentManagedAccess           DeviceAttribute = 89  // CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
	AttrCanUseHostPointerForRegisteredMem DeviceAttribute = 91  // CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
	AttrHostRegisterSupported             DeviceAttribute = 99  // CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
	AttrGPUDirectRDMASupported            DeviceAttribute = 116 // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
)

// DeviceCount returns the number of CUDA devices (cuDeviceGetCount).
func DeviceCount() (int, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.err("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device is a CUDA device (a CUdevice handle and its ordinal). It is a plain
// value; it holds no resources. Get one with GetDevice.
type Device struct {
	ordinal int
	h       int32
}

// GetDevice returns the device with the given ordinal (cuDeviceGet).
func GetDevice(ordinal int) (Device, error) {
	d, err := getDriver()
	if err != nil {
		return Device{}, err
	}
	var h int32
	if err := d.err("cuDeviceGet", d.cuDeviceGet(&h, int32(ordinal))); err != nil {
		return Device{}, fmt.Errorf("CUDA: device %d: %w", ordinal, err)
	}
	return Device{ordinal: ordinal, h: h}, nil
}

// Ordinal returns the device's ordinal (its index, as in CUDA_VISIBLE_DEVICES order).
func (dev Device) Ordinal() int { return dev.ordinal }

func (dev Device) String() string { return fmt.Sprintf("cuda:%d", dev.ordinal) }

// Name returns the device's name (cuDeviceGetName), e.g. "NVIDIA H200".
func (dev Device) Name() (string, error) {
	d, err := getDriver()
	if err != nil {
		return "", err
	}
	var buf [256]byte
	if err := d.err("cuDeviceGetName", d.cuDeviceGetName(&buf[0], int32(len(buf)), dev.h)); err != nil {
		return "", err
	}
	return bufString(buf[:]), nil
}

// TotalMem returns the device's memory in bytes (cuDeviceTotalMem).
func (dev Device) TotalMem() (uint64, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var n uintptr
	if err := d.err("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&n, dev.h)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// PCIBusID returns the device's PCI address, "domain:bus:device.function"
// (cuDeviceGetPCIBusId), e.g. "0000:3B:00.0".
func (dev Device) PCIBusID() (string, error) {
	d, err := getDriver()
	if err != nil {
		return "", err
	}
	var buf [64]byte
	if err := d.err("cuDeviceGetPCIBusId", d.cuDeviceGetPCIBusId(&buf[0], int32(len(buf)), dev.h)); err != nil {
		return "", err
	}
	return bufString(buf[:]), nil
}

// Attribute returns one CUdevice_attribute (cuDeviceGetAttribute).
func (dev Device) Attribute(a DeviceAttribute) (int, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.err("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, int32(a), dev.h)); err != nil {
		return 0, fmt.Errorf("CUDA: attribute %d: %w", int32(a), err)
	}
	return int(v), nil
}

func (dev Device) boolAttr(a DeviceAttribute) (bool, error) {
	v, err := dev.Attribute(a)
	return v != 0, err
}

// ComputeCapability returns the device's compute capability (9, 0 for Hopper).
func (dev Device) ComputeCapability() (major, minor int, err error) {
	if major, err = dev.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = dev.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// UnifiedAddressing reports CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: host and
// device share one virtual address space (true on every 64-bit Linux GPU).
func (dev Device) UnifiedAddressing() (bool, error) { return dev.boolAttr(AttrUnifiedAddressing) }

// Integrated reports CU_DEVICE_ATTRIBUTE_INTEGRATED: the GPU shares physical
// memory with the CPU (Jetson-class edge devices). The `unified` path of
// gpuio applies only where this is true.
func (dev Device) Integrated() (bool, error) { return dev.boolAttr(AttrIntegrated) }

// CanMapHostMemory reports CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY.
func (dev Device) CanMapHostMemory() (bool, error) { return dev.boolAttr(AttrCanMapHostMemory) }

// CanUseHostPointerForRegisteredMem reports
// CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: the device can
// use a registered (or pinned) host buffer at the same virtual address as
// the CPU, so HostMem.Ptr() is also its device address.
func (dev Device) CanUseHostPointerForRegisteredMem() (bool, error) {
	return dev.boolAttr(AttrCanUseHostPointerForRegisteredMem)
}

// DeviceInfo is a snapshot of what Kylix needs to know about a device, for
// `kylix doctor` and for choosing a GPU path.
type DeviceInfo struct {
	Ordinal                           int
	Name                              string
	TotalMem                          uint64
	PCIBusID                          string
	Major, Minor                      int // compute capability
	AsyncEngines                      int // copy engines
	UnifiedAddressing                 bool
	Integrated                        bool
	CanMapHostMemory                  bool
	CanUseHostPointerForRegisteredMem bool
	PageableMemoryAccess              bool
	HostRegisterSupported             bool
	GPUDirectRDMASupported            bool
	DriverVersion                     int // cuDriverGetVersion (13000 = 13.0)
}

// Info collects DeviceInfo in one call.
func (dev Device) Info() (DeviceInfo, error) {
	var (
		in  = DeviceInfo{Ordinal: dev.ordinal}
		err error
	)
	if in.Name, err = dev.Name(); err != nil {
		return in, err
	}
	if in.TotalMem, err = dev.TotalMem(); err != nil {
		return in, err
	}
	if in.PCIBusID, err = dev.PCIBusID(); err != nil {
		return in, err
	}
	if in.Major, in.Minor, err = dev.ComputeCapability(); err != nil {
		return in, err
	}
	if in.AsyncEngines, err = dev.Attribute(AttrAsyncEngineCount); err != nil {
		return in, err
	}
	for _, b := range []struct {
		dst *bool
		a   DeviceAttribute
	}{
		{&in.UnifiedAddressing, AttrUnifiedAddressing},
		{&in.Integrated, AttrIntegrated},
		{&in.CanMapHostMemory, AttrCanMapHostMemory},
		{&in.CanUseHostPointerForRegisteredMem, AttrCanUseHostPointerForRegisteredMem},
		{&in.PageableMemoryAccess, AttrPageableMemoryAccess},
		{&in.HostRegisterSupported, AttrHostRegisterSupported},
		{&in.GPUDirectRDMASupported, AttrGPUDirectRDMASupported},
	} {
		if *b.dst, err = dev.boolAttr(b.a); err != nil {
			return in, err
		}
	}
	if in.DriverVersion, err = DriverVersion(); err != nil {
		return in, err
	}
	return in, nil
}
