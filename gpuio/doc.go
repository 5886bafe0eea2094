// Package gpuio moves stored files into GPU memory: a byte range of a file, a
// list of safetensors tensors, or one tensor-parallel rank's share of each.
//
// The bytes take one of these paths, chosen per load and reported in every
// Result:
//
//   - gds: cuFile reads from the backing pack (opened O_DIRECT) straight into
//     device memory, when cuFile runs in native (nvidia-fs) or P2PDMA mode.
//   - gds-compat: the same calls when cuFile runs in compatibility mode (the
//     library bounces through host memory itself). Reported as such, never as
//     gds, and never chosen automatically over bounce.
//   - bounce: reads into a fixed set of reused pinned host buffers (through
//     storeio: io_uring, O_DIRECT for data not in the page cache, buffered
//     reads for data that is), verification on the CPU, and asynchronous
//     host-to-device copies; many buffers in flight so that disk, CPU and PCIe
//     overlap.
//   - unified: devices whose CPU and GPU share memory (integrated GPUs): the
//     bytes are read straight into memory the GPU uses.
//
// Reads are made of whole chunks, so every chunk is verified against its
// BLAKE3 ID before the bytes that were asked for are copied to the device; the
// edges of a range that does not start or end on a chunk boundary are trimmed
// by copying only the wanted part. Strict mode fails instead of taking a
// slower path than asked for.
//
// gpuio declares the Device interface it needs; NewCUDADevice adapts package
// cuda to it, and HostDevice is a host-memory device for tests and machines
// without a GPU (selected explicitly, never as a silent fallback).
package gpuio
