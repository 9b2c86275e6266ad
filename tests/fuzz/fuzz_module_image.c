/*
 * fuzz_module_image.c - libFuzzer harness for module_image_static_bytes
 * and module_image_params_read (daemon/module_image.c): the size of a
 * module's globals and the parameter lists of its kernels, read from the
 * PTX, cubin or fatbin bytes a client sends, on the device thread and on
 * the session's compile threads.
 *
 * The input is the image, as is.  The harness checks what module_image.h
 * promises:
 *   - the same bytes give the same size and the same known, and known may
 *     be NULL;
 *   - PTX text (neither magic) is always known;
 *   - wrapped in a fatbin as its one entry (kind ELF for an ELF, else PTX),
 *     stored plain and zstd-compressed, an image counts what it counts
 *     alone: the fatbin walk and the expansion read the payload the way
 *     the image is read on its own (compressed, within the budget of
 *     module_image.c: expanding past 64 times the fatbin's size, it is
 *     not read at all).
 *   - the parameter table reads the same twice; every parameter it knows
 *     has a size, and a kernel has no more parameters than the image has
 *     bytes; wrapped in a fatbin as above (plain, twice over, compressed),
 *     the image's kernels are known alike (the names asked about: a few
 *     fixed ones and those the input spells after ".entry" or
 *     ".nv.info.").
 * Sanitizers (ASan, UBSan) and libFuzzer's -malloc_limit_mb/-rss_limit_mb
 * watch the rest: a client's bytes must not make the daemon read out of
 * bounds, loop, or allocate far past what it sent.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "module_image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define expect(cond)                                                      \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "fuzz_module_image: %s:%d: %s\n", \
				__FILE__, __LINE__, #cond);               \
			abort();                                          \
		}                                                         \
	} while (0)

/* Larger inputs are read as they are, not wrapped (time per input). */
#define WRAP_MAX (64u << 10)
#define FATBIN_MAGIC 0xBA55ED50u
#define ENTRY_HEADER 0x40u
/* module_image.c: a fatbin's entries expand to 64 times its size at most. */
#define EXPAND_RATIO 64u

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

/*
 * A fatbin whose copies entries (kind, flags) each carry payload; NULL: no
 * memory.
 */
static uint8_t *fatbin_copies(uint16_t kind, uint64_t flags,
			      const void *payload, size_t n, unsigned copies,
			      size_t *len)
{
	size_t entry = ENTRY_HEADER + n, total = 16 + entry * copies;
	uint8_t *b = calloc(1, total);

	if (b == NULL)
		return NULL;
	put_le(b, FATBIN_MAGIC, 4);
	put_le(b + 4, 1, 2);		  /* version */
	put_le(b + 6, 16, 2);		  /* header size */
	put_le(b + 8, entry * copies, 8); /* entries' size */
	for (unsigned i = 0; i < copies; i++) {
		uint8_t *e = b + 16 + entry * i;

		put_le(e, kind, 2);
		put_le(e + 4, ENTRY_HEADER, 4);
		put_le(e + 8, n, 8);
		put_le(e + 0x28, flags, 8);
		memcpy(e + ENTRY_HEADER, payload, n);
	}
	*len = total;
	return b;
}

static uint8_t *fatbin_of(uint16_t kind, uint64_t flags, const void *payload,
			  size_t n, size_t *len)
{
	return fatbin_copies(kind, flags, payload, n, 1, len);
}

/* ---- parameter tables */

#define PROBES 24
#define PROBE_LEN 64

/* The kernel names to ask a table about. */
struct probes {
	char name[PROBES][PROBE_LEN];
	size_t count;
};

static void probe_add(struct probes *pr, const uint8_t *p, size_t n)
{
	if (pr->count == PROBES || n >= PROBE_LEN)
		return;
	memcpy(pr->name[pr->count], p, n);
	pr->name[pr->count][n] = '\0';
	pr->count++;
}

/* A few fixed names, and the words that follow ".entry" or ".nv.info.". */
static void probes_of(const uint8_t *d, size_t size, struct probes *pr)
{
	static const char *const fixed[] = { "k", "ptrs", "mixed", "add_one" };
	static const char *const marks[] = { ".entry", ".nv.info." };

	pr->count = 0;
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		probe_add(pr, (const uint8_t *)fixed[i], strlen(fixed[i]));
	for (size_t m = 0; m < 2; m++) {
		size_t ml = strlen(marks[m]);
		const uint8_t *p = d, *end = d + size;

		while ((p = memmem(p, (size_t)(end - p), marks[m], ml))) {
			const uint8_t *w = p + ml, *e;

			while (w < end &&
			       (*w == ' ' || *w == '\t' || *w == '\n'))
				w++;
			for (e = w; e < end && *e != '\0' && *e != '(' &&
				    *e != ' ' && *e != '\t' && *e != '\n';
			     e++)
				;
			if (e > w)
				probe_add(pr, w, (size_t)(e - w));
			p += ml;
		}
	}
}

static struct module_image_params *params_read(const void *b, size_t n)
{
	struct module_image_params *t = NULL;
	int rc = module_image_params_read(b, n, &t);

	expect(rc == 0 || rc == -ENOMEM);
	expect((rc == 0) == (t != NULL));
	return t;
}

/* Do a and b know the same of every probe? */
static void expect_same_params(const struct module_image_params *a,
			       const struct module_image_params *b,
			       const struct probes *pr)
{
	for (size_t i = 0; i < pr->count; i++) {
		const size_t *sa = NULL, *sb = NULL;
		size_t na = 0, nb = 0;
		bool ka = module_image_params_find(a, pr->name[i], &na, &sa);
		bool kb = module_image_params_find(b, pr->name[i], &nb, &sb);

		expect(ka == kb);
		if (!ka)
			continue;
		expect(na == nb);
		expect(na == 0 || memcmp(sa, sb, na * sizeof(*sa)) == 0);
	}
}

/* What t knows is plausible for an image of size bytes. */
static void expect_plausible(const struct module_image_params *t,
			     const struct probes *pr, size_t size)
{
	for (size_t i = 0; i < pr->count; i++) {
		const size_t *sizes = NULL;
		size_t n = 0;

		if (!module_image_params_find(t, pr->name[i], &n, &sizes))
			continue;
		expect(n <= size);
		for (size_t k = 0; k < n; k++)
			expect(sizes[k] > 0);
	}
}

/* The image's table, wrapped in a fatbin (copies entries), is the same. */
static void check_wrapped_params(uint16_t kind, uint64_t flags,
				 const void *payload, size_t n, unsigned copies,
				 const struct module_image_params *want,
				 const struct probes *pr)
{
	size_t len;
	uint8_t *f = fatbin_copies(kind, flags, payload, n, copies, &len);
	struct module_image_params *t;

	if (f == NULL)
		return;
	t = params_read(f, len);
	if (t != NULL)
		expect_same_params(t, want, pr);
	module_image_params_free(t);
	free(f);
}

/*
 * The fatbin of payload (n bytes; compressed when flags say so, from
 * want_len) counts want, known k.
 */
static void check_wrapped(uint16_t kind, uint64_t flags, const void *payload,
			  size_t n, size_t want_len, uint64_t want,
			  enum module_image_known k)
{
	size_t len;
	uint8_t *f = fatbin_of(kind, flags, payload, n, &len);
	enum module_image_known fk;
	uint64_t v;

	if (f == NULL)
		return;
	v = module_image_static_bytes(f, len, &fk);
	if ((flags & 0x8000) && n > 0 &&
	    want_len > (uint64_t)len * EXPAND_RATIO) {
		/* Past the budget: not expanded, so not read. */
		expect(v == 0);
		expect(fk == MODULE_IMAGE_UNKNOWN);
	} else {
		expect(v == want);
		expect(fk == k);
	}
	free(f);
}

/*
 * The parameter tables of data, read twice and wrapped (size is the
 * length a fatbin entry of it has: a PTX entry ends at its first NUL).
 */
static void check_params(const uint8_t *data, size_t size, bool wrap,
			 uint16_t kind, size_t wrap_size)
{
	struct probes pr;
	struct module_image_params *t = params_read(data, size), *t2;

	if (t == NULL)
		return;
	probes_of(data, size, &pr);
	expect_plausible(t, &pr, size);
	t2 = params_read(data, size);
	if (t2 != NULL)
		expect_same_params(t, t2, &pr);
	module_image_params_free(t2);
	if (wrap && wrap_size > 0) {
		size_t cap = ZSTD_compressBound(wrap_size);
		void *z = malloc(cap);

		check_wrapped_params(kind, 0, data, wrap_size, 1, t, &pr);
		/* Two entries of the same code agree. */
		check_wrapped_params(kind, 0, data, wrap_size, 2, t, &pr);
		if (z != NULL) {
			size_t zn = ZSTD_compress(z, cap, data, wrap_size, 1);

			/* Within the budget, expanded and read alike. */
			if (!ZSTD_isError(zn) &&
			    wrap_size <= (uint64_t)zn * EXPAND_RATIO)
				check_wrapped_params(kind, 0x8000, z, zn, 1, t,
						     &pr);
			free(z);
		}
	}
	module_image_params_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum module_image_known k = MODULE_IMAGE_UNKNOWN, k2;
	uint64_t v = module_image_static_bytes(data, size, &k);
	bool elf = size >= 4 && memcmp(data,
				       "\x7f"
				       "ELF",
				       4) == 0;
	bool fatbin = size >= 4 && (data[0] | data[1] << 8 | data[2] << 16 |
				    (uint32_t)data[3] << 24) == FATBIN_MAGIC;

	expect(k == MODULE_IMAGE_KNOWN || k == MODULE_IMAGE_UNKNOWN);
	expect(module_image_static_bytes(data, size, &k2) == v);
	expect(k2 == k);
	expect(module_image_static_bytes(data, size, NULL) == v);
	/* PTX text is known, unless a .global in it could not be sized. */
	if (!elf && !fatbin)
		expect(k == MODULE_IMAGE_KNOWN ||
		       memmem(data, size, ".global", 7) != NULL);

	check_params(data, size, !fatbin && size > 0 && size <= WRAP_MAX,
		     elf ? 2 : 1,
		     elf ? size : strnlen((const char *)data, size));
	if (fatbin || size == 0 || size > WRAP_MAX)
		return 0;
	if (!elf) {
		/* A PTX entry is text: it ends at its first NUL. */
		size = strnlen((const char *)data, size);
		if (size == 0)
			return 0;
	}
	{
		uint16_t kind = elf ? 2 : 1;
		/*
		 * An entry that cannot be read leaves the fatbin unknown and
		 * counting 0 (an unreadable ELF alone is 0 and unknown too).
		 */
		enum module_image_known fk = k;
		size_t cap = ZSTD_compressBound(size);
		void *z = malloc(cap);
		size_t zn;

		check_wrapped(kind, 0, data, size, size, v, fk);
		if (z == NULL)
			return 0;
		zn = ZSTD_compress(z, cap, data, size, 1);
		expect(!ZSTD_isError(zn));
		check_wrapped(kind, 0x8000, z, zn, size, v, fk);
		free(z);
	}
	return 0;
}
