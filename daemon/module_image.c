/*
 * module_image.c - the static device memory of a module image (see
 * module_image.h): a PTX declaration scanner, an ELF section walk and a
 * fatbin entry walk, each bounds-checked, since the bytes come from a
 * client.
 */
#include "module_image.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;

	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t le(const uint8_t *p, size_t n)
{
	uint64_t v = 0;

	for (size_t i = n; i-- > 0;)
		v = v << 8 | p[i];
	return v;
}

/* ---- PTX -------------------------------------------------------------- */

/* Bytes of one element of a PTX fundamental type; 0 when not a type. */
static uint64_t ptx_type_size(const char *t, size_t n)
{
	static const struct {
		const char *name;
		uint64_t size;
	} types[] = {
		{ ".b8", 1 },	  { ".u8", 1 },		{ ".s8", 1 },
		{ ".b16", 2 },	  { ".u16", 2 },	{ ".s16", 2 },
		{ ".f16", 2 },	  { ".bf16", 2 },	{ ".b32", 4 },
		{ ".u32", 4 },	  { ".s32", 4 },	{ ".f32", 4 },
		{ ".f16x2", 4 },  { ".bf16x2", 4 },	{ ".tf32", 4 },
		{ ".b64", 8 },	  { ".u64", 8 },	{ ".s64", 8 },
		{ ".f64", 8 },	  { ".b128", 16 },	{ ".pred", 1 },
		{ ".texref", 8 }, { ".samplerref", 8 }, { ".surfref", 8 },
	};

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (strlen(types[i].name) == n &&
		    memcmp(types[i].name, t, n) == 0)
			return types[i].size;
	return 0;
}

/* A PTX statement, comments gone: [p, end). */
struct span {
	const char *p;
	const char *end;
};

static bool word_is(const char *w, size_t n, const char *lit)
{
	return strlen(lit) == n && memcmp(w, lit, n) == 0;
}

/* The next word of s (letters, digits, '.', '_', '$', '%'), or 0 at a mark. */
static size_t next_word(struct span *s, const char **w)
{
	const char *p = s->p;

	while (p < s->end && isspace((unsigned char)*p))
		p++;
	*w = p;
	while (p < s->end && (isalnum((unsigned char)*p) || *p == '.' ||
			      *p == '_' || *p == '$' || *p == '%'))
		p++;
	s->p = p;
	return (size_t)(p - *w);
}

static void skip_space(struct span *s)
{
	while (s->p < s->end && isspace((unsigned char)*s->p))
		s->p++;
}

/* An unsigned number at s (decimal, 0x hex or octal), saturating. */
static bool parse_number(struct span *s, uint64_t *out)
{
	unsigned base = 10;
	uint64_t v = 0;
	bool any = false;

	skip_space(s);
	if (s->end - s->p > 2 && s->p[0] == '0' &&
	    (s->p[1] == 'x' || s->p[1] == 'X')) {
		base = 16;
		s->p += 2;
	} else if (s->p < s->end && s->p[0] == '0') {
		base = 8;
	}
	while (s->p < s->end) {
		int c = (unsigned char)*s->p, d;

		if (isdigit(c))
			d = c - '0';
		else if (base == 16 && isxdigit(c))
			d = tolower(c) - 'a' + 10;
		else
			break;
		if ((unsigned)d >= base)
			return false;
		v = sat_add(sat_mul(v, base), (uint64_t)d);
		any = true;
		s->p++;
	}
	if (s->p < s->end && (*s->p == 'U' || *s->p == 'u'))
		s->p++;
	*out = v;
	return any;
}

/*
 * Leaf values of the initializer at s (after '='): items between commas
 * and braces, up to the end of the declarator (a comma outside braces).
 */
static uint64_t initializer_items(struct span *s)
{
	uint64_t items = 0;
	int depth = 0;
	bool item = false;

	for (; s->p < s->end; s->p++) {
		char c = *s->p;

		if (c == '{' || c == '(') {
			depth++;
		} else if (c == '}' || c == ')') {
			if (depth > 0)
				depth--;
		} else if (c == ',' && depth == 0) {
			break;
		}
		if (c == ',' || c == '{' || c == '}') {
			items += item;
			item = false;
		} else if (!isspace((unsigned char)c)) {
			item = true;
		}
	}
	return items + item;
}

static uint64_t round_up(uint64_t v, uint64_t align)
{
	if (align <= 1)
		return v;
	return sat_mul((v / align) + (v % align != 0), align);
}

/*
 * The bytes the declarators of a .global statement take: s is past the
 * directives, at the first name; elem is the element size, align the
 * declared alignment (0: natural).
 */
static uint64_t ptx_declarators(struct span *s, uint64_t elem, uint64_t align)
{
	uint64_t total = 0;

	for (;;) {
		const char *w;
		uint64_t count = 1, dim, bytes;
		bool open_dim = false;

		if (next_word(s, &w) == 0)
			break;
		for (;;) {
			skip_space(s);
			if (s->p >= s->end || *s->p != '[')
				break;
			s->p++;
			skip_space(s);
			if (s->p < s->end && *s->p == ']')
				open_dim = true;
			else if (parse_number(s, &dim))
				count = sat_mul(count, dim);
			while (s->p < s->end && *s->p != ']')
				s->p++;
			if (s->p < s->end)
				s->p++;
		}
		skip_space(s);
		if (s->p < s->end && *s->p == '=') {
			uint64_t items;

			s->p++;
			items = initializer_items(s);
			/*
			 * x[][n] = {...}: as many elements as it lists, in
			 * whole rows of the dimensions it gives.
			 */
			if (open_dim)
				count = round_up(items, count);
		} else if (open_dim) {
			count = 0; /* no storage without a size */
		}
		bytes = sat_mul(count, elem);
		total = sat_add(total, round_up(bytes, align ? align : elem));
		skip_space(s);
		if (s->p >= s->end || *s->p != ',')
			break;
		s->p++;
	}
	return total;
}

/* Past a parenthesised list at s (".attribute(.unified(19, 95))"). */
static void skip_parens(struct span *s)
{
	int depth = 0;

	skip_space(s);
	if (s->p >= s->end || *s->p != '(')
		return;
	for (; s->p < s->end; s->p++) {
		if (*s->p == '(')
			depth++;
		else if (*s->p == ')' && --depth == 0) {
			s->p++;
			return;
		}
	}
}

/*
 * The bytes a PTX statement declares in .global; 0 for anything else.  A
 * statement runs from the previous ';', so it may begin with directives
 * that take none (.version, .target, .address_size) or with the end of a
 * function: the declaration is the .global word, the qualifiers right
 * before it, and what follows it.  A .global inside parentheses (a
 * parameter's ".ptr .global") declares no variable.  A .global declaration
 * this cannot size (a qualifier or type it does not know: .texref, a
 * future attribute) sets *unknown: counted as none, it would make the
 * module look free of globals, and such a module is shared between
 * services (module.c).
 */
static uint64_t ptx_statement(struct span st, bool *unknown)
{
	struct span s = st;
	uint64_t elem = 0, vec = 1, align = 0;
	const char *w, *prev[2] = { NULL, NULL };
	size_t n, prev_n[2] = { 0, 0 };
	int depth = 0;

	for (;;) {
		while (s.p < s.end && !isalnum((unsigned char)*s.p) &&
		       *s.p != '.' && *s.p != '_' && *s.p != '$' &&
		       *s.p != '%') {
			if (*s.p == '(' || *s.p == '[')
				depth++;
			else if ((*s.p == ')' || *s.p == ']') && depth > 0)
				depth--;
			else if (*s.p == '=' || *s.p == '{' || *s.p == '}')
				prev[0] = prev[1] = NULL;
			if (*s.p == '=')
				return 0; /* an initializer before any .global */
			s.p++;
		}
		n = next_word(&s, &w);
		if (n == 0)
			return 0;
		if (word_is(w, n, ".global") && depth == 0)
			break;
		prev[1] = prev[0];
		prev_n[1] = prev_n[0];
		prev[0] = w;
		prev_n[0] = n;
	}
	/* ".extern .global" or ".extern .visible .global": storage elsewhere. */
	for (int k = 0; k < 2; k++)
		if (prev[k] != NULL && word_is(prev[k], prev_n[k], ".extern"))
			return 0;
	for (;;) {
		const char *save = s.p;

		n = next_word(&s, &w);
		if (n == 0 || w[0] != '.') {
			s.p = save;
			break;
		}
		if (word_is(w, n, ".align")) {
			if (!parse_number(&s, &align)) {
				*unknown = true;
				return 0;
			}
		} else if (word_is(w, n, ".attribute")) {
			/* .managed, .unified(...): __managed__ variables
			 * are .global storage like any other. */
			skip_parens(&s);
		} else if (word_is(w, n, ".v2") || word_is(w, n, ".v4") ||
			   word_is(w, n, ".v8")) {
			vec = (uint64_t)(w[2] - '0');
		} else if (ptx_type_size(w, n) != 0) {
			elem = ptx_type_size(w, n);
		} else {
			*unknown = true;
			return 0;
		}
	}
	if (elem == 0) {
		*unknown = true;
		return 0;
	}
	return ptx_declarators(&s, elem * vec, align);
}

/*
 * PTX text with its comments and strings out (each becomes a space), in a
 * buffer the caller frees, *out_len bytes long (and NUL-terminated); NULL
 * when there is no memory.
 */
static char *ptx_clean(const char *p, size_t len, size_t *out_len)
{
	const char *end = p + len;
	char *clean = malloc(len + 1);
	size_t k = 0;

	if (clean == NULL)
		return NULL;
	while (p < end) {
		if (end - p >= 2 && p[0] == '/' && p[1] == '/') {
			while (p < end && *p != '\n')
				p++;
			clean[k++] = ' ';
		} else if (end - p >= 2 && p[0] == '/' && p[1] == '*') {
			p += 2;
			while (end - p >= 2 && !(p[0] == '*' && p[1] == '/'))
				p++;
			p = end - p >= 2 ? p + 2 : end;
			clean[k++] = ' ';
		} else if (*p == '"') {
			/* .file names: skipped whole, ';' and all. */
			p++;
			while (p < end && *p != '"')
				p++;
			if (p < end)
				p++;
			clean[k++] = ' ';
		} else {
			clean[k++] = *p++;
		}
	}
	clean[k] = '\0';
	*out_len = k;
	return clean;
}

/* The .global bytes of PTX text; *unknown set when a part was not read. */
static uint64_t ptx_static_bytes(const char *p, size_t len, bool *unknown)
{
	uint64_t total = 0;
	size_t k;
	char *clean = ptx_clean(p, len, &k);

	if (clean == NULL) {
		*unknown = true;
		return 0;
	}
	/* Statement by statement. */
	for (size_t i = 0, from = 0; i <= k; i++) {
		if (i == k || clean[i] == ';') {
			struct span st = { clean + from, clean + i };

			total = sat_add(total, ptx_statement(st, unknown));
			from = i + 1;
		}
	}
	free(clean);
	return total;
}

/* ---- ELF (cubin) --------------------------------------------------------- */

static const uint8_t elf_magic[4] = { 0x7f, 'E', 'L', 'F' };

/* Is the string at nm (room bytes left in its table) lit? */
static bool name_is(const char *nm, size_t room, const char *lit)
{
	size_t n = strlen(lit) + 1;

	return room >= n && memcmp(nm, lit, n) == 0;
}

/* The section headers of a little-endian ELF64, checked to lie inside it. */
struct elf {
	const uint8_t *b;
	size_t len;
	const uint8_t *sh; /* the first section header */
	size_t shentsize;
	size_t shnum;
	const uint8_t *strs; /* the section name table */
	uint64_t strs_size;
};

/* Read b's headers into e; false: not an ELF64 this can read. */
static bool elf_open(const uint8_t *b, size_t len, struct elf *e)
{
	uint64_t shoff, strs_off;
	size_t shstrndx;

	if (len < 64 || memcmp(b, elf_magic, 4) != 0 || b[4] != 2 || b[5] != 1)
		return false; /* ELF64, little-endian only */
	shoff = le(b + 0x28, 8);
	e->shentsize = (size_t)le(b + 0x3a, 2);
	e->shnum = (size_t)le(b + 0x3c, 2);
	shstrndx = (size_t)le(b + 0x3e, 2);
	if (e->shentsize < 64 || e->shnum == 0 || shstrndx >= e->shnum ||
	    shoff > len || (len - shoff) / e->shentsize < e->shnum)
		return false;
	e->b = b;
	e->len = len;
	e->sh = b + shoff;
	strs_off = le(e->sh + shstrndx * e->shentsize + 0x18, 8);
	e->strs_size = le(e->sh + shstrndx * e->shentsize + 0x20, 8);
	if (strs_off > len || e->strs_size > len - strs_off)
		return false;
	e->strs = b + strs_off;
	return true;
}

/*
 * The name of section header sh: its bytes in the table and the room left
 * there (what follows may not be NUL-terminated); false when it points
 * outside.  The name is compared within that room, terminator included,
 * and read once: the bytes may be a client's region, which it can change
 * while they are read (a strnlen, then a strcmp, could run past the table,
 * and past the mapping).
 */
static bool elf_section_name(const struct elf *e, const uint8_t *sh,
			     const char **nm, size_t *room)
{
	uint64_t name = le(sh, 4);

	if (name >= e->strs_size)
		return false;
	*nm = (const char *)e->strs + name;
	*room = (size_t)(e->strs_size - name);
	return true;
}

/* The .nv.global sections of a little-endian ELF64; false: not readable. */
static bool elf_static_bytes(const uint8_t *b, size_t len, uint64_t *out)
{
	struct elf e;
	uint64_t total = 0;

	if (!elf_open(b, len, &e))
		return false;
	for (size_t i = 0; i < e.shnum; i++) {
		const uint8_t *sh = e.sh + i * e.shentsize;
		const char *nm;
		size_t room;

		if (!elf_section_name(&e, sh, &nm, &room))
			continue;
		if (name_is(nm, room, ".nv.global") ||
		    name_is(nm, room, ".nv.global.init"))
			total = sat_add(total, le(sh + 0x20, 8));
	}
	*out = total;
	return true;
}

/* ---- fatbin ----------------------------------------------------------- */

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_KIND_PTX 1
#define FATBIN_KIND_ELF 2
/*
 * Entry flags that mark a compressed payload: 0x8000 a zstd frame (CUDA 13
 * compresses every entry so by default), 0x2000 the older LZ-style
 * compression, which is not read here.
 */
#define FATBIN_ZSTD 0x8000u
#define FATBIN_COMPRESSED 0xA000u
/*
 * What the compressed entries of one image may expand to, all together:
 * FATBIN_EXPAND_RATIO times the image's own size, and FATBIN_MAX_EXPANDED
 * at most.  A zstd frame states its size and expands some 30000 to 1 (a
 * few kilobytes for 256 MiB of one byte), and this runs on the device
 * thread: a client's bytes buy work in proportion to their number.  Real
 * device code compresses a few times over; entries past the budget are
 * not read (any one entry tells the globals).
 */
#define FATBIN_EXPAND_RATIO 64u
#define FATBIN_MAX_EXPANDED (64u << 20)

/*
 * The zstd payload of an entry expanded (the caller frees it), or NULL:
 * not a frame, a size it does not state or past *budget (what the image
 * may still expand: a frame tried takes its size from it), a frame that
 * does not decode.
 */
static uint8_t *fatbin_expand(const uint8_t *p, size_t n, uint64_t *budget,
			      size_t *out_len)
{
	unsigned long long size = ZSTD_getFrameContentSize(p, n);
	uint8_t *buf;
	size_t got;

	if (size == ZSTD_CONTENTSIZE_UNKNOWN ||
	    size == ZSTD_CONTENTSIZE_ERROR || size == 0 || size > *budget)
		return NULL;
	*budget -= size;
	/* The payload is padded to 8 bytes: the frame ends before that. */
	n = ZSTD_findFrameCompressedSize(p, n);
	if (ZSTD_isError(n))
		return NULL;
	buf = malloc((size_t)size + 1);
	if (buf == NULL)
		return NULL;
	got = ZSTD_decompress(buf, (size_t)size, p, n);
	if (ZSTD_isError(got) || got != size) {
		free(buf);
		return NULL;
	}
	buf[got] = 0;
	*out_len = got;
	return buf;
}

/* The static bytes of one fatbin entry's (plain) payload; false: unreadable. */
static bool fatbin_entry(uint64_t kind, const uint8_t *p, size_t n,
			 uint64_t *out)
{
	bool unknown = false;

	*out = 0;
	if (kind == FATBIN_KIND_ELF)
		return elf_static_bytes(p, n, out);
	if (kind == FATBIN_KIND_PTX)
		*out = ptx_static_bytes((const char *)p,
					strnlen((const char *)p, n), &unknown);
	return !unknown;
}

/* What fatbin_walk hands each entry to. */
typedef void fatbin_entry_fn(void *arg, uint64_t kind, const uint8_t *p,
			     size_t n);

/*
 * Hand fn(arg, ...) each PTX or ELF entry of fatbin b, with its payload
 * plain (as stored, or zstd-expanded within the image's budget), or with
 * p NULL when it cannot be read.  False when the fatbin's headers are
 * malformed: the entries past the first bad one are not seen.
 */
static bool fatbin_walk(const uint8_t *b, size_t len, fatbin_entry_fn *fn,
			void *arg)
{
	uint64_t hsize, fsize, off;
	uint64_t budget = sat_mul(len, FATBIN_EXPAND_RATIO);

	if (budget > FATBIN_MAX_EXPANDED)
		budget = FATBIN_MAX_EXPANDED;
	if (len < 16)
		return false;
	hsize = le(b + 6, 2);
	fsize = le(b + 8, 8);
	if (hsize < 16 || hsize > len || fsize > len - hsize)
		return false;
	for (off = hsize; off + 0x40 <= hsize + fsize;) {
		const uint8_t *e = b + off;
		uint64_t kind = le(e, 2), ehsize = le(e + 4, 4);
		uint64_t psize = le(e + 8, 8), flags = le(e + 0x28, 8);
		const uint8_t *payload;

		if (ehsize < 0x40 || ehsize > hsize + fsize - off ||
		    psize > hsize + fsize - off - ehsize)
			return false;
		payload = e + ehsize;
		if (kind != FATBIN_KIND_ELF && kind != FATBIN_KIND_PTX) {
			/* not device code */
		} else if ((flags & FATBIN_COMPRESSED) == 0) {
			fn(arg, kind, payload, (size_t)psize);
		} else if (flags & FATBIN_ZSTD) {
			size_t n = 0;
			uint8_t *plain = fatbin_expand(payload, (size_t)psize,
						       &budget, &n);

			fn(arg, kind, plain, n);
			free(plain);
		} else {
			fn(arg, kind, NULL, 0);
		}
		off += ehsize + psize;
	}
	return true;
}

/* The static bytes of a fatbin so far (fatbin_walk's arg). */
struct fatbin_bytes {
	uint64_t most;
	bool read_one;
};

static void fatbin_bytes_entry(void *arg, uint64_t kind, const uint8_t *p,
			       size_t n)
{
	struct fatbin_bytes *fb = arg;
	uint64_t v = 0;
	bool ok = p != NULL && fatbin_entry(kind, p, n, &v);

	/* A part read of PTX is still a lower bound. */
	fb->read_one = fb->read_one || ok;
	if (v > fb->most)
		fb->most = v;
}

/*
 * Every entry of one fatbin comes from one translation unit, so its
 * globals are the same whichever the driver loads: the largest readable
 * entry counts, and the image is known when any entry could be read.
 */
static uint64_t fatbin_static_bytes(const uint8_t *b, size_t len,
				    enum module_image_known *known)
{
	struct fatbin_bytes fb = { 0, false };

	if (!fatbin_walk(b, len, fatbin_bytes_entry, &fb) || !fb.read_one)
		*known = MODULE_IMAGE_UNKNOWN;
	return fb.most;
}

uint64_t module_image_static_bytes(const void *image, size_t len,
				   enum module_image_known *known)
{
	const uint8_t *b = image;
	enum module_image_known k = MODULE_IMAGE_KNOWN;
	uint64_t v = 0;

	if (image == NULL || len == 0) {
		/* nothing */
	} else if (len >= 4 && le(b, 4) == FATBIN_MAGIC) {
		v = fatbin_static_bytes(b, len, &k);
	} else if (len >= 4 && memcmp(b, elf_magic, 4) == 0) {
		if (!elf_static_bytes(b, len, &v))
			k = MODULE_IMAGE_UNKNOWN;
	} else {
		bool unknown = false;

		v = ptx_static_bytes(image, strnlen(image, len), &unknown);
		if (unknown)
			k = MODULE_IMAGE_UNKNOWN;
	}
	if (known != NULL)
		*known = k;
	return v;
}

/* ---- kernel parameters ---------------------------------------------------- */

/* One kernel's parameters, as one part of an image declares them. */
struct kernel_params {
	char *name;
	bool known; /* false: parts of the image disagree */
	size_t n;
	size_t *size;
};

struct module_image_params {
	struct kernel_params *k; /* sorted by name, once read */
	size_t count;
	size_t cap;
	bool oom; /* an allocation failed while reading */
};

/* Note that name (len bytes) takes n parameters of size[i] bytes. */
static void params_add(struct module_image_params *t, const char *name,
		       size_t len, const size_t *size, size_t n)
{
	struct kernel_params *k;

	if (t->oom)
		return;
	if (t->count == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct kernel_params *more = realloc(t->k, cap * sizeof(*more));

		if (more == NULL) {
			t->oom = true;
			return;
		}
		t->k = more;
		t->cap = cap;
	}
	k = &t->k[t->count];
	k->name = malloc(len + 1);
	k->size = malloc(n ? n * sizeof(*size) : 1);
	if (k->name == NULL || k->size == NULL) {
		free(k->name);
		free(k->size);
		t->oom = true;
		return;
	}
	memcpy(k->name, name, len);
	k->name[len] = '\0';
	if (n > 0)
		memcpy(k->size, size, n * sizeof(*size));
	k->n = n;
	k->known = true;
	t->count++;
}

/* Append v to the n sizes at *a (room for *cap); false: no memory. */
static bool sizes_push(size_t **a, size_t *n, size_t *cap, size_t v)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 8;
		size_t *more = realloc(*a, c * sizeof(*more));

		if (more == NULL)
			return false;
		*a = more;
		*cap = c;
	}
	(*a)[(*n)++] = v;
	return true;
}

/* ---- PTX .entry parameter lists */

/*
 * The next word of s up to a '.' past its first character, so that
 * directives written together (".v4.u32") read as two.
 */
static size_t next_piece(struct span *s, const char **w)
{
	skip_space(s);
	*w = s->p;
	if (s->p < s->end && *s->p == '.')
		s->p++;
	while (s->p < s->end && (isalnum((unsigned char)*s->p) ||
				 *s->p == '_' || *s->p == '$' || *s->p == '%'))
		s->p++;
	return (size_t)(s->p - *w);
}

/* A PTX identifier: no directive, no number, no dot inside. */
static bool ptx_ident(const char *w, size_t n)
{
	if (n == 0 || w[0] == '.' || isdigit((unsigned char)w[0]))
		return false;
	return memchr(w, '.', n) == NULL;
}

/*
 * The bytes of one parameter of an .entry list at s (".param", its
 * directives, its name, its array dimensions), or 0 when this cannot read
 * it: a type it does not know or an opaque one (.texref and the like have
 * no size the launch could check), an attribute it does not know, an array
 * without a size.
 */
static uint64_t ptx_param(struct span *s)
{
	uint64_t elem = 0, vec = 1, count = 1, v;
	bool ptr = false;
	const char *w;
	size_t n;

	n = next_piece(s, &w);
	if (!word_is(w, n, ".param"))
		return 0;
	for (;;) {
		const char *save = s->p;

		n = next_piece(s, &w);
		if (n == 0 || w[0] != '.') {
			s->p = save;
			break;
		}
		if (word_is(w, n, ".align")) {
			if (!parse_number(s, &v) || v == 0)
				return 0;
		} else if (word_is(w, n, ".ptr")) {
			/* ".u64 .ptr .global .align 8": what the pointer
			 * points at, not the parameter. */
			ptr = true;
		} else if (ptr && (word_is(w, n, ".global") ||
				   word_is(w, n, ".shared") ||
				   word_is(w, n, ".const") ||
				   word_is(w, n, ".local"))) {
			/* the pointee's state space */
		} else if (word_is(w, n, ".v2") || word_is(w, n, ".v4")) {
			vec = (uint64_t)(w[2] - '0');
		} else if (elem == 0 && !word_is(w, n, ".pred") &&
			   !word_is(w, n, ".texref") &&
			   !word_is(w, n, ".samplerref") &&
			   !word_is(w, n, ".surfref") &&
			   ptx_type_size(w, n) != 0) {
			elem = ptx_type_size(w, n);
		} else {
			return 0;
		}
	}
	n = next_word(s, &w);
	if (elem == 0 || !ptx_ident(w, n))
		return 0;
	for (;;) {
		skip_space(s);
		if (s->p >= s->end || *s->p != '[')
			break;
		s->p++;
		if (!parse_number(s, &v) || v == 0)
			return 0;
		skip_space(s);
		if (s->p >= s->end || *s->p != ']')
			return 0;
		s->p++;
		count = sat_mul(count, v);
	}
	return sat_mul(sat_mul(elem, vec), count);
}

/*
 * The kernel whose ".entry" s is just past: its name, then its parameter
 * list in parentheses, or none at all (the list is optional: then the
 * body or a performance directive follows).  A list this cannot read to
 * its ')' notes nothing.
 */
static void ptx_entry(struct span *s, struct module_image_params *t)
{
	const char *name;
	size_t name_len = next_word(s, &name);
	size_t *size = NULL, n = 0, cap = 0;

	if (!ptx_ident(name, name_len))
		return;
	skip_space(s);
	if (s->p < s->end && *s->p == '(') {
		s->p++;
		skip_space(s);
		if (s->p < s->end && *s->p == ')')
			s->p++;
		else
			for (;;) {
				uint64_t bytes = ptx_param(s);

				if (bytes == 0 || bytes > SIZE_MAX)
					goto out;
				if (!sizes_push(&size, &n, &cap,
						(size_t)bytes)) {
					t->oom = true;
					goto out;
				}
				skip_space(s);
				if (s->p < s->end && *s->p == ',') {
					s->p++;
				} else if (s->p < s->end && *s->p == ')') {
					s->p++;
					break;
				} else {
					goto out;
				}
			}
	} else if (s->p >= s->end || (*s->p != '{' && *s->p != '.')) {
		return;
	}
	params_add(t, name, name_len, size, n);
out:
	free(size);
}

/*
 * The kernels of PTX text: each .entry outside any braces (a function's
 * body, an initializer), comments and strings out.
 */
static void ptx_params(const char *p, size_t len, struct module_image_params *t)
{
	size_t k;
	char *clean = ptx_clean(p, len, &k);
	struct span s;
	int depth = 0;

	if (clean == NULL) {
		t->oom = true;
		return;
	}
	s.p = clean;
	s.end = clean + k;
	while (s.p < s.end && !t->oom) {
		const char *w;
		size_t n;

		if (*s.p == '{') {
			depth++;
			s.p++;
		} else if (*s.p == '}') {
			if (depth > 0)
				depth--;
			s.p++;
		} else if (!isalnum((unsigned char)*s.p) && *s.p != '.' &&
			   *s.p != '_' && *s.p != '$' && *s.p != '%') {
			s.p++;
		} else {
			n = next_word(&s, &w);
			if (depth == 0 && word_is(w, n, ".entry"))
				ptx_entry(&s, t);
		}
	}
	free(clean);
}

/* ---- cubin .nv.info.<kernel> attributes */

#define SHT_CUDA_INFO 0x70000000u
/*
 * Attribute formats: no value, a byte, a half word (each 4 bytes in all),
 * or a value of the length that follows.  The no-value records are 4 bytes
 * too: nvcc 13's sm_75 and sm_80 cubins have them (attributes 0x04, 0x35)
 * before the parameter records, and only at 4 do the sections parse to
 * their ends (check_module_image, fixtures/params.sm_80.cubin).
 */
#define EIFMT_NVAL 1
#define EIFMT_BVAL 2
#define EIFMT_HVAL 3
#define EIFMT_SVAL 4
#define EIATTR_PARAM_CBANK 0x0a /* symbol, offset:16, size:16 */
#define EIATTR_KPARAM_INFO 0x17 /* index, ordinal:16, offset:16, flags:32 */
#define EIATTR_CBANK_PARAM_SIZE 0x19 /* the parameters' bytes in all */
/* index, ordinal:16, offset:16, size:16, flags:16 */
#define EIATTR_KPARAM_INFO_V2 0x45
#define KPARAM_RECORD 12

/* One parameter as a KPARAM record says. */
struct kparam {
	uint64_t offset;
	uint64_t size;
	bool seen;
};

/*
 * The parameters of the kernel whose .nv.info.<name> section is p (n
 * bytes): one KPARAM record per parameter, in any order.  Taken only when
 * the section parses to its end, the ordinals are 0..count-1 once each,
 * every size is non-zero, each parameter starts past the end of the one
 * before, and the last ends where EIATTR_CBANK_PARAM_SIZE (and
 * EIATTR_PARAM_CBANK, when there) says the parameters end: anything less
 * is a layout this does not know.  A kernel without records may take no
 * parameters or be described some other way, and is left unknown.
 */
static void elf_kernel_params(const char *name, size_t name_len,
			      const uint8_t *p, size_t n,
			      struct module_image_params *t)
{
	struct kparam *kp;
	size_t *size = NULL, count = 0, max = n / (4 + KPARAM_RECORD);
	uint64_t cbank_size = 0, bank_size = 0, end = 0;
	bool has_cbank_size = false, has_bank = false, ok = false;

	if (max == 0)
		return;
	kp = calloc(max, sizeof(*kp));
	if (kp == NULL) {
		t->oom = true;
		return;
	}
	for (size_t q = 0; q < n;) {
		unsigned fmt, attr;
		const uint8_t *v;
		size_t vlen = 2;

		if (n - q < 4)
			goto out;
		fmt = p[q];
		attr = p[q + 1];
		v = p + q + 2;
		if (fmt == EIFMT_SVAL) {
			vlen = (size_t)le(p + q + 2, 2);
			v = p + q + 4;
			if (vlen > n - q - 4)
				goto out;
			q += 4 + vlen;
		} else if (fmt == EIFMT_NVAL || fmt == EIFMT_BVAL ||
			   fmt == EIFMT_HVAL) {
			q += 4;
		} else {
			goto out;
		}
		if (attr == EIATTR_KPARAM_INFO ||
		    attr == EIATTR_KPARAM_INFO_V2) {
			uint64_t ord, sz;

			if (fmt != EIFMT_SVAL || vlen != KPARAM_RECORD)
				goto out;
			ord = le(v + 4, 2);
			sz = attr == EIATTR_KPARAM_INFO ? le(v + 8, 4) >> 18 :
							  le(v + 8, 2);
			/* At most max records fit: a larger ordinal leaves
			 * a gap. */
			if (ord >= max || kp[ord].seen || sz == 0)
				goto out;
			kp[ord].offset = le(v + 6, 2);
			kp[ord].size = sz;
			kp[ord].seen = true;
			count++;
		} else if (attr == EIATTR_CBANK_PARAM_SIZE) {
			if (fmt != EIFMT_HVAL)
				goto out;
			cbank_size = le(v, 2);
			has_cbank_size = true;
		} else if (attr == EIATTR_PARAM_CBANK) {
			if (fmt != EIFMT_SVAL || vlen != 8)
				goto out;
			bank_size = le(v + 6, 2);
			has_bank = true;
		}
	}
	if (count == 0 || !has_cbank_size ||
	    (has_bank && bank_size != cbank_size))
		goto out;
	size = malloc(count * sizeof(*size));
	if (size == NULL) {
		t->oom = true;
		goto out;
	}
	for (size_t i = 0; i < count; i++) {
		if (!kp[i].seen || kp[i].offset < end)
			goto out;
		end = kp[i].offset + kp[i].size;
		size[i] = (size_t)kp[i].size;
	}
	ok = end == cbank_size;
out:
	if (ok)
		params_add(t, name, name_len, size, count);
	free(size);
	free(kp);
}

/*
 * The kernels of a little-endian ELF64 (a cubin): its .nv.info.<name>.
 * The sections of a cubin do not overlap, nor do their names, so all the
 * names and attributes read here fit in the image once: so much is read
 * at most (headers that all point at the same megabyte would otherwise
 * have it walked once each, on the device thread).
 */
static void elf_params(const uint8_t *b, size_t len,
		       struct module_image_params *t)
{
	static const char prefix[] = ".nv.info.";
	const size_t plen = sizeof(prefix) - 1;
	uint64_t names_left, data_left = len;
	struct elf e;

	if (!elf_open(b, len, &e))
		return;
	names_left = e.strs_size;
	for (size_t i = 0; i < e.shnum && !t->oom; i++) {
		const uint8_t *sh = e.sh + i * e.shentsize;
		uint64_t off = le(sh + 0x18, 8), size = le(sh + 0x20, 8);
		const char *nm, *end;
		size_t room;

		if (le(sh + 4, 4) != SHT_CUDA_INFO ||
		    !elf_section_name(&e, sh, &nm, &room) || room <= plen ||
		    memcmp(nm, prefix, plen) != 0 || off > len ||
		    size > len - off)
			continue;
		if (room - plen > names_left)
			room = (size_t)names_left + plen;
		end = memchr(nm + plen, '\0', room - plen);
		if (end == NULL || size > data_left)
			return; /* past what one image holds */
		names_left -= (uint64_t)(end - nm - plen) + 1;
		data_left -= size;
		if (end > nm + plen)
			elf_kernel_params(nm + plen, (size_t)(end - nm - plen),
					  b + off, (size_t)size, t);
	}
}

/* ---- the table */

static void fatbin_params_entry(void *arg, uint64_t kind, const uint8_t *p,
				size_t n)
{
	if (p == NULL)
		return;
	if (kind == FATBIN_KIND_ELF)
		elf_params(p, n, arg);
	else
		ptx_params((const char *)p, strnlen((const char *)p, n), arg);
}

static int params_by_name(const void *a, const void *b)
{
	const struct kernel_params *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static bool params_equal(const struct kernel_params *a,
			 const struct kernel_params *b)
{
	return a->n == b->n &&
	       (a->n == 0 ||
		memcmp(a->size, b->size, a->n * sizeof(*a->size)) == 0);
}

/*
 * Sort t by name and keep one entry per kernel: the parts of an image
 * (fatbin entries, a name declared twice) must agree, or the kernel is
 * unknown.
 */
static void params_merge(struct module_image_params *t)
{
	size_t out = 0;

	if (t->count == 0)
		return;
	qsort(t->k, t->count, sizeof(*t->k), params_by_name);
	for (size_t i = 1; i < t->count; i++) {
		struct kernel_params *keep = &t->k[out];

		if (strcmp(t->k[i].name, keep->name) == 0) {
			if (!params_equal(&t->k[i], keep))
				keep->known = false;
			free(t->k[i].name);
			free(t->k[i].size);
		} else {
			t->k[++out] = t->k[i];
		}
	}
	t->count = out + 1;
}

int module_image_params_read(const void *image, size_t len,
			     struct module_image_params **out)
{
	struct module_image_params *t = calloc(1, sizeof(*t));
	const uint8_t *b = image;

	if (t == NULL)
		return -ENOMEM;
	if (image == NULL || len == 0) {
		/* nothing */
	} else if (len >= 4 && le(b, 4) == FATBIN_MAGIC) {
		(void)fatbin_walk(b, len, fatbin_params_entry, t);
	} else if (len >= 4 && memcmp(b, elf_magic, 4) == 0) {
		elf_params(b, len, t);
	} else {
		ptx_params(image, strnlen(image, len), t);
	}
	if (t->oom) {
		module_image_params_free(t);
		return -ENOMEM;
	}
	params_merge(t);
	*out = t;
	return 0;
}

bool module_image_params_find(const struct module_image_params *t,
			      const char *name, size_t *n, const size_t **sizes)
{
	struct kernel_params key = { .name = (char *)name };
	const struct kernel_params *k;

	if (t == NULL || t->count == 0)
		return false;
	k = bsearch(&key, t->k, t->count, sizeof(*t->k), params_by_name);
	if (k == NULL || !k->known)
		return false;
	*n = k->n;
	*sizes = k->size;
	return true;
}

void module_image_params_free(struct module_image_params *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->count; i++) {
		free(t->k[i].name);
		free(t->k[i].size);
	}
	free(t->k);
	free(t);
}
