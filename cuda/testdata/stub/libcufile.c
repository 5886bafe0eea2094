/*
 * A stub of libcufile.so.0 (compatibility mode, no nvidia-fs) for
 * stub_test.go: reads are pread into the stub's host-memory "device"
 * buffers. CUfileError_t and CUfileDescr_t have cufile.h's layout.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } CUfileDescr_t;

static const CUfileError_t ok = {0, 0};

CUfileError_t cuFileDriverOpen(void) { return ok; }
CUfileError_t cuFileDriverClose_v2(void) { return ok; }
CUfileError_t cuFileDriverGetProperties(void *p) {
	unsigned *u = p;
	memset(p, 0, 56);
	u[6] = 1u << 4; /* dstatusflags: nvme */
	u[7] = 1u << 1; /* dcontrolflags: allow compat mode */
	return ok;
}
CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d) {
	if (d->type != 1 || d->handle.fd < 0 || d->fs_ops != 0) { CUfileError_t e = {5022, 0}; return e; }
	*fh = (void *)(intptr_t)(d->handle.fd + 1000);
	return ok;
}
void cuFileHandleDeregister(void *fh) {}
CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags) { return ok; }
CUfileError_t cuFileBufDeregister(const void *p) { return ok; }
CUfileError_t cuFileGetVersion(int *v) { *v = 1150; return ok; }
CUfileError_t cuFileGetParameterBool(int param, bool *v) { *v = (param == 1); return ok; }
ssize_t cuFileRead(void *fh, void *buf, size_t n, off_t foff, off_t boff) {
	ssize_t r = pread((int)((intptr_t)fh - 1000), (char *)buf + boff, n, foff);
	return r < 0 ? -1 : r;
}
