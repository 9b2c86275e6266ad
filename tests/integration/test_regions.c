/*
 * test_regions.c - shared regions at the wire level: a memfd passed with
 * SCM_RIGHTS, writes from it and reads into it, bounds, seals, releases
 * with copies in flight, and a client that dies with regions mapped; and
 * the service's region_limit (gpucmdd.conf(5)): attaches up to it, the
 * next one refused with GPUCMD_EQUOTA and the numbers, bytes given back by
 * a release once its fences passed and by a client that dies, the memory
 * report (library and gpucmd memory-report), the Welcome and gpucmd status
 * that tell a connection its limit, and a SIGHUP that changes it.
 *
 * This speaks the protocol directly (frame.h + the generated protobuf code)
 * so it checks the daemon independently of the client library.
 */
#include <stdbool.h>
#include <sys/mman.h>

#include "frame.h"
#include "harness.h"

struct raw {
	int fd;
	uint64_t next_id;
	uint64_t region_limit; /* what the Welcome's Limits said */
};

static void raw_send(struct raw *c, const Gpucmd__Frame *f, const int *fds,
		     int nfds)
{
	uint8_t *buf;
	size_t len;

	ck_assert_int_eq(frame_encode(f, &buf, &len), 0);
	ck_assert_int_eq(harness_send_fds(c->fd, buf, len, fds, nfds),
			 (ssize_t)len);
	free(buf);
}

static void read_exact(int fd, void *buf, size_t len)
{
	size_t have = 0;

	while (have < len) {
		ssize_t n = recv(fd, (char *)buf + have, len - have, 0);
		ck_assert_msg(n > 0, "connection closed while reading");
		have += (size_t)n;
	}
}

static Gpucmd__Frame *raw_recv(struct raw *c)
{
	uint8_t hdr[FRAME_HEADER_SIZE];
	struct frame_header h;
	uint8_t *body;
	Gpucmd__Frame *f;

	read_exact(c->fd, hdr, sizeof(hdr));
	frame_header_unpack(hdr, &h);
	ck_assert_int_eq(frame_header_check(&h, FRAME_MAX_BODY, NULL, 0), 0);
	body = malloc(h.length + 1);
	read_exact(c->fd, body, h.length);
	f = frame_decode(body, h.length);
	free(body);
	ck_assert_ptr_nonnull(f);
	return f;
}

static struct raw raw_open_as(const char *service)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *w;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	struct raw c = { .next_id = 1 };
	struct timeval tv = { .tv_sec = 20 };

	c.fd = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", the_daemon.sock);
	ck_assert_int_eq(connect(c.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = (char *)service;
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	raw_send(&c, &f, NULL, 0);
	w = raw_recv(&c);
	ck_assert_int_eq(w->msg_case, GPUCMD__FRAME__MSG_WELCOME);
	ck_assert_ptr_nonnull(w->welcome->limits);
	c.region_limit = w->welcome->limits->region_limit;
	frame_free(w);
	return c;
}

static struct raw raw_open(void)
{
	return raw_open_as("regions");
}

/* Send ops as one request on stream (with fds); its response frame. */
static Gpucmd__Frame *run_ops_on(struct raw *c, uint32_t stream,
				 Gpucmd__Op **ops, size_t n, const int *fds,
				 int nfds)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *r;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;

	req.id = c->next_id++;
	req.stream = stream;
	req.n_ops = n;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	raw_send(c, &f, fds, nfds);
	r = raw_recv(c);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
	ck_assert_uint_eq(r->response->id, req.id);
	return r;
}

/* Send ops as one request on stream 0 (with fds). */
static Gpucmd__Frame *run_ops(struct raw *c, Gpucmd__Op **ops, size_t n,
			      const int *fds, int nfds)
{
	return run_ops_on(c, 0, ops, n, fds, nfds);
}

static int sealed_memfd(size_t size, bool seal)
{
	int fd = memfd_create("gpucmd-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	if (seal)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

static Gpucmd__Op *attach(uint64_t region, uint64_t size)
{
	static Gpucmd__OpRegionAttach a[16];
	static Gpucmd__Op o[16];
	static int n;
	int k = n++ % 16;

	gpucmd__op_region_attach__init(&a[k]);
	a[k].region = region;
	a[k].size = size;
	gpucmd__op__init(&o[k]);
	o[k].op_case = GPUCMD__OP__OP_REGION_ATTACH;
	o[k].region_attach = &a[k];
	return &o[k];
}

/*
 * The two ops most region tests start with: an OpEmpty of size bytes as
 * handle, then an OpWrite into it at offset of length bytes from region at
 * region_offset (the arguments of gpucmd_batch_write_region).  The
 * messages live in the caller's struct, which must outlive the request.
 */
struct empty_write {
	Gpucmd__OpEmpty empty;
	Gpucmd__RegionRef src;
	Gpucmd__OpWrite write;
	Gpucmd__Op o_empty, o_write;
};

static void empty_write(struct empty_write *ew, uint64_t handle, uint64_t size,
			uint64_t offset, uint64_t region,
			uint64_t region_offset, uint64_t length)
{
	gpucmd__op_empty__init(&ew->empty);
	ew->empty.handle = handle;
	ew->empty.size = size;
	gpucmd__op__init(&ew->o_empty);
	ew->o_empty.op_case = GPUCMD__OP__OP_EMPTY;
	ew->o_empty.empty = &ew->empty;
	gpucmd__region_ref__init(&ew->src);
	ew->src.region = region;
	ew->src.offset = region_offset;
	ew->src.length = length;
	gpucmd__op_write__init(&ew->write);
	ew->write.handle = handle;
	ew->write.offset = offset;
	ew->write.region = &ew->src;
	gpucmd__op__init(&ew->o_write);
	ew->o_write.op_case = GPUCMD__OP__OP_WRITE;
	ew->o_write.write = &ew->write;
}

/*
 * The built-in spin kernel for usec, grid and block 1, as an Op whose
 * messages live in the caller's struct (which must outlive the request).
 */
struct spin_op {
	Gpucmd__OpKernel k;
	Gpucmd__KernelArg a, *args[1];
	uint32_t one[1];
	Gpucmd__Op o;
};

static Gpucmd__Op *spin_op(struct spin_op *sp, uint32_t usec)
{
	gpucmd__kernel_arg__init(&sp->a);
	sp->a.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	sp->a.u32 = usec;
	sp->args[0] = &sp->a;
	sp->one[0] = 1;
	gpucmd__op_kernel__init(&sp->k);
	sp->k.name = "spin";
	sp->k.n_grid = 1;
	sp->k.grid = sp->one;
	sp->k.n_block = 1;
	sp->k.block = sp->one;
	sp->k.n_args = 1;
	sp->k.args = sp->args;
	gpucmd__op__init(&sp->o);
	sp->o.op_case = GPUCMD__OP__OP_KERNEL;
	sp->o.kernel = &sp->k;
	return &sp->o;
}

START_TEST(write_from_and_read_into_a_region)
{
	enum { SIZE = 1 << 20 };
	struct raw c = raw_open();
	int fd = sealed_memfd(SIZE, true);
	uint8_t *map =
		mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct empty_write ew;
	Gpucmd__RegionRef dst = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Op o_r = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[4];
	Gpucmd__Frame *r;

	ck_assert_ptr_ne(map, MAP_FAILED);
	for (size_t i = 0; i < SIZE / 2; i++)
		map[i] = (uint8_t)(i * 7 + 3);
	/* Odd offset and length on both sides. */
	empty_write(&ew, 1, SIZE / 2, 2, 9, 1, SIZE / 2 - 3);
	dst.region = 9;
	dst.offset = SIZE / 2 + 1;
	dst.length = SIZE / 2 - 3;
	rd.handle = 1;
	rd.offset = 2;
	rd.length = SIZE / 2 - 3;
	rd.into = &dst;
	o_r.op_case = GPUCMD__OP__OP_READ;
	o_r.read = &rd;
	ops[0] = attach(9, SIZE);
	ops[1] = &ew.o_empty;
	ops[2] = &ew.o_write;
	ops[3] = &o_r;
	r = run_ops(&c, ops, 4, &fd, 1);
	ck_assert_msg(r->response->error == NULL, "failed: %s",
		      r->response->error ? r->response->error->message : "");
	ck_assert_int_eq(r->response->results[3]->result_case,
			 GPUCMD__OP_RESULT__RESULT_REGION);
	ck_assert_uint_eq(r->response->results[3]->region->offset,
			  SIZE / 2 + 1);
	frame_free(r);
	ck_assert_int_eq(memcmp(map + SIZE / 2 + 1, map + 1, SIZE / 2 - 3), 0);
	munmap(map, SIZE);
	close(fd);
	close(c.fd);
}
END_TEST

START_TEST(region_errors)
{
	struct raw c = raw_open();
	int unsealed = sealed_memfd(4096, false);
	int small = sealed_memfd(4096, true);
	int good = sealed_memfd(8192, true);
	int hugetlb;
	struct empty_write ew;
	Gpucmd__OpRegionRelease rel = GPUCMD__OP_REGION_RELEASE__INIT;
	Gpucmd__Op o_rel = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[3];
	Gpucmd__Frame *r;

	/* Not sealed against shrinking: refused. */
	ops[0] = attach(1, 4096);
	r = run_ops(&c, ops, 1, &unsealed, 1);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(
		strstr(r->response->error->message, "F_SEAL_SHRINK"));
	frame_free(r);
	/*
	 * A hugetlb memfd, sealed: refused before it is mapped (its owner
	 * could punch a hole under the daemon's copies).  Kernels without
	 * hugetlbfs refuse to create one.
	 */
	hugetlb = memfd_create("gpucmd-test",
			       MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
	if (hugetlb >= 0) {
		ck_assert_int_eq(ftruncate(hugetlb, 2 << 20), 0);
		ck_assert_int_eq(fcntl(hugetlb, F_ADD_SEALS, F_SEAL_SHRINK), 0);
		ops[0] = attach(4, 2 << 20);
		r = run_ops(&c, ops, 1, &hugetlb, 1);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
		ck_assert_msg(strstr(r->response->error->message,
				     "not a plain memfd (hugetlb)") != NULL,
			      "hugetlb memfd: %s", r->response->error->message);
		frame_free(r);
		close(hugetlb);
	}
	/* Announced larger than the file: refused. */
	ops[0] = attach(2, 8192);
	r = run_ops(&c, ops, 1, &small, 1);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(r->response->error->message, "4096"));
	frame_free(r);
	/* A good one, then a write range past its end. */
	ops[0] = attach(3, 8192);
	r = run_ops(&c, ops, 1, &good, 1);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
	empty_write(&ew, 5, 100000, 0, 3, 8000, 1000);
	ops[0] = &ew.o_empty;
	ops[1] = &ew.o_write;
	r = run_ops(&c, ops, 2, NULL, 0);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_uint_eq(r->response->failed_index, 1);
	ck_assert_ptr_nonnull(
		strstr(r->response->error->message, "out of bounds"));
	frame_free(r);
	/* Release, then use: not found. */
	rel.region = 3;
	o_rel.op_case = GPUCMD__OP__OP_REGION_RELEASE;
	o_rel.region_release = &rel;
	ew.src.offset = 0;
	ops[0] = &o_rel;
	ops[1] = &ew.o_write;
	r = run_ops(&c, ops, 2, NULL, 0);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ENOTFOUND);
	ck_assert_uint_eq(r->response->failed_index, 1);
	frame_free(r);
	close(unsealed);
	close(small);
	close(good);
	close(c.fd);
}
END_TEST

START_TEST(attach_without_descriptor_closes_connection)
{
	struct raw c = raw_open();
	struct gpucmd_conn *other = connect_as("other");
	Gpucmd__Op *ops[1] = { attach(1, 4096) };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *r;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	struct gpucmd_batch *b;

	req.id = 1;
	req.n_ops = 1;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	raw_send(&c, &f, NULL, 0);
	r = raw_recv(&c);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_ERROR);
	ck_assert_int_eq(r->error->code, GPUCMD_EPROTO);
	frame_free(r);
	close(c.fd);
	gpucmd_batch_new(other, 0, &b);
	gpucmd_batch_ping(b);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(other);
}
END_TEST

/* A client dies with a region mapped and a copy in flight: nothing leaks. */
START_TEST(client_dies_with_region_and_copy_in_flight)
{
	struct gpucmd_conn *obs = connect_as("observer");
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct raw c = raw_open();
		int fd = sealed_memfd(1 << 22, true);
		struct empty_write ew;
		struct spin_op sp;
		Gpucmd__Op *ops[4];
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Request req = GPUCMD__REQUEST__INIT;

		empty_write(&ew, 1, 1 << 22, 0, 1, 0, 1 << 22);
		ops[0] = attach(1, 1 << 22);
		ops[1] = &ew.o_empty;
		ops[2] = spin_op(&sp, 300000);
		ops[3] = &ew.o_write;
		req.id = 1;
		req.n_ops = 4;
		req.ops = ops;
		f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
		f.request = &req;
		raw_send(&c, &f, &fd, 1);
		/* Die while the spin holds the write behind it. */
		usleep(50000);
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	for (int i = 0; i < 1000; i++) {
		struct gpucmd_service_report t = report_totals(obs);
		if (t.bytes_reserved == 0 && t.allocations == 0)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(report_totals(obs).bytes_reserved, 0);
	ck_assert_uint_eq(report_totals(obs).allocations, 0);
	gpucmd_close(obs);
}
END_TEST

/* Modules at the wire level: on the host backend a load is refused clearly. */
START_TEST(load_module_errors)
{
	struct raw c = raw_open();
	const char *backend = getenv("GPUCMD_TEST_BACKEND");
	Gpucmd__OpLoadModule lm = GPUCMD__OP_LOAD_MODULE__INIT;
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__Op o_lm = GPUCMD__OP__INIT, o_k = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1];
	uint32_t one[1] = { 1 };
	Gpucmd__Frame *r;

	lm.module = 4;
	lm.format = "elf";
	lm.data.data = (uint8_t *)"x";
	lm.data.len = 1;
	o_lm.op_case = GPUCMD__OP__OP_LOAD_MODULE;
	o_lm.load_module = &lm;
	ops[0] = &o_lm;
	r = run_ops(&c, ops, 1, NULL, 0);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(
		strstr(r->response->error->message, "ptx, cubin"));
	frame_free(r);
	if (backend == NULL || strcmp(backend, "host") == 0) {
		lm.format = "ptx";
		r = run_ops(&c, ops, 1, NULL, 0);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EUNSUPPORTED);
		ck_assert_ptr_nonnull(
			strstr(r->response->error->message, "host backend"));
		frame_free(r);
	}
	k.name = "f";
	k.module = 77;
	k.n_grid = 1;
	k.grid = one;
	o_k.op_case = GPUCMD__OP__OP_KERNEL;
	o_k.kernel = &k;
	ops[0] = &o_k;
	r = run_ops(&c, ops, 1, NULL, 0);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ENOKERNEL);
	ck_assert_ptr_nonnull(strstr(r->response->error->message, "module 77"));
	frame_free(r);
	close(c.fd);
}
END_TEST

/* A user's PTX (nvcc -ptx -arch=compute_75, .version lowered to 7.0). */
static const char add_one_ptx[] =
	".version 7.0\n"
	".target sm_75\n"
	".address_size 64\n"
	"	// .globl	add_one\n"
	".visible .entry add_one(\n"
	"	.param .u64 add_one_param_0,\n"
	"	.param .u32 add_one_param_1\n"
	")\n"
	"{\n"
	"	.reg .pred 	%p<2>;\n"
	"	.reg .b32 	%r<8>;\n"
	"	.reg .b64 	%rd<5>;\n"
	"	ld.param.u64 	%rd1, [add_one_param_0];\n"
	"	ld.param.u32 	%r2, [add_one_param_1];\n"
	"	mov.u32 	%r3, %ctaid.x;\n"
	"	mov.u32 	%r4, %ntid.x;\n"
	"	mov.u32 	%r5, %tid.x;\n"
	"	mad.lo.s32 	%r1, %r3, %r4, %r5;\n"
	"	setp.ge.u32 	%p1, %r1, %r2;\n"
	"	@%p1 bra 	$L__BB0_2;\n"
	"	cvta.to.global.u64 	%rd2, %rd1;\n"
	"	mul.wide.u32 	%rd3, %r1, 4;\n"
	"	add.s64 	%rd4, %rd2, %rd3;\n"
	"	ld.global.u32 	%r6, [%rd4];\n"
	"	add.s32 	%r7, %r6, 1;\n"
	"	st.global.u32 	[%rd4], %r7;\n"
	"$L__BB0_2:\n"
	"	ret;\n"
	"}\n";

/* On CUDA: a user's PTX module loads, and its kernel runs on a buffer. */
START_TEST(user_ptx_module_on_cuda)
{
	const char *backend = getenv("GPUCMD_TEST_BACKEND");
	struct raw c;
	uint32_t vals[64], one[1] = { 1 }, block[1] = { 64 };
	Gpucmd__OpLoadModule lm = GPUCMD__OP_LOAD_MODULE__INIT;
	Gpucmd__OpCreateWithData cr = GPUCMD__OP_CREATE_WITH_DATA__INIT;
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__KernelArg a0 = GPUCMD__KERNEL_ARG__INIT,
			  a1 = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg *args[2] = { &a0, &a1 };
	Gpucmd__Op o_lm = GPUCMD__OP__INIT, o_cr = GPUCMD__OP__INIT;
	Gpucmd__Op o_k = GPUCMD__OP__INIT, o_rd = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[4] = { &o_lm, &o_cr, &o_k, &o_rd };
	Gpucmd__Frame *r;
	const uint32_t *got;

	if (backend == NULL || strcmp(backend, "cuda") != 0) {
		printf("skipped: needs the CUDA backend\n");
		return;
	}
	c = raw_open();
	for (uint32_t i = 0; i < 64; i++)
		vals[i] = i * 3;
	lm.module = 1;
	lm.format = "ptx";
	lm.data.data = (uint8_t *)add_one_ptx;
	lm.data.len = sizeof(add_one_ptx);
	o_lm.op_case = GPUCMD__OP__OP_LOAD_MODULE;
	o_lm.load_module = &lm;
	cr.handle = 5;
	cr.data.data = (uint8_t *)vals;
	cr.data.len = sizeof(vals);
	o_cr.op_case = GPUCMD__OP__OP_CREATE_WITH_DATA;
	o_cr.create_with_data = &cr;
	a0.value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
	a0.buffer = 5;
	a1.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	a1.u32 = 64;
	k.name = "add_one";
	k.module = 1;
	k.n_grid = 1;
	k.grid = one;
	k.n_block = 1;
	k.block = block;
	k.n_args = 2;
	k.args = args;
	o_k.op_case = GPUCMD__OP__OP_KERNEL;
	o_k.kernel = &k;
	rd.handle = 5;
	rd.length = sizeof(vals);
	o_rd.op_case = GPUCMD__OP__OP_READ;
	o_rd.read = &rd;
	r = run_ops(&c, ops, 4, NULL, 0);
	ck_assert_msg(r->response->error == NULL, "failed at op %u: %s",
		      r->response->failed_index,
		      r->response->error ? r->response->error->message : "");
	ck_assert_uint_eq(r->response->results[3]->data.len, sizeof(vals));
	got = (const uint32_t *)r->response->results[3]->data.data;
	for (uint32_t i = 0; i < 64; i++)
		ck_assert_uint_eq(got[i], i * 3 + 1);
	frame_free(r);
	close(c.fd);
}
END_TEST

/*
 * A load_module whose code comes from a shared region, in a batch of
 * connection-wide ops (which runs on no stream): the daemon reads the
 * bytes there and then, and answers (on the host backend, that it runs no
 * modules), alone in its batch or after the attach, on any stream number.
 */
START_TEST(load_module_from_a_region_in_a_batch_without_a_stream)
{
	enum { SIZE = 4096 };
	const char *backend = getenv("GPUCMD_TEST_BACKEND");
	bool host = backend == NULL || strcmp(backend, "host") == 0;
	struct raw c = raw_open();
	int fd = sealed_memfd(SIZE, true);
	Gpucmd__RegionRef src = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpLoadModule lm = GPUCMD__OP_LOAD_MODULE__INIT;
	Gpucmd__OpStatus st = GPUCMD__OP_STATUS__INIT;
	Gpucmd__Op o_lm = GPUCMD__OP__INIT, o_st = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[2];
	Gpucmd__Frame *r;

	ck_assert_int_eq(pwrite(fd, add_one_ptx, sizeof(add_one_ptx), 0),
			 (ssize_t)sizeof(add_one_ptx));
	src.region = 3;
	src.offset = 0;
	src.length = sizeof(add_one_ptx);
	lm.module = 1;
	lm.format = "ptx";
	lm.region = &src;
	o_lm.op_case = GPUCMD__OP__OP_LOAD_MODULE;
	o_lm.load_module = &lm;
	/* The attach and the load in one batch. */
	ops[0] = attach(3, SIZE);
	ops[1] = &o_lm;
	r = run_ops(&c, ops, 2, &fd, 1);
	if (host) {
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EUNSUPPORTED);
		ck_assert_uint_eq(r->response->failed_index, 1);
	} else {
		ck_assert_msg(r->response->error == NULL, "failed: %s",
			      r->response->error ? r->response->error->message :
						   "");
	}
	frame_free(r);
	/* The load alone, on a number that has no stream. */
	lm.module = 2;
	ops[0] = &o_lm;
	r = run_ops_on(&c, 7, ops, 1, NULL, 0);
	if (host)
		ck_assert_int_eq(r->response->error->code, GPUCMD_EUNSUPPORTED);
	else
		ck_assert_ptr_null(r->response->error);
	frame_free(r);
	/* The daemon is still there. */
	o_st.op_case = GPUCMD__OP__OP_STATUS;
	o_st.status = &st;
	ops[0] = &o_st;
	r = run_ops(&c, ops, 1, NULL, 0);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
	close(fd);
	close(c.fd);
}
END_TEST

/* ---- region_limit ----------------------------------------------------------- */

/*
 * A daemon whose service "capped" may map 3 MiB of shared regions; other
 * services have no region limit.  The file is written beside the daemon's
 * own directory, under the runner's, which removes it.
 */
#define CAP_LIMIT (UINT64_C(3) << 20)

static char cap_conf[192];

static void cap_write(uint64_t limit)
{
	char text[128];

	snprintf(text, sizeof(text),
		 "[service capped]\nregion_limit = %llu\n"
		 "[service open]\nmemory_limit = 64M\n",
		 (unsigned long long)limit);
	harness_config_write(cap_conf, text);
}

static void capped_setup(void)
{
	harness_config("", cap_conf, sizeof(cap_conf));
	cap_write(CAP_LIMIT);
	daemon_start_args(&the_daemon, "--config", cap_conf, NULL);
}

/* Attach a sealed memfd of size bytes as region id; the response frame. */
static Gpucmd__Frame *try_attach(struct raw *c, uint64_t id, size_t size)
{
	int fd = sealed_memfd(size, true);
	Gpucmd__Op *ops[1] = { attach(id, size) };
	Gpucmd__Frame *r = run_ops(c, ops, 1, &fd, 1);

	/* The daemon has its own descriptor (or closed it): ours goes. */
	close(fd);
	return r;
}

static void attach_ok(struct raw *c, uint64_t id, size_t size)
{
	Gpucmd__Frame *r = try_attach(c, id, size);

	ck_assert_msg(r->response->error == NULL,
		      "attach of region %llu (%zu bytes) failed: %s",
		      (unsigned long long)id, size,
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
}

/* An attach refused with GPUCMD_EQUOTA: its message. */
static char *attach_over(struct raw *c, uint64_t id, size_t size)
{
	Gpucmd__Frame *r = try_attach(c, id, size);
	char *msg;

	ck_assert_msg(r->response->error != NULL,
		      "attach of region %llu (%zu bytes) over the limit "
		      "succeeded",
		      (unsigned long long)id, size);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EQUOTA);
	ck_assert_uint_eq(r->response->failed_index, 0);
	msg = strdup(r->response->error->message);
	ck_assert_ptr_nonnull(msg);
	frame_free(r);
	return msg;
}

static void release_on(struct raw *c, uint32_t stream, uint64_t id)
{
	Gpucmd__OpRegionRelease rel = GPUCMD__OP_REGION_RELEASE__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT, *ops[1] = { &o };
	Gpucmd__Frame *r;

	rel.region = id;
	o.op_case = GPUCMD__OP__OP_REGION_RELEASE;
	o.region_release = &rel;
	r = run_ops_on(c, stream, ops, 1, NULL, 0);
	ck_assert_msg(r->response->error == NULL, "release of region %llu: %s",
		      (unsigned long long)id,
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
}

/*
 * On stream: copy the first 4 KiB of region id into a new buffer handle,
 * then release the region, in one request: the release waits for the copy.
 */
static void use_then_release(struct raw *c, uint32_t stream, uint64_t id,
			     uint64_t handle)
{
	Gpucmd__OpRegionRelease rel = GPUCMD__OP_REGION_RELEASE__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT;
	struct empty_write ew;
	Gpucmd__Op *ops[3] = { &ew.o_empty, &ew.o_write, &o };
	Gpucmd__Frame *r;

	empty_write(&ew, handle, 4096, 0, id, 0, 4096);
	rel.region = id;
	o.op_case = GPUCMD__OP__OP_REGION_RELEASE;
	o.region_release = &rel;
	r = run_ops_on(c, stream, ops, 3, NULL, 0);
	ck_assert_msg(r->response->error == NULL,
		      "copy and release of region "
		      "%llu: %s",
		      (unsigned long long)id,
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
}

/*
 * A sync on stream: its answer comes once the stream's work completed, and
 * the daemon unmaps released regions whose fences passed before it reads
 * the next request, so after this a release on stream (with nothing in
 * flight elsewhere) has given its bytes back.  A release alone may be
 * answered before its own fence completes.
 */
static void sync_on(struct raw *c, uint32_t stream)
{
	Gpucmd__OpSync sy = GPUCMD__OP_SYNC__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT, *ops[1] = { &o };
	Gpucmd__Frame *r;

	o.op_case = GPUCMD__OP__OP_SYNC;
	o.sync = &sy;
	r = run_ops_on(c, stream, ops, 1, NULL, 0);
	ck_assert_msg(r->response->error == NULL, "sync: %s",
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
}

/* The spin kernel for usec on stream (answered before it is done). */
static void spin_on(struct raw *c, uint32_t stream, uint32_t usec)
{
	struct spin_op sp;
	Gpucmd__Op *ops[1] = { spin_op(&sp, usec) };
	Gpucmd__Frame *r;

	r = run_ops_on(c, stream, ops, 1, NULL, 0);
	ck_assert_msg(r->response->error == NULL, "spin: %s",
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
}

/*
 * Descriptors reach the attach that names them whichever way the daemon
 * read the bytes: right after a round trip the loop spins and reads a lone
 * sender's socket itself (server.c on_spin), other times libuv reads it.
 * Each request attaches two regions, copies the first into the second
 * through a buffer and checks the copy, so a descriptor taken out of order
 * or lost shows.  Odd rounds wait 5 ms first, past every spin, so that the
 * poll reads them; even rounds follow a round trip at once, as the direct
 * read wants them (which one reads is up to the scheduler).
 */
START_TEST(descriptors_follow_their_attaches_both_ways)
{
	enum { SIZE = 4096, ROUNDS = 50 };
	struct raw c = raw_open();

	for (int i = 0; i < ROUNDS; i++) {
		int fds[2] = { sealed_memfd(SIZE, true),
			       sealed_memfd(SIZE, true) };
		uint64_t a = 100 + 2 * (uint64_t)i, b = a + 1;
		uint8_t *src = mmap(NULL, SIZE, PROT_READ | PROT_WRITE,
				    MAP_SHARED, fds[0], 0);
		uint8_t *dst = mmap(NULL, SIZE, PROT_READ | PROT_WRITE,
				    MAP_SHARED, fds[1], 0);
		struct empty_write ew;
		Gpucmd__RegionRef into = GPUCMD__REGION_REF__INIT;
		Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
		Gpucmd__Op o_r = GPUCMD__OP__INIT, *ops[5];
		Gpucmd__Frame *r;

		ck_assert_ptr_ne(src, MAP_FAILED);
		ck_assert_ptr_ne(dst, MAP_FAILED);
		for (size_t k = 0; k < SIZE; k++)
			src[k] = (uint8_t)(k * 13 + (size_t)i);
		if (i % 2 == 1)
			usleep(5000);
		empty_write(&ew, 1 + (uint64_t)i, SIZE, 0, a, 0, SIZE);
		into.region = b;
		into.length = SIZE;
		rd.handle = 1 + (uint64_t)i;
		rd.length = SIZE;
		rd.into = &into;
		o_r.op_case = GPUCMD__OP__OP_READ;
		o_r.read = &rd;
		ops[0] = attach(a, SIZE);
		ops[1] = attach(b, SIZE);
		ops[2] = &ew.o_empty;
		ops[3] = &ew.o_write;
		ops[4] = &o_r;
		r = run_ops(&c, ops, 5, fds, 2);
		ck_assert_msg(r->response->error == NULL, "round %d: %s", i,
			      r->response->error ? r->response->error->message :
						   "");
		frame_free(r);
		ck_assert_msg(memcmp(dst, src, SIZE) == 0,
			      "round %d: region %llu does not hold what "
			      "region %llu held",
			      i, (unsigned long long)b, (unsigned long long)a);
		munmap(src, SIZE);
		munmap(dst, SIZE);
		close(fds[0]);
		close(fds[1]);
		release_on(&c, 0, a);
		release_on(&c, 0, b);
	}
	close(c.fd);
}
END_TEST

/*
 * A released region stays mapped until the copies queued with it are done,
 * so it counts toward the 64 a connection may hold: behind one long kernel,
 * attach, copy and release in a loop must stop at 64 with GPUCMD_ELIMIT,
 * not grow the daemon's mappings without bound.  The daemon keeps no
 * descriptor of a mapped region.  Once the kernel is done, attaches work
 * again.  A region no queued copy uses goes at its release.
 */
START_TEST(released_regions_count_until_unmapped)
{
	/* Long enough for 64 round trips, under valgrind too. */
	uint32_t spin_us = getenv("GPUCMD_TEST_VALGRIND") ? 20000000 : 3000000;
	struct raw c = raw_open();
	int before = daemon_fds(the_daemon.pid);
	Gpucmd__Frame *r;

	spin_on(&c, 0, spin_us);
	/* Unused, it is unmapped at its release even behind the spin. */
	attach_ok(&c, 999, 4096);
	release_on(&c, 0, 999);
	for (int i = 0; i < 64; i++) {
		attach_ok(&c, 1000 + (uint64_t)i, 4096);
		use_then_release(&c, 0, 1000 + (uint64_t)i, 1 + (uint64_t)i);
	}
	ck_assert_int_le(daemon_fds(the_daemon.pid), before + 2);
	r = try_attach(&c, 2000, 4096);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ELIMIT);
	ck_assert_msg(strstr(r->response->error->message,
			     "0 regions attached and 64 released") != NULL,
		      "%s", r->response->error->message);
	frame_free(r);
	sync_on(&c, 0);
	attach_ok(&c, 2000, 4096);
	release_on(&c, 0, 2000);
	close(c.fd);
}
END_TEST

/* Service name's row of the memory report, and the totals. */
static struct gpucmd_service_report row_of(struct gpucmd_conn *c,
					   const char *name,
					   struct gpucmd_service_report *totals)
{
	struct gpucmd_report *rep = NULL;
	struct gpucmd_service_report out;
	size_t i;

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (i = 0; i < rep->nservices; i++)
		if (strcmp(rep->services[i].name, name) == 0)
			break;
	ck_assert_msg(i < rep->nservices, "service %s is not in the report",
		      name);
	out = rep->services[i];
	out.streams = NULL;
	out.nstreams = 0;
	if (totals != NULL) {
		*totals = rep->totals;
		totals->streams = NULL;
	}
	gpucmd_report_free(rep);
	return out;
}

#define expect_regions(c, name, bytes, count)                              \
	do {                                                               \
		struct gpucmd_service_report row_ = row_of(c, name, NULL); \
		ck_assert_msg(row_.region_bytes == (bytes) &&              \
				      row_.regions == (count),             \
			      "service %s: %llu bytes in %u regions, "     \
			      "expected %llu in %u",                       \
			      name, (unsigned long long)row_.region_bytes, \
			      row_.regions, (unsigned long long)(bytes),   \
			      (unsigned)(count));                          \
	} while (0)

/* Every needle must be in msg. */
static void expect_in(const char *msg, const char *const *needles, size_t n)
{
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(strstr(msg, needles[i]) != NULL,
			      "'%s' is not in: %.3000s", needles[i], msg);
}

/*
 * Up to the limit, exactly, across two connections of the service; the
 * next byte is refused with the numbers, and nothing is mapped for it; a
 * release (settled by a sync) makes room again.  The report has the bytes,
 * the count and the limit, in the library and in every gpucmd output.
 */
START_TEST(region_limit_refuses_the_attach_over_it)
{
	struct raw c = raw_open_as("capped");
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_conn *lib = connect_as("capped");
	struct gpucmd_service_report row, tot;
	static char out[1 << 20];
	char *msg;
	void *p;

	/* 1 MiB + 1.5 MiB: 2.5 MiB of 3. */
	attach_ok(&c, 1, 1048576);
	attach_ok(&c, 2, 1572864);
	row = row_of(obs, "capped", &tot);
	ck_assert_uint_eq(row.region_bytes, 2621440);
	ck_assert_uint_eq(row.regions, 2);
	ck_assert_uint_eq(row.region_limit, CAP_LIMIT);
	ck_assert_uint_eq(row.region_refusals, 0);
	ck_assert_uint_eq(row.connections, 2);
	/* Device memory is another account. */
	ck_assert_uint_eq(row.bytes_in_use, 0);
	ck_assert_uint_eq(row.limit_bytes, 0);
	ck_assert_uint_eq(tot.region_bytes, 2621440);
	ck_assert_uint_eq(tot.regions, 2);
	ck_assert_uint_eq(tot.region_limit, 0);
	row = row_of(obs, "open", NULL);
	ck_assert_uint_eq(row.region_limit, 0);
	ck_assert_uint_eq(row.limit_bytes, 64u << 20);

	/* 768 KiB more would be 3.25 MiB: refused, with the numbers. */
	msg = attach_over(&c, 3, 786432);
	{
		const char *const want[] = {
			"region 3 of 786432 bytes",
			"service 'capped'",
			"to 3407872 bytes",
			"region_limit of 3145728",
			"2 regions of 2621440 bytes attached",
			"raise region_limit",
		};
		expect_in(msg, want, sizeof(want) / sizeof(want[0]));
	}
	free(msg);
	/* Nothing was mapped or counted for it, and its id is still free. */
	expect_regions(obs, "capped", 2621440, 2);
	/* The service's other connection is held to the same account. */
	ck_assert_int_eq(gpucmd_region_create(lib, 7, 786432, &p),
			 GPUCMD_EQUOTA);
	/* The library keeps the daemon's sentence for the caller. */
	ck_assert_msg(strstr(gpucmd_last_message(lib), "region 7 of 786432 "
						       "bytes") != NULL &&
			      strstr(gpucmd_last_message(lib),
				     "region_limit of 3145728") != NULL,
		      "last message: %s", gpucmd_last_message(lib));
	expect_regions(obs, "capped", 2621440, 2);

	/* Exactly up to the limit is allowed; one byte past it is not. */
	attach_ok(&c, 3, 524288);
	expect_regions(obs, "capped", CAP_LIMIT, 3);
	msg = attach_over(&c, 4, 1);
	{
		const char *const want[] = {
			"region 4 of 1 bytes",
			"to 3145729 bytes",
			"3 regions of 3145728 bytes attached",
		};
		expect_in(msg, want, sizeof(want) / sizeof(want[0]));
	}
	free(msg);

	/* Three attaches were refused: counted for the operator. */
	row = row_of(obs, "capped", &tot);
	ck_assert_uint_eq(row.region_refusals, 3);
	ck_assert_uint_eq(tot.region_refusals, 3);
	ck_assert_uint_eq(row_of(obs, "open", NULL).region_refusals, 0);

	/* The report as gpucmd shows it, in every format. */
	harness_tool_output("memory-report --json --service capped", out,
			    sizeof(out));
	ck_assert_msg(strstr(out, "\"region_bytes\":3145728,\"regions\":3,"
				  "\"region_limit\":3145728,"
				  "\"region_refusals\":3") != NULL,
		      "memory-report --json: %.3000s", out);
	ck_assert_msg(strstr(out, "\"totals\":{") != NULL &&
			      strstr(strstr(out, "\"totals\":{"),
				     "\"region_bytes\":3145728,\"regions\":3,"
				     "\"region_limit\":0,"
				     "\"region_refusals\":3,"
				     "\"bytes_released_pending\":0,"
				     "\"module_bytes\":0,"
				     "\"shared_buffers\":0,"
				     "\"shared_buffer_bytes\":0}") != NULL,
		      "memory-report --json totals: %.3000s", out);
	harness_tool_output("memory-report --prometheus", out, sizeof(out));
	{
		const char *const want[] = {
			"# TYPE gpucmd_service_region_bytes gauge\n",
			"# HELP gpucmd_service_region_bytes ",
			"\ngpucmd_service_region_bytes{service=\"capped\"} 3145728\n",
			"\ngpucmd_service_regions{service=\"capped\"} 3\n",
			"\ngpucmd_service_region_limit_bytes{service=\"capped\"} 3145728\n",
			"\ngpucmd_service_region_bytes{service=\"open\"} 0\n",
			"\ngpucmd_service_region_limit_bytes{service=\"open\"} 0\n",
			"# TYPE gpucmd_service_region_refusals_total counter\n",
			"\ngpucmd_service_region_refusals_total{service=\"capped\"} 3\n",
			"\ngpucmd_service_region_refusals_total{service=\"open\"} 0\n",
		};
		expect_in(out, want, sizeof(want) / sizeof(want[0]));
	}
	harness_tool_output("memory-report --bytes", out, sizeof(out));
	{
		const char *const want[] = {
			"\nshared regions (",
			"\n  capped: 3 regions, 3145728 (limit 3145728), 3 "
			"attaches refused over the limit\n",
		};
		expect_in(out, want, sizeof(want) / sizeof(want[0]));
	}
	/* Services with neither regions nor a region limit get no line. */
	ck_assert_msg(strstr(out, "  open:") == NULL &&
			      strstr(out, "  observer:") == NULL,
		      "memory-report: %.3000s", out);

	/* A release, settled by a sync, gives its bytes back... */
	release_on(&c, 0, 2);
	sync_on(&c, 0);
	expect_regions(obs, "capped", 1572864, 2);
	/* ...so what was refused fits now, from either connection. */
	attach_ok(&c, 4, 786432);
	expect_regions(obs, "capped", 2359296, 3);
	ck_assert_int_eq(gpucmd_region_create(lib, 7, 786432, &p), 0);
	ck_assert_str_eq(gpucmd_last_message(lib), "");
	expect_regions(obs, "capped", CAP_LIMIT, 4);
	ck_assert_int_eq(gpucmd_region_create(lib, 8, 4096, &p), GPUCMD_EQUOTA);
	ck_assert_uint_eq(row_of(obs, "capped", NULL).region_refusals, 4);
	/* A closed connection returns what it had. */
	gpucmd_close(lib);
	for (int i = 0; i < 2000; i++) {
		row = row_of(obs, "capped", NULL);
		if (row.connections == 1 && row.region_bytes == 2359296)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(row.connections, 1);
	expect_regions(obs, "capped", 2359296, 3);
	gpucmd_close(obs);
	close(c.fd);
}
END_TEST

/*
 * gpucmd_write_buffer and gpucmd_read_buffer under a region_limit of
 * 3 MiB, whose quarter is under the scratch region's least size (1 MiB):
 * no scratch region is asked for, beside the caller's own region or
 * without it, and the transfers go inline a frame at a time, byte-exact.
 * (A scratch region of 1 MiB used to take a third of the limit from the
 * service's own regions; test_region_api covers a larger limit.)
 */
START_TEST(region_limit_convenience_transfers_fit_under_it)
{
	enum { N = 5 * 1024 * 1024 + 123 };
	struct gpucmd_conn *lib = connect_as("capped");
	struct gpucmd_batch *b;
	uint8_t *want = malloc(N), *got = malloc(N);
	uint8_t *mine = NULL;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	for (size_t i = 0; i < N; i++)
		want[i] = (uint8_t)(i * 31 + 7);
	ck_assert_int_eq(gpucmd_batch_new(lib, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, N), 0);
	gpucmd_response_free(run_ok(b));
	/* A region of the caller's takes most of the limit: no scratch fits. */
	ck_assert_int_eq(gpucmd_region_create(lib, 5, 5 * (1 << 19),
					      (void **)&mine),
			 0);
	ck_assert_int_eq(gpucmd_write_buffer(lib, 0, 1, 0, want, N), 0);
	memset(got, 0, N);
	ck_assert_int_eq(gpucmd_read_buffer(lib, 0, 1, 0, N, got), 0);
	ck_assert_int_eq(memcmp(got, want, N), 0);
	ck_assert_uint_eq(row_of(lib, "capped", NULL).region_refusals, 0);
	/* Without it, still inline: the region's place stays the service's. */
	ck_assert_int_eq(gpucmd_region_release(lib, 5), 0);
	for (int i = 0; i < 1000; i++) {
		if (row_of(lib, "capped", NULL).region_bytes == 0)
			break;
		usleep(10000);
	}
	for (size_t i = 0; i < N; i++)
		want[i] = (uint8_t)(i * 17 + 3);
	ck_assert_int_eq(gpucmd_write_buffer(lib, 0, 1, 0, want, N), 0);
	memset(got, 0, N);
	ck_assert_int_eq(gpucmd_read_buffer(lib, 0, 1, 0, N, got), 0);
	ck_assert_int_eq(memcmp(got, want, N), 0);
	expect_regions(lib, "capped", 0, 0);
	ck_assert_uint_eq(row_of(lib, "capped", NULL).region_refusals, 0);
	gpucmd_close(lib);
	free(want);
	free(got);
}
END_TEST

/*
 * The Welcome tells each connection its service's region_limit, on the
 * wire and through the library; a service without one (listed with other
 * limits, or not listed at all) is told 0.  gpucmd status, run here by an
 * admin, observes: it joins neither service and shows no quota (a
 * tenant's status shows its service's: report_cli.sh, as nobody).
 */
START_TEST(region_limit_in_the_welcome_and_status)
{
	struct raw capped = raw_open_as("capped");
	struct raw open = raw_open_as("open");
	struct gpucmd_conn *lib = connect_as("capped");
	struct gpucmd_conn *obs = connect_as("observer");
	static char out[1 << 16];

	ck_assert_uint_eq(capped.region_limit, CAP_LIMIT);
	ck_assert_uint_eq(open.region_limit, 0);
	ck_assert_uint_eq(gpucmd_info(lib)->region_limit, CAP_LIMIT);
	ck_assert_uint_eq(gpucmd_info(lib)->memory_limit, 0);
	ck_assert_uint_eq(gpucmd_info(obs)->region_limit, 0);

	harness_tool_output("--service capped status --json", out, sizeof(out));
	ck_assert_msg(strstr(out,
			     "\"client\":{\"observer\":true,"
			     "\"service\":\"\",\"service_id\":0,") != NULL &&
			      strstr(out, "\"memory_limit\":null,"
					  "\"region_limit\":null,") != NULL,
		      "status --json: %.3000s", out);
	harness_tool_output("--service capped status", out, sizeof(out));
	ck_assert_msg(strstr(out, "\nthis client  an observer in no "
				  "service, ") != NULL &&
			      strstr(out, "\nlimits       streams 16, ") !=
				      NULL,
		      "status: %.3000s", out);
	gpucmd_close(obs);
	gpucmd_close(lib);
	close(open.fd);
	close(capped.fd);
}
END_TEST

/*
 * A release while a copy from it waits on another stream of the
 * connection: the region stays mapped, and counted, until that work is
 * done (the refusal says so), then its bytes come back.  The spin is long enough that the
 * checks run while it spins; a machine too slow for that skips only the
 * checks that need it.
 */
START_TEST(region_limit_counts_a_release_until_its_fences_pass)
{
	enum { SPIN_US = 1500000 };
	struct raw c = raw_open_as("capped");
	struct gpucmd_conn *obs = connect_as("observer");
	uint64_t t0;
	char *msg;

	attach_ok(&c, 1, 2097152);
	t0 = harness_now_us();
	spin_on(&c, 1, SPIN_US);
	use_then_release(&c, 1, 1, 1);
	sync_on(&c, 0);
	{
		struct gpucmd_service_report row = row_of(obs, "capped", NULL);
		Gpucmd__Frame *r = try_attach(&c, 2, 2097152);
		bool spinning = harness_now_us() - t0 < SPIN_US;

		if (spinning) {
			ck_assert_uint_eq(row.region_bytes, 2097152);
			ck_assert_uint_eq(row.regions, 1);
			ck_assert_ptr_nonnull(r->response->error);
			ck_assert_int_eq(r->response->error->code,
					 GPUCMD_EQUOTA);
			msg = r->response->error->message;
			ck_assert_msg(strstr(msg, "to 4194304 bytes") != NULL &&
					      strstr(msg,
						     "1 of them, 2097152 "
						     "bytes, released") != NULL,
				      "message: %s", msg);
		} else {
			printf("note: the checks during the spin were "
			       "skipped (too slow a machine)\n");
		}
		/* Refused or, too late to tell, attached: either way, id 2. */
		if (r->response->error == NULL)
			release_on(&c, 0, 2);
		frame_free(r);
	}
	/* Once stream 1 is done, the released region is gone. */
	sync_on(&c, 1);
	sync_on(&c, 0);
	expect_regions(obs, "capped", 0, 0);
	attach_ok(&c, 2, 2097152);
	expect_regions(obs, "capped", 2097152, 1);
	gpucmd_close(obs);
	close(c.fd);
}
END_TEST

/*
 * A client killed (SIGKILL) with regions attached gives every byte back:
 * the report says 0, and the whole limit is free for the next client.
 */
/* Two 1 MiB regions of "capped", a copy from one behind a 0.3 s spin. */
static int capped_with_regions(void *arg)
{
	struct raw c = raw_open_as("capped");
	struct empty_write ew;
	Gpucmd__Op *ops[2] = { &ew.o_empty, &ew.o_write };
	Gpucmd__Frame *r;
	int bad;

	(void)arg;
	attach_ok(&c, 1, 1048576);
	attach_ok(&c, 2, 1048576);
	spin_on(&c, 0, 300000);
	empty_write(&ew, 1, 1048576, 0, 2, 0, 1048576);
	r = run_ops(&c, ops, 2, NULL, 0);
	bad = r->response->error != NULL;
	frame_free(r);
	return bad;
}

START_TEST(region_limit_client_killed_returns_its_regions)
{
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_service_report row;
	pid_t pid = harness_child_ready(capped_with_regions, NULL);

	expect_regions(obs, "capped", 2097152, 2);
	harness_child_kill(pid);
	for (int i = 0; i < 2000; i++) {
		row = row_of(obs, "capped", NULL);
		if (row.region_bytes == 0 && row.connections == 0)
			break;
		usleep(10000);
	}
	row = row_of(obs, "capped", NULL);
	ck_assert_uint_eq(row.region_bytes, 0);
	ck_assert_uint_eq(row.regions, 0);
	ck_assert_uint_eq(row.connections, 0);
	ck_assert_uint_eq(row.region_limit, CAP_LIMIT);
	/* The whole limit is there for the next client. */
	{
		struct raw c = raw_open_as("capped");

		attach_ok(&c, 1, CAP_LIMIT);
		expect_regions(obs, "capped", CAP_LIMIT, 1);
		close(c.fd);
	}
	gpucmd_close(obs);
}
END_TEST

/* The region_limit a new connection of service is told in its Welcome. */
static uint64_t welcome_region_limit(const char *service)
{
	struct raw c = raw_open_as(service);

	close(c.fd);
	return c.region_limit;
}

/*
 * Write capped's region_limit into the config, reload (SIGHUP) and wait
 * until the report shows it; a new connection's Welcome carries it too.
 */
static void reload_capped(struct gpucmd_conn *obs, uint64_t limit)
{
	struct gpucmd_service_report row;

	cap_write(limit);
	ck_assert_int_eq(kill(the_daemon.pid, SIGHUP), 0);
	for (int i = 0; i < 2000; i++) {
		row = row_of(obs, "capped", NULL);
		if (row.region_limit == limit)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(row.region_limit, limit);
	ck_assert_uint_eq(welcome_region_limit("capped"), limit);
}

/*
 * SIGHUP applies a new region_limit to the live service and connection,
 * and the Welcome of the next connection has it.
 */
START_TEST(region_limit_follows_a_reload)
{
	struct raw c = raw_open_as("capped");
	struct gpucmd_conn *obs = connect_as("observer");
	char *msg;

	attach_ok(&c, 1, 2097152);
	free(attach_over(&c, 2, 2097152));
	/* Raised: the same connection may grow. */
	reload_capped(obs, UINT64_C(5) << 20);
	attach_ok(&c, 2, 2097152);
	/* Lowered under what is held: what is attached stays, nothing more. */
	reload_capped(obs, UINT64_C(1) << 20);
	expect_regions(obs, "capped", 4194304, 2);
	msg = attach_over(&c, 3, 4096);
	ck_assert_msg(strstr(msg, "region_limit of 1048576") != NULL &&
			      strstr(msg, "to 4198400 bytes") != NULL,
		      "message: %s", msg);
	free(msg);
	/* 0: no limit at all. */
	reload_capped(obs, 0);
	attach_ok(&c, 3, 8u << 20);
	expect_regions(obs, "capped", 12582912, 3);
	gpucmd_close(obs);
	close(c.fd);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("regions");
	TCase *tc = tcase_create("regions");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, write_from_and_read_into_a_region);
	tcase_add_test(tc, region_errors);
	tcase_add_test(tc, attach_without_descriptor_closes_connection);
	tcase_add_test(tc, client_dies_with_region_and_copy_in_flight);
	tcase_add_test(tc, load_module_errors);
	tcase_add_test(tc, user_ptx_module_on_cuda);
	tcase_add_test(tc,
		       load_module_from_a_region_in_a_batch_without_a_stream);
	tcase_add_test(tc, descriptors_follow_their_attaches_both_ways);
	tcase_add_test(tc, released_regions_count_until_unmapped);
	suite_add_tcase(s, tc);

	tc = tcase_create("region_limit");
	tcase_add_checked_fixture(tc, capped_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, region_limit_refuses_the_attach_over_it);
	tcase_add_test(tc, region_limit_in_the_welcome_and_status);
	tcase_add_test(tc, region_limit_counts_a_release_until_its_fences_pass);
	tcase_add_test(tc, region_limit_client_killed_returns_its_regions);
	tcase_add_test(tc, region_limit_follows_a_reload);
	tcase_add_test(tc, region_limit_convenience_transfers_fit_under_it);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
