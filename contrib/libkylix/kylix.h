/*
 * kylix.h - libkylix: read files of a Kylix mount from C (or Python's ctypes)
 * without a Go runtime in the calling process.
 *
 * A file opened with kylix_open is read with kylix_pread. Bytes come from one
 * of two paths, and every read reports which (struct kylix_read_info):
 *
 *   "fuse"  plain pread(2) on the file opened in the mount. Always correct;
 *           the node verifies every chunk it serves. A file that is not in a
 *           Kylix mount is read this way too (libkylix then works as a plain
 *           pread wrapper, so callers need no second code path).
 *   "pack"  pread(2) straight from a read-only pack fd that the node handed
 *           this process over its client socket (op PACKS, SCM_RIGHTS). The
 *           node hands out only whole-file packs (the pack holds exactly this
 *           file's bytes from offset 0) that passed its passthrough pack check,
 *           so these reads carry the same verification guarantee as the
 *           kernel's FUSE passthrough. libkylix checks the reply (size,
 *           generation against KYLIX_IOC_PACK, the chunk table from
 *           KYLIX_IOC_CHUNKS) and fstat(2)s the pack before each read: on any
 *           mismatch or error it drops the pack, reads through the mount and
 *           counts a fallback.
 *
 * Errors: every function that can fail returns a negative errno value
 * (-EINVAL, -EBADMSG, ...); nothing aborts or prints. kylix_strerror names a
 * code; kylix_last_error returns a message about the calling thread's last
 * failed call (and, after kylix_fill_device, the node's own message).
 *
 * Threads: every function may be called from many threads at once, also on
 * the same kylix_file (kylix_close excepted: close a file once, after every
 * other call on it returned).
 *
 * fork: pack fds and client connections belong to one process. A child that
 * uses a kylix_file inherited across fork notices the new pid, closes the
 * inherited pack fds and asks the node again on its own connection. Every
 * descriptor libkylix opens is close-on-exec.
 *
 * Every exported symbol starts with kylix_; structs are plain, fixed-size
 * C structs (no bitfields, no unions, no varargs) so ctypes can mirror them.
 */
#ifndef KYLIX_H
#define KYLIX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libkylix.so. The LD_PRELOAD shim, which compiles these
 * sources in, defines KYLIX_API empty so that it exports none of them. */
#ifndef KYLIX_API
#if defined(__GNUC__)
#define KYLIX_API __attribute__((visibility("default")))
#else
#define KYLIX_API
#endif
#endif

/* KYLIX_ABI_VERSION changes whenever a struct or signature here changes. */
#define KYLIX_ABI_VERSION 1

/* kylix_abi_version returns KYLIX_ABI_VERSION of the library loaded, so a
 * ctypes binding can refuse a library it does not match. */
KYLIX_API int kylix_abi_version(void);

/* kylix_file is an open file; opaque. */
typedef struct kylix_file kylix_file;

/* kylix_open opens path read-only and, when the file is on a Kylix mount,
 * asks the node (KYLIX_IOC_PROBE) where its client socket is and reads the
 * file's chunk table (KYLIX_IOC_CHUNKS). It does not connect to the client
 * socket: that happens at the first kylix_pread that could use a pack.
 * Returns 0 and sets *out, or a negative errno (that of open(2), -EISDIR
 * for a directory, -EINVAL for a NULL argument, -ENOMEM). A file that is
 * not on Kylix opens fine (kylix_is_kylix reports 0). */
KYLIX_API int kylix_open(const char *path, kylix_file **out);

/* kylix_close closes the file and every pack fd libkylix holds for it and
 * frees it. NULL is allowed. */
KYLIX_API void kylix_close(kylix_file *f);

/* kylix_size returns the file's size in bytes (as at kylix_open), or a
 * negative errno (-EINVAL for NULL). */
KYLIX_API int64_t kylix_size(const kylix_file *f);

/* kylix_fd returns the file descriptor libkylix reads the mount through
 * (owned by f: do not close it), or -EINVAL. */
KYLIX_API int kylix_fd(const kylix_file *f);

/* kylix_is_kylix returns 1 when f is on a Kylix mount, 0 when not, or
 * -EINVAL. */
KYLIX_API int kylix_is_kylix(const kylix_file *f);

/* kylix_is_kylix_fd asks KYLIX_IOC_PROBE on fd: 1 when fd is a file of a
 * Kylix mount, 0 when it is anything else (the ioctl answers ENOTTY, EINVAL,
 * ENOSYS, EOPNOTSUPP or a wrong magic), or a negative errno when fd is not an
 * open descriptor (-EBADF) or the probe fails otherwise. */
KYLIX_API int kylix_is_kylix_fd(int fd);

/* ---- safetensors headers ------------------------------------------------ */

/* Bounds of the parser (the node's Go parser accepts the same files, except
 * that it has no dimension limit). */
#define KYLIX_MAX_HEADER_LEN (100u << 20) /* JSON header bytes */
#define KYLIX_MAX_TENSORS    (1u << 20)
#define KYLIX_MAX_DIMS       16
#define KYLIX_DTYPE_LEN      16

/* kylix_tensor is one tensor of a safetensors file. */
typedef struct kylix_tensor {
	const char *name;             /* NUL-terminated UTF-8, owned by the header */
	char dtype[KYLIX_DTYPE_LEN];  /* "BF16", "F32", ... NUL-terminated */
	uint32_t elem_size;           /* bytes per element of dtype */
	uint32_t ndim;                /* entries used in shape */
	uint64_t shape[KYLIX_MAX_DIMS];
	uint64_t begin;               /* data_offsets[0]: from the data section */
	uint64_t end;                 /* data_offsets[1] */
	uint64_t offset;              /* begin + data_start: offset in the file */
	uint64_t nbytes;              /* end - begin */
} kylix_tensor;

/* kylix_kv is one entry of __metadata__ (string -> string). */
typedef struct kylix_kv {
	const char *key;   /* NUL-terminated UTF-8 */
	const char *value; /* NUL-terminated UTF-8 (a "\u0000" escape is refused) */
} kylix_kv;

/* kylix_header is a parsed safetensors header. Tensors are sorted by begin
 * (then end, then name), as they lie in the file. */
typedef struct kylix_header {
	uint64_t header_len;   /* JSON bytes after the 8-byte length prefix */
	uint64_t data_start;   /* 8 + header_len */
	uint64_t n_tensors;
	const kylix_tensor *tensors;
	uint64_t n_metadata;
	const kylix_kv *metadata; /* in file order */
} kylix_header;

/* kylix_parse_header parses the safetensors header in buf (the first len
 * bytes of a file of file_size bytes: the 8-byte little-endian length, then
 * at least the whole JSON header) with libkylix's own bounded JSON parser.
 * Rules, as the node's parser: the header length is 1..KYLIX_MAX_HEADER_LEN
 * and fits the file; the JSON is one object of valid UTF-8; every key is
 * unique; __metadata__ maps strings to strings; every other member is a
 * tensor {dtype, shape, data_offsets} with a known dtype, non-negative
 * 64-bit integers, end - begin == elements * elem_size, end within the data
 * section, and no two tensors overlap; nesting is bounded; unknown tensor
 * fields are ignored. Returns 0 and sets *out (free with
 * kylix_free_header), -EBADMSG for a malformed header (kylix_last_error
 * says what is wrong), -EINVAL for bad arguments, -ENOMEM. */
KYLIX_API int kylix_parse_header(const void *buf, size_t len, uint64_t file_size,
                                 kylix_header **out);

/* kylix_free_header frees a header from kylix_parse_header. NULL is allowed.
 * Never pass the header of kylix_tensors: the file owns that one. */
KYLIX_API void kylix_free_header(kylix_header *h);

/* kylix_tensors reads and parses f's safetensors header once (later calls
 * return the same) and sets *out to it; f owns it until kylix_close.
 * Returns 0, -EBADMSG for a file that is not valid safetensors, or the
 * negative errno of the read. */
KYLIX_API int kylix_tensors(kylix_file *f, const kylix_header **out);

/* ---- reads -------------------------------------------------------------- */

/* kylix_read_info says how the bytes of one kylix_pread (or, from
 * kylix_stats, of every read of the file so far) were read. */
typedef struct kylix_read_info {
	uint64_t bytes_pack;     /* bytes read from pack fds */
	uint64_t bytes_fuse;     /* bytes read through the mount */
	uint64_t pack_fallbacks; /* pack reads that failed a check and went to the mount */
	uint64_t reads;          /* kylix_pread calls (kylix_stats only; 1 per call) */
	char path[16];           /* "pack", "fuse", "mixed" or "none" (0 bytes) */
} kylix_read_info;

/* kylix_pread reads up to n bytes at file offset off into buf, like
 * pread(2) but until n bytes or the end of the file: it returns the bytes
 * read (less than n only at the end of the file; 0 at or past it), or a
 * negative errno. Whole-file packs the node hands out are read directly;
 * everything else, and every failed pack read, goes through the mount. When
 * info is not NULL it is filled in.
 *
 * Environment, read by kylix_open: KYLIX_NO_PACKS=1 turns the pack path
 * off (reads go through the mount only); KYLIX_PACK_IO=auto
 * (default), buffered or direct says how packs are read: "auto" reads a
 * large (>= 256 KiB), 4 KiB-aligned (offset and buf) range that is mostly
 * not in the page cache with O_DIRECT and everything else through the page
 * cache, as the node's GPU loader does; "direct" uses O_DIRECT for every
 * such aligned range; "buffered" never. O_DIRECT needs the pack reopened
 * through /proc/self/fd (possible where the caller may open the pack file
 * itself); where that fails, the page cache. Both count as "pack". */
KYLIX_API ssize_t kylix_pread(kylix_file *f, void *buf, size_t n, uint64_t off,
                              kylix_read_info *info);

/* kylix_stats fills *out with the totals of every kylix_pread on f in this
 * process (a forked child starts from the parent's totals). Returns 0 or
 * -EINVAL. */
KYLIX_API int kylix_stats(kylix_file *f, kylix_read_info *out);

/* kylix_packs says how many pack fds f holds now in this process (0 before
 * the first read that asked the node), or a negative errno. */
KYLIX_API int kylix_packs(kylix_file *f);

/* ---- GPU fill by the node ----------------------------------------------- */

/* Flags of kylix_fill_device. */
#define KYLIX_FILL_VERIFY 1u /* the node must verify every chunk on the GPU */
#define KYLIX_FILL_STRICT 2u /* fail instead of falling back to a slower path */

/* kylix_fill_info is the node's answer to a fill. */
typedef struct kylix_fill_info {
	uint64_t bytes;    /* bytes written into the allocation */
	uint64_t nanos;    /* time the node took */
	char path[32];     /* gpuio path: "bounce", "mapped", "gds", ... */
	char io[32];       /* I/O engine */
	char verified[32]; /* how the bytes were verified */
} kylix_fill_info;

/* kylix_fill_device asks the node (client socket op FILL) to copy len bytes
 * of f from file_off into the caller's CUDA allocation named by ipc_handle
 * (the 64 bytes of a CUipcMemHandle / cudaIpcMemHandle_t from
 * cuIpcGetMemHandle) on CUDA device `device`, at dst_off from the start of
 * that allocation. The node bounds-checks against the real allocation,
 * verifies and answers. flags: KYLIX_FILL_*. Returns 0 and fills *info
 * (may be NULL); -ENOTSUP when f is not on Kylix or its node has no client
 * socket; -ENODEV when the node has no GPU or driver; otherwise the node's
 * or the socket's negative errno. kylix_last_error carries the node's
 * message. */
KYLIX_API int kylix_fill_device(kylix_file *f, const void *ipc_handle64, int device,
                                uint64_t dst_off, uint64_t file_off, uint64_t len,
                                uint32_t flags, kylix_fill_info *info);

/* kylix_range is one range of kylix_fill_device_ranges. */
typedef struct kylix_range {
	uint64_t file_offset; /* from the start of the file */
	uint64_t length;      /* bytes */
	uint64_t dst_offset;  /* from the start of the allocation */
} kylix_range;

#define KYLIX_FILL_MAX_RANGES 4096

/* kylix_fill_device_ranges is kylix_fill_device for n ranges (1 ..
 * KYLIX_FILL_MAX_RANGES) into one allocation in one request: a tensor-
 * parallel rank's slices, for example. Every range must lie inside the
 * file (-EINVAL otherwise, before anything is sent); the node checks each
 * against the allocation. Returns as kylix_fill_device. */
KYLIX_API int kylix_fill_device_ranges(kylix_file *f, const void *ipc_handle64, int device,
                                       const kylix_range *ranges, uint32_t n, uint32_t flags,
                                       kylix_fill_info *info);

/* ---- tar headers --------------------------------------------------------- */

/* kylix_tar_scan walks the tar headers in a window of a tar file that the
 * caller has already read (kylix.data's shard reader: one 8 MiB read, then
 * this call, instead of parsing each 512-byte header in Python). It does
 * no I/O and keeps no state; any thread may call it.
 *
 * buf holds len bytes of the file from file offset base, and a header
 * begins at buf[0]. From there the scanner takes one header after another
 * and, for each it understands, fills one kylix_tar_member of out; it
 * stops (and says why in its return value) at the first of:
 *
 *   KYLIX_TAR_MORE   the window ends: fewer than 512 bytes are left for the
 *                    next header, or that header's member (its data and its
 *                    padding to a multiple of 512) is not wholly inside buf.
 *                    Read the next window from *next_off and call again. If
 *                    nothing was returned and *next_off == base, the member
 *                    is larger than the window, or the file ends inside it:
 *                    the caller decides (read it whole, or report truncation).
 *   KYLIX_TAR_FULL   max members filled in; call again from *next_off.
 *   KYLIX_TAR_END    the block at *next_off is 512 zero bytes (the trailer).
 *   KYLIX_TAR_OTHER  the header at *next_off is not one the scanner
 *                    understands, and the caller's own parser must take it:
 *                    a PAX header ('x', 'g'), a GNU long name ('L'), a
 *                    checksum that does not match, no ustar magic (v7,
 *                    garbage), or a size or checksum field that is not the
 *                    plain form below. Nothing about it is returned.
 *
 * A header is understood when: its magic is POSIX "ustar\0" (at offset
 * 257; the version is not checked) or GNU "ustar  \0"; its checksum field
 * (148..155) is octal digits (at least one), optionally after spaces and
 * followed only by NULs and spaces, and equals the unsigned byte sum of the
 * 512 bytes with that field counted as 8 spaces (the exact sum; readers
 * that also accept a signed sum, or compare modulo something, take the
 * header over at KYLIX_TAR_OTHER); its size field (124..135) is octal of
 * the same form (no digits: 0) or base-256 (first byte 0x80, then 11 bytes
 * big-endian, below 2^64); its type is not 'x', 'g' or 'L'. Members of
 * every other type (directories, links, 'K', ...) are returned with their
 * type: their size counts (as a data area) like a regular file's, so a
 * caller skips them as a whole.
 *
 * Names, as Python's tarfile reads a ustar header: the name field (offset
 * 0, up to 100 bytes, ending at its first NUL) and, for the POSIX magic
 * only, the prefix field (offset 345, up to 155 bytes): the full name is
 * prefix "/" name when the prefix is not empty. Both stay in buf (at the
 * header, buf[header_offset - base]); nothing is decoded or copied.
 *
 * Sample keys, as WebDataset (and kylix.data.sample_key) split a name: the
 * key is the name up to the first dot of its base name (the part after the
 * last '/'), the extension the rest after that dot; a base name without a
 * dot, or that starts with one, is all key (extension ""). key_len gives
 * the split within the name field (the base name always lies in the name
 * field: a prefix is followed by '/').
 *
 * Returns the stop reason (KYLIX_TAR_*, >= 0) and sets *n_out to the members
 * filled in and *next_off to the file offset where scanning stopped (the
 * header after the last member returned, else base). Returns -EINVAL for a
 * NULL argument (buf may be NULL when len is 0), max 0, or base + len past
 * 2^64 - 1; it never reads outside buf[0..len). */
#define KYLIX_TAR_MORE  0
#define KYLIX_TAR_FULL  1
#define KYLIX_TAR_END   2
#define KYLIX_TAR_OTHER 3

/* KYLIX_TAR_SAME_KEY (kylix_tar_member.flags): this member is a regular
 * file (type '0' or NUL) with the same sample key (prefix and all) as the
 * regular file before it in the same out array; never set on out[0] of a
 * call. Lets a caller build one key per sample, not one per member. */
#define KYLIX_TAR_SAME_KEY 1u

/* kylix_tar_member is one member found by kylix_tar_scan. Every field is a
 * uint64_t (a binding may read an array of them as one array of integers). */
typedef struct kylix_tar_member {
	uint64_t header_offset; /* file offset of the 512-byte header (base + its place in buf) */
	uint64_t data_offset;   /* header_offset + 512: the member's first byte */
	uint64_t size;          /* the member's bytes (its size field) */
	uint64_t next_offset;   /* data_offset + size rounded up to 512: the next header */
	uint64_t name_len;      /* bytes of the name field before its first NUL (0..100) */
	uint64_t prefix_len;    /* bytes of the ustar prefix (0..155); 0 for none or a GNU header */
	uint64_t key_len;       /* the key is (prefix "/") + the name field's first key_len bytes;
	                         * the extension is its bytes key_len + 1 .. name_len, or "" when
	                         * key_len == name_len */
	uint64_t type;          /* the type flag byte: '0' or 0 regular file, '5' directory, ... */
	uint64_t flags;         /* KYLIX_TAR_SAME_KEY */
	uint64_t reserved;      /* 0 */
} kylix_tar_member;

KYLIX_API int kylix_tar_scan(const void *buf, size_t len, uint64_t base, kylix_tar_member *out,
                             size_t max, size_t *n_out, uint64_t *next_off);

/* ---- errors ------------------------------------------------------------- */

/* kylix_strerror returns a static description of err (negative or positive
 * errno). Thread-safe. */
KYLIX_API const char *kylix_strerror(int err);

/* kylix_last_error returns the message of the calling thread's last failed
 * libkylix call ("" if none). The string lives until the thread's next
 * libkylix call. */
KYLIX_API const char *kylix_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KYLIX_H */
