package gpublake3

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/kylix/kylix/internal/testneeds"
)

// cpuShim lets the kernel source compile as C++ on the host: the CUDA
// built-ins it uses become plain functions, and a harness runs the chunk
// kernel for every chunk and the root kernel with one thread per block
// (its __syncthreads then has nothing to wait for). It checks the BLAKE3
// logic, the Job layout and the result layout on machines without a GPU.
const cpuShim = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { uint4 r = {a, b, c, d}; return r; }
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned n) {
	n &= 31; return n ? (lo >> n) | (hi << (32 - n)) : lo;
}
struct dim3_ { unsigned x, y, z; };
static dim3_ blockIdx, threadIdx, blockDim;
#define __syncthreads()
`

const cpuMain = `
static void* slurp(const char* path, long* n) {
	FILE* f = fopen(path, "rb"); if (!f) { perror(path); exit(2); }
	fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
	void* p = aligned_alloc(64, (*n + 64) & ~63L); if (*n && fread(p, 1, *n, f) != (size_t)*n) exit(3);
	fclose(f); return p;
}
int main(int argc, char** argv) {
	long nb, nj;
	const u8* buf = (const u8*)slurp(argv[1], &nb);
	const Job* jobs = (const Job*)slurp(argv[2], &nj);
	u32 njobs = (u32)(nj / sizeof(Job));
	u64 total = strtoull(argv[3], 0, 10);
	u32* cvs = (u32*)aligned_alloc(64, total * 32 + 64);
	u32* tmp = (u32*)aligned_alloc(64, total * 32 + 64);
	u32* out = (u32*)calloc(njobs * 9, 4);
	blockDim.x = 1;
	for (u64 g = 0; g < total; g++) { blockIdx.x = (unsigned)g; threadIdx.x = 0; blake3_chunks(buf, jobs, njobs, total, cvs); }
	for (u32 b = 0; b < njobs; b++) { blockIdx.x = b; threadIdx.x = 0; blake3_roots(jobs, cvs, tmp, out); }
	FILE* f = fopen(argv[4], "wb"); fwrite(out, 4, njobs * 9, f); fclose(f);
	return 0;
}
`

func TestKernelSourceOnCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	cxx := testneeds.Command(t, "c++", "g++")
	if binary.Size(struct {
		Off, Len, Chunk0, N uint64
		Want                [8]uint32
	}{}) != jobSize {
		t.Fatal("jobSize does not match struct Job")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "k.cc")
	if err := os.WriteFile(src, []byte(cpuShim+kernelSource+cpuMain), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "k")
	if out, err := exec.Command(cxx, "-O2", "-w", "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("compile kernel source as C++: %v\n%s", err, out)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	lens := []int64{0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 3073, 5 * 1024, 7*1024 + 5, 31 * 1024, 33*1024 + 1, 1 << 20, 4<<20 + 1}
	buf, msgs := layout(rng, lens, 0)
	msgs = append(msgs, msgs[3]) // the same message twice
	msgs[len(msgs)-1].Want[0] ^= 1
	jobs := make([]byte, len(msgs)*jobSize)
	total := encodeJobs(jobs, msgs)
	bufPath, jobsPath, outPath := filepath.Join(dir, "buf"), filepath.Join(dir, "jobs"), filepath.Join(dir, "out")
	os.WriteFile(bufPath, buf, 0o644)
	os.WriteFile(jobsPath, jobs, 0o644)
	if out, err := exec.Command(exe, bufPath, jobsPath, strconv.FormatInt(total, 10), outPath).CombinedOutput(); err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	res, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	sums, bad := decodeResults(res, len(msgs))
	for i, m := range msgs {
		want := blake3.Sum256(buf[m.Off : m.Off+m.Len])
		if sums[i] != want {
			t.Errorf("message %d (%d bytes at %d): got %x, want %x", i, m.Len, m.Off, sums[i], want)
		}
	}
	if len(bad) != 1 || bad[0] != len(msgs)-1 {
		t.Errorf("mismatches %v, want [%d]", bad, len(msgs)-1)
	}
}
