/*
 * cmd_exec.c - gpucmd exec: the scripting front end, one op per line, in
 * the spirit of redis-cli.  The language is described in gpucmd(1).
 *
 * A script is read one submit group at a time: the ops up to a `submit`
 * line (or the end of the script) are parsed completely before anything of
 * the group is sent, so a typo on the last line of a group costs nothing on
 * the device.  Groups after a good one are still read only when their turn
 * comes, which keeps a script typed or piped into stdin interactive.
 *
 * A protobuf Request has one stream, so a group becomes one request per run
 * of ops on the same stream.  All requests of a group are sent before any
 * response is read (pipelined, at most max_in_flight outstanding), and the
 * results are printed afterwards in script order, whatever order the
 * daemon finished the streams in.
 *
 * Buffers, reservations, graphs and profiles have script names, each kind
 * in a namespace of its own as on the daemon; the tool maps each new name
 * (`empty`, `create`, `bind`; `reserve`; `capture end`; `profile begin`) to
 * a fresh 64-bit id and remembers a buffer's size, so `read NAME` can
 * default to the whole buffer.  Names are resolved while parsing: a name
 * that was never made, or was ended (`release`, `bind`, `destroy`,
 * `profile end`), is a parse error.
 *
 * A buffer shared with the service's other connections (`share BUF NAME`)
 * keeps its script name; `import BUF NAME` makes a buffer name for one
 * that another connection shared.  The daemon does not say how large an
 * imported buffer is, so the script does not know, and `read BUF` must
 * give its range.
 *
 * Shared regions (`region NAME BYTES`) are named like the rest; a region
 * is created (a round trip of its own, gpucmd_region_create) when its
 * group runs, before the group's requests, and its line leaves no result.
 * Transfers larger than GPUCMD_INLINE_MAX (or than fits a frame) that
 * name no region go through a scratch region of the group's own: created
 * before the requests, filled with the bytes to write, read from after the
 * responses, and released at the end of the group.  The daemon unmaps it
 * only once the copies from it are done, so the group need not sync.
 * Where the service's region_limit or the daemon's count of regions
 * leaves no room for it, those transfers go in the frame when each
 * request still fits one, as libgpucmd's convenience calls do.  A large
 * regular file: operand is measured when its line is parsed and read when
 * the group runs, straight into the scratch region, so its bytes are not
 * held twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"

/* Most words on a line: an op, a kernel name, grid, block, arguments. */
#define EXEC_MAX_WORDS 40
/* The largest file: operand. */
#define EXEC_MAX_FILE (1ull << 30)
/*
 * Ids of the groups' scratch regions: far above the ids given to named
 * regions, below the library's own (GPUCMD_REGION_ID_RESERVED).
 */
#define EXEC_SCRATCH_ID (UINT64_C(1) << 62)
/* Room in a frame for what surrounds inline bytes. */
#define EXEC_FRAME_SLACK 4096u
/* Alignment of each transfer in the scratch region. */
#define EXEC_SCRATCH_ALIGN 4096u
/* The longest name of a shared buffer (gpucmd_batch_share). */
#define EXEC_SHARED_NAME_MAX 63

static const char exec_usage[] =
	"usage: gpucmd exec [--service NAME] [--json] [SCRIPT|-]\n"
	"  --service NAME  service to speak for (default: the global --service)\n"
	"  --json          print each result as a JSON object on its own line\n"
	"  SCRIPT          script file; '-' or none reads stdin\n"
	"\n"
	"script lines (ops are queued until 'submit' or the end):\n"
	"  stream N\n"
	"  empty NAME BYTES                 (BYTES may end in K, M or G)\n"
	"  create NAME hex:..|file:PATH|REGION\n"
	"  write NAME [OFFSET] [LAYOUT] hex:..|file:PATH|REGION\n"
	"  read NAME [OFFSET LEN] [file:PATH|REGION]\n"
	"  read NAME [OFFSET] LAYOUT [file:PATH|REGION]\n"
	"       LAYOUT: shape=A[,B..] [strides=S[,1..]] [elem=BYTES]\n"
	"       REGION: region:R[:ROFF[:LEN]] (read: region:R[:ROFF])\n"
	"  region R BYTES [hex:..|file:PATH] | release-region R\n"
	"  kernel KERNEL grid=X[,Y,Z] block=X[,Y,Z] [shared=BYTES] ARG...\n"
	"       ARG: NAME, in:NAME (read only), u32:N, i32:N, u64:N, f32:X\n"
	"  release NAME\n"
	"  share NAME SHARED | import NAME SHARED\n"
	"       SHARED: the service-wide name, 1 to 63 of A-Z a-z 0-9 . _ - / :\n"
	"  reserve RESERVATION BYTES | bind RESERVATION NAME\n"
	"  reserve-cpu BYTES\n"
	"  mode auto|persistent\n"
	"  pools subslices|exclusive | pools custom POOL...\n"
	"       POOL: sliced:page=N[,slice=N][,pool=N] | exclusive:max=N[,period=N]\n"
	"             | direct[:reclaim=N]\n"
	"  profile begin|end PROFILE\n"
	"  capture begin | capture end GRAPH | launch GRAPH | destroy GRAPH\n"
	"  module NAME ptx|cubin|fatbin|cuda:hex:..|file:PATH   (then kernel NAME.FUNC ...)\n"
	"  sync | usage | cursor | report | cleanup | flush | ping | submit\n";

enum op_kind {
	OP_EMPTY,
	OP_CREATE,
	OP_WRITE,
	OP_READ,
	OP_KERNEL,
	OP_RELEASE,
	OP_SYNC,
	OP_USAGE,
	OP_PING,
	OP_RESERVE,
	OP_BIND,
	OP_CURSOR,
	OP_REPORT,
	OP_CLEANUP,
	OP_FLUSH,
	OP_MODE,
	OP_POOLS,
	OP_RESERVE_CPU,
	OP_PROFILE_BEGIN,
	OP_PROFILE_END,
	OP_CAPTURE_BEGIN,
	OP_CAPTURE_END,
	OP_LAUNCH,
	OP_DESTROY,
	OP_REGION,
	OP_RELEASE_REGION,
	OP_MODULE,
	OP_SHARE,
	OP_IMPORT,
};

/* Where the bytes of a write, create or read travel. */
enum via {
	VIA_INLINE,  /* in the frame */
	VIA_REGION,  /* a region the script named */
	VIA_SCRATCH, /* the group's scratch region (large transfers) */
};

/* The kinds of script names, each a namespace of its own. */
enum name_kind {
	NAME_BUFFER,
	NAME_RESERVATION,
	NAME_GRAPH,
	NAME_PROFILE,
	NAME_REGION,
	NAME_MODULE,
	NAME_KINDS,
};

/* One parsed script line that becomes an op. */
struct op {
	enum op_kind kind;
	unsigned line;
	uint32_t stream;
	const char *name; /* the script name it acts on (its binding owns it) */
	uint64_t handle;  /* buffer */
	uint64_t id;	  /* reservation, graph or profile */
	uint64_t offset;
	uint64_t len;  /* empty, reserve, reserve-cpu: size; read: length */
	uint8_t *data; /* create, write, region, module */
	size_t data_len;
	char *src;  /* a file: operand read when the group runs */
	char *path; /* read: write the bytes to this file */
	struct gpucmd_layout layout; /* write, read: rank 0 = none */
	char *kernel;	   /* kernel: the function; module: the format */
	char *shared_name; /* share, import: the service-wide name */
	uint32_t grid[3];
	uint32_t block[3];
	uint32_t shared;
	struct gpucmd_arg *args;
	size_t nargs;
	enum gpucmd_allocation_mode mode;
	const char *preset; /* pools: a string literal */
	struct gpucmd_pool_options *pools;
	size_t npools;
	enum via via;		 /* write, create, read */
	const char *region_name; /* VIA_REGION (its binding owns it) */
	uint64_t region;	 /* VIA_REGION, VIA_SCRATCH: the region's id */
	uint64_t roff;		 /* offset in the region */
	uint64_t rlen;		 /* bytes moved through the region */
};

/* A script name. */
struct binding {
	char *name;
	uint64_t id;   /* 0 once ended */
	uint64_t size; /* buffers and reservations */
	bool unsized;  /* a buffer made by import: its size is not known */
};

/* The names of one kind, and the ids given to them. */
struct names {
	struct binding *v;
	size_t n;
	size_t cap;
	uint64_t next_id;
};

struct script {
	const char *label; /* the script's name in messages */
	FILE *in;
	unsigned line;
	char *buf; /* the line, cut into words in place */
	size_t buf_cap;
	char *text; /* the line as read, for messages */
	char *word[EXEC_MAX_WORDS];
	size_t col[EXEC_MAX_WORDS]; /* 1-based column of each word */
	size_t nwords;
	int eof;
	uint32_t stream; /* set by `stream N`, kept across groups */
	struct names names[NAME_KINDS];
};

/* The ops of one submit group. */
struct group {
	struct op *ops;
	size_t n;
	size_t cap;
};

/* One request of a group: a run of ops on the same stream. */
struct request {
	size_t first;
	size_t n;
	struct gpucmd_batch *batch; /* until submitted */
	uint64_t id;
	int err; /* submit or wait failure */
	struct gpucmd_response *resp;
};

struct exec {
	const struct tool_opts *opts;
	const char *service;
	int json;
	struct gpucmd_conn *conn; /* opened when the first group runs */
	struct script s;
	uint64_t scratch_id; /* the running group's scratch region, or 0 */
	uint8_t *scratch;    /* its mapping */
	unsigned groups;     /* groups run, for fresh scratch ids */
};

struct op_syntax {
	const char *name;
	enum op_kind kind;
	size_t min_args;
	size_t max_args;
	int (*parse)(struct script *s, struct op *op);
	const char *usage;
};

/* Names of the ops in messages and JSON ("op"). */
static const char *const op_names[] = {
	[OP_EMPTY] = "empty",
	[OP_CREATE] = "create",
	[OP_WRITE] = "write",
	[OP_READ] = "read",
	[OP_KERNEL] = "kernel",
	[OP_RELEASE] = "release",
	[OP_SYNC] = "sync",
	[OP_USAGE] = "usage",
	[OP_PING] = "ping",
	[OP_RESERVE] = "reserve",
	[OP_BIND] = "bind",
	[OP_CURSOR] = "cursor",
	[OP_REPORT] = "report",
	[OP_CLEANUP] = "cleanup",
	[OP_FLUSH] = "flush",
	[OP_MODE] = "mode",
	[OP_POOLS] = "pools",
	[OP_RESERVE_CPU] = "reserve-cpu",
	[OP_PROFILE_BEGIN] = "profile_begin",
	[OP_PROFILE_END] = "profile_end",
	[OP_CAPTURE_BEGIN] = "capture_begin",
	[OP_CAPTURE_END] = "capture_end",
	[OP_LAUNCH] = "launch",
	[OP_DESTROY] = "destroy",
	[OP_REGION] = "region",
	[OP_RELEASE_REGION] = "release-region",
	[OP_MODULE] = "module",
	[OP_SHARE] = "share",
	[OP_IMPORT] = "import",
};

/* How messages speak of each kind of name. */
static const struct name_words {
	const char *what;  /* "buffer" */
	const char *make;  /* how to make one */
	const char *ended; /* why a known name is not live */
	const char *end;   /* how to end a live one */
} name_words[NAME_KINDS] = {
	[NAME_BUFFER] = { "buffer",
			  "create it with empty, create, bind or import",
			  "it was released", "release it" },
	[NAME_RESERVATION] = { "reservation", "make it with reserve",
			       "it was bound", "bind it" },
	[NAME_GRAPH] = { "graph",
			 "record it with capture begin and "
			 "capture end",
			 "it was destroyed", "destroy it" },
	[NAME_PROFILE] = { "open profile", "open it with profile begin",
			   "it was ended", "end it with profile end" },
	[NAME_REGION] = { "region", "create it with region", "it was released",
			  "release it with release-region" },
	[NAME_MODULE] = { "module", "load it with module", "it was unloaded",
			  "use another name" },
};

/* ---- parsing ------------------------------------------------------------ */

/*
 * Complain about word w of the current line (w == nwords: its end), show
 * the line with a caret under the spot, and return -1.
 */
__attribute__((format(printf, 3, 4))) static int
parse_error(struct script *s, size_t w, const char *fmt, ...)
{
	size_t col = w < s->nwords ? s->col[w] : strlen(s->text) + 1;
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "gpucmd: %s:%u:%zu: ", s->label, s->line, col);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n    %s\n    ", s->text);
	/* Tabs stay tabs so the caret lines up however they are shown. */
	for (size_t i = 0; i + 1 < col; i++)
		fputc(s->text[i] == '\t' ? '\t' : ' ', stderr);
	fputs("^\n", stderr);
	return -1;
}

/*
 * Read the next line and cut it into words: 0, 1 at the end of the script,
 * -ENOMEM, or -1 after a parse error or a read error (said on stderr).
 */
static int next_line(struct script *s)
{
	ssize_t n;
	char *p;

	errno = 0;
	n = getline(&s->buf, &s->buf_cap, s->in);
	if (n < 0 && ferror(s->in)) {
		/* Not the end: the rest of the script must not be dropped. */
		fprintf(stderr,
			"gpucmd: cannot read script '%s' after line "
			"%u: %s\n",
			s->label, s->line, strerror(errno != 0 ? errno : EIO));
		return -1;
	}
	if (n < 0)
		return 1;
	s->line++;
	while (n > 0 && (s->buf[n - 1] == '\n' || s->buf[n - 1] == '\r'))
		s->buf[--n] = '\0';
	free(s->text);
	s->text = strdup(s->buf);
	if (s->text == NULL)
		return -ENOMEM;
	s->nwords = 0;
	/*
	 * The words are C strings: past a NUL byte the rest of the line
	 * would be dropped without a word.  The caret goes under the NUL
	 * (text ends there).
	 */
	if (memchr(s->buf, '\0', (size_t)n) != NULL)
		return parse_error(s, 0,
				   "line %u contains a NUL byte: is "
				   "'%s' a text script?",
				   s->line, s->label);
	p = s->buf;
	for (;;) {
		p += strspn(p, " \t\v\f\r");
		if (*p == '\0' || *p == '#')
			break;
		if (s->nwords == EXEC_MAX_WORDS)
			return parse_error(s, s->nwords - 1,
					   "more than %d words on one line",
					   EXEC_MAX_WORDS);
		s->col[s->nwords] = (size_t)(p - s->buf) + 1;
		s->word[s->nwords++] = p;
		p += strcspn(p, " \t\v\f\r");
		if (*p != '\0')
			*p++ = '\0';
	}
	return 0;
}

static int word_number(struct script *s, size_t w, int suffix, uint64_t *out,
		       const char *what)
{
	if (tool_parse_u64(s->word[w], suffix, out) == 0)
		return 0;
	return parse_error(s, w,
			   "bad %s '%s': expected a number in decimal "
			   "or 0x hex%s",
			   what, s->word[w],
			   suffix ? ", optionally ending in K, M or G" : "");
}

static struct binding *binding_find(struct names *ns, const char *name)
{
	for (size_t i = 0; i < ns->n; i++)
		if (strcmp(ns->v[i].name, name) == 0)
			return &ns->v[i];
	return NULL;
}

/* The live name of kind called name (in word w), or NULL after a parse error. */
static struct binding *name_live(struct script *s, size_t w,
				 enum name_kind kind, const char *name)
{
	struct binding *b = binding_find(&s->names[kind], name);
	const struct name_words *nw = &name_words[kind];

	if (b != NULL && b->id != 0)
		return b;
	parse_error(s, w, "no %s named '%s' (%s)", nw->what, name,
		    b != NULL ? nw->ended : nw->make);
	return NULL;
}

/* The live name of kind that word w names, or NULL after a parse error. */
static struct binding *word_live(struct script *s, size_t w,
				 enum name_kind kind)
{
	return name_live(s, w, kind, s->word[w]);
}

/* The live buffer that word w names, or NULL after a parse error. */
static struct binding *word_buffer(struct script *s, size_t w)
{
	return word_live(s, w, NAME_BUFFER);
}

/* Word w names the buffer op works on; *out (when not NULL) gets it. */
static int word_target(struct script *s, size_t w, struct op *op,
		       struct binding **out)
{
	struct binding *b = word_buffer(s, w);

	if (b == NULL)
		return -1;
	op->name = b->name;
	op->handle = b->id;
	if (out != NULL)
		*out = b;
	return 0;
}

/* Word w names a live name of kind that op uses and, when end, ends. */
static int word_use(struct script *s, size_t w, enum name_kind kind,
		    struct op *op, int end)
{
	struct binding *b = word_live(s, w, kind);

	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	if (end)
		b->id = 0;
	return 0;
}

static int valid_name(const char *n)
{
	if (!((n[0] >= 'a' && n[0] <= 'z') || (n[0] >= 'A' && n[0] <= 'Z') ||
	      n[0] == '_'))
		return 0;
	return n[strspn(n, "abcdefghijklmnopqrstuvwxyz"
			   "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")] == '\0';
}

/*
 * Word w becomes a new name of kind with a fresh id (and size), or the
 * result is NULL after a parse error.
 */
static struct binding *word_new(struct script *s, size_t w, enum name_kind kind,
				uint64_t size)
{
	struct names *ns = &s->names[kind];
	const char *name = s->word[w];
	struct binding *b;

	if (!valid_name(name)) {
		parse_error(s, w,
			    "bad %s name '%s': use letters, digits, "
			    "'_', '.' and '-', starting with a letter or '_'",
			    name_words[kind].what, name);
		return NULL;
	}
	b = binding_find(ns, name);
	if (b != NULL && b->id != 0) {
		parse_error(s, w, "'%s' already names a%s %s; %s first", name,
			    kind == NAME_PROFILE ? "n" : "",
			    name_words[kind].what, name_words[kind].end);
		return NULL;
	}
	if (b == NULL) {
		if (ns->n == ns->cap) {
			size_t cap = ns->cap ? 2 * ns->cap : 16;
			struct binding *nb = realloc(ns->v, cap * sizeof(*nb));

			if (nb == NULL) {
				parse_error(s, w, "out of memory");
				return NULL;
			}
			ns->v = nb;
			ns->cap = cap;
		}
		b = &ns->v[ns->n];
		b->name = strdup(name);
		if (b->name == NULL) {
			parse_error(s, w, "out of memory");
			return NULL;
		}
		ns->n++;
	}
	b->id = ++ns->next_id;
	b->size = size;
	b->unsized = false;
	return b;
}

/* Word w becomes a new buffer of size bytes with a fresh handle. */
static int word_new_buffer(struct script *s, size_t w, struct op *op,
			   uint64_t size)
{
	struct binding *b = word_new(s, w, NAME_BUFFER, size);

	if (b == NULL)
		return -1;
	op->name = b->name;
	op->handle = b->id;
	op->len = size;
	return 0;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int parse_hex(struct script *s, size_t w, const char *hex, struct op *op)
{
	size_t n = strlen(hex);

	if (n % 2 != 0)
		return parse_error(s, w, "odd number of hex digits in '%s'",
				   s->word[w]);
	op->data = malloc(n / 2 + 1);
	if (op->data == NULL)
		return parse_error(s, w, "out of memory");
	for (size_t i = 0; i < n; i += 2) {
		int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);

		if (hi < 0 || lo < 0)
			return parse_error(s, w,
					   "'%c%c' is not a hex byte in "
					   "'%s'",
					   hex[i], hex[i + 1], s->word[w]);
		op->data[i / 2] = (uint8_t)(hi << 4 | lo);
	}
	op->data_len = n / 2;
	return 0;
}

/*
 * A file: operand over EXEC_MAX_FILE (size bytes, 0 when unknown: a pipe
 * read that far): say how else the bytes can move.  The grammar takes a
 * file whole, so a larger one is split outside the script, and each piece
 * written at its offset.
 */
static int file_too_large(struct script *s, size_t w, const char *path,
			  const struct op *op, uint64_t size)
{
	char bytes[64], how[512];

	if (size != 0)
		snprintf(bytes, sizeof(bytes), "%" PRIu64 " bytes", size);
	else
		snprintf(bytes, sizeof(bytes), "more than %llu bytes",
			 (unsigned long long)EXEC_MAX_FILE);
	if (op->kind == OP_WRITE)
		snprintf(how, sizeof(how),
			 "split it (split -b 1G) and write "
			 "each piece with `write %s OFFSET file:PIECE`, or use "
			 "libgpucmd's regions (libgpucmd(3))",
			 s->word[1]);
	else if (op->kind == OP_CREATE)
		snprintf(how, sizeof(how),
			 "make the buffer with `empty %s "
			 "BYTES`, split the file (split -b 1G) and write each "
			 "piece with `write %s OFFSET file:PIECE`, or use "
			 "libgpucmd's regions (libgpucmd(3))",
			 s->word[1], s->word[1]);
	else
		snprintf(how, sizeof(how),
			 "use libgpucmd (libgpucmd(3)) for "
			 "data that large");
	return parse_error(s, w,
			   "'%s' is over the 1 GiB one exec operand can "
			   "carry (%s): %s",
			   path, bytes, how);
}

/*
 * A file: operand.  A regular file over GPUCMD_INLINE_MAX is only opened
 * and measured here, and read when its group runs, straight into the
 * region that carries it (op_load): held once, not twice over.  Anything
 * else (a pipe or /dev/stdin, which can be read only once; a small file)
 * is read whole now.
 */
static int parse_file(struct script *s, size_t w, const char *path,
		      struct op *op)
{
	FILE *f = fopen(path, "rbe");
	size_t cap = 0, len = 0;
	struct stat st;
	int err = 0, fd;

	if (f == NULL)
		return parse_error(s, w, "cannot open '%s': %s", path,
				   strerror(errno));
	/* A stream with no descriptor (the fuzz harness's) is read now. */
	fd = fileno(f);
	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
	    (uint64_t)st.st_size > GPUCMD_INLINE_MAX) {
		fclose(f);
		if ((uint64_t)st.st_size > EXEC_MAX_FILE)
			return file_too_large(s, w, path, op,
					      (uint64_t)st.st_size);
		op->src = strdup(path);
		if (op->src == NULL)
			return parse_error(s, w, "out of memory");
		op->data_len = (size_t)st.st_size;
		return 0;
	}
	for (;;) {
		size_t n;

		if (len == cap) {
			uint8_t *d;

			cap = cap ? 2 * cap : 65536;
			if (cap > EXEC_MAX_FILE + 1)
				cap = EXEC_MAX_FILE + 1;
			if (len == cap) {
				err = EFBIG;
				break;
			}
			d = realloc(op->data, cap);
			if (d == NULL) {
				err = ENOMEM;
				break;
			}
			op->data = d;
		}
		n = fread(op->data + len, 1, cap - len, f);
		len += n;
		if (n == 0) {
			if (ferror(f))
				err = errno != 0 ? errno : EIO;
			break;
		}
	}
	fclose(f);
	op->data_len = len;
	if (err == EFBIG)
		return file_too_large(s, w, path, op, 0);
	if (err != 0)
		return parse_error(s, w, "cannot read '%s': %s", path,
				   strerror(err));
	return 0;
}

/* Word w is the data operand: hex:BYTES or file:PATH. */
static int word_data(struct script *s, size_t w, struct op *op)
{
	const char *v = s->word[w];

	if (strncmp(v, "hex:", 4) == 0)
		return parse_hex(s, w, v + 4, op);
	if (strncmp(v, "file:", 5) == 0 && v[5] != '\0')
		return parse_file(s, w, v + 5, op);
	return parse_error(s, w, "expected hex:BYTES or file:PATH, not '%s'",
			   v);
}

static int is_region_word(const char *v)
{
	return strncmp(v, "region:", 7) == 0;
}

/*
 * Word w is region:R[:ROFF[:LEN]] (with_len) or region:R[:ROFF]: the
 * region and offset go into op, and LEN into *len when it is given (else
 * *len is left alone).  Only the region's name is checked here.
 */
static int word_region(struct script *s, size_t w, struct op *op, int with_len,
		       uint64_t *len, int *has_len)
{
	char buf[256], *part[4];
	size_t nparts = 0;
	struct binding *b;

	if (snprintf(buf, sizeof(buf), "%s", s->word[w] + 7) >=
	    (int)sizeof(buf))
		return parse_error(s, w, "region operand too long");
	for (char *p = buf; nparts < 4;) {
		part[nparts++] = p;
		p = strchr(p, ':');
		if (p == NULL)
			break;
		*p++ = '\0';
	}
	if (nparts > (with_len ? 3u : 2u) || part[0][0] == '\0')
		return parse_error(s, w,
				   "expected region:R[:ROFF%s], not "
				   "'%s'",
				   with_len ? "[:LEN]" : "", s->word[w]);
	b = name_live(s, w, NAME_REGION, part[0]);
	if (b == NULL)
		return -1;
	op->via = VIA_REGION;
	op->region = b->id;
	op->region_name = b->name;
	op->roff = 0;
	if (nparts > 1 && tool_parse_u64(part[1], 1, &op->roff) < 0)
		return parse_error(s, w, "bad region offset '%s'", part[1]);
	*has_len = nparts > 2;
	if (nparts > 2 && tool_parse_u64(part[2], 1, len) < 0)
		return parse_error(s, w, "bad region length '%s'", part[2]);
	return 0;
}

/* The range of op's region (rlen bytes at roff) must lie inside it. */
static int region_range(struct script *s, size_t w, struct op *op)
{
	struct binding *b =
		binding_find(&s->names[NAME_REGION], op->region_name);
	uint64_t end;

	if (__builtin_add_overflow(op->roff, op->rlen, &end) || end > b->size)
		return parse_error(s, w,
				   "%llu bytes at offset %llu do not "
				   "fit region '%s' of %llu bytes",
				   (unsigned long long)op->rlen,
				   (unsigned long long)op->roff, b->name,
				   (unsigned long long)b->size);
	return 0;
}

/*
 * The source of a write or create in word w: a region range (the rest of
 * the region when LEN is not given, want bytes when want is not 0), or
 * inline data.
 */
static int word_source(struct script *s, size_t w, struct op *op, uint64_t want)
{
	struct binding *r;
	int has_len;

	if (!is_region_word(s->word[w]))
		return word_data(s, w, op);
	if (word_region(s, w, op, 1, &op->rlen, &has_len) < 0)
		return -1;
	r = binding_find(&s->names[NAME_REGION], op->region_name);
	if (!has_len)
		op->rlen = want != 0	      ? want :
			   r->size > op->roff ? r->size - op->roff :
						0;
	return region_range(s, w, op);
}

static int parse_empty(struct script *s, struct op *op)
{
	uint64_t size;

	if (word_number(s, 2, 1, &size, "size") < 0)
		return -1;
	return word_new_buffer(s, 1, op, size);
}

static int parse_create(struct script *s, struct op *op)
{
	if (word_source(s, 2, op, 0) < 0)
		return -1;
	return word_new_buffer(s, 1, op,
			       op->via == VIA_REGION ? op->rlen : op->data_len);
}

/* A comma-separated list of 1 to GPUCMD_MAX_RANK numbers. */
static int parse_list(struct script *s, size_t w, const char *v, uint64_t *out,
		      uint32_t *n)
{
	char part[32];

	for (*n = 0; *v != '\0'; (*n)++) {
		size_t len = strcspn(v, ",");

		if (*n == GPUCMD_MAX_RANK || len == 0 || len >= sizeof(part))
			return parse_error(s, w,
					   "bad list in '%s': expected "
					   "1 to %d numbers separated by ','",
					   s->word[w], GPUCMD_MAX_RANK);
		memcpy(part, v, len);
		part[len] = '\0';
		if (tool_parse_u64(part, 0, &out[*n]) < 0)
			return parse_error(s, w, "bad number '%s' in '%s'",
					   part, s->word[w]);
		v += len;
		if (*v == ',' && *++v == '\0')
			return parse_error(s, w, "trailing ',' in '%s'",
					   s->word[w]);
	}
	if (*n == 0)
		return parse_error(s, w, "'%s' lists no numbers", s->word[w]);
	return 0;
}

/*
 * Take the layout words (shape=, strides=, elem=) of a write or read out
 * of the line: op->layout gets them (rank 0 when there are none) and
 * pos[] the indexes of the other words after the buffer's name.  Strides
 * default to dense row-major and elem to 1 byte; whether the daemon can
 * copy the strides is for it to say (GPUCMD_ESTRIDES).
 */
static int split_layout(struct script *s, struct op *op, size_t *pos,
			size_t *npos, size_t *shape_at)
{
	struct gpucmd_layout *l = &op->layout;
	uint32_t nstrides = 0;
	size_t shape_w = 0, strides_w = 0, elem_w = 0;

	*npos = 0;
	for (size_t w = 2; w < s->nwords; w++) {
		const char *v = s->word[w];
		uint64_t elem;

		if (strncmp(v, "shape=", 6) == 0) {
			shape_w = w;
			if (parse_list(s, w, v + 6, l->shape, &l->rank) < 0)
				return -1;
		} else if (strncmp(v, "strides=", 8) == 0) {
			strides_w = w;
			if (parse_list(s, w, v + 8, l->strides, &nstrides) < 0)
				return -1;
		} else if (strncmp(v, "elem=", 5) == 0) {
			elem_w = w;
			if (tool_parse_u64(v + 5, 0, &elem) < 0 || elem == 0 ||
			    elem > UINT32_MAX)
				return parse_error(s, w,
						   "bad element size "
						   "'%s'",
						   v + 5);
			l->elem_size = (uint32_t)elem;
		} else {
			pos[(*npos)++] = w;
		}
	}
	if (shape_w == 0 && (strides_w != 0 || l->elem_size != 0))
		return parse_error(s, strides_w ? strides_w : elem_w,
				   "a layout needs shape=");
	*shape_at = shape_w;
	if (shape_w == 0)
		return 0;
	if (l->elem_size == 0)
		l->elem_size = 1;
	if (strides_w != 0 && nstrides != l->rank)
		return parse_error(s, strides_w,
				   "%u strides for %u "
				   "dimensions: give one stride per "
				   "dimension",
				   nstrides, l->rank);
	if (strides_w == 0) {
		l->strides[l->rank - 1] = 1;
		for (uint32_t i = l->rank - 1; i-- > 0;)
			l->strides[i] = l->strides[i + 1] * l->shape[i + 1];
	}
	return 0;
}

/* Bytes a layout's elements take packed together. */
static int layout_bytes(const struct gpucmd_layout *l, uint64_t *out)
{
	uint64_t n = l->elem_size;

	for (uint32_t i = 0; i < l->rank; i++)
		if (__builtin_mul_overflow(n, l->shape[i], &n))
			return -1;
	*out = n;
	return 0;
}

static int parse_write(struct script *s, struct op *op)
{
	size_t pos[EXEC_MAX_WORDS], npos, shape_at = 0;
	uint64_t want;

	if (word_target(s, 1, op, NULL) < 0 ||
	    split_layout(s, op, pos, &npos, &shape_at) < 0)
		return -1;
	if (npos == 0)
		return parse_error(s, s->nwords,
				   "missing operand: usage: "
				   "write NAME [OFFSET] [LAYOUT] "
				   "hex:..|file:PATH|region:R[:ROFF[:LEN]]");
	if (npos > 2)
		return parse_error(s, pos[2],
				   "too many operands: usage: "
				   "write NAME [OFFSET] [LAYOUT] "
				   "hex:..|file:PATH|region:R[:ROFF[:LEN]]");
	if (npos == 2 && word_number(s, pos[0], 1, &op->offset, "offset") < 0)
		return -1;
	want = 0;
	if (op->layout.rank != 0 && layout_bytes(&op->layout, &want) < 0)
		return parse_error(s, shape_at,
				   "the layout holds more than "
				   "2^64 bytes");
	if (word_source(s, pos[npos - 1], op, want) < 0)
		return -1;
	if (op->layout.rank == 0)
		return 0;
	if (op->via == VIA_REGION && want != op->rlen)
		return parse_error(s, pos[npos - 1],
				   "the layout holds %llu "
				   "bytes, the region range %llu",
				   (unsigned long long)want,
				   (unsigned long long)op->rlen);
	if (op->via == VIA_INLINE && want != op->data_len)
		return parse_error(s, pos[npos - 1],
				   "the layout holds %llu "
				   "bytes, the data has %zu",
				   (unsigned long long)want, op->data_len);
	return 0;
}

static int parse_read(struct script *s, struct op *op)
{
	size_t pos[EXEC_MAX_WORDS], n, dest = 0, shape_at = 0;
	struct binding *b;

	if (word_target(s, 1, op, &b) < 0 ||
	    split_layout(s, op, pos, &n, &shape_at) < 0)
		return -1;
	if (n > 0 && strncmp(s->word[pos[n - 1]], "file:", 5) == 0) {
		if (s->word[pos[n - 1]][5] == '\0')
			return parse_error(s, pos[n - 1], "file: needs a path");
		op->path = strdup(s->word[pos[n - 1]] + 5);
		if (op->path == NULL)
			return parse_error(s, pos[n - 1], "out of memory");
		n--;
	} else if (n > 0 && is_region_word(s->word[pos[n - 1]])) {
		int has_len;

		dest = pos[n - 1];
		if (word_region(s, dest, op, 0, &op->rlen, &has_len) < 0)
			return -1;
		n--;
	}
	if (op->layout.rank != 0) {
		/* The layout says how much: only an offset may come. */
		if (n > 1)
			return parse_error(s, pos[1],
					   "a read with a layout "
					   "takes only an OFFSET");
		if (n == 1 &&
		    word_number(s, pos[0], 1, &op->offset, "offset") < 0)
			return -1;
		if (layout_bytes(&op->layout, &op->rlen) < 0)
			return parse_error(s, shape_at,
					   "the layout holds "
					   "more than 2^64 bytes");
	} else if (n == 0) {
		if (b->unsized)
			return parse_error(s, 1,
					   "the script does not know how large "
					   "'%s' is (import does not say): "
					   "read %s OFFSET LEN",
					   b->name, b->name);
		op->len = b->size;
		op->rlen = op->len;
	} else if (n != 2) {
		return parse_error(s, pos[n - 1],
				   "read takes both OFFSET and "
				   "LEN, or neither");
	} else {
		if (word_number(s, pos[0], 1, &op->offset, "offset") < 0 ||
		    word_number(s, pos[1], 1, &op->len, "length") < 0)
			return -1;
		op->rlen = op->len;
	}
	return op->via == VIA_REGION ? region_range(s, dest, op) : 0;
}

static int parse_release(struct script *s, struct op *op)
{
	struct binding *b;

	if (word_target(s, 1, op, &b) < 0)
		return -1;
	b->id = 0;
	return 0;
}

/* region R BYTES [hex:..|file:PATH] */
static int parse_region(struct script *s, struct op *op)
{
	struct binding *b;

	if (word_number(s, 2, 1, &op->len, "size") < 0)
		return -1;
	if (op->len == 0 || op->len > (uint64_t)INT64_MAX)
		return parse_error(s, 2,
				   "a region holds 1 byte to 2^63-1 "
				   "bytes");
	if (s->nwords == 4) {
		if (word_data(s, 3, op) < 0)
			return -1;
		if (op->data_len > op->len)
			return parse_error(s, 3,
					   "%zu bytes of data do not fit "
					   "a region of %llu bytes",
					   op->data_len,
					   (unsigned long long)op->len);
	}
	b = word_new(s, 1, NAME_REGION, op->len);
	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	return 0;
}

/*
 * Word w is the name a shared buffer goes by in the service, checked here
 * as the daemon checks it, so a bad one costs the group nothing.
 */
static int word_shared_name(struct script *s, size_t w, struct op *op)
{
	const char *v = s->word[w];
	size_t n = strlen(v);

	if (n > EXEC_SHARED_NAME_MAX ||
	    v[strspn(v, "abcdefghijklmnopqrstuvwxyz"
			"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:")] != '\0')
		return parse_error(s, w,
				   "'%s' cannot name a shared buffer: use 1 "
				   "to %d letters, digits, '.', '_', '-', '/' "
				   "or ':'",
				   v, EXEC_SHARED_NAME_MAX);
	op->shared_name = strdup(v);
	if (op->shared_name == NULL)
		return parse_error(s, w, "out of memory");
	return 0;
}

/* share NAME SHARED: the buffer keeps its name, read-only from now on. */
static int parse_share(struct script *s, struct op *op)
{
	if (word_target(s, 1, op, NULL) < 0)
		return -1;
	return word_shared_name(s, 2, op);
}

/* import NAME SHARED: a new buffer name, of a size the script cannot know. */
static int parse_import(struct script *s, struct op *op)
{
	struct binding *b;

	if (word_shared_name(s, 2, op) < 0)
		return -1;
	b = word_new(s, 1, NAME_BUFFER, 0);
	if (b == NULL)
		return -1;
	b->unsized = true;
	op->name = b->name;
	op->handle = b->id;
	return 0;
}

static int parse_release_region(struct script *s, struct op *op)
{
	return word_use(s, 1, NAME_REGION, op, 1);
}

static int parse_reserve(struct script *s, struct op *op)
{
	struct binding *b;

	if (word_number(s, 2, 1, &op->len, "size") < 0)
		return -1;
	b = word_new(s, 1, NAME_RESERVATION, op->len);
	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	return 0;
}

/* bind RESERVATION NAME: the reservation ends, the buffer begins. */
static int parse_bind(struct script *s, struct op *op)
{
	struct binding *r = word_live(s, 1, NAME_RESERVATION);

	if (r == NULL)
		return -1;
	if (word_new_buffer(s, 2, op, r->size) < 0)
		return -1;
	op->id = r->id;
	r->id = 0;
	return 0;
}

static int parse_reserve_cpu(struct script *s, struct op *op)
{
	return word_number(s, 1, 1, &op->len, "size");
}

static int parse_mode(struct script *s, struct op *op)
{
	if (strcmp(s->word[1], "auto") == 0)
		op->mode = GPUCMD_MODE_AUTO;
	else if (strcmp(s->word[1], "persistent") == 0)
		op->mode = GPUCMD_MODE_PERSISTENT;
	else
		return parse_error(s, 1,
				   "mode is auto or persistent, not "
				   "'%s'",
				   s->word[1]);
	return 0;
}

/* The keys of a custom pool, which kinds take them, and the field. */
static const struct pool_key {
	const char *name;
	const char *alias; /* the wire's name */
	const char *kind;
	size_t offset;
	int suffix; /* a size (K, M, G), not a count */
} pool_keys[] = {
	{ "page", "page_size", "sliced",
	  offsetof(struct gpucmd_pool_options, page_size), 1 },
	{ "slice", "max_slice", "sliced",
	  offsetof(struct gpucmd_pool_options, max_slice), 1 },
	{ "pool", "max_pool_size", "sliced",
	  offsetof(struct gpucmd_pool_options, max_pool_size), 1 },
	{ "max", "max_alloc", "exclusive",
	  offsetof(struct gpucmd_pool_options, max_alloc), 1 },
	{ "period", "dealloc_period", "exclusive",
	  offsetof(struct gpucmd_pool_options, dealloc_period), 0 },
	{ "reclaim", "reclaim_at", "direct",
	  offsetof(struct gpucmd_pool_options, reclaim_at), 1 },
};

/* One key=value of a pool in word w; kv is not NUL-terminated at len. */
static int parse_pool_key(struct script *s, size_t w, const char *kv,
			  size_t len, struct gpucmd_pool_options *p)
{
	char buf[64], *v;

	if (len >= sizeof(buf) || memchr(kv, '=', len) == NULL)
		return parse_error(s, w,
				   "bad pool option '%.*s': expected "
				   "KEY=VALUE",
				   (int)len, kv);
	memcpy(buf, kv, len);
	buf[len] = '\0';
	v = strchr(buf, '=');
	*v++ = '\0';
	for (size_t k = 0; k < sizeof(pool_keys) / sizeof(pool_keys[0]); k++) {
		const struct pool_key *pk = &pool_keys[k];

		if (strcmp(buf, pk->name) != 0 && strcmp(buf, pk->alias) != 0)
			continue;
		if (strcmp(p->kind, pk->kind) != 0)
			return parse_error(s, w,
					   "'%s' is an option of %s "
					   "pools, not of %s pools",
					   buf, pk->kind, p->kind);
		if (tool_parse_u64(v, pk->suffix,
				   (uint64_t *)((char *)p + pk->offset)) < 0)
			return parse_error(s, w, "bad value '%s' for %s", v,
					   buf);
		return 0;
	}
	return parse_error(s, w,
			   "unknown pool option '%s': sliced takes "
			   "page, slice, pool; exclusive takes max, period; "
			   "direct takes reclaim",
			   buf);
}

/* KIND[:key=value,...] */
static int parse_pool(struct script *s, size_t w, struct gpucmd_pool_options *p)
{
	static const char *const kinds[] = { "sliced", "exclusive", "direct" };
	const char *v = s->word[w];
	size_t len = strcspn(v, ":");

	memset(p, 0, sizeof(*p));
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
		if (strlen(kinds[k]) == len && strncmp(v, kinds[k], len) == 0)
			p->kind = kinds[k];
	if (p->kind == NULL)
		return parse_error(s, w,
				   "pool kind '%.*s' is not sliced, "
				   "exclusive or direct",
				   (int)len, v);
	for (v += len; *v == ':' || *v == ',';) {
		v++;
		len = strcspn(v, ",");
		if (parse_pool_key(s, w, v, len, p) < 0)
			return -1;
		v += len;
	}
	if (strcmp(p->kind, "sliced") == 0 && p->page_size == 0)
		return parse_error(s, w, "a sliced pool needs page=SIZE");
	if (strcmp(p->kind, "exclusive") == 0 && p->max_alloc == 0)
		return parse_error(s, w, "an exclusive pool needs max=SIZE");
	return 0;
}

static int parse_pools(struct script *s, struct op *op)
{
	static const char *const presets[] = { "subslices", "exclusive",
					       "custom" };

	for (size_t k = 0; k < sizeof(presets) / sizeof(presets[0]); k++)
		if (strcmp(s->word[1], presets[k]) == 0)
			op->preset = presets[k];
	if (op->preset == NULL)
		return parse_error(s, 1,
				   "layout '%s' is not subslices, "
				   "exclusive or custom",
				   s->word[1]);
	if (strcmp(op->preset, "custom") != 0) {
		if (s->nwords > 2)
			return parse_error(s, 2,
					   "only a custom layout lists "
					   "pools");
		return 0;
	}
	if (s->nwords == 2)
		return parse_error(s, 2,
				   "a custom layout needs at least one "
				   "POOL");
	op->pools = calloc(s->nwords - 2, sizeof(*op->pools));
	if (op->pools == NULL)
		return parse_error(s, 2, "out of memory");
	for (size_t w = 2; w < s->nwords; w++)
		if (parse_pool(s, w, &op->pools[op->npools++]) < 0)
			return -1;
	return 0;
}

/* profile begin NAME | profile end NAME */
static int parse_profile(struct script *s, struct op *op)
{
	struct binding *b;

	if (s->nwords != 3)
		return parse_error(s, s->nwords < 3 ? s->nwords : 3,
				   "usage: profile begin|end NAME");
	if (strcmp(s->word[1], "end") == 0) {
		op->kind = OP_PROFILE_END;
		return word_use(s, 2, NAME_PROFILE, op, 1);
	}
	if (strcmp(s->word[1], "begin") != 0)
		return parse_error(s, 1, "expected begin or end, not '%s'",
				   s->word[1]);
	op->kind = OP_PROFILE_BEGIN;
	b = word_new(s, 2, NAME_PROFILE, 0);
	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	return 0;
}

/* capture begin | capture end GRAPH | capture abort */
static int parse_capture(struct script *s, struct op *op)
{
	struct binding *b;

	if (strcmp(s->word[1], "abort") == 0) {
		if (s->nwords != 2)
			return parse_error(s, 2,
					   "capture abort takes no "
					   "operands");
		/* capture_end of graph 0: the recording is discarded. */
		op->kind = OP_CAPTURE_END;
		op->id = 0;
		return 0;
	}
	if (strcmp(s->word[1], "begin") == 0) {
		if (s->nwords != 2)
			return parse_error(s, 2,
					   "capture begin takes no "
					   "operands");
		op->kind = OP_CAPTURE_BEGIN;
		return 0;
	}
	if (strcmp(s->word[1], "end") != 0)
		return parse_error(s, 1,
				   "expected begin, end or abort, not '%s'",
				   s->word[1]);
	if (s->nwords != 3)
		return parse_error(s, s->nwords < 3 ? s->nwords : 3,
				   "usage: capture end GRAPH");
	op->kind = OP_CAPTURE_END;
	b = word_new(s, 2, NAME_GRAPH, 0);
	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	return 0;
}

static int parse_launch(struct script *s, struct op *op)
{
	return word_use(s, 1, NAME_GRAPH, op, 0);
}

static int parse_destroy(struct script *s, struct op *op)
{
	return word_use(s, 1, NAME_GRAPH, op, 1);
}

static int parse_plain(struct script *s, struct op *op)
{
	return 0;
}

/* grid=X[,Y,Z] or block=X[,Y,Z]: missing values are 1. */
static int parse_dims(struct script *s, size_t w, const char *v,
		      uint32_t dims[3])
{
	char part[32];

	for (int i = 0; i < 3; i++)
		dims[i] = 1;
	for (int i = 0; *v != '\0'; i++) {
		size_t len = strcspn(v, ",");
		uint64_t x;

		if (i == 3 || len == 0 || len >= sizeof(part))
			return parse_error(s, w,
					   "bad dimensions in '%s': "
					   "expected X[,Y[,Z]]",
					   s->word[w]);
		memcpy(part, v, len);
		part[len] = '\0';
		if (tool_parse_u64(part, 0, &x) < 0 || x == 0 || x > UINT32_MAX)
			return parse_error(s, w,
					   "bad dimension '%s' in '%s': "
					   "expected a number from 1 to %u",
					   part, s->word[w], UINT32_MAX);
		dims[i] = (uint32_t)x;
		v += len;
		if (*v == ',' && *++v == '\0')
			return parse_error(s, w, "trailing ',' in '%s'",
					   s->word[w]);
	}
	return 0;
}

/* A typed scalar argument: u32:N, i32:N, u64:N or f32:X. */
static int parse_scalar(struct script *s, size_t w, struct gpucmd_arg *a)
{
	const char *word = s->word[w];
	const char *v = strchr(word, ':') + 1;
	int neg = v[0] == '-';
	uint64_t x, max;
	char *end;

	if (strncmp(word, "f32:", 4) == 0) {
		errno = 0;
		a->kind = GPUCMD_ARG_F32;
		a->v.f32 = strtof(v, &end);
		if (*v == '\0' || *end != '\0' || errno == ERANGE)
			return parse_error(s, w, "bad f32 value '%s'", v);
		return 0;
	}
	if (strncmp(word, "u32:", 4) == 0) {
		a->kind = GPUCMD_ARG_U32;
		max = neg ? 0 : UINT32_MAX;
	} else if (strncmp(word, "u64:", 4) == 0) {
		a->kind = GPUCMD_ARG_U64;
		max = neg ? 0 : UINT64_MAX;
	} else if (strncmp(word, "i32:", 4) == 0) {
		a->kind = GPUCMD_ARG_I32;
		max = neg ? (uint64_t)INT32_MAX + 1 : INT32_MAX;
	} else {
		return parse_error(s, w,
				   "unknown argument type '%.*s': use a "
				   "buffer name, in:, u32:, i32:, u64: or "
				   "f32:",
				   (int)(v - 1 - word), word);
	}
	if (tool_parse_u64(v + neg, 0, &x) < 0)
		return parse_error(s, w,
				   "bad number '%s': expected decimal or "
				   "0x hex",
				   v);
	if (x > max || (neg && x == 0))
		return parse_error(s, w, "'%s' is out of range for %.3s", v,
				   word);
	a->v.u64 = 0;
	if (a->kind == GPUCMD_ARG_U32)
		a->v.u32 = (uint32_t)x;
	else if (a->kind == GPUCMD_ARG_U64)
		a->v.u64 = x;
	else
		a->v.i32 = neg ? (int32_t)(-(int64_t)x) : (int32_t)x;
	return 0;
}

static int parse_kernel(struct script *s, struct op *op)
{
	const char *dot = strchr(s->word[1], '.');

	/* MODULE.FUNCTION names a function of a module this script loaded. */
	if (dot != NULL) {
		char *mod = strndup(s->word[1], (size_t)(dot - s->word[1]));
		struct binding *mb =
			mod ? binding_find(&s->names[NAME_MODULE], mod) : NULL;

		free(mod);
		if (mb == NULL || mb->id == 0 || dot[1] == '\0')
			return parse_error(s, 1,
					   "'%s' is not MODULE.FUNCTION "
					   "of a module loaded with the module "
					   "line",
					   s->word[1]);
		op->id = mb->id;
		op->kernel = strdup(dot + 1);
	} else {
		op->kernel = strdup(s->word[1]);
	}
	op->args = calloc(s->nwords, sizeof(*op->args));
	if (op->kernel == NULL || op->args == NULL)
		return parse_error(s, 1, "out of memory");
	for (int i = 0; i < 3; i++)
		op->grid[i] = op->block[i] = 1;
	for (size_t w = 2; w < s->nwords; w++) {
		const char *v = s->word[w];
		struct gpucmd_arg *a = &op->args[op->nargs];
		struct binding *b;

		if (strncmp(v, "grid=", 5) == 0) {
			if (parse_dims(s, w, v + 5, op->grid) < 0)
				return -1;
			continue;
		}
		if (strncmp(v, "block=", 6) == 0) {
			if (parse_dims(s, w, v + 6, op->block) < 0)
				return -1;
			continue;
		}
		if (strncmp(v, "shared=", 7) == 0) {
			uint64_t x;

			if (tool_parse_u64(v + 7, 1, &x) < 0 || x > UINT32_MAX)
				return parse_error(s, w,
						   "bad shared memory "
						   "size '%s'",
						   v + 7);
			op->shared = (uint32_t)x;
			continue;
		}
		if (strncmp(v, "in:", 3) == 0) {
			/* A buffer the kernel only reads: shared ones too. */
			if (v[3] == '\0')
				return parse_error(s, w,
						   "in: needs a buffer name: "
						   "in:NAME");
			b = name_live(s, w, NAME_BUFFER, v + 3);
			if (b == NULL)
				return -1;
			a->kind = GPUCMD_ARG_BUFFER_IN;
			a->v.handle = b->id;
		} else if (strchr(v, ':') != NULL) {
			if (parse_scalar(s, w, a) < 0)
				return -1;
		} else {
			b = word_buffer(s, w);
			if (b == NULL)
				return -1;
			a->kind = GPUCMD_ARG_BUFFER;
			a->v.handle = b->id;
		}
		op->nargs++;
	}
	return 0;
}

/* module NAME ptx|cubin|fatbin|cuda:hex:..|file:PATH */
static int parse_module(struct script *s, struct op *op)
{
	static const char *const formats[] = { "ptx", "cubin", "fatbin",
					       "cuda" };
	char *v = s->word[2];
	char *colon = strchr(v, ':');
	struct binding *b;
	int rc;

	for (size_t i = 0; colon != NULL && i < 4; i++) {
		if ((size_t)(colon - v) == strlen(formats[i]) &&
		    strncmp(v, formats[i], strlen(formats[i])) == 0) {
			op->kernel = strdup(formats[i]);
			break;
		}
	}
	if (op->kernel == NULL)
		return parse_error(s, 2,
				   "expected ptx:, cubin:, fatbin: or "
				   "cuda: before the data, not '%s'",
				   v);
	s->word[2] = colon + 1;
	rc = word_data(s, 2, op);
	s->word[2] = v;
	if (rc < 0)
		return -1;
	b = word_new(s, 1, NAME_MODULE, 0);
	if (b == NULL)
		return -1;
	op->name = b->name;
	op->id = b->id;
	return 0;
}

static const struct op_syntax syntax[] = {
	{ "empty", OP_EMPTY, 2, 2, parse_empty, "empty NAME BYTES" },
	{ "create", OP_CREATE, 2, 2, parse_create,
	  "create NAME hex:..|file:PATH|region:R[:ROFF[:LEN]]" },
	{ "write", OP_WRITE, 2, 6, parse_write,
	  "write NAME [OFFSET] [LAYOUT] hex:..|file:PATH|region:R[:ROFF[:LEN]]" },
	{ "read", OP_READ, 1, 6, parse_read,
	  "read NAME [OFFSET LEN | [OFFSET] LAYOUT] [file:PATH|region:R[:ROFF]]" },
	{ "kernel", OP_KERNEL, 1, EXEC_MAX_WORDS, parse_kernel,
	  "kernel KERNEL grid=X[,Y,Z] block=X[,Y,Z] ARG..." },
	{ "release", OP_RELEASE, 1, 1, parse_release, "release NAME" },
	{ "share", OP_SHARE, 2, 2, parse_share, "share NAME SHARED" },
	{ "import", OP_IMPORT, 2, 2, parse_import, "import NAME SHARED" },
	{ "sync", OP_SYNC, 0, 0, parse_plain, "sync" },
	{ "usage", OP_USAGE, 0, 0, parse_plain, "usage" },
	{ "ping", OP_PING, 0, 0, parse_plain, "ping" },
	{ "reserve", OP_RESERVE, 2, 2, parse_reserve,
	  "reserve RESERVATION BYTES" },
	{ "bind", OP_BIND, 2, 2, parse_bind, "bind RESERVATION NAME" },
	{ "cursor", OP_CURSOR, 0, 0, parse_plain, "cursor" },
	{ "report", OP_REPORT, 0, 0, parse_plain, "report" },
	{ "cleanup", OP_CLEANUP, 0, 0, parse_plain, "cleanup" },
	{ "flush", OP_FLUSH, 0, 0, parse_plain, "flush" },
	{ "mode", OP_MODE, 1, 1, parse_mode, "mode auto|persistent" },
	{ "pools", OP_POOLS, 1, EXEC_MAX_WORDS, parse_pools,
	  "pools subslices|exclusive|custom POOL..." },
	{ "reserve-cpu", OP_RESERVE_CPU, 1, 1, parse_reserve_cpu,
	  "reserve-cpu BYTES" },
	{ "profile", OP_PROFILE_BEGIN, 2, 2, parse_profile,
	  "profile begin|end NAME" },
	{ "capture", OP_CAPTURE_BEGIN, 1, 2, parse_capture,
	  "capture begin | capture end GRAPH" },
	{ "launch", OP_LAUNCH, 1, 1, parse_launch, "launch GRAPH" },
	{ "destroy", OP_DESTROY, 1, 1, parse_destroy, "destroy GRAPH" },
	{ "region", OP_REGION, 2, 3, parse_region,
	  "region R BYTES [hex:..|file:PATH]" },
	{ "release-region", OP_RELEASE_REGION, 1, 1, parse_release_region,
	  "release-region R" },
	{ "module", OP_MODULE, 2, 2, parse_module,
	  "module NAME ptx|cubin|fatbin|cuda:hex:..|file:PATH" },
};

static void op_clear(struct op *op)
{
	free(op->pools);
	free(op->data);
	free(op->src);
	free(op->path);
	free(op->kernel);
	free(op->shared_name);
	free(op->args);
}

static void group_clear(struct group *g)
{
	for (size_t i = 0; i < g->n; i++)
		op_clear(&g->ops[i]);
	g->n = 0;
}

/* Parse one op line (not stream or submit) onto the group. */
static int parse_op(struct script *s, struct group *g)
{
	const struct op_syntax *syn = NULL;
	size_t nargs = s->nwords - 1;
	struct op *op;

	for (size_t i = 0; i < sizeof(syntax) / sizeof(syntax[0]); i++)
		if (strcmp(s->word[0], syntax[i].name) == 0)
			syn = &syntax[i];
	if (syn == NULL)
		return parse_error(s, 0,
				   "unknown op '%s' (gpucmd exec --help "
				   "lists them)",
				   s->word[0]);
	if (nargs < syn->min_args || nargs > syn->max_args)
		return parse_error(s,
				   nargs < syn->min_args ? s->nwords :
							   1 + syn->max_args,
				   "%s: usage: %s",
				   nargs < syn->min_args ? "missing operand" :
							   "too many operands",
				   syn->usage);
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 16;
		struct op *ops = realloc(g->ops, cap * sizeof(*ops));

		if (ops == NULL)
			return parse_error(s, 0, "out of memory");
		g->ops = ops;
		g->cap = cap;
	}
	op = &g->ops[g->n];
	memset(op, 0, sizeof(*op));
	op->kind = syn->kind;
	op->line = s->line;
	op->stream = s->stream;
	g->n++; /* counted now so group_clear frees a half-parsed op */
	return syn->parse(s, op);
}

/*
 * Parse lines up to `submit` or the end of the script into g: 0, or -1
 * after a parse error was printed.
 */
static int parse_group(struct script *s, struct group *g)
{
	for (;;) {
		int r = next_line(s);

		if (r == 1) {
			s->eof = 1;
			return 0;
		}
		if (r == -ENOMEM) {
			fprintf(stderr, "gpucmd: out of memory\n");
			return -1;
		}
		if (r < 0)
			return -1;
		if (s->nwords == 0)
			continue;
		if (strcmp(s->word[0], "submit") == 0) {
			if (s->nwords > 1)
				return parse_error(s, 1,
						   "submit takes no "
						   "operands");
			return 0;
		}
		if (strcmp(s->word[0], "stream") == 0) {
			uint64_t n;

			if (s->nwords != 2)
				return parse_error(s, s->nwords > 2 ? 2 : 1,
						   "usage: stream N");
			if (word_number(s, 1, 0, &n, "stream") < 0)
				return -1;
			if (n > UINT32_MAX)
				return parse_error(
					s, 1,
					"stream %" PRIu64
					" is out of range (0 to %" PRIu32 ")",
					n, UINT32_MAX);
			s->stream = (uint32_t)n;
			continue;
		}
		if (parse_op(s, g) < 0)
			return -1;
	}
}

/* ---- running ------------------------------------------------------------ */

static int batch_add(struct gpucmd_batch *b, const struct op *op)
{
	switch (op->kind) {
	case OP_EMPTY:
		return gpucmd_batch_empty(b, op->handle, op->len);
	case OP_CREATE:
		if (op->via != VIA_INLINE)
			return gpucmd_batch_create_region(b, op->handle,
							  op->region, op->roff,
							  op->rlen);
		return gpucmd_batch_create_with_data(b, op->handle, op->data,
						     op->data_len);
	case OP_WRITE:
		if (op->via != VIA_INLINE && op->layout.rank != 0)
			return gpucmd_batch_write_region_layout(b, op->handle,
								op->offset,
								&op->layout,
								op->region,
								op->roff);
		if (op->via != VIA_INLINE)
			return gpucmd_batch_write_region(b, op->handle,
							 op->offset, op->region,
							 op->roff, op->rlen);
		if (op->layout.rank != 0)
			return gpucmd_batch_write_layout(b, op->handle,
							 op->offset,
							 &op->layout, op->data,
							 op->data_len);
		return gpucmd_batch_write(b, op->handle, op->offset, op->data,
					  op->data_len);
	case OP_READ:
		if (op->via != VIA_INLINE && op->layout.rank != 0)
			return gpucmd_batch_read_region_layout(b, op->handle,
							       op->offset,
							       &op->layout,
							       op->region,
							       op->roff);
		if (op->via != VIA_INLINE)
			return gpucmd_batch_read_region(b, op->handle,
							op->offset, op->len,
							op->region, op->roff);
		if (op->layout.rank != 0)
			return gpucmd_batch_read_layout(b, op->handle,
							op->offset,
							&op->layout);
		return gpucmd_batch_read(b, op->handle, op->offset, op->len);
	case OP_RELEASE_REGION:
		return gpucmd_batch_release_region(b, op->id);
	case OP_REGION:
		break; /* run before the group's requests */
	case OP_KERNEL:
		if (op->id != 0)
			return gpucmd_batch_kernel_module(b, op->id, op->kernel,
							  op->grid, op->block,
							  op->shared, op->args,
							  op->nargs);
		return gpucmd_batch_kernel_shared(b, op->kernel, op->grid,
						  op->block, op->shared,
						  op->args, op->nargs);
	case OP_MODULE:
		return gpucmd_batch_load_module(b, op->id, op->kernel, op->data,
						op->data_len);
	case OP_RELEASE:
		return gpucmd_batch_release(b, op->handle);
	case OP_SHARE:
		return gpucmd_batch_share(b, op->handle, op->shared_name);
	case OP_IMPORT:
		return gpucmd_batch_import(b, op->handle, op->shared_name);
	case OP_SYNC:
		return gpucmd_batch_sync(b);
	case OP_USAGE:
		return gpucmd_batch_memory_usage(b);
	case OP_PING:
		return gpucmd_batch_ping(b);
	case OP_RESERVE:
		return gpucmd_batch_reserve(b, op->id, op->len);
	case OP_BIND:
		return gpucmd_batch_bind(b, op->id, op->handle);
	case OP_CURSOR:
		return gpucmd_batch_cursor(b);
	case OP_REPORT:
		return gpucmd_batch_stream_report(b);
	case OP_CLEANUP:
		return gpucmd_batch_memory_cleanup(b);
	case OP_FLUSH:
		return gpucmd_batch_flush_drops(b);
	case OP_MODE:
		return gpucmd_batch_allocation_mode(b, op->mode);
	case OP_POOLS:
		return gpucmd_batch_install_pools(b, op->preset, op->pools,
						  op->npools);
	case OP_RESERVE_CPU:
		return gpucmd_batch_reserve_cpu(b, op->len);
	case OP_PROFILE_BEGIN:
		return gpucmd_batch_profile_begin(b, op->id);
	case OP_PROFILE_END:
		return gpucmd_batch_profile_end(b, op->id);
	case OP_CAPTURE_BEGIN:
		return gpucmd_batch_capture_begin(b);
	case OP_CAPTURE_END:
		return op->id == 0 ? gpucmd_batch_capture_abort(b) :
				     gpucmd_batch_capture_end(b, op->id);
	case OP_LAUNCH:
		return gpucmd_batch_graph_launch(b, op->id);
	case OP_DESTROY:
		return gpucmd_batch_graph_destroy(b, op->id);
	}
	return GPUCMD_EINVAL;
}

/* Why the library refused to queue op; a limit gets its numbers. */
static void queue_error(struct exec *x, const struct op *op, int code)
{
	const struct gpucmd_info *in = gpucmd_info(x->conn);

	fflush(stdout);
	fprintf(stderr, "gpucmd: %s:%u: cannot queue %s: ", x->s.label,
		op->line, op_names[op->kind]);
	if (code == GPUCMD_ELIMIT && op->via == VIA_INLINE &&
	    op->data_len > in->max_frame_bytes)
		fprintf(stderr,
			"%zu bytes of data is over the daemon's frame "
			"limit of %u bytes (max_frame_bytes)\n",
			op->data_len, in->max_frame_bytes);
	else if (code == GPUCMD_ELIMIT)
		fprintf(stderr,
			"the daemon takes at most %u ops per request; "
			"split the group with submit\n",
			in->max_ops_per_batch);
	else
		fprintf(stderr, "%s\n", gpucmd_strerror(code));
}

/*
 * Build every request of the group before any is sent, so an op that the
 * library refuses (over a limit) stops the group with nothing done.
 */
static int build_requests(struct exec *x, struct group *g, struct request *req,
			  size_t nreq)
{
	for (size_t k = 0; k < nreq; k++) {
		const struct op *first = &g->ops[req[k].first];
		int r = gpucmd_batch_new(x->conn, first->stream, &req[k].batch);

		for (size_t j = 0; r == 0 && j < req[k].n; j++) {
			const struct op *op = &first[j];

			r = batch_add(req[k].batch, op);
			if (r < 0)
				queue_error(x, op, r);
		}
		if (r < 0)
			return TOOL_EXIT_USAGE;
	}
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * The script lines of a request (ops first to last), as messages about it
 * name them: "script line 3", or "script lines 1-3" for a request of
 * several ops, whichever of them the daemon is busy with.
 */
static void request_span(const struct op *first, const struct op *last,
			 char *buf, size_t len)
{
	if (first->line == last->line)
		snprintf(buf, len, "script line %u", first->line);
	else
		snprintf(buf, len, "script lines %u-%u", first->line,
			 last->line);
}

static void request_lines(const struct group *g, const struct request *rq,
			  char *buf, size_t len)
{
	request_span(&g->ops[rq->first], &g->ops[rq->first + rq->n - 1], buf,
		     len);
}

/*
 * Wait for rq's answer.  On a terminal (and without --json), a wait of
 * more than a second shows on stderr what it waits for and for how long,
 * redrawn each second and erased when the answer comes: a long kernel or
 * a large transfer does not look like a hung command.  The wait keeps to
 * --timeout all the same.  The line names the request's lines and first
 * and last ops, as a timeout's message names its lines: with no answer
 * there is no knowing which op the daemon is at.
 */
static int wait_shown(struct exec *x, const struct group *g, struct request *rq)
{
	const struct op *first = &g->ops[rq->first];
	const struct op *last = &g->ops[rq->first + rq->n - 1];
	char lines[64];
	int limit = x->opts->timeout_ms;
	uint64_t start = now_ms();
	bool shown = false;
	int r;

	if (x->json || !isatty(STDERR_FILENO))
		return gpucmd_wait(x->conn, rq->id, &rq->resp);
	for (;;) {
		uint64_t spent = now_ms() - start;
		int slice = 1000;

		if (limit >= 0 && spent >= (uint64_t)limit) {
			r = -ETIMEDOUT;
			break;
		}
		if (limit >= 0 && (uint64_t)limit - spent < 1000u)
			slice = (int)((uint64_t)limit - spent);
		r = gpucmd_wait_timeout(x->conn, rq->id, slice, &rq->resp);
		/* A look that found nothing leaves the connection as it was. */
		if (r != -ETIMEDOUT || gpucmd_conn_error(x->conn, NULL) != 0)
			break;
		request_lines(g, rq, lines, sizeof(lines));
		fprintf(stderr,
			"\rgpucmd: waiting for %s (%s%s%s): %" PRIu64 " s ",
			lines, op_names[first->kind], rq->n > 1 ? " to " : "",
			rq->n > 1 ? op_names[last->kind] : "",
			(now_ms() - start) / 1000u);
		shown = true;
	}
	if (shown)
		fprintf(stderr, "\r\033[K");
	return r;
}

/*
 * After a wait timed out (--timeout) the daemon is taken as gone: the
 * requests after it are neither sent nor waited for, and fail the same.
 */
static void wait_request(struct exec *x, const struct group *g,
			 struct request *rq, int *timed_out)
{
	if (rq->err == 0 && *timed_out)
		rq->err = -ETIMEDOUT;
	if (rq->err == 0)
		rq->err = wait_shown(x, g, rq);
	if (rq->err == -ETIMEDOUT)
		*timed_out = 1;
}

/* Send the requests pipelined, at most max_in_flight outstanding. */
static void send_requests(struct exec *x, const struct group *g,
			  struct request *req, size_t nreq)
{
	uint32_t max = gpucmd_info(x->conn)->max_in_flight;
	size_t waited = 0;
	int timed_out = 0;

	for (size_t k = 0; k < nreq; k++) {
		while (max > 0 && k - waited >= max)
			wait_request(x, g, &req[waited++], &timed_out);
		if (timed_out) {
			gpucmd_batch_free(req[k].batch);
			req[k].err = -ETIMEDOUT;
		} else {
			req[k].err = gpucmd_submit(req[k].batch, &req[k].id);
			if (req[k].err == -ETIMEDOUT)
				timed_out = 1;
		}
		req[k].batch = NULL;
	}
	while (waited < nreq)
		wait_request(x, g, &req[waited++], &timed_out);
}

static void json_head(const struct op *op)
{
	printf("{\"line\":%u,\"op\":\"%s\"", op->line, op_names[op->kind]);
}

static void print_hex(const uint8_t *p, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	char buf[4096] = "";
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		buf[k++] = digits[p[i] >> 4];
		buf[k++] = digits[p[i] & 15];
		if (k == sizeof(buf)) {
			fwrite(buf, 1, k, stdout);
			k = 0;
		}
	}
	fwrite(buf, 1, k, stdout);
}

static int write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wbe");
	int err;

	if (f == NULL)
		return -errno;
	err = fwrite(data, 1, len, f) == len ? 0 : -EIO;
	if (fclose(f) != 0 && err == 0)
		err = errno != 0 ? -errno : -EIO;
	return err;
}

static void json_error(const struct op *op, int code, const char *message);

static int print_read(struct exec *x, const struct op *op, const void *data,
		      size_t len)
{
	int r;

	if (op->path == NULL) {
		if (x->json) {
			json_head(op);
			printf(",\"name\":");
			tool_json_string(stdout, op->name);
			printf(",\"data\":\"");
		}
		print_hex(data, len);
		printf(x->json ? "\"}\n" : "\n");
		return TOOL_EXIT_OK;
	}
	r = write_file(op->path, data, len);
	if (r < 0) {
		if (x->json) {
			char msg[4096 + 128];

			snprintf(msg, sizeof(msg), "cannot write '%s': %s",
				 op->path, strerror(-r));
			json_error(op, r, msg);
		}
		fflush(stdout);
		fprintf(stderr, "gpucmd: %s:%u: cannot write '%s': %s\n",
			x->s.label, op->line, op->path, strerror(-r));
		return TOOL_EXIT_FAIL;
	}
	if (x->json) {
		json_head(op);
		printf(",\"name\":");
		tool_json_string(stdout, op->name);
		printf(",\"bytes\":%zu,\"file\":", len);
		tool_json_string(stdout, op->path);
		printf("}\n");
	} else {
		printf("%s: %zu bytes -> %s\n", op->name, len, op->path);
	}
	return TOOL_EXIT_OK;
}

/* A read that landed in a named region: where. */
static int print_read_region(struct exec *x, const struct op *op, uint64_t len,
			     uint64_t roff)
{
	if (x->json) {
		json_head(op);
		printf(",\"name\":");
		tool_json_string(stdout, op->name);
		printf(",\"bytes\":%" PRIu64 ",\"region\":", len);
		tool_json_string(stdout, op->region_name);
		printf(",\"region_offset\":%" PRIu64 "}\n", roff);
	} else {
		printf("%s: %" PRIu64 " bytes -> region %s at %" PRIu64 "\n",
		       op->name, len, op->region_name, roff);
	}
	return TOOL_EXIT_OK;
}

static int print_usage(struct exec *x, const struct op *op,
		       const struct gpucmd_memory_usage *u)
{
	if (x->json) {
		json_head(op);
		printf(",");
		tool_json_usage(u);
		printf("}\n");
	} else {
		printf("usage: allocations=%" PRIu64 " bytes_in_use=%" PRIu64
		       " bytes_padding=%" PRIu64 " bytes_reserved=%" PRIu64
		       "\n",
		       u->allocations, u->bytes_in_use, u->bytes_padding,
		       u->bytes_reserved);
	}
	return TOOL_EXIT_OK;
}

/* The stream's usage on one line, then its pools as a table. */
static int print_report(struct exec *x, const struct op *op,
			const struct gpucmd_stream_report *sr)
{
	if (x->json) {
		json_head(op);
		printf(",");
		tool_json_stream(sr);
		printf("}\n");
		return TOOL_EXIT_OK;
	}
	printf("report: stream %u (connection %" PRIu64
	       "): allocations=%" PRIu64 " bytes_in_use=%" PRIu64
	       " bytes_padding=%" PRIu64 " bytes_reserved=%" PRIu64 "\n",
	       sr->stream, sr->connection_id, sr->usage.allocations,
	       sr->usage.bytes_in_use, sr->usage.bytes_padding,
	       sr->usage.bytes_reserved);
	/* Exact bytes: a script's output is compared, not skimmed. */
	if (tool_pool_table(sr, 1, 2) < 0) {
		fflush(stdout);
		fprintf(stderr, "gpucmd: %s:%u: out of memory\n", x->s.label,
			op->line);
		return TOOL_EXIT_FAIL;
	}
	return TOOL_EXIT_OK;
}

static int print_profile(struct exec *x, const struct op *op,
			 const struct gpucmd_profile *p)
{
	if (x->json) {
		json_head(op);
		printf(",\"name\":");
		tool_json_string(stdout, op->name);
		printf(",\"valid\":%s", p->valid ? "true" : "false");
		if (p->valid) {
			printf(",\"device_ms\":%.6f}\n", p->device_ms);
		} else {
			printf(",\"reason\":");
			tool_json_string(stdout, p->reason);
			printf("}\n");
		}
	} else if (p->valid) {
		printf("profile %s: %.3f ms\n", op->name, p->device_ms);
	} else {
		printf("profile %s: invalid (%s)\n", op->name, p->reason);
	}
	return TOOL_EXIT_OK;
}

/* Print the result of op, which is result i of resp. */
static int print_result(struct exec *x, const struct op *op,
			const struct gpucmd_response *resp, size_t i)
{
	struct gpucmd_memory_usage u;
	struct gpucmd_stream_report *sr;
	struct gpucmd_cpu_buffer cpu;
	struct gpucmd_profile prof;
	const char *what = "result";
	uint64_t value, region, roff, rlen;
	const void *data;
	size_t len;
	int r;

	switch (op->kind) {
	case OP_READ:
		if (op->via != VIA_INLINE) {
			what = "region range";
			if (gpucmd_response_region(resp, i, &region, &roff,
						   &rlen) < 0)
				break;
			if (op->via == VIA_SCRATCH)
				return print_read(x, op, x->scratch + roff,
						  (size_t)rlen);
			return print_read_region(x, op, rlen, roff);
		}
		what = "data";
		if (gpucmd_response_data(resp, i, &data, &len) < 0)
			break;
		return print_read(x, op, data, len);
	case OP_USAGE:
		what = "usage";
		if (gpucmd_response_usage(resp, i, &u) < 0)
			break;
		return print_usage(x, op, &u);
	case OP_PING:
		if (x->json) {
			json_head(op);
			printf("}\n");
		} else {
			printf("pong\n");
		}
		return TOOL_EXIT_OK;
	case OP_CURSOR:
		what = "cursor";
		if (gpucmd_response_value(resp, i, &value) < 0)
			break;
		if (x->json) {
			json_head(op);
			printf(",\"value\":%" PRIu64 "}\n", value);
		} else {
			printf("cursor: %" PRIu64 "\n", value);
		}
		return TOOL_EXIT_OK;
	case OP_REPORT:
		what = "stream report";
		if (gpucmd_response_stream_report(resp, i, &sr) < 0)
			break;
		r = print_report(x, op, sr);
		gpucmd_stream_report_free(sr);
		return r;
	case OP_RESERVE_CPU:
		what = "host buffer";
		if (gpucmd_response_cpu(resp, i, &cpu) < 0)
			break;
		if (x->json) {
			json_head(op);
			printf(",\"size\":%" PRIu64 ",\"pinned\":%s}\n",
			       cpu.size, cpu.pinned ? "true" : "false");
		} else {
			printf("reserve_cpu: %" PRIu64 " bytes %s\n", cpu.size,
			       cpu.pinned ? "pinned" : "heap");
		}
		return TOOL_EXIT_OK;
	case OP_PROFILE_END:
		what = "profile";
		if (gpucmd_response_profile(resp, i, &prof) < 0)
			break;
		return print_profile(x, op, &prof);
	default:
		return TOOL_EXIT_OK;
	}
	fflush(stdout);
	fprintf(stderr,
		"gpucmd: %s:%u: the daemon's answer to %s carries no "
		"%s\n",
		x->s.label, op->line, op_names[op->kind], what);
	return TOOL_EXIT_FAIL;
}

/* An error as a JSON line on stdout, beside the text on stderr. */
static void json_error(const struct op *op, int code, const char *message)
{
	json_head(op);
	printf(",\"error\":\"%s\",\"code\":%d,\"message\":",
	       gpucmd_errname(code), code);
	tool_json_string(stdout, message);
	printf("}\n");
}

/* "gpucmd: op N (KIND): message [script line L]", and JSON on stdout. */
static void print_op_error(struct exec *x, const struct op *op, int index,
			   int code, const char *message)
{
	if (message[0] == '\0')
		message = gpucmd_strerror(code);
	if (x->json)
		json_error(op, code, message);
	fflush(stdout);
	fprintf(stderr, "gpucmd: op %d (%s): %s [script line %u]\n", index,
		gpucmd_errname(code), message, op->line);
}

/*
 * The daemon's sentence with the script's name after each "handle N" it
 * gives (its ids are exec's: "handle 3 ('w')"), into buf.
 */
static void handle_names(const struct exec *x, const char *why, char *buf,
			 size_t len)
{
	const struct names *ns = &x->s.names[NAME_BUFFER];
	size_t used = 0;

	buf[0] = '\0';
	while (*why != '\0' && used + 1 < len) {
		const char *at = strstr(why, "handle ");
		const char *name = NULL;
		char *end = NULL;
		uint64_t id = 0;
		int n;

		if (at != NULL && at[7] >= '0' && at[7] <= '9')
			id = strtoull(at + 7, &end, 10);
		for (size_t i = 0; id != 0 && i < ns->n; i++)
			if (ns->v[i].id == id)
				name = ns->v[i].name;
		if (at == NULL)
			end = (char *)why + strlen(why);
		else if (end == NULL)
			end = (char *)at + 7;
		n = snprintf(buf + used, len - used, "%.*s", (int)(end - why),
			     why);
		if (n > 0)
			used += (size_t)n < len - used ? (size_t)n :
							 len - used - 1;
		if (name != NULL && used + 1 < len) {
			n = snprintf(buf + used, len - used, " ('%s')", name);
			if (n > 0)
				used += (size_t)n < len - used ? (size_t)n :
								 len - used - 1;
		}
		why = end;
	}
}

/* Print one request's results in order, then its error if it failed. */
static int print_request(struct exec *x, const struct group *g,
			 const struct request *rq)
{
	const struct gpucmd_response *resp = rq->resp;
	size_t count = gpucmd_response_count(resp);
	int code = gpucmd_response_error(resp);
	int failed = gpucmd_response_failed_index(resp);
	int status = TOOL_EXIT_OK;

	for (size_t j = 0; j < rq->n && j < count; j++) {
		int r = print_result(x, &g->ops[rq->first + j], resp, j);

		if (r != TOOL_EXIT_OK)
			status = r;
	}
	if (code == 0)
		return status;
	/*
	 * One past the last op: every op ran, and what followed failed (the
	 * daemon's host out of memory for the answer); the last op's line.
	 * A daemon that names no valid op gets the request's first line.
	 */
	if (failed >= 0 && (size_t)failed == rq->n && rq->n > 0)
		failed = (int)rq->n - 1;
	else if (failed < 0 || (size_t)failed >= rq->n)
		failed = 0;
	{
		char why[1024];

		handle_names(x, gpucmd_response_message(resp), why,
			     sizeof(why));
		print_op_error(x, &g->ops[rq->first + (size_t)failed], failed,
			       code, why);
	}
	return TOOL_EXIT_FAIL;
}

/*
 * Say why request rq got no response (not sent, or the connection died);
 * the exit status.  The JSON record has its first line.
 */
static int unanswered(struct exec *x, const struct group *g,
		      const struct request *rq, int err)
{
	const struct op *op = &g->ops[rq->first];
	char what[64], msg[576]; /* the daemon's sentence is up to 511 */
	const char *why = NULL;
	int status;

	/* What the daemon said when it closed the connection, if it did. */
	if (x->conn != NULL && gpucmd_conn_error(x->conn, &why) == 0)
		why = NULL;
	if (err == GPUCMD_EDISCONNECTED && why != NULL && why[0] != '\0' &&
	    strncmp(why, "the daemon closed", 17) != 0 &&
	    strcmp(why, gpucmd_strerror(err)) != 0)
		snprintf(msg, sizeof(msg),
			 "the daemon closed the connection: %s", why);
	else
		snprintf(msg, sizeof(msg), "%s",
			 err == GPUCMD_EDISCONNECTED ?
				 "the daemon closed the connection" :
				 gpucmd_strerror(err));
	if (x->json)
		json_error(op, err, msg);
	request_lines(g, rq, what, sizeof(what));
	status = tool_fail_why(what, err,
			       err == GPUCMD_EDISCONNECTED ? why : NULL);
	if (err == GPUCMD_ELIMIT) {
		uint64_t data = 0;

		/* The bytes it carries in the frame, which put it over. */
		for (size_t i = rq->first; i < rq->first + rq->n; i++) {
			const struct op *o = &g->ops[i];

			if (((o->kind == OP_WRITE || o->kind == OP_CREATE) &&
			     o->via == VIA_INLINE) ||
			    o->kind == OP_MODULE)
				data += o->data_len;
		}
		fprintf(stderr,
			"gpucmd: the request carries %" PRIu64 " bytes "
			"of data in its frame, over the daemon's "
			"max_frame_bytes of %" PRIu32
			" with its framing; split "
			"the group with submit\n",
			data,
			x->conn != NULL ?
				gpucmd_info(x->conn)->max_frame_bytes :
				0);
	}
	return status;
}

/* ---- regions ------------------------------------------------------------ */

/* The largest transfer that goes inline on this connection. */
static uint64_t inline_limit(struct exec *x)
{
	uint64_t frame = gpucmd_info(x->conn)->max_frame_bytes;
	uint64_t room = frame > EXEC_FRAME_SLACK ? frame - EXEC_FRAME_SLACK : 0;

	return room < GPUCMD_INLINE_MAX ? room : GPUCMD_INLINE_MAX;
}

/* The bytes a write, create or read moves; 0 for other ops. */
static uint64_t op_bytes(const struct op *op)
{
	switch (op->kind) {
	case OP_WRITE:
	case OP_CREATE:
		return op->via == VIA_INLINE ? op->data_len : op->rlen;
	case OP_READ:
		return op->rlen;
	default:
		return 0;
	}
}

/*
 * A region that could not be made: say so, with why (the daemon's last
 * message when NULL); the exit status.
 */
static int region_failed(struct exec *x, const struct op *op, const char *what,
			 const char *why, int code)
{
	char line[1024];

	if (why == NULL)
		why = gpucmd_last_message(x->conn);
	if (x->json)
		json_error(op, code, why[0] ? why : gpucmd_strerror(code));
	snprintf(line, sizeof(line), "script line %u: %s%s%s", op->line, what,
		 why[0] ? ": " : "", why);
	return tool_fail(line, code);
}

/*
 * The daemon's last sentence with "region ID" (the number it knows the
 * region by, which is nothing the script wrote) spelled as label.
 */
static void region_reason(struct exec *x, uint64_t id, const char *label,
			  char *buf, size_t len)
{
	const char *why = gpucmd_last_message(x->conn);
	char num[48];
	const char *at;
	size_t n;

	n = (size_t)snprintf(num, sizeof(num), "region %" PRIu64, id);
	at = strstr(why, num);
	if (at == NULL || (at[n] >= '0' && at[n] <= '9'))
		snprintf(buf, len, "%s", why);
	else
		snprintf(buf, len, "%.*s%s%s", (int)(at - why), why, label,
			 at + n);
}

/* Why the group's scratch region (ids 2^62 and up) was refused. */
static void scratch_reason(struct exec *x, char *buf, size_t len)
{
	region_reason(x, x->scratch_id, "exec's scratch region", buf, len);
}

/*
 * Read op's file: operand, measured when its line was parsed, into dest
 * (data_len bytes).  A file that is no longer that long is refused rather
 * than sent short or cut.  0, or the exit status after saying why.
 */
static int op_load(struct exec *x, const struct op *op, uint8_t *dest)
{
	int fd = open(op->src, O_RDONLY | O_CLOEXEC);
	size_t done = 0;
	char msg[4096 + 256], extra;
	int err = fd < 0 ? errno : 0;

	while (err == 0 && done < op->data_len) {
		size_t want = op->data_len - done;
		ssize_t n = read(fd, dest + done,
				 want < (1u << 30) ? want : (1u << 30));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			err = errno;
		else if (n == 0)
			break;
		else
			done += (size_t)n;
	}
	/* One byte more: the file grew. */
	if (err == 0 && done == op->data_len && read(fd, &extra, 1) > 0)
		done++;
	if (fd >= 0)
		close(fd);
	if (err == 0 && done == op->data_len)
		return 0;
	if (err != 0)
		snprintf(msg, sizeof(msg), "cannot read '%s': %s", op->src,
			 strerror(err));
	else
		snprintf(msg, sizeof(msg),
			 "'%s' changed size after line %u "
			 "was parsed (it had %zu bytes then); run the script "
			 "again once nothing writes to it",
			 op->src, op->line, op->data_len);
	if (x->json)
		json_error(op, err != 0 ? -err : -EIO, msg);
	fflush(stdout);
	fprintf(stderr, "gpucmd: %s:%u: %s\n", x->s.label, op->line, msg);
	return TOOL_EXIT_FAIL;
}

/* Read op's file: operand into memory of its own, for the frame. */
static int op_load_heap(struct exec *x, struct op *op)
{
	op->data = malloc(op->data_len);
	if (op->data == NULL) {
		fflush(stdout);
		fprintf(stderr,
			"gpucmd: %s:%u: out of memory for the %zu "
			"bytes of '%s'\n",
			x->s.label, op->line, op->data_len, op->src);
		return TOOL_EXIT_FAIL;
	}
	return op_load(x, op, op->data);
}

/* a + b, or UINT64_MAX where that overflows. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t sum;

	return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

/*
 * The group's scratch region of total bytes was refused for the
 * service's region_limit (GPUCMD_EQUOTA), the daemon's count of regions
 * (GPUCMD_ELIMIT) or memory (GPUCMD_ENOMEM: the daemon could not map it,
 * or the CUDA driver could not pin it).  Its transfers go inline instead,
 * as those of
 * gpucmd_write_buffer do, when each request that gets one still fits a
 * frame, its bytes going out and its reads coming back (the daemon keeps
 * a reply to max_frame_bytes as well).  0, or the exit status after
 * saying what would fit where.
 */
static int scratch_refused(struct exec *x, struct group *g, uint64_t total,
			   const struct op *first_big, int code)
{
	const struct gpucmd_info *in = gpucmd_info(x->conn);
	uint64_t room = in->max_frame_bytes > EXEC_FRAME_SLACK ?
				in->max_frame_bytes - EXEC_FRAME_SLACK :
				0;
	char why[640], refused[1024], advice[256], over[1024], span[64];

	scratch_reason(x, why, sizeof(why));
	x->scratch_id = 0;
	/* One request per run of ops on a stream (run_group), regions aside. */
	for (size_t i = 0; i < g->n;) {
		const struct op *from = NULL, *to = NULL;
		uint64_t sent = 0, back = 0;
		bool moved = false;
		size_t j;

		for (j = i; j < g->n; j++) {
			struct op *op = &g->ops[j];

			if (op->kind == OP_REGION)
				continue;
			if (from != NULL && op->stream != from->stream)
				break;
			if (from == NULL)
				from = op;
			to = op;
			if (op->via == VIA_SCRATCH) {
				op->via = VIA_INLINE;
				op->roff = 0;
				moved = true;
			}
			if (op->via != VIA_INLINE)
				continue;
			if (op->kind == OP_READ)
				back = sat_add(back, op_bytes(op));
			else if (op->kind == OP_MODULE)
				sent = sat_add(sent, op->data_len);
			else
				sent = sat_add(sent, op_bytes(op));
		}
		i = j;
		if (!moved || (sent <= room && back <= room))
			continue;
		if (why[0] != '\0')
			snprintf(refused, sizeof(refused),
				 "cannot create "
				 "exec's scratch region for the transfers over "
				 "%" PRIu64 " bytes: %s",
				 inline_limit(x), why);
		else
			snprintf(refused, sizeof(refused),
				 "cannot create "
				 "exec's scratch region of %" PRIu64 " bytes "
				 "for the transfers over %" PRIu64 " bytes: %s",
				 total, inline_limit(x), gpucmd_strerror(code));
		if (code == GPUCMD_EQUOTA)
			snprintf(advice, sizeof(advice),
				 "raise the service's "
				 "region_limit (%" PRIu64 " bytes) by %" PRIu64
				 " bytes",
				 in->region_limit, total);
		else if (code == GPUCMD_ENOMEM)
			snprintf(advice, sizeof(advice),
				 "free memory on the "
				 "daemon's host (or, on CUDA, its pinned "
				 "memory) for a region of %" PRIu64 " bytes",
				 total);
		else
			snprintf(advice, sizeof(advice),
				 "release a region "
				 "before this group (release-region)");
		request_span(from, to, span, sizeof(span));
		snprintf(over, sizeof(over),
			 "nor do they fit inline: the "
			 "request of %s would %s %" PRIu64 " bytes, over the "
			 "%" PRIu64 " bytes a frame holds (max_frame_bytes is "
			 "%u): %s, raise max_frame_bytes, or move the data in "
			 "pieces of at most %" PRIu64 " bytes with submit "
			 "between them",
			 span, sent > room ? "send" : "read back",
			 sent > room ? sent : back, room, in->max_frame_bytes,
			 advice, room);
		if (x->json) {
			char msg[sizeof(refused) + sizeof(over) + 2];

			snprintf(msg, sizeof(msg), "%s; %s", refused, over);
			json_error(first_big, code, msg);
		}
		fflush(stdout);
		fprintf(stderr, "gpucmd: %s:%u: %s (%s)\ngpucmd: %s\n",
			x->s.label, first_big->line, refused,
			gpucmd_errname(code), over);
		return tool_exit_status(code);
	}
	return 0;
}

/*
 * Before the group's requests: create its named regions (and fill them),
 * give each large transfer a range of a fresh scratch region (or, where
 * the service has no room for one, the frame), read the file: operands
 * left for now into where they go, and drop the region lines, which leave
 * no op.  0 or the exit status.
 */
static int group_regions(struct exec *x, struct group *g)
{
	uint64_t limit = inline_limit(x), total = 0;
	const struct op *first_big = NULL;
	size_t keep = 0;
	void *p;
	int r;

	for (size_t i = 0; i < g->n; i++) {
		struct op *op = &g->ops[i];

		if (op->kind != OP_REGION)
			continue;
		r = gpucmd_region_create(x->conn, op->id, op->len, &p);
		if (r < 0) {
			char label[160], why[640];

			snprintf(label, sizeof(label), "region %s", op->name);
			region_reason(x, op->id, label, why, sizeof(why));
			return region_failed(x, op, "cannot create the region",
					     why, r);
		}
		if (op->src != NULL) {
			r = op_load(x, op, p);
			if (r != 0)
				return r;
		} else if (op->data_len > 0) {
			memcpy(p, op->data, op->data_len);
		}
	}
	for (size_t i = 0; i < g->n; i++) {
		struct op *op = &g->ops[i];
		uint64_t n = op_bytes(op), end;

		/*
		 * A read longer than any file: operand is left to the daemon
		 * to refuse rather than backed by a region that large.
		 */
		if (op->via != VIA_INLINE || n <= limit || n > EXEC_MAX_FILE ||
		    __builtin_add_overflow(total, n, &end) ||
		    end > (uint64_t)INT64_MAX - EXEC_SCRATCH_ALIGN)
			continue;
		op->via = VIA_SCRATCH;
		op->roff = total;
		op->rlen = n;
		total = (end + EXEC_SCRATCH_ALIGN - 1) / EXEC_SCRATCH_ALIGN *
			EXEC_SCRATCH_ALIGN;
		if (first_big == NULL)
			first_big = op;
	}
	if (first_big != NULL) {
		char why[640];

		x->scratch_id = EXEC_SCRATCH_ID + x->groups;
		r = gpucmd_region_create(x->conn, x->scratch_id, total, &p);
		if (r == GPUCMD_EQUOTA || r == GPUCMD_ELIMIT ||
		    r == GPUCMD_ENOMEM) {
			r = scratch_refused(x, g, total, first_big, r);
			if (r != 0)
				return r;
		} else if (r < 0) {
			scratch_reason(x, why, sizeof(why));
			x->scratch_id = 0;
			return region_failed(x, first_big,
					     "cannot create "
					     "exec's scratch region for large "
					     "transfers",
					     why, r);
		} else {
			x->scratch = p;
		}
	}
	/* The bytes go where they travel; nothing is dropped yet. */
	for (size_t i = 0; i < g->n; i++) {
		struct op *op = &g->ops[i];

		r = 0;
		if (op->via == VIA_SCRATCH) {
			op->region = x->scratch_id;
			if (op->src != NULL)
				r = op_load(x, op, x->scratch + op->roff);
			else if (op->data != NULL)
				memcpy(x->scratch + op->roff, op->data,
				       op->data_len);
			/* The region has the bytes now. */
			free(op->data);
			op->data = NULL;
		} else if (op->src != NULL && op->data == NULL &&
			   op->kind != OP_REGION) {
			r = op_load_heap(x, op);
		}
		if (r != 0)
			return r;
	}
	for (size_t i = 0; i < g->n; i++) {
		struct op *op = &g->ops[i];

		if (op->kind == OP_REGION) {
			op_clear(op);
			continue;
		}
		g->ops[keep++] = *op;
	}
	g->n = keep;
	return 0;
}

/* Release the group's scratch region; 0 or the exit status. */
static int scratch_release(struct exec *x)
{
	int r;

	if (x->scratch_id == 0)
		return 0;
	r = gpucmd_region_release(x->conn, x->scratch_id);
	x->scratch_id = 0;
	x->scratch = NULL;
	return r < 0 ? tool_fail("releasing exec's scratch region", r) : 0;
}

static int run_group(struct exec *x, struct group *g)
{
	struct request *req = NULL;
	size_t nreq = 0;
	int status, rel;

	status = x->conn != NULL ? 0 :
				   tool_connect(x->opts, x->service, &x->conn);
	if (status == 0)
		status = group_regions(x, g);
	x->groups++;
	if (status == 0 && g->n > 0) {
		req = calloc(g->n, sizeof(*req));
		if (req == NULL) {
			fprintf(stderr, "gpucmd: out of memory\n");
			status = TOOL_EXIT_FAIL;
		}
	}
	for (size_t i = 0; req != NULL && i < g->n; i++) {
		if (nreq == 0 ||
		    g->ops[i].stream != g->ops[req[nreq - 1].first].stream)
			req[nreq++].first = i;
		req[nreq - 1].n++;
	}
	if (status == 0)
		status = build_requests(x, g, req, nreq);
	if (status == 0) {
		send_requests(x, g, req, nreq);
		for (size_t k = 0; k < nreq; k++) {
			int r = req[k].err != 0 ?
					unanswered(x, g, &req[k], req[k].err) :
					print_request(x, g, &req[k]);

			if (status == TOOL_EXIT_OK)
				status = r;
			/* Past a lost connection every request fails alike. */
			if (req[k].err != 0 && req[k].err != GPUCMD_ELIMIT)
				break;
		}
	}
	for (size_t k = 0; k < nreq; k++) {
		gpucmd_batch_free(req[k].batch);
		gpucmd_response_free(req[k].resp);
	}
	free(req);
	/* A connection that died already took the region with it. */
	rel = x->conn != NULL && status != TOOL_EXIT_UNAVAILABLE ?
		      scratch_release(x) :
		      0;
	if (status == TOOL_EXIT_OK)
		status = rel;
	x->scratch_id = 0;
	x->scratch = NULL;
	fflush(stdout);
	return status;
}

int cmd_exec(const struct tool_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "service", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct exec x = { .opts = o, .service = o->service };
	struct group g = { 0 };
	const char *path = "-";
	int c, status = TOOL_EXIT_OK;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'S':
			x.service = optarg;
			break;
		case 'j':
			x.json = 1;
			break;
		case 'h':
			return tool_usage(argv[0], exec_usage, TOOL_EXIT_OK,
					  NULL);
		default:
			return tool_usage(argv[0], exec_usage, TOOL_EXIT_USAGE,
					  NULL);
		}
	}
	if (argc - optind > 1)
		return tool_usage(argv[0], exec_usage, TOOL_EXIT_USAGE,
				  "more than one script given");
	if (optind < argc)
		path = argv[optind];
	if (strcmp(path, "-") == 0) {
		x.s.in = stdin;
		x.s.label = "<stdin>";
	} else {
		x.s.in = fopen(path, "re");
		x.s.label = path;
		if (x.s.in == NULL) {
			fprintf(stderr, "gpucmd: cannot open script '%s': %s\n",
				path, strerror(errno));
			return TOOL_EXIT_USAGE;
		}
	}

	while (status == TOOL_EXIT_OK && !x.s.eof) {
		if (parse_group(&x.s, &g) < 0)
			status = TOOL_EXIT_USAGE;
		else if (g.n > 0)
			status = run_group(&x, &g);
		group_clear(&g);
	}

	if (x.s.in != stdin)
		fclose(x.s.in);
	for (int k = 0; k < NAME_KINDS; k++) {
		for (size_t i = 0; i < x.s.names[k].n; i++)
			free(x.s.names[k].v[i].name);
		free(x.s.names[k].v);
	}
	free(x.s.buf);
	free(x.s.text);
	free(g.ops);
	gpucmd_close(x.conn);
	return status;
}
