/*
 * test_regions.c - shared regions at the wire level: a memfd passed with
 * SCM_RIGHTS, writes from it and reads into it, bounds, seals, releases
 * with copies in flight, and a client that dies with regions mapped.
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
};

static void raw_send(struct raw *c, const Gpucmd__Frame *f, const int *fds,
		     int nfds)
{
	uint8_t *buf;
	size_t len;
	struct iovec iov;
	struct msghdr mh = { 0 };
	char ctl[CMSG_SPACE(sizeof(int) * 8)];

	ck_assert_int_eq(frame_encode(f, &buf, &len), 0);
	iov.iov_base = buf;
	iov.iov_len = len;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (nfds > 0) {
		struct cmsghdr *cm;

		memset(ctl, 0, sizeof(ctl));
		mh.msg_control = ctl;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	ck_assert_int_eq(sendmsg(c->fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
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

static struct raw raw_open(void)
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
	hello.service = "regions";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	raw_send(&c, &f, NULL, 0);
	w = raw_recv(&c);
	ck_assert_int_eq(w->msg_case, GPUCMD__FRAME__MSG_WELCOME);
	frame_free(w);
	return c;
}

/* Send ops as one request (with fds) and return its response frame. */
static Gpucmd__Frame *run_ops(struct raw *c, Gpucmd__Op **ops, size_t n,
			      const int *fds, int nfds)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *r;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;

	req.id = c->next_id++;
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

START_TEST(write_from_and_read_into_a_region)
{
	enum { SIZE = 1 << 20 };
	struct raw c = raw_open();
	int fd = sealed_memfd(SIZE, true);
	uint8_t *map = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__RegionRef src = GPUCMD__REGION_REF__INIT, dst = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Op o_empty = GPUCMD__OP__INIT, o_w = GPUCMD__OP__INIT, o_r = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[4];
	Gpucmd__Frame *r;

	ck_assert_ptr_ne(map, MAP_FAILED);
	for (size_t i = 0; i < SIZE / 2; i++)
		map[i] = (uint8_t)(i * 7 + 3);
	empty.handle = 1;
	empty.size = SIZE / 2;
	o_empty.op_case = GPUCMD__OP__OP_EMPTY;
	o_empty.empty = &empty;
	/* Odd offset and length on both sides. */
	src.region = 9;
	src.offset = 1;
	src.length = SIZE / 2 - 3;
	w.handle = 1;
	w.offset = 2;
	w.region = &src;
	o_w.op_case = GPUCMD__OP__OP_WRITE;
	o_w.write = &w;
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
	ops[1] = &o_empty;
	ops[2] = &o_w;
	ops[3] = &o_r;
	r = run_ops(&c, ops, 4, &fd, 1);
	ck_assert_msg(r->response->error == NULL, "failed: %s",
		      r->response->error ? r->response->error->message : "");
	ck_assert_int_eq(r->response->results[3]->result_case,
			 GPUCMD__OP_RESULT__RESULT_REGION);
	ck_assert_uint_eq(r->response->results[3]->region->offset, SIZE / 2 + 1);
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
	Gpucmd__RegionRef ref = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRegionRelease rel = GPUCMD__OP_REGION_RELEASE__INIT;
	Gpucmd__Op o_empty = GPUCMD__OP__INIT, o_w = GPUCMD__OP__INIT, o_rel = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[3];
	Gpucmd__Frame *r;

	/* Not sealed against shrinking: refused. */
	ops[0] = attach(1, 4096);
	r = run_ops(&c, ops, 1, &unsealed, 1);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(r->response->error->message, "F_SEAL_SHRINK"));
	frame_free(r);
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
	empty.handle = 5;
	empty.size = 100000;
	o_empty.op_case = GPUCMD__OP__OP_EMPTY;
	o_empty.empty = &empty;
	ref.region = 3;
	ref.offset = 8000;
	ref.length = 1000;
	w.handle = 5;
	w.region = &ref;
	o_w.op_case = GPUCMD__OP__OP_WRITE;
	o_w.write = &w;
	ops[0] = &o_empty;
	ops[1] = &o_w;
	r = run_ops(&c, ops, 2, NULL, 0);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
	ck_assert_uint_eq(r->response->failed_index, 1);
	ck_assert_ptr_nonnull(strstr(r->response->error->message, "out of bounds"));
	frame_free(r);
	/* Release, then use: not found. */
	rel.region = 3;
	o_rel.op_case = GPUCMD__OP__OP_REGION_RELEASE;
	o_rel.region_release = &rel;
	ref.offset = 0;
	ops[0] = &o_rel;
	ops[1] = &o_w;
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
		Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
		Gpucmd__RegionRef ref = GPUCMD__REGION_REF__INIT;
		Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
		Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
		Gpucmd__KernelArg a = GPUCMD__KERNEL_ARG__INIT, *args[1] = { &a };
		uint32_t one[1] = { 1 };
		Gpucmd__Op o_e = GPUCMD__OP__INIT, o_w = GPUCMD__OP__INIT, o_k = GPUCMD__OP__INIT;
		Gpucmd__Op *ops[4];
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Request req = GPUCMD__REQUEST__INIT;

		a.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
		a.u32 = 300000;
		k.name = "spin";
		k.n_grid = 1;
		k.grid = one;
		k.n_block = 1;
		k.block = one;
		k.n_args = 1;
		k.args = args;
		o_k.op_case = GPUCMD__OP__OP_KERNEL;
		o_k.kernel = &k;
		empty.handle = 1;
		empty.size = 1 << 22;
		o_e.op_case = GPUCMD__OP__OP_EMPTY;
		o_e.empty = &empty;
		ref.region = 1;
		ref.length = 1 << 22;
		w.handle = 1;
		w.region = &ref;
		o_w.op_case = GPUCMD__OP__OP_WRITE;
		o_w.write = &w;
		ops[0] = attach(1, 1 << 22);
		ops[1] = &o_e;
		ops[2] = &o_k;
		ops[3] = &o_w;
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
	ck_assert_ptr_nonnull(strstr(r->response->error->message, "ptx, cubin"));
	frame_free(r);
	if (backend == NULL || strcmp(backend, "host") == 0) {
		lm.format = "ptx";
		r = run_ops(&c, ops, 1, NULL, 0);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EUNSUPPORTED);
		ck_assert_ptr_nonnull(strstr(r->response->error->message, "host backend"));
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
	Gpucmd__KernelArg a0 = GPUCMD__KERNEL_ARG__INIT, a1 = GPUCMD__KERNEL_ARG__INIT;
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
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
