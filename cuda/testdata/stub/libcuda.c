/*
 * A stub of libcuda.so.1 for testing package cuda on machines without a
 * GPU (see stub_test.go). "Device memory" is host memory, copies are
 * memcpy, streams run everything at once, and an event reports
 * CUDA_ERROR_NOT_READY to its first two queries after each record, so that
 * the poll paths run. It checks that a context is current where the real
 * driver needs one. It is not a model of CUDA: only of its ABI.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <pthread.h>

typedef int CUresult;
typedef uintptr_t ptr;

enum { OK = 0, INVALID_VALUE = 1, INVALID_DEVICE = 101, INVALID_CONTEXT = 201, NOT_FOUND = 500, NOT_READY = 600 };

static __thread ptr ctxstack[64];
static __thread int ctxdepth;
static int current(void) { return ctxdepth > 0 && ctxstack[ctxdepth - 1] != 0; }
#define NEED_CTX if (!current()) return INVALID_CONTEXT

CUresult cuInit(unsigned flags) { return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) {
	static __thread char buf[64];
	snprintf(buf, sizeof buf, "STUB_ERROR_%d", r);
	*s = buf;
	return OK;
}

CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Stub GPU"); return OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { *b = (size_t)1 << 34; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
	switch (attr) {
	case 75: *v = 9; break;  /* compute capability major */
	case 76: *v = 0; break;  /* minor */
	case 18: *v = 0; break;  /* integrated */
	case 40: *v = 2; break;  /* async engines */
	default: *v = 1;
	}
	return OK;
}
CUresult cuDeviceGetPCIBusId(char *s, int len, int d) { snprintf(s, len, "0000:01:00.0"); return OK; }
CUresult cuDevicePrimaryCtxRetain(ptr *c, int d) { *c = 0xc0c0; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return OK; }
CUresult cuCtxPushCurrent_v2(ptr c) { if (ctxdepth == 64) return INVALID_VALUE; ctxstack[ctxdepth++] = c; return OK; }
CUresult cuCtxPopCurrent_v2(ptr *c) { if (ctxdepth == 0) return INVALID_CONTEXT; *c = ctxstack[--ctxdepth]; return OK; }
CUresult cuCtxGetCurrent(ptr *c) { *c = ctxdepth ? ctxstack[ctxdepth - 1] : 0; return OK; }

/* Allocations are remembered for cuMemGetAddressRange. */
static ptr allocBase[4096];
static size_t allocSize[4096];
static int nalloc;

CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { NEED_CTX; *f = (size_t)1 << 33; *t = (size_t)1 << 34; return OK; }
CUresult cuMemAlloc_v2(ptr *p, size_t n) {
	NEED_CTX;
	void *m = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	if (!m) return 2;
	*p = (ptr)m;
	if (nalloc < 4096) { allocBase[nalloc] = *p; allocSize[nalloc++] = n; }
	return OK;
}
CUresult cuMemFree_v2(ptr p) {
	for (int i = 0; i < nalloc; i++) if (allocBase[i] == p) allocBase[i] = allocSize[i] = 0;
	free((void *)p);
	return OK;
}
CUresult cuMemGetAddressRange_v2(ptr *base, size_t *size, ptr p) {
	for (int i = nalloc - 1; i >= 0; i--)
		if (allocSize[i] && p >= allocBase[i] && p < allocBase[i] + allocSize[i]) { *base = allocBase[i]; *size = allocSize[i]; return OK; }
	return NOT_FOUND;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) { NEED_CTX; *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095); return *p ? OK : 2; }
CUresult cuMemFreeHost(void *p) { free(p); return OK; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) { NEED_CTX; return OK; }
CUresult cuMemHostUnregister(void *p) { return OK; }
CUresult cuMemHostGetDevicePointer_v2(ptr *d, void *p, unsigned flags) { *d = (ptr)p; return OK; }

CUresult cuStreamCreate(ptr *s, unsigned flags) { NEED_CTX; *s = (ptr)malloc(8); return OK; }
CUresult cuStreamDestroy_v2(ptr s) { free((void *)s); return OK; }
CUresult cuStreamSynchronize(ptr s) { return OK; }

CUresult cuMemcpyHtoD_v2(ptr d, const void *s, size_t n) { NEED_CTX; memcpy((void *)d, s, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *d, ptr s, size_t n) { NEED_CTX; memcpy(d, (void *)s, n); return OK; }
CUresult cuMemcpyDtoD_v2(ptr d, ptr s, size_t n) { NEED_CTX; memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemsetD8_v2(ptr d, unsigned char v, size_t n) { NEED_CTX; memset((void *)d, v, n); return OK; }
CUresult cuMemcpyHtoDAsync_v2(ptr d, const void *s, size_t n, ptr st) { NEED_CTX; memcpy((void *)d, s, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, ptr s, size_t n, ptr st) { NEED_CTX; memcpy(d, (void *)s, n); return OK; }
CUresult cuMemcpyDtoDAsync_v2(ptr d, ptr s, size_t n, ptr st) { NEED_CTX; memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemsetD8Async(ptr d, unsigned char v, size_t n, ptr st) { NEED_CTX; memset((void *)d, v, n); return OK; }

/* An event is an int: the number of NOT_READY answers still to give. */
CUresult cuEventCreate(ptr *e, unsigned flags) { NEED_CTX; *e = (ptr)calloc(1, sizeof(int)); return OK; }
CUresult cuEventDestroy_v2(ptr e) { free((void *)e); return OK; }
CUresult cuEventRecord(ptr e, ptr s) { NEED_CTX; *(int *)e = 2; return OK; }
CUresult cuEventQuery(ptr e) { int *c = (int *)e; if (*c > 0) { (*c)--; return NOT_READY; } return OK; }
CUresult cuEventSynchronize(ptr e) { usleep(50); *(int *)e = 0; return OK; }
CUresult cuEventElapsedTime_v2(float *ms, ptr a, ptr b) { *ms = 1.5f; return OK; }

/* CUDA IPC: a stub handle is { u64 pointer of an allocation; "KYLXIPC" };
 * opening it maps the allocation at its own address (one process plays
 * both sides). Opens are counted so a close without an open fails. */
typedef struct { char reserved[64]; } CUipcMemHandle;
static int ipcOpen[4096];
/* A second kind of stub handle lets another process (a test playing the
 * client of a node) export memory: { "KYLXSHM\0"; u64 size; path of a file
 * (NUL-terminated) } is mapped MAP_SHARED, so what the node writes there the
 * test reads back from the file. */
static int ipcShm[4096];
static pthread_mutex_t ipcMu = PTHREAD_MUTEX_INITIALIZER; /* a node fills for many clients at once */
static CUresult openShmLocked(ptr *p, const char *h);
static CUresult openShm(ptr *p, const char *h) {
	pthread_mutex_lock(&ipcMu);
	CUresult r = openShmLocked(p, h);
	pthread_mutex_unlock(&ipcMu);
	return r;
}
static CUresult openShmLocked(ptr *p, const char *h) {
	size_t n;
	char path[49];
	memcpy(&n, h + 8, 8);
	memcpy(path, h + 16, 48);
	path[48] = 0;
	int fd = open(path, O_RDWR);
	if (fd < 0) return INVALID_VALUE;
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) return INVALID_VALUE;
	if (nalloc >= 4096) { munmap(m, n); return 2; }
	allocBase[nalloc] = (ptr)m; allocSize[nalloc] = n; ipcOpen[nalloc] = 1; ipcShm[nalloc] = 1; nalloc++;
	*p = (ptr)m;
	return OK;
}
CUresult cuIpcOpenMemHandle_v2(ptr *p, CUipcMemHandle h, unsigned flags) {
	NEED_CTX;
	if (memcmp(h.reserved, "KYLXSHM", 8) == 0) return flags == 1 ? openShm(p, h.reserved) : INVALID_VALUE;
	ptr want;
	memcpy(&want, h.reserved, 8);
	if (memcmp(h.reserved + 8, "KYLXIPC", 7) != 0 || flags != 1) return INVALID_VALUE;
	for (int i = 0; i < nalloc; i++)
		if (allocSize[i] && allocBase[i] == want) { ipcOpen[i]++; *p = want; return OK; }
	return INVALID_VALUE;
}
static CUresult closeLocked(ptr p);
CUresult cuIpcCloseMemHandle(ptr p) {
	NEED_CTX;
	pthread_mutex_lock(&ipcMu);
	CUresult r = closeLocked(p);
	pthread_mutex_unlock(&ipcMu);
	return r;
}
static CUresult closeLocked(ptr p) {
	for (int i = 0; i < nalloc; i++)
		if (allocSize[i] && allocBase[i] == p && ipcOpen[i] > 0) {
			if (ipcShm[i]) { munmap((void *)p, allocSize[i]); allocBase[i] = allocSize[i] = 0; ipcShm[i] = ipcOpen[i] = 0; return OK; }
			ipcOpen[i]--;
			return OK;
		}
	return INVALID_VALUE;
}
