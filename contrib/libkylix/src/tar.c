/*
 * tar.c - kylix_tar_scan: the ustar headers of a window of a tar file
 * already in memory (kylix.data's shard reader). See kylix.h for the
 * contract and docs/design/libkylix.md, "Tar headers", for why.
 *
 * The scanner accepts only headers whose every field it uses has the plain
 * form; anything else stops the scan (KYLIX_TAR_OTHER) and the caller's own
 * parser takes that header, so a header is never read two different ways.
 */
#include "internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define TAR_BLOCK 512
#define TAR_NAME_LEN 100
#define TAR_PREFIX_OFF 345
#define TAR_PREFIX_LEN 155

/* A field of octal digits: spaces, digits 0-7 (at least one when
 * need_digit), then only NULs and spaces to the field's end. */
static bool tar_octal(const unsigned char *f, size_t n, bool need_digit, uint64_t *out)
{
	size_t i = 0;
	while (i < n && f[i] == ' ')
		i++;
	uint64_t v = 0;
	size_t digits = 0;
	for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
		if (v >> 61)
			return false; /* v * 8 would not fit 64 bits */
		v = v * 8 + (uint64_t)(f[i] - '0');
	}
	for (; i < n; i++)
		if (f[i] != 0 && f[i] != ' ')
			return false;
	if (need_digit && digits == 0)
		return false;
	*out = v;
	return true;
}

/* The size field: octal, or base-256 (0x80, then 11 bytes big-endian). */
static bool tar_size(const unsigned char *f, uint64_t *out)
{
	if (f[0] != 0x80)
		return tar_octal(f, 12, false, out);
	uint64_t v = 0;
	for (size_t i = 1; i < 12; i++) {
		if (v >> 56)
			return false; /* 2^64 or more */
		v = v << 8 | f[i];
	}
	*out = v;
	return true;
}

static bool tar_zero(const unsigned char *b)
{
	static const unsigned char zero[TAR_BLOCK];
	return memcmp(b, zero, TAR_BLOCK) == 0;
}

/* The member of the header at h, if the scanner understands it (kylix.h):
 * fills m's size, names, key and type. */
static bool tar_header(const unsigned char *h, kylix_tar_member *m)
{
	bool posix = memcmp(h + 257, "ustar\0", 6) == 0;
	if (!posix && memcmp(h + 257, "ustar  \0", 8) != 0)
		return false;
	uint64_t chk, sum = 0;
	if (!tar_octal(h + 148, 8, true, &chk))
		return false;
	for (size_t i = 0; i < TAR_BLOCK; i++)
		sum += h[i];
	for (size_t i = 148; i < 156; i++)
		sum -= h[i];
	if (sum + 8 * ' ' != chk)
		return false;
	unsigned char type = h[156];
	if (type == 'x' || type == 'g' || type == 'L')
		return false;
	uint64_t size;
	if (!tar_size(h + 124, &size))
		return false;
	const unsigned char *nul = memchr(h, 0, TAR_NAME_LEN);
	size_t nl = nul ? (size_t)(nul - h) : TAR_NAME_LEN;
	size_t pl = 0;
	if (posix) {
		nul = memchr(h + TAR_PREFIX_OFF, 0, TAR_PREFIX_LEN);
		pl = nul ? (size_t)(nul - (h + TAR_PREFIX_OFF)) : TAR_PREFIX_LEN;
	}
	/* The base name starts after the name field's last '/' (a prefix
	 * always ends in one), the extension after the base name's first dot;
	 * a base name without a dot, or that starts with one, is all key. */
	size_t base = 0;
	for (size_t i = 0; i < nl; i++)
		if (h[i] == '/')
			base = i + 1;
	const unsigned char *dot = memchr(h + base, '.', nl - base);
	size_t kl = nl;
	if (dot && dot > h + base)
		kl = (size_t)(dot - h);
	m->size = size;
	m->name_len = nl;
	m->prefix_len = pl;
	m->key_len = kl;
	m->type = type;
	m->flags = 0;
	m->reserved = 0;
	return true;
}

static bool is_regular(uint64_t type)
{
	return type == '0' || type == 0;
}

/* Whether the members whose headers are at a and b have the same key. */
static bool same_key(const unsigned char *a, const kylix_tar_member *ma, const unsigned char *b,
                     const kylix_tar_member *mb)
{
	return ma->key_len == mb->key_len && ma->prefix_len == mb->prefix_len &&
	       memcmp(a, b, ma->key_len) == 0 &&
	       memcmp(a + TAR_PREFIX_OFF, b + TAR_PREFIX_OFF, ma->prefix_len) == 0;
}

int kylix_tar_scan(const void *vbuf, size_t len, uint64_t base, kylix_tar_member *out, size_t max,
                   size_t *n_out, uint64_t *next_off)
{
	if (!n_out || !next_off || !out || max == 0 || (!vbuf && len > 0))
		return kx_seterr(-EINVAL, "kylix_tar_scan: NULL argument or max 0");
	*n_out = 0;
	*next_off = base;
	if (base > UINT64_MAX - len)
		return kx_seterr(-EINVAL, "kylix_tar_scan: base + len past 2^64 - 1");
	const unsigned char *buf = vbuf;
	size_t pos = 0, n = 0;
	size_t last_reg = SIZE_MAX; /* out index of the previous regular member */
	int stop;
	for (;;) {
		if (n == max) {
			stop = KYLIX_TAR_FULL;
			break;
		}
		if (len - pos < TAR_BLOCK) {
			stop = KYLIX_TAR_MORE;
			break;
		}
		const unsigned char *h = buf + pos;
		if (tar_zero(h)) {
			stop = KYLIX_TAR_END;
			break;
		}
		kylix_tar_member *m = &out[n];
		if (!tar_header(h, m)) {
			stop = KYLIX_TAR_OTHER;
			break;
		}
		/* The member and its padding must lie in the window. */
		size_t avail = len - pos - TAR_BLOCK;
		if (m->size > avail || (m->size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK > avail) {
			/* (m->size <= avail < SIZE_MAX - 512: the rounding cannot wrap) */
			stop = KYLIX_TAR_MORE;
			break;
		}
		size_t padded = (size_t)(m->size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
		m->header_offset = base + pos;
		m->data_offset = m->header_offset + TAR_BLOCK;
		m->next_offset = m->data_offset + padded;
		if (is_regular(m->type)) {
			const kylix_tar_member *p = last_reg == SIZE_MAX ? NULL : &out[last_reg];
			if (p && same_key(buf + (p->header_offset - base), p, h, m))
				m->flags |= KYLIX_TAR_SAME_KEY;
			last_reg = n;
		}
		pos += TAR_BLOCK + padded;
		n++;
	}
	*n_out = n;
	*next_off = base + pos;
	return stop;
}
