/*
 * safetensors.c - the safetensors header parser: an 8-byte little-endian
 * length, then a JSON object of name -> {dtype, shape, data_offsets} plus an
 * optional __metadata__ object of string -> string.
 *
 * The JSON parser is our own and only as general as the header needs: it
 * validates full JSON syntax (so it refuses what the node's Go parser
 * refuses), but decodes only strings and non-negative integers and skips
 * every other value. It is bounded everywhere: nesting depth (KX_MAX_DEPTH),
 * integers (no overflow: anything above INT64_MAX is refused), tensor count
 * (KYLIX_MAX_TENSORS), dimensions (KYLIX_MAX_DIMS) and memory (one string
 * arena no larger than the header, since a decoded string never outgrows its
 * JSON spelling). It never reads past len bytes.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define KX_MAX_DEPTH 64

struct header_alloc {
	kylix_header pub;
	kylix_tensor *tensors;
	kylix_kv *metadata;
	char *arena;
};

struct parser {
	const unsigned char *p, *end;
	char *arena;      /* decoded strings go here */
	size_t arena_len; /* bytes used */
	size_t arena_cap;
};

static int bad(struct parser *ps, const unsigned char *start, const char *what)
{
	return kx_seterr(-EBADMSG, "safetensors header: %s at byte %zu of the JSON", what,
	                 (size_t)(ps->p - start));
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int hexval(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static bool read_hex4(struct parser *ps, uint32_t *out)
{
	if (ps->end - ps->p < 4)
		return false;
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		int h = hexval(ps->p[i]);
		if (h < 0)
			return false;
		v = v << 4 | (uint32_t)h;
	}
	ps->p += 4;
	*out = v;
	return true;
}

static void put_utf8(char *dst, size_t *n, uint32_t cp)
{
	if (cp < 0x80) {
		dst[(*n)++] = (char)cp;
	} else if (cp < 0x800) {
		dst[(*n)++] = (char)(0xC0 | cp >> 6);
		dst[(*n)++] = (char)(0x80 | (cp & 0x3F));
	} else if (cp < 0x10000) {
		dst[(*n)++] = (char)(0xE0 | cp >> 12);
		dst[(*n)++] = (char)(0x80 | (cp >> 6 & 0x3F));
		dst[(*n)++] = (char)(0x80 | (cp & 0x3F));
	} else {
		dst[(*n)++] = (char)(0xF0 | cp >> 18);
		dst[(*n)++] = (char)(0x80 | (cp >> 12 & 0x3F));
		dst[(*n)++] = (char)(0x80 | (cp >> 6 & 0x3F));
		dst[(*n)++] = (char)(0x80 | (cp & 0x3F));
	}
}

/*
 * parse_string parses a JSON string at ps->p (which must be '"'). When out is
 * not NULL the decoded, NUL-terminated string is stored in the arena and
 * *out points to it (a string holding U+0000 is refused then: C strings
 * cannot carry it). Lone surrogate escapes decode to U+FFFD, as in Go. The
 * input is already known to be valid UTF-8.
 */
static int parse_string(struct parser *ps, const unsigned char *start, const char **out)
{
	if (ps->p >= ps->end || *ps->p != '"')
		return bad(ps, start, "expected a string");
	ps->p++;
	char *dst = NULL;
	size_t n = 0;
	if (out) {
		dst = ps->arena + ps->arena_len;
	}
	for (;;) {
		if (ps->p >= ps->end)
			return bad(ps, start, "unterminated string");
		unsigned char c = *ps->p;
		if (c == '"') {
			ps->p++;
			break;
		}
		if (c < 0x20)
			return bad(ps, start, "control character in a string");
		if (c != '\\') {
			if (dst)
				dst[n++] = (char)c;
			ps->p++;
			continue;
		}
		ps->p++;
		if (ps->p >= ps->end)
			return bad(ps, start, "unterminated escape");
		uint32_t cp;
		switch (*ps->p++) {
		case '"': cp = '"'; break;
		case '\\': cp = '\\'; break;
		case '/': cp = '/'; break;
		case 'b': cp = '\b'; break;
		case 'f': cp = '\f'; break;
		case 'n': cp = '\n'; break;
		case 'r': cp = '\r'; break;
		case 't': cp = '\t'; break;
		case 'u':
			if (!read_hex4(ps, &cp))
				return bad(ps, start, "bad \\u escape");
			if (cp >= 0xD800 && cp < 0xDC00) {
				/* A high surrogate: a pair only with a following \uDC00-DFFF. */
				uint32_t lo;
				const unsigned char *save = ps->p;
				if (ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
					ps->p += 2;
					if (!read_hex4(ps, &lo))
						return bad(ps, start, "bad \\u escape");
					if (lo >= 0xDC00 && lo < 0xE000) {
						cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
					} else {
						cp = 0xFFFD;
						ps->p = save; /* the second escape stands alone */
					}
				} else {
					cp = 0xFFFD;
				}
			} else if (cp >= 0xDC00 && cp < 0xE000) {
				cp = 0xFFFD;
			}
			break;
		default:
			return bad(ps, start, "bad escape");
		}
		if (dst) {
			if (cp == 0)
				return bad(ps, start, "\\u0000 in a name or value");
			put_utf8(dst, &n, cp);
		}
	}
	if (dst) {
		dst[n++] = '\0';
		ps->arena_len += n;
		*out = dst;
	}
	return 0;
}

/* parse_uint parses a JSON number that must be a non-negative integer of at
 * most INT64_MAX (what the node's parser accepts). */
static int parse_uint(struct parser *ps, const unsigned char *start, uint64_t *out)
{
	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return bad(ps, start, "expected a non-negative integer");
	if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
		return bad(ps, start, "leading zero in a number");
	uint64_t v = 0;
	while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
		uint64_t d = (uint64_t)(*ps->p - '0');
		if (v > (UINT64_C(0x7fffffffffffffff) - d) / 10)
			return bad(ps, start, "integer larger than 2^63-1");
		v = v * 10 + d;
		ps->p++;
	}
	if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
		return bad(ps, start, "expected an integer, not a fraction or exponent");
	*out = v;
	return 0;
}

static int skip_value(struct parser *ps, const unsigned char *start, int depth);

/* skip_number validates the JSON number grammar. */
static int skip_number(struct parser *ps, const unsigned char *start)
{
	if (ps->p < ps->end && *ps->p == '-')
		ps->p++;
	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return bad(ps, start, "bad number");
	if (*ps->p == '0') {
		ps->p++;
	} else {
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (ps->p < ps->end && *ps->p == '.') {
		ps->p++;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return bad(ps, start, "bad number");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
		ps->p++;
		if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
			ps->p++;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return bad(ps, start, "bad number");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	return 0;
}

static int skip_literal(struct parser *ps, const unsigned char *start, const char *lit)
{
	size_t n = strlen(lit);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0)
		return bad(ps, start, "bad literal");
	ps->p += n;
	return 0;
}

/* skip_value validates and skips any JSON value, nesting at most
 * KX_MAX_DEPTH deep. */
static int skip_value(struct parser *ps, const unsigned char *start, int depth)
{
	if (depth > KX_MAX_DEPTH)
		return bad(ps, start, "nesting too deep");
	skip_ws(ps);
	if (ps->p >= ps->end)
		return bad(ps, start, "unexpected end");
	int err;
	switch (*ps->p) {
	case '"':
		return parse_string(ps, start, NULL);
	case 't':
		return skip_literal(ps, start, "true");
	case 'f':
		return skip_literal(ps, start, "false");
	case 'n':
		return skip_literal(ps, start, "null");
	case '[':
		ps->p++;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ']') {
			ps->p++;
			return 0;
		}
		for (;;) {
			if ((err = skip_value(ps, start, depth + 1)))
				return err;
			skip_ws(ps);
			if (ps->p >= ps->end)
				return bad(ps, start, "unterminated array");
			if (*ps->p == ']') {
				ps->p++;
				return 0;
			}
			if (*ps->p != ',')
				return bad(ps, start, "expected ',' or ']'");
			ps->p++;
		}
	case '{':
		ps->p++;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == '}') {
			ps->p++;
			return 0;
		}
		for (;;) {
			skip_ws(ps);
			if ((err = parse_string(ps, start, NULL)))
				return err;
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':')
				return bad(ps, start, "expected ':'");
			ps->p++;
			if ((err = skip_value(ps, start, depth + 1)))
				return err;
			skip_ws(ps);
			if (ps->p >= ps->end)
				return bad(ps, start, "unterminated object");
			if (*ps->p == '}') {
				ps->p++;
				return 0;
			}
			if (*ps->p != ',')
				return bad(ps, start, "expected ',' or '}'");
			ps->p++;
		}
	default:
		return skip_number(ps, start);
	}
}

/*
 * walk_object iterates the members of the object at ps->p: for each it
 * parses the key (into the arena when keep_keys) and calls fn, which must
 * consume the value. Returns 0 after the closing '}'.
 */
typedef int (*member_fn)(struct parser *ps, const unsigned char *start, const char *key, void *ctx);

static int walk_object(struct parser *ps, const unsigned char *start, member_fn fn, void *ctx)
{
	int err;
	skip_ws(ps);
	if (ps->p >= ps->end || *ps->p != '{')
		return bad(ps, start, "expected an object");
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '}') {
		ps->p++;
		return 0;
	}
	for (;;) {
		skip_ws(ps);
		const char *key = NULL;
		if ((err = parse_string(ps, start, &key)))
			return err;
		skip_ws(ps);
		if (ps->p >= ps->end || *ps->p != ':')
			return bad(ps, start, "expected ':'");
		ps->p++;
		skip_ws(ps);
		if ((err = fn(ps, start, key, ctx)))
			return err;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return bad(ps, start, "unterminated object");
		if (*ps->p == '}') {
			ps->p++;
			return 0;
		}
		if (*ps->p != ',')
			return bad(ps, start, "expected ',' or '}'");
		ps->p++;
	}
}

/* ---- dtypes ---- */

static const struct {
	const char *name;
	uint32_t size;
} dtypes[] = {
	{"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1},
	{"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2},
	{"I32", 4}, {"U32", 4}, {"F32", 4},
	{"F64", 8}, {"I64", 8}, {"U64", 8},
};

static uint32_t dtype_size(const char *s)
{
	for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
		if (strcmp(dtypes[i].name, s) == 0)
			return dtypes[i].size;
	return 0;
}

/* ---- the header's members ---- */

struct tensor_ctx {
	kylix_tensor *t;
	bool have_dtype, have_shape, have_offsets;
	uint64_t offs[2];
	uint32_t n_offs;
};

static int int_array(struct parser *ps, const unsigned char *start, uint64_t *dst, uint32_t max,
                     uint32_t *n, const char *what)
{
	int err;
	char msg[96];
	if (ps->p >= ps->end || *ps->p != '[') {
		snprintf(msg, sizeof msg, "%s is not an array", what);
		return bad(ps, start, msg);
	}
	ps->p++;
	*n = 0;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == ']') {
		ps->p++;
		return 0;
	}
	for (;;) {
		skip_ws(ps);
		uint64_t v = 0;
		if ((err = parse_uint(ps, start, &v)))
			return err;
		if (*n >= max) {
			snprintf(msg, sizeof msg, "%s has more than %u elements", what, max);
			return bad(ps, start, msg);
		}
		dst[(*n)++] = v;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return bad(ps, start, "unterminated array");
		if (*ps->p == ']') {
			ps->p++;
			return 0;
		}
		if (*ps->p != ',')
			return bad(ps, start, "expected ',' or ']'");
		ps->p++;
	}
}

static int tensor_member(struct parser *ps, const unsigned char *start, const char *key, void *vctx)
{
	struct tensor_ctx *c = vctx;
	int err;
	bool *have = NULL;
	if (strcmp(key, "dtype") == 0)
		have = &c->have_dtype;
	else if (strcmp(key, "shape") == 0)
		have = &c->have_shape;
	else if (strcmp(key, "data_offsets") == 0)
		have = &c->have_offsets;
	/* Keys of tensor objects are not kept: give their arena bytes back. */
	ps->arena_len -= strlen(key) + 1;
	if (!have)
		return skip_value(ps, start, 2); /* unknown fields are ignored, as by the reference */
	if (*have)
		return bad(ps, start, "duplicate key in a tensor");
	*have = true;
	if (have == &c->have_dtype) {
		const char *s = NULL;
		if ((err = parse_string(ps, start, &s)))
			return err;
		size_t l = strlen(s);
		uint32_t es = dtype_size(s);
		ps->arena_len -= l + 1;
		if (es == 0 || l >= KYLIX_DTYPE_LEN)
			return bad(ps, start, "unknown dtype");
		memcpy(c->t->dtype, s, l + 1);
		c->t->elem_size = es;
		return 0;
	}
	if (have == &c->have_shape)
		return int_array(ps, start, c->t->shape, KYLIX_MAX_DIMS, &c->t->ndim, "shape");
	return int_array(ps, start, c->offs, 2, &c->n_offs, "data_offsets");
}

struct kv_ctx {
	kylix_kv *kv;
	uint64_t n, cap;
};

static int metadata_member(struct parser *ps, const unsigned char *start, const char *key, void *vctx)
{
	struct kv_ctx *c = vctx;
	const char *val = NULL;
	int err;
	if (ps->p >= ps->end || *ps->p != '"')
		return bad(ps, start, "__metadata__ value is not a string");
	if ((err = parse_string(ps, start, &val)))
		return err;
	if (c->n == c->cap) {
		uint64_t nc = c->cap ? c->cap * 2 : 8;
		if (nc > KYLIX_MAX_TENSORS)
			return bad(ps, start, "too many __metadata__ entries");
		kylix_kv *kv = realloc(c->kv, nc * sizeof *kv);
		if (!kv)
			return kx_seterr(-ENOMEM, "safetensors header: out of memory");
		c->kv = kv;
		c->cap = nc;
	}
	c->kv[c->n].key = key;
	c->kv[c->n].value = val;
	c->n++;
	return 0;
}

struct top_ctx {
	struct header_alloc *h;
	uint64_t n, cap;
	uint64_t data_len;
	bool have_metadata;
	struct kv_ctx md;
};

static int top_member(struct parser *ps, const unsigned char *start, const char *key, void *vctx)
{
	struct top_ctx *c = vctx;
	int err;
	if (strcmp(key, "__metadata__") == 0) {
		if (c->have_metadata)
			return bad(ps, start, "duplicate key \"__metadata__\"");
		c->have_metadata = true;
		ps->arena_len -= strlen(key) + 1;
		if (ps->p >= ps->end || *ps->p != '{')
			return bad(ps, start, "__metadata__ is not an object");
		return walk_object(ps, start, metadata_member, &c->md);
	}
	if (c->n == c->cap) {
		uint64_t nc = c->cap ? c->cap * 2 : 64;
		if (c->cap >= KYLIX_MAX_TENSORS)
			return bad(ps, start, "more tensors than KYLIX_MAX_TENSORS");
		if (nc > KYLIX_MAX_TENSORS)
			nc = KYLIX_MAX_TENSORS;
		kylix_tensor *t = realloc(c->h->tensors, nc * sizeof *t);
		if (!t)
			return kx_seterr(-ENOMEM, "safetensors header: out of memory");
		c->h->tensors = t;
		c->cap = nc;
	}
	kylix_tensor *t = &c->h->tensors[c->n];
	memset(t, 0, sizeof *t);
	t->name = key;
	if (ps->p >= ps->end || *ps->p != '{')
		return bad(ps, start, "a tensor is not an object");
	struct tensor_ctx tc = {.t = t};
	if ((err = walk_object(ps, start, tensor_member, &tc)))
		return err;
	if (!tc.have_dtype || !tc.have_shape || !tc.have_offsets)
		return bad(ps, start, "tensor lacks dtype, shape or data_offsets");
	if (tc.n_offs != 2)
		return bad(ps, start, "data_offsets does not have 2 elements");
	t->begin = tc.offs[0];
	t->end = tc.offs[1];
	if (t->begin > t->end)
		return bad(ps, start, "data_offsets begin after end");
	/* bytes = product(shape) * elem_size, all within INT64_MAX. */
	uint64_t elems = 1;
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (t->shape[i] != 0 && elems > UINT64_C(0x7fffffffffffffff) / t->shape[i])
			return bad(ps, start, "shape has too many elements");
		elems *= t->shape[i];
	}
	if (elems > UINT64_C(0x7fffffffffffffff) / t->elem_size)
		return bad(ps, start, "shape is too large for its dtype");
	if (t->end - t->begin != elems * t->elem_size)
		return bad(ps, start, "data_offsets do not hold shape x dtype bytes");
	if (t->end > c->data_len)
		return bad(ps, start, "data_offsets run past the end of the file");
	t->nbytes = t->end - t->begin;
	c->n++;
	return 0;
}

/* utf8_valid checks RFC 3629 UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned char c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		uint32_t cp, min;
		if (c >= 0xC2 && c <= 0xDF) {
			len = 2; cp = c & 0x1F; min = 0x80;
		} else if (c >= 0xE0 && c <= 0xEF) {
			len = 3; cp = c & 0x0F; min = 0x800;
		} else if (c >= 0xF0 && c <= 0xF4) {
			len = 4; cp = c & 0x07; min = 0x10000;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3F);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
			return false;
		i += len;
	}
	return true;
}

static int cmp_tensor(const void *a, const void *b)
{
	const kylix_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_strp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* has_duplicate reports whether names[0..n) holds a name twice (sorts it). */
static const char *find_duplicate(const char **names, uint64_t n)
{
	qsort(names, n, sizeof *names, cmp_strp);
	for (uint64_t i = 1; i < n; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			return names[i];
	return NULL;
}

void kylix_free_header(kylix_header *h)
{
	if (!h)
		return;
	struct header_alloc *a = (struct header_alloc *)h;
	free(a->tensors);
	free(a->metadata);
	free(a->arena);
	free(a);
}

int kylix_parse_header(const void *buf, size_t len, uint64_t file_size, kylix_header **out)
{
	kx_clearerr();
	if (!out || (!buf && len))
		return kx_seterr(-EINVAL, "kylix_parse_header: NULL argument");
	*out = NULL;
	const unsigned char *b = buf;
	if (file_size < 8 || len < 8)
		return kx_seterr(-EBADMSG, "safetensors: file is shorter than the 8-byte header length");
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | b[i];
	if (n == 0)
		return kx_seterr(-EBADMSG, "safetensors: header length is 0");
	if (n > KYLIX_MAX_HEADER_LEN)
		return kx_seterr(-EBADMSG, "safetensors: header length %llu exceeds the %u-byte limit",
		                 (unsigned long long)n, KYLIX_MAX_HEADER_LEN);
	if (n > file_size - 8)
		return kx_seterr(-EBADMSG, "safetensors: header length %llu runs past the end of the %llu-byte file",
		                 (unsigned long long)n, (unsigned long long)file_size);
	if (len - 8 < n)
		return kx_seterr(-EBADMSG, "safetensors: header is %llu bytes but only %zu were given",
		                 (unsigned long long)n, len - 8);
	const unsigned char *js = b + 8;
	if (js[0] != '{')
		return kx_seterr(-EBADMSG, "safetensors: header does not start with '{'");
	if (!utf8_valid(js, n))
		return kx_seterr(-EBADMSG, "safetensors: header is not valid UTF-8");

	struct header_alloc *h = calloc(1, sizeof *h);
	if (!h)
		return kx_seterr(-ENOMEM, "safetensors: out of memory");
	h->arena = malloc(n + 1);
	if (!h->arena) {
		free(h);
		return kx_seterr(-ENOMEM, "safetensors: out of memory");
	}
	struct parser ps = {.p = js, .end = js + n, .arena = h->arena, .arena_cap = n + 1};
	struct top_ctx c = {.h = h, .data_len = file_size - 8 - n};
	int err = walk_object(&ps, js, top_member, &c);
	if (!err) {
		skip_ws(&ps);
		if (ps.p != ps.end)
			err = bad(&ps, js, "data after the header object");
	}
	h->metadata = c.md.kv;
	if (err) {
		kylix_free_header(&h->pub);
		return err;
	}
	/* Duplicate keys: top level (tensor names; __metadata__ was checked) and
	 * within __metadata__. */
	uint64_t nn = c.n > c.md.n ? c.n : c.md.n;
	const char **names = malloc((nn ? nn : 1) * sizeof *names);
	if (!names) {
		kylix_free_header(&h->pub);
		return kx_seterr(-ENOMEM, "safetensors: out of memory");
	}
	for (uint64_t i = 0; i < c.n; i++)
		names[i] = h->tensors[i].name;
	const char *dup = find_duplicate(names, c.n);
	if (!dup) {
		for (uint64_t i = 0; i < c.md.n; i++)
			names[i] = c.md.kv[i].key;
		dup = find_duplicate(names, c.md.n);
	}
	if (dup) {
		err = kx_seterr(-EBADMSG, "safetensors: duplicate key \"%.200s\"", dup);
		free(names);
		kylix_free_header(&h->pub);
		return err;
	}
	free(names);
	if (c.n)
		qsort(h->tensors, c.n, sizeof *h->tensors, cmp_tensor);
	for (uint64_t i = 0; i < c.n; i++) {
		h->tensors[i].offset = h->tensors[i].begin + 8 + n;
		if (i > 0 && h->tensors[i].begin < h->tensors[i - 1].end) {
			err = kx_seterr(-EBADMSG, "safetensors: tensor \"%.200s\" overlaps tensor \"%.200s\"",
			                h->tensors[i].name, h->tensors[i - 1].name);
			kylix_free_header(&h->pub);
			return err;
		}
	}
	h->pub.header_len = n;
	h->pub.data_start = 8 + n;
	h->pub.n_tensors = c.n;
	h->pub.tensors = h->tensors;
	h->pub.n_metadata = c.md.n;
	h->pub.metadata = c.md.kv;
	*out = &h->pub;
	return 0;
}
