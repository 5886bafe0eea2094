// Package cuda binds the CUDA driver API (libcuda.so.1) and cuFile
// (libcufile.so.0, GPUDirect Storage) at run time with purego: no CUDA is
// needed to build, the binary can be CGO_ENABLED=0, and on a machine without
// the library, the driver or a GPU every entry point returns an error
// wrapping ErrUnavailable that says why. Nothing panics.
//
// The pieces:
//
//   - Available, DriverVersion, DeviceCount, GetDevice, Device: what is here.
//   - Device.PrimaryContext: the device's primary context (shared with the
//     CUDA runtime, so with PyTorch in the same process). Every call that
//     needs a current context pushes it on a locked OS thread and pops it
//     again, so goroutines may move freely between threads.
//   - DeviceMem (Alloc, WrapDevicePtr), HostMem (AllocHost, RegisterHost):
//     memory with in-flight accounting; Free while a transfer uses the
//     memory returns ErrBusy instead of freeing.
//   - Stream and Transfer: async copies return a *Transfer to Wait on or to
//     select on (Done). One poller goroutine per busy stream completes
//     transfers in order; see WaitPolicy.
//   - Event: timing (ElapsedTime) and ordering.
//   - Kernels: Compile (NVRTC, libnvrtc.so bound at run time) turns CUDA
//     C++ into PTX or a CUBIN for Device.Arch; Context.LoadModule,
//     Module.Function and Stream.Launch run it. A launch returns a
//     *Transfer and holds its buffer arguments like a copy does.
//   - cuFile: CuFileStatus (native / p2pdma / compat / absent, and why),
//     FileDriverOpen/Close, HandleRegister, BufRegister, FileHandle.Read.
//
// The design and what was verified on a GPU are in docs/design/cuda.md.
package cuda
