/*
 * test_modules.c - module compilation runs off the device thread.
 *
 * The daemon compiles a load_module op's code (NVRTC, the PTX JIT: up to
 * seconds) on libuv's thread pool, and meanwhile serves every other
 * connection; the loading connection's later requests wait their turn.
 * The host backend cannot load modules, but it refuses from the same
 * compile path, after --test-compile-delay-ms: a stand-in for a long
 * compile that these tests time against.  Bounds are generous (2 cores,
 * sanitizers, valgrind): they tell "waited for the compile" from "did not".
 */
#include <stdbool.h>

#include "harness.h"

/*
 * The stand-in compile's length: long enough that "waited for it" and "did
 * not" stay apart on a loaded machine, longer under valgrind.
 */
static unsigned delay_ms(void)
{
	return getenv("GPUCMD_TEST_VALGRIND") != NULL ? 3000 : 800;
}

#define DELAY_MS delay_ms()

static const char *delay_arg(void)
{
	static char buf[16];

	snprintf(buf, sizeof(buf), "%u", delay_ms());
	return buf;
}

static const char some_ptx[] = ".version 7.0\n.target sm_50\n";

static bool host_backend(void)
{
	const char *b = getenv("GPUCMD_TEST_BACKEND");

	return b == NULL || b[0] == '\0' || strcmp(b, "host") == 0;
}

static void slow_setup(void)
{
	daemon_start_args(&the_daemon, "--test-compile-delay-ms", delay_arg(),
			  NULL);
}

static uint64_t submit_load(struct gpucmd_conn *c, uint64_t module)
{
	struct gpucmd_batch *b;
	uint64_t id = 0;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_load_module(b, module, "ptx", some_ptx,
						  sizeof(some_ptx) - 1),
			 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/* Submit a batch of one sync (ping false) or one ping; its id. */
static uint64_t submit_one(struct gpucmd_conn *c, bool ping)
{
	struct gpucmd_batch *b;
	uint64_t id = 0;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(ping ? gpucmd_batch_ping(b) : gpucmd_batch_sync(b), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/* Wait for id; its error code (0 on success). */
static int wait_code(struct gpucmd_conn *c, uint64_t id, char *msg,
		     size_t msg_len)
{
	struct gpucmd_response *r = NULL;
	int rc;

	ck_assert_int_eq(gpucmd_wait(c, id, &r), 0);
	rc = gpucmd_response_error(r);
	if (msg != NULL)
		snprintf(msg, msg_len, "%s", gpucmd_response_message(r));
	gpucmd_response_free(r);
	return rc;
}

/*
 * Wait for id, which must fail with code well before a compile could have
 * ended (the daemon refused it without compiling); its message into msg.
 */
static void refused_at_once(struct gpucmd_conn *c, uint64_t id, int code,
			    char *msg, size_t msg_len)
{
	uint64_t t0 = harness_now_us(), took;
	int rc = wait_code(c, id, msg, msg_len);

	took = harness_now_us() - t0;
	ck_assert_msg(rc == code, "got %s, expected %s: %s", gpucmd_errname(rc),
		      gpucmd_errname(code), msg);
	ck_assert_msg(took < DELAY_MS * 1000u / 2,
		      "the refusal took %llu us: it waited for a compile",
		      (unsigned long long)took);
}

/*
 * While one connection's module compiles, another is served at once; the
 * compiling connection's own later requests (a device batch and a ping the
 * loop would answer itself) come after the load's answer.
 */
START_TEST(compile_does_not_hold_other_connections)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_batch *batch;
	struct gpucmd_response *r;
	uint64_t t0, t_other, t_sync, t_ping, load, sync, ping;
	char msg[512];

	if (!host_backend())
		return;
	a = connect_as("compiler");
	b = connect_as("bystander");
	t0 = harness_now_us();
	load = submit_load(a, 1);
	sync = submit_one(a, false);
	ping = submit_one(a, true);

	/* b: a device round trip and a write/read, long before the compile ends. */
	ck_assert_int_eq(gpucmd_batch_new(b, 0, &batch), 0);
	ck_assert_int_eq(gpucmd_batch_empty(batch, 1, 4096), 0);
	ck_assert_int_eq(gpucmd_batch_sync(batch), 0);
	r = run_ok(batch);
	gpucmd_response_free(r);
	t_other = harness_now_us() - t0;
	ck_assert_msg(t_other < DELAY_MS * 1000 / 2,
		      "another connection waited %llu us for a compile",
		      (unsigned long long)t_other);

	/* a's ping and sync were answered after the compile, not before. */
	ck_assert_int_eq(wait_code(a, ping, NULL, 0), 0);
	t_ping = harness_now_us() - t0;
	ck_assert_int_eq(wait_code(a, sync, NULL, 0), 0);
	t_sync = harness_now_us() - t0;
	ck_assert_msg(t_ping >= DELAY_MS * 900 && t_sync >= DELAY_MS * 900,
		      "requests behind the load were answered before its "
		      "compile ended (ping %llu us, sync %llu us)",
		      (unsigned long long)t_ping, (unsigned long long)t_sync);
	ck_assert_int_eq(wait_code(a, load, msg, sizeof(msg)),
			 GPUCMD_EUNSUPPORTED);
	ck_assert_msg(strstr(msg, "cannot load module 1 (ptx, 27 bytes)") &&
			      strstr(msg, "host backend"),
		      "message: %s", msg);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * Within tries looks 50 ms apart, c's is the only connection left and no
 * memory is in use.
 */
static void settles_to_one_connection(struct gpucmd_conn *c, int tries)
{
	struct gpucmd_service_report t;

	for (int i = 0; i < tries; i++) {
		t = report_totals(c);
		if (t.connections == 1 && t.bytes_in_use == 0)
			break;
		usleep(50 * 1000);
	}
	t = report_totals(c);
	ck_assert_uint_eq(t.connections, 1);
	ck_assert_uint_eq(t.bytes_in_use, 0);
}

/* A client that leaves while its module compiles leaves nothing behind. */
START_TEST(client_leaves_during_compile)
{
	struct gpucmd_conn *a, *obs;
	struct gpucmd_service_report t;
	struct gpucmd_batch *batch;
	struct gpucmd_response *r;

	if (!host_backend())
		return;
	a = connect_as("leaver");
	ck_assert_int_eq(gpucmd_batch_new(a, 0, &batch), 0);
	ck_assert_int_eq(gpucmd_batch_empty(batch, 1, 1 << 20), 0);
	r = run_ok(batch);
	gpucmd_response_free(r);
	(void)submit_load(a, 1);
	(void)submit_one(a, false);
	usleep(100 * 1000);
	gpucmd_close(a);

	/* The compile is still running; the daemon serves and then settles. */
	obs = connect_as("observer");
	settles_to_one_connection(obs, 100);
	/* And after the compile ended, it still serves. */
	usleep(DELAY_MS * 1000);
	t = report_totals(obs);
	ck_assert_uint_eq(t.connections, 1);
	ck_assert_uint_eq(t.bytes_in_use, 0);
	gpucmd_close(obs);
}
END_TEST

/*
 * A connection evicted while its module compiles: the compile runs out on
 * its thread, then nothing of the request reaches the device, and the
 * connection's memory and place go back (compile_done on a closing
 * session).  Its sibling, which evicted it, is served all along.
 */
START_TEST(evicted_during_compile)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_batch *batch;
	struct gpucmd_response *r = NULL;
	uint64_t load, n = 0;
	uint64_t t0;
	const char *why = "";

	a = connect_as("leaver");
	ck_assert_int_eq(gpucmd_batch_new(a, 0, &batch), 0);
	ck_assert_int_eq(gpucmd_batch_empty(batch, 1, 1 << 20), 0);
	gpucmd_response_free(run_ok(batch));
	load = submit_load(a, 1);
	(void)submit_one(a, false);
	usleep(100 * 1000);
	b = connect_as("leaver");
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_evict(b, "leaver", 0, &n), 0);
	ck_assert_uint_eq(n, 1);
	/* b is answered while a's compile still runs. */
	ck_assert_int_eq(gpucmd_batch_new(b, 0, &batch), 0);
	ck_assert_int_eq(gpucmd_batch_ping(batch), 0);
	gpucmd_response_free(run_ok(batch));
	ck_assert_msg(harness_now_us() - t0 < DELAY_MS * 1000u / 2,
		      "the eviction waited for the compile");
	/* a's requests get no answer: its connection is gone. */
	ck_assert_int_ne(gpucmd_wait(a, load, &r), 0);
	ck_assert_ptr_null(r);
	ck_assert(gpucmd_conn_error(a, &why) != 0);
	ck_assert_msg(strstr(why, "evict") != NULL, "%s", why);
	gpucmd_close(a);
	/* Once the compile has ended, the memory and the place are back. */
	settles_to_one_connection(b, 200);
	ck_assert_int_eq(gpucmd_batch_new(b, 0, &batch), 0);
	ck_assert_int_eq(gpucmd_batch_sync(batch), 0);
	gpucmd_response_free(run_ok(batch));
	gpucmd_close(b);
}
END_TEST

/* Several loads in one batch and in a row keep their order and answers. */
START_TEST(loads_in_a_row_answer_in_order)
{
	struct gpucmd_conn *a;
	struct gpucmd_batch *b;
	uint64_t ids[3];
	char msg[512];

	a = connect_as("rows");
	ck_assert_int_eq(gpucmd_batch_new(a, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_load_module(b, 7, "ptx", some_ptx,
						  sizeof(some_ptx) - 1),
			 0);
	ck_assert_int_eq(gpucmd_batch_load_module(b, 8, "cuda", "x", 1), 0);
	ck_assert_int_eq(gpucmd_submit(b, &ids[0]), 0);
	ids[1] = submit_one(a, false);
	ids[2] = submit_load(a, 9);
	if (host_backend()) {
		ck_assert_int_eq(wait_code(a, ids[0], msg, sizeof(msg)),
				 GPUCMD_EUNSUPPORTED);
		ck_assert_msg(strstr(msg, "module 7") != NULL, "%s", msg);
		ck_assert_int_eq(wait_code(a, ids[1], NULL, 0), 0);
		ck_assert_int_eq(wait_code(a, ids[2], msg, sizeof(msg)),
				 GPUCMD_EUNSUPPORTED);
		ck_assert_msg(strstr(msg, "module 9") != NULL, "%s", msg);
	} else {
		/* Not valid code for any GPU: the driver's refusal and log. */
		ck_assert_int_ne(wait_code(a, ids[0], msg, sizeof(msg)), 0);
		ck_assert_msg(strstr(msg, "module 7") != NULL, "%s", msg);
		ck_assert_int_eq(wait_code(a, ids[1], NULL, 0), 0);
		ck_assert_int_ne(wait_code(a, ids[2], msg, sizeof(msg)), 0);
	}
	gpucmd_close(a);
}
END_TEST

/* ---- max_modules ---------------------------------------------------------- */

/*
 * The compile-delayed daemon with a service that may load no module
 * (max_modules = 0) and one that may hold two.
 */
static void start_with_config(const char *text)
{
	char conf[192];

	harness_config(text, conf, sizeof(conf));
	daemon_start_args(&the_daemon, "--config", conf,
			  "--test-compile-delay-ms", delay_arg(), NULL);
}

static void quota_setup(void)
{
	start_with_config("[service builtins]\nmax_modules = 0\n"
			  "[service two]\nmax_modules = 2\n");
}

/*
 * A service with max_modules = 0 runs the built-ins only: a load is
 * refused with EPERM and the reason, at once (the daemon does not even
 * compile it), and built-in kernels still run.  Another service's load
 * goes on to the compiler as before.
 */
START_TEST(max_modules_zero_means_builtins_only)
{
	struct gpucmd_conn *a = connect_as("builtins");
	struct gpucmd_conn *b = connect_as("two");
	struct gpucmd_arg fill[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 1 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 7 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 4 },
	};
	static const uint32_t one[3] = { 1, 1, 1 }, block[3] = { 32, 1, 1 };
	struct gpucmd_batch *batch;
	struct gpucmd_response *r;
	char msg[512];
	int rc;

	refused_at_once(a, submit_load(a, 3), GPUCMD_EPERM, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "module 3") != NULL &&
			      strstr(msg, "'builtins'") != NULL &&
			      strstr(msg, "built-in kernels only") != NULL &&
			      strstr(msg, "max_modules = 0") != NULL,
		      "%s", msg);
	ck_assert_int_eq(gpucmd_batch_new(a, 0, &batch), 0);
	gpucmd_batch_empty(batch, 1, 16);
	gpucmd_batch_kernel(batch, "fill_u32", one, block, fill, 3);
	gpucmd_batch_read(batch, 1, 0, 16);
	r = run_ok(batch);
	{
		const void *data;
		size_t len;

		ck_assert_int_eq(gpucmd_response_data(r, 2, &data, &len), 0);
		ck_assert_uint_eq(len, 16);
		ck_assert_uint_eq(((const uint32_t *)data)[3], 7);
	}
	gpucmd_response_free(r);
	/* The report shows each service's modules and their limit. */
	{
		struct gpucmd_report *rep = NULL;
		int seen = 0;

		ck_assert_int_eq(gpucmd_memory_report(b, &rep), 0);
		for (size_t k = 0; k < rep->nservices; k++) {
			const struct gpucmd_service_report *sr =
				&rep->services[k];

			if (strcmp(sr->name, "builtins") == 0) {
				ck_assert_uint_eq(sr->max_modules, 0);
				seen |= 1;
			} else if (strcmp(sr->name, "two") == 0) {
				ck_assert_uint_eq(sr->max_modules, 2);
				seen |= 2;
			} else {
				continue;
			}
			ck_assert_uint_eq(sr->modules, 0);
		}
		ck_assert_int_eq(seen, 3);
		gpucmd_report_free(rep);
	}
	/* A service allowed modules reaches the backend's compiler. */
	rc = wait_code(b, submit_load(b, 3), msg, sizeof(msg));
	if (host_backend())
		ck_assert_int_eq(rc, GPUCMD_EUNSUPPORTED);
	else
		ck_assert_int_ne(rc, GPUCMD_EPERM);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/* ---- globals and the memory quota ------------------------------------------ */

/* A service with a 64M quota, beside the compile-delayed daemon. */
static void globals_setup(void)
{
	start_with_config("[service small]\nmemory_limit = 64M\n"
			  "max_modules = 4\n");
}

static uint64_t submit_ptx(struct gpucmd_conn *c, uint64_t module,
			   const char *ptx)
{
	struct gpucmd_batch *b;
	uint64_t id = 0;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_load_module(b, module, "ptx", ptx,
						  strlen(ptx)),
			 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/*
 * A module's global variables take device memory while it is loaded, so
 * they count in the memory_limit (gpucmdd.conf(5)): a module whose
 * globals cannot fit is refused with EQUOTA and the numbers, before it is
 * loaded or even compiled, alone (128 MiB under 64M) or beside the
 * service's live buffers (8 MiB beside 60M).  A module within it goes on
 * to the compiler as before.
 */
START_TEST(module_globals_count_against_the_quota)
{
	static const char big[] = ".version 8.0\n.target sm_90\n"
				  ".address_size 64\n"
				  ".global .align 1 .b8 big[134217728];\n";
	static const char eight[] = ".version 8.0\n.target sm_90\n"
				    ".global .align 4 .b8 e[8388608];\n";
	struct gpucmd_conn *c = connect_as("small");
	struct gpucmd_batch *b;
	char msg[512];
	int rc;

	refused_at_once(c, submit_ptx(c, 5, big), GPUCMD_EQUOTA, msg,
			sizeof(msg));
	ck_assert_msg(strstr(msg, "module 5's global variables take "
				  "134217728 bytes") != NULL &&
			      strstr(msg, "'small'") != NULL &&
			      strstr(msg, "memory_limit of 67108864") != NULL,
		      "%s", msg);
	/* Within the quota alone, but not beside 60M of live buffers. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_empty(b, 1, 60u << 20);
	gpucmd_response_free(run_ok(b));
	rc = wait_code(c, submit_ptx(c, 6, eight), msg, sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_EQUOTA);
	ck_assert_msg(strstr(msg, "8388608 bytes") != NULL &&
			      strstr(msg, "live buffers 62914560") != NULL,
		      "%s", msg);
	/* The report keeps it as the service's last refused allocation. */
	{
		struct gpucmd_report *rep = NULL;
		const struct gpucmd_refusal *last;

		ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
		ck_assert_uint_eq(rep->nservices, 1);
		last = &rep->services[0].last_refusal;
		ck_assert_uint_eq(last->size, 8388608);
		ck_assert_int_eq(last->code, GPUCMD_EQUOTA);
		ck_assert_str_eq(last->message, msg);
		gpucmd_report_free(rep);
	}
	/* With the buffers gone it goes on to the compiler. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run_ok(b));
	rc = wait_code(c, submit_ptx(c, 6, eight), msg, sizeof(msg));
	if (host_backend())
		ck_assert_int_eq(rc, GPUCMD_EUNSUPPORTED);
	else
		ck_assert_int_eq(rc, 0);
	gpucmd_close(c);
}
END_TEST

/*
 * A __managed__ variable is a .global too (.attribute(.managed)): 128 MiB
 * of it under small's 64M is refused at once, like big above, not loaded
 * uncounted.
 */
START_TEST(managed_globals_count_against_the_quota)
{
	static const char big_managed[] =
		".version 8.0\n.target sm_90\n.address_size 64\n"
		".global .attribute(.managed) .align 1 .b8 big[134217728];\n";
	struct gpucmd_conn *c = connect_as("small");
	char msg[512];

	refused_at_once(c, submit_ptx(c, 5, big_managed), GPUCMD_EQUOTA, msg,
			sizeof(msg));
	gpucmd_close(c);
}
END_TEST

/* The modules service small keeps loaded, and their globals' bytes. */
static void small_modules(struct gpucmd_conn *c, uint32_t *modules,
			  uint64_t *bytes)
{
	struct gpucmd_report *rep = NULL;
	bool seen = false;

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (size_t k = 0; k < rep->nservices; k++)
		if (strcmp(rep->services[k].name, "small") == 0) {
			*modules = rep->services[k].modules;
			*bytes = rep->services[k].module_bytes;
			seen = true;
		}
	gpucmd_report_free(rep);
	ck_assert(seen);
}

/*
 * A module with 8 MiB of globals and add_one(p, n), which adds one to n
 * u32s at p (the fake CUDA runs it), launched on buffer 1's first four.
 */
static const char add_one_ptx[] =
	".version 8.0\n.target sm_90\n.address_size 64\n"
	".global .align 4 .b8 e[8388608];\n"
	".visible .entry add_one(\n.param .u64 add_one_param_0,\n"
	".param .u32 add_one_param_1\n)\n{\nret;\n}\n";
static const struct gpucmd_arg add_one_args[2] = {
	{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 1 },
	{ .kind = GPUCMD_ARG_U32, .v.u32 = 4 },
};

/*
 * A connection of service small with add_one_ptx loaded as module 6, or
 * NULL on the host backend, which loads no modules.
 */
static struct gpucmd_conn *small_with_add_one(void)
{
	struct gpucmd_conn *c;
	char msg[512];

	if (host_backend())
		return NULL;
	c = connect_as("small");
	ck_assert_int_eq(wait_code(c, submit_ptx(c, 6, add_one_ptx), msg,
				   sizeof(msg)),
			 0);
	return c;
}

/* Run b and read back the 4 u32s of handle 1; each must be want. */
static void run_and_expect(struct gpucmd_batch *b, uint32_t want)
{
	struct gpucmd_response *r;
	const uint32_t *u;
	const void *data;
	size_t len;

	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 16), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, gpucmd_response_count(r) - 1,
					      &data, &len),
			 0);
	ck_assert_uint_eq(len, 16);
	u = data;
	for (int k = 0; k < 4; k++)
		ck_assert_msg(u[k] == want, "element %d is %u, expected %u", k,
			      u[k], want);
	gpucmd_response_free(r);
}

/* Within 5 s, service small holds no module and no globals' bytes. */
static void small_modules_go_to_zero(struct gpucmd_conn *c)
{
	uint64_t bytes = 0;
	uint32_t modules = 0;

	for (int i = 0; i < 500; i++) {
		small_modules(c, &modules, &bytes);
		if (modules == 0)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(modules, 0);
	ck_assert_uint_eq(bytes, 0);
}

/* Unload module on stream 0; its error code, message into msg. */
static int unload(struct gpucmd_conn *c, uint64_t module, char *msg,
		  size_t msg_len)
{
	struct gpucmd_batch *b;
	uint64_t id = 0;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_unload_module(b, module), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return wait_code(c, id, msg, msg_len);
}

/*
 * Unloading a module frees its id at once, but the module stays loaded,
 * and counted against the service's max_modules and memory_limit, until
 * the work enqueued before the unload has run (a launch may still need
 * it); then its globals' bytes leave the service's count.  An id that is
 * not loaded is refused with ENOTFOUND.  (A driver backend only: the host
 * backend loads no modules.)
 */
START_TEST(unload_gives_the_module_back_after_earlier_work)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	const struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32,
					 .v.u32 = 3000000 };
	static const uint32_t zeros[4];
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	uint64_t bytes = 0, spinning = 0;
	uint32_t modules = 0;
	char msg[512];

	c = small_with_add_one();
	if (c == NULL)
		return;
	small_modules(c, &modules, &bytes);
	ck_assert_uint_eq(modules, 1);
	ck_assert_uint_eq(bytes, 8u << 20);
	/*
	 * Behind a 3 s kernel, a launch of the module's add_one, then the
	 * unload: the module stays loaded and counted, and the launch runs.
	 */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, zeros,
						       sizeof(zeros)),
			 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", one, one, &spin, 1), 0);
	ck_assert_int_eq(gpucmd_batch_kernel_module(b, 6, "add_one", one, one,
						    0, add_one_args, 2),
			 0);
	ck_assert_int_eq(gpucmd_submit(b, &spinning), 0);
	ck_assert_int_eq(unload(c, 6, msg, sizeof(msg)), 0);
	small_modules(c, &modules, &bytes);
	ck_assert_uint_eq(modules, 1);
	ck_assert_uint_eq(bytes, 8u << 20);
	/* The id is free at once. */
	ck_assert_int_eq(unload(c, 6, msg, sizeof(msg)), GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "module 6 is not loaded") != NULL, "%s", msg);
	/* Once the kernels have run, the module leaves the count. */
	ck_assert_int_eq(wait_code(c, spinning, msg, sizeof(msg)), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	run_and_expect(b, 1);
	small_modules_go_to_zero(c);
	/* And the id loads again. */
	ck_assert_int_eq(wait_code(c, submit_ptx(c, 6, add_one_ptx), msg,
				   sizeof(msg)),
			 0);
	small_modules(c, &modules, &bytes);
	ck_assert_uint_eq(modules, 1);
	gpucmd_close(c);
}
END_TEST

/*
 * A graph that recorded a launch of a module's kernel keeps the module
 * loaded, and counted against the service, for its replays: unloading the
 * module frees its id, the graph still launches it, and only destroying
 * the graph gives the module back.  (A driver backend only.)
 */
START_TEST(a_graph_keeps_its_modules_until_destroyed)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	static const uint32_t zeros[4];
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	uint64_t bytes = 0;
	uint32_t modules = 0;
	char msg[512];

	c = small_with_add_one();
	if (c == NULL)
		return;
	/* Record one launch of add_one into graph 7; nothing runs yet. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, zeros,
						       sizeof(zeros)),
			 0);
	ck_assert_int_eq(gpucmd_batch_capture_begin(b), 0);
	ck_assert_int_eq(gpucmd_batch_kernel_module(b, 6, "add_one", one, one,
						    0, add_one_args, 2),
			 0);
	ck_assert_int_eq(gpucmd_batch_capture_end(b, 7), 0);
	run_and_expect(b, 0);
	/* Unloaded: the id is free, the graph still holds the module. */
	ck_assert_int_eq(unload(c, 6, msg, sizeof(msg)), 0);
	ck_assert_int_eq(unload(c, 6, msg, sizeof(msg)), GPUCMD_ENOTFOUND);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	gpucmd_response_free(run_ok(b));
	small_modules(c, &modules, &bytes);
	ck_assert_uint_eq(modules, 1);
	ck_assert_uint_eq(bytes, 8u << 20);
	/* And its replays run the kernel, once each. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_graph_launch(b, 7), 0);
	run_and_expect(b, 1);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_graph_launch(b, 7), 0);
	ck_assert_int_eq(gpucmd_batch_graph_launch(b, 7), 0);
	run_and_expect(b, 3);
	/* Destroyed, the graph gives the module back. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_graph_destroy(b, 7), 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	gpucmd_response_free(run_ok(b));
	small_modules_go_to_zero(c);
	gpucmd_close(c);
}
END_TEST

/*
 * SIGTERM while a module compiles: the load is answered when the compile
 * ends (here the host backend's refusal, which leaves nothing in flight),
 * the ping pipelined behind it is not taken, and the daemon exits 0.
 */
START_TEST(sigterm_during_a_compile)
{
	struct gpucmd_conn *a;
	struct gpucmd_response *r = NULL;
	uint64_t load, ping;
	char msg[512];
	int rc, status = 0;

	if (!host_backend())
		return;
	a = connect_as("compiler");
	load = submit_load(a, 1);
	ping = submit_one(a, true);
	/* The load reached the compiler: the loop stopped reading a. */
	usleep(100 * 1000);
	ck_assert_int_eq(kill(the_daemon.pid, SIGTERM), 0);
	harness_wait_log("shutting down", 0);
	ck_assert_int_eq(wait_code(a, load, msg, sizeof(msg)),
			 GPUCMD_EUNSUPPORTED);
	rc = gpucmd_wait(a, ping, &r);
	gpucmd_response_free(r);
	ck_assert_msg(rc != 0, "the ping behind the compile was taken after "
			       "SIGTERM");
	gpucmd_close(a);
	status = daemon_wait_exit(&the_daemon);
	ck_assert_msg(status == 0, "gpucmdd exited %d after SIGTERM, not 0",
		      status);
	daemon_cleanup_dir(&the_daemon);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("modules");
	TCase *tc = tcase_create("compile");

	tcase_add_checked_fixture(tc, slow_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, compile_does_not_hold_other_connections);
	tcase_add_test(tc, client_leaves_during_compile);
	tcase_add_test(tc, evicted_during_compile);
	tcase_add_test(tc, loads_in_a_row_answer_in_order);
	tcase_add_test(tc, sigterm_during_a_compile);
	suite_add_tcase(s, tc);

	tc = tcase_create("quota");
	tcase_add_checked_fixture(tc, quota_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, max_modules_zero_means_builtins_only);
	suite_add_tcase(s, tc);

	tc = tcase_create("globals");
	tcase_add_checked_fixture(tc, globals_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, module_globals_count_against_the_quota);
	tcase_add_test(tc, managed_globals_count_against_the_quota);
	tcase_add_test(tc, unload_gives_the_module_back_after_earlier_work);
	tcase_add_test(tc, a_graph_keeps_its_modules_until_destroyed);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
