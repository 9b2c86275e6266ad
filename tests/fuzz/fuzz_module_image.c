/*
 * fuzz_module_image.c - libFuzzer harness for module_image_static_bytes
 * (daemon/module_image.c): the size of a module's globals, read from the
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
 * Sanitizers (ASan, UBSan) and libFuzzer's -malloc_limit_mb/-rss_limit_mb
 * watch the rest: a client's bytes must not make the daemon read out of
 * bounds, loop, or allocate far past what it sent.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "module_image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define expect(cond)                                                        \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "fuzz_module_image: %s:%d: %s\n",   \
				__FILE__, __LINE__, #cond);                 \
			abort();                                            \
		}                                                           \
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

/* A fatbin whose one entry (kind, flags) carries payload; NULL: no memory. */
static uint8_t *fatbin_of(uint16_t kind, uint64_t flags, const void *payload,
			  size_t n, size_t *len)
{
	size_t total = 16 + ENTRY_HEADER + n;
	uint8_t *b = calloc(1, total);

	if (b == NULL)
		return NULL;
	put_le(b, FATBIN_MAGIC, 4);
	put_le(b + 4, 1, 2);			/* version */
	put_le(b + 6, 16, 2);			/* header size */
	put_le(b + 8, ENTRY_HEADER + n, 8);	/* entries' size */
	put_le(b + 16, kind, 2);
	put_le(b + 16 + 4, ENTRY_HEADER, 4);
	put_le(b + 16 + 8, n, 8);
	put_le(b + 16 + 0x28, flags, 8);
	memcpy(b + 16 + ENTRY_HEADER, payload, n);
	*len = total;
	return b;
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
	if ((flags & 0x8000) && n > 0 && want_len > (uint64_t)len * EXPAND_RATIO) {
		/* Past the budget: not expanded, so not read. */
		expect(v == 0);
		expect(fk == MODULE_IMAGE_UNKNOWN);
	} else {
		expect(v == want);
		expect(fk == k);
	}
	free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum module_image_known k = MODULE_IMAGE_UNKNOWN, k2;
	uint64_t v = module_image_static_bytes(data, size, &k);
	bool elf = size >= 4 && memcmp(data, "\x7f" "ELF", 4) == 0;
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
