/*
 * internal.h - libkylix internals: wire layouts (docs/design/libkylix.md,
 * ONRAMP contract A and B) and helpers shared by the source files. Nothing
 * here is exported from libkylix.so (-fvisibility=hidden); the static test
 * binary links the objects directly and may call the kx_ functions.
 */
#ifndef KYLIX_INTERNAL_H
#define KYLIX_INTERNAL_H

#include "../kylix.h"

#include <linux/ioctl.h>
#include <stdint.h>
#include <sys/types.h>

#define KX_HIDDEN __attribute__((visibility("hidden")))

/* Layout ioctls (fs/layout/kylix_layout.h, version 2). Only PROBE is used:
 * its layout is the one the contract fixes to 256 bytes. */
#define KX_LAYOUT_MAGIC 0x4b594c58u /* "KYLX" */
struct kx_probe {
	uint32_t magic;          /* out: KX_LAYOUT_MAGIC */
	uint32_t version;        /* out: highest layout version served */
	uint64_t node_pid;       /* out */
	char client_socket[240]; /* out: NUL-terminated path, "" if none */
};
_Static_assert(sizeof(struct kx_probe) == 256, "kylix_probe is 256 bytes");
#define KX_IOC_PROBE _IOR('K', 3, struct kx_probe)

/* Client socket, protocol version 1 (cmd/kylix serve, clientproto). */
#define KX_CLIENT_MAGIC   0x4b594c43u /* "KYLC" */
#define KX_CLIENT_VERSION 1
#define KX_OP_PACKS 1
#define KX_OP_FILL  2
#define KX_OP_STAT  3
#define KX_REPLY_BIT 0x8000u
#define KX_MAX_FDS 16            /* most fds one PACKS reply carries */
#define KX_PACK_WHOLE_FILE 1u
#define KX_PACK_CHECKED    2u
#define KX_PACK_SHARED     4u   /* holds other files' bytes too (all readable by the caller) */
#define KX_PACKS_SHARED    1u   /* PACKS request flag: shared packs too (the LD_PRELOAD shim) */

/* Optional PACKS request body (an empty body is version 1's request). */
struct kx_packs_request {
	uint32_t flags;
	uint32_t reserved;
};
_Static_assert(sizeof(struct kx_packs_request) == 8, "PACKS request is 8 bytes");

struct kx_msg_header {
	uint32_t magic;
	uint16_t version;
	uint16_t op;
	uint32_t seq;
	uint32_t body_len;
};
_Static_assert(sizeof(struct kx_msg_header) == 16, "client header is 16 bytes");

/* Start of every reply body; msg_len bytes of message follow. */
struct kx_reply_status {
	int32_t status;
	uint32_t msg_len;
};

struct kx_pack_entry {
	uint32_t pack_index;
	uint32_t flags;
	uint64_t generation;
	uint64_t size;
};
_Static_assert(sizeof(struct kx_pack_entry) == 24, "pack entry is 24 bytes");

struct kx_fill_request {
	uint32_t device;
	uint32_t flags;
	uint8_t ipc_handle[64];
	uint64_t dst_offset;
	uint64_t file_offset;
	uint64_t length;
	uint32_t n_ranges;
	uint32_t reserved;
};
_Static_assert(sizeof(struct kx_fill_request) == 104, "fill request is 104 bytes");

struct kx_fill_reply {
	uint64_t bytes;
	uint64_t nanos;
	char path[32];
	char io[32];
	char verified[32];
};
_Static_assert(sizeof(struct kx_fill_reply) == 112, "fill reply is 112 bytes");

/* kx_generation is kylix_pack_generation of fs/layout/kylix_layout.h
 * (layout.Generation in Go): FNV-1a 64 over the little-endian st_dev,
 * st_ino, st_size, st_mtime (ns) and st_ctime (ns), 0 mapped to 1. The node
 * sends it with each pack; recomputed from fstat of the fd it must agree,
 * else the pack is not the state the node checked. */
struct stat;
KX_HIDDEN uint64_t kx_generation(const struct stat *st);

/* The client socket exchange, shared by kylix.c and the LD_PRELOAD shim
 * (contrib/preload): kx_connect_node opens a new connection (120 s
 * timeouts); kx_exchange sends one request with fd attached and receives
 * the reply body into rbuf and up to KX_MAX_FDS fds (close-on-exec, owned
 * by the caller), returning the body length or a negative errno;
 * kx_reply_status checks the reply's status and points *fields after its
 * message. Each returns a negative errno with kylix_last_error set. */
KX_HIDDEN int kx_connect_node(const char *sock_path);
KX_HIDDEN ssize_t kx_exchange(int s, uint16_t op, const void *body, uint32_t body_len, int fd,
                              void *rbuf, size_t rcap, int *fds, int *nfds);
KX_HIDDEN int kx_reply_status(const char *what, const unsigned char *body, size_t len,
                              const unsigned char **fields, size_t *flen);

/* kx_seterr records a message for kylix_last_error and returns err. */
KX_HIDDEN int kx_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
KX_HIDDEN void kx_clearerr(void);

/* kx_direct_bytes counts bytes read with O_DIRECT in this process (for
 * the tests: kylix_read_info counts them as "pack"). */
KX_HIDDEN extern _Atomic unsigned long long kx_direct_bytes;

/* kx_test_set_socket points f at a client socket path and marks it as a
 * Kylix file: lets the unit test drive the pack and fill code against a
 * fake node without a mount. */
KX_HIDDEN void kx_test_set_socket(kylix_file *f, const char *path);

#endif
