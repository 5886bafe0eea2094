/*
 * kylix_layout.h - the layout ioctls of files in a Kylix mount.
 *
 * An open file in a Kylix FUSE mount answers two fixed-size ioctls so that a
 * reader can bypass FUSE and read the file's bytes from the store's backing
 * pack files directly (O_DIRECT, cuFile, mmap):
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
 * Mirrors the Go package github.com/kylix/kylix/fs/layout; a test checks that
 * the sizes and command numbers agree.
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

#endif /* KYLIX_LAYOUT_H */
