/*
 * main.c - gpucmdd: parse the command line, open the device, serve.
 *
 * Exit status: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when the
 * daemon cannot start or a stop is cut short (a second signal, [daemon]
 * stop_timeout, a lost device; the reason is logged), 2 for a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "sd.h"
#include "server.h"
#include "service.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: gpucmdd [OPTION]...\n"
		"Serve one GPU to several client processes over a Unix socket.\n"
		"\n"
		"  -c, --config PATH       read settings from PATH (default %s;\n"
		"                          a missing default file means built-in defaults)\n"
		"      --check-config      validate the config file, print the result, exit\n"
		"      --probe             open the device, print what it is, exit (0: usable)\n"
		"  -s, --socket PATH       listen on PATH (default $GPUCMD_SOCKET, else the\n"
		"                          config file's socket, else %s)\n"
		"  -b, --backend NAME      auto, cuda or host (default auto: cuda when a\n"
		"                          device answers, else host)\n"
		"  -d, --device N|ID       GPU index (default 0), GPU-UUID or PCI bus id\n"
		"      --host-memory SIZE  device memory of the host backend (default 4G)\n"
		"      --max-connections N connections at once (default 256)\n"
		"      --max-frame-bytes SIZE  largest frame body (default 64M)\n"
		"      --max-streams N     streams per connection (default 16)\n"
		"  -l, --log-level LEVEL   error, warning, notice, info or debug (default info)\n"
		"  -h, --help              show this help and exit\n"
		"  -V, --version           show the version and exit\n"
		"\n"
		"Flags override the config file, which overrides the defaults.\n"
		"See gpucmdd(8) and gpucmdd.conf(5).\n",
		CONFIG_DEFAULT_PATH, GPUCMD_DEFAULT_SOCKET);
}

enum {
	OPT_HOST_MEMORY = 256,
	OPT_MAX_CONNECTIONS,
	OPT_MAX_FRAME,
	OPT_MAX_STREAMS,
	OPT_FAIL_ALLOC,
	OPT_COMPILE_DELAY,
	OPT_CHECK_CONFIG,
	OPT_PROBE,
};

/* What the first pass over argv found: which file, and whether to check it. */
struct early_args {
	const char *config;
	bool config_given;
	bool check_only;
	bool probe;
	bool bad;    /* an option getopt refused: a usage error first */
	bool absent; /* no file at the default place: built-in defaults */
};

static int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
	uint64_t v;

	if (config_parse_size(s, &v) != 0 || v < min || v > max)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* A count or an index: plain decimal digits, no size suffix. */
static int parse_count(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
	if (s[0] < '0' || s[0] > '9' || s[strspn(s, "0123456789")] != '\0')
		return -1;
	return parse_u32(s, min, max, out);
}

static const struct option opts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
	{ "probe", no_argument, NULL, OPT_PROBE },
	{ "socket", required_argument, NULL, 's' },
	{ "backend", required_argument, NULL, 'b' },
	{ "device", required_argument, NULL, 'd' },
	{ "host-memory", required_argument, NULL, OPT_HOST_MEMORY },
	{ "max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS },
	{ "max-frame-bytes", required_argument, NULL, OPT_MAX_FRAME },
	{ "max-streams", required_argument, NULL, OPT_MAX_STREAMS },
	{ "test-fail-alloc-at", required_argument, NULL, OPT_FAIL_ALLOC },
	{ "test-compile-delay-ms", required_argument, NULL, OPT_COMPILE_DELAY },
	{ "log-level", required_argument, NULL, 'l' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};
static const char optstring[] = "c:s:b:d:l:hV";

/* First pass: only --config, --check-config, --help, --version. */
static void early_args(int argc, char **argv, struct early_args *e)
{
	int c;

	e->config = CONFIG_DEFAULT_PATH;
	opterr = 0;
	while ((c = getopt_long(argc, argv, optstring, opts, NULL)) != -1) {
		if (c == 'c') {
			e->config = optarg;
			e->config_given = true;
		} else if (c == OPT_CHECK_CONFIG) {
			e->check_only = true;
		} else if (c == OPT_PROBE) {
			e->probe = true;
		} else if (c == '?' || c == ':') {
			e->bad = true;
		}
	}
	opterr = 1;
	optind = 0;
}

static int parse_args(int argc, char **argv, struct config *cfg)
{
	const char *env = getenv("GPUCMD_SOCKET");
	uint32_t u;
	int c, v, rc;

	if (env != NULL && env[0] != '\0')
		snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", env);
	while ((c = getopt_long(argc, argv, optstring, opts, NULL)) != -1) {
		switch (c) {
		case 'c':
		case OPT_CHECK_CONFIG:
		case OPT_PROBE:
			break; /* handled by early_args */
		case 's':
			if (optarg[0] == '\0') {
				fprintf(stderr, "gpucmdd: --socket needs a "
						"path\n");
				return 2;
			}
			if (strlen(optarg) >= sizeof(cfg->socket_path)) {
				fprintf(stderr,
					"gpucmdd: socket path '%s' is %zu "
					"bytes, longer than the %zu a Unix "
					"socket takes\n",
					optarg, strlen(optarg),
					sizeof(cfg->socket_path) - 1);
				return 2;
			}
			snprintf(cfg->socket_path, sizeof(cfg->socket_path),
				 "%s", optarg);
			break;
		case 'b':
			v = config_backend_parse(optarg);
			if (v < 0) {
				fprintf(stderr,
					"gpucmdd: unknown backend '%s' "
					"(auto, cuda or host)\n",
					optarg);
				return 2;
			}
			cfg->backend = (enum config_backend)v;
			break;
		case 'd':
			rc = config_parse_device(optarg, &cfg->device,
						 cfg->device_id,
						 sizeof(cfg->device_id));
			if (rc == -2) {
				fprintf(stderr,
					"gpucmdd: --device '%s' is a MIG "
					"instance, which CUDA numbers only "
					"when CUDA_VISIBLE_DEVICES names it: "
					"start gpucmdd with "
					"CUDA_VISIBLE_DEVICES=%s in its "
					"environment and no --device\n",
					optarg, optarg);
				return 2;
			}
			if (rc != 0) {
				fprintf(stderr,
					"gpucmdd: bad --device '%s' (a GPU "
					"index from 0 to 1024, a GPU UUID "
					"GPU-... or a PCI bus id "
					"0000:3b:00.0)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_HOST_MEMORY:
			if (config_parse_size(optarg, &cfg->host_memory) != 0 ||
			    cfg->host_memory < (1u << 20)) {
				fprintf(stderr,
					"gpucmdd: bad --host-memory '%s' "
					"(a size of at least 1M)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_MAX_CONNECTIONS:
			if (parse_count(optarg, 1, 1u << 20,
					&cfg->limits.max_connections) != 0) {
				fprintf(stderr,
					"gpucmdd: bad --max-connections '%s' "
					"(1 to 1048576)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_MAX_FRAME:
			if (parse_u32(optarg, 4096, 1u << 30,
				      &cfg->limits.max_frame_bytes) != 0) {
				fprintf(stderr,
					"gpucmdd: bad --max-frame-bytes '%s' "
					"(4K to 1G)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_MAX_STREAMS:
			if (parse_count(optarg, 1, 64,
					&cfg->limits.max_streams) != 0) {
				fprintf(stderr,
					"gpucmdd: bad --max-streams '%s' "
					"(1 to 64)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_FAIL_ALLOC:
			if (config_parse_size(optarg,
					      &cfg->host_fail_alloc_at) != 0) {
				fprintf(stderr,
					"gpucmdd: bad --test-fail-alloc-at "
					"'%s' (a number)\n",
					optarg);
				return 2;
			}
			break;
		case OPT_COMPILE_DELAY:
			if (parse_count(optarg, 0, 600000, &u) != 0) {
				fprintf(stderr,
					"gpucmdd: bad "
					"--test-compile-delay-ms '%s'\n",
					optarg);
				return 2;
			}
			cfg->test_compile_delay_ms = u;
			break;
		case 'l':
			v = log_level_parse(optarg);
			if (v < 0) {
				fprintf(stderr,
					"gpucmdd: unknown log level '%s' "
					"(error, warning, notice, info or "
					"debug)\n",
					optarg);
				return 2;
			}
			cfg->log_level = v;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("gpucmdd %s (protocol %d)\n",
			       GPUCMD_VERSION_STRING, GPUCMD_PROTOCOL_VERSION);
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gpucmdd: unexpected argument '%s'\n",
			argv[optind]);
		usage(stderr);
		return 2;
	}
	return 0;
}

/* Defaults, then the file.  0, or the exit status. */
static int load_file(struct early_args *e, struct config *cfg)
{
	char err[512];
	int rc;

	rc = config_load(cfg, e->config, err, sizeof(err));
	/*
	 * No file at the default place: the built-in defaults, for the check
	 * too (the units' ExecReload= runs it: a daemon without a file has
	 * nothing to reload, which is no reason to fail the reload).
	 */
	if (rc == -ENOENT && !e->config_given) {
		e->absent = true;
		return 0;
	}
	if (rc != 0) {
		fprintf(stderr, "gpucmdd: %s\n", err);
		return 1;
	}
	return 0;
}

/* What a reload needs to rebuild the settings the way main did. */
static struct {
	int argc;
	char **argv;
	struct early_args early;
} saved;

static int rebuild(struct config *cfg, char *err, size_t err_len)
{
	int rc;

	config_defaults(cfg);
	rc = config_load(cfg, saved.early.config, err, err_len);
	if (rc != 0) {
		config_free(cfg);
		return rc;
	}
	optind = 0;
	opterr = 0;
	rc = parse_args(saved.argc, saved.argv, cfg);
	opterr = 1;
	if (rc != 0) {
		snprintf(err, err_len, "the command line no longer parses");
		config_free(cfg);
		return GPUCMD_EINVAL;
	}
	return 0;
}

/*
 * "GPU-..., PCI 0000:3b:00.0; " for the start line, so that the log says
 * which GPU an index meant; "" where the backend has neither.
 */
static const char *gpu_ids(const struct driver_properties *p, char *buf,
			   size_t len)
{
	buf[0] = '\0';
	if (p->uuid[0] != '\0' || p->pci_bus_id[0] != '\0')
		snprintf(buf, len, "%s, PCI %s; ",
			 p->uuid[0] ? p->uuid : "no UUID",
			 p->pci_bus_id[0] ? p->pci_bus_id : "unknown");
	return buf;
}

/* --probe: open the backend as the daemon would, say what it is, close. */
static void probe_reply(void *conn, uint8_t *buf, size_t len,
			struct reply_pieces *pieces,
			const struct reply_lost *lost, bool completed,
			void *arg)
{
	(void)conn;
	(void)len;
	(void)lost;
	(void)completed;
	(void)arg;
	frame_buf_free(buf);
	reply_pieces_free(pieces);
}

static void probe_closed(void *conn, void *arg)
{
	(void)conn;
	(void)arg;
}

static void probe_fatal(const char *why, void *arg)
{
	(void)why;
	(void)arg;
}

static int probe(const struct config *cfg)
{
	struct executor_callbacks cb = {
		.reply = probe_reply,
		.closed = probe_closed,
		.fatal = probe_fatal,
	};
	struct executor *ex;
	const struct driver_properties *p;
	char why[1024];
	int rc;

	rc = executor_start(cfg, &cb, &ex, why, sizeof(why));
	if (rc != 0) {
		/* The CUDA backend's why says it already. */
		fprintf(stderr, "gpucmdd: %s%s\n",
			strstr(why, "no usable") ? "" : "no usable device: ",
			why);
		return 1;
	}
	p = executor_properties(ex);
	printf("%s backend: %s, %llu MiB, alignment %llu\n", p->backend,
	       p->name, (unsigned long long)(p->total_memory >> 20),
	       (unsigned long long)p->alignment);
	if (p->uuid[0] != '\0' || p->pci_bus_id[0] != '\0')
		printf("gpu: %s, PCI %s\n", p->uuid[0] ? p->uuid : "(no UUID)",
		       p->pci_bus_id[0] ? p->pci_bus_id : "(unknown)");
	executor_stop(ex);
	return 0;
}

/*
 * What the file cannot say by itself: groups that do not exist here and
 * more host memory than the machine has.  An error only where the daemon
 * would then fail to start (1); the rest are warnings on stderr.
 */
static int check_host(const struct config *cfg)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	int rc = 0;

	if (cfg->socket_group[0] != '\0' &&
	    getgrnam(cfg->socket_group) == NULL) {
		fprintf(stderr,
			"gpucmdd: %s: socket_group '%s' does not "
			"exist: create it (the package's sysusers.d does) or "
			"change the setting; the daemon would not start (under "
			"socket activation the socket unit's SocketGroup= "
			"applies instead)\n",
			config_file(cfg), cfg->socket_group);
		rc = 1;
	}
	if (cfg->admin_group[0] != '\0' && getgrnam(cfg->admin_group) == NULL)
		fprintf(stderr,
			"gpucmdd: %s: warning: admin_group '%s' does "
			"not exist: only root and the daemon's user will be "
			"admins\n",
			config_file(cfg), cfg->admin_group);
	if (pages > 0 && page > 0 &&
	    cfg->host_memory / (uint64_t)page > (uint64_t)pages)
		fprintf(stderr,
			"gpucmdd: warning: host_memory %llu MiB is "
			"more than this machine's %llu MiB of memory: the host "
			"backend's allocations would fail with the host out of "
			"memory before the limit\n",
			(unsigned long long)(cfg->host_memory >> 20),
			(unsigned long long)(((uint64_t)pages *
					      (uint64_t)page) >>
					     20));
	return rc;
}

int main(int argc, char **argv)
{
	struct early_args early = { 0 };
	struct config cfg;
	struct server srv;
	char why[1024] = "", ids[96];
	uv_loop_t loop;
	int rc;

	/* getopt's own complaints start with it, as every other message. */
	argv[0] = (char *)"gpucmdd";
	config_defaults(&cfg);
	early_args(argc, argv, &early);
	/* A bad command line is reported as such, before any file. */
	rc = early.bad ? parse_args(argc, argv, &cfg) : load_file(&early, &cfg);
	/*
	 * A file that does not load stops the daemon as a usage error (2):
	 * the units do not restart it (RestartPreventExitStatus=2), since
	 * only an edit can fix it.  --check-config says 1 for it, as for
	 * anything it finds.
	 */
	if (rc != 0 && !early.check_only)
		rc = 2;
	if (rc == 0 && !early.bad)
		rc = parse_args(argc, argv, &cfg);
	if (early.check_only) {
		if (rc == 0)
			rc = check_host(&cfg);
		if (rc == 0)
			printf("%s: %sok (%u services, backend %s, socket %s)\n",
			       early.config,
			       early.absent ? "no such file, so the built-in "
					      "defaults: " :
					      "",
			       cfg.nservices, config_backend_name(cfg.backend),
			       cfg.socket_path);
		config_free(&cfg);
		return rc;
	}
	if (rc != 0) {
		config_free(&cfg);
		return rc;
	}
	if (early.probe) {
		log_set_level(LOG_LEVEL_WARNING);
		rc = probe(&cfg);
		config_free(&cfg);
		return rc;
	}
	log_set_level((enum log_level)cfg.log_level);
	log_set_journal(sd_stderr_is_journal());
	/* A client that goes away mid-write must not kill the daemon. */
	signal(SIGPIPE, SIG_IGN);

	uv_loop_init(&loop);
	saved.argc = argc;
	saved.argv = argv;
	saved.early = early;
	rc = server_init(&srv, &loop, &cfg, why, sizeof(why));
	srv.rebuild = rebuild;
	if (rc != 0) {
		log_err("cannot start: %s", why);
		uv_loop_close(&loop);
		config_free(&cfg);
		return 1;
	}
	if (cfg.path[0] != '\0')
		log_info("settings from %s", cfg.path);
	log_notice("gpucmdd %s serving %s (%s%s backend, %llu MiB) on %s",
		   GPUCMD_VERSION_STRING, executor_properties(srv.ex)->name,
		   gpu_ids(executor_properties(srv.ex), ids, sizeof(ids)),
		   executor_properties(srv.ex)->backend,
		   (unsigned long long)(executor_properties(srv.ex)
						->total_memory >>
					20),
		   srv.activated ? "the socket systemd passed" :
				   cfg.socket_path);
	rc = server_run(&srv);
	uv_loop_close(&loop);
	config_free(&cfg);
	service_registry_free();
	log_notice("stopped");
	return rc;
}
