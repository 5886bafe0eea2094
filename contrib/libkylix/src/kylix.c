/*
 * kylix.c - files, reads (pack and FUSE paths), the client socket and
 * errors. See kylix.h for the API and docs/design/libkylix.md for why.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- errors ---- */

static _Thread_local char last_error[512];

int kx_seterr(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	return err;
}

void kx_clearerr(void)
{
	last_error[0] = '\0';
}

const char *kylix_last_error(void)
{
	return last_error;
}

const char *kylix_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0: return "success";
	case EBADMSG: return "malformed data (not a valid safetensors header or node reply)";
	case ENOTSUP: return "not supported here (not a Kylix file, or the node has no client socket)";
	case ENODEV: return "no GPU or driver on the node";
	case EBUSY: return "the file is being written";
	case EPROTO: return "protocol error talking to the node";
	default: break;
	}
	/* strerror_r's GNU form returns a pointer that may be a static string;
	 * sys_errlist is gone, so keep a small thread-local copy. */
	static _Thread_local char buf[128];
	const char *s = strerror_r(err, buf, sizeof buf);
	return s ? s : "unknown error";
}

uint64_t kx_generation(const struct stat *st)
{
	uint64_t v[5] = {(uint64_t)st->st_dev, (uint64_t)st->st_ino, (uint64_t)st->st_size,
	                 (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec,
	                 (uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec};
	uint64_t h = UINT64_C(14695981039346656037);
	for (int i = 0; i < 5; i++)
		for (int b = 0; b < 8; b++) {
			h ^= (v[i] >> (8 * b)) & 0xff;
			h *= UINT64_C(1099511628211);
		}
	return h ? h : 1;
}

int kylix_abi_version(void)
{
	return KYLIX_ABI_VERSION;
}

/* ---- files ---- */

/* A pack handed out by the node: whole-file, so file offset == pack offset. */
struct pack {
	int fd;
	uint64_t size;
	uint64_t generation; /* the node's; fstat of fd must still give it */
	int dfd;             /* the same pack opened O_DIRECT, or -1 */
	void *map;           /* a read-only mapping, only for mincore; or NULL */
};

/* How pack bytes are read (KYLIX_PACK_IO): as gpuio's IOAuto, aligned large
 * reads of data mostly not in the page cache go O_DIRECT, the rest through
 * the page cache. */
enum pack_io { IO_AUTO, IO_BUFFERED, IO_DIRECT };
#define KX_DIRECT_ALIGN 4096u
#define KX_DIRECT_MIN   (256u << 10)

_Atomic unsigned long long kx_direct_bytes;

static enum pack_io pack_io_mode(void)
{
	const char *e = getenv("KYLIX_PACK_IO");
	if (e && strcmp(e, "buffered") == 0)
		return IO_BUFFERED;
	if (e && strcmp(e, "direct") == 0)
		return IO_DIRECT;
	return IO_AUTO;
}

static void pack_release(struct pack *p)
{
	close(p->fd);
	if (p->dfd >= 0)
		close(p->dfd);
	if (p->map)
		munmap(p->map, (size_t)p->size);
}

/* packset is what one process got for a file; shared by concurrent readers
 * through a reference count, so no lock is held during pread. */
struct packset {
	atomic_int refs;
	int n;
	struct pack packs[KX_MAX_FDS];
};

struct kylix_file {
	int fd;
	uint64_t size;
	bool kylix;
	bool no_packs;         /* KYLIX_NO_PACKS at open */
	enum pack_io io;       /* KYLIX_PACK_IO at open */
	char sock_path[240];

	pthread_mutex_t mu;     /* guards everything below */
	pid_t pid;              /* the process the pack state belongs to */
	bool asked;             /* the node was asked for packs in this process */
	struct packset *packs;  /* NULL when none */
	kylix_header *header;   /* parsed once */
	kylix_read_info stats;
	struct kylix_file *next, *prev; /* the open-file list, for fork */
};

/* Every open file, so that fork can take every file's lock (pthread_atfork):
 * a child must not inherit a mutex some other thread held at fork. */
static pthread_mutex_t files_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kylix_file *files;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void prepare_fork(void)
{
	pthread_mutex_lock(&files_mu);
	for (struct kylix_file *f = files; f; f = f->next)
		pthread_mutex_lock(&f->mu);
}

static void after_fork(void)
{
	for (struct kylix_file *f = files; f; f = f->next)
		pthread_mutex_unlock(&f->mu);
	pthread_mutex_unlock(&files_mu);
}

static void install_atfork(void)
{
	pthread_atfork(prepare_fork, after_fork, after_fork);
}

static void packset_put(struct packset *ps)
{
	if (!ps)
		return;
	if (atomic_fetch_sub(&ps->refs, 1) != 1)
		return;
	for (int i = 0; i < ps->n; i++)
		pack_release(&ps->packs[i]);
	free(ps);
}

/* check_pid makes the pack state belong to this process: in a forked child
 * the inherited pack fds are closed and the node is asked again. The
 * references parent threads held do not exist in the child, so the set is
 * closed outright. Called with f->mu held. */
static void check_pid(struct kylix_file *f)
{
	pid_t me = getpid();
	if (f->pid == me)
		return;
	if (f->packs) {
		for (int i = 0; i < f->packs->n; i++)
			pack_release(&f->packs->packs[i]);
		free(f->packs);
		f->packs = NULL;
	}
	f->asked = false;
	f->pid = me;
}

int kylix_is_kylix_fd(int fd)
{
	struct kx_probe p;
	memset(&p, 0, sizeof p);
	if (ioctl(fd, KX_IOC_PROBE, &p) != 0) {
		int e = errno;
		switch (e) {
		case ENOTTY: case EINVAL: case ENOSYS: case EOPNOTSUPP: case EFAULT: case EPERM:
		case EACCES:
			return 0;
		default:
			return kx_seterr(-e, "KYLIX_IOC_PROBE: %s", strerror(e));
		}
	}
	return p.magic == KX_LAYOUT_MAGIC ? 1 : 0;
}

static bool no_packs_env(void)
{
	const char *e = getenv("KYLIX_NO_PACKS");
	return e && e[0] && strcmp(e, "0") != 0;
}

int kylix_open(const char *path, kylix_file **out)
{
	kx_clearerr();
	if (!path || !out)
		return kx_seterr(-EINVAL, "kylix_open: NULL argument");
	*out = NULL;
	pthread_once(&atfork_once, install_atfork);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return kx_seterr(-e, "open %s: %s", path, strerror(e));
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return kx_seterr(-e, "stat %s: %s", path, strerror(e));
	}
	if (S_ISDIR(st.st_mode)) {
		close(fd);
		return kx_seterr(-EISDIR, "%s is a directory", path);
	}
	struct kylix_file *f = calloc(1, sizeof *f);
	if (!f) {
		close(fd);
		return kx_seterr(-ENOMEM, "kylix_open: out of memory");
	}
	f->fd = fd;
	f->size = (uint64_t)st.st_size;
	f->pid = getpid();
	/* The environment is read here, once: getenv on every read would race
	 * with a setenv elsewhere in the process. */
	f->no_packs = no_packs_env();
	f->io = pack_io_mode();
	pthread_mutex_init(&f->mu, NULL);
	struct kx_probe p;
	memset(&p, 0, sizeof p);
	if (S_ISREG(st.st_mode) && ioctl(fd, KX_IOC_PROBE, &p) == 0 && p.magic == KX_LAYOUT_MAGIC) {
		f->kylix = true;
		p.client_socket[sizeof p.client_socket - 1] = '\0';
		memcpy(f->sock_path, p.client_socket, sizeof f->sock_path);
	}
	pthread_mutex_lock(&files_mu);
	f->next = files;
	if (files)
		files->prev = f;
	files = f;
	pthread_mutex_unlock(&files_mu);
	*out = f;
	return 0;
}

void kylix_close(kylix_file *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&files_mu);
	if (f->prev)
		f->prev->next = f->next;
	else
		files = f->next;
	if (f->next)
		f->next->prev = f->prev;
	pthread_mutex_unlock(&files_mu);
	pthread_mutex_lock(&f->mu);
	check_pid(f);
	packset_put(f->packs);
	f->packs = NULL;
	pthread_mutex_unlock(&f->mu);
	pthread_mutex_destroy(&f->mu);
	kylix_free_header(f->header);
	close(f->fd);
	free(f);
}

int64_t kylix_size(const kylix_file *f)
{
	return f ? (int64_t)f->size : -EINVAL;
}

int kylix_fd(const kylix_file *f)
{
	return f ? f->fd : -EINVAL;
}

int kylix_is_kylix(const kylix_file *f)
{
	return f ? (int)f->kylix : -EINVAL;
}

void kx_test_set_socket(kylix_file *f, const char *path)
{
	pthread_mutex_lock(&f->mu);
	f->kylix = true;
	snprintf(f->sock_path, sizeof f->sock_path, "%s", path);
	pthread_mutex_unlock(&f->mu);
}

/* ---- the client socket ---- */

static atomic_uint next_seq = 1;

/* kx_connect_node opens a new connection to the node's client socket. Connections are
 * per call: nothing is shared between threads or across fork. */
int kx_connect_node(const char *sock_path)
{
	if (!sock_path[0])
		return kx_seterr(-ENOTSUP, "the node serves no client socket");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(sock_path) >= sizeof sa.sun_path)
		return kx_seterr(-ENAMETOOLONG, "client socket path too long");
	strcpy(sa.sun_path, sock_path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return kx_seterr(-errno, "socket: %s", strerror(errno));
	/* A node that hangs must not hang the caller forever. */
	struct timeval tv = {.tv_sec = 120};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
		int e = errno;
		close(s);
		return kx_seterr(-e, "connect %s: %s", sock_path, strerror(e));
	}
	return s;
}

/*
 * exchange sends one request (header + body, with fd attached) and receives
 * the reply into rbuf. Received fds (close-on-exec) go to fds[0..*nfds);
 * the caller owns them. Returns the reply body length or a negative errno.
 */
ssize_t kx_exchange(int s, uint16_t op, const void *body, uint32_t body_len, int fd,
                    void *rbuf, size_t rcap, int *fds, int *nfds)
{
	struct kx_msg_header h = {KX_CLIENT_MAGIC, KX_CLIENT_VERSION, op, atomic_fetch_add(&next_seq, 1), body_len};
	struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, body_len}};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * KX_MAX_FDS)];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = body_len ? 2 : 1,
	                   .msg_control = cm.buf, .msg_controllen = CMSG_SPACE(sizeof(int))};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	ssize_t r;
	do
		r = sendmsg(s, &m, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return kx_seterr(-errno, "send to the node: %s", strerror(errno));

	struct kx_msg_header rh;
	struct iovec riov[2] = {{&rh, sizeof rh}, {rbuf, rcap}};
	memset(&cm, 0, sizeof cm);
	struct msghdr rm = {.msg_iov = riov, .msg_iovlen = 2, .msg_control = cm.buf,
	                    .msg_controllen = sizeof cm.buf};
	do
		r = recvmsg(s, &rm, MSG_CMSG_CLOEXEC);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return kx_seterr(-errno, "receive from the node: %s", strerror(errno));
	/* Collect fds first so that every path below can close them. */
	*nfds = 0;
	for (c = CMSG_FIRSTHDR(&rm); c; c = CMSG_NXTHDR(&rm, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int got;
			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
			if (*nfds < KX_MAX_FDS)
				fds[(*nfds)++] = got;
			else
				close(got);
		}
	}
	int err = 0;
	if (r == 0)
		err = kx_seterr(-EPIPE, "the node closed the connection");
	else if (rm.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		err = kx_seterr(-EPROTO, "the node's reply was larger than expected");
	else if ((size_t)r < sizeof rh)
		err = kx_seterr(-EPROTO, "short reply from the node");
	else if (rh.magic != KX_CLIENT_MAGIC || rh.version != KX_CLIENT_VERSION)
		err = kx_seterr(-EPROTO, "reply from the node has a bad magic or version");
	else if (rh.op != (op | KX_REPLY_BIT) || rh.seq != h.seq)
		err = kx_seterr(-EPROTO, "reply from the node answers another request");
	else if (rh.body_len != (size_t)r - sizeof rh)
		err = kx_seterr(-EPROTO, "reply body_len does not match the datagram");
	if (err) {
		for (int i = 0; i < *nfds; i++)
			close(fds[i]);
		*nfds = 0;
		return err;
	}
	return (ssize_t)rh.body_len;
}

/* reply_status checks the status part of a reply body; on success *fields
 * points after the message. A failure's message goes to kylix_last_error. */
int kx_reply_status(const char *what, const unsigned char *body, size_t len,
                    const unsigned char **fields, size_t *flen)
{
	struct kx_reply_status st;
	if (len < sizeof st)
		return kx_seterr(-EPROTO, "%s: reply too short", what);
	memcpy(&st, body, sizeof st);
	if (st.msg_len > len - sizeof st)
		return kx_seterr(-EPROTO, "%s: reply message runs past the reply", what);
	if (st.status > 0 || st.status < -4095)
		return kx_seterr(-EPROTO, "%s: reply has a bad status %d", what, st.status);
	if (st.status != 0) {
		int n = st.msg_len > 400 ? 400 : (int)st.msg_len;
		return kx_seterr(st.status, "%s: the node says: %.*s", what, n, (const char *)body + sizeof st);
	}
	*fields = body + sizeof st + st.msg_len;
	*flen = len - sizeof st - st.msg_len;
	return 0;
}

/*
 * ask_packs asks the node (op PACKS) for f's whole-file packs. Every pack fd
 * is checked before it is kept: the entry says whole-file and checked, its
 * size is the file's, and fstat of the fd agrees with the entry. Anything
 * else is closed and counted as a fallback. Called with f->mu held (one
 * request per process, not one per thread).
 */
static struct packset *ask_packs(struct kylix_file *f, const char *sock_path, uint64_t *rejected)
{
	int s = kx_connect_node(sock_path);
	if (s < 0)
		return NULL;
	unsigned char rbuf[4096];
	int fds[KX_MAX_FDS], nfds = 0;
	ssize_t r = kx_exchange(s, KX_OP_PACKS, NULL, 0, f->fd, rbuf, sizeof rbuf, fds, &nfds);
	close(s);
	if (r < 0)
		return NULL;
	const unsigned char *fl;
	size_t flen;
	struct packset *ps = NULL;
	uint32_t n = 0;
	if (kx_reply_status("PACKS", rbuf, (size_t)r, &fl, &flen) != 0)
		goto out;
	if (flen < 4) {
		kx_seterr(-EPROTO, "PACKS: reply too short");
		goto out;
	}
	memcpy(&n, fl, 4);
	if (n > KX_MAX_FDS || flen != 4 + (size_t)n * sizeof(struct kx_pack_entry) || (int)n != nfds) {
		kx_seterr(-EPROTO, "PACKS: reply has %u entries in %zu bytes with %d fds", n, flen, nfds);
		*rejected += n;
		goto out;
	}
	ps = calloc(1, sizeof *ps);
	if (!ps)
		goto out;
	atomic_init(&ps->refs, 1);
	for (uint32_t i = 0; i < n; i++) {
		struct kx_pack_entry e;
		memcpy(&e, fl + 4 + i * sizeof e, sizeof e);
		struct stat st;
		bool ok = (e.flags & (KX_PACK_WHOLE_FILE | KX_PACK_CHECKED)) == (KX_PACK_WHOLE_FILE | KX_PACK_CHECKED) &&
		          e.size == f->size && fstat(fds[i], &st) == 0 && S_ISREG(st.st_mode) &&
		          (uint64_t)st.st_size == e.size && kx_generation(&st) == e.generation &&
		          (fcntl(fds[i], F_GETFL) & O_ACCMODE) == O_RDONLY;
		if (!ok) {
			(*rejected)++;
			close(fds[i]);
			fds[i] = -1;
			continue;
		}
		struct pack *p = &ps->packs[ps->n++];
		p->fd = fds[i];
		fds[i] = -1;
		p->size = e.size;
		p->generation = e.generation;
		p->dfd = -1;
		p->map = NULL;
		enum pack_io mode = f->io;
		if (mode != IO_BUFFERED) {
			/* O_DIRECT needs its own open file description: reopen the
			 * received fd through /proc (a fresh open, so it works where the
			 * caller may open the pack: the node's user). Must be the same
			 * inode; else (or where O_DIRECT is unsupported) page cache. */
			char proc[64];
			snprintf(proc, sizeof proc, "/proc/self/fd/%d", p->fd);
			int d = open(proc, O_RDONLY | O_DIRECT | O_CLOEXEC);
			struct stat dst;
			if (d >= 0 && (fstat(d, &dst) != 0 || dst.st_dev != st.st_dev || dst.st_ino != st.st_ino)) {
				close(d);
				d = -1;
			}
			p->dfd = d;
		}
		if (mode == IO_AUTO && p->dfd >= 0 && e.size > 0 && e.size <= SIZE_MAX) {
			void *m = mmap(NULL, (size_t)e.size, PROT_READ, MAP_SHARED, p->fd, 0);
			p->map = m == MAP_FAILED ? NULL : m;
			if (!p->map) {
				close(p->dfd);
				p->dfd = -1;
			}
		}
	}
	nfds = 0;
out:
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (ps && ps->n == 0) {
		free(ps);
		ps = NULL;
	}
	return ps;
}


/* get_packs returns a reference to f's pack set in this process, asking the
 * node once per process; NULL when there is none. */
static struct packset *get_packs(struct kylix_file *f, uint64_t *fallbacks)
{
	pthread_mutex_lock(&f->mu);
	check_pid(f);
	if (!f->kylix || !f->sock_path[0] || f->no_packs) {
		pthread_mutex_unlock(&f->mu);
		return NULL;
	}
	if (!f->asked) {
		/* Ask under the lock: one request per process, not one per thread.
		 * The saved message keeps a failed ask from showing as this read's
		 * error (the read itself succeeds through the mount). */
		char saved[sizeof last_error];
		memcpy(saved, last_error, sizeof saved);
		uint64_t rejected = 0;
		f->packs = ask_packs(f, f->sock_path, &rejected);
		*fallbacks += rejected; /* kylix_pread adds them to f->stats */
		memcpy(last_error, saved, sizeof saved);
		f->asked = true;
	}
	struct packset *ps = f->packs;
	if (ps)
		atomic_fetch_add(&ps->refs, 1);
	pthread_mutex_unlock(&f->mu);
	return ps;
}

/* drop_packs forgets ps (a pack failed a check): later reads use the mount. */
static void drop_packs(struct kylix_file *f, struct packset *ps)
{
	pthread_mutex_lock(&f->mu);
	if (f->packs == ps) {
		f->packs = NULL;
		packset_put(ps); /* the file's own reference */
	}
	pthread_mutex_unlock(&f->mu);
}


/* resident says whether most of [off, off+n) of pack p is in the page cache. */
static bool resident(const struct pack *p, uint64_t off, size_t n)
{
	static size_t page;
	if (!page)
		page = (size_t)sysconf(_SC_PAGESIZE);
	uint64_t start = off & ~(uint64_t)(page - 1);
	size_t len = (size_t)(off + n - start);
	size_t pages = (len + page - 1) / page;
	unsigned char small[1024];
	unsigned char *vec = pages <= sizeof small ? small : malloc(pages);
	if (!vec)
		return true;
	bool res = true;
	if (mincore((char *)p->map + start, len, vec) == 0) {
		size_t in = 0;
		for (size_t i = 0; i < pages; i++)
			in += vec[i] & 1;
		res = in * 2 >= pages;
	}
	if (vec != small)
		free(vec);
	return res;
}

/* read_full preads until n bytes, EOF or an error. */
static ssize_t read_full(int fd, unsigned char *buf, size_t n, uint64_t off)
{
	size_t done = 0;
	while (done < n) {
		size_t want = n - done;
		if (want > (size_t)SSIZE_MAX)
			want = (size_t)SSIZE_MAX;
		ssize_t r = pread(fd, buf + done, want, (off_t)(off + done));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

ssize_t kylix_pread(kylix_file *f, void *buf, size_t n, uint64_t off, kylix_read_info *info)
{
	kx_clearerr();
	kylix_read_info ri;
	memset(&ri, 0, sizeof ri);
	if (info)
		*info = ri;
	if (!f || (!buf && n))
		return kx_seterr(-EINVAL, "kylix_pread: NULL argument");
	if (off > INT64_MAX)
		return kx_seterr(-EINVAL, "kylix_pread: offset beyond 2^63");
	if (off >= f->size)
		n = 0;
	else if (n > f->size - off)
		n = (size_t)(f->size - off);
	size_t done = 0;
	if (n > 0) {
		struct packset *ps = get_packs(f, &ri.pack_fallbacks);
		if (ps) {
			struct pack *p = &ps->packs[0];
			struct stat st;
			ssize_t r = -1;
			/* The pack must still be in the state the node checked (the
			 * passthrough rule): a pack written to since is not read. */
			if (fstat(p->fd, &st) == 0 && kx_generation(&st) == p->generation) {
				/* The aligned head of a large aligned read of data not in the
				 * page cache: O_DIRECT; a direct read that fails is retried
				 * through the page cache. */
				size_t dn = 0;
				if (p->dfd >= 0 && n >= KX_DIRECT_MIN && off % KX_DIRECT_ALIGN == 0 &&
				    (uintptr_t)buf % KX_DIRECT_ALIGN == 0) {
					dn = n & ~(size_t)(KX_DIRECT_ALIGN - 1);
					if (p->map && resident(p, off, dn))
						dn = 0;
				}
				ssize_t d = dn ? read_full(p->dfd, buf, dn, off) : 0;
				if (d < 0)
					d = 0;
				atomic_fetch_add(&kx_direct_bytes, (unsigned long long)d);
				r = read_full(p->fd, (unsigned char *)buf + d, n - (size_t)d, off + (uint64_t)d);
				if (r >= 0)
					r += d;
			}
			if (r > 0) {
				done = (size_t)r;
				ri.bytes_pack = done;
			}
			if (done < n) {
				/* Error, short pack or a changed pack: the mount for the rest. */
				ri.pack_fallbacks++;
				drop_packs(f, ps);
			}
			packset_put(ps);
		}
	}
	if (done < n) {
		ssize_t r = read_full(f->fd, (unsigned char *)buf + done, n - done, off + done);
		if (r < 0)
			return kx_seterr((int)r, "read at %llu: %s", (unsigned long long)(off + done), strerror((int)-r));
		ri.bytes_fuse = (uint64_t)r;
		done += (size_t)r;
	}
	ri.reads = 1;
	snprintf(ri.path, sizeof ri.path, "%s",
	         ri.bytes_pack && ri.bytes_fuse ? "mixed" : ri.bytes_pack ? "pack" : ri.bytes_fuse ? "fuse" : "none");
	pthread_mutex_lock(&f->mu);
	f->stats.bytes_pack += ri.bytes_pack;
	f->stats.bytes_fuse += ri.bytes_fuse;
	f->stats.pack_fallbacks += ri.pack_fallbacks;
	f->stats.reads++;
	pthread_mutex_unlock(&f->mu);
	if (info)
		*info = ri;
	return (ssize_t)done;
}

int kylix_stats(kylix_file *f, kylix_read_info *out)
{
	if (!f || !out)
		return kx_seterr(-EINVAL, "kylix_stats: NULL argument");
	pthread_mutex_lock(&f->mu);
	*out = f->stats;
	pthread_mutex_unlock(&f->mu);
	snprintf(out->path, sizeof out->path, "%s",
	         out->bytes_pack && out->bytes_fuse ? "mixed" : out->bytes_pack ? "pack" : out->bytes_fuse ? "fuse" : "none");
	return 0;
}

int kylix_packs(kylix_file *f)
{
	if (!f)
		return kx_seterr(-EINVAL, "kylix_packs: NULL argument");
	pthread_mutex_lock(&f->mu);
	check_pid(f);
	int n = f->packs ? f->packs->n : 0;
	pthread_mutex_unlock(&f->mu);
	return n;
}

int kylix_tensors(kylix_file *f, const kylix_header **out)
{
	kx_clearerr();
	if (!f || !out)
		return kx_seterr(-EINVAL, "kylix_tensors: NULL argument");
	*out = NULL;
	pthread_mutex_lock(&f->mu);
	kylix_header *h = f->header;
	pthread_mutex_unlock(&f->mu);
	if (h) {
		*out = h;
		return 0;
	}
	unsigned char pre[8];
	ssize_t r = read_full(f->fd, pre, 8, 0);
	if (r < 0)
		return kx_seterr((int)r, "read the safetensors header: %s", strerror((int)-r));
	if (r < 8)
		return kx_seterr(-EBADMSG, "safetensors: file is shorter than the 8-byte header length");
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | pre[i];
	if (hl == 0 || hl > KYLIX_MAX_HEADER_LEN || hl > f->size - 8)
		return kylix_parse_header(pre, 8, f->size, &h); /* for its message */
	unsigned char *b = malloc(8 + hl);
	if (!b)
		return kx_seterr(-ENOMEM, "kylix_tensors: out of memory");
	memcpy(b, pre, 8);
	r = read_full(f->fd, b + 8, hl, 8);
	if (r < 0) {
		free(b);
		return kx_seterr((int)r, "read the safetensors header: %s", strerror((int)-r));
	}
	int err = kylix_parse_header(b, 8 + (size_t)r, f->size, &h);
	free(b);
	if (err)
		return err;
	pthread_mutex_lock(&f->mu);
	if (f->header) { /* another thread won */
		kylix_free_header(h);
		h = f->header;
	} else {
		f->header = h;
	}
	pthread_mutex_unlock(&f->mu);
	*out = h;
	return 0;
}

/* ---- FILL ---- */

/* fill sends one FILL request: the single range (ranges == NULL) or n. */
static int fill(kylix_file *f, const void *ipc_handle64, int device, uint64_t dst_off, uint64_t file_off,
                uint64_t len, const kylix_range *ranges, uint32_t n, uint32_t flags, kylix_fill_info *info)
{
	if (info)
		memset(info, 0, sizeof *info);
	if (!f || !ipc_handle64 || (n && !ranges))
		return kx_seterr(-EINVAL, "kylix_fill_device: NULL argument");
	if (device < 0)
		return kx_seterr(-EINVAL, "kylix_fill_device: device %d is negative", device);
	if (flags & ~(KYLIX_FILL_VERIFY | KYLIX_FILL_STRICT))
		return kx_seterr(-EINVAL, "kylix_fill_device: unknown flags %#x", flags);
	if (ranges && (n == 0 || n > KYLIX_FILL_MAX_RANGES))
		return kx_seterr(-EINVAL, "kylix_fill_device_ranges: %u ranges (1..%d)", n, KYLIX_FILL_MAX_RANGES);
	for (uint32_t i = 0; i < (ranges ? n : 1); i++) {
		uint64_t o = ranges ? ranges[i].file_offset : file_off, l = ranges ? ranges[i].length : len;
		if (o > f->size || l > f->size - o)
			return kx_seterr(-EINVAL, "kylix_fill_device: range [%llu,+%llu) is outside the %llu-byte file",
			                 (unsigned long long)o, (unsigned long long)l, (unsigned long long)f->size);
	}
	char sock_path[sizeof f->sock_path];
	pthread_mutex_lock(&f->mu);
	bool kylix = f->kylix;
	memcpy(sock_path, f->sock_path, sizeof sock_path);
	pthread_mutex_unlock(&f->mu);
	if (!kylix)
		return kx_seterr(-ENOTSUP, "kylix_fill_device: the file is not on a Kylix mount");
	if (!sock_path[0])
		return kx_seterr(-ENOTSUP, "kylix_fill_device: the node serves no client socket");
	size_t body_len = sizeof(struct kx_fill_request) + (ranges ? (size_t)n * sizeof(kylix_range) : 0);
	unsigned char *body = calloc(1, body_len);
	if (!body)
		return kx_seterr(-ENOMEM, "kylix_fill_device: out of memory");
	struct kx_fill_request req;
	memset(&req, 0, sizeof req);
	req.device = (uint32_t)device;
	req.flags = flags;
	memcpy(req.ipc_handle, ipc_handle64, sizeof req.ipc_handle);
	if (!ranges) {
		req.dst_offset = dst_off;
		req.file_offset = file_off;
		req.length = len;
	}
	req.n_ranges = ranges ? n : 0;
	memcpy(body, &req, sizeof req);
	/* kylix_range is the wire entry { file_offset, length, dst_offset }. */
	_Static_assert(sizeof(kylix_range) == 24, "a FILL range is 24 bytes");
	if (ranges)
		memcpy(body + sizeof req, ranges, (size_t)n * sizeof(kylix_range));
	int s = kx_connect_node(sock_path);
	if (s < 0) {
		free(body);
		return s;
	}
	unsigned char rbuf[4096];
	int fds[KX_MAX_FDS], nfds = 0;
	ssize_t r = kx_exchange(s, KX_OP_FILL, body, (uint32_t)body_len, f->fd, rbuf, sizeof rbuf, fds, &nfds);
	close(s);
	free(body);
	for (int i = 0; i < nfds; i++)
		close(fds[i]); /* FILL carries none; never leak what a node sends */
	if (r < 0)
		return (int)r;
	const unsigned char *fl;
	size_t flen;
	int err = kx_reply_status("FILL", rbuf, (size_t)r, &fl, &flen);
	if (err)
		return err;
	struct kx_fill_reply rep;
	if (flen != sizeof rep)
		return kx_seterr(-EPROTO, "FILL: reply fields are %zu bytes, want %zu", flen, sizeof rep);
	memcpy(&rep, fl, sizeof rep);
	rep.path[sizeof rep.path - 1] = rep.io[sizeof rep.io - 1] = rep.verified[sizeof rep.verified - 1] = '\0';
	if (info) {
		info->bytes = rep.bytes;
		info->nanos = rep.nanos;
		memcpy(info->path, rep.path, sizeof info->path);
		memcpy(info->io, rep.io, sizeof info->io);
		memcpy(info->verified, rep.verified, sizeof info->verified);
	}
	return 0;
}

int kylix_fill_device(kylix_file *f, const void *ipc_handle64, int device, uint64_t dst_off,
                      uint64_t file_off, uint64_t len, uint32_t flags, kylix_fill_info *info)
{
	kx_clearerr();
	return fill(f, ipc_handle64, device, dst_off, file_off, len, NULL, 0, flags, info);
}

int kylix_fill_device_ranges(kylix_file *f, const void *ipc_handle64, int device, const kylix_range *ranges,
                             uint32_t n, uint32_t flags, kylix_fill_info *info)
{
	kx_clearerr();
	return fill(f, ipc_handle64, device, 0, 0, 0, ranges, n, flags, info);
}
