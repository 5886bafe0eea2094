/*
 * preload_test.c - exercises every call the LD_PRELOAD shim intercepts
 * (docs/design/preload.md). Run it with the shim preloaded (plain, or the
 * ASan+UBSan build after libasan):
 *
 *   preload-test unit DIR          a file in DIR (any file system): every
 *                                  call behaves as without the shim
 *                                  (bytes, offsets, errno, dup, fork)
 *   preload-test compare FILE SRC  FILE (in a Kylix mount) reads equal to
 *                                  SRC by every call: read, pread, readv,
 *                                  preadv, preadv2, mmap at several
 *                                  offsets, 8 threads, a forked child
 *   preload-test stdio FILE SRC K  every stdio read call on FILE compared
 *                                  with glibc's stream on SRC (fopen,
 *                                  fopen64+setvbuf, fdopen, freopen, fork,
 *                                  read() on fileno(), 8 threads); K: served (FILE's
 *                                  stream must be the shim's), plain, any
 *   preload-test stdio-wide FILE SRC K   fgetwc, fgetws, ungetwc, fwide
 *   preload-test stdio-rewrite FILE a stream reads on after FILE is
 *                                  rewritten; what it read to stdout
 *   preload-test stdio-unit DIR    stdio on files in DIR (glibc's streams)
 *
 * Exit status 0 when every check passed; each failure is printed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wchar.h>

static int failures;
#define CHECK(c, ...)                                                 \
	do {                                                          \
		if (!(c)) {                                           \
			failures++;                                   \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                 \
			fputc('\n', stderr);                          \
		}                                                     \
	} while (0)

static unsigned char *slurp(const char *path, size_t *n)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return NULL;
	struct stat st;
	fstat(fd, &st);
	unsigned char *b = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (b && got < (size_t)st.st_size) {
		ssize_t r = pread(fd, b + got, (size_t)st.st_size - got, (off_t)got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	*n = got;
	return b;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

struct ctx {
	const char *path;
	const unsigned char *want;
	size_t n;
	unsigned seed;
	int bad;
};

static void *reader(void *arg)
{
	struct ctx *c = arg;
	int fd = open(c->path, O_RDONLY);
	if (fd < 0) {
		c->bad++;
		return NULL;
	}
	unsigned s = c->seed;
	unsigned char *buf = malloc(1 << 20);
	for (int i = 0; i < 200 && buf; i++) {
		s = s * 1103515245u + 12345u;
		size_t off = c->n ? (size_t)s % c->n : 0;
		size_t len = 1 + (size_t)(s >> 8) % (1 << 20);
		ssize_t r = pread(fd, buf, len, (off_t)off);
		size_t want = off + len > c->n ? c->n - off : len;
		if (r != (ssize_t)want || memcmp(buf, c->want + off, want) != 0)
			c->bad++;
	}
	free(buf);
	close(fd);
	return NULL;
}

static void compare(const char *path, const char *src)
{
	size_t n;
	unsigned char *want = slurp(src, &n);
	CHECK(want, "read %s", src);
	if (!want)
		return;
	unsigned char *got = malloc(n + 1);
	/* read() in odd pieces, offset advanced. */
	int fd = open(path, O_RDONLY);
	CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	size_t at = 0;
	for (;;) {
		size_t want_n = 1 + next() % 300000;
		ssize_t r = read(fd, got + at, at + want_n > n ? n - at + 1 : want_n);
		if (r <= 0) {
			CHECK(r == 0, "read: %s", strerror(errno));
			break;
		}
		at += (size_t)r;
		CHECK(lseek(fd, 0, SEEK_CUR) == (off_t)at, "offset %jd after read, want %zu", (intmax_t)lseek(fd, 0, SEEK_CUR), at);
	}
	CHECK(at == n && memcmp(got, want, n) == 0, "read(): %zu bytes, want %zu, equal %d", at, n, at == n && !memcmp(got, want, n));
	/* pread at random offsets. */
	for (int i = 0; i < 100 && n; i++) {
		size_t off = next() % n, len = 1 + next() % (n - off);
		ssize_t r = pread(fd, got, len, (off_t)off);
		CHECK(r == (ssize_t)len && memcmp(got, want + off, len) == 0, "pread %zu at %zu: %zd", len, off, r);
	}
	CHECK(pread(fd, got, 10, (off_t)n) == 0, "pread at EOF");
	/* readv / preadv / preadv2 with three buffers. */
	lseek(fd, 0, SEEK_SET);
	memset(got, 0, n);
	size_t a = n / 3, b = n / 3;
	struct iovec iov[3] = {{got, a}, {got + a, b}, {got + a + b, n - a - b + 1}};
	ssize_t r = readv(fd, iov, 3);
	CHECK(r == (ssize_t)n && memcmp(got, want, n) == 0, "readv: %zd", r);
	CHECK(lseek(fd, 0, SEEK_CUR) == (off_t)n, "offset after readv");
	if (n > 100) {
		memset(got, 0, n);
		struct iovec iv[2] = {{got, 10}, {got + 10, 50}};
		r = preadv(fd, iv, 2, 40);
		CHECK(r == 60 && memcmp(got, want + 40, 60) == 0, "preadv: %zd", r);
		lseek(fd, 30, SEEK_SET);
		r = preadv2(fd, iv, 2, -1, 0);
		CHECK(r == 60 && memcmp(got, want + 30, 60) == 0 && lseek(fd, 0, SEEK_CUR) == 90, "preadv2(-1): %zd", r);
	}
	/* mmap of the whole file and of page-aligned windows. */
	if (n > 0) {
		void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
		CHECK(m != MAP_FAILED && memcmp(m, want, n) == 0, "mmap whole");
		if (m != MAP_FAILED)
			munmap(m, n);
		m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
		CHECK(m != MAP_FAILED && memcmp(m, want, n) == 0, "mmap shared whole");
		if (m != MAP_FAILED)
			munmap(m, n);
		for (int i = 0; i < 20; i++) {
			size_t pages = (n + 4095) / 4096;
			size_t p = next() % pages, len = 1 + next() % (n - p * 4096);
			m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)(p * 4096));
			CHECK(m != MAP_FAILED && memcmp(m, want + p * 4096, len) == 0, "mmap %zu at page %zu", len, p);
			if (m != MAP_FAILED) {
				((unsigned char *)m)[0] ^= 1; /* private: writable, never written back */
				munmap(m, len);
			}
		}
	}
	/* dup and dup2: same offset, same bytes. */
	lseek(fd, 5, SEEK_SET);
	int d = dup(fd);
	r = read(d, got, 7);
	CHECK(r == (ssize_t)(n > 12 ? 7 : (n > 5 ? n - 5 : 0)) && (r <= 0 || memcmp(got, want + 5, (size_t)r) == 0), "read of dup");
	CHECK(dup2(fd, 100) == 100, "dup2");
	CHECK(pread(100, got, n, 0) == (ssize_t)n && memcmp(got, want, n) == 0, "pread of dup2");
	close(100);
	close(d);
	/* threads */
	pthread_t th[8];
	struct ctx cs[8];
	for (int i = 0; i < 8; i++) {
		cs[i] = (struct ctx){path, want, n, (unsigned)i * 7919u + 1, 0};
		pthread_create(&th[i], NULL, reader, &cs[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		CHECK(cs[i].bad == 0, "thread %d: %d bad reads", i, cs[i].bad);
	}
	/* fork: the child reads the inherited fd and a new one. */
	pid_t pid = fork();
	if (pid == 0) {
		unsigned char *g2 = malloc(n + 1);
		int ok = pread(fd, g2, n, 0) == (ssize_t)n && memcmp(g2, want, n) == 0;
		int f2 = open(path, O_RDONLY);
		ok = ok && read(f2, g2, n + 1) == (ssize_t)n && memcmp(g2, want, n) == 0;
		_exit(ok ? 0 : 1);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child");
	close(fd);
	free(got);
	free(want);
}

static void unit(const char *dir)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/preload-unit.bin", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0, "create %s", path);
	unsigned char buf[10000];
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (unsigned char)(i * 7);
	CHECK(write(fd, buf, sizeof buf) == (ssize_t)sizeof buf, "write");
	close(fd);
	/* errno is the real call's. */
	errno = 0;
	CHECK(read(-1, buf, 1) == -1 && errno == EBADF, "read(-1): errno %d", errno);
	errno = 0;
	CHECK(pread(12345, buf, 1, 0) == -1 && errno == EBADF, "pread(closed)");
	errno = 0;
	CHECK(close(12345) == -1 && errno == EBADF, "close(closed)");
	errno = ENOENT;
	int p[2];
	CHECK(pipe(p) == 0, "pipe");
	CHECK(write(p[1], "ab", 2) == 2 && read(p[0], buf, 2) == 2 && errno == ENOENT, "pipe read keeps errno");
	close(p[0]);
	close(p[1]);
	/* A file written through one fd and read through another. */
	fd = open(path, O_RDWR);
	CHECK(pwrite(fd, "XYZ", 3, 100) == 3, "pwrite");
	unsigned char g[16];
	CHECK(pread(fd, g, 3, 100) == 3 && memcmp(g, "XYZ", 3) == 0, "read back a write");
	CHECK(fcntl(fd, F_DUPFD_CLOEXEC, 200) >= 200, "F_DUPFD_CLOEXEC");
	close_range(200, 300, 0);
	CHECK(fcntl(200, F_GETFD) == -1 && errno == EBADF, "close_range");
	close(fd);
	compare(path, path);
	unlink(path);
}

/* ---- stdio (docs/design/preload.md, "stdio") ----
 *
 * Differential: every operation is applied to a stream on FILE (under
 * the shim: the shim's stream where it serves FILE) and one on SRC (a
 * plain glibc stream: SRC is outside any mount), and every result must
 * be equal: return values, bytes, feof/ferror, ftello; and read() on
 * the shim's stream's fileno() between stdio calls (switching handles
 * as POSIX says) reads SRC's bytes at the stream's position. "served" asserts FILE's stream is the
 * shim's (a cookie stream: _fileno -2), "plain" that it is glibc's. */

/* glibc's _FORTIFY_SOURCE entry points (what fread, fread_unlocked and
 * fgets become in fortified programs), declared here: the test is built
 * without _FORTIFY_SOURCE. */
extern size_t __fread_chk(void *, size_t, size_t, size_t, FILE *);
extern size_t __fread_unlocked_chk(void *, size_t, size_t, size_t, FILE *);
extern char *__fgets_chk(char *, size_t, int, FILE *);

struct two {
	FILE *f[2];
	size_t n; /* SRC's size */
	unsigned char *want; /* SRC's bytes */
	int fdops; /* fflush, then lseek and read() on fileno() between calls */
	char *vb[2];
};

static int stdio_fail_cap(void) { return failures > 30; }

static void same_state(struct two *t, const char *op)
{
	CHECK(feof(t->f[0]) == feof(t->f[1]), "%s: feof %d vs %d", op, feof(t->f[0]), feof(t->f[1]));
	CHECK(ferror(t->f[0]) == ferror(t->f[1]), "%s: ferror %d vs %d", op, ferror(t->f[0]), ferror(t->f[1]));
	CHECK(ftello(t->f[0]) == ftello(t->f[1]), "%s: ftello %jd vs %jd", op, (intmax_t)ftello(t->f[0]),
	      (intmax_t)ftello(t->f[1]));
}

static void one_op(struct two *t, unsigned char *b0, unsigned char *b1, size_t cap)
{
	unsigned op = (unsigned)(next() % 17);
	size_t len = next() % 4 == 0 ? 1 + next() % cap : 1 + next() % 20000;
	if (len > cap)
		len = cap;
	long r0 = 0, r1 = 0;
	char name[64];
	snprintf(name, sizeof name, "op %u len %zu", op, len);
	switch (op) {
	case 0:
	case 1: {
		size_t sz = 1 + next() % 8;
		r0 = (long)fread(b0, sz, len / sz, t->f[0]);
		r1 = (long)fread(b1, sz, len / sz, t->f[1]);
		CHECK(r0 == r1 && !memcmp(b0, b1, (size_t)r0 * sz), "%s: fread %ld vs %ld", name, r0, r1);
		break;
	}
	case 2: {
		off_t off = (off_t)(next() % (t->n + 20000)); /* past the end too */
		int wh = (int)(next() % 3);
		off_t o = wh == SEEK_SET ? off : wh == SEEK_CUR ? off - (off_t)(t->n / 2) : -(off_t)(next() % (t->n + 100));
		r0 = fseeko(t->f[0], o, wh);
		r1 = fseeko(t->f[1], o, wh);
		CHECK(r0 == r1, "%s: fseeko(%jd, %d) %ld vs %ld", name, (intmax_t)o, wh, r0, r1);
		break;
	}
	case 3:
		r0 = fgetc(t->f[0]), r1 = fgetc(t->f[1]);
		CHECK(r0 == r1, "%s: fgetc %ld vs %ld", name, r0, r1);
		r0 = getc(t->f[0]), r1 = getc(t->f[1]);
		CHECK(r0 == r1, "%s: getc %ld vs %ld", name, r0, r1);
		r0 = getc_unlocked(t->f[0]), r1 = getc_unlocked(t->f[1]);
		CHECK(r0 == r1, "%s: getc_unlocked %ld vs %ld", name, r0, r1);
		break;
	case 4: {
		int c = (int)(next() % 256);
		r0 = ungetc(c, t->f[0]), r1 = ungetc(c, t->f[1]);
		CHECK(r0 == r1, "%s: ungetc %ld vs %ld", name, r0, r1);
		r0 = fgetc(t->f[0]), r1 = fgetc(t->f[1]);
		CHECK(r0 == r1, "%s: fgetc after ungetc %ld vs %ld", name, r0, r1);
		break;
	}
	case 5: {
		char *l0 = NULL, *l1 = NULL;
		size_t c0 = 0, c1 = 0;
		int delim = next() % 2 ? '\n' : (int)(next() % 256);
		r0 = (long)getdelim(&l0, &c0, delim, t->f[0]);
		r1 = (long)getdelim(&l1, &c1, delim, t->f[1]);
		CHECK(r0 == r1 && (r0 <= 0 || !memcmp(l0, l1, (size_t)r0)), "%s: getdelim(%d) %ld vs %ld", name, delim, r0, r1);
		free(l0);
		free(l1);
		l0 = l1 = NULL;
		r0 = (long)getline(&l0, &c0, t->f[0]);
		r1 = (long)getline(&l1, &c1, t->f[1]);
		CHECK(r0 == r1 && (r0 <= 0 || !memcmp(l0, l1, (size_t)r0)), "%s: getline %ld vs %ld", name, r0, r1);
		free(l0);
		free(l1);
		break;
	}
	case 6: {
		int sz = (int)(1 + next() % 300);
		char *s0 = fgets((char *)b0, sz, t->f[0]), *s1 = fgets((char *)b1, sz, t->f[1]);
		CHECK(!s0 == !s1 && (!s0 || !memcmp(b0, b1, strlen((char *)b1) + 1)), "%s: fgets", name);
		break;
	}
	case 7:
		if (t->fdops && t->f[0]->_fileno == -2) {
			/* The shim's stream and read() on its fileno(), switching
			 * handles as POSIX says: after fseeko(0, SEEK_CUR) the
			 * descriptor is at the stream's position (fflush is not
			 * enough after ungetc: glibc's sync leaves the main buffer
			 * then, on every stream); read() takes the bytes there
			 * and the stream goes on after them. (glibc's own stream
			 * may keep its descriptor elsewhere, its offset cached:
			 * the other stream is moved by fseeko instead.) */
			fseeko(t->f[0], 0, SEEK_CUR);
			off_t pos = ftello(t->f[0]);
			CHECK(lseek(fileno(t->f[0]), 0, SEEK_CUR) == pos, "%s: descriptor at %jd after fseeko, stream at %jd",
			      name, (intmax_t)lseek(fileno(t->f[0]), 0, SEEK_CUR), (intmax_t)pos);
			r0 = read(fileno(t->f[0]), b0, len);
			size_t want = pos >= (off_t)t->n ? 0 : t->n - (size_t)pos < len ? t->n - (size_t)pos : len;
			CHECK(r0 == (long)want && !memcmp(b0, t->want + pos, want), "%s: read(fileno) at %jd: %ld, want %zu",
			      name, (intmax_t)pos, r0, want);
			if (r0 > 0)
				pos += r0;
			CHECK(ftello(t->f[0]) == pos, "%s: stream at %jd after read(fileno), want %jd", name,
			      (intmax_t)ftello(t->f[0]), (intmax_t)pos);
			fseeko(t->f[1], pos, SEEK_SET);
			clearerr(t->f[0]);
			clearerr(t->f[1]);
		}
		break;
	case 8: {
		fpos_t p0, p1;
		r0 = fgetpos(t->f[0], &p0), r1 = fgetpos(t->f[1], &p1);
		CHECK(r0 == r1, "%s: fgetpos", name);
		size_t k0 = fread(b0, 1, len % 5000, t->f[0]), k1 = fread(b1, 1, len % 5000, t->f[1]);
		CHECK(k0 == k1 && !memcmp(b0, b1, k0), "%s: fread after fgetpos", name);
		if (r0 == 0 && r1 == 0) {
			r0 = fsetpos(t->f[0], &p0), r1 = fsetpos(t->f[1], &p1);
			CHECK(r0 == r1, "%s: fsetpos", name);
		}
		break;
	}
	case 9:
		if (next() % 4 == 0) {
			rewind(t->f[0]);
			rewind(t->f[1]);
		} else {
			clearerr(t->f[0]);
			clearerr(t->f[1]);
		}
		break;
	case 10:
		r0 = (long)fread_unlocked(b0, 1, len, t->f[0]);
		r1 = (long)fread_unlocked(b1, 1, len, t->f[1]);
		CHECK(r0 == r1 && !memcmp(b0, b1, (size_t)r0), "%s: fread_unlocked %ld vs %ld", name, r0, r1);
		break;
	case 11: {
		char w0[32] = "", w1[32] = "";
		r0 = fscanf(t->f[0], "%31s", w0), r1 = fscanf(t->f[1], "%31s", w1);
		CHECK(r0 == r1 && !strcmp(w0, w1), "%s: fscanf %ld vs %ld", name, r0, r1);
		break;
	}
	case 12:
		r0 = fseek(t->f[0], 0, SEEK_END), r1 = fseek(t->f[1], 0, SEEK_END);
		CHECK(r0 == r1 && ftell(t->f[0]) == (long)t->n, "%s: fseek(END) %ld vs %ld, ftell %ld", name, r0, r1,
		      ftell(t->f[0]));
		r0 = fseek(t->f[0], -(long)(next() % (t->n + 1)), SEEK_END), r1 = fseek(t->f[1], ftell(t->f[0]) - (long)t->n, SEEK_END);
		break;
	case 13:
		r0 = (long)__fread_chk(b0, cap, 1, len, t->f[0]);
		r1 = (long)__fread_chk(b1, cap, 1, len, t->f[1]);
		CHECK(r0 == r1 && !memcmp(b0, b1, (size_t)r0), "%s: __fread_chk %ld vs %ld", name, r0, r1);
		r0 = (long)__fread_unlocked_chk(b0, cap, 1, len % 3000, t->f[0]);
		r1 = (long)__fread_unlocked_chk(b1, cap, 1, len % 3000, t->f[1]);
		CHECK(r0 == r1 && !memcmp(b0, b1, (size_t)r0), "%s: __fread_unlocked_chk %ld vs %ld", name, r0, r1);
		break;
	case 14: {
		int sz = (int)(1 + next() % 300);
		char *s0 = __fgets_chk((char *)b0, cap, sz, t->f[0]), *s1 = __fgets_chk((char *)b1, cap, sz, t->f[1]);
		CHECK(!s0 == !s1 && (!s0 || !memcmp(b0, b1, strlen((char *)b1) + 1)), "%s: __fgets_chk", name);
		break;
	}
	default: {
		size_t k = len > 64 ? 64 : len;
		r0 = (long)fread(b0, 1, k, t->f[0]);
		r1 = (long)fread(b1, 1, k, t->f[1]);
		CHECK(r0 == r1 && !memcmp(b0, b1, (size_t)r0), "%s: small fread %ld vs %ld", name, r0, r1);
		break;
	}
	}
	same_state(t, name);
}

static void ops(struct two *t, int count)
{
	size_t cap = 300000;
	unsigned char *b0 = malloc(cap), *b1 = malloc(cap);
	for (int i = 0; i < count && !stdio_fail_cap(); i++)
		one_op(t, b0, b1, cap);
	free(b0);
	free(b1);
}

static void check_kind(FILE *f, const char *kind, const char *what)
{
	if (!strcmp(kind, "served"))
		CHECK(f && f->_fileno == -2, "%s: not the shim's stream (_fileno %d)", what, f ? f->_fileno : 0);
	else if (!strcmp(kind, "plain"))
		CHECK(f && f->_fileno >= 0, "%s: not glibc's own stream (_fileno %d)", what, f ? f->_fileno : 0);
	if (f)
		CHECK(fileno(f) >= 0, "%s: fileno %d", what, fileno(f));
}

static void two_close(struct two *t)
{
	for (int i = 0; i < 2; i++) {
		CHECK(fclose(t->f[i]) == 0, "fclose");
		free(t->vb[i]);
		t->vb[i] = NULL;
	}
}

struct sctx {
	const char *path;
	const unsigned char *want;
	size_t n;
	unsigned seed;
	int bad;
};

/* stdio_reader: a thread's own stream on the file: fread in odd pieces
 * to the end, then fseeko+fread at random offsets, against the bytes. */
static void *stdio_reader(void *arg)
{
	struct sctx *c = arg;
	FILE *f = fopen(c->path, "r");
	if (!f) {
		c->bad++;
		return NULL;
	}
	unsigned s = c->seed;
	unsigned char *b = malloc(200000);
	size_t at = 0;
	while (b) {
		s = s * 1103515245u + 12345u;
		size_t k = fread(b, 1, 1 + (s >> 8) % 200000, f);
		if (k == 0 || memcmp(b, c->want + at, k) != 0)
			break;
		at += k;
	}
	if (at != c->n || !feof(f))
		c->bad++;
	for (int i = 0; i < 50 && b && c->n; i++) {
		s = s * 1103515245u + 12345u;
		size_t off = (size_t)s % c->n, len = 1 + (s >> 8) % 100000;
		size_t want = off + len > c->n ? c->n - off : len;
		if (fseeko(f, (off_t)off, SEEK_SET) != 0 || fread(b, 1, len, f) != want || memcmp(b, c->want + off, want) != 0)
			c->bad++;
	}
	free(b);
	fclose(f);
	return NULL;
}

static void stdio_compare(const char *path, const char *src, const char *kind)
{
	struct stat st;
	CHECK(stat(src, &st) == 0, "stat %s", src);
	struct two t = {.n = (size_t)st.st_size};
	t.want = slurp(src, &t.n);
	CHECK(t.want, "read %s", src);
	if (!t.want)
		return;
	/* 1. fopen, default buffers, stdio calls only. */
	t.f[0] = fopen(path, "r");
	t.f[1] = fopen(src, "r");
	CHECK(t.f[0] && t.f[1], "fopen: %s", strerror(errno));
	if (!t.f[0] || !t.f[1])
		return;
	check_kind(t.f[0], kind, "fopen");
	CHECK(fcntl(fileno(t.f[0]), F_GETFD) == 0, "no 'e': the descriptor is inherited across exec");
	ops(&t, 1500);
	two_close(&t);
	/* The descriptor number is the one glibc's fopen takes (the lowest
	 * free). */
	int probe = dup(0);
	close(probe);
	FILE *pf = fopen(path, "r");
	CHECK(pf && fileno(pf) == probe, "fopen's descriptor %d, want the lowest free %d", pf ? fileno(pf) : -1, probe);
	if (pf)
		fclose(pf);
	/* 2. fopen64 "rbe" + setvbuf with equal 8 KiB buffers (sha256sum's
	 * pattern): the descriptor is shared with read(), lseek. */
	t.f[0] = fopen64(path, "rbe");
	t.f[1] = fopen64(src, "rbe");
	CHECK(t.f[0] && t.f[1], "fopen64: %s", strerror(errno));
	if (!t.f[0] || !t.f[1])
		return;
	check_kind(t.f[0], kind, "fopen64");
	CHECK(fcntl(fileno(t.f[0]), F_GETFD) == FD_CLOEXEC, "'e': close-on-exec");
	t.fdops = 1;
	for (int i = 0; i < 2; i++) {
		t.vb[i] = malloc(8192);
		CHECK(setvbuf(t.f[i], t.vb[i], _IOFBF, 8192) == 0, "setvbuf");
	}
	posix_fadvise(fileno(t.f[0]), 0, 0, POSIX_FADV_SEQUENTIAL);
	ops(&t, 1500);
	/* fork: the child goes on with both streams (the descriptors' offsets
	 * are shared with the parent, as with any FILE), then the parent,
	 * after the fseek to its position that POSIX asks of a handle that
	 * becomes active again (glibc's stream would trust its cached
	 * offset, the shim's asks the descriptor the child moved). */
	fflush(stdout);
	fflush(stderr);
	off_t at_fork = ftello(t.f[0]);
	CHECK(at_fork == ftello(t.f[1]), "ftello at fork");
	pid_t pid = fork();
	if (pid == 0) {
		ops(&t, 300);
		_exit(failures ? 1 : 0);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child's stdio");
	CHECK(fseeko(t.f[0], at_fork, SEEK_SET) == 0 && fseeko(t.f[1], at_fork, SEEK_SET) == 0, "fseeko after the child");
	ops(&t, 300);
	/* freopen: the same file again by name and by NULL. */
	t.f[0] = freopen(path, "r", t.f[0]);
	t.f[1] = freopen(src, "r", t.f[1]);
	CHECK(t.f[0] && t.f[1], "freopen: %s", strerror(errno));
	if (!t.f[0] || !t.f[1])
		return;
	check_kind(t.f[0], kind, "freopen");
	ops(&t, 300);
	t.f[0] = freopen(NULL, "rb", t.f[0]);
	t.f[1] = freopen(NULL, "rb", t.f[1]);
	CHECK(t.f[0] && t.f[1], "freopen(NULL): %s", strerror(errno));
	if (!t.f[0] || !t.f[1])
		return;
	ops(&t, 300);
	two_close(&t);
	/* 3. fdopen of open() (numpy.fromfile's way: a dup'ed fd). */
	int fd0 = open(path, O_RDONLY), fd1 = open(src, O_RDONLY);
	int d0 = dup(fd0), d1 = dup(fd1);
	t.f[0] = fdopen(d0, "rb");
	t.f[1] = fdopen(d1, "rb");
	CHECK(t.f[0] && t.f[1], "fdopen: %s", strerror(errno));
	if (!t.f[0] || !t.f[1])
		return;
	check_kind(t.f[0], kind, "fdopen");
	CHECK(fileno(t.f[0]) == d0, "fdopen: fileno %d, want %d", fileno(t.f[0]), d0);
	ops(&t, 1000);
	two_close(&t);
	CHECK(fcntl(d0, F_GETFD) == -1 && errno == EBADF, "fclose closed the fdopen'ed descriptor");
	close(fd0);
	close(fd1);
	/* 8 threads, a stream each. */
	pthread_t th[8];
	struct sctx cs[8];
	for (int i = 0; i < 8; i++) {
		cs[i] = (struct sctx){path, t.want, t.n, (unsigned)i * 7919u + 3, 0};
		pthread_create(&th[i], NULL, stdio_reader, &cs[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		CHECK(cs[i].bad == 0, "stdio thread %d: %d bad reads", i, cs[i].bad);
	}
	/* Streams opened for writing are glibc's. */
	if (!strcmp(kind, "served")) {
		FILE *w = fopen(path, "r+");
		CHECK(!w || w->_fileno >= 0, "r+ stream is glibc's");
		if (w)
			fclose(w);
		FILE *r = fopen(path, "r");
		errno = 0;
		CHECK(r && freopen(path, "r+", r) == NULL && errno == EINVAL, "freopen of a served stream for writing: EINVAL");
	}
	free(t.want);
}

/* stdio_wide: fgetwc, getwc, fgetws, ungetwc, fwide on FILE and SRC
 * (UTF-8 text), compared as above. */
static void stdio_wide(const char *path, const char *src, const char *kind)
{
	if (!setlocale(LC_ALL, "C.UTF-8")) {
		CHECK(0, "no C.UTF-8 locale");
		return;
	}
	FILE *f[2] = {fopen(path, "r"), fopen(src, "r")};
	CHECK(f[0] && f[1], "fopen");
	if (!f[0] || !f[1])
		return;
	check_kind(f[0], kind, "wide fopen");
	CHECK(fwide(f[0], 0) == fwide(f[1], 0), "fwide(0) before");
	const wchar_t back[] = L"a\u00e9\u20ac\U0001F600";
	for (int i = 0; i < 3000 && !stdio_fail_cap(); i++) {
		unsigned op = (unsigned)(next() % 5);
		wint_t c0, c1;
		switch (op) {
		case 0:
			c0 = fgetwc(f[0]), c1 = fgetwc(f[1]);
			CHECK(c0 == c1, "fgetwc %u vs %u", (unsigned)c0, (unsigned)c1);
			break;
		case 1:
			c0 = getwc(f[0]), c1 = getwc(f[1]);
			CHECK(c0 == c1, "getwc %u vs %u", (unsigned)c0, (unsigned)c1);
			break;
		case 2: {
			wchar_t w0[64], w1[64];
			int sz = (int)(1 + next() % 64);
			wchar_t *s0 = fgetws(w0, sz, f[0]), *s1 = fgetws(w1, sz, f[1]);
			CHECK(!s0 == !s1 && (!s0 || !wcscmp(w0, w1)), "fgetws(%d)", sz);
			break;
		}
		case 3: {
			wchar_t w = back[next() % 4];
			c0 = ungetwc((wint_t)w, f[0]), c1 = ungetwc((wint_t)w, f[1]);
			CHECK(c0 == c1, "ungetwc");
			c0 = fgetwc(f[0]), c1 = fgetwc(f[1]);
			CHECK(c0 == c1 && c0 == (wint_t)w, "fgetwc after ungetwc %u vs %u", (unsigned)c0, (unsigned)c1);
			break;
		}
		default:
			if (next() % 8 == 0) {
				rewind(f[0]);
				rewind(f[1]);
			}
			break;
		}
		CHECK(feof(f[0]) == feof(f[1]) && ferror(f[0]) == ferror(f[1]), "wide op %u: feof/ferror", op);
		CHECK(fwide(f[0], 0) == fwide(f[1], 0), "wide op %u: fwide %d vs %d", op, fwide(f[0], 0), fwide(f[1], 0));
	}
	fclose(f[0]);
	fclose(f[1]);
	setlocale(LC_ALL, "C");
}

/* stdio_rewrite: a stream reads 5000 bytes of FILE, FILE is rewritten
 * (O_TRUNC, other bytes, through the same path), the stream reads on;
 * everything read goes to stdout (the test compares it with and without
 * the shim). */
static void stdio_rewrite(const char *path)
{
	FILE *f = fopen(path, "r");
	CHECK(f, "fopen %s: %s", path, strerror(errno));
	if (!f)
		return;
	unsigned char *b = malloc(1 << 20);
	size_t k = fread(b, 1, 5000, f);
	fwrite(b, 1, k, stdout);
	int w = open(path, O_WRONLY | O_TRUNC);
	CHECK(w >= 0, "open for rewrite: %s", strerror(errno));
	for (int i = 0; i < 64 && w >= 0; i++) {
		memset(b, 'A' + i % 26, 4096);
		CHECK(write(w, b, 4096) == 4096, "rewrite");
	}
	if (w >= 0)
		close(w);
	while ((k = fread(b, 1, 1 << 20, f)) > 0)
		fwrite(b, 1, k, stdout);
	CHECK(!ferror(f), "stream error after the rewrite: %s", strerror(errno));
	fclose(f);
	free(b);
}

static void stdio_unit(const char *dir)
{
	char path[4096], wpath[4096];
	snprintf(path, sizeof path, "%s/preload-stdio.bin", dir);
	snprintf(wpath, sizeof wpath, "%s/preload-stdio.txt", dir);
	FILE *f = fopen(path, "w");
	CHECK(f && f->_fileno >= 0, "fopen w: glibc's stream");
	for (int i = 0; f && i < 40000; i++)
		fprintf(f, "%d line %x\n", i, i * 77);
	CHECK(f && fclose(f) == 0, "write");
	f = fopen(wpath, "w");
	for (int i = 0; f && i < 500; i++)
		fputs("h\u00e9llo w\u00f6rld \u20ac \U0001F600\n", f);
	CHECK(f && fclose(f) == 0, "write wide");
	/* A file outside a mount: glibc's streams on both sides. */
	stdio_compare(path, path, "plain");
	stdio_wide(wpath, wpath, "plain");
	errno = 0;
	CHECK(fopen("/nonexistent/x", "r") == NULL && errno == ENOENT, "fopen ENOENT");
	CHECK(fdopen(-1, "r") == NULL && errno == EBADF, "fdopen(-1) EBADF");
	unlink(path);
	unlink(wpath);
}

int main(int argc, char **argv)
{
	/* PRELOAD_TEST_SEED: another sequence of random calls (the stdio
	 * comparisons, the offsets of compare). */
	const char *seed = getenv("PRELOAD_TEST_SEED");
	if (seed && strtoull(seed, NULL, 10))
		rng = strtoull(seed, NULL, 10);
	if (argc == 3 && !strcmp(argv[1], "unit"))
		unit(argv[2]);
	else if (argc == 4 && !strcmp(argv[1], "compare"))
		compare(argv[2], argv[3]);
	else if (argc == 3 && !strcmp(argv[1], "stdio-unit"))
		stdio_unit(argv[2]);
	else if (argc == 5 && !strcmp(argv[1], "stdio"))
		stdio_compare(argv[2], argv[3], argv[4]);
	else if (argc == 5 && !strcmp(argv[1], "stdio-wide"))
		stdio_wide(argv[2], argv[3], argv[4]);
	else if (argc == 3 && !strcmp(argv[1], "stdio-rewrite"))
		stdio_rewrite(argv[2]);
	else {
		fprintf(stderr, "usage: %s unit DIR | compare FILE SRC | stdio-unit DIR | stdio FILE SRC served|plain|any |\n"
		        "  stdio-wide FILE SRC served|plain|any | stdio-rewrite FILE\n", argv[0]);
		return 2;
	}
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
