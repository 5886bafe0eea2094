/*
 * ctest.c - libkylix's C tests. One binary, linked with the library's
 * objects (so it can reach the hidden kx_test_ hook), built twice by the
 * Makefile: plain and with ASan+UBSan. tests/run.sh drives it:
 *
 *   ctest unit                 parser cases, fake-node pack/fill/fork/threads,
 *                              tar scanner cases
 *   ctest fuzz N [FILE...]     N random mutations of valid headers
 *   ctest tarfuzz N            N random tar windows for kylix_tar_scan
 *   ctest dump FILE            print a file's parsed header (run.sh compares
 *                              it with Python's json parse)
 *   ctest mount [--pack F]... SRC DST...
 *                              read each DST (in a live mount) through
 *                              libkylix and compare with SRC; threads; fork.
 *                              Files named with --pack must come from packs
 *                              when the node has a client socket.
 *
 * Exit status 0 when every check passed; each failure prints a line.
 */
#include "../kylix.h"
#include "../src/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                         \
			fprintf(stderr, "\n");                                \
			failures++;                                           \
		}                                                             \
	} while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	/* xorshift64*: deterministic, so a failure reproduces. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static unsigned char *read_file(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return NULL;
	struct stat st;
	fstat(fd, &st);
	unsigned char *b = malloc((size_t)st.st_size + 1);
	size_t done = 0;
	while (b && done < (size_t)st.st_size) {
		ssize_t r = pread(fd, b + done, (size_t)st.st_size - done, (off_t)done);
		if (r <= 0)
			break;
		done += (size_t)r;
	}
	close(fd);
	*len = done;
	return b;
}

static int write_file(const char *path, const void *b, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -1;
	ssize_t w = write(fd, b, n);
	close(fd);
	return w == (ssize_t)n ? 0 : -1;
}

/* hdr builds "8-byte length + json" followed by data_len zero bytes. */
static unsigned char *hdr(const char *json, size_t data_len, size_t *len)
{
	size_t n = strlen(json);
	*len = 8 + n + data_len;
	unsigned char *b = calloc(1, *len);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)n >> (8 * i));
	memcpy(b + 8, json, n);
	return b;
}

static int parse_json(const char *json, size_t data_len, kylix_header **h)
{
	size_t len;
	unsigned char *b = hdr(json, data_len, &len);
	int r = kylix_parse_header(b, len, len, h);
	free(b);
	return r;
}

/* ---- parser ---- */

static void test_parser(void)
{
	kylix_header *h = NULL;
	int r = parse_json("{\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9\":\"v\\n\"},"
	                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24],\"x\":[{}]},"
	                   "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
	                   "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}   ",
	                   32, &h);
	CHECK(r == 0, "valid header: %d %s", r, kylix_last_error());
	if (r == 0) {
		CHECK(h->n_tensors == 3, "%llu tensors", (unsigned long long)h->n_tensors);
		CHECK(strcmp(h->tensors[0].name, "a") == 0 && strcmp(h->tensors[1].name, "b") == 0,
		      "sorted by offset");
		CHECK(strcmp(h->tensors[1].dtype, "F32") == 0 && h->tensors[1].ndim == 2 &&
		      h->tensors[1].shape[1] == 2 && h->tensors[1].nbytes == 16, "tensor b");
		CHECK(h->tensors[1].offset == h->data_start + 8, "absolute offset");
		CHECK(h->tensors[2].ndim == 0 && h->tensors[2].nbytes == 8, "scalar");
		CHECK(h->n_metadata == 2 && strcmp(h->metadata[1].key, "k\xc3\xa9") == 0 &&
		      strcmp(h->metadata[1].value, "v\n") == 0, "metadata");
		kylix_free_header(h);
	}
	/* Surrogate pairs decode; an empty header object is valid. */
	r = parse_json("{\"\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &h);
	CHECK(r == 0 && strcmp(h->tensors[0].name, "\xf0\x9f\x98\x80") == 0, "surrogate pair: %d", r);
	kylix_free_header(r == 0 ? h : NULL);
	r = parse_json("{}", 0, &h);
	CHECK(r == 0 && h->n_tensors == 0, "empty object: %d", r);
	kylix_free_header(r == 0 ? h : NULL);

	static const char *const bad[] = {
		"",                                  /* length 0 */
		" {}",                               /* must start with { */
		"{",                                 /* truncated */
		"{}x",                               /* trailing data */
		"[]",
		"{\"a\":1}",                          /* tensor not an object */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}",                                  /* no offsets */
		"{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}",           /* dtype */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,5]}}",           /* size */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",           /* begin > end */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",         /* 3 offsets */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",          /* negative */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}",         /* float */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}",         /* exponent */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",          /* leading 0 */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",       /* string */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}", /* 2^63 */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,4]}}",
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", /* product overflows */
		"{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,4]}}", /* bytes overflow */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", /* overlap */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]}}",        /* past the data */
		"{\"__metadata__\":{\"a\":1}}",
		"{\"__metadata__\":[]}",
		"{\"__metadata__\":{\"a\":\"b\",\"a\":\"c\"}}",
		"{\"__metadata__\":{},\"__metadata__\":{}}",
		"{\"__metadata__\":{\"a\":\"\\u0000\"}}",
		"{\"a\x01\":{}}",                    /* control character */
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":tru}}",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":\"\\x\"}}",
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
		"{\"\xff\":{}}",                     /* invalid UTF-8 */
		"{\"\xed\xa0\x80\":{}}",             /* encoded surrogate */
		"{\"\xc0\xaf\":{}}",                 /* overlong */
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		h = NULL;
		r = parse_json(bad[i], 16, &h);
		CHECK(r == -EBADMSG, "bad header %zu (%s) gave %d", i, bad[i], r);
		CHECK(h == NULL, "no header on error");
		CHECK(r == 0 || kylix_last_error()[0] != '\0', "message for bad header %zu", i);
		kylix_free_header(h);
	}
	/* Nesting: 100 levels inside an ignored field are refused, not recursed. */
	char deep[512];
	int k = snprintf(deep, sizeof deep, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
	for (int i = 0; i < 100; i++)
		deep[k++] = '[';
	for (int i = 0; i < 100; i++)
		deep[k++] = ']';
	snprintf(deep + k, sizeof deep - (size_t)k, "}}");
	r = parse_json(deep, 1, &h);
	CHECK(r == -EBADMSG, "deep nesting gave %d", r);
	/* The length prefix: overlong, past the file, truncated buffer. */
	size_t len;
	unsigned char *b = hdr("{}", 0, &len);
	CHECK(kylix_parse_header(b, len, len - 1, &h) == -EBADMSG, "header past the file");
	CHECK(kylix_parse_header(b, len - 1, len, &h) == -EBADMSG, "truncated buffer");
	CHECK(kylix_parse_header(b, 7, len, &h) == -EBADMSG, "short prefix");
	b[7] = 1; /* 2^56 */
	CHECK(kylix_parse_header(b, len, len, &h) == -EBADMSG, "overlong length");
	b[7] = 0;
	b[3] = 0x10; /* 256 MiB > the limit */
	CHECK(kylix_parse_header(b, len, (uint64_t)1 << 40, &h) == -EBADMSG, "length over the limit");
	free(b);
	CHECK(kylix_parse_header(NULL, 0, 0, NULL) == -EINVAL, "NULL out");
	CHECK(strlen(kylix_strerror(-EBADMSG)) > 0 && strlen(kylix_strerror(-ENOENT)) > 0, "strerror");
}

/* ---- fuzz ---- */

static const char *const seeds[] = {
	"{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
	"\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]}}",
	"{\"x\\u00e9\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"extra\":[1,{\"a\":null},true,-1.5e3]}}",
};

static void check_header_invariants(const kylix_header *h, uint64_t file_size)
{
	for (uint64_t i = 0; i < h->n_tensors; i++) {
		const kylix_tensor *t = &h->tensors[i];
		CHECK(t->begin <= t->end && t->end <= file_size - h->data_start, "tensor in range");
		CHECK(i == 0 || t->begin >= h->tensors[i - 1].end, "no overlap");
		CHECK(t->ndim <= KYLIX_MAX_DIMS && t->elem_size > 0, "dims and dtype");
	}
}

static int fuzz(long n, int nfiles, char **files)
{
	size_t nseeds = sizeof seeds / sizeof seeds[0] + (size_t)nfiles;
	unsigned char **sb = calloc(nseeds, sizeof *sb);
	size_t *sl = calloc(nseeds, sizeof *sl);
	for (size_t i = 0; i < nseeds; i++) {
		if (i < sizeof seeds / sizeof seeds[0]) {
			sb[i] = hdr(seeds[i], 32, &sl[i]);
		} else {
			size_t len;
			unsigned char *f = read_file(files[i - sizeof seeds / sizeof seeds[0]], &len);
			if (!f || len < 8) {
				fprintf(stderr, "fuzz: cannot read %s\n", files[i - 2]);
				return 1;
			}
			uint64_t hl = 0;
			for (int k = 7; k >= 0; k--)
				hl = hl << 8 | f[k];
			/* The header plus a little of the data section keeps it fast. */
			sl[i] = 8 + hl + 64 < len ? 8 + hl + 64 : len;
			sb[i] = f;
		}
	}
	unsigned char *buf = malloc(1 << 20);
	long ok = 0;
	for (long it = 0; it < n; it++) {
		size_t s = rnd() % nseeds;
		size_t len = sl[s] < (1u << 20) - 64 ? sl[s] : (1u << 20) - 64;
		memcpy(buf, sb[s], len);
		int muts = 1 + (int)(rnd() % 4);
		for (int m = 0; m < muts; m++) {
			size_t pos = rnd() % len;
			switch (rnd() % 7) {
			case 0: buf[pos] ^= (unsigned char)(1u << (rnd() % 8)); break;
			case 1: buf[pos] = (unsigned char)rnd(); break;
			case 2: {
				static const char tok[] = "{}[]\",:0123456789-.eE\\u \x80\xff";
				buf[pos] = (unsigned char)tok[rnd() % (sizeof tok - 1)];
				break;
			}
			case 3: /* delete a byte */
				memmove(buf + pos, buf + pos + 1, len - pos - 1);
				len--;
				break;
			case 4: /* insert a byte */
				memmove(buf + pos + 1, buf + pos, len - pos);
				buf[pos] = (unsigned char)"{}[]\",:9\\"[rnd() % 9]; /* 9 chars */
				len++;
				break;
			case 5: /* a huge number */
				if (len > pos + 20)
					memcpy(buf + pos, "99999999999999999999", 20);
				break;
			default: /* the length prefix */
				if (pos < 8)
					buf[pos] = (unsigned char)rnd();
				break;
			}
			if (len < 9)
				break;
		}
		uint64_t file_size = len + (rnd() % 3 == 0 ? rnd() % 64 : 0);
		kylix_header *h = NULL;
		int r = kylix_parse_header(buf, len, file_size, &h);
		CHECK(r == 0 || r == -EBADMSG, "fuzz iteration %ld: %d", it, r);
		if (r == 0) {
			ok++;
			check_header_invariants(h, file_size);
			kylix_free_header(h);
		}
		if (failures > 10)
			break;
	}
	printf("fuzz: %ld inputs, %ld parsed, %d failures\n", n, ok, failures);
	for (size_t i = 0; i < nseeds; i++)
		free(sb[i]);
	free(sb);
	free(sl);
	free(buf);
	return failures ? 1 : 0;
}

static int dump(const char *path)
{
	kylix_file *f;
	int r = kylix_open(path, &f);
	if (r) {
		fprintf(stderr, "open %s: %s\n", path, kylix_last_error());
		return 1;
	}
	const kylix_header *h;
	r = kylix_tensors(f, &h);
	if (r) {
		fprintf(stderr, "tensors %s: %d %s\n", path, r, kylix_last_error());
		kylix_close(f);
		return 1;
	}
	printf("H %llu\n", (unsigned long long)h->header_len);
	for (uint64_t i = 0; i < h->n_metadata; i++)
		printf("M %s=%s\n", h->metadata[i].key, h->metadata[i].value);
	for (uint64_t i = 0; i < h->n_tensors; i++) {
		const kylix_tensor *t = &h->tensors[i];
		printf("T %s %s [", t->name, t->dtype);
		for (uint32_t d = 0; d < t->ndim; d++)
			printf(d ? ",%llu" : "%llu", (unsigned long long)t->shape[d]);
		printf("] %llu %llu %llu\n", (unsigned long long)t->begin, (unsigned long long)t->end,
		       (unsigned long long)t->offset);
	}
	kylix_close(f);
	return 0;
}

/* ---- a fake node on a client socket ---- */

struct fake {
	char path[108];
	int lfd;
	pthread_t th;
	const char *pack_path; /* handed out for PACKS */
	uint64_t pack_size;    /* size claimed in the entry */
	uint32_t pack_flags;
	uint64_t gen_skew;     /* added to the true generation */
	int32_t status;        /* reply status */
	const char *msg;
	int packs_asked;       /* PACKS requests served */
	int fills;
	struct kx_fill_request last_fill;
	kylix_range last_ranges[8];
	size_t last_body;
	ino_t want_ino;        /* the fd sent must be this file */
	int bad_fd;            /* requests with the wrong fd */
	pid_t child_pid_seen;
};

static void reply(int c, const struct kx_msg_header *rq, int32_t status, const char *msg,
                  const void *fields, size_t flen, const int *fds, int nfds)
{
	unsigned char b[1024];
	struct kx_reply_status st = {status, (uint32_t)strlen(msg)};
	struct kx_msg_header h = {KX_CLIENT_MAGIC, 1, (uint16_t)(rq->op | KX_REPLY_BIT), rq->seq,
	                          (uint32_t)(sizeof st + st.msg_len + flen)};
	size_t n = 0;
	memcpy(b, &h, sizeof h), n += sizeof h;
	memcpy(b + n, &st, sizeof st), n += sizeof st;
	memcpy(b + n, msg, st.msg_len), n += st.msg_len;
	if (flen)
		memcpy(b + n, fields, flen), n += flen;
	struct iovec iov = {b, n};
	char cm[CMSG_SPACE(sizeof(int) * 4)];
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds) {
		memset(cm, 0, sizeof cm);
		m.msg_control = cm;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c2 = CMSG_FIRSTHDR(&m);
		c2->cmsg_level = SOL_SOCKET;
		c2->cmsg_type = SCM_RIGHTS;
		c2->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c2), fds, sizeof(int) * (size_t)nfds);
	}
	if (sendmsg(c, &m, MSG_NOSIGNAL) < 0)
		perror("fake node: sendmsg");
}

static void *fake_main(void *arg)
{
	struct fake *fk = arg;
	for (;;) {
		int c = accept(fk->lfd, NULL, NULL);
		if (c < 0)
			return NULL;
		static unsigned char b[128 << 10];
		char cm[CMSG_SPACE(sizeof(int) * 4)];
		struct iovec iov = {b, sizeof b};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm, .msg_controllen = sizeof cm};
		ssize_t r = recvmsg(c, &m, 0);
		int rfd = -1;
		struct cmsghdr *cc = CMSG_FIRSTHDR(&m);
		if (cc && cc->cmsg_type == SCM_RIGHTS)
			memcpy(&rfd, CMSG_DATA(cc), sizeof rfd);
		struct stat st;
		if (rfd < 0 || fstat(rfd, &st) != 0 || st.st_ino != fk->want_ino ||
		    (fcntl(rfd, F_GETFL) & O_ACCMODE) != O_RDONLY)
			fk->bad_fd++;
		if (rfd >= 0)
			close(rfd);
		struct kx_msg_header h;
		if (r < (ssize_t)sizeof h) {
			close(c);
			continue;
		}
		memcpy(&h, b, sizeof h);
		if (h.magic != KX_CLIENT_MAGIC || h.version != 1 || h.body_len != (size_t)r - sizeof h)
			fk->bad_fd += 1000;
		struct ucred cr;
		socklen_t crl = sizeof cr;
		if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crl) == 0)
			fk->child_pid_seen = cr.pid;
		if (h.op == KX_OP_PACKS) {
			fk->packs_asked++;
			if (fk->status) {
				reply(c, &h, fk->status, fk->msg, NULL, 0, NULL, 0);
			} else {
				int pfd = open(fk->pack_path, O_RDONLY);
				unsigned char fl[4 + sizeof(struct kx_pack_entry)];
				uint32_t one = 1;
				struct stat pst;
				fstat(pfd, &pst);
				struct kx_pack_entry e = {0, fk->pack_flags, kx_generation(&pst) + fk->gen_skew, fk->pack_size};
				memcpy(fl, &one, 4);
				memcpy(fl + 4, &e, sizeof e);
				reply(c, &h, 0, "", fl, sizeof fl, &pfd, 1);
				close(pfd);
			}
		} else if (h.op == KX_OP_FILL) {
			fk->fills++;
			fk->last_body = h.body_len;
			if (h.body_len >= sizeof fk->last_fill)
				memcpy(&fk->last_fill, b + sizeof h, sizeof fk->last_fill);
			if (h.body_len >= sizeof fk->last_fill + sizeof fk->last_ranges)
				memcpy(fk->last_ranges, b + sizeof h + sizeof fk->last_fill, sizeof fk->last_ranges);
			if (fk->status) {
				reply(c, &h, fk->status, fk->msg, NULL, 0, NULL, 0);
			} else {
				struct kx_fill_reply rep = {fk->last_fill.length, 1234, "bounce", "pread", "blake3-gpu"};
				reply(c, &h, 0, "ok", &rep, sizeof rep, NULL, 0);
			}
		}
		close(c);
	}
}

static void fake_start(struct fake *fk, const char *dir)
{
	snprintf(fk->path, sizeof fk->path, "%s/client.sock", dir);
	fk->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", fk->path);
	if (bind(fk->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(fk->lfd, 16)) {
		perror("fake node");
		exit(2);
	}
	pthread_create(&fk->th, NULL, fake_main, fk);
}

static void fake_stop(struct fake *fk)
{
	shutdown(fk->lfd, SHUT_RDWR);
	pthread_join(fk->th, NULL);
	close(fk->lfd);
	unlink(fk->path);
}

struct reader {
	kylix_file *f;
	const unsigned char *want;
	size_t size;
	int bad;
	uint64_t seed;
	int iters;
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	uint64_t s = rd->seed;
	unsigned char *buf = malloc(1 << 20);
	for (int i = 0; i < rd->iters; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t off = (s >> 11) % (rd->size + 1);
		size_t n = (size_t)((s >> 3) % (1 << 20));
		kylix_read_info ri;
		ssize_t r = kylix_pread(rd->f, buf, n, off, &ri);
		size_t want_n = off + n > rd->size ? rd->size - off : n;
		if (r != (ssize_t)want_n || memcmp(buf, rd->want + off, want_n) != 0 ||
		    ri.bytes_pack + ri.bytes_fuse != want_n)
			rd->bad++;
	}
	free(buf);
	return NULL;
}

static int read_threads(kylix_file *f, const unsigned char *want, size_t size, int iters)
{
	struct reader rd[8];
	pthread_t th[8];
	for (int i = 0; i < 8; i++) {
		rd[i] = (struct reader){f, want, size, 0, (uint64_t)i * 7919 + 1, iters};
		pthread_create(&th[i], NULL, reader_main, &rd[i]);
	}
	int bad = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		bad += rd[i].bad;
	}
	return bad;
}

/* child_read reads the whole file in a forked child; the exit status says
 * how it went (0 ok, 1 wrong bytes, 2 not from packs when expected). */
static int child_read(kylix_file *f, const unsigned char *want, size_t size, bool want_pack)
{
	pid_t pid = fork();
	if (pid == 0) {
		unsigned char *buf = malloc(size + 1);
		kylix_read_info ri;
		ssize_t r = kylix_pread(f, buf, size, 0, &ri);
		int rc = (r != (ssize_t)size || memcmp(buf, want, size) != 0) ? 1 : 0;
		if (!rc && want_pack && ri.bytes_pack != size)
			rc = 2;
		free(buf);
		_exit(rc);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static void test_fake_node(void)
{
	char dir[] = "/tmp/kylix-ctest-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		failures++;
		return;
	}
	char src[256], pack[256];
	snprintf(src, sizeof src, "%s/file", dir);
	snprintf(pack, sizeof pack, "%s/pack", dir);
	size_t size = (3 << 20) + 12345;
	unsigned char *data = malloc(size);
	for (size_t i = 0; i < size; i++)
		data[i] = (unsigned char)rnd();
	write_file(src, data, size);
	write_file(pack, data, size);
	struct stat st;
	stat(src, &st);

	/* A plain file is not on Kylix, and a pipe is not either. */
	int pfd[2];
	CHECK(pipe(pfd) == 0, "pipe");
	CHECK(kylix_is_kylix_fd(pfd[0]) == 0, "pipe is not kylix");
	close(pfd[0]);
	close(pfd[1]);
	CHECK(kylix_is_kylix_fd(12345) == -EBADF, "bad fd: %d", kylix_is_kylix_fd(12345));
	kylix_file *f;
	CHECK(kylix_open(dir, &f) == -EISDIR, "directory refused");
	CHECK(kylix_open("/nonexistent/x", &f) == -ENOENT && strstr(kylix_last_error(), "/nonexistent/x"),
	      "ENOENT with the path: %s", kylix_last_error());
	CHECK(kylix_open(src, &f) == 0, "open: %s", kylix_last_error());
	CHECK(kylix_is_kylix(f) == 0 && kylix_is_kylix_fd(kylix_fd(f)) == 0, "plain file");
	CHECK(kylix_size(f) == (int64_t)size, "size");
	unsigned char *buf = malloc(size + 100);
	kylix_read_info ri;
	CHECK(kylix_pread(f, buf, size + 100, 0, &ri) == (ssize_t)size && memcmp(buf, data, size) == 0 &&
	      ri.bytes_fuse == size && strcmp(ri.path, "fuse") == 0, "plain read");
	CHECK(kylix_pread(f, buf, 10, size, &ri) == 0 && strcmp(ri.path, "none") == 0, "read at EOF");
	unsigned char h64[64] = {0};
	CHECK(kylix_fill_device(f, h64, 0, 0, 0, 1, 0, NULL) == -ENOTSUP, "fill on a plain file");

	/* The fake node hands out the pack. */
	struct fake fk = {.pack_path = pack, .pack_size = size, .pack_flags = KX_PACK_WHOLE_FILE | KX_PACK_CHECKED,
	                  .want_ino = st.st_ino};
	fake_start(&fk, dir);
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_packs(f) == 0, "no packs before a read");
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && memcmp(buf, data, size) == 0, "pack read bytes");
	CHECK(ri.bytes_pack == size && ri.bytes_fuse == 0 && strcmp(ri.path, "pack") == 0,
	      "pack path: pack %llu fuse %llu", (unsigned long long)ri.bytes_pack, (unsigned long long)ri.bytes_fuse);
	CHECK(kylix_packs(f) == 1 && fk.packs_asked == 1, "one pack, asked once");
	CHECK(read_threads(f, data, size, 200) == 0, "8 threads through packs");
	CHECK(fk.packs_asked == 1, "threads did not ask again: %d", fk.packs_asked);
	/* fork: the child asks again on its own connection, and reads packs. */
	CHECK(child_read(f, data, size, true) == 0, "child read after fork");
	CHECK(fk.packs_asked == 2, "child asked for its own packs: %d", fk.packs_asked);
	CHECK(kylix_pread(f, buf, 100, 5, &ri) == 100 && ri.bytes_pack == 100, "parent still on packs");
	CHECK(fk.packs_asked == 2, "parent did not ask again");

	/* O_DIRECT (where the filesystem has it): KYLIX_PACK_IO=direct reads an
	 * aligned range with it; auto only once the range left the page cache. */
	int probe_fd = open(pack, O_RDONLY | O_DIRECT);
	if (probe_fd >= 0) {
		close(probe_fd);
		void *abuf = NULL;
		CHECK(posix_memalign(&abuf, 4096, 2 << 20) == 0, "posix_memalign");
		const char *modes[] = {"direct", "auto", "buffered"};
		for (int mi = 0; mi < 3; mi++) {
			setenv("KYLIX_PACK_IO", modes[mi], 1);
			kylix_file *g;
			CHECK(kylix_open(src, &g) == 0, "open");
			kx_test_set_socket(g, fk.path);
			int pf = open(pack, O_RDONLY);
			/* Out of the page cache (the pack is clean: written, then synced). */
			CHECK(fsync(pf) == 0 && posix_fadvise(pf, 0, 0, POSIX_FADV_DONTNEED) == 0, "evict");
			close(pf);
			unsigned long long before = kx_direct_bytes;
			ssize_t got = kylix_pread(g, abuf, (2 << 20) - 100, 8192, &ri);
			unsigned long long direct = kx_direct_bytes - before;
			CHECK(got == (2 << 20) - 100 && memcmp(abuf, data + 8192, (size_t)got) == 0 &&
			      ri.bytes_pack == (uint64_t)got, "%s: bytes", modes[mi]);
			CHECK(mi == 2 ? direct == 0 : direct == ((2 << 20) - 4096), "%s: %llu bytes O_DIRECT", modes[mi], direct);
			/* auto: now in the page cache (the tail went buffered; read it all
			 * buffered once more), so no O_DIRECT. */
			if (mi == 1) {
				CHECK(kylix_pread(g, buf, size, 0, NULL) == (ssize_t)size, "warm");
				before = kx_direct_bytes;
				CHECK(kylix_pread(g, abuf, 2 << 20, 8192, &ri) == 2 << 20 &&
				      memcmp(abuf, data + 8192, 2 << 20) == 0, "auto warm bytes");
				CHECK(kx_direct_bytes == before, "auto: warm data read through the page cache");
			}
			kylix_close(g);
		}
		unsetenv("KYLIX_PACK_IO");
		free(abuf);
	} else {
		printf("unit: O_DIRECT not supported on %s: O_DIRECT pack reads not tested\n", dir);
	}

	/* The pack changes under us, same size (a write in place; its mtime set
	 * explicitly, since two writes within one clock tick may share one): the
	 * generation differs, the read falls back and counts it. */
	int pw = open(pack, O_WRONLY);
	struct timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
	CHECK(pwrite(pw, data, 1, 0) == 1 && futimens(pw, times) == 0, "rewrite a byte in place");
	close(pw);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && memcmp(buf, data, size) == 0 &&
	      ri.bytes_fuse == size && ri.pack_fallbacks == 1, "changed pack falls back: fuse %llu fallbacks %llu",
	      (unsigned long long)ri.bytes_fuse, (unsigned long long)ri.pack_fallbacks);
	CHECK(kylix_packs(f) == 0, "changed pack dropped");
	kylix_read_info tot;
	CHECK(kylix_stats(f, &tot) == 0 && tot.pack_fallbacks == 1 && tot.bytes_pack > 0 && tot.bytes_fuse > 0 &&
	      strcmp(tot.path, "mixed") == 0, "totals");
	kylix_close(f);

	/* A reply whose size disagrees with the file is refused. */
	write_file(pack, data, size);
	fk.pack_size = size - 1;
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && memcmp(buf, data, size) == 0 &&
	      ri.bytes_fuse == size && ri.pack_fallbacks == 1, "wrong size refused");
	kylix_close(f);
	/* A generation that is not the pack's (it changed between the node's
	 * check and our fstat) is refused. */
	fk.pack_size = size;
	fk.gen_skew = 1;
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && memcmp(buf, data, size) == 0 &&
	      ri.bytes_fuse == size && ri.pack_fallbacks == 1, "wrong generation refused");
	kylix_close(f);
	fk.gen_skew = 0;
	/* A pack not marked checked is refused. */
	fk.pack_size = size;
	fk.pack_flags = KX_PACK_WHOLE_FILE;
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && ri.bytes_fuse == size && ri.pack_fallbacks == 1,
	      "unchecked pack refused");
	kylix_close(f);
	/* The node refuses (a file being written): the mount, no error. */
	fk.status = -EBUSY;
	fk.msg = "file is being written";
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && ri.bytes_fuse == size, "refusal: mount");
	CHECK(kylix_last_error()[0] == '\0', "a successful read leaves no error: %s", kylix_last_error());
	/* KYLIX_NO_PACKS turns packs off. */
	fk.status = 0;
	fk.pack_flags = KX_PACK_WHOLE_FILE | KX_PACK_CHECKED;
	kylix_close(f);
	setenv("KYLIX_NO_PACKS", "1", 1);
	int asked = fk.packs_asked;
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && ri.bytes_fuse == size && fk.packs_asked == asked,
	      "KYLIX_NO_PACKS");
	unsetenv("KYLIX_NO_PACKS");

	/* FILL: the request as the contract encodes it, and the node's errors. */
	for (int i = 0; i < 64; i++)
		h64[i] = (unsigned char)(i * 3 + 1);
	fk.status = -ENODEV;
	fk.msg = "no CUDA driver on this node";
	int r = kylix_fill_device(f, h64, 3, 4096, 100, 2000, KYLIX_FILL_VERIFY, NULL);
	CHECK(r == -ENODEV, "fill ENODEV: %d", r);
	CHECK(strstr(kylix_last_error(), "no CUDA driver on this node") != NULL, "node message: %s", kylix_last_error());
	CHECK(fk.fills == 1 && fk.last_fill.device == 3 && fk.last_fill.flags == KYLIX_FILL_VERIFY &&
	      memcmp(fk.last_fill.ipc_handle, h64, 64) == 0 && fk.last_fill.dst_offset == 4096 &&
	      fk.last_fill.file_offset == 100 && fk.last_fill.length == 2000 && fk.last_fill.n_ranges == 0 &&
	      fk.last_fill.reserved == 0, "fill request encoding");
	fk.status = -ENOTSUP;
	fk.msg = "gds not available (strict)";
	CHECK(kylix_fill_device(f, h64, 0, 0, 0, 10, KYLIX_FILL_STRICT, NULL) == -ENOTSUP &&
	      strstr(kylix_last_error(), "strict"), "fill ENOTSUP");
	fk.status = 0;
	kylix_fill_info fi;
	CHECK(kylix_fill_device(f, h64, 0, 0, 0, 1000, 0, &fi) == 0 && fi.bytes == 1000 && fi.nanos == 1234 &&
	      strcmp(fi.path, "bounce") == 0 && strcmp(fi.verified, "blake3-gpu") == 0, "fill ok");
	kylix_range rg[4096];
	for (int i = 0; i < 4096; i++)
		rg[i] = (kylix_range){(uint64_t)i * 100, 50, (uint64_t)i * 64};
	CHECK(kylix_fill_device_ranges(f, h64, 1, rg, 4096, KYLIX_FILL_VERIFY, &fi) == 0, "ranges: %s", kylix_last_error());
	CHECK(fk.last_body == 104 + 4096 * 24 && fk.last_fill.n_ranges == 4096 && fk.last_fill.device == 1 &&
	      fk.last_fill.length == 0 && fk.last_fill.file_offset == 0 && memcmp(fk.last_ranges, rg, sizeof fk.last_ranges) == 0,
	      "ranges encoding: body %zu n %u", fk.last_body, fk.last_fill.n_ranges);
	CHECK(kylix_fill_device_ranges(f, h64, 1, rg, 4097, 0, NULL) == -EINVAL, "too many ranges");
	CHECK(kylix_fill_device_ranges(f, h64, 1, rg, 0, 0, NULL) == -EINVAL, "no ranges");
	rg[7].file_offset = size;
	CHECK(kylix_fill_device_ranges(f, h64, 1, rg, 8, 0, NULL) == -EINVAL, "a range past the end");
	CHECK(kylix_fill_device(f, h64, 0, 0, size, 1, 0, NULL) == -EINVAL, "fill past the end");
	CHECK(kylix_fill_device(f, h64, 0, 0, 0, 1, 8, NULL) == -EINVAL, "fill unknown flag");
	CHECK(fk.bad_fd == 0, "every request carried the file's read-only fd (%d bad)", fk.bad_fd);
	kylix_close(f);
	fake_stop(&fk);

	/* No node listening: reads still work, fill says why. */
	CHECK(kylix_open(src, &f) == 0, "open");
	kx_test_set_socket(f, fk.path);
	CHECK(kylix_pread(f, buf, size, 0, &ri) == (ssize_t)size && ri.bytes_fuse == size, "no node: mount");
	CHECK(kylix_fill_device(f, h64, 0, 0, 0, 1, 0, NULL) == -ENOENT, "fill without a node");
	kylix_close(f);

	free(buf);
	free(data);
	unlink(src);
	unlink(pack);
	rmdir(dir);
}

/* ---- a live mount ---- */

static int mount_test(int argc, char **argv)
{
	const char *pack_files[16];
	int npack = 0;
	int i = 0;
	bool probe = true;
	for (;;) {
		if (i + 1 < argc && strcmp(argv[i], "--pack") == 0 && npack < 16) {
			pack_files[npack++] = argv[i + 1];
			i += 2;
		} else if (i < argc && strcmp(argv[i], "--no-probe") == 0) {
			probe = false; /* a node without KYLIX_IOC_PROBE (layout v1) */
			i++;
		} else {
			break;
		}
	}
	for (; i + 1 < argc; i += 2) {
		const char *src = argv[i], *dst = argv[i + 1];
		size_t size;
		unsigned char *want = read_file(src, &size);
		CHECK(want != NULL, "read %s", src);
		if (!want)
			continue;
		kylix_file *f;
		int r = kylix_open(dst, &f);
		CHECK(r == 0, "open %s: %s", dst, kylix_last_error());
		if (r) {
			free(want);
			continue;
		}
		if (probe)
			CHECK(kylix_is_kylix(f) == 1 && kylix_is_kylix_fd(kylix_fd(f)) == 1, "%s is on Kylix", dst);
		CHECK(kylix_size(f) == (int64_t)size, "%s size %lld want %zu", dst, (long long)kylix_size(f), size);
		int sock_fd = open(dst, O_RDONLY);
		struct kx_probe p;
		memset(&p, 0, sizeof p);
		bool has_socket = ioctl(sock_fd, KX_IOC_PROBE, &p) == 0 && p.client_socket[0];
		close(sock_fd);
		bool want_pack = false;
		for (int k = 0; k < npack; k++)
			want_pack |= strcmp(pack_files[k], dst) == 0;
		want_pack &= has_socket;
		/* Whole file in odd-sized pieces. */
		unsigned char *buf = malloc(size + 1);
		size_t off = 0;
		while (off < size) {
			size_t n = 1 + (size_t)(rnd() % (3 << 20));
			kylix_read_info ri;
			ssize_t got = kylix_pread(f, buf + off, n, off, &ri);
			CHECK(got > 0, "%s read at %zu: %zd %s", dst, off, got, kylix_last_error());
			if (got <= 0)
				break;
			off += (size_t)got;
		}
		CHECK(off == size && memcmp(buf, want, size) == 0, "%s bytes equal the source", dst);
		/* Once more into a page-aligned buffer (O_DIRECT where chosen). */
		void *abuf = NULL;
		if (posix_memalign(&abuf, 4096, size + 4096) == 0) {
			CHECK(kylix_pread(f, abuf, size, 0, NULL) == (ssize_t)size && memcmp(abuf, want, size) == 0,
			      "%s aligned read equals the source", dst);
			free(abuf);
		}
		if (strstr(dst, ".safetensors")) {
			const kylix_header *h;
			CHECK(kylix_tensors(f, &h) == 0, "%s tensors: %s", dst, kylix_last_error());
		}
		if (has_socket) {
			/* FILL with a handle no process allocated: refused, with the
			 * node's reason; without a GPU that is ENODEV. */
			unsigned char h64[64] = {0};
			int fr = kylix_fill_device(f, h64, 0, 0, 0, size < 4096 ? size : 4096, 0, NULL);
			CHECK(fr < 0 && kylix_last_error()[0], "%s: fill with a zero handle: %d", dst, fr);
			if (access("/dev/nvidia0", F_OK) != 0) {
				CHECK(fr == -ENODEV, "%s: fill without a GPU: %d %s", dst, fr, kylix_last_error());
				/* Said once, as a skip: the refusal is what is tested. */
				static int said;
				if (fr == -ENODEV && !said++ && !getenv("KYLIX_CTEST_SKIPS_SAID"))
					printf("skip: GPU fill into client memory: no GPU here (each FILL refused with ENODEV, as it must be): %s\n",
					       kylix_last_error());
			} else {
				printf("%s: fill: %s\n", dst, kylix_last_error());
			}
		}
		CHECK(read_threads(f, want, size, 48) == 0, "%s: 8 threads", dst);
		int cr = child_read(f, want, size, want_pack);
		CHECK(cr == 0, "%s: child after fork: %d", dst, cr);
		kylix_read_info tot;
		kylix_stats(f, &tot);
		printf("%s: %zu bytes, pack %llu, fuse %llu, fallbacks %llu, direct %llu, socket %s\n", dst, size,
		       (unsigned long long)tot.bytes_pack, (unsigned long long)tot.bytes_fuse,
		       (unsigned long long)tot.pack_fallbacks, (unsigned long long)kx_direct_bytes,
		       has_socket ? p.client_socket : "(none)");
		if (want_pack)
			CHECK(tot.bytes_fuse == 0 && tot.bytes_pack > 0, "%s: read from packs", dst);
		else if (!has_socket)
			CHECK(tot.bytes_pack == 0 && tot.bytes_fuse > 0, "%s: read through the mount", dst);
		free(buf);
		free(want);
		kylix_close(f);
	}
	return failures ? 1 : 0;
}

/* ---- kylix_tar_scan ------------------------------------------------------ */

enum { TAR_POSIX, TAR_GNU, TAR_V7 };

/* tar_put writes a 512-byte header at h: name (and prefix, POSIX only),
 * size (octal; base-256 when b256), type, magic; checksum exact. */
static void tar_put(unsigned char *h, const char *name, const char *prefix, uint64_t size, char type,
                    int magic, bool b256)
{
	memset(h, 0, 512);
	memcpy(h, name, strnlen(name, 100));
	memcpy(h + 100, "0000644", 7);
	if (b256) {
		h[124] = 0x80;
		for (int i = 0; i < 8; i++)
			h[135 - i] = (unsigned char)(size >> (8 * i));
	} else {
		snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
	}
	h[156] = (unsigned char)type;
	if (magic == TAR_POSIX) {
		memcpy(h + 257, "ustar\0" "00", 8);
		if (prefix)
			memcpy(h + 345, prefix, strnlen(prefix, 155));
	} else if (magic == TAR_GNU) {
		memcpy(h + 257, "ustar  \0", 8);
	}
	unsigned sum = 8 * ' ';
	for (int i = 0; i < 512; i++)
		if (i < 148 || i >= 156)
			sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	h[155] = ' ';
}

/* tar_add appends a member (header, size bytes of a pattern, padding) at
 * *len of b, returning its header's offset. */
static size_t tar_add(unsigned char *b, size_t *len, const char *name, uint64_t size, char type)
{
	size_t off = *len;
	tar_put(b + off, name, NULL, size, type, TAR_POSIX, false);
	for (uint64_t i = 0; i < size; i++)
		b[off + 512 + i] = (unsigned char)(i * 7 + 1);
	size_t pad = (size_t)(size + 511) / 512 * 512;
	memset(b + off + 512 + size, 0, pad - size);
	*len = off + 512 + pad;
	return off;
}

static void tar_resum(unsigned char *h)
{
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	h[155] = ' ';
}

static int scan(const unsigned char *b, size_t len, uint64_t base, kylix_tar_member *m, size_t max,
                size_t *n, uint64_t *next)
{
	/* A copy of exactly len bytes, so that ASan sees any read past it. */
	unsigned char *c = malloc(len ? len : 1);
	memcpy(c, b, len);
	int r = kylix_tar_scan(len ? c : NULL, len, base, m, max, n, next);
	free(c);
	return r;
}

static void test_tar(void)
{
	enum { CAP = 1 << 16 };
	unsigned char *b = calloc(1, CAP);
	kylix_tar_member m[16];
	size_t n, len = 0;
	uint64_t next;
	size_t h0 = tar_add(b, &len, "a/0001.bin", 10, '0');
	size_t h1 = tar_add(b, &len, "a/0001.seg.png", 0, 0);
	size_t h2 = tar_add(b, &len, "a/0002.bin", 600, '0');
	size_t end = len;
	memset(b + len, 0, 1024);
	len += 1024;

	/* A whole file: three members, then the trailer. */
	int r = scan(b, len, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_END && n == 3 && next == end, "whole: r %d n %zu next %llu", r, n, (unsigned long long)next);
	CHECK(m[0].header_offset == h0 && m[0].data_offset == 512 && m[0].size == 10 && m[0].next_offset == h1,
	      "member 0 offsets");
	CHECK(m[1].header_offset == h1 && m[1].size == 0 && m[1].next_offset == h1 + 512 && m[1].type == 0,
	      "member 1: empty, type NUL");
	CHECK(m[2].header_offset == h2 && m[2].size == 600 && m[2].next_offset == h2 + 512 + 1024 && m[2].type == '0',
	      "member 2");
	CHECK(m[0].name_len == 10 && m[0].key_len == 6 && m[0].prefix_len == 0, "a/0001.bin: key a/0001");
	CHECK(m[1].name_len == 14 && m[1].key_len == 6, "a/0001.seg.png: key a/0001, extension seg.png");
	CHECK(m[0].flags == 0 && m[1].flags == KYLIX_TAR_SAME_KEY && m[2].flags == 0, "same-key flags %llu %llu %llu",
	      (unsigned long long)m[0].flags, (unsigned long long)m[1].flags, (unsigned long long)m[2].flags);
	/* The same bytes at another base: offsets move with it. */
	uint64_t base = (uint64_t)1 << 40;
	r = scan(b, len, base, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_END && n == 3 && next == base + end && m[2].data_offset == base + h2 + 512, "base");
	/* Starting at a later header (the caller's next window). */
	r = scan(b + h2, len - h2, h2, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_END && n == 1 && m[0].header_offset == h2 && m[0].flags == 0, "from the third header");

	/* Truncated windows: the member whose data (or padding) is not all
	 * in the window ends the scan at its header. */
	size_t cuts[] = {h2 + 512 + 599, h2 + 512 + 600, h2 + 512 + 1023, h2 + 511, h2};
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		r = scan(b, cuts[i], 0, m, 16, &n, &next);
		CHECK(r == KYLIX_TAR_MORE && n == 2 && next == h2, "cut at %zu: r %d n %zu next %llu", cuts[i], r, n,
		      (unsigned long long)next);
	}
	r = scan(b, h2 + 512 + 1024, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 3 && next == end, "window ends at the trailer");
	r = scan(b, 511, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 0 && next == 0, "less than a header");
	r = scan(b, 0, 7, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 0 && next == 7, "empty window");
	/* A member larger than the window: nothing, next at the window's start. */
	r = scan(b + h2, 1024, h2, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 0 && next == h2, "member larger than the window");

	/* max: FULL, and a second call goes on. */
	r = scan(b, len, 0, m, 2, &n, &next);
	CHECK(r == KYLIX_TAR_FULL && n == 2 && next == h2, "full");
	r = scan(b + next, len - next, next, m, 2, &n, &next);
	CHECK(r == KYLIX_TAR_END && n == 1 && m[0].header_offset == h2 && next == end, "after full");

	/* The trailer first. */
	r = scan(b + end, 1024, end, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_END && n == 0 && next == end, "trailer");

	/* A bad checksum in the second header: OTHER there, the first returned. */
	unsigned char *c = calloc(1, CAP);
	memcpy(c, b, len);
	c[h1 + 3] ^= 0x20;
	r = scan(c, len, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_OTHER && n == 1 && next == h1, "bad checksum: r %d n %zu", r, n);
	/* A signed-sum checksum (tarfile accepts one) is the caller's. */
	memcpy(c, b, len);
	c[h1 + 20] = 0xE9;
	{
		int sum = 0;
		memset(c + h1 + 148, ' ', 8);
		for (int i = 0; i < 512; i++)
			sum += (signed char)c[h1 + i];
		snprintf((char *)c + h1 + 148, 8, "%06o", sum);
	}
	r = scan(c, len, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_OTHER && n == 1 && next == h1, "signed checksum");
	/* Checksum and size fields in other than the plain form. */
	const char *chks[] = {"", "       ", "0x12", "9", "12\0x"};
	for (size_t i = 0; i < sizeof chks / sizeof chks[0]; i++) {
		memcpy(c, b, len);
		memset(c + h1 + 148, 0, 8);
		memcpy(c + h1 + 148, chks[i], i == 4 ? 4 : strlen(chks[i]));
		r = scan(c, len, 0, m, 16, &n, &next);
		CHECK(r == KYLIX_TAR_OTHER && n == 1, "checksum field %zu", i);
	}
	const char *sizes[] = {"+0000000012", "0000000001x", "00000000019", "\0 12"};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		memcpy(c, b, len);
		memset(c + h1 + 124, 0, 12);
		memcpy(c + h1 + 124, sizes[i], i == 3 ? 4 : strlen(sizes[i]));
		tar_resum(c + h1);
		r = scan(c, len, 0, m, 16, &n, &next);
		CHECK(r == KYLIX_TAR_OTHER && n == 1, "size field %zu: r %d n %zu", i, r, n);
	}
	/* Plain forms: leading spaces, trailing NULs and spaces, no digits. */
	memcpy(c, b, len);
	memcpy(c + h0 + 124, "  12 \0\0 \0\0\0\0", 12);
	tar_resum(c + h0);
	r = scan(c, len, 0, m, 1, &n, &next);
	CHECK(r == KYLIX_TAR_FULL && n == 1 && m[0].size == 10, "size ' 12 ': %llu", (unsigned long long)m[0].size);
	memset(c + h1 + 124, 0, 12);
	tar_resum(c + h1);
	r = scan(c + h1, 512, h1, m, 1, &n, &next);
	CHECK(r == KYLIX_TAR_FULL && n == 1 && m[0].size == 0, "size field of NULs is 0");

	/* Not ustar (v7, no magic), and the headers the caller parses itself. */
	size_t l2 = 0;
	tar_add(c, &l2, "x.bin", 1, '0');
	size_t o = l2;
	tar_put(c + l2, "y.bin", NULL, 1, '0', TAR_V7, false);
	l2 += 1024;
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_OTHER && n == 1 && next == o, "v7 header");
	const char others[] = {'x', 'g', 'L'};
	for (size_t i = 0; i < sizeof others; i++) {
		l2 = 0;
		tar_add(c, &l2, "x.bin", 1, '0');
		o = tar_add(c, &l2, "././@LongLink", 300, others[i]);
		tar_add(c, &l2, "y.bin", 1, '0');
		r = scan(c, l2, 0, m, 16, &n, &next);
		CHECK(r == KYLIX_TAR_OTHER && n == 1 && next == o, "type %c", others[i]);
	}
	/* Other types are members (skipped whole by the caller); a directory
	 * between two files of one key does not break their SAME_KEY. */
	l2 = 0;
	tar_add(c, &l2, "k/1.a", 3, '0');
	tar_add(c, &l2, "k/1.d", 1500, '5');
	tar_add(c, &l2, "k/1.b", 3, '0');
	tar_add(c, &l2, "k/1.lnk", 0, '2');
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 4 && next == l2, "other types: r %d n %zu", r, n);
	CHECK(m[1].type == '5' && m[1].next_offset == 512 + 512 + 512 + 1536 && m[1].flags == 0, "directory");
	CHECK(m[2].flags == KYLIX_TAR_SAME_KEY && m[3].flags == 0, "same key over a directory");

	/* Base-256 sizes. */
	l2 = 0;
	tar_put(c, "big.bin", NULL, 1000, '0', TAR_POSIX, true);
	memset(c + 512, 0, 1024);
	l2 = 1536;
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 1 && m[0].size == 1000 && next == 1536, "base-256 size");
	memset(c + 125, 0, 11);
	c[125] = 1; /* 2^80 */
	tar_resum(c);
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_OTHER && n == 0, "base-256 size of 2^80");
	tar_put(c, "neg.bin", NULL, 0, '0', TAR_POSIX, false);
	memset(c + 124, 0xff, 12);
	tar_resum(c);
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_OTHER && n == 0, "negative base-256 size");
	/* A size that is plain but larger than any window. */
	tar_put(c, "huge.bin", NULL, 077777777777ull, '0', TAR_POSIX, false);
	r = scan(c, l2, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 0 && next == 0, "huge member");

	/* Names: prefix (POSIX only), dots, slashes, 100 bytes without NUL. */
	struct {
		const char *name, *prefix;
		int magic;
		size_t name_len, prefix_len, key_len;
	} names[] = {
		{"x.tar.gz", "long/dir", TAR_POSIX, 8, 8, 1},
		{"x.tar.gz", "long/dir", TAR_GNU, 8, 0, 1},
		{".hidden", NULL, TAR_POSIX, 7, 0, 7},
		{"d/.hidden.x", NULL, TAR_POSIX, 11, 0, 11},
		{"dir.d/file", NULL, TAR_POSIX, 10, 0, 10},
		{"a/b.", NULL, TAR_POSIX, 4, 0, 3},
		{"noext", NULL, TAR_POSIX, 5, 0, 5},
		{"trailing/", NULL, TAR_POSIX, 9, 0, 9},
		{"", "pre", TAR_POSIX, 0, 3, 0},
		{"n\xc3\xa9.\xff", NULL, TAR_POSIX, 5, 0, 3},
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		tar_put(c, names[i].name, names[i].prefix, 0, '0', names[i].magic, false);
		if (names[i].magic == TAR_GNU) { /* GNU keeps other fields there */
			memcpy(c + 345, "12345670123", 11);
			tar_resum(c);
		}
		r = scan(c, 512, 0, m, 16, &n, &next);
		CHECK(r == KYLIX_TAR_MORE && n == 1 && m[0].name_len == names[i].name_len &&
		          m[0].prefix_len == names[i].prefix_len && m[0].key_len == names[i].key_len,
		      "name %zu %s: n %zu name %llu prefix %llu key %llu", i, names[i].name, n,
		      (unsigned long long)m[0].name_len, (unsigned long long)m[0].prefix_len,
		      (unsigned long long)m[0].key_len);
	}
	char long_name[101];
	memset(long_name, 'n', 100);
	long_name[100] = 0;
	long_name[50] = '.';
	tar_put(c, long_name, NULL, 0, '0', TAR_POSIX, false);
	memset(c + 345, 'p', 155);
	tar_resum(c);
	r = scan(c, 512, 0, m, 16, &n, &next);
	CHECK(r == KYLIX_TAR_MORE && n == 1 && m[0].name_len == 100 && m[0].prefix_len == 155 && m[0].key_len == 50,
	      "100-byte name, 155-byte prefix");
	/* Same key: prefixes differ, so keys differ. */
	tar_put(c, "k.a", "p1", 0, '0', TAR_POSIX, false);
	tar_put(c + 512, "k.b", "p2", 0, '0', TAR_POSIX, false);
	tar_put(c + 1024, "k.c", "p2", 0, '0', TAR_POSIX, false);
	r = scan(c, 1536, 0, m, 16, &n, &next);
	CHECK(n == 3 && m[1].flags == 0 && m[2].flags == KYLIX_TAR_SAME_KEY, "same key with prefixes");

	/* Arguments. */
	CHECK(kylix_tar_scan(b, len, 0, m, 16, NULL, &next) == -EINVAL, "NULL n_out");
	CHECK(kylix_tar_scan(b, len, 0, m, 16, &n, NULL) == -EINVAL, "NULL next_off");
	CHECK(kylix_tar_scan(b, len, 0, NULL, 16, &n, &next) == -EINVAL, "NULL out");
	CHECK(kylix_tar_scan(b, len, 0, m, 0, &n, &next) == -EINVAL, "max 0");
	CHECK(kylix_tar_scan(NULL, 512, 0, m, 16, &n, &next) == -EINVAL, "NULL buf");
	CHECK(kylix_tar_scan(b, len, UINT64_MAX - 100, m, 16, &n, &next) == -EINVAL, "base + len wraps");
	CHECK(*kylix_last_error() != 0, "a message for -EINVAL");
	free(c);
	free(b);
}

/* tar_check verifies what kylix_tar_scan returned on buf against kylix.h's
 * contract, recomputing every field from the bytes. */
static void tar_check(const unsigned char *buf, size_t len, uint64_t base, size_t max, int r,
                      const kylix_tar_member *m, size_t n, uint64_t next, long it)
{
	CHECK(r >= KYLIX_TAR_MORE && r <= KYLIX_TAR_OTHER, "tarfuzz %ld: r %d", it, r);
	CHECK(n <= max, "tarfuzz %ld: n %zu > max %zu", it, n, max);
	CHECK(next >= base && next - base <= len, "tarfuzz %ld: next outside the window", it);
	uint64_t at = base;
	size_t prev_reg = SIZE_MAX;
	for (size_t i = 0; i < n && i <= max; i++) {
		const kylix_tar_member *t = &m[i];
		CHECK(t->header_offset == at, "tarfuzz %ld: member %zu not where the last ended", it, i);
		CHECK(t->data_offset == at + 512 && t->next_offset >= t->data_offset + t->size &&
		          t->next_offset - t->data_offset - t->size < 512 && (t->next_offset - at) % 512 == 0,
		      "tarfuzz %ld: member %zu offsets", it, i);
		CHECK(t->next_offset - base <= len, "tarfuzz %ld: member %zu past the window", it, i);
		if (failures)
			return;
		const unsigned char *h = buf + (t->header_offset - base);
		unsigned sum = 8 * ' ';
		for (int k = 0; k < 512; k++)
			if (k < 148 || k >= 156)
				sum += h[k];
		uint64_t chk = 0;
		for (int k = 148; k < 156 && h[k] >= '0' && h[k] <= '7'; k++)
			chk = chk * 8 + (uint64_t)(h[k] - '0');
		int k0 = 148;
		while (h[k0] == ' ')
			k0++;
		chk = 0;
		for (int k = k0; k < 156 && h[k] >= '0' && h[k] <= '7'; k++)
			chk = chk * 8 + (uint64_t)(h[k] - '0');
		CHECK(chk == sum, "tarfuzz %ld: member %zu checksum %llu, sum %u", it, i, (unsigned long long)chk, sum);
		CHECK(t->type != 'x' && t->type != 'g' && t->type != 'L' && t->type == h[156], "tarfuzz %ld: type", it);
		bool posix = memcmp(h + 257, "ustar\0", 6) == 0;
		CHECK(posix || memcmp(h + 257, "ustar  \0", 8) == 0, "tarfuzz %ld: magic", it);
		size_t nl = strnlen((const char *)h, 100);
		size_t pl = posix ? strnlen((const char *)h + 345, 155) : 0;
		CHECK(t->name_len == nl && t->prefix_len == pl, "tarfuzz %ld: name lengths", it);
		size_t bs = 0, kl = nl;
		for (size_t k = 0; k < nl; k++)
			if (h[k] == '/')
				bs = k + 1;
		for (size_t k = bs + 1; k < nl && h[bs] != '.'; k++) /* ".x": all key */
			if (h[k] == '.') {
				kl = k;
				break;
			}
		CHECK(t->key_len == kl, "tarfuzz %ld: key_len %llu, want %zu", it, (unsigned long long)t->key_len, kl);
		bool reg = t->type == '0' || t->type == 0;
		bool same = false;
		if (reg && prev_reg != SIZE_MAX) {
			const kylix_tar_member *p = &m[prev_reg];
			const unsigned char *ph = buf + (p->header_offset - base);
			same = p->key_len == kl && p->prefix_len == pl && memcmp(ph, h, kl) == 0 &&
			       memcmp(ph + 345, h + 345, pl) == 0;
		}
		CHECK(t->flags == (same ? KYLIX_TAR_SAME_KEY : 0u) && t->reserved == 0, "tarfuzz %ld: flags", it);
		if (reg)
			prev_reg = i;
		at = t->next_offset;
	}
	CHECK(next == at, "tarfuzz %ld: next %llu, last member ends at %llu", it, (unsigned long long)next,
	      (unsigned long long)at);
	size_t pos = (size_t)(next - base);
	if (r == KYLIX_TAR_END) {
		static const unsigned char zero[512];
		CHECK(len - pos >= 512 && memcmp(buf + pos, zero, 512) == 0, "tarfuzz %ld: END not at zeros", it);
	}
	if (r == KYLIX_TAR_OTHER)
		CHECK(len - pos >= 512, "tarfuzz %ld: OTHER past the window", it);
	if (r == KYLIX_TAR_FULL)
		CHECK(n == max, "tarfuzz %ld: FULL with %zu of %zu", it, n, max);
}

/* tarfuzz: random tar files (names with dots and slashes, prefixes, both
 * magics, base-256 sizes, PAX and long-name headers, other types), then
 * random mutations of their bytes, windows and max: kylix_tar_scan must
 * return only what tar_check accepts, and never read outside the window
 * (each window is a malloc of exactly its length, for ASan). */
static int tarfuzz(long iters)
{
	enum { CAP = 1 << 17 };
	unsigned char *b = malloc(CAP);
	kylix_tar_member m[64];
	long members = 0;
	for (long it = 0; it < iters && failures <= 10; it++) {
		size_t len = 0;
		int nm = 1 + (int)(rnd() % 12);
		for (int i = 0; i < nm && len + 8192 < CAP; i++) {
			char name[120], prefix[40];
			int nl = (int)(rnd() % 24);
			for (int k = 0; k < nl; k++)
				name[k] = "ab./0.x./"[rnd() % 9];
			name[nl] = 0;
			if (rnd() % 16 == 0) {
				memset(name, 'q', 100);
				name[100] = 0;
			}
			int pl = (int)(rnd() % 4 == 0 ? rnd() % 12 : 0);
			for (int k = 0; k < pl; k++)
				prefix[k] = "pd/."[rnd() % 4];
			prefix[pl] = 0;
			uint64_t size = rnd() % 4 == 0 ? 0 : rnd() % 3000;
			char type = "0000000\0\0" "5x2LgK"[rnd() % 15];
			int magic = rnd() % 8 == 0 ? TAR_GNU : TAR_POSIX;
			tar_put(b + len, name, pl ? prefix : NULL, size, type, magic, rnd() % 8 == 0);
			size_t pad = (size_t)(size + 511) / 512 * 512;
			for (size_t k = 0; k < pad; k++)
				b[len + 512 + k] = k < size ? (unsigned char)rnd() : 0;
			len += 512 + pad;
		}
		if (rnd() % 2) {
			memset(b + len, 0, 1024);
			len += 1024;
		}
		int muts = (int)(rnd() % 4);
		for (int k = 0; k < muts; k++) {
			size_t pos = rnd() % len;
			if (rnd() % 2)
				pos = pos / 512 * 512 + (rnd() % 2 ? 124 + rnd() % 12 : 148 + rnd() % 8);
			if (pos >= len)
				continue;
			switch (rnd() % 4) {
			case 0: b[pos] ^= (unsigned char)(1u << (rnd() % 8)); break;
			case 1: b[pos] = (unsigned char)rnd(); break;
			case 2: b[pos] = " 0\0" "7"[rnd() % 4]; break;
			default: tar_resum(b + pos / 512 * 512); break; /* a valid sum over whatever is there */
			}
		}
		size_t start = rnd() % 4 == 0 ? (rnd() % len) / 512 * 512 : 0;
		size_t wl = len - start;
		if (rnd() % 2)
			wl = rnd() % (wl + 1);
		size_t max = 1 + rnd() % 64;
		uint64_t base = rnd() % 2 ? start : rnd() >> 2;
		unsigned char *w = malloc(wl ? wl : 1);
		memcpy(w, b + start, wl);
		size_t n = 0;
		uint64_t next = 0;
		int r = kylix_tar_scan(wl ? w : NULL, wl, base, m, max, &n, &next);
		tar_check(w, wl, base, max, r, m, n, next, it);
		members += (long)n;
		free(w);
	}
	printf("tarfuzz: %ld windows, %ld members, %d failures\n", iters, members, failures);
	free(b);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "unit") == 0) {
		test_parser();
		test_fake_node();
		test_tar();
		printf("unit: %d failures\n", failures);
		return failures ? 1 : 0;
	}
	if (argc >= 3 && strcmp(argv[1], "fuzz") == 0)
		return fuzz(atol(argv[2]), argc - 3, argv + 3);
	if (argc == 3 && strcmp(argv[1], "tarfuzz") == 0)
		return tarfuzz(atol(argv[2]));
	if (argc == 3 && strcmp(argv[1], "dump") == 0)
		return dump(argv[2]);
	if (argc >= 4 && strcmp(argv[1], "mount") == 0)
		return mount_test(argc - 2, argv + 2);
	fprintf(stderr, "usage: ctest unit | fuzz N [FILE...] | tarfuzz N | dump FILE | mount [--pack DST]... SRC DST...\n");
	return 2;
}
