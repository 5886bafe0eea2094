/*
 * preload.c - libkylix_preload.so, the LD_PRELOAD shim (docs/design/preload.md).
 *
 * For committed files of a Kylix mount opened read-only, read, pread,
 * readv, preadv (their 64, v2 and _chk forms) are served from the node's
 * pack files, whose read-only descriptors the node hands out over its
 * client socket (op PACKS, flag shared; libkylix's exchange code), and
 * mmap is composed from the packs: each page whose file offset and pack
 * offset agree modulo the page size is mapped (MAP_FIXED over an anonymous
 * reservation), the others are copied in. stdio streams opened read-only
 * on such a file (fopen, fopen64, fdopen) are glibc cookie streams whose
 * reads are the shim's read (section "stdio streams"). Everything else goes to the real
 * libc call untouched: other files, pipes, files open for writing, files
 * being written, anything the shim is unsure of.
 *
 * Safety rules, each relied on below:
 *   - internal I/O uses raw syscalls, never the interposed symbols;
 *   - real functions are found with dlsym(RTLD_NEXT) at first use; until
 *     then (or if missing) the raw syscall stands in;
 *   - errno is saved around everything the shim does on its own account;
 *   - an fd's state is re-validated by fstat (device, inode, size, mtime)
 *     on every call, so an fd closed behind the shim's back (raw close)
 *     and reused is detected; close/dup2/dup3/dup/fcntl(F_DUPFD)/
 *     close_range/closefrom forget the state of the numbers they touch;
 *   - each pack fd's generation (fstat) is checked before every read from
 *     it: a pack that changed, or an fd number the program closed and
 *     reused, is never read (the range goes through the mount);
 *   - one global mutex guards the Kylix entries of the fd table and the
 *     file cache, held only for bookkeeping, taken around fork
 *     (pthread_atfork); fds the shim does not serve are classified and
 *     forgotten with atomics alone, so calls on them (from a signal
 *     handler too) never wait for it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <wchar.h>

#include "../libkylix/src/internal.h"
#include "../../fs/layout/kylix_layout.h"

#define EXPORT __attribute__((visibility("default")))
#define KX_FUSE_MAGIC 0x65735546
#define PG 4096ul
#define MAXFD 65536
#define CACHE_MAX 16
#define PACK_FD_MIN 512

/* ---- real functions ---- */

#define REAL(ret, name, ...)                                                      \
	static ret (*real_##name)(__VA_ARGS__);                                   \
	static ret (*get_##name(void))(__VA_ARGS__)                               \
	{                                                                         \
		ret (*p)(__VA_ARGS__) = __atomic_load_n(&real_##name, __ATOMIC_ACQUIRE); \
		if (!p) {                                                         \
			*(void **)&p = dlsym(RTLD_NEXT, #name);                   \
			__atomic_store_n(&real_##name, p, __ATOMIC_RELEASE);      \
		}                                                                 \
		return p;                                                         \
	}

REAL(ssize_t, read, int, void *, size_t)
REAL(ssize_t, pread, int, void *, size_t, off_t)
REAL(ssize_t, pread64, int, void *, size_t, off_t)
REAL(ssize_t, readv, int, const struct iovec *, int)
REAL(ssize_t, preadv, int, const struct iovec *, int, off_t)
REAL(ssize_t, preadv64, int, const struct iovec *, int, off_t)
REAL(ssize_t, preadv2, int, const struct iovec *, int, off_t, int)
REAL(ssize_t, preadv64v2, int, const struct iovec *, int, off_t, int)
REAL(ssize_t, __read_chk, int, void *, size_t, size_t)
REAL(ssize_t, __pread_chk, int, void *, size_t, off_t, size_t)
REAL(ssize_t, __pread64_chk, int, void *, size_t, off_t, size_t)
REAL(void *, mmap, void *, size_t, int, int, int, off_t)
REAL(void *, mmap64, void *, size_t, int, int, int, off_t)
REAL(int, close, int)
REAL(int, dup, int)
REAL(int, dup2, int, int)
REAL(int, dup3, int, int, int)
REAL(int, fcntl, int, int, ...)
REAL(int, fcntl64, int, int, ...)
REAL(int, close_range, unsigned, unsigned, int)
REAL(void, closefrom, int)
REAL(ssize_t, copy_file_range, int, off_t *, int, off_t *, size_t, unsigned)

/* ---- statistics (KYLIX_PRELOAD_STATS) ---- */

static _Atomic uint64_t st_bypassed, st_fuse, st_mmaps, st_mmap_copied, st_mmap_mapped, st_files, st_streams;

/* ---- packs and files ---- */

struct kpack {
	int fd;
	uint32_t flags;
	uint64_t generation;
	uint64_t size;
	atomic_bool bad; /* changed, short read, error: not used again */
};

struct kext {
	uint64_t off, len; /* file range */
	int pack;          /* index into packs, -1: through the mount */
	uint64_t poff;     /* pack offset of off */
};

struct kfile {
	atomic_int refs;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
	int npacks;
	struct kpack packs[KX_MAX_FDS];
	size_t next;
	struct kext *ext;
	struct kfile *cache_next;
};

enum { S_UNKNOWN = 0, S_PASS = 1, S_KYLIX = 2 };

struct slot {
	atomic_int state;
	struct kfile *kf; /* S_KYLIX, under mu */
};

static struct slot fds[MAXFD];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct kfile *cache; /* most recent first, under mu */
static int ncache;
static bool disabled;

static int raw_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }

static void pack_close(struct kpack *p)
{
	/* Close only the descriptor received: if the program closed that
	 * number and reused it, the generation differs and it is not ours. */
	struct stat st;
	if (p->fd >= 0 && raw_fstat(p->fd, &st) == 0 && kx_generation(&st) == p->generation)
		syscall(SYS_close, p->fd);
	p->fd = -1;
}

static void kf_put(struct kfile *kf)
{
	if (!kf || atomic_fetch_sub(&kf->refs, 1) != 1)
		return;
	for (int i = 0; i < kf->npacks; i++)
		pack_close(&kf->packs[i]);
	free(kf->ext);
	free(kf);
}

static bool same_state(const struct kfile *kf, const struct stat *st)
{
	return kf->dev == st->st_dev && kf->ino == st->st_ino && kf->size == st->st_size &&
	       kf->mtime.tv_sec == st->st_mtim.tv_sec && kf->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* forget drops what the shim knows about fd number fd (it was closed or
 * replaced). Called under mu. */
static void forget_locked(int fd)
{
	if (fd < 0 || fd >= MAXFD)
		return;
	struct kfile *kf = fds[fd].kf;
	fds[fd].kf = NULL;
	atomic_store(&fds[fd].state, S_UNKNOWN);
	kf_put(kf);
}

static void forget(int fd)
{
	if (fd < 0 || fd >= MAXFD)
		return;
	/* Not a Kylix fd: no lock (close is async-signal-safe, and so is
	 * every call on an fd the shim does not serve). */
	int s = S_PASS;
	if (atomic_compare_exchange_strong(&fds[fd].state, &s, S_UNKNOWN) || s == S_UNKNOWN)
		return;
	pthread_mutex_lock(&mu);
	forget_locked(fd);
	pthread_mutex_unlock(&mu);
}

/* add_ext appends a file range to kf's extents, merging with the last. */
static int add_ext(struct kfile *kf, size_t *cap, uint64_t off, uint64_t len, int pack, uint64_t poff)
{
	if (kf->next > 0) {
		struct kext *l = &kf->ext[kf->next - 1];
		if (l->pack == pack && l->off + l->len == off && (pack < 0 || l->poff + l->len == poff)) {
			l->len += len;
			return 0;
		}
	}
	if (kf->next == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		struct kext *e = realloc(kf->ext, nc * sizeof *e);
		if (!e)
			return -1;
		kf->ext = e;
		*cap = nc;
	}
	kf->ext[kf->next++] = (struct kext){off, len, pack, pack < 0 ? 0 : poff};
	return 0;
}

/* ask_packs asks the node for fd's packs (PACKS, flag shared) and keeps
 * those that pass libkylix's receipt checks: checked, read-only, regular,
 * fstat agreeing with the entry's size and generation; a whole-file pack
 * must be the file's size. slot_of[i] is the kfile pack index of table
 * entry i, or -1. Any failure leaves kf with no packs (reads go through
 * the mount). */
static void ask_packs(struct kfile *kf, int fd, const char *sock, int *slot_of, size_t nslot)
{
	int s = kx_connect_node(sock);
	if (s < 0)
		return;
	struct kx_packs_request rq = {KX_PACKS_SHARED, 0};
	unsigned char rbuf[4096];
	int got[KX_MAX_FDS], ngot = 0;
	ssize_t r = kx_exchange(s, KX_OP_PACKS, &rq, sizeof rq, fd, rbuf, sizeof rbuf, got, &ngot);
	syscall(SYS_close, s);
	if (r < 0)
		return;
	const unsigned char *fl;
	size_t flen;
	uint32_t n = 0;
	if (kx_reply_status("PACKS", rbuf, (size_t)r, &fl, &flen) != 0 || flen < 4)
		goto out;
	memcpy(&n, fl, 4);
	if (n > KX_MAX_FDS || flen != 4 + (size_t)n * sizeof(struct kx_pack_entry) || (int)n != ngot)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		struct kx_pack_entry e;
		memcpy(&e, fl + 4 + i * sizeof e, sizeof e);
		struct stat st;
		bool whole = e.flags & KX_PACK_WHOLE_FILE;
		bool ok = (e.flags & KX_PACK_CHECKED) && e.pack_index < nslot && slot_of[e.pack_index] < 0 &&
		          (!whole || e.size == (uint64_t)kf->size) && raw_fstat(got[i], &st) == 0 &&
		          S_ISREG(st.st_mode) && (uint64_t)st.st_size == e.size && kx_generation(&st) == e.generation &&
		          (syscall(SYS_fcntl, got[i], F_GETFL) & O_ACCMODE) == O_RDONLY;
		if (!ok)
			continue;
		/* Out of the low numbers programs pick by hand (dup2 targets). */
		int hi = (int)syscall(SYS_fcntl, got[i], F_DUPFD_CLOEXEC, PACK_FD_MIN);
		if (hi >= 0) {
			syscall(SYS_close, got[i]);
			got[i] = hi;
		}
		struct kpack *p = &kf->packs[kf->npacks];
		p->fd = got[i];
		got[i] = -1;
		p->flags = e.flags;
		p->generation = e.generation;
		p->size = e.size;
		atomic_init(&p->bad, false);
		slot_of[e.pack_index] = kf->npacks++;
	}
out:
	for (int i = 0; i < ngot; i++)
		if (got[i] >= 0)
			syscall(SYS_close, got[i]);
}

/* build makes the kfile of a Kylix file open read-only on fd: its packs,
 * then its extents (one, for a whole-file pack; else from the chunk table,
 * KYLIX_IOC_CHUNKS). NULL: leave this fd to the real calls. */
static struct kfile *build(int fd, const struct stat *st, const char *sock)
{
	struct kfile *kf = calloc(1, sizeof *kf);
	if (!kf)
		return NULL;
	atomic_init(&kf->refs, 1);
	kf->dev = st->st_dev;
	kf->ino = st->st_ino;
	kf->size = st->st_size;
	kf->mtime = st->st_mtim;
	size_t cap = 0;
	const size_t maxe = KYLIX_CHUNKS_MAX_ENTRIES;
	unsigned char *buf = calloc(1, KYLIX_CHUNKS_SIZE(KYLIX_CHUNKS_MAX_ENTRIES));
	if (!buf)
		goto fail;
	struct kylix_chunks h = {.magic = KYLIX_LAYOUT_MAGIC, .version = KYLIX_LAYOUT_VERSION2};
	memcpy(buf, &h, sizeof h);
	/* Totals first: a file being written answers EBUSY (leave it to FUSE). */
	if (ioctl(fd, KYLIX_IOC_CHUNKS(0), buf) != 0)
		goto fail;
	memcpy(&h, buf, sizeof h);
	if (h.file_size != (uint64_t)st->st_size)
		goto fail;
	uint8_t id[32];
	memcpy(id, h.file_id, 32);
	int slot_of[KX_MAX_FDS * 64];
	for (size_t i = 0; i < sizeof slot_of / sizeof slot_of[0]; i++)
		slot_of[i] = -1;
	ask_packs(kf, fd, sock, slot_of, sizeof slot_of / sizeof slot_of[0]);
	for (int i = 0; i < kf->npacks; i++)
		if (kf->packs[i].flags & KX_PACK_WHOLE_FILE) {
			/* A checked whole-file pack is the file from offset 0. */
			if (add_ext(kf, &cap, 0, (uint64_t)kf->size, i, 0) != 0)
				goto fail;
			free(buf);
			return kf;
		}
	uint64_t off = 0;
	for (uint64_t first = 0; first < h.n_chunks;) {
		struct kylix_chunks q = {.magic = KYLIX_LAYOUT_MAGIC, .version = KYLIX_LAYOUT_VERSION2,
		                         .first_chunk = first, .max_entries = (uint32_t)maxe};
		memcpy(buf, &q, sizeof q);
		if (ioctl(fd, KYLIX_IOC_CHUNKS(KYLIX_CHUNKS_MAX_ENTRIES), buf) != 0)
			goto fail;
		memcpy(&q, buf, sizeof q);
		if (memcmp(q.file_id, id, 32) != 0 || q.n_chunks != h.n_chunks || q.n_entries == 0 ||
		    q.n_entries > maxe)
			goto fail; /* replaced meanwhile */
		for (uint32_t k = 0; k < q.n_entries; k++) {
			struct kylix_chunk c;
			memcpy(&c, buf + sizeof q + k * sizeof c, sizeof c);
			if (c.file_offset != off || c.length == 0)
				goto fail;
			int p = -1;
			if ((c.flags & KYLIX_CHUNK_LOCAL) && c.pack_index < sizeof slot_of / sizeof slot_of[0])
				p = slot_of[c.pack_index];
			if (p >= 0 && c.pack_offset + c.length > kf->packs[p].size)
				p = -1;
			if (add_ext(kf, &cap, off, c.length, p, c.pack_offset) != 0)
				goto fail;
			off += c.length;
		}
		first += q.n_entries;
	}
	if (off != (uint64_t)kf->size)
		goto fail;
	free(buf);
	return kf;
fail:
	free(buf);
	kf_put(kf);
	return NULL;
}

/* detect says whether fd is a committed Kylix file open read-only that the
 * shim serves, and builds or finds its kfile (a reference). */
static struct kfile *detect(int fd, const struct stat *st)
{
	if (!S_ISREG(st->st_mode))
		return NULL;
	struct statfs sf;
	if (syscall(SYS_fstatfs, fd, &sf) != 0 || sf.f_type != KX_FUSE_MAGIC)
		return NULL;
	long fl = syscall(SYS_fcntl, fd, F_GETFL);
	if (fl < 0 || (fl & O_ACCMODE) != O_RDONLY || (fl & O_PATH))
		return NULL;
	struct kylix_probe pr;
	memset(&pr, 0, sizeof pr);
	if (ioctl(fd, KYLIX_IOC_PROBE, &pr) != 0 || pr.magic != KYLIX_LAYOUT_MAGIC || pr.version < 2)
		return NULL;
	pr.client_socket[sizeof pr.client_socket - 1] = 0;
	pthread_mutex_lock(&mu);
	for (struct kfile *k = cache; k; k = k->cache_next)
		if (same_state(k, st)) {
			atomic_fetch_add(&k->refs, 1);
			pthread_mutex_unlock(&mu);
			return k;
		}
	pthread_mutex_unlock(&mu);
	struct kfile *kf = build(fd, st, pr.client_socket);
	if (!kf)
		return NULL;
	atomic_fetch_add(&st_files, 1);
	pthread_mutex_lock(&mu);
	atomic_fetch_add(&kf->refs, 1); /* the cache's */
	kf->cache_next = cache;
	cache = kf;
	if (++ncache > CACHE_MAX) {
		struct kfile **pp = &cache;
		while ((*pp)->cache_next)
			pp = &(*pp)->cache_next;
		struct kfile *old = *pp;
		*pp = NULL;
		ncache--;
		kf_put(old);
	}
	pthread_mutex_unlock(&mu);
	return kf;
}

/* lookup returns a reference to fd's kfile when the shim serves fd, with
 * *st its fstat; NULL: use the real call. */
static struct kfile *lookup(int fd, struct stat *st)
{
	if (disabled || fd < 0 || fd >= MAXFD)
		return NULL;
	int s = atomic_load(&fds[fd].state);
	if (s == S_PASS)
		return NULL;
	if (raw_fstat(fd, st) != 0)
		return NULL;
	if (s == S_KYLIX) {
		pthread_mutex_lock(&mu);
		struct kfile *kf = fds[fd].kf;
		if (kf && same_state(kf, st)) {
			atomic_fetch_add(&kf->refs, 1);
			pthread_mutex_unlock(&mu);
			return kf;
		}
		forget_locked(fd); /* another file, or this one changed: look again */
		pthread_mutex_unlock(&mu);
	}
	struct kfile *kf = detect(fd, st);
	if (!kf) {
		/* Not ours: remembered without the lock (see forget). */
		int u = S_UNKNOWN;
		atomic_compare_exchange_strong(&fds[fd].state, &u, S_PASS);
		return NULL;
	}
	pthread_mutex_lock(&mu);
	if (atomic_load(&fds[fd].state) == S_UNKNOWN) {
		atomic_fetch_add(&kf->refs, 1);
		fds[fd].kf = kf;
		atomic_store(&fds[fd].state, S_KYLIX);
	}
	pthread_mutex_unlock(&mu);
	return kf;
}

/* ---- reads ---- */

static ssize_t fuse_pread(int fd, void *buf, size_t n, off_t off)
{
	ssize_t (*p)(int, void *, size_t, off_t) = get_pread64();
	return p ? p(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

/* pack_ok checks a pack's generation before a read from it. */
static bool pack_ok(struct kpack *p)
{
	if (atomic_load(&p->bad))
		return false;
	struct stat st;
	if (raw_fstat(p->fd, &st) != 0 || kx_generation(&st) != p->generation) {
		atomic_store(&p->bad, true);
		return false;
	}
	return true;
}

static size_t find_ext(const struct kfile *kf, uint64_t off)
{
	size_t lo = 0, hi = kf->next;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (kf->ext[mid].off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* serve reads up to n bytes at off of the file on fd: pack bytes from the
 * packs, the rest (and anything a pack fails) through the mount. Returns
 * the bytes read or -1 with errno (only when nothing was read). */
static ssize_t serve(struct kfile *kf, int fd, void *buf, size_t n, uint64_t off)
{
	if (off >= (uint64_t)kf->size || n == 0)
		return 0;
	if (n > (uint64_t)kf->size - off)
		n = (size_t)((uint64_t)kf->size - off);
	if (n > SSIZE_MAX)
		n = SSIZE_MAX;
	uint32_t checked = 0;
	size_t done = 0;
	while (done < n) {
		uint64_t at = off + done;
		const struct kext *e = &kf->ext[find_ext(kf, at)];
		size_t piece = (size_t)(e->off + e->len - at);
		if (piece > n - done)
			piece = n - done;
		if (e->pack >= 0) {
			struct kpack *p = &kf->packs[e->pack];
			bool ok = (checked & (1u << e->pack)) ? !atomic_load(&p->bad) : pack_ok(p);
			checked |= 1u << e->pack;
			if (ok) {
				ssize_t r = syscall(SYS_pread64, p->fd, (char *)buf + done, piece, e->poff + (at - e->off));
				if (r == (ssize_t)piece) {
					atomic_fetch_add(&st_bypassed, (uint64_t)r);
					done += piece;
					continue;
				}
				atomic_store(&p->bad, true); /* short or failed: the mount from now on */
			}
		}
		ssize_t r = fuse_pread(fd, (char *)buf + done, piece, (off_t)at);
		if (r < 0)
			return done ? (ssize_t)done : -1;
		atomic_fetch_add(&st_fuse, (uint64_t)r);
		done += (size_t)r;
		if ((size_t)r < piece)
			break;
	}
	return (ssize_t)done;
}

static ssize_t serve_iov(struct kfile *kf, int fd, const struct iovec *iov, int cnt, uint64_t off)
{
	if (cnt < 0 || cnt > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	size_t total = 0;
	for (int i = 0; i < cnt; i++) {
		if (iov[i].iov_len == 0)
			continue;
		ssize_t r = serve(kf, fd, iov[i].iov_base, iov[i].iov_len, off + total);
		if (r < 0)
			return total ? (ssize_t)total : -1;
		total += (size_t)r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return (ssize_t)total;
}

/* The offset-advancing reads: the fd's file offset through the real fd. */
static ssize_t read_at_pos(struct kfile *kf, int fd, void *buf, size_t n, const struct iovec *iov, int cnt)
{
	off_t cur = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR);
	if (cur < 0)
		return -2; /* not seekable: real call */
	ssize_t r = iov ? serve_iov(kf, fd, iov, cnt, (uint64_t)cur) : serve(kf, fd, buf, n, (uint64_t)cur);
	if (r > 0)
		syscall(SYS_lseek, fd, cur + r, SEEK_SET);
	return r;
}

#define KEEP_ERRNO_BEGIN int saved_errno_ = errno
#define KEEP_ERRNO_END errno = saved_errno_

/* shim_read is read(2) as the shim serves it (also the stdio streams'
 * read, below). */
static ssize_t shim_read(int fd, void *buf, size_t n)
{
	KEEP_ERRNO_BEGIN;
	struct stat st;
	struct kfile *kf = lookup(fd, &st);
	KEEP_ERRNO_END;
	if (kf) {
		ssize_t r = read_at_pos(kf, fd, buf, n, NULL, 0);
		kf_put(kf);
		if (r != -2)
			return r;
		KEEP_ERRNO_END;
	}
	ssize_t (*p)(int, void *, size_t) = get_read();
	return p ? p(fd, buf, n) : syscall(SYS_read, fd, buf, n);
}

EXPORT ssize_t read(int fd, void *buf, size_t n) { return shim_read(fd, buf, n); }

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen) {
		ssize_t (*p)(int, void *, size_t, size_t) = get___read_chk();
		if (p)
			return p(fd, buf, n, buflen); /* fails the check as glibc does */
		abort();
	}
	return read(fd, buf, n);
}

static ssize_t do_pread(int fd, void *buf, size_t n, off_t off, ssize_t (*real)(int, void *, size_t, off_t))
{
	KEEP_ERRNO_BEGIN;
	struct stat st;
	struct kfile *kf = off >= 0 ? lookup(fd, &st) : NULL;
	KEEP_ERRNO_END;
	if (kf) {
		ssize_t r = serve(kf, fd, buf, n, (uint64_t)off);
		kf_put(kf);
		return r;
	}
	return real ? real(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off) { return do_pread(fd, buf, n, off, get_pread()); }
EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return do_pread(fd, buf, n, off, get_pread64()); }

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	if (n > buflen) {
		ssize_t (*p)(int, void *, size_t, off_t, size_t) = get___pread_chk();
		if (p)
			return p(fd, buf, n, off, buflen);
		abort();
	}
	return pread(fd, buf, n, off);
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	if (n > buflen) {
		ssize_t (*p)(int, void *, size_t, off_t, size_t) = get___pread64_chk();
		if (p)
			return p(fd, buf, n, off, buflen);
		abort();
	}
	return pread64(fd, buf, n, off);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	KEEP_ERRNO_BEGIN;
	struct stat st;
	struct kfile *kf = lookup(fd, &st);
	KEEP_ERRNO_END;
	if (kf) {
		ssize_t r = read_at_pos(kf, fd, NULL, 0, iov, cnt);
		kf_put(kf);
		if (r != -2)
			return r;
		KEEP_ERRNO_END;
	}
	ssize_t (*p)(int, const struct iovec *, int) = get_readv();
	return p ? p(fd, iov, cnt) : syscall(SYS_readv, fd, iov, cnt);
}

static ssize_t do_preadv(int fd, const struct iovec *iov, int cnt, off_t off, int flags,
                         ssize_t (*real)(int, const struct iovec *, int, off_t),
                         ssize_t (*real2)(int, const struct iovec *, int, off_t, int))
{
	KEEP_ERRNO_BEGIN;
	struct stat st;
	/* preadv2 with flags (RWF_NOWAIT, ...) is the kernel's business; off
	 * -1 (the file offset) only for the v2 calls. */
	struct kfile *kf = flags == 0 && (off >= 0 || (off == -1 && real2)) ? lookup(fd, &st) : NULL;
	KEEP_ERRNO_END;
	if (kf) {
		ssize_t r = off == -1 ? read_at_pos(kf, fd, NULL, 0, iov, cnt) : serve_iov(kf, fd, iov, cnt, (uint64_t)off);
		kf_put(kf);
		if (r != -2)
			return r;
		KEEP_ERRNO_END;
	}
	if (real2)
		return real2(fd, iov, cnt, off, flags);
	if (real)
		return real(fd, iov, cnt, off);
	return syscall(SYS_preadv2, fd, iov, cnt, (long)off, (long)((uint64_t)off >> 32), flags);
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
	return do_preadv(fd, iov, cnt, off, 0, get_preadv(), NULL);
}
EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off)
{
	return do_preadv(fd, iov, cnt, off, 0, get_preadv64(), NULL);
}
EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	return do_preadv(fd, iov, cnt, off, flags, NULL, get_preadv2());
}
EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	return do_preadv(fd, iov, cnt, off, flags, NULL, get_preadv64v2());
}

/* copy_file_range from a file the shim serves: EXDEV, which every caller
 * handles (the kernel answers it across file systems), so that cp and
 * friends fall back to read(), which the shim serves. */
EXPORT ssize_t copy_file_range(int in, off_t *off_in, int out, off_t *off_out, size_t n, unsigned flags)
{
	KEEP_ERRNO_BEGIN;
	struct stat st;
	struct kfile *kf = lookup(in, &st);
	KEEP_ERRNO_END;
	if (kf) {
		bool packs = kf->npacks > 0;
		kf_put(kf);
		if (packs) {
			errno = EXDEV;
			return -1;
		}
	}
	ssize_t (*p)(int, off_t *, int, off_t *, size_t, unsigned) = get_copy_file_range();
	return p ? p(in, off_in, out, off_out, n, flags) : syscall(SYS_copy_file_range, in, off_in, out, off_out, n, flags);
}

/* ---- mmap ---- */

/* mappable says whether file page [fo, fo+PG) can be mapped from a pack,
 * and how many pages from fo on can (one pack, one extent, pages at the
 * same phase); *pack and *poff say where. */
static size_t mappable(struct kfile *kf, uint64_t fo, size_t maxpages, int *pack, uint64_t *poff, uint32_t *checked)
{
	const struct kext *e = &kf->ext[find_ext(kf, fo)];
	if (e->pack < 0)
		return 0;
	struct kpack *p = &kf->packs[e->pack];
	uint64_t po = e->poff + (fo - e->off);
	if (po % PG != 0)
		return 0;
	if (!(*checked & (1u << e->pack))) {
		*checked |= 1u << e->pack;
		pack_ok(p);
	}
	if (atomic_load(&p->bad))
		return 0;
	uint64_t end = e->off + e->len;
	size_t k = 0;
	while (k < maxpages) {
		uint64_t pe = fo + (k + 1) * PG;
		if (pe <= end) {
			k++;
			continue;
		}
		/* The file's last, partial page: only from a whole-file pack
		 * (past its end the kernel gives zeros, not other files' bytes). */
		if (end == (uint64_t)kf->size && (p->flags & KX_PACK_WHOLE_FILE) && p->size == (uint64_t)kf->size)
			k++;
		break;
	}
	*pack = e->pack;
	*poff = po;
	return k;
}

static void *compose(struct kfile *kf, int fd, void *addr, size_t len, int prot, int flags, off_t off)
{
	size_t npg = (len + PG - 1) / PG;
	char *base = (char *)syscall(SYS_mmap, addr, npg * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((unsigned long)base > -4096ul)
		return MAP_FAILED;
	uint32_t checked = 0;
	uint64_t copied = 0, mapped = 0;
	for (size_t i = 0; i < npg;) {
		uint64_t fo = (uint64_t)off + i * PG;
		int pack;
		uint64_t po;
		size_t k = mappable(kf, fo, npg - i, &pack, &po, &checked);
		if (k > 0) {
			void *m = (void *)syscall(SYS_mmap, base + i * PG, k * PG, prot,
			                          MAP_PRIVATE | MAP_FIXED | (flags & MAP_POPULATE), kf->packs[pack].fd, (off_t)po);
			if (m == base + i * PG) {
				mapped += k * PG;
				i += k;
				continue;
			}
			k = 0;
		}
		/* Copy one page (pack or mount: serve decides). */
		size_t want = PG;
		if (fo + want > (uint64_t)kf->size)
			want = (size_t)((uint64_t)kf->size - fo);
		if (serve(kf, fd, base + i * PG, want, fo) != (ssize_t)want) {
			syscall(SYS_munmap, base, npg * PG);
			return MAP_FAILED;
		}
		copied += want;
		i++;
	}
	if (prot != (PROT_READ | PROT_WRITE))
		syscall(SYS_mprotect, base, npg * PG, prot);
	atomic_fetch_add(&st_mmaps, 1);
	atomic_fetch_add(&st_mmap_copied, copied);
	atomic_fetch_add(&st_mmap_mapped, mapped);
	/* Counted as reads too: the mapped bytes bypass FUSE when touched. */
	return base;
}

static void *do_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off,
                     void *(*real)(void *, size_t, int, int, int, off_t))
{
	int type = flags & MAP_TYPE;
	bool ours = fd >= 0 && !(flags & (MAP_ANONYMOUS | MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_HUGETLB)) &&
	            (type == MAP_PRIVATE || (type == MAP_SHARED && !(prot & PROT_WRITE))) &&
	            !(prot & PROT_EXEC) && len > 0 && off >= 0 && (uint64_t)off % PG == 0;
	if (ours) {
		KEEP_ERRNO_BEGIN;
		struct stat st;
		struct kfile *kf = lookup(fd, &st);
		void *m = MAP_FAILED;
		if (kf) {
			uint64_t filepages = ((uint64_t)kf->size + PG - 1) / PG * PG;
			if (kf->npacks > 0 && (uint64_t)off < filepages && len <= filepages - (uint64_t)off)
				m = compose(kf, fd, addr, len, prot, flags, off);
			kf_put(kf);
		}
		KEEP_ERRNO_END;
		if (m != MAP_FAILED)
			return m;
	}
	return real ? real(addr, len, prot, flags, fd, off) : (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off, get_mmap());
}
EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off, get_mmap64());
}

/* ---- descriptors ---- */

static int shim_close(int fd)
{
	KEEP_ERRNO_BEGIN;
	forget(fd);
	KEEP_ERRNO_END;
	int (*p)(int) = get_close();
	return p ? p(fd) : (int)syscall(SYS_close, fd);
}

EXPORT int close(int fd) { return shim_close(fd); }

EXPORT int dup(int fd)
{
	int (*p)(int) = get_dup();
	int r = p ? p(fd) : (int)syscall(SYS_dup, fd);
	if (r >= 0) {
		KEEP_ERRNO_BEGIN;
		forget(r);
		KEEP_ERRNO_END;
	}
	return r;
}

EXPORT int dup2(int old, int new)
{
	int (*p)(int, int) = get_dup2();
	int r = p ? p(old, new) : (int)syscall(SYS_dup2, old, new);
	if (r >= 0 && old != new) {
		KEEP_ERRNO_BEGIN;
		forget(new);
		KEEP_ERRNO_END;
	}
	return r;
}

EXPORT int dup3(int old, int new, int flags)
{
	int (*p)(int, int, int) = get_dup3();
	int r = p ? p(old, new, flags) : (int)syscall(SYS_dup3, old, new, flags);
	if (r >= 0) {
		KEEP_ERRNO_BEGIN;
		forget(new);
		KEEP_ERRNO_END;
	}
	return r;
}

static int do_fcntl(int (*real)(int, int, ...), int fd, int cmd, void *arg)
{
	int r = real ? real(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {
		KEEP_ERRNO_BEGIN;
		forget(r);
		KEEP_ERRNO_END;
	}
	return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(get_fcntl(), fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	int (*p)(int, int, ...) = get_fcntl64();
	return do_fcntl(p ? p : get_fcntl(), fd, cmd, arg);
}

static void forget_range(unsigned first, unsigned last)
{
	pthread_mutex_lock(&mu);
	for (unsigned fd = first; fd <= last && fd < MAXFD; fd++)
		if (atomic_load(&fds[fd].state) != S_UNKNOWN)
			forget_locked((int)fd);
	pthread_mutex_unlock(&mu);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	int (*p)(unsigned, unsigned, int) = get_close_range();
	int r = p ? p(first, last, flags) : (int)syscall(SYS_close_range, first, last, flags);
	if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC)) {
		KEEP_ERRNO_BEGIN;
		forget_range(first, last);
		KEEP_ERRNO_END;
	}
	return r;
}

EXPORT void closefrom(int lowfd)
{
	KEEP_ERRNO_BEGIN;
	if (lowfd >= 0)
		forget_range((unsigned)lowfd, MAXFD - 1);
	KEEP_ERRNO_END;
	void (*p)(int) = get_closefrom();
	if (p)
		p(lowfd);
	else
		syscall(SYS_close_range, (unsigned)lowfd, ~0u, 0);
}

/* ---- stdio streams (docs/design/preload.md, "stdio") ----
 *
 * glibc's fread, fgets, getline, getc... read through libc-internal calls
 * that an LD_PRELOAD cannot interpose. So fopen, fopen64 and fdopen of a
 * file the shim serves, in a read-only mode, return a glibc cookie stream
 * (fopencookie) whose read is shim_read on the stream's own descriptor and
 * whose seek is lseek on it: every stdio function then works on it as
 * glibc's own code, and the descriptor's offset is the stream's position
 * plus what its buffer holds, as under a plain stream (read() on fileno()
 * after an fseek reads on from the stream's position). What a cookie
 * stream lacks is supplied here: fileno answers
 * the descriptor (glibc says -1), freopen reopens in place, and the wide
 * character reads (glibc's cookie streams have no wide buffer: fgetwc on
 * one crashes) are done over the byte stream with mbrtowc. Any other
 * mode, any stream the shim does not serve, and KYLIX_PRELOAD_STDIO=0:
 * glibc's stream, untouched. */

REAL(FILE *, fopen, const char *, const char *)
REAL(FILE *, fopen64, const char *, const char *)
REAL(FILE *, fdopen, int, const char *)
REAL(FILE *, freopen, const char *, const char *, FILE *)
REAL(FILE *, freopen64, const char *, const char *, FILE *)
REAL(int, fileno, FILE *)
REAL(int, fileno_unlocked, FILE *)
REAL(int, fwide, FILE *, int)
REAL(wint_t, fgetwc, FILE *)
REAL(wint_t, getwc, FILE *)
REAL(wint_t, fgetwc_unlocked, FILE *)
REAL(wint_t, getwc_unlocked, FILE *)
REAL(wchar_t *, fgetws, wchar_t *, int, FILE *)
REAL(wchar_t *, fgetws_unlocked, wchar_t *, int, FILE *)
REAL(wchar_t *, __fgetws_chk, wchar_t *, size_t, int, FILE *)
REAL(wchar_t *, __fgetws_unlocked_chk, wchar_t *, size_t, int, FILE *)
REAL(wint_t, ungetwc, wint_t, FILE *)

#define KS_COOKIE_FILENO (-2) /* glibc's _fileno of a cookie stream */
#define KS_BUCKETS 256

struct kstream {
	FILE *fp;
	int fd;     /* -1 once a failed freopen closed it */
	int orient; /* fwide: 0 none yet, 1 wide, -1 byte (set by fwide only) */
	char *buf;  /* the stream's buffer (setvbuf), freed at close */
	mbstate_t mbs;
	struct kstream *next;
};

static pthread_mutex_t smu = PTHREAD_MUTEX_INITIALIZER; /* the stream table */
static struct kstream *streams[KS_BUCKETS];
static bool stdio_off;

static size_t ks_bucket(const FILE *fp) { return ((uintptr_t)fp >> 4) % KS_BUCKETS; }

/* ks_find returns the shim's stream fp, or NULL (glibc's own: untouched). */
static struct kstream *ks_find(FILE *fp)
{
	if (!fp || fp->_fileno != KS_COOKIE_FILENO)
		return NULL;
	pthread_mutex_lock(&smu);
	struct kstream *k = streams[ks_bucket(fp)];
	while (k && k->fp != fp)
		k = k->next;
	pthread_mutex_unlock(&smu);
	return k;
}

static void ks_unlink(struct kstream *k)
{
	pthread_mutex_lock(&smu);
	for (struct kstream **pp = &streams[ks_bucket(k->fp)]; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			break;
		}
	pthread_mutex_unlock(&smu);
}

static ssize_t ks_read(void *c, char *buf, size_t n)
{
	struct kstream *k = c;
	if (k->fd < 0) {
		errno = EBADF;
		return -1;
	}
	return shim_read(k->fd, buf, n);
}

static int ks_seek(void *c, off64_t *pos, int whence)
{
	struct kstream *k = c;
	off_t r = (off_t)syscall(SYS_lseek, k->fd, (off_t)*pos, whence);
	if (r < 0)
		return -1;
	*pos = r;
	return 0;
}

static int ks_close(void *c)
{
	struct kstream *k = c;
	ks_unlink(k);
	int r = k->fd >= 0 ? shim_close(k->fd) : 0;
	free(k->buf); /* glibc touches no buffer after the close call */
	free(k);
	return r;
}

/* read_only_mode: "r" with only b, e, m, c, t after it (no '+', no
 * ",ccs="): the modes a cookie stream serves as glibc would. */
static bool read_only_mode(const char *m)
{
	if (!m || m[0] != 'r')
		return false;
	for (const char *p = m + 1; *p; p++)
		if (!strchr("bemct", *p))
			return false;
	return true;
}

/* A cookie stream's reads all go through its buffer (glibc's generic
 * xsgetn: no direct read into a large fread's destination), 8 KiB by
 * default: each refill costs the shim's checks (fstat of the fd and the
 * pack, lseek twice). The buffer is the file's size rounded up to a power
 * of two, from 8 KiB to 64 KiB: 64 KiB reads a warm GiB through cksum in
 * 0.17 s where 8 KiB takes 0.25 s and 1 MiB gains nothing more
 * (docs/bench.md); a stream holds at most 64 KiB read ahead (bytes of the
 * version it read, should the file be rewritten meanwhile; glibc's own
 * streams 8 KiB). */
#define KS_BUF_MIN 8192u
#ifndef KS_BUF_MAX
#define KS_BUF_MAX 65536u /* -DKS_BUF_MAX=8192u: glibc's size (the benchmark's "8 KiB") */
#endif

/* ks_wrap returns a cookie stream reading fd (taking it over), or NULL. */
static FILE *ks_wrap(int fd)
{
	struct stat st;
	size_t bsz = KS_BUF_MIN;
	if (raw_fstat(fd, &st) == 0)
		while (bsz < KS_BUF_MAX && (off_t)bsz < st.st_size)
			bsz <<= 1;
	struct kstream *k = calloc(1, sizeof *k);
	if (!k)
		return NULL;
	k->fd = fd;
	cookie_io_functions_t io = {.read = ks_read, .write = NULL, .seek = ks_seek, .close = ks_close};
	FILE *fp = fopencookie(k, "r", io);
	if (!fp) {
		free(k);
		return NULL;
	}
	k->fp = fp;
	k->buf = malloc(bsz);
	if (k->buf && setvbuf(fp, k->buf, _IOFBF, bsz) != 0) {
		free(k->buf);
		k->buf = NULL;
	}
	pthread_mutex_lock(&smu);
	k->next = streams[ks_bucket(fp)];
	streams[ks_bucket(fp)] = k;
	pthread_mutex_unlock(&smu);
	atomic_fetch_add(&st_streams, 1);
	return fp;
}

/* served says whether the shim serves reads of fd from at least one
 * pack (a fresh look: the number's state is forgotten first, it may be a
 * stale one's). A file with no pack handed out keeps glibc's stream, and
 * its number is forgotten again: glibc's fclose closes it without the
 * shim seeing it, and a number left marked "not Kylix" would keep the
 * shim off the next file opened under it. */
static bool served(int fd)
{
	if (disabled || stdio_off || fd < 0)
		return false;
	forget(fd);
	struct stat st;
	struct kfile *kf = lookup(fd, &st);
	bool packs = kf && kf->npacks > 0;
	if (kf)
		kf_put(kf);
	if (!packs)
		forget(fd);
	return packs;
}

/* do_fopen: glibc opens (its mode rules, errno, O_CLOEXEC for 'e'); a
 * file the shim serves is then moved to a cookie stream on the same
 * descriptor number where it is still free (F_DUPFD never replaces). */
static FILE *do_fopen(FILE *(*real)(const char *, const char *), const char *path, const char *mode)
{
	if (!real) {
		errno = ENOSYS;
		return NULL;
	}
	FILE *orig = real(path, mode);
	if (!orig || !read_only_mode(mode))
		return orig;
	KEEP_ERRNO_BEGIN;
	int fd = orig->_fileno;
	long fdfl = syscall(SYS_fcntl, fd, F_GETFD);
	FILE *fp = NULL;
	int nfd = -1;
	if (fdfl >= 0 && served(fd) && (nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
		forget(nfd);
		fp = ks_wrap(nfd);
	}
	if (!fp) {
		if (nfd >= 0)
			syscall(SYS_close, nfd);
		forget(fd);
		KEEP_ERRNO_END;
		return orig;
	}
	forget(fd);
	fclose(orig); /* closes fd (glibc's internal close) */
	struct kstream *k = ks_find(fp);
	int back = (int)syscall(SYS_fcntl, nfd, (fdfl & FD_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, fd);
	if (back == fd) {
		forget(fd);
		syscall(SYS_close, nfd);
		forget(nfd);
		k->fd = fd;
	} else {
		if (back >= 0)
			syscall(SYS_close, back);
		if (!(fdfl & FD_CLOEXEC))
			syscall(SYS_fcntl, nfd, F_SETFD, 0);
	}
	KEEP_ERRNO_END;
	return fp;
}

EXPORT FILE *fopen(const char *path, const char *mode) { return do_fopen(get_fopen(), path, mode); }
EXPORT FILE *fopen64(const char *path, const char *mode)
{
	FILE *(*p)(const char *, const char *) = get_fopen64();
	return do_fopen(p ? p : get_fopen(), path, mode);
}

/* fdopen in a read-only mode of a descriptor the shim serves (open
 * O_RDONLY: what glibc checks): the cookie stream takes it over as is
 * (glibc's fdopen changes nothing on it for "r"). */
EXPORT FILE *fdopen(int fd, const char *mode)
{
	if (read_only_mode(mode) && !strchr(mode, 'e')) {
		KEEP_ERRNO_BEGIN;
		FILE *fp = served(fd) ? ks_wrap(fd) : NULL;
		KEEP_ERRNO_END;
		if (fp)
			return fp;
	}
	FILE *(*p)(int, const char *) = get_fdopen();
	if (!p) {
		errno = ENOSYS;
		return NULL;
	}
	return p(fd, mode);
}

/* freopen of the shim's stream: in a read-only mode, the new file is
 * opened and put on the stream's descriptor number (dup3, as glibc does),
 * and the stream is rewound with nothing buffered; in any other mode it
 * cannot become a writable glibc stream in place: the stream is closed,
 * EINVAL (docs/design/preload.md). Other streams: glibc's freopen. */
static FILE *do_freopen(FILE *(*real)(const char *, const char *, FILE *), const char *path, const char *mode,
                        FILE *fp)
{
	struct kstream *k = ks_find(fp);
	if (!k) {
		if (!real) {
			errno = ENOSYS;
			return NULL;
		}
		return real(path, mode, fp);
	}
	flockfile(fp);
	fflush(fp);
	FILE *ret = NULL;
	if (!read_only_mode(mode)) {
		if (k->fd >= 0)
			shim_close(k->fd);
		k->fd = -1;
		errno = EINVAL;
		goto out;
	}
	char procp[64];
	if (!path) {
		snprintf(procp, sizeof procp, "/proc/self/fd/%d", k->fd);
		path = procp;
	}
	bool ce = strchr(mode, 'e') != NULL;
	int nfd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | (ce ? O_CLOEXEC : 0));
	if (nfd < 0) {
		int e = errno;
		if (k->fd >= 0)
			shim_close(k->fd);
		k->fd = -1;
		errno = e;
		goto out;
	}
	forget(nfd);
	KEEP_ERRNO_BEGIN;
	if (k->fd >= 0 && syscall(SYS_dup3, nfd, k->fd, ce ? O_CLOEXEC : 0) == k->fd) {
		forget(k->fd);
		syscall(SYS_close, nfd);
	} else {
		if (k->fd >= 0)
			shim_close(k->fd);
		k->fd = nfd;
	}
	k->orient = 0;
	memset(&k->mbs, 0, sizeof k->mbs);
	fseeko64(fp, 0, SEEK_SET);
	clearerr_unlocked(fp);
	KEEP_ERRNO_END;
	ret = fp;
out:
	funlockfile(fp);
	return ret;
}

EXPORT FILE *freopen(const char *path, const char *mode, FILE *fp) { return do_freopen(get_freopen(), path, mode, fp); }
EXPORT FILE *freopen64(const char *path, const char *mode, FILE *fp)
{
	FILE *(*p)(const char *, const char *, FILE *) = get_freopen64();
	return do_freopen(p ? p : get_freopen(), path, mode, fp);
}

/* fseek of the shim's stream from SEEK_END: glibc turns SEEK_END into
 * SEEK_SET with fstat's size for its own streams, then seeks to the 8 KiB
 * block and reads up to the offset; for a cookie stream it cannot fstat
 * and seeks the descriptor straight there. The conversion done here
 * keeps glibc's descriptor offsets (read() on fileno() after fseek). */
REAL(int, fseek, FILE *, long, int)
REAL(int, fseeko, FILE *, off_t, int)
REAL(int, fseeko64, FILE *, off64_t, int)

static int end_to_set(FILE *fp, off64_t *off, int *whence)
{
	struct kstream *k = *whence == SEEK_END ? ks_find(fp) : NULL;
	struct stat st;
	if (!k || k->fd < 0 || raw_fstat(k->fd, &st) != 0 || !S_ISREG(st.st_mode))
		return 0;
	if (*off > 0 && st.st_size > INT64_MAX - *off)
		return 0; /* glibc's (and the kernel's) EOVERFLOW/EINVAL */
	*off += st.st_size;
	*whence = SEEK_SET;
	return 0;
}

EXPORT int fseek(FILE *fp, long off, int whence)
{
	off64_t o = off;
	KEEP_ERRNO_BEGIN;
	end_to_set(fp, &o, &whence);
	KEEP_ERRNO_END;
	int (*p)(FILE *, long, int) = get_fseek();
	if (o != (long)o) {
		errno = EOVERFLOW;
		return -1;
	}
	return p ? p(fp, (long)o, whence) : -1;
}

EXPORT int fseeko(FILE *fp, off_t off, int whence)
{
	off64_t o = off;
	KEEP_ERRNO_BEGIN;
	end_to_set(fp, &o, &whence);
	KEEP_ERRNO_END;
	int (*p)(FILE *, off_t, int) = get_fseeko();
	return p ? p(fp, (off_t)o, whence) : -1;
}

EXPORT int fseeko64(FILE *fp, off64_t off, int whence)
{
	KEEP_ERRNO_BEGIN;
	end_to_set(fp, &off, &whence);
	KEEP_ERRNO_END;
	int (*p)(FILE *, off64_t, int) = get_fseeko64();
	return p ? p(fp, off, whence) : -1;
}

static int do_fileno(int (*real)(FILE *), FILE *fp)
{
	struct kstream *k = ks_find(fp);
	if (k) {
		if (k->fd >= 0)
			return k->fd;
		errno = EBADF;
		return -1;
	}
	return real ? real(fp) : fp->_fileno;
}

EXPORT int fileno(FILE *fp) { return do_fileno(get_fileno(), fp); }
EXPORT int fileno_unlocked(FILE *fp) { return do_fileno(get_fileno_unlocked(), fp); }

/* Wide reads of the shim's streams: multibyte characters of the byte
 * stream (the locale's, as glibc converts), with the stream's own
 * conversion state. Orientation is what fwide set; byte reads leave it. */
EXPORT int fwide(FILE *fp, int mode)
{
	struct kstream *k = ks_find(fp);
	if (!k) {
		int (*p)(FILE *, int) = get_fwide();
		return p ? p(fp, mode) : 0;
	}
	flockfile(fp);
	if (mode != 0 && k->orient == 0)
		k->orient = mode > 0 ? 1 : -1;
	int r = k->orient;
	funlockfile(fp);
	return r;
}

static wint_t ks_getwc(struct kstream *k, FILE *fp)
{
	if (k->orient < 0)
		return WEOF;
	k->orient = 1;
	for (;;) {
		int c = getc_unlocked(fp);
		if (c == EOF) {
			if (!mbsinit(&k->mbs)) {
				memset(&k->mbs, 0, sizeof k->mbs);
				fp->_flags |= _IO_ERR_SEEN;
				errno = EILSEQ;
			}
			return WEOF;
		}
		char ch = (char)c;
		wchar_t wc;
		size_t r = mbrtowc(&wc, &ch, 1, &k->mbs);
		if (r == (size_t)-2)
			continue;
		if (r == (size_t)-1) {
			memset(&k->mbs, 0, sizeof k->mbs);
			fp->_flags |= _IO_ERR_SEEN;
			errno = EILSEQ;
			return WEOF;
		}
		return (wint_t)wc;
	}
}

static wint_t ks_getwc_locked(struct kstream *k, FILE *fp)
{
	flockfile(fp);
	wint_t r = ks_getwc(k, fp);
	funlockfile(fp);
	return r;
}

#define WIDE_GETC(name, locked)                                           \
	EXPORT wint_t name(FILE *fp)                                      \
	{                                                                 \
		struct kstream *k = ks_find(fp);                          \
		if (k)                                                    \
			return locked ? ks_getwc_locked(k, fp) : ks_getwc(k, fp); \
		wint_t (*p)(FILE *) = get_##name();                       \
		if (!p) {                                                 \
			errno = ENOSYS;                                   \
			return WEOF;                                      \
		}                                                         \
		return p(fp);                                             \
	}
WIDE_GETC(fgetwc, 1)
WIDE_GETC(getwc, 1)
WIDE_GETC(fgetwc_unlocked, 0)
WIDE_GETC(getwc_unlocked, 0)

/* ks_getws is glibc's fgetws: up to n-1 characters through a newline;
 * NULL at end of file with none read, or on an error in this call. */
static wchar_t *ks_getws(struct kstream *k, wchar_t *ws, int n, FILE *fp, bool locked)
{
	if (n <= 0)
		return NULL;
	if (locked)
		flockfile(fp);
	wchar_t *ret = ws;
	if (n == 1) {
		ws[0] = L'\0';
		goto out;
	}
	int old_err = fp->_flags & _IO_ERR_SEEN;
	fp->_flags &= ~_IO_ERR_SEEN;
	int i = 0;
	while (i < n - 1) {
		wint_t c = ks_getwc(k, fp);
		if (c == WEOF)
			break;
		ws[i++] = (wchar_t)c;
		if (c == L'\n')
			break;
	}
	if (i == 0 || (fp->_flags & _IO_ERR_SEEN))
		ret = NULL;
	else
		ws[i] = L'\0';
	fp->_flags |= old_err;
out:
	if (locked)
		funlockfile(fp);
	return ret;
}

EXPORT wchar_t *fgetws(wchar_t *ws, int n, FILE *fp)
{
	struct kstream *k = ks_find(fp);
	if (k)
		return ks_getws(k, ws, n, fp, true);
	wchar_t *(*p)(wchar_t *, int, FILE *) = get_fgetws();
	return p ? p(ws, n, fp) : NULL;
}

EXPORT wchar_t *fgetws_unlocked(wchar_t *ws, int n, FILE *fp)
{
	struct kstream *k = ks_find(fp);
	if (k)
		return ks_getws(k, ws, n, fp, false);
	wchar_t *(*p)(wchar_t *, int, FILE *) = get_fgetws_unlocked();
	return p ? p(ws, n, fp) : NULL;
}

EXPORT wchar_t *__fgetws_chk(wchar_t *ws, size_t size, int n, FILE *fp)
{
	wchar_t *(*p)(wchar_t *, size_t, int, FILE *) = get___fgetws_chk();
	struct kstream *k = ks_find(fp);
	if (!k || (n > 0 && (size_t)n > size)) {
		if (p)
			return p(ws, size, n, fp); /* fails the check as glibc does */
		abort();
	}
	return ks_getws(k, ws, n, fp, true);
}

EXPORT wchar_t *__fgetws_unlocked_chk(wchar_t *ws, size_t size, int n, FILE *fp)
{
	wchar_t *(*p)(wchar_t *, size_t, int, FILE *) = get___fgetws_unlocked_chk();
	struct kstream *k = ks_find(fp);
	if (!k || (n > 0 && (size_t)n > size)) {
		if (p)
			return p(ws, size, n, fp);
		abort();
	}
	return ks_getws(k, ws, n, fp, false);
}

/* ungetwc: the character's multibyte bytes pushed back (glibc's ungetc
 * takes more than one). */
EXPORT wint_t ungetwc(wint_t wc, FILE *fp)
{
	struct kstream *k = ks_find(fp);
	if (!k) {
		wint_t (*p)(wint_t, FILE *) = get_ungetwc();
		return p ? p(wc, fp) : WEOF;
	}
	if (wc == WEOF)
		return WEOF;
	flockfile(fp);
	wint_t r = wc;
	char mb[MB_LEN_MAX];
	mbstate_t s;
	memset(&s, 0, sizeof s);
	size_t n = k->orient < 0 ? (size_t)-1 : wcrtomb(mb, (wchar_t)wc, &s);
	if (n == (size_t)-1)
		r = WEOF;
	for (size_t i = n; r != WEOF && i > 0; i--)
		if (ungetc((unsigned char)mb[i - 1], fp) == EOF)
			r = WEOF;
	if (r != WEOF)
		k->orient = 1;
	funlockfile(fp);
	return r;
}

/* ---- process life ---- */

static void before_fork(void)
{
	pthread_mutex_lock(&smu);
	pthread_mutex_lock(&mu);
}
static void after_fork_parent(void)
{
	pthread_mutex_unlock(&mu);
	pthread_mutex_unlock(&smu);
}
static void after_fork_child(void)
{
	pthread_mutex_unlock(&mu);
	pthread_mutex_unlock(&smu);
	/* The child's statistics are its own; pack fds and the fd table are
	 * inherited with the descriptors they describe, so they stay valid. */
	atomic_store(&st_bypassed, 0);
	atomic_store(&st_fuse, 0);
	atomic_store(&st_mmaps, 0);
	atomic_store(&st_mmap_copied, 0);
	atomic_store(&st_mmap_mapped, 0);
	atomic_store(&st_files, 0);
	atomic_store(&st_streams, 0);
}

__attribute__((constructor)) static void preload_init(void)
{
	const char *v = getenv("KYLIX_NO_PACKS");
	disabled = v && v[0] && strcmp(v, "0") != 0;
	v = getenv("KYLIX_PRELOAD_STDIO");
	stdio_off = v && strcmp(v, "0") == 0;
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* KYLIX_PRELOAD_STATS=FILE (%p: the pid): the counters as JSON at exit. A
 * process that did nothing through the shim writes only if FILE does not
 * exist yet, so that a shell's exit does not overwrite its child's. */
__attribute__((destructor)) static void preload_fini(void)
{
	int e = errno;
	const char *path = getenv("KYLIX_PRELOAD_STATS");
	if (!path || !path[0])
		return;
	char name[4096];
	size_t j = 0;
	for (const char *c = path; *c && j < sizeof name - 24; c++) {
		if (c[0] == '%' && c[1] == 'p') {
			j += (size_t)snprintf(name + j, sizeof name - j, "%ld", (long)syscall(SYS_getpid));
			c++;
		} else {
			name[j++] = *c;
		}
	}
	name[j] = 0;
	uint64_t b = atomic_load(&st_bypassed), f = atomic_load(&st_fuse), m = atomic_load(&st_mmaps);
	uint64_t mc = atomic_load(&st_mmap_copied), mm = atomic_load(&st_mmap_mapped), nf = atomic_load(&st_files);
	uint64_t ns = atomic_load(&st_streams);
	bool idle = b == 0 && f == 0 && m == 0 && nf == 0 && ns == 0;
	char out[512];
	int n = snprintf(out, sizeof out,
	                 "{\"bypassed_bytes\": %llu, \"fuse_bytes\": %llu, \"mmaps_composed\": %llu, "
	                 "\"mmap_copied_bytes\": %llu, \"mmap_mapped_bytes\": %llu, \"kylix_files\": %llu, "
	                 "\"stdio_streams\": %llu, \"pid\": %ld}\n",
	                 (unsigned long long)b, (unsigned long long)f, (unsigned long long)m, (unsigned long long)mc,
	                 (unsigned long long)mm, (unsigned long long)nf, (unsigned long long)ns, (long)syscall(SYS_getpid));
	int fd = (int)syscall(SYS_openat, AT_FDCWD, name,
	                      O_WRONLY | O_CREAT | O_CLOEXEC | (idle ? O_EXCL : O_TRUNC), 0644);
	if (fd >= 0) {
		if (n > 0)
			(void)!syscall(SYS_write, fd, out, (size_t)n);
		syscall(SYS_close, fd);
	}
	errno = e;
}
