/*
 * kylix_layout.h - the layout ioctls of files in a Kylix mount.
 *
 * docs/design/ioctl.md describes them all. Version 2 (below the v1 part):
 *
 *   KYLIX_IOC_PROBE      is this fd on Kylix (any open file or directory of
 *                        a mount); the node's pid and client socket.
 *   KYLIX_IOC_CHUNKS(n)  the file's chunks, n per call (paged): file offset,
 *                        length, BLAKE3-256 id, pack index, pack offset.
 *   KYLIX_IOC_PACK       one entry of the file's pack table: path, size,
 *                        generation, flags.
 *   KYLIX_IOC_MAKE_LOCAL make a byte range local; 0 when it is.
 *
 * Version 1: an open file in a Kylix FUSE mount answers two fixed-size
 * ioctls so that a reader can bypass FUSE and read the file's bytes from
 * the store's backing pack files directly (O_DIRECT, cuFile, mmap):
 *
 *   KYLIX_IOC_LAYOUT    the extents of a byte range: for each, the pack id
 *                       and offset where it is stored, or "not local".
 *   KYLIX_IOC_PACK_PATH the absolute path of a pack file, by pack id (the
 *                       pack id is the index into the node's path table).
 *
 * Rules (every field is checked; a request that breaks one gets EINVAL):
 *   - magic must be KYLIX_LAYOUT_MAGIC and version KYLIX_LAYOUT_VERSION;
 *   - every field marked "out" and every reserved field must be zero on input;
 *   - offset must not be beyond the file's size; offset + length must not
 *     overflow; length 0 means "to the end of the file";
 *   - at most KYLIX_LAYOUT_MAX_EXTENTS extents come back; when the range
 *     needs more, next_offset says where to continue (it equals the range's
 *     end when everything was returned).
 * A file open for writing on the node answers EBUSY (its bytes are not in
 * packs yet). Pack paths are only meaningful on the node that answered.
 *
 * Mirrors the Go package github.com/kylix/kylix/fs/layout; a test compiles
 * this header and checks every size, field offset and command number (and
 * kylix_pack_generation) against the Go package.
 */
#ifndef KYLIX_LAYOUT_H
#define KYLIX_LAYOUT_H

#include <stdint.h>
#include <linux/ioctl.h>

#define KYLIX_LAYOUT_MAGIC       0x4b594c58u /* "KYLX" */
#define KYLIX_LAYOUT_VERSION     1u
#define KYLIX_LAYOUT_MAX_EXTENTS 16u
#define KYLIX_PACK_PATH_MAX      4096u

/* kylix_extent.flags */
#define KYLIX_EXTENT_LOCAL      0x1u /* stored in pack pack_id at pack_offset */
#define KYLIX_EXTENT_WHOLE_FILE 0x2u /* the pack holds exactly this file from offset 0 */

struct kylix_extent {
	uint64_t file_offset; /* out */
	uint64_t length;      /* out */
	uint64_t pack_id;     /* out: 0 when not local */
	uint64_t pack_offset; /* out: 0 when not local */
	uint32_t flags;       /* out: KYLIX_EXTENT_* */
	uint32_t reserved;    /* out: zero */
};

struct kylix_layout {
	uint32_t magic;       /* in: KYLIX_LAYOUT_MAGIC */
	uint16_t version;     /* in: KYLIX_LAYOUT_VERSION */
	uint16_t flags;       /* in: zero (reserved) */
	uint64_t offset;      /* in: first byte of the range */
	uint64_t length;      /* in: bytes in the range; 0 = to end of file */
	uint64_t file_size;   /* out: the file's size */
	uint64_t next_offset; /* out: where to continue; range end when complete */
	uint32_t n_extents;   /* out: entries used in ext[] */
	uint32_t reserved;    /* in/out: zero */
	uint8_t  file_id[32]; /* out: the file's manifest id (BLAKE3-256) */
	struct kylix_extent ext[KYLIX_LAYOUT_MAX_EXTENTS]; /* out */
};

struct kylix_pack_path {
	uint32_t magic;    /* in: KYLIX_LAYOUT_MAGIC */
	uint16_t version;  /* in: KYLIX_LAYOUT_VERSION */
	uint16_t flags;    /* in: zero (reserved) */
	uint64_t pack_id;  /* in: a pack id from kylix_extent.pack_id, not 0 */
	uint32_t len;      /* out: bytes in path, without the NUL */
	uint32_t reserved; /* in/out: zero */
	char     path[KYLIX_PACK_PATH_MAX]; /* out: NUL-terminated absolute path */
};

#define KYLIX_IOC_LAYOUT    _IOWR('K', 1, struct kylix_layout)
#define KYLIX_IOC_PACK_PATH _IOWR('K', 2, struct kylix_pack_path)

/* ------------------------------------------------------------------------
 * Layout version 2.
 *
 * Rules common to every v2 request (a request that breaks one gets EINVAL):
 *   - magic is KYLIX_LAYOUT_MAGIC, version KYLIX_LAYOUT_VERSION2, flags 0;
 *   - every field marked "out" and every reserved field is zero on input
 *     (the entries after a struct kylix_chunks are output only: their input
 *     bytes are ignored);
 *   - _IOC_SIZE(cmd) is exactly the size of the struct (for
 *     KYLIX_IOC_CHUNKS: KYLIX_CHUNKS_SIZE(max_entries));
 *   - indexes (first_chunk, pack_index) are in range.
 * A file being written (no committed version, or a working copy open)
 * answers EBUSY to CHUNKS, PACK and MAKE_LOCAL; PROBE always answers.
 * An ioctl number of type 'K' that Kylix does not define, or any other
 * type, is ENOTTY.
 *
 * FUSE ioctls on regular files are "restricted": the kernel copies exactly
 * _IOC_SIZE(cmd) bytes in (for _IOC_WRITE) and out (for _IOC_READ), and
 * _IOC_SIZE has 14 bits, so one call moves at most 16383 bytes.
 * ---------------------------------------------------------------------- */

#define KYLIX_LAYOUT_VERSION2       2u
#define KYLIX_CLIENT_SOCKET_MAX     240u  /* sizeof kylix_probe.client_socket */
#define KYLIX_CHUNKS_MAX_ENTRIES    254u  /* most entries per KYLIX_IOC_CHUNKS */
#define KYLIX_PACK_PATH_MAX2        4056u /* sizeof kylix_pack.path */

/* kylix_chunk.flags */
#define KYLIX_CHUNK_LOCAL           0x1u  /* in pack pack_index at pack_offset */
/* kylix_chunk.pack_index of a chunk that is not local */
#define KYLIX_NO_PACK               0xffffffffu

/* kylix_pack.pack_flags */
#define KYLIX_PACK_WHOLE_FILE       0x1u  /* holds exactly this file from offset 0 */
#define KYLIX_PACK_CHECKED          0x2u  /* this state (generation) passed the pack check */

/* KYLIX_IOC_PROBE: _IOR, every field out. 256 bytes. */
struct kylix_probe {
	uint32_t magic;         /* out: KYLIX_LAYOUT_MAGIC; anything else: not Kylix */
	uint32_t version;       /* out: highest layout version served (2) */
	uint64_t node_pid;      /* out: pid of the node serving the mount */
	char     client_socket[KYLIX_CLIENT_SOCKET_MAX];
	                        /* out: NUL-terminated absolute path of the node's
	                         * client socket; "" when it has none */
};

/* KYLIX_IOC_CHUNKS: the header, followed in the same buffer by max_entries
 * struct kylix_chunk. 72 bytes. Ask with max_entries 0 for the totals,
 * then page with first_chunk = 0, n_entries, 2*n_entries, ...; compare
 * file_id across pages (a file replaced in between has another id). */
struct kylix_chunks {
	uint32_t magic;         /* in: KYLIX_LAYOUT_MAGIC */
	uint16_t version;       /* in: KYLIX_LAYOUT_VERSION2 */
	uint16_t flags;         /* in: zero (reserved) */
	uint64_t first_chunk;   /* in: index of the first chunk wanted, <= n_chunks */
	uint32_t max_entries;   /* in: entries the buffer holds, <= KYLIX_CHUNKS_MAX_ENTRIES;
	                         * 0 = just the totals */
	uint32_t n_entries;     /* out: entries filled, min(max_entries, n_chunks - first_chunk) */
	uint64_t n_chunks;      /* out: the file's chunk count */
	uint64_t file_size;     /* out: the file's size in bytes */
	uint8_t  file_id[32];   /* out: the file's manifest id (BLAKE3-256) */
};

/* One chunk of the file. 64 bytes. Entries come in file order, back to
 * back: entry k+1's file_offset is entry k's file_offset + length. */
struct kylix_chunk {
	uint64_t file_offset;   /* out: file offset of the chunk's first byte */
	uint32_t length;        /* out: the chunk's length in bytes (> 0) */
	uint32_t flags;         /* out: KYLIX_CHUNK_* */
	uint32_t pack_index;    /* out: index into THIS file's pack table
	                         * (KYLIX_IOC_PACK), 0..n_packs-1; KYLIX_NO_PACK
	                         * when not local */
	uint32_t reserved;      /* out: zero */
	uint64_t pack_offset;   /* out: offset of the chunk in the pack; 0 when not local */
	uint8_t  id[32];        /* out: BLAKE3-256 of the chunk's bytes; a reader that
	                         * bypasses the mount must check it (or use only
	                         * KYLIX_PACK_CHECKED packs of the same generation) */
};

#define KYLIX_CHUNKS_SIZE(n) \
	(sizeof(struct kylix_chunks) + (size_t)(n) * sizeof(struct kylix_chunk))

/* KYLIX_IOC_PACK: one entry of the file's pack table. 4096 bytes. */
struct kylix_pack {
	uint32_t magic;         /* in: KYLIX_LAYOUT_MAGIC */
	uint16_t version;       /* in: KYLIX_LAYOUT_VERSION2 */
	uint16_t flags;         /* in: zero (reserved) */
	uint32_t pack_index;    /* in: a pack_index from a chunk entry of this file */
	uint32_t n_packs;       /* out: packs in this file's table */
	uint64_t generation;    /* out: kylix_pack_generation() of the pack file's
	                         * stat when the node answered; a reader that opens
	                         * path compares it with its fd's fstat */
	uint64_t size;          /* out: the pack file's size */
	uint32_t pack_flags;    /* out: KYLIX_PACK_* */
	uint32_t path_len;      /* out: bytes in path, without the NUL */
	char     path[KYLIX_PACK_PATH_MAX2];
	                        /* out: NUL-terminated absolute path of the pack on
	                         * the node; only the node's user may open it */
};

/* KYLIX_IOC_MAKE_LOCAL: _IOW, every field in. 24 bytes. Returns 0 when
 * every chunk of the range is stored on the node, EIO when one is not and
 * cannot be fetched. */
struct kylix_make_local {
	uint32_t magic;         /* in: KYLIX_LAYOUT_MAGIC */
	uint16_t version;       /* in: KYLIX_LAYOUT_VERSION2 */
	uint16_t flags;         /* in: zero (reserved) */
	uint64_t offset;        /* in: first byte, <= the file's size */
	uint64_t length;        /* in: bytes; 0 = to the end; clipped at the end */
};

#define KYLIX_IOC_PROBE      _IOR('K', 3, struct kylix_probe)
#define KYLIX_IOC_CHUNKS(n)  _IOC(_IOC_READ | _IOC_WRITE, 'K', 4, KYLIX_CHUNKS_SIZE(n))
#define KYLIX_IOC_PACK       _IOWR('K', 5, struct kylix_pack)
#define KYLIX_IOC_MAKE_LOCAL _IOW('K', 6, struct kylix_make_local)

/* The generation of a pack file in the state fstat reports: FNV-1a 64 over
 * the 40 little-endian bytes of st_dev, st_ino, st_size, st_mtime (ns) and
 * st_ctime (ns); 0 is mapped to 1. Call it with the fields of a struct stat:
 *   kylix_pack_generation(st.st_dev, st.st_ino, st.st_size,
 *       st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
 *       st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec) */
static inline uint64_t kylix_pack_generation(uint64_t dev, uint64_t ino, int64_t size,
                                             int64_t mtime_ns, int64_t ctime_ns)
{
	uint64_t v[5] = { dev, ino, (uint64_t)size, (uint64_t)mtime_ns, (uint64_t)ctime_ns };
	uint64_t h = 14695981039346656037ull;
	for (int i = 0; i < 5; i++)
		for (int b = 0; b < 8; b++) {
			h ^= (v[i] >> (8 * b)) & 0xff;
			h *= 1099511628211ull;
		}
	return h ? h : 1;
}

#endif /* KYLIX_LAYOUT_H */
