/*
 * fuzz_exec.c - libFuzzer harness for the script parser of `gpucmd exec`
 * (client/cmd_exec.c; gpucmd(1), THE EXEC LANGUAGE).
 *
 * The input is the script.  It is read through fmemopen exactly as
 * cmd_exec reads its file: parse_group one submit group at a time until
 * the end of the script or the first parse error (where the tool stops
 * too), group_clear after each group, and the script's names, line buffer
 * and ops freed at the end as cmd_exec frees them.  No daemon is involved:
 * the parser is static in cmd_exec.c, so this file includes cmd_exec.c
 * unchanged and calls it directly; the tool's other files (tool_parse_u64
 * in gpucmd.c, with main renamed) and the client library are linked as
 * they are (see fuzz.mk).
 *
 * Two names are redirected inside cmd_exec.c only, both for the parse
 * functions' benefit:
 *   - stderr goes to a memory stream, so the diagnostics can be checked
 *     and do not flood the fuzzer's log;
 *   - fopen serves a few in-memory files (file:empty, file:small,
 *     file:big, which crosses parse_file's first 64 KiB buffer, and
 *     file:dir, a directory, whose read fails) and refuses every other
 *     path with ENOENT, so that file: operands never read the machine's
 *     files (/dev/zero, /dev/stdin).
 *
 * What the harness checks:
 *   - parse_group returns 0 or -1; 0 prints nothing, -1 prints a
 *     diagnostic that starts "gpucmd: ", and one of the form
 *     "gpucmd: LABEL:LINE:COL:" names the current line and a column
 *     inside it (or just past its end);
 *   - every op of a parsed group is well formed: its kind, line, the
 *     name and id it acts on (a binding of the right kind, with an id
 *     that kind gave out), its data, layout, region range, kernel
 *     dimensions and arguments, pools and sizes as the parse functions
 *     promise them to run_group;
 *   - the script's names are valid and unique per kind, with distinct
 *     live ids no larger than the last one given out;
 *   - no crash, no undefined behaviour, no leak (ASan/UBSan/LSan).
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* What cmd_exec.c writes to stderr, for one input. */
static FILE *fuzz_diag;
static FILE *fuzz_fopen(const char *path, const char *mode);

#undef stderr
#define stderr fuzz_diag
#define fopen fuzz_fopen
#include "../../client/cmd_exec.c"
#undef fopen
#undef stderr

#define expect(cond)                                                        \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "fuzz_exec: %s:%d: %s\n", __FILE__, \
				__LINE__, #cond);                           \
			abort();                                            \
		}                                                           \
	} while (0)

#define LABEL "fuzz"

/* ---- the files file: may name ------------------------------------------ */

static uint8_t small_file[16];
static uint8_t big_file[65536 + 1000];

static FILE *fuzz_fopen(const char *path, const char *mode)
{
	expect(mode[0] == 'r'); /* parsing only reads */
	if (strcmp(path, "empty") == 0)
		return fmemopen(small_file, 0, "r");
	if (strcmp(path, "small") == 0)
		return fmemopen(small_file, sizeof(small_file), "r");
	if (strcmp(path, "big") == 0)
		return fmemopen(big_file, sizeof(big_file), "r");
	if (strcmp(path, "dir") == 0)
		return fopen("/", mode); /* opens; reading fails (EISDIR) */
	errno = ENOENT;
	return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	for (size_t i = 0; i < sizeof(small_file); i++)
		small_file[i] = (uint8_t)i;
	for (size_t i = 0; i < sizeof(big_file); i++)
		big_file[i] = (uint8_t)(i * 7);
	return 0;
}

/* ---- invariants --------------------------------------------------------- */

/* The binding of kind whose name is the very string name (op->name). */
static const struct binding *owner(const struct script *s, enum name_kind kind,
				   const char *name)
{
	const struct names *ns = &s->names[kind];

	for (size_t i = 0; i < ns->n; i++)
		if (ns->v[i].name == name)
			return &ns->v[i];
	return NULL;
}

/* op names a binding of kind, with an id that kind gave out. */
static void check_named(const struct script *s, const struct op *op,
			enum name_kind kind, uint64_t id)
{
	expect(op->name != NULL);
	expect(owner(s, kind, op->name) != NULL);
	expect(id != 0 && id <= s->names[kind].next_id);
}

static void check_names(const struct script *s)
{
	for (int k = 0; k < NAME_KINDS; k++) {
		const struct names *ns = &s->names[k];

		expect(ns->n <= ns->cap);
		expect(ns->n == 0 || ns->v != NULL);
		expect(ns->n <= ns->next_id);
		for (size_t i = 0; i < ns->n; i++) {
			const struct binding *b = &ns->v[i];

			expect(b->name != NULL && valid_name(b->name));
			expect(b->id <= ns->next_id);
			for (size_t j = 0; j < i; j++) {
				expect(strcmp(b->name, ns->v[j].name) != 0);
				expect(b->id == 0 || b->id != ns->v[j].id);
			}
		}
	}
}

static void check_layout(const struct gpucmd_layout *l)
{
	expect(l->rank <= GPUCMD_MAX_RANK);
	if (l->rank == 0)
		return;
	expect(l->elem_size >= 1);
}

/* The data of a write, create, region or module. */
static void check_data(const struct op *op)
{
	/*
	 * Or src: a large regular file, read when the group runs (no fuzz
	 * file is one: fmemopen streams have no descriptor to measure).
	 */
	expect(op->data_len == 0 || op->data != NULL || op->src != NULL);
	expect(op->data_len <= EXEC_MAX_FILE);
}

/* A region range: a live region of the script, inside it. */
static void check_region(const struct script *s, const struct op *op)
{
	const struct binding *r;
	uint64_t end;

	expect(op->via == VIA_REGION);
	expect(op->region_name != NULL && op->region != 0);
	r = owner(s, NAME_REGION, op->region_name);
	expect(r != NULL);
	expect(op->region <= s->names[NAME_REGION].next_id);
	/* The same region still (not released and made again since). */
	if (r->id == op->region) {
		expect(!__builtin_add_overflow(op->roff, op->rlen, &end));
		expect(end <= r->size);
	}
}

static void check_op(const struct script *s, const struct op *op)
{
	uint64_t bytes;

	expect(op->kind <= OP_IMPORT);
	expect(op->line >= 1 && op->line <= s->line);
	expect(op->via == VIA_INLINE || op->via == VIA_REGION);
	check_data(op);
	switch (op->kind) {
	case OP_EMPTY:
		check_named(s, op, NAME_BUFFER, op->handle);
		break;
	case OP_CREATE:
		check_named(s, op, NAME_BUFFER, op->handle);
		if (op->via == VIA_REGION) {
			check_region(s, op);
			expect(op->len == op->rlen);
		} else {
			expect(op->len == op->data_len);
		}
		break;
	case OP_WRITE:
		check_named(s, op, NAME_BUFFER, op->handle);
		check_layout(&op->layout);
		if (op->via == VIA_REGION)
			check_region(s, op);
		if (op->layout.rank != 0) {
			expect(layout_bytes(&op->layout, &bytes) == 0);
			expect(bytes == (op->via == VIA_REGION ? op->rlen :
								 op->data_len));
		}
		break;
	case OP_READ:
		check_named(s, op, NAME_BUFFER, op->handle);
		check_layout(&op->layout);
		expect(op->data == NULL);
		expect(op->path == NULL || op->path[0] != '\0');
		expect(op->path == NULL || op->via == VIA_INLINE);
		if (op->via == VIA_REGION)
			check_region(s, op);
		if (op->layout.rank != 0) {
			expect(layout_bytes(&op->layout, &bytes) == 0);
			expect(bytes == op->rlen);
		} else {
			expect(op->rlen == op->len);
		}
		break;
	case OP_RELEASE:
		check_named(s, op, NAME_BUFFER, op->handle);
		break;
	case OP_SHARE:
	case OP_IMPORT:
		check_named(s, op, NAME_BUFFER, op->handle);
		expect(op->shared_name != NULL && op->shared_name[0] != '\0' &&
		       strlen(op->shared_name) <= EXEC_SHARED_NAME_MAX);
		for (const char *c = op->shared_name; *c != '\0'; c++)
			expect(isalnum((unsigned char)*c) ||
			       strchr("._-/:", *c) != NULL);
		break;
	case OP_RESERVE:
		check_named(s, op, NAME_RESERVATION, op->id);
		break;
	case OP_BIND:
		check_named(s, op, NAME_BUFFER, op->handle);
		expect(op->id != 0 &&
		       op->id <= s->names[NAME_RESERVATION].next_id);
		break;
	case OP_PROFILE_BEGIN:
	case OP_PROFILE_END:
		check_named(s, op, NAME_PROFILE, op->id);
		break;
	case OP_CAPTURE_END:
		/* capture abort: graph 0, no name */
		if (op->name == NULL) {
			expect(op->id == 0);
			break;
		}
		check_named(s, op, NAME_GRAPH, op->id);
		break;
	case OP_LAUNCH:
	case OP_DESTROY:
		check_named(s, op, NAME_GRAPH, op->id);
		break;
	case OP_REGION:
		check_named(s, op, NAME_REGION, op->id);
		expect(op->len >= 1 && op->len <= (uint64_t)INT64_MAX);
		expect(op->data_len <= op->len);
		break;
	case OP_RELEASE_REGION:
		check_named(s, op, NAME_REGION, op->id);
		break;
	case OP_MODULE:
		check_named(s, op, NAME_MODULE, op->id);
		expect(op->kernel != NULL);
		expect(strcmp(op->kernel, "ptx") == 0 ||
		       strcmp(op->kernel, "cubin") == 0 ||
		       strcmp(op->kernel, "fatbin") == 0 ||
		       strcmp(op->kernel, "cuda") == 0);
		break;
	case OP_KERNEL:
		expect(op->kernel != NULL && op->kernel[0] != '\0');
		expect(op->id <= s->names[NAME_MODULE].next_id);
		for (int i = 0; i < 3; i++)
			expect(op->grid[i] >= 1 && op->block[i] >= 1);
		expect(op->nargs <= EXEC_MAX_WORDS - 2);
		expect(op->nargs == 0 || op->args != NULL);
		for (size_t i = 0; i < op->nargs; i++) {
			const struct gpucmd_arg *a = &op->args[i];

			expect(a->kind == GPUCMD_ARG_BUFFER ||
			       a->kind == GPUCMD_ARG_BUFFER_IN ||
			       a->kind == GPUCMD_ARG_U32 ||
			       a->kind == GPUCMD_ARG_I32 ||
			       a->kind == GPUCMD_ARG_U64 ||
			       a->kind == GPUCMD_ARG_F32);
			if (a->kind == GPUCMD_ARG_BUFFER ||
			    a->kind == GPUCMD_ARG_BUFFER_IN)
				expect(a->v.handle != 0 &&
				       a->v.handle <=
					       s->names[NAME_BUFFER].next_id);
		}
		break;
	case OP_MODE:
		expect(op->mode == GPUCMD_MODE_AUTO ||
		       op->mode == GPUCMD_MODE_PERSISTENT);
		break;
	case OP_POOLS:
		expect(op->preset != NULL);
		if (strcmp(op->preset, "custom") != 0) {
			expect(op->npools == 0);
			break;
		}
		expect(op->npools >= 1 && op->pools != NULL);
		for (size_t i = 0; i < op->npools; i++) {
			const struct gpucmd_pool_options *p = &op->pools[i];

			expect(p->kind != NULL);
			if (strcmp(p->kind, "sliced") == 0)
				expect(p->page_size != 0);
			else if (strcmp(p->kind, "exclusive") == 0)
				expect(p->max_alloc != 0);
			else
				expect(strcmp(p->kind, "direct") == 0);
		}
		break;
	case OP_SYNC:
	case OP_USAGE:
	case OP_PING:
	case OP_CURSOR:
	case OP_REPORT:
	case OP_CLEANUP:
	case OP_FLUSH:
	case OP_RESERVE_CPU:
	case OP_CAPTURE_BEGIN:
		break;
	}
}

/*
 * The diagnostics printed by one parse_group call, diag[0..len): none on
 * success; on failure a "gpucmd: " line, and a parse error's position on
 * the current line.
 */
static void check_diag(const struct script *s, int rc, const char *diag,
		       size_t len)
{
	const char *at = LABEL ":";
	unsigned line;
	size_t col;

	if (rc == 0) {
		expect(len == 0);
		return;
	}
	expect(len > 8 && strncmp(diag, "gpucmd: ", 8) == 0);
	if (strncmp(diag + 8, at, strlen(at)) != 0)
		return; /* out of memory */
	expect(sscanf(diag + 8 + strlen(at), "%u:%zu:", &line, &col) == 2);
	expect(line == s->line);
	expect(s->text != NULL);
	expect(col >= 1 && col <= strlen(s->text) + 1);
}

/* ---- the input ---------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct script s = { 0 };
	struct group g = { 0 };
	char *diag = NULL;
	size_t diag_len = 0, seen = 0;
	uint8_t *copy;

	/* glibc's fmemopen (2.22 on) takes an empty buffer: an empty script. */
	copy = malloc(size + 1);
	expect(copy != NULL);
	if (size > 0)
		memcpy(copy, data, size);
	s.label = LABEL;
	s.in = fmemopen(copy, size, "r");
	expect(s.in != NULL);
	fuzz_diag = open_memstream(&diag, &diag_len);
	expect(fuzz_diag != NULL);

	while (!s.eof) {
		unsigned before = s.line;
		int rc = parse_group(&s, &g);

		expect(rc == 0 || rc == -1);
		expect(fflush(fuzz_diag) == 0);
		check_diag(&s, rc, diag + seen, diag_len - seen);
		seen = diag_len;
		expect(s.nwords <= EXEC_MAX_WORDS);
		expect(s.line >= before);
		expect(g.n <= g.cap);
		check_names(&s);
		if (rc == 0) {
			/* A group ends at submit (a line) or at the end. */
			expect(s.eof || s.line > before);
			for (size_t i = 0; i < g.n; i++)
				check_op(&s, &g.ops[i]);
		}
		group_clear(&g);
		expect(g.n == 0);
		if (rc < 0)
			break; /* where gpucmd exec stops too */
	}

	/* What cmd_exec frees at its end. */
	fclose(s.in);
	for (int k = 0; k < NAME_KINDS; k++) {
		for (size_t i = 0; i < s.names[k].n; i++)
			free(s.names[k].v[i].name);
		free(s.names[k].v);
	}
	free(s.buf);
	free(s.text);
	free(g.ops);
	fclose(fuzz_diag);
	fuzz_diag = NULL;
	free(diag);
	free(copy);
	return 0;
}
