/*
 * check_config.c - unit tests of the daemon's settings (daemon/config.c):
 * defaults, the value parsers, and config_load over good and bad files.
 *
 * Every test writes its files into a private temporary directory (made and
 * removed by an unchecked fixture, in the parent, so that a failing test
 * leaves nothing behind; the forked tests run one after the other).  A bad file must be
 * refused with "PATH:LINE: problem" naming the line that is wrong, and must
 * leave the configuration it was loaded over exactly as it was.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "gpucmd.h"
#include "log.h"
#include "unit.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

/* ---- fixture: a private directory for the files of one test -------------- */

static char dir[64];
static char last_path[PATH_MAX];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/gpucmd-check-config-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0) {
		/* a leftover temporary directory is only untidy */
	}
}

/* Write text to dir/name and return the path (valid until the next call). */
static const char *write_file(const char *name, const char *text)
{
	FILE *f;

	snprintf(last_path, sizeof(last_path), "%s/%s", dir, name);
	f = fopen(last_path, "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fputs(text, f) >= 0, 1);
	ck_assert_int_eq(fclose(f), 0);
	return last_path;
}

/* Load text over the defaults into cfg; it must succeed. */
/* The n ids are exactly want[nwant], in order. */
static void expect_ids(const uint32_t *ids, uint32_t n, const uint32_t *want,
		       uint32_t nwant)
{
	ck_assert_uint_eq(n, nwant);
	for (uint32_t i = 0; i < n; i++)
		ck_assert_msg(ids[i] == want[i], "id %u is %u, want %u", i,
			      ids[i], want[i]);
}

static void load_ok(struct config *cfg, const char *text)
{
	char err[512] = "";
	const char *path = write_file("good.conf", text);
	int rc;

	config_defaults(cfg);
	rc = config_load(cfg, path, err, sizeof(err));
	ck_assert_msg(rc == 0, "config_load: %d (%s) for:\n%s", rc, err, text);
	ck_assert_str_eq(cfg->path, path);
}

/*
 * Load text over the defaults; it must fail with GPUCMD_EINVAL and
 * "PATH:LINE: ..." where LINE is line (or also_line, when not 0: for
 * problems that may fairly be blamed on a section header or its first key),
 * and the message must contain needle.
 */
#define expect_bad(text, line, needle) \
	expect_bad_at(__LINE__, text, line, 0, needle)
#define expect_bad2(text, line, also_line, needle) \
	expect_bad_at(__LINE__, text, line, also_line, needle)
static void expect_bad_at(int at, const char *text, int line, int also_line,
			  const char *needle)
{
	struct config cfg, before;
	char err[512] = "";
	char want[PATH_MAX + 32], want2[PATH_MAX + 32];
	const char *path = write_file("bad.conf", text);
	int rc;

	config_defaults(&cfg);
	memcpy(&before, &cfg, sizeof(before));
	rc = config_load(&cfg, path, err, sizeof(err));
	ck_assert_msg(rc == GPUCMD_EINVAL,
		      "line %d: config_load returned %d (%s), expected "
		      "GPUCMD_EINVAL for:\n%s",
		      at, rc, err, text);
	snprintf(want, sizeof(want), "%s:%d: ", path, line);
	snprintf(want2, sizeof(want2), "%s:%d: ", path, also_line);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0 ||
			      (also_line != 0 &&
			       strncmp(err, want2, strlen(want2)) == 0),
		      "line %d: error '%s' does not start with '%s'%s%s", at,
		      err, want, also_line ? " or " : "",
		      also_line ? want2 : "");
	ck_assert_msg(strstr(err, needle) != NULL,
		      "line %d: error '%s' lacks '%s'", at, err, needle);
	/* A failed load leaves what it was loaded over alone. */
	ck_assert_msg(memcmp(&cfg, &before, sizeof(cfg)) == 0,
		      "line %d: a failed load changed the config", at);
}

/* ---- defaults ------------------------------------------------------------ */

START_TEST(defaults_are_the_documented_ones)
{
	struct config cfg;

	memset(&cfg, 0xa5, sizeof(cfg));
	config_defaults(&cfg);
	ck_assert_str_eq(cfg.path, "");
	ck_assert_str_eq(cfg.socket_path, GPUCMD_DEFAULT_SOCKET);
	ck_assert_uint_eq(cfg.socket_mode, 0660);
	ck_assert_str_eq(cfg.socket_group, "");
	ck_assert_str_eq(cfg.admin_group, "");
	ck_assert_int_eq(cfg.backend, CONFIG_BACKEND_AUTO);
	ck_assert_int_eq(cfg.device, 0);
	ck_assert_uint_eq(cfg.host_memory, 4 * GIB);
	ck_assert_uint_eq(cfg.host_fail_alloc_at, 0);
	ck_assert_uint_eq(cfg.pinned_memory, 256 * MIB);
	ck_assert_int_eq(cfg.log_level, LOG_LEVEL_INFO);
	ck_assert_str_eq(cfg.layout, "subslices");
	ck_assert_uint_eq(cfg.spin_us, 50);
	ck_assert_uint_eq(cfg.host_stream_nice, 10);
	ck_assert_uint_eq(cfg.stop_timeout, 60);
	ck_assert_uint_eq(cfg.limits.max_connections, 256);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, 64 * MIB);
	ck_assert_uint_eq(cfg.limits.max_ops_per_batch, 65536);
	ck_assert_uint_eq(cfg.limits.max_in_flight, 1024);
	ck_assert_uint_eq(cfg.limits.max_handles, 1u << 20);
	ck_assert_uint_eq(cfg.limits.max_streams, 16);
	ck_assert_uint_eq(cfg.limits.max_pending_bytes, 256 * MIB);
	ck_assert_uint_eq(cfg.limits.max_bytes_in_flight, 256 * MIB);
	ck_assert_uint_eq(cfg.limits.frame_timeout, 10);
	ck_assert_int_eq(cfg.unknown_services, CONFIG_UNKNOWN_ALLOW);
	ck_assert_str_eq(cfg.default_service.name, "");
	ck_assert_uint_eq(cfg.default_service.memory_limit, 0);
	ck_assert_uint_eq(cfg.default_service.region_limit, 0);
	ck_assert_uint_eq(cfg.default_service.set, 0);
	ck_assert_uint_eq(cfg.default_service.max_streams, 0);
	ck_assert_uint_eq(cfg.default_service.weight, 1);
	ck_assert_uint_eq(cfg.default_service.max_modules, 64);
	ck_assert_uint_eq(cfg.default_service.nuids, 0);
	ck_assert_uint_eq(cfg.default_service.ngids, 0);
	ck_assert_uint_eq(cfg.nservices, 0);
	ck_assert_ptr_null(cfg.services);
	ck_assert_ptr_null(config_find_service(&cfg, "anything"));
	config_free(&cfg);
	config_free(&cfg); /* twice is harmless */
}
END_TEST

/* ---- config_parse_size ---------------------------------------------------- */

START_TEST(parse_size_numbers_and_suffixes)
{
	static const struct {
		const char *s;
		uint64_t v;
	} good[] = {
		{ "0", 0 },
		{ "1", 1 },
		{ "4096", 4096 },
		{ "1K", KIB },
		{ "1k", KIB },
		{ "64K", 64 * KIB },
		{ "1KiB", KIB },
		{ "1kb", KIB },
		{ "1KB", KIB },
		{ "2M", 2 * MIB },
		{ "2m", 2 * MIB },
		{ "2MiB", 2 * MIB },
		{ "3G", 3 * GIB },
		{ "3GB", 3 * GIB },
		{ "1T", TIB },
		{ "0x10", 16 },
		{ "0X1f", 31 },
		{ "010G", 10 * GIB }, /* decimal, not octal */
		{ "0755", 755 },
		{ "0M", 0 },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215T", UINT64_C(16777215) << 40 },
		{ "17179869183G", UINT64_C(17179869183) << 30 },
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		uint64_t v = 12345;

		ck_assert_msg(config_parse_size(good[i].s, &v) == 0,
			      "'%s' was refused", good[i].s);
		ck_assert_msg(v == good[i].v, "'%s' gave %llu, expected %llu",
			      good[i].s, (unsigned long long)v,
			      (unsigned long long)good[i].v);
	}
}
END_TEST

START_TEST(parse_size_rejects_what_is_not_a_size)
{
	static const char *const bad[] = {
		"",
		"K",
		"abc",
		"-1",
		"+1",
		" 1",
		"1 ",
		"1 K",
		"1X",
		"1KK",
		"1Kx",
		"1KiBB",
		"1iB",
		"1B",
		"1.5M",
		"1e6",
		"0x",
		"12Q",
		/* Too large for 64 bits, with and without a suffix. */
		"18446744073709551616",
		"99999999999999999999999",
		"16777216T",
		"17179869184G",
		"17592186044416M",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 777;

		ck_assert_msg(config_parse_size(bad[i], &v) == -1,
			      "'%s' was accepted as %llu", bad[i],
			      (unsigned long long)v);
		ck_assert_msg(v == 777, "'%s' wrote the out-parameter", bad[i]);
	}
	{
		uint64_t v = 777;
		ck_assert_int_eq(config_parse_size(NULL, &v), -1);
		ck_assert_uint_eq(v, 777);
	}
}
END_TEST

/* ---- backends ------------------------------------------------------------- */

START_TEST(backend_names_round_trip)
{
	ck_assert_int_eq(config_backend_parse("auto"), CONFIG_BACKEND_AUTO);
	ck_assert_int_eq(config_backend_parse("host"), CONFIG_BACKEND_HOST);
	ck_assert_int_eq(config_backend_parse("cuda"), CONFIG_BACKEND_CUDA);
	ck_assert_int_eq(config_backend_parse("CUDA"), -1);
	ck_assert_int_eq(config_backend_parse("gpu"), -1);
	ck_assert_int_eq(config_backend_parse(""), -1);
	ck_assert_int_eq(config_backend_parse("host "), -1);
	ck_assert_str_eq(config_backend_name(CONFIG_BACKEND_AUTO), "auto");
	ck_assert_str_eq(config_backend_name(CONFIG_BACKEND_HOST), "host");
	ck_assert_str_eq(config_backend_name(CONFIG_BACKEND_CUDA), "cuda");
	for (int b = CONFIG_BACKEND_AUTO; b <= CONFIG_BACKEND_CUDA; b++)
		ck_assert_int_eq(config_backend_parse(config_backend_name(
					 (enum config_backend)b)),
				 b);
}
END_TEST

/* ---- devices -------------------------------------------------------------- */

/* An index, a UUID (or a start of one) or a PCI bus id; nothing else. */
START_TEST(device_index_uuid_or_bus_id)
{
	char id[64] = "stale";
	int index = 7;
	struct config cfg;
	char err[256];
	FILE *f;
	char path[] = "/tmp/check_config_dev_XXXXXX";
	int fd;

	ck_assert_int_eq(config_parse_device("3", &index, id, sizeof(id)), 0);
	ck_assert_int_eq(index, 3);
	ck_assert_str_eq(id, "");
	ck_assert_int_eq(config_parse_device("1024", &index, id, sizeof(id)),
			 0);
	ck_assert_int_eq(index, 1024);
	ck_assert_int_eq(
		config_parse_device("GPU-3b9c1a2e-0d4f-4e5a-9b1c-2d3e4f5a6b7c",
				    &index, id, sizeof(id)),
		0);
	ck_assert_int_eq(index, 0);
	ck_assert_str_eq(id, "GPU-3b9c1a2e-0d4f-4e5a-9b1c-2d3e4f5a6b7c");
	ck_assert_int_eq(config_parse_device("gpu-3B9C", &index, id,
					     sizeof(id)),
			 0);
	ck_assert_str_eq(id, "gpu-3B9C");
	ck_assert_int_eq(config_parse_device("0000:3b:00.0", &index, id,
					     sizeof(id)),
			 0);
	ck_assert_str_eq(id, "0000:3b:00.0");
	ck_assert_int_eq(config_parse_device("3b:00.0", &index, id, sizeof(id)),
			 0);
	ck_assert_str_eq(id, "3b:00.0");
	/* An index again empties the id. */
	ck_assert_int_eq(config_parse_device("2", &index, id, sizeof(id)), 0);
	ck_assert_str_eq(id, "");
	ck_assert_int_eq(index, 2);
	/* What is none of them leaves both alone. */
	const char *bad[] = { "",	 "1025",     "-1",	     "GPU-",
			      "GPU-xyz", "GPU 3b",   "3b.00",	     "3b-00-0",
			      "0x3",	 "MIG 1234", "0000:3b:00.0 " };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(config_parse_device(bad[i], &index, id,
						  sizeof(id)) == -1,
			      "'%s' taken for a device", bad[i]);
		ck_assert_int_eq(index, 2);
		ck_assert_str_eq(id, "");
	}
	/*
	 * A MIG instance's UUID, as nvidia-smi -L prints it (and the older
	 * MIG-GPU-.../gi/ci form): its own code, for a message that says how
	 * to choose one (CUDA_VISIBLE_DEVICES), both left alone.
	 */
	ck_assert_int_eq(
		config_parse_device("MIG-8a2f3b1c-4d5e-5f60-8a7b-9c0d1e2f3a4b",
				    &index, id, sizeof(id)),
		-2);
	ck_assert_int_eq(config_parse_device("mig-GPU-3b9c1a2e/1/0", &index, id,
					     sizeof(id)),
			 -2);
	ck_assert_int_eq(index, 2);
	ck_assert_str_eq(id, "");
	/* Longer than the id may be. */
	ck_assert_int_eq(config_parse_device("GPU-0123456789abcdef", &index, id,
					     8),
			 -1);

	/* In the file. */
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	ck_assert_ptr_nonnull(f);
	fputs("[daemon]\ndevice = GPU-3b9c1a2e\n", f);
	fclose(f);
	config_defaults(&cfg);
	ck_assert_int_eq(config_load(&cfg, path, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.device_id, "GPU-3b9c1a2e");
	ck_assert_int_eq(cfg.device, 0);
	config_free(&cfg);
	unlink(path);
}
END_TEST

/* ---- good files ----------------------------------------------------------- */

START_TEST(every_key)
{
	struct config cfg;
	const struct config_service *web, *batch;

	load_ok(&cfg, "; gpucmdd.conf written by check_config\n"
		      "# both comment styles\n"
		      "[daemon]\n"
		      "socket = /run/test/gpucmd.sock\n"
		      "socket_mode = 0640\n"
		      "socket_group = video\n"
		      "admin_group = wheel\n"
		      "backend = host\n"
		      "device = 3\n"
		      "host_memory = 512M\n"
		      "pinned_memory = 0x1000000\n"
		      "log_level = debug\n"
		      "layout = exclusive\n"
		      "spin_us = 0\n"
		      "host_stream_nice = 0\n"
		      "stop_timeout = 5\n"
		      "\n"
		      "[limits]\n"
		      "max_connections = 1000\n"
		      "max_frame_bytes = 1M\n"
		      "max_ops_per_batch = 4096\n"
		      "max_in_flight = 32\n"
		      "max_handles = 100000\n"
		      "max_streams = 8\n"
		      "max_pending_bytes = 64M\n"
		      "max_bytes_in_flight = 32M\n"
		      "frame_timeout = 0\n"
		      "\n"
		      "[services]\n"
		      "unknown = refuse\n"
		      "default_memory_limit = 1G\n"
		      "default_region_limit = 256M\n"
		      "default_max_streams = 4\n"
		      "default_weight = 10\n"
		      "\n"
		      "[service web]\n"
		      "memory_limit = 2G\n"
		      "region_limit = 512M\n"
		      "max_streams = 2\n"
		      "weight = 100\n"
		      "uids = 1000, 1001\n"
		      "gids = 100\n"
		      "\n"
		      "[service batch]\n"
		      "weight = 1\n");
	ck_assert_str_eq(cfg.socket_path, "/run/test/gpucmd.sock");
	ck_assert_uint_eq(cfg.socket_mode, 0640);
	ck_assert_str_eq(cfg.socket_group, "video");
	ck_assert_str_eq(cfg.admin_group, "wheel");
	ck_assert_int_eq(cfg.backend, CONFIG_BACKEND_HOST);
	ck_assert_int_eq(cfg.device, 3);
	ck_assert_uint_eq(cfg.host_memory, 512 * MIB);
	ck_assert_uint_eq(cfg.pinned_memory, 16 * MIB);
	ck_assert_int_eq(cfg.log_level, LOG_LEVEL_DEBUG);
	ck_assert_str_eq(cfg.layout, "exclusive");
	ck_assert_uint_eq(cfg.spin_us, 0);
	ck_assert_uint_eq(cfg.host_stream_nice, 0);
	ck_assert_uint_eq(cfg.stop_timeout, 5);
	ck_assert_uint_eq(cfg.limits.max_connections, 1000);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, MIB);
	ck_assert_uint_eq(cfg.limits.max_ops_per_batch, 4096);
	ck_assert_uint_eq(cfg.limits.max_in_flight, 32);
	ck_assert_uint_eq(cfg.limits.max_handles, 100000);
	ck_assert_uint_eq(cfg.limits.max_streams, 8);
	ck_assert_uint_eq(cfg.limits.max_pending_bytes, 64 * MIB);
	ck_assert_uint_eq(cfg.limits.max_bytes_in_flight, 32 * MIB);
	ck_assert_uint_eq(cfg.limits.frame_timeout, 0);
	ck_assert_int_eq(cfg.unknown_services, CONFIG_UNKNOWN_REFUSE);
	ck_assert_uint_eq(cfg.default_service.memory_limit, GIB);
	ck_assert_uint_eq(cfg.default_service.region_limit, 256 * MIB);
	ck_assert_uint_eq(cfg.default_service.max_streams, 4);
	ck_assert_uint_eq(cfg.default_service.weight, 10);
	ck_assert_uint_eq(cfg.nservices, 2);

	web = config_find_service(&cfg, "web");
	ck_assert_ptr_nonnull(web);
	ck_assert_str_eq(web->name, "web");
	ck_assert_uint_eq(web->memory_limit, 2 * GIB);
	ck_assert_uint_eq(web->region_limit, 512 * MIB);
	ck_assert_uint_eq(web->max_streams, 2);
	ck_assert_uint_eq(web->weight, 100);
	ck_assert_uint_eq(web->nuids, 2);
	ck_assert_uint_eq(web->uids[0], 1000);
	ck_assert_uint_eq(web->uids[1], 1001);
	ck_assert_uint_eq(web->ngids, 1);
	ck_assert_uint_eq(web->gids[0], 100);

	/* What batch does not say comes from the [services] defaults. */
	batch = config_find_service(&cfg, "batch");
	ck_assert_ptr_nonnull(batch);
	ck_assert_uint_eq(batch->weight, 1);
	ck_assert_uint_eq(batch->memory_limit, GIB);
	ck_assert_uint_eq(batch->region_limit, 256 * MIB);
	ck_assert_uint_eq(batch->max_streams, 4);
	ck_assert_uint_eq(batch->nuids, 0);
	ck_assert_uint_eq(batch->ngids, 0);

	ck_assert_ptr_null(config_find_service(&cfg, "Web"));
	ck_assert_ptr_null(config_find_service(&cfg, "we"));
	ck_assert_ptr_null(config_find_service(&cfg, ""));
	config_free(&cfg);
	ck_assert_uint_eq(cfg.nservices, 0);
	ck_assert_ptr_null(cfg.services);
}
END_TEST

START_TEST(each_choice_of_the_enumerations)
{
	static const char *const levels[] = { "error", "warning", "notice",
					      "info", "debug" };
	static const int level_values[] = { LOG_LEVEL_ERR, LOG_LEVEL_WARNING,
					    LOG_LEVEL_NOTICE, LOG_LEVEL_INFO,
					    LOG_LEVEL_DEBUG };
	struct config cfg;
	char text[256];

	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		snprintf(text, sizeof(text), "[daemon]\nlog_level = %s\n",
			 levels[i]);
		load_ok(&cfg, text);
		ck_assert_int_eq(cfg.log_level, level_values[i]);
		config_free(&cfg);
	}
	load_ok(&cfg, "[daemon]\nbackend = cuda\nlayout = subslices\n"
		      "[services]\nunknown = allow\n");
	ck_assert_int_eq(cfg.backend, CONFIG_BACKEND_CUDA);
	ck_assert_str_eq(cfg.layout, "subslices");
	ck_assert_int_eq(cfg.unknown_services, CONFIG_UNKNOWN_ALLOW);
	config_free(&cfg);
	load_ok(&cfg, "[daemon]\nbackend = auto\n");
	ck_assert_int_eq(cfg.backend, CONFIG_BACKEND_AUTO);
	config_free(&cfg);
}
END_TEST

START_TEST(sizes_with_suffixes_and_range_edges)
{
	struct config cfg;
	const struct config_service *s;

	load_ok(&cfg, "[daemon]\n"
		      "host_memory = 1M\n"
		      "[limits]\n"
		      "max_frame_bytes = 4K\n"
		      "max_pending_bytes = 64KiB\n"
		      "max_connections = 1\n"
		      "max_streams = 64\n"
		      "max_ops_per_batch = 16777216\n"
		      "max_handles = 1G\n"
		      "[service a]\n"
		      "memory_limit = 1536K\n"
		      "weight = 1000\n"
		      "max_streams = 1\n"
		      "[service b]\n"
		      "memory_limit = 0\n"
		      "[service c]\n"
		      "memory_limit = 3t\n");
	ck_assert_uint_eq(cfg.host_memory, MIB);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, 4096);
	ck_assert_uint_eq(cfg.limits.max_pending_bytes, 65536);
	ck_assert_uint_eq(cfg.limits.max_connections, 1);
	ck_assert_uint_eq(cfg.limits.max_streams, 64);
	ck_assert_uint_eq(cfg.limits.max_ops_per_batch, 1u << 24);
	ck_assert_uint_eq(cfg.limits.max_handles, 1u << 30);
	s = config_find_service(&cfg, "a");
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(s->memory_limit, 1536 * KIB);
	ck_assert_uint_eq(s->weight, 1000);
	ck_assert_uint_eq(s->max_streams, 1);
	s = config_find_service(&cfg, "b");
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(s->memory_limit, 0);
	s = config_find_service(&cfg, "c");
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(s->memory_limit, 3 * TIB);
	config_free(&cfg);
	load_ok(&cfg, "[limits]\nmax_frame_bytes = 1G\nmax_connections = 1M\n");
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, GIB);
	ck_assert_uint_eq(cfg.limits.max_connections, 1u << 20);
	config_free(&cfg);
}
END_TEST

START_TEST(socket_mode_is_octal)
{
	struct config cfg;

	load_ok(&cfg, "[daemon]\nsocket_mode = 0666\n");
	ck_assert_uint_eq(cfg.socket_mode, 0666);
	config_free(&cfg);
	/* Without the leading 0 it is octal all the same. */
	load_ok(&cfg, "[daemon]\nsocket_mode = 660\n");
	ck_assert_uint_eq(cfg.socket_mode, 0660);
	config_free(&cfg);
	load_ok(&cfg, "[daemon]\nsocket_mode = 0600\n");
	ck_assert_uint_eq(cfg.socket_mode, 0600);
	config_free(&cfg);
	load_ok(&cfg, "[daemon]\nsocket_mode = 0777\n");
	ck_assert_uint_eq(cfg.socket_mode, 0777);
	config_free(&cfg);

	expect_bad("[daemon]\nsocket_mode = 0888\n", 2, "socket_mode = 0888");
	expect_bad("[daemon]\nsocket_mode = 01000\n", 2, "octal mode");
	expect_bad("[daemon]\nsocket_mode = rw-rw----\n", 2, "octal mode");
	expect_bad("[daemon]\nsocket_mode = 0660x\n", 2, "octal mode");
	expect_bad("[daemon]\nsocket_mode = -1\n", 2, "octal mode");
}
END_TEST

/* An empty value is not a mode: it must not silently become 0000. */
START_TEST(socket_mode_empty_is_refused)
{
	expect_bad("[daemon]\nsocket_mode =\n", 2, "socket_mode");
}
END_TEST

START_TEST(ids_by_number_and_by_name)
{
	struct config cfg;
	const struct config_service *s;
	struct passwd *nobody = getpwnam("nobody");
	struct group *root_group = getgrnam("root");

	ck_assert_ptr_nonnull(nobody);
	ck_assert_ptr_nonnull(root_group);
	load_ok(&cfg, "[service ids]\n"
		      "uids = root, 0, 1000,nobody\t4242\n"
		      "gids = root 7, 100\n");
	s = config_find_service(&cfg, "ids");
	ck_assert_ptr_nonnull(s);
	expect_ids(s->uids, s->nuids,
		   (const uint32_t[]){ 0, 0, 1000, nobody->pw_uid, 4242 }, 5);
	expect_ids(s->gids, s->ngids,
		   (const uint32_t[]){ root_group->gr_gid, 7, 100 }, 3);
	config_free(&cfg);

	/* Exactly CONFIG_MAX_IDS is fine. */
	{
		char text[512];
		int n = snprintf(text, sizeof(text), "[service many]\nuids =");

		for (int i = 0; i < CONFIG_MAX_IDS; i++)
			n += snprintf(text + n, sizeof(text) - (size_t)n, " %d",
				      i + 1);
		snprintf(text + n, sizeof(text) - (size_t)n, "\n");
		load_ok(&cfg, text);
		s = config_find_service(&cfg, "many");
		ck_assert_ptr_nonnull(s);
		ck_assert_uint_eq(s->nuids, CONFIG_MAX_IDS);
		ck_assert_uint_eq(s->uids[CONFIG_MAX_IDS - 1], CONFIG_MAX_IDS);
		config_free(&cfg);

		n = snprintf(text, sizeof(text), "[service many]\ngids =");
		for (int i = 0; i <= CONFIG_MAX_IDS; i++)
			n += snprintf(text + n, sizeof(text) - (size_t)n, " %d",
				      i + 1);
		snprintf(text + n, sizeof(text) - (size_t)n, "\n");
		expect_bad(text, 2, "more than 32 ids");
	}
	expect_bad(
		"[service x]\nweight = 2\nuids = 1000, no-such-user-gpucmd\n",
		3, "no user named 'no-such-user-gpucmd'");
	expect_bad("[service x]\n\ngids = no-such-group-gpucmd\n", 3,
		   "no group named 'no-such-group-gpucmd'");
	expect_bad("[service x]\nuids = 12abc\n", 2, "uids");
}
END_TEST

/*
 * A uid that does not fit uid_t must be refused, not wrapped: 4294968296 is
 * 1000 modulo 2^32, so wrapping would let uid 1000 in; "-5" is not a uid.
 */
START_TEST(ids_out_of_range_are_refused)
{
	expect_bad("[service x]\nuids = 4294968296\n", 2, "uids");
	expect_bad("[service x]\nuids = -5\n", 2, "uids");
	expect_bad("[service x]\ngids = 99999999999999999999\n", 2, "gids");
}
END_TEST

START_TEST(comments_and_whitespace)
{
	struct config cfg;
	const struct config_service *s;

	load_ok(&cfg, "# a comment\n"
		      "; another\n"
		      "\n"
		      "[daemon]   \n"
		      "socket_mode=0600\n"
		      "backend   =   host   \n"
		      "[service spaced] ; trailing comment\n"
		      "memory_limit = 2M ; two mebibytes\n"
		      "weight = 3\n");
	ck_assert_uint_eq(cfg.socket_mode, 0600);
	ck_assert_int_eq(cfg.backend, CONFIG_BACKEND_HOST);
	s = config_find_service(&cfg, "spaced");
	ck_assert_ptr_nonnull(s);
	ck_assert_uint_eq(s->memory_limit, 2 * MIB);
	config_free(&cfg);
}
END_TEST

START_TEST(multiple_service_sections)
{
	struct config cfg;
	const struct config_service *a, *b, *c;

	load_ok(&cfg, "[service alpha]\n"
		      "memory_limit = 1M\n"
		      "[service beta.2]\n"
		      "memory_limit = 2M\n"
		      "weight = 20\n"
		      "[service Gamma_3-x]\n"
		      "max_streams = 3\n"
		      "[limits]\n"
		      "max_streams = 9\n"
		      "; the same section again adds to it\n"
		      "[service alpha]\n"
		      "weight = 5\n"
		      "[service \"quoted\"]\n"
		      "weight = 6\n");
	ck_assert_uint_eq(cfg.nservices, 4);
	a = config_find_service(&cfg, "alpha");
	b = config_find_service(&cfg, "beta.2");
	c = config_find_service(&cfg, "Gamma_3-x");
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(c);
	ck_assert_ptr_ne(a, b);
	ck_assert_ptr_ne(b, c);
	ck_assert_uint_eq(a->memory_limit, MIB);
	ck_assert_uint_eq(a->weight, 5);
	ck_assert_uint_eq(b->memory_limit, 2 * MIB);
	ck_assert_uint_eq(b->weight, 20);
	ck_assert_uint_eq(c->max_streams, 3);
	ck_assert_uint_eq(c->memory_limit, 0);
	ck_assert_uint_eq(c->weight, 1);
	ck_assert_uint_eq(cfg.limits.max_streams, 9);
	ck_assert_ptr_nonnull(config_find_service(&cfg, "quoted"));
	ck_assert_uint_eq(config_find_service(&cfg, "quoted")->weight, 6);
	ck_assert_ptr_null(config_find_service(&cfg, "gamma_3-x"));
	ck_assert_ptr_null(config_find_service(&cfg, "delta"));
	config_free(&cfg);
}
END_TEST

START_TEST(service_defaults_from_services_section)
{
	struct config cfg;
	const struct config_service *a, *b;

	load_ok(&cfg, "[services]\n"
		      "default_memory_limit = 2M\n"
		      "default_max_streams = 3\n"
		      "default_weight = 7\n"
		      "[service a]\n"
		      "weight = 2\n"
		      "[service b]\n"
		      "memory_limit = 5M\n"
		      "uids = 2000, 2001\n");
	ck_assert_uint_eq(cfg.default_service.memory_limit, 2 * MIB);
	ck_assert_uint_eq(cfg.default_service.max_streams, 3);
	ck_assert_uint_eq(cfg.default_service.weight, 7);
	a = config_find_service(&cfg, "a");
	b = config_find_service(&cfg, "b");
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(a->memory_limit, 2 * MIB);
	ck_assert_uint_eq(a->max_streams, 3);
	ck_assert_uint_eq(a->weight, 2);
	ck_assert_uint_eq(a->nuids, 0);
	ck_assert_uint_eq(b->memory_limit, 5 * MIB);
	ck_assert_uint_eq(b->max_streams, 3);
	ck_assert_uint_eq(b->weight, 7);
	ck_assert_uint_eq(b->nuids, 2);
	ck_assert_uint_eq(b->uids[0], 2000);
	ck_assert_uint_eq(b->uids[1], 2001);
	config_free(&cfg);
}
END_TEST

/*
 * "default_" + any service key is accepted in [services]; default_uids and
 * default_gids must then do something (be the list of services that give
 * none), or be refused as unknown keys: accepted and ignored is the one
 * wrong answer, since an admin would believe access is restricted.
 */
START_TEST(default_uids_apply_or_are_refused)
{
	struct config cfg;
	char err[512] = "";
	const char *path;
	const struct config_service *a, *b;
	int rc;

	path = write_file("ids.conf", "[services]\n"
				      "default_uids = 1000\n"
				      "default_gids = 100\n"
				      "[service a]\n"
				      "weight = 2\n"
				      "[service b]\n"
				      "uids = 2000\n"
				      "[service c]\n"
				      "gids = 4242\n");
	config_defaults(&cfg);
	rc = config_load(&cfg, path, err, sizeof(err));
	if (rc != 0) {
		ck_assert_int_eq(rc, GPUCMD_EINVAL);
		ck_assert_msg(strstr(err, ":2: ") != NULL &&
				      strstr(err, "default_uids") != NULL,
			      "error: %s", err);
		return;
	}
	ck_assert_uint_eq(cfg.default_service.nuids, 1);
	ck_assert_uint_eq(cfg.default_service.ngids, 1);
	a = config_find_service(&cfg, "a");
	b = config_find_service(&cfg, "b");
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_msg(a->nuids == 1 && a->uids[0] == 1000,
		      "default_uids = 1000 was accepted, yet [service a] has "
		      "%u uids",
		      a->nuids);
	ck_assert_msg(a->ngids == 1 && a->gids[0] == 100,
		      "default_gids = 100 was accepted, yet [service a] has "
		      "%u gids",
		      a->ngids);
	/*
	 * A service's own list replaces both defaults: [service b] names
	 * users only and admits no default group, [service c] names a group
	 * only and admits no default user.
	 */
	ck_assert_uint_eq(b->nuids, 1);
	ck_assert_uint_eq(b->uids[0], 2000);
	ck_assert_uint_eq(b->ngids, 0);
	{
		const struct config_service *c = config_find_service(&cfg, "c");

		ck_assert_ptr_nonnull(c);
		ck_assert_msg(c->nuids == 0,
			      "[service c] gids = 4242 also "
			      "admits %u default uid(s)",
			      c->nuids);
		ck_assert_uint_eq(c->ngids, 1);
		ck_assert_uint_eq(c->gids[0], 4242);
	}
	config_free(&cfg);
}
END_TEST

/*
 * The defaults of [services] are defaults whatever the order of the
 * sections: a [service] written above [services] gets them too.
 */
START_TEST(service_defaults_whatever_the_order)
{
	struct config cfg;
	const struct config_service *early;

	load_ok(&cfg, "[service early]\n"
		      "max_streams = 2\n"
		      "[services]\n"
		      "default_memory_limit = 4M\n"
		      "default_weight = 9\n");
	early = config_find_service(&cfg, "early");
	ck_assert_ptr_nonnull(early);
	ck_assert_uint_eq(early->max_streams, 2);
	ck_assert_msg(early->memory_limit == 4 * MIB,
		      "[service early] above [services] got memory_limit %llu, "
		      "not default_memory_limit 4M",
		      (unsigned long long)early->memory_limit);
	ck_assert_uint_eq(early->weight, 9);
	config_free(&cfg);
}
END_TEST

/*
 * region_limit follows memory_limit: a size with the usual suffixes, 0 for
 * none, and [services] default_region_limit for every service that does
 * not set its own, whatever the order of the sections; a service's own 0
 * beats a non-zero default (it is set, not missing), and the two limits
 * are independent of each other.
 */
START_TEST(region_limit_sizes_and_inheritance)
{
	struct config cfg;
	const struct config_service *own, *zero, *dflt, *early, *mem;

	load_ok(&cfg, "[service early]\n"
		      "weight = 3\n"
		      "[services]\n"
		      "default_region_limit = 64M\n"
		      "default_memory_limit = 1G\n"
		      "[service own]\n"
		      "region_limit = 1536K\n"
		      "[service zero]\n"
		      "region_limit = 0\n"
		      "[service dflt]\n"
		      "memory_limit = 2G\n"
		      "[service mem]\n"
		      "region_limit = 0x1000\n"
		      "memory_limit = 0\n"
		      "[service own]\n"
		      "max_streams = 2\n");
	ck_assert_uint_eq(cfg.default_service.region_limit, 64 * MIB);
	ck_assert_uint_eq(cfg.default_service.memory_limit, GIB);
	ck_assert_uint_eq(cfg.nservices, 5);
	own = config_find_service(&cfg, "own");
	zero = config_find_service(&cfg, "zero");
	dflt = config_find_service(&cfg, "dflt");
	early = config_find_service(&cfg, "early");
	mem = config_find_service(&cfg, "mem");
	ck_assert_ptr_nonnull(own);
	ck_assert_ptr_nonnull(zero);
	ck_assert_ptr_nonnull(dflt);
	ck_assert_ptr_nonnull(early);
	ck_assert_ptr_nonnull(mem);
	/* Its own value, kept when the section comes back for another key. */
	ck_assert_uint_eq(own->region_limit, 1536 * KIB);
	ck_assert_uint_eq(own->memory_limit, GIB);
	ck_assert_uint_eq(own->max_streams, 2);
	ck_assert(own->set & CONFIG_SET_REGION_LIMIT);
	ck_assert(!(own->set & CONFIG_SET_MEMORY_LIMIT));
	/* An explicit 0 is "no limit", not "take the default". */
	ck_assert_uint_eq(zero->region_limit, 0);
	ck_assert(zero->set & CONFIG_SET_REGION_LIMIT);
	/* Unset: the default, whether above or below [services]. */
	ck_assert_uint_eq(dflt->region_limit, 64 * MIB);
	ck_assert_uint_eq(dflt->memory_limit, 2 * GIB);
	ck_assert(!(dflt->set & CONFIG_SET_REGION_LIMIT));
	ck_assert_msg(early->region_limit == 64 * MIB,
		      "[service early] above [services] got region_limit %llu, "
		      "not default_region_limit 64M",
		      (unsigned long long)early->region_limit);
	ck_assert_uint_eq(early->memory_limit, GIB);
	ck_assert_uint_eq(early->weight, 3);
	/* Neither limit leaks into the other. */
	ck_assert_uint_eq(mem->region_limit, 4096);
	ck_assert_uint_eq(mem->memory_limit, 0);
	config_free(&cfg);

	/* Without any default, services have no region limit. */
	load_ok(&cfg, "[service plain]\nmemory_limit = 5M\n"
		      "[service big]\nregion_limit = 3t\n");
	ck_assert_uint_eq(cfg.default_service.region_limit, 0);
	ck_assert_uint_eq(config_find_service(&cfg, "plain")->region_limit, 0);
	ck_assert_uint_eq(config_find_service(&cfg, "plain")->memory_limit,
			  5 * MIB);
	ck_assert_uint_eq(config_find_service(&cfg, "big")->region_limit,
			  3 * TIB);
	config_free(&cfg);
}
END_TEST

/*
 * max_modules: 0 (built-ins only) to 1024 (the daemon's module cache),
 * default 64, [services] default_max_modules for the services that do
 * not set it.
 */
START_TEST(max_modules_range_and_inheritance)
{
	struct config cfg;

	load_ok(&cfg, "[service early]\n"
		      "weight = 2\n"
		      "[services]\n"
		      "default_max_modules = 8\n"
		      "[service none]\n"
		      "max_modules = 0\n"
		      "[service all]\n"
		      "max_modules = 1024\n");
	ck_assert_uint_eq(cfg.default_service.max_modules, 8);
	ck_assert_uint_eq(config_find_service(&cfg, "early")->max_modules, 8);
	ck_assert_uint_eq(config_find_service(&cfg, "none")->max_modules, 0);
	ck_assert_uint_eq(config_find_service(&cfg, "all")->max_modules, 1024);
	config_free(&cfg);
	load_ok(&cfg, "[service plain]\nweight = 1\n");
	ck_assert_uint_eq(config_find_service(&cfg, "plain")->max_modules, 64);
	config_free(&cfg);
	expect_bad("[service x]\nmax_modules = 1025\n", 2, "max_modules");
	expect_bad("[services]\ndefault_max_modules = -1\n", 2, "max_modules");
}
END_TEST

/*
 * max_bytes_in_flight of a service (all its connections): default 1G,
 * [services] default_max_bytes_in_flight for the services that do not set
 * it, 0 for no bound.
 */
START_TEST(service_bytes_in_flight_and_inheritance)
{
	struct config cfg;

	load_ok(&cfg, "[service early]\n"
		      "weight = 2\n"
		      "[services]\n"
		      "default_max_bytes_in_flight = 2G\n"
		      "[service none]\n"
		      "max_bytes_in_flight = 0\n"
		      "[service small]\n"
		      "max_bytes_in_flight = 64M\n");
	ck_assert_uint_eq(cfg.default_service.max_bytes_in_flight, 2ull << 30);
	ck_assert_uint_eq(config_find_service(&cfg, "early")
				  ->max_bytes_in_flight,
			  2ull << 30);
	ck_assert_uint_eq(config_find_service(&cfg, "none")
				  ->max_bytes_in_flight,
			  0);
	ck_assert_uint_eq(config_find_service(&cfg, "small")
				  ->max_bytes_in_flight,
			  64ull << 20);
	config_free(&cfg);
	load_ok(&cfg, "[service plain]\nweight = 1\n");
	ck_assert_uint_eq(config_find_service(&cfg, "plain")
				  ->max_bytes_in_flight,
			  1ull << 30);
	config_free(&cfg);
	expect_bad("[service x]\nmax_bytes_in_flight = lots\n", 2,
		   "max_bytes_in_flight");
}
END_TEST

/*
 * max_connections of a service: none by default ([limits] max_connections
 * alone), [services] default_max_connections for the services that do not
 * set it.
 */
START_TEST(service_max_connections_and_inheritance)
{
	struct config cfg;

	load_ok(&cfg, "[service plain]\nweight = 1\n");
	ck_assert_uint_eq(config_find_service(&cfg, "plain")->max_connections,
			  0);
	config_free(&cfg);
	load_ok(&cfg, "[service early]\n"
		      "weight = 2\n"
		      "[services]\n"
		      "default_max_connections = 16\n"
		      "[service few]\n"
		      "max_connections = 2\n");
	ck_assert_uint_eq(cfg.default_service.max_connections, 16);
	ck_assert_uint_eq(config_find_service(&cfg, "early")->max_connections,
			  16);
	ck_assert_uint_eq(config_find_service(&cfg, "few")->max_connections, 2);
	config_free(&cfg);
	expect_bad("[service x]\nmax_connections = many\n", 2,
		   "max_connections");
	expect_bad("[services]\ndefault_max_connections = 1048577\n", 2,
		   "max_connections");
}
END_TEST

/*
 * "[service idle]" with no keys declares a service with the default limits:
 * under "unknown = refuse" it is the way to admit a service without
 * changing anything else.
 */
START_TEST(empty_service_section_declares_the_service)
{
	struct config cfg;
	const struct config_service *s;

	load_ok(&cfg, "[services]\n"
		      "unknown = refuse\n"
		      "default_weight = 4\n"
		      "[service idle]\n"
		      "[service busy]\n"
		      "weight = 2\n");
	ck_assert_ptr_nonnull(config_find_service(&cfg, "busy"));
	s = config_find_service(&cfg, "idle");
	ck_assert_msg(s != NULL, "an empty [service idle] section was dropped");
	ck_assert_uint_eq(s->weight, 4);
	ck_assert_uint_eq(cfg.nservices, 2);
	config_free(&cfg);
	/* And an empty section that is not valid is an error, not nothing. */
	expect_bad2("[daemon]\nbackend = host\n[bogus]\n", 3, 3,
		    "unknown section [bogus]");
}
END_TEST

/*
 * Service names may be 63 characters long (SERVICE_NAME_MAX); a section
 * for a long name must configure that name, or be refused, never configure
 * a truncated one.
 */
START_TEST(long_service_names_are_kept_whole)
{
	char name[64], text[256];
	struct config cfg;
	char err[512] = "";
	const char *path;
	int rc;

	memset(name, 'n', 60);
	name[60] = '\0';
	snprintf(text, sizeof(text), "[service %s]\nweight = 2\n", name);
	path = write_file("long.conf", text);
	config_defaults(&cfg);
	rc = config_load(&cfg, path, err, sizeof(err));
	if (rc == 0) {
		for (uint32_t i = 0; i < cfg.nservices; i++)
			ck_assert_msg(strcmp(cfg.services[i].name, name) == 0,
				      "[service <60 chars>] configured service "
				      "'%s' (%zu chars)",
				      cfg.services[i].name,
				      strlen(cfg.services[i].name));
		ck_assert_ptr_nonnull(config_find_service(&cfg, name));
	} else {
		ck_assert_int_eq(rc, GPUCMD_EINVAL);
		ck_assert_msg(strstr(err, ":1: ") != NULL, "error: %s", err);
	}
	config_free(&cfg);

	/* Over 63 characters: not a valid name, so an error. */
	memset(name, 'm', 63);
	name[63] = '\0';
	snprintf(text, sizeof(text), "[service %sXYZ]\nweight = 2\n", name);
	expect_bad2(text, 1, 2, "service");
}
END_TEST

/* ---- bad files ------------------------------------------------------------ */

START_TEST(unknown_sections_and_keys)
{
	expect_bad2("[daemon]\nsocket_mode = 0660\n\n[bogus]\nx = 1\n", 4, 5,
		    "unknown section [bogus]");
	expect_bad(
		"key_before_any_section = 1\n", 1,
		"'key_before_any_section' comes before any section: put it under [daemon]");
	expect_bad2("[servicex]\nweight = 1\n", 1, 2,
		    "unknown section [servicex]");
	expect_bad2("[service]\nweight = 1\n", 1, 2,
		    "unknown section [service]");
	expect_bad("[daemon]\nbackend = host\nsockett = /x\n", 3,
		   "unknown key 'sockett' in [daemon]");
	expect_bad("[limits]\nmax_connections = 5\nmax_conections = 5\n", 3,
		   "unknown key 'max_conections' in [limits]");
	expect_bad("[services]\nunknown = allow\ndefault_colour = red\n", 3,
		   "unknown key");
	/* [services] keys are named as the file has them, default_ and all. */
	expect_bad("[services]\ndefault_memory_limt = 1M\n", 2,
		   "unknown key 'default_memory_limt' in [services]");
	expect_bad("[services]\ndefault_memory_limit = lots\n", 2,
		   "default_memory_limit = lots");
	expect_bad("[services]\ndefault_uids = nosuchuser-gpucmd\n", 2,
		   "default_uids: no user named");
	expect_bad("[services]\nmemory_limit = 1M\n", 2,
		   "unknown key 'memory_limit' in [services]");
	expect_bad("[services]\nregion_limit = 1M\n", 2,
		   "unknown key 'region_limit' in [services]");
	expect_bad("[services]\nregion_limit = 1M\n", 2,
		   "default_region_limit");
	expect_bad("[limits]\nregion_limit = 1M\n", 2,
		   "unknown key 'region_limit' in [limits]");
	expect_bad("[service web]\nregions_limit = 1M\n", 2,
		   "unknown key 'regions_limit' in a service section");
	expect_bad("[service web]\nregions_limit = 1M\n", 2, "region_limit");
	expect_bad("[service web]\nweight = 2\n\nmemory = 1M\n", 4,
		   "unknown key 'memory' in a service section");
	/* Keys are case-sensitive, like the documentation writes them. */
	expect_bad("[daemon]\nBackend = host\n", 2, "unknown key 'Backend'");
}
END_TEST

/*
 * Lines and sections past what a config file can hold are named at their
 * line: a line over the reader's buffer (and one over inih's, shorter), a
 * service section whose name is not one (even with no key under it), and
 * more service sections than the daemon keeps.  Blanks around a header
 * and its name are not part of the name.
 */
START_TEST(long_lines_bad_headers_and_too_many_sections)
{
	struct config cfg;
	char *text;
	size_t cap = 64 * 4100, len = 0;

	text = malloc(cap);
	ck_assert_ptr_nonnull(text);
	/* 2000 characters: past the 1 KiB line buffer. */
	len = (size_t)snprintf(text, cap, "[daemon]\n# ");
	memset(text + len, 'x', 2000);
	len += 2000;
	snprintf(text + len, cap - len, "\nbackend = host\n");
	expect_bad(text, 2, "line is longer than 1022 characters");
	/* 600: within the buffer, past inih's line (200 by default). */
	len = (size_t)snprintf(text, cap, "[daemon]\nbackend = host\n# ");
	memset(text + len, 'y', 600);
	len += 600;
	snprintf(text + len, cap - len, "\n");
	expect_bad(text, 3, "line is longer than");
	/* A bad name, with no key to report it at: at its header. */
	expect_bad("[daemon]\nbackend = host\n[service no way!]\n", 3,
		   "'no way!' is not a valid service name");
	/* Blanks around the header and the name. */
	load_ok(&cfg, "  [service   web\t ]  \nweight = 3\n");
	ck_assert_ptr_nonnull(config_find_service(&cfg, "web"));
	ck_assert_uint_eq(config_find_service(&cfg, "web")->weight, 3);
	config_free(&cfg);
	/* 4097 service sections, of four services. */
	len = 0;
	for (int i = 0; i <= 4096; i++)
		len += (size_t)snprintf(text + len, cap - len,
					"[service s%d]\n", i % 4);
	expect_bad(text, 4097, "more than 4096 service sections");
	/*
	 * 1024 services, as many as the daemon keeps, and then one more:
	 * it could never connect (listed services are never retired).
	 */
	len = 0;
	for (int i = 0; i < 1024; i++)
		len += (size_t)snprintf(text + len, cap - len,
					"[service s%d]\n", i);
	load_ok(&cfg, text);
	ck_assert_uint_eq(cfg.nservices, 1024);
	config_free(&cfg);
	snprintf(text + len, cap - len, "[service s0]\n[service one-more]\n");
	expect_bad(text, 1026,
		   "[service one-more]: more than 1024 services, "
		   "the most the daemon keeps");
	free(text);
}
END_TEST

/*
 * inih reads an indented line after a key as that key again, with the
 * line as its whole value: "uids = 0, 1000" then "  2000" left uid 2000
 * alone, and "memory_limit = 1G" then "  64G" 64G, each without a word.
 * Indented keys are keys; an indented line without one is refused; a
 * list key given again adds up; an empty list (which read as "anyone",
 * over default_uids) is refused.
 */
START_TEST(indented_lines_repeated_and_empty_id_lists)
{
	struct config cfg;
	const struct config_service *a;

	expect_bad("[service a]\nuids = 0, 1000\n   2000\n", 3,
		   "an indented line without a key: continuation lines are "
		   "not read");
	expect_bad("[service a]\nmemory_limit = 1G\n\t64G\n", 3,
		   "an indented line without a key");
	load_ok(&cfg, "[services]\ndefault_uids = 4242\n"
		      "[service a]\n  uids = 0, 1000\n\tuids = 2000\n"
		      "  memory_limit = 1G\n  ; an indented comment\n   \n"
		      "[service b]\n[service a]\ngids = 0\ngids = 5\n");
	a = config_find_service(&cfg, "a");
	ck_assert_ptr_nonnull(a);
	expect_ids(a->uids, a->nuids, (const uint32_t[]){ 0, 1000, 2000 }, 3);
	expect_ids(a->gids, a->ngids, (const uint32_t[]){ 0, 5 }, 2);
	ck_assert_uint_eq(a->memory_limit, 1ull << 30);
	/* b set neither: the defaults. */
	ck_assert_uint_eq(config_find_service(&cfg, "b")->nuids, 1);
	ck_assert_uint_eq(config_find_service(&cfg, "b")->uids[0], 4242);
	config_free(&cfg);
	expect_bad("[services]\ndefault_uids = 4242\n[service a]\nuids =\n", 4,
		   "uids is empty: list at least one user, or leave the "
		   "key out");
	expect_bad("[service a]\ngids = , \n", 2,
		   "gids is empty: list at "
		   "least one group");
	expect_bad("[services]\ndefault_uids =\n", 2, "default_uids is empty");
	/* 32 ids over two lines, then one more. */
	expect_bad(
		"[service a]\nuids = 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"
		"uids = 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32\n"
		"uids = 33\n",
		4,
		"uids lists more than 32 ids (all its "
		"lines together)");
}
END_TEST

START_TEST(bad_values)
{
	/* Sizes. */
	expect_bad("[service web]\nmemory_limit = 12Q\n", 2,
		   "memory_limit = 12Q");
	expect_bad("[service web]\nmemory_limit = 1.5G\n", 2, "memory_limit");
	expect_bad("[service web]\nmemory_limit = -1\n", 2, "memory_limit");
	expect_bad("[service web]\nmemory_limit = lots\n", 2,
		   "suffixes K, M, G, T");
	expect_bad("[service web]\nregion_limit = 12Q\n", 2,
		   "region_limit = 12Q");
	expect_bad("[service web]\nregion_limit = 0.5G\n", 2, "region_limit");
	expect_bad("[service web]\nregion_limit = -4K\n", 2,
		   "suffixes K, M, G, T");
	expect_bad("[service web]\nregion_limit =\n", 2, "region_limit");
	expect_bad("[service web]\nregion_limit = 99999999999999999999\n", 2,
		   "region_limit");
	expect_bad("[service web]\nregion_limit = 17179869184T\n", 2,
		   "region_limit");
	expect_bad("[services]\ndefault_region_limit = many\n", 2,
		   "region_limit = many");
	expect_bad("[daemon]\nhost_memory = 512K\n", 2,
		   "at least 1048576 bytes");
	expect_bad("[limits]\nmax_pending_bytes = 1K\n", 2,
		   "max_pending_bytes = 1K");
	expect_bad("[limits]\nmax_bytes_in_flight = 4K\n", 2,
		   "max_bytes_in_flight = 4K");
	/* Numbers out of range name the range. */
	expect_bad("[limits]\nmax_connections = 0\n", 2,
		   "max_connections = 0: expected a number from 1 to 1048576");
	expect_bad("[limits]\nmax_streams = 65\n", 2, "from 1 to 64");
	expect_bad("[limits]\nmax_frame_bytes = 4095\n", 2,
		   "from 4096 to 1073741824");
	expect_bad("[limits]\nmax_frame_bytes = 2G\n", 2, "max_frame_bytes");
	expect_bad("[limits]\nmax_in_flight = 0\n", 2, "max_in_flight");
	expect_bad("[limits]\nframe_timeout = 3601\n", 2,
		   "frame_timeout = 3601: expected a number from 0 to 3600");
	expect_bad("[limits]\nmax_ops_per_batch = 16777217\n", 2,
		   "max_ops_per_batch");
	expect_bad("[limits]\nmax_handles = 2G\n", 2, "max_handles");
	expect_bad("[daemon]\ndevice = 1025\n", 2, "device = 1025");
	expect_bad("[daemon]\ndevice = -1\n", 2, "device");
	expect_bad("[daemon]\ndevice = GPU-nope\n", 2,
		   "device = GPU-nope: expected an index from 0 to 1024, a GPU "
		   "UUID (GPU-...) or a PCI bus id (0000:3b:00.0)");
	expect_bad(
		"[daemon]\ndevice = MIG-8a2f3b1c\n", 2,
		"device = MIG-8a2f3b1c: a MIG instance is chosen by "
		"CUDA_VISIBLE_DEVICES=MIG-8a2f3b1c in gpucmdd's environment");
	expect_bad("[service web]\nweight = 0\n", 2, "from 1 to 1000");
	expect_bad("[service web]\nweight = 1001\n", 2, "weight = 1001");
	expect_bad("[service web]\nmax_streams = 0\n", 2, "from 1 to 64");
	expect_bad("[services]\ndefault_weight = 5000\n", 2, "weight");
	expect_bad("[limits]\nmax_connections = 99999999999999999999999\n", 2,
		   "max_connections");
	/* Choices. */
	expect_bad("[daemon]\nbackend = gpu\n", 2,
		   "backend = gpu: expected auto, cuda or host");
	expect_bad("[daemon]\nbackend = \n", 2, "backend");
	expect_bad("[daemon]\nlog_level = verbose\n", 2, "log_level = verbose");
	expect_bad("[daemon]\nlayout = striped\n", 2, "layout = striped");
	expect_bad("[daemon]\nspin_us = 10001\n", 2, "spin_us");
	expect_bad("[daemon]\nhost_stream_nice = 20\n", 2, "host_stream_nice");
	expect_bad("[daemon]\nstop_timeout = 3601\n", 2,
		   "stop_timeout = 3601: expected a number from 0 to 3600");
	expect_bad("[daemon]\nstop_timeout = -1\n", 2, "stop_timeout");
	expect_bad("[services]\nunknown = maybe\n", 2,
		   "unknown = maybe: expected allow or refuse");
	/* Strings longer than their field. */
	{
		char text[512];
		char longpath[200];

		memset(longpath, 'p', sizeof(longpath) - 1);
		longpath[sizeof(longpath) - 1] = '\0';
		longpath[0] = '/';
		snprintf(text, sizeof(text), "[daemon]\nsocket = %.150s\n",
			 longpath);
		expect_bad(text, 2, "socket is longer than 107 characters");
	}
}
END_TEST

START_TEST(bad_service_names)
{
	expect_bad("[service bad/name]\nweight = 2\n", 2,
		   "not a valid service name");
	expect_bad("[service bad*]\nweight = 2\n", 2, "'bad*'");
	expect_bad2("[daemon]\nbackend = host\n[service caf\xc3\xa9]\n"
		    "memory_limit = 1M\n",
		    4, 3, "not a valid service name");
}
END_TEST

START_TEST(syntax_errors)
{
	expect_bad("[daemon]\nthis line has no equals sign\n", 2,
		   "syntax error");
	expect_bad("[daemon\n", 1, "syntax error");
	expect_bad("[daemon]\nbackend = host\n\n\n= value without a key\n", 5,
		   "unknown key ''");
	/* The first problem is reported, with its own line. */
	expect_bad("[daemon]\nbackend = gpu\nnot ini\n", 2, "backend = gpu");
}
END_TEST

/*
 * A syntax error above a bad key: the message must describe the line it
 * names (a syntax error), not pair that line with a later line's problem.
 */
START_TEST(syntax_error_then_bad_key_names_the_syntax_error)
{
	expect_bad("[daemon]\nnot ini at all\n\nsockett = /x\n", 2,
		   "syntax error");
	/* A header without its bracket, then keys that fall in no section. */
	expect_bad("[daemon\nbackend = host\n", 1, "syntax error");
}
END_TEST

START_TEST(missing_file_is_enoent)
{
	struct config cfg, before;
	char err[512] = "";
	char path[128];

	snprintf(path, sizeof(path), "%s/no-such.conf", dir);
	config_defaults(&cfg);
	memcpy(&before, &cfg, sizeof(before));
	ck_assert_int_eq(config_load(&cfg, path, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, path) != NULL, "error '%s' lacks the path",
		      err);
	ck_assert_int_eq(memcmp(&cfg, &before, sizeof(cfg)), 0);
	ck_assert_str_eq(cfg.path, "");
}
END_TEST

/* A directory is not a config file: "ok (0 services)" would hide a typo. */
START_TEST(directory_is_not_a_config_file)
{
	struct config cfg;
	char err[512] = "";
	int rc;

	config_defaults(&cfg);
	rc = config_load(&cfg, dir, err, sizeof(err));
	ck_assert_msg(rc != 0, "config_load accepted the directory %s", dir);
	ck_assert_msg(strstr(err, dir) != NULL, "error '%s' lacks the path",
		      err);
	config_free(&cfg);
}
END_TEST

START_TEST(failed_load_keeps_the_previous_config)
{
	struct config cfg, before;
	struct config_service *services_before;
	char err[512] = "";
	const char *path;
	int rc;

	load_ok(&cfg, "[daemon]\nsocket_mode = 0600\nbackend = host\n"
		      "[limits]\nmax_streams = 5\n"
		      "[service keep]\nmemory_limit = 3M\nweight = 4\n"
		      "region_limit = 2M\n");
	memcpy(&before, &cfg, sizeof(before));
	services_before = malloc(cfg.nservices * sizeof(*services_before));
	ck_assert_ptr_nonnull(services_before);
	memcpy(services_before, cfg.services,
	       cfg.nservices * sizeof(*services_before));

	/* Changes everything before its error on the last line. */
	path = write_file("broken.conf",
			  "[daemon]\nsocket_mode = 0666\nbackend = cuda\n"
			  "[limits]\nmax_streams = 7\n"
			  "[service keep]\nmemory_limit = 9M\n"
			  "region_limit = 9M\n"
			  "[service added]\nweight = 3\n"
			  "[services]\nunknown = refuse\n"
			  "default_weight = 12\n"
			  "default_region_limit = 1G\n"
			  "max_streams = 3\n");
	rc = config_load(&cfg, path, err, sizeof(err));
	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_msg(strstr(err, ":15: ") != NULL, "error: %s", err);
	ck_assert_int_eq(memcmp(&cfg, &before, sizeof(cfg)), 0);
	ck_assert_int_eq(memcmp(cfg.services, services_before,
				cfg.nservices * sizeof(*services_before)),
			 0);
	ck_assert_uint_eq(cfg.socket_mode, 0600);
	ck_assert_uint_eq(cfg.nservices, 1);
	ck_assert_uint_eq(config_find_service(&cfg, "keep")->memory_limit,
			  3 * MIB);
	ck_assert_uint_eq(config_find_service(&cfg, "keep")->region_limit,
			  2 * MIB);
	ck_assert_uint_eq(cfg.default_service.region_limit, 0);
	ck_assert_ptr_null(config_find_service(&cfg, "added"));
	free(services_before);

	/* A good file loaded over it then applies on top. */
	path = write_file("next.conf", "[service keep]\nmemory_limit = 1M\n");
	ck_assert_int_eq(config_load(&cfg, path, err, sizeof(err)), 0);
	ck_assert_uint_eq(config_find_service(&cfg, "keep")->memory_limit, MIB);
	ck_assert_uint_eq(config_find_service(&cfg, "keep")->weight, 4);
	ck_assert_uint_eq(config_find_service(&cfg, "keep")->region_limit,
			  2 * MIB);
	ck_assert_str_eq(cfg.path, path);
	config_free(&cfg);
}
END_TEST

START_TEST(copy_is_deep)
{
	struct config src, dst;

	load_ok(&src, "[service one]\nweight = 2\n[service two]\nweight = 3\n");
	ck_assert_int_eq(config_copy(&dst, &src), 0);
	ck_assert_ptr_ne(dst.services, src.services);
	ck_assert_uint_eq(dst.nservices, 2);
	src.services[0].weight = 99;
	ck_assert_uint_eq(config_find_service(&dst, "one")->weight, 2);
	ck_assert_uint_eq(config_find_service(&dst, "two")->weight, 3);
	ck_assert_str_eq(dst.path, src.path);
	config_free(&src);
	ck_assert_uint_eq(config_find_service(&dst, "one")->weight, 2);
	config_free(&dst);

	/* Copying a config without services gives none. */
	config_defaults(&src);
	ck_assert_int_eq(config_copy(&dst, &src), 0);
	ck_assert_ptr_null(dst.services);
	ck_assert_uint_eq(dst.nservices, 0);
	config_free(&dst);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("parsers");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, defaults_are_the_documented_ones);
	tcase_add_test(tc, parse_size_numbers_and_suffixes);
	tcase_add_test(tc, parse_size_rejects_what_is_not_a_size);
	tcase_add_test(tc, backend_names_round_trip);
	tcase_add_test(tc, device_index_uuid_or_bus_id);
	suite_add_tcase(s, tc);

	tc = tcase_create("good files");
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, every_key);
	tcase_add_test(tc, each_choice_of_the_enumerations);
	tcase_add_test(tc, sizes_with_suffixes_and_range_edges);
	tcase_add_test(tc, socket_mode_is_octal);
	tcase_add_test(tc, ids_by_number_and_by_name);
	tcase_add_test(tc, comments_and_whitespace);
	tcase_add_test(tc, multiple_service_sections);
	tcase_add_test(tc, service_defaults_from_services_section);
	tcase_add_test(tc, default_uids_apply_or_are_refused);
	tcase_add_test(tc, service_defaults_whatever_the_order);
	tcase_add_test(tc, region_limit_sizes_and_inheritance);
	tcase_add_test(tc, empty_service_section_declares_the_service);
	tcase_add_test(tc, long_service_names_are_kept_whole);
	tcase_add_test(tc, copy_is_deep);
	suite_add_tcase(s, tc);

	tc = tcase_create("bad files");
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, unknown_sections_and_keys);
	tcase_add_test(tc, long_lines_bad_headers_and_too_many_sections);
	tcase_add_test(tc, indented_lines_repeated_and_empty_id_lists);
	tcase_add_test(tc, bad_values);
	tcase_add_test(tc, bad_service_names);
	tcase_add_test(tc, syntax_errors);
	tcase_add_test(tc, syntax_error_then_bad_key_names_the_syntax_error);
	tcase_add_test(tc, socket_mode_empty_is_refused);
	tcase_add_test(tc, ids_out_of_range_are_refused);
	tcase_add_test(tc, max_modules_range_and_inheritance);
	tcase_add_test(tc, service_bytes_in_flight_and_inheritance);
	tcase_add_test(tc, service_max_connections_and_inheritance);
	tcase_add_test(tc, missing_file_is_enoent);
	tcase_add_test(tc, directory_is_not_a_config_file);
	tcase_add_test(tc, failed_load_keeps_the_previous_config);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(config_suite());
}
