package gpublake3

// kernelSource is the CUDA C source of the two kernels, compiled at run
// time with NVRTC (cuda.Compile). It includes no headers.
//
// BLAKE3 (default hash mode, no key, 32-byte output):
//   - a message is split into 1024-byte chunks (an empty message is one
//     empty chunk); a chunk is up to 16 blocks of 64 bytes, compressed in
//     turn starting from the IV with counter = chunk index, block_len = the
//     block's length (the last block zero-padded), CHUNK_START on the first
//     block and CHUNK_END on the last;
//   - chunk chaining values (CVs) are merged pairwise, adjacent nodes, level
//     by level, an odd last node carried up unchanged (this is the spec's
//     "left subtree = largest power of two" tree); a parent compresses
//     left_cv || right_cv from the IV with counter 0, block_len 64, PARENT;
//   - the last compression (the root parent, or the last block of the only
//     chunk) also carries ROOT, and its first 8 state words, serialized
//     little-endian, are the hash. Message words are read little-endian.
const kernelSource = `
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

// One message, as Hasher.Verify uploads it (64 bytes, see job in hasher.go).
struct Job {
	u64 off;      // byte offset of the message in the data buffer
	u64 len;      // message length in bytes
	u64 chunk0;   // index of its first chunk CV in the CV arrays
	u64 nchunks;  // number of chunks (1 for an empty message)
	u32 want[8];  // expected hash, as little-endian words
};

#define CHUNK_START 1u
#define CHUNK_END   2u
#define PARENT      4u
#define ROOT        8u

#define IV0 0x6A09E667u
#define IV1 0xBB67AE85u
#define IV2 0x3C6EF372u
#define IV3 0xA54FF53Au
#define IV4 0x510E527Fu
#define IV5 0x9B05688Cu
#define IV6 0x1F83D9ABu
#define IV7 0x5BE0CD19u

__device__ __forceinline__ u32 rotr(u32 x, u32 n) { return __funnelshift_r(x, x, n); }

#define G(a, b, c, d, x, y)              \
	do {                                 \
		a = a + b + (x); d = rotr(d ^ a, 16); \
		c = c + d;       b = rotr(b ^ c, 12); \
		a = a + b + (y); d = rotr(d ^ a, 8);  \
		c = c + d;       b = rotr(b ^ c, 7);  \
	} while (0)

// compress returns the first 8 words of BLAKE3's compression function
// output (the new chaining value) in cv.
__device__ __forceinline__ void compress(u32 cv[8], const u32 block[16], u64 counter, u32 blen, u32 flags) {
	u32 m[16];
#pragma unroll
	for (int i = 0; i < 16; i++) m[i] = block[i];
	u32 v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
	u32 v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
	u32 v8 = IV0, v9 = IV1, v10 = IV2, v11 = IV3;
	u32 v12 = (u32)counter, v13 = (u32)(counter >> 32), v14 = blen, v15 = flags;
#pragma unroll
	for (int r = 0; r < 7; r++) {
		G(v0, v4, v8,  v12, m[0],  m[1]);
		G(v1, v5, v9,  v13, m[2],  m[3]);
		G(v2, v6, v10, v14, m[4],  m[5]);
		G(v3, v7, v11, v15, m[6],  m[7]);
		G(v0, v5, v10, v15, m[8],  m[9]);
		G(v1, v6, v11, v12, m[10], m[11]);
		G(v2, v7, v8,  v13, m[12], m[13]);
		G(v3, v4, v9,  v14, m[14], m[15]);
		if (r < 6) {
			// MSG_PERMUTATION = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8}
			u32 t0 = m[2], t1 = m[6], t2 = m[3], t3 = m[10], t4 = m[7], t5 = m[0], t6 = m[4], t7 = m[13];
			u32 t8 = m[1], t9 = m[11], t10 = m[12], t11 = m[5], t12 = m[9], t13 = m[14], t14 = m[15], t15 = m[8];
			m[0] = t0; m[1] = t1; m[2] = t2; m[3] = t3; m[4] = t4; m[5] = t5; m[6] = t6; m[7] = t7;
			m[8] = t8; m[9] = t9; m[10] = t10; m[11] = t11; m[12] = t12; m[13] = t13; m[14] = t14; m[15] = t15;
		}
	}
	cv[0] = v0 ^ v8;  cv[1] = v1 ^ v9;  cv[2] = v2 ^ v10; cv[3] = v3 ^ v11;
	cv[4] = v4 ^ v12; cv[5] = v5 ^ v13; cv[6] = v6 ^ v14; cv[7] = v7 ^ v15;
}

// load_block reads blen (<= 64) bytes at p as 16 little-endian words,
// zero-padded.
__device__ __forceinline__ void load_block(const u8* __restrict__ p, u32 blen, u32 m[16]) {
	if (blen == 64 && (((unsigned long long)p) & 15) == 0) {
		const uint4* q = (const uint4*)p;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint4 w = __ldg(q + i);
			m[4 * i] = w.x; m[4 * i + 1] = w.y; m[4 * i + 2] = w.z; m[4 * i + 3] = w.w;
		}
		return;
	}
	if (blen == 64 && (((unsigned long long)p) & 3) == 0) {
		const u32* q = (const u32*)p;
#pragma unroll
		for (int i = 0; i < 16; i++) m[i] = __ldg(q + i);
		return;
	}
	// Unaligned or short: byte loads (constant word indices keep m in
	// registers).
#pragma unroll
	for (int w = 0; w < 16; w++) {
		u32 x = 0;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			u32 i = 4 * w + k;
			if (i < blen) x |= ((u32)__ldg(p + i)) << (8 * k);
		}
		m[w] = x;
	}
}

// blake3_chunks: one thread per 1 KiB chunk of every message. Writes the
// chunk's CV to cvs[8*g] (g: the chunk's global index); for a message of
// one chunk that is already the root hash.
extern "C" __global__ void blake3_chunks(const u8* __restrict__ buf, const Job* __restrict__ jobs,
                                         u32 njobs, u64 total, u32* __restrict__ cvs) {
	u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
	if (g >= total) return;
	u32 lo = 0, hi = njobs - 1;
	while (lo < hi) { // the last job whose chunk0 <= g
		u32 mid = (lo + hi + 1) >> 1;
		if (jobs[mid].chunk0 <= g) lo = mid; else hi = mid - 1;
	}
	u64 off = jobs[lo].off, len = jobs[lo].len, ci = g - jobs[lo].chunk0;
	bool root = jobs[lo].nchunks == 1;
	u64 start = ci * 1024;
	u32 clen = (u32)((len - start) > 1024 ? 1024 : (len - start));
	const u8* p = buf + off + start;
	u32 cv[8] = {IV0, IV1, IV2, IV3, IV4, IV5, IV6, IV7};
	u32 nblocks = clen == 0 ? 1 : (clen + 63) / 64;
	for (u32 b = 0; b < nblocks; b++) {
		u32 blen = b + 1 == nblocks ? clen - 64 * b : 64;
		u32 m[16];
		load_block(p + 64 * b, blen, m);
		u32 flags = 0;
		if (b == 0) flags |= CHUNK_START;
		if (b + 1 == nblocks) flags |= CHUNK_END | (root ? ROOT : 0u);
		compress(cv, m, ci, blen, flags);
	}
	uint4* o = (uint4*)(cvs + 8 * g);
	o[0] = make_uint4(cv[0], cv[1], cv[2], cv[3]);
	o[1] = make_uint4(cv[4], cv[5], cv[6], cv[7]);
}

// blake3_roots: one block per message. Merges the message's chunk CVs
// level by level (ping-pong between cvs and tmp), compares the root hash
// with the expected one and writes out[9*i .. 9*i+8] = hash words, then 1
// for a mismatch or 0.
extern "C" __global__ void blake3_roots(const Job* __restrict__ jobs, u32* cvs, u32* tmp, u32* __restrict__ out) {
	const Job* j = jobs + blockIdx.x;
	u32* src = cvs + 8 * j->chunk0;
	u32* dst = tmp + 8 * j->chunk0;
	u64 m = j->nchunks;
	while (m > 1) {
		u64 pairs = m >> 1;
		u32 flags = PARENT | (m == 2 ? ROOT : 0u);
		for (u64 i = threadIdx.x; i < pairs; i += blockDim.x) {
			u32 blk[16];
			const uint4* q = (const uint4*)(src + 16 * i);
#pragma unroll
			for (int k = 0; k < 4; k++) {
				uint4 w = q[k];
				blk[4 * k] = w.x; blk[4 * k + 1] = w.y; blk[4 * k + 2] = w.z; blk[4 * k + 3] = w.w;
			}
			u32 cv[8] = {IV0, IV1, IV2, IV3, IV4, IV5, IV6, IV7};
			compress(cv, blk, 0, 64, flags);
			uint4* o = (uint4*)(dst + 8 * i);
			o[0] = make_uint4(cv[0], cv[1], cv[2], cv[3]);
			o[1] = make_uint4(cv[4], cv[5], cv[6], cv[7]);
		}
		if ((m & 1) && threadIdx.x == 0) {
#pragma unroll
			for (int k = 0; k < 8; k++) dst[8 * pairs + k] = src[8 * (m - 1) + k];
		}
		__syncthreads();
		u32* t = src; src = dst; dst = t;
		m = pairs + (m & 1);
	}
	if (threadIdx.x == 0) {
		u32 bad = 0;
		u32* o = out + 9 * (u64)blockIdx.x;
#pragma unroll
		for (int k = 0; k < 8; k++) {
			u32 h = src[k];
			o[k] = h;
			bad |= h ^ j->want[k];
		}
		o[8] = bad != 0;
	}
}
`
