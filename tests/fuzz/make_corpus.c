/*
 * make_corpus.c - write the seed corpora of the fuzz harnesses:
 *
 *   DIR/fuzz_frame/    valid frames of every message kind (one and two per
 *                      file), each behind the harness's limit byte
 *   DIR/fuzz_dispatch/ raw-mode inputs (first byte 0x10): length-prefixed
 *                      Requests that use every op the daemon knows; a
 *                      buffer shared by one connection and imported by
 *                      the other, in raw and interpreter mode
 *   DIR/fuzz_config/   config files: the example file's sections, every
 *                      key, services with uids and quotas
 *
 *   make fuzz-corpus      (runs build/fuzz/make_corpus tests/fuzz/corpus)
 *
 * The files are small on purpose: libFuzzer mutates from them.  The
 * dispatch corpus also holds inputs libFuzzer found (merged with -merge=1),
 * which this program leaves alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frame.h"
#include "gpucmd.h"

static const char *root;

static void put(const char *dir, const char *name, const void *a, size_t alen,
		const void *b, size_t blen)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, dir);
	if (mkdir(path, 0755) != 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", root, dir, name);
	f = fopen(path, "wb");
	if (f == NULL || fwrite(a, 1, alen, f) != alen ||
	    (blen && fwrite(b, 1, blen, f) != blen) || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* ---- frames ---------------------------------------------------------------- */

static void frame_file(const char *name, const Gpucmd__Frame *f)
{
	uint8_t limit = 4; /* the harness's FRAME_DEFAULT_MAX_BODY */
	uint8_t *buf, *two;
	size_t len;

	if (frame_encode(f, &buf, &len) != 0)
		exit(1);
	put("fuzz_frame", name, &limit, 1, buf, len);
	/* The same frame twice: the stream-of-frames path. */
	two = malloc(2 * len);
	if (two == NULL)
		exit(1);
	memcpy(two, buf, len);
	memcpy(two + len, buf, len);
	{
		char name2[128];

		snprintf(name2, sizeof(name2), "%s-twice", name);
		put("fuzz_frame", name2, &limit, 1, two, 2 * len);
	}
	free(two);
	free(buf);
}

/* A request with one op of every kind, filled in plausibly. */
static Gpucmd__Request *every_op(void)
{
	static Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	static Gpucmd__Op ops[40];
	static Gpucmd__Op *ptrs[40];
	static Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	static Gpucmd__OpCreateWithData create =
		GPUCMD__OP_CREATE_WITH_DATA__INIT;
	static Gpucmd__OpWrite write = GPUCMD__OP_WRITE__INIT;
	static Gpucmd__OpRead read = GPUCMD__OP_READ__INIT;
	static Gpucmd__OpRelease release = GPUCMD__OP_RELEASE__INIT;
	static Gpucmd__OpKernel kernel = GPUCMD__OP_KERNEL__INIT;
	static Gpucmd__KernelArg args[3] = {
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
	};
	static Gpucmd__KernelArg *argp[3] = { &args[0], &args[1], &args[2] };
	/* copy(h1, buffer_in h2, 64): a kernel reading a shared buffer */
	static Gpucmd__OpKernel copy = GPUCMD__OP_KERNEL__INIT;
	static Gpucmd__KernelArg cargs[3] = {
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
	};
	static Gpucmd__KernelArg *cargp[3] = { &cargs[0], &cargs[1],
					       &cargs[2] };
	static Gpucmd__OpShare share = GPUCMD__OP_SHARE__INIT;
	static Gpucmd__OpImport import = GPUCMD__OP_IMPORT__INIT;
	static uint32_t grid[1] = { 4 }, block[1] = { 64 };
	static Gpucmd__CopyLayout layout = GPUCMD__COPY_LAYOUT__INIT;
	static uint64_t shape[2] = { 2, 4 }, strides[2] = { 8, 1 };
	static Gpucmd__OpSync sync = GPUCMD__OP_SYNC__INIT;
	static Gpucmd__OpMemoryUsage usage = GPUCMD__OP_MEMORY_USAGE__INIT;
	static Gpucmd__OpPing ping = GPUCMD__OP_PING__INIT;
	static Gpucmd__OpMemoryReport report = GPUCMD__OP_MEMORY_REPORT__INIT;
	static Gpucmd__OpStatus status = GPUCMD__OP_STATUS__INIT;
	static Gpucmd__OpReserve reserve = GPUCMD__OP_RESERVE__INIT;
	static Gpucmd__OpBind bind = GPUCMD__OP_BIND__INIT;
	static Gpucmd__OpCursor cursor = GPUCMD__OP_CURSOR__INIT;
	static Gpucmd__OpStreamReport sreport = GPUCMD__OP_STREAM_REPORT__INIT;
	static Gpucmd__OpMemoryCleanup mclean = GPUCMD__OP_MEMORY_CLEANUP__INIT;
	static Gpucmd__OpFlushDrops flush = GPUCMD__OP_FLUSH_DROPS__INIT;
	static Gpucmd__OpAllocationMode mode = GPUCMD__OP_ALLOCATION_MODE__INIT;
	static Gpucmd__OpInstallPools pools = GPUCMD__OP_INSTALL_POOLS__INIT;
	static Gpucmd__MemoryLayout mlayout = GPUCMD__MEMORY_LAYOUT__INIT;
	static Gpucmd__OpReserveCpu cpu = GPUCMD__OP_RESERVE_CPU__INIT;
	static Gpucmd__OpProfileBegin pbegin = GPUCMD__OP_PROFILE_BEGIN__INIT;
	static Gpucmd__OpProfileEnd pend = GPUCMD__OP_PROFILE_END__INIT;
	static Gpucmd__OpCaptureBegin cbegin = GPUCMD__OP_CAPTURE_BEGIN__INIT;
	static Gpucmd__OpCaptureEnd cend = GPUCMD__OP_CAPTURE_END__INIT;
	static Gpucmd__OpGraphLaunch glaunch = GPUCMD__OP_GRAPH_LAUNCH__INIT;
	static Gpucmd__OpGraphDestroy gdestroy = GPUCMD__OP_GRAPH_DESTROY__INIT;
	static Gpucmd__OpCleanup cleanup = GPUCMD__OP_CLEANUP__INIT;
	static Gpucmd__OpRegionAttach attach = GPUCMD__OP_REGION_ATTACH__INIT;
	static Gpucmd__OpRegionRelease rrelease =
		GPUCMD__OP_REGION_RELEASE__INIT;
	static uint8_t bytes[64];
	size_t n = 0;

	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (uint8_t)i;
#define OP(kase, field, msg)               \
	do {                               \
		gpucmd__op__init(&ops[n]); \
		ops[n].op_case = kase;     \
		ops[n].field = &msg;       \
		ptrs[n] = &ops[n];         \
		n++;                       \
	} while (0)
	empty.handle = 1;
	empty.size = 256;
	OP(GPUCMD__OP__OP_EMPTY, empty, empty);
	create.handle = 2;
	create.data.data = bytes;
	create.data.len = sizeof(bytes);
	OP(GPUCMD__OP__OP_CREATE_WITH_DATA, create_with_data, create);
	layout.n_shape = 2;
	layout.shape = shape;
	layout.n_strides = 2;
	layout.strides = strides;
	layout.elem_size = 4;
	write.handle = 1;
	write.offset = 0;
	write.data.data = bytes;
	write.data.len = 32;
	write.layout = &layout;
	OP(GPUCMD__OP__OP_WRITE, write, write);
	args[0].value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
	args[0].buffer = 1;
	args[1].value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	args[1].u32 = 7;
	args[2].value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	args[2].u32 = 16;
	kernel.name = "fill_u32";
	kernel.n_grid = 1;
	kernel.grid = grid;
	kernel.n_block = 1;
	kernel.block = block;
	kernel.n_args = 3;
	kernel.args = argp;
	OP(GPUCMD__OP__OP_KERNEL, kernel, kernel);
	read.handle = 1;
	read.length = 64;
	OP(GPUCMD__OP__OP_READ, read, read);
	OP(GPUCMD__OP__OP_SYNC, sync, sync);
	/* h2 shared and read through buffer_in (imported as h4 below). */
	share.handle = 2;
	share.name = "seed/w";
	OP(GPUCMD__OP__OP_SHARE, share, share);
	cargs[0].value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
	cargs[0].buffer = 1;
	cargs[1].value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
	cargs[1].buffer_in = 2;
	cargs[2].value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
	cargs[2].u64 = sizeof(bytes);
	copy.name = "copy";
	copy.n_grid = 1;
	copy.grid = grid;
	copy.n_block = 1;
	copy.block = block;
	copy.n_args = 3;
	copy.args = cargp;
	OP(GPUCMD__OP__OP_KERNEL, kernel, copy);
	OP(GPUCMD__OP__OP_MEMORY_USAGE, memory_usage, usage);
	OP(GPUCMD__OP__OP_PING, ping, ping);
	OP(GPUCMD__OP__OP_MEMORY_REPORT, memory_report, report);
	OP(GPUCMD__OP__OP_STATUS, status, status);
	reserve.reservation = 3;
	reserve.size = 4096;
	OP(GPUCMD__OP__OP_RESERVE, reserve, reserve);
	bind.reservation = 3;
	bind.handle = 3;
	OP(GPUCMD__OP__OP_BIND, bind, bind);
	OP(GPUCMD__OP__OP_CURSOR, cursor, cursor);
	OP(GPUCMD__OP__OP_STREAM_REPORT, stream_report, sreport);
	OP(GPUCMD__OP__OP_MEMORY_CLEANUP, memory_cleanup, mclean);
	OP(GPUCMD__OP__OP_FLUSH_DROPS, flush_drops, flush);
	mode.mode = GPUCMD__ALLOCATION_MODE__PERSISTENT;
	OP(GPUCMD__OP__OP_ALLOCATION_MODE, allocation_mode, mode);
	mlayout.preset = "exclusive";
	pools.layout = &mlayout;
	OP(GPUCMD__OP__OP_INSTALL_POOLS, install_pools, pools);
	cpu.size = 4096;
	OP(GPUCMD__OP__OP_RESERVE_CPU, reserve_cpu, cpu);
	pbegin.profile = 1;
	OP(GPUCMD__OP__OP_PROFILE_BEGIN, profile_begin, pbegin);
	pend.profile = 1;
	OP(GPUCMD__OP__OP_PROFILE_END, profile_end, pend);
	OP(GPUCMD__OP__OP_CAPTURE_BEGIN, capture_begin, cbegin);
	cend.graph = 1;
	OP(GPUCMD__OP__OP_CAPTURE_END, capture_end, cend);
	glaunch.graph = 1;
	OP(GPUCMD__OP__OP_GRAPH_LAUNCH, graph_launch, glaunch);
	gdestroy.graph = 1;
	OP(GPUCMD__OP__OP_GRAPH_DESTROY, graph_destroy, gdestroy);
	cleanup.service = "";
	OP(GPUCMD__OP__OP_CLEANUP, cleanup, cleanup);
	attach.region = 1;
	attach.size = 4096;
	OP(GPUCMD__OP__OP_REGION_ATTACH, region_attach, attach);
	rrelease.region = 1;
	OP(GPUCMD__OP__OP_REGION_RELEASE, region_release, rrelease);
	/* Last but one: in the same batch as the share it may find the
	 * copy still to run (GPUCMD_EBUSY), and stop the batch there. */
	import.handle = 4;
	import.name = "seed/w";
	OP(GPUCMD__OP__OP_IMPORT, import, import);
	release.handle = 1;
	OP(GPUCMD__OP__OP_RELEASE, release, release);
#undef OP
	req.id = 7;
	req.stream = 1;
	req.n_ops = n;
	req.ops = ptrs;
	return &req;
}

static void frames(void)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	Gpucmd__Welcome welcome = GPUCMD__WELCOME__INIT;
	Gpucmd__DeviceInfo dev = GPUCMD__DEVICE_INFO__INIT;
	Gpucmd__Limits lim = GPUCMD__LIMITS__INIT;
	Gpucmd__Error err = GPUCMD__ERROR__INIT;
	Gpucmd__Response resp = GPUCMD__RESPONSE__INIT;
	Gpucmd__OpResult res = GPUCMD__OP_RESULT__INIT;
	Gpucmd__OpResult *resp_results[1] = { &res };
	static uint8_t data[16] = "0123456789abcdef";

	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = "batch";
	hello.client_name = "make_corpus";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	frame_file("hello", &f);

	dev.name = "host";
	dev.backend = "host";
	dev.total_memory = 1u << 30;
	welcome.protocol_version = GPUCMD_PROTOCOL_VERSION;
	welcome.service_id = 1;
	welcome.service = "batch";
	welcome.device = &dev;
	lim.max_streams = 16;
	welcome.limits = &lim;
	f.msg_case = GPUCMD__FRAME__MSG_WELCOME;
	f.welcome = &welcome;
	frame_file("welcome", &f);

	err.code = GPUCMD_EPROTO;
	err.message = "bad frame";
	f.msg_case = GPUCMD__FRAME__MSG_ERROR;
	f.error = &err;
	frame_file("error", &f);

	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = every_op();
	frame_file("request-every-op", &f);

	res.result_case = GPUCMD__OP_RESULT__RESULT_DATA;
	res.data.data = data;
	res.data.len = sizeof(data);
	resp.id = 7;
	resp.n_results = 1;
	resp.results = resp_results;
	resp.error = &err;
	resp.failed_index = 1;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &resp;
	frame_file("response", &f);

	/* A memory report whose service shares a buffer. */
	{
		static Gpucmd__MemoryReport rep = GPUCMD__MEMORY_REPORT__INIT;
		static Gpucmd__ServiceReport svc = GPUCMD__SERVICE_REPORT__INIT;
		static Gpucmd__ServiceReport totals =
			GPUCMD__SERVICE_REPORT__INIT;
		static Gpucmd__SharedBuffer sb = GPUCMD__SHARED_BUFFER__INIT;
		static Gpucmd__ServiceReport *svcs[1] = { &svc };
		static Gpucmd__SharedBuffer *sbs[1] = { &sb };

		sb.name = "model/weights";
		sb.bytes = 1u << 20;
		sb.handles = 3;
		sb.connection_id = 4;
		sb.imports = 2;
		sb.ready = 1;
		sb.sharer_open = 1;
		svc.name = "inference";
		svc.id = 1;
		svc.connections = 3;
		svc.shared_buffers = 1;
		svc.shared_buffer_bytes = 1u << 20;
		svc.n_shared = 1;
		svc.shared = sbs;
		totals.name = "";
		totals.shared_buffers = 1;
		totals.shared_buffer_bytes = 1u << 20;
		rep.n_services = 1;
		rep.services = svcs;
		rep.totals = &totals;
		res.result_case = GPUCMD__OP_RESULT__RESULT_REPORT;
		res.report = &rep;
		resp.error = NULL;
		resp.failed_index = 0;
		frame_file("response-report-shared", &f);
	}
}

/* ---- dispatch (raw mode) ----------------------------------------------------- */

/* One raw-mode chunk: header byte (conn, wait), u16 length, Request. */
static size_t chunk(uint8_t *out, uint8_t hdr, const Gpucmd__Request *req)
{
	size_t len = gpucmd__request__get_packed_size(req);

	out[0] = hdr;
	out[1] = (uint8_t)len;
	out[2] = (uint8_t)(len >> 8);
	gpucmd__request__pack(req, out + 3);
	return 3 + len;
}

/* Raw mode, one service: the share, import and uses of ops-share-import. */
static void raw_share_import(void)
{
	static uint8_t buf[4096], bytes[64];
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Op ops[8], *ptrs[8];
	Gpucmd__OpCreateWithData create = GPUCMD__OP_CREATE_WITH_DATA__INIT;
	Gpucmd__OpShare share = GPUCMD__OP_SHARE__INIT;
	Gpucmd__OpImport import = GPUCMD__OP_IMPORT__INIT;
	Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpKernel copy = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__KernelArg args[3] = {
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
		GPUCMD__KERNEL_ARG__INIT,
	};
	Gpucmd__KernelArg *argp[3] = { &args[0], &args[1], &args[2] };
	Gpucmd__OpRead read3 = GPUCMD__OP_READ__INIT;
	Gpucmd__OpRead read2 = GPUCMD__OP_READ__INIT;
	Gpucmd__OpWrite write = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRelease release1 = GPUCMD__OP_RELEASE__INIT;
	Gpucmd__OpRelease release2 = GPUCMD__OP_RELEASE__INIT;
	Gpucmd__OpSync sync = GPUCMD__OP_SYNC__INIT;
	size_t len = 1, n;

	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (uint8_t)(i * 3 + 1);
	req.ops = ptrs;
#define OP(kase, field, msg)               \
	do {                               \
		gpucmd__op__init(&ops[n]); \
		ops[n].op_case = kase;     \
		ops[n].field = &msg;       \
		ptrs[n] = &ops[n];         \
		n++;                       \
	} while (0)
	/* conn 0: create h1, share it as "w", sync */
	n = 0;
	create.handle = 1;
	create.data.data = bytes;
	create.data.len = sizeof(bytes);
	OP(GPUCMD__OP__OP_CREATE_WITH_DATA, create_with_data, create);
	share.handle = 1;
	share.name = "w";
	OP(GPUCMD__OP__OP_SHARE, share, share);
	OP(GPUCMD__OP__OP_SYNC, sync, sync);
	req.id = 1;
	req.n_ops = n;
	len += chunk(buf + len, 2, &req);
	/* conn 1: import it as h2, copy it into h3 through buffer_in, read
	 * both, and write h2 (refused: read-only) */
	n = 0;
	import.handle = 2;
	import.name = "w";
	OP(GPUCMD__OP__OP_IMPORT, import, import);
	empty.handle = 3;
	empty.size = sizeof(bytes);
	OP(GPUCMD__OP__OP_EMPTY, empty, empty);
	args[0].value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
	args[0].buffer = 3;
	args[1].value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
	args[1].buffer_in = 2;
	args[2].value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
	args[2].u64 = sizeof(bytes);
	copy.name = "copy";
	copy.n_args = 3;
	copy.args = argp;
	OP(GPUCMD__OP__OP_KERNEL, kernel, copy);
	read3.handle = 3;
	read3.length = sizeof(bytes);
	OP(GPUCMD__OP__OP_READ, read, read3);
	read2.handle = 2;
	read2.length = sizeof(bytes);
	OP(GPUCMD__OP__OP_READ, read, read2);
	write.handle = 2;
	write.data.data = bytes;
	write.data.len = 8;
	OP(GPUCMD__OP__OP_WRITE, write, write);
	req.id = 2;
	req.n_ops = n;
	len += chunk(buf + len, 3, &req);
	/* conn 0: release h1; conn 1: h2 still reads, then goes */
	n = 0;
	release1.handle = 1;
	OP(GPUCMD__OP__OP_RELEASE, release, release1);
	OP(GPUCMD__OP__OP_SYNC, sync, sync);
	req.id = 3;
	req.n_ops = n;
	len += chunk(buf + len, 2, &req);
	n = 0;
	OP(GPUCMD__OP__OP_READ, read, read2);
	release2.handle = 2;
	OP(GPUCMD__OP__OP_RELEASE, release, release2);
	OP(GPUCMD__OP__OP_SYNC, sync, sync);
	req.id = 4;
	req.n_ops = n;
	len += chunk(buf + len, 3, &req);
#undef OP
	buf[0] = 0x50; /* raw mode, one service */
	put("fuzz_dispatch", "raw-share-import", buf, len, NULL, 0);
}

static void dispatch(void)
{
	Gpucmd__Request *all = every_op();
	Gpucmd__Request one = GPUCMD__REQUEST__INIT;
	static uint8_t buf[1 << 16];
	uint8_t flags = 0x10; /* raw mode, subslices, no quota */
	size_t len;

	/* Every op in one batch, then each op alone on streams 0-3. */
	buf[0] = flags;
	len = 1 + chunk(buf + 1, 2, all);
	put("fuzz_dispatch", "raw-every-op", buf, len, NULL, 0);
	buf[0] = flags | 1; /* exclusive pages */
	put("fuzz_dispatch", "raw-every-op-exclusive", buf, len, NULL, 0);
	len = 1;
	for (size_t i = 0; i < all->n_ops; i++) {
		one.id = i + 1;
		one.stream = (uint32_t)(i % 4);
		one.n_ops = 1;
		one.ops = &all->ops[i];
		len += chunk(buf + len, (uint8_t)((i & 1) | 2), &one);
	}
	buf[0] = flags;
	put("fuzz_dispatch", "raw-each-op", buf, len, NULL, 0);

	/* Interpreter mode: create, read back, fault, sync on stream 0. */
	{
		static const uint8_t prog[] = {
			0x00,			 /* flags */
			1,    0, 10, 0x41,	 /* create h1, 64 bytes */
			3,    0, 5,  0,	   0x10, /* read h1 */
			5,    7, 0,		 /* kernel fault() */
			6,			 /* sync */
			13,			 /* end of batch */
			0x06, /* next: conn 0, wait, stream 1 */
			3,    0, 5,  0,	   0x10, /* read h1 on stream 1 */
			4,    0,		 /* release h1 */
		};
		put("fuzz_dispatch", "ops-create-fault-sync", prog,
		    sizeof(prog), NULL, 0);
	}

	/*
	 * Interpreter mode, both connections in one service (flag 0x40):
	 * conn 0 shares h1 as "w", conn 1 imports it as h2, copies it through
	 * buffer_in, reads it, and is refused a write into it; conn 0
	 * releases h1, and conn 1 reads h2 still.
	 */
	{
		/* clang-format off */
		static const uint8_t prog[] = {
			0x40,			/* flags: one service */
			1, 0, 10, 0x41,		/* create h1, 64 bytes */
			38, 0, 0,		/* share h1 as "w" */
			6,			/* sync */
			13,			/* end of batch */
			0x02,			/* conn 0, wait, stream 0 */
			6, 13,			/* sync */
			0x03,			/* conn 1, wait, stream 0 */
			39, 1, 0,		/* import h2 "w" */
			37, 2, 4,		/* empty h3, 64 bytes */
			5, 1, 0,		/* kernel copy, plain flags */
			0, 2,			/* out: buffer h3 */
			0x40, 1,		/* in: buffer_in h2 */
			0, 1,			/* bytes: h3's size */
			3, 2, 0, 0, 1,		/* read h3 */
			3, 1, 0, 0, 5, 16,	/* read 16 bytes of h2 */
			2, 1, 0, 0, 5, 8, 0x11,	/* write h2: refused */
			13,			/* end of batch */
			0x02,			/* conn 0, wait, stream 0 */
			4, 0,			/* release h1 */
			6, 13,			/* sync */
			0x03,			/* conn 1, wait, stream 0 */
			3, 1, 0, 0, 5, 16,	/* read h2 */
			4, 1,			/* release h2 */
			6,			/* sync */
		};
		/* clang-format on */
		put("fuzz_dispatch", "ops-share-import", prog, sizeof(prog),
		    NULL, 0);
	}
	raw_share_import();
}

/* ---- config ---------------------------------------------------------------- */

static void config(const char *name, const char *text)
{
	uint8_t mode = 0;

	put("fuzz_config", name, &mode, 1, text, strlen(text));
}

static void configs(void)
{
	config("empty", "");
	config("daemon", "; the daemon\n"
			 "[daemon]\n"
			 "socket = /run/gpucmd/gpucmd.sock\n"
			 "socket_mode = 0660\n"
			 "socket_group = gpucmd\n"
			 "admin_group = gpucmd-admin\n"
			 "backend = auto\n"
			 "device = 0\n"
			 "host_memory = 4G\n"
			 "log_level = info\n"
			 "layout = subslices\n");
	config("limits", "[limits]\n"
			 "max_connections = 256\n"
			 "max_frame_bytes = 64M\n"
			 "max_ops_per_batch = 65536\n"
			 "max_in_flight = 1024\n"
			 "max_handles = 1048576\n"
			 "max_streams = 16\n"
			 "max_pending_bytes = 256MiB\n");
	config("services", "[services]\n"
			   "unknown = refuse\n"
			   "default_memory_limit = 1G\n"
			   "default_max_streams = 4\n"
			   "default_weight = 2\n"
			   "\n"
			   "[service batch]\n"
			   "memory_limit = 8G\n"
			   "max_streams = 8\n"
			   "weight = 10\n"
			   "uids = 0, root\n"
			   "gids = 0\n"
			   "\n"
			   "[service \"inference\"]\n"
			   "memory_limit = 512M\n");
	config("bad-key", "[limits]\nmax_streams = 65\n");
	config("bad-section", "[nope]\nx = 1\n");
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make_corpus DIR\n");
		return 2;
	}
	root = argv[1];
	if (mkdir(root, 0755) != 0 && errno != EEXIST) {
		perror(root);
		return 1;
	}
	frames();
	dispatch();
	configs();
	return 0;
}
