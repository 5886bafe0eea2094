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
 *
 * Exit status 0 when every check passed; each failure is printed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
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

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "unit"))
		unit(argv[2]);
	else if (argc == 4 && !strcmp(argv[1], "compare"))
		compare(argv[2], argv[3]);
	else {
		fprintf(stderr, "usage: %s unit DIR | compare FILE SRC\n", argv[0]);
		return 2;
	}
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
