/*
 * gpucmd_bench.c - gpucmd-bench: where gpucmd stands against the floor of
 * the machine it runs on.
 *
 * It starts its own gpucmdd (the one next to its own binary, found through
 * /proc/self/exe) on a private socket in a temporary directory, with the
 * host backend unless --backend says otherwise, runs the scenarios in
 * order, prints one table (or one JSON object with --json) and stops the
 * daemon.  With --socket it measures a daemon that is already running.
 *
 * Each scenario measures its own floor in the same run (bench.h); the table
 * says for every row what it was compared with, the target, and whether the
 * target is met.  When the daemon runs on the CUDA backend, the "gpu"
 * scenario also holds it against the CUDA driver API called from this
 * process (cuLaunchKernel, cuMemcpy from pinned memory; bench_gpu.c); on
 * any other backend it adds a note instead of rows.  A missed target is a
 * finding, not a failure: the exit status is 0 unless something could not
 * be measured at all.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct bench_opts bench;

/* Our own daemon, when we started one. */
static pid_t own_daemon;
static char tmpdir[64];
static char sock_path[128];
static char log_path[128];
static char conf_path[128];
/*
 * Files the scenarios make in tmpdir (bench_scratch_path), so that a
 * signal handler, which cannot read the directory, still removes them.
 */
#define SCRATCH_MAX 4
static char scratch[SCRATCH_MAX][160];
static volatile sig_atomic_t nscratch;

static void usage(FILE *out)
{
	fprintf(out,
		"usage: gpucmd-bench [OPTION]...\n"
		"Measure gpucmd against the floor of this machine, in one run.\n"
		"\n"
		"      --quick           a short run (under a minute on two cores)\n"
		"      --json            print one JSON object instead of the table\n"
		"      --socket PATH     measure the daemon already serving on PATH\n"
		"                        (default: start a private gpucmdd)\n"
		"      --backend NAME    backend of the private daemon and of the\n"
		"                        allocator scenario: host (default), cuda, auto\n"
		"      --only NAME       run only the scenarios whose name contains NAME\n"
		"                        (memory, roundtrip, throughput, transfer,\n"
		"                        allocator, scaling, gpu)\n"
		"  -h, --help            show this help and exit\n"
		"\n"
		"Every speed is a ratio to a floor measured in the same run: a raw\n"
		"Unix-socket ping-pong of the same bytes, memcpy, the backend's own\n"
		"allocator; with --backend cuda also cuLaunchKernel and cuMemcpy\n"
		"from pinned memory, called from this process (the gpu scenario,\n"
		"which only notes why when the daemon is not on CUDA).  The exit\n"
		"status is 0 even when a target is missed, and non-zero only when\n"
		"something could not be measured.\n");
}

/* ---- the private daemon --------------------------------------------------- */

int bench_scratch_path(const char *name, char *out, size_t len)
{
	if (nscratch == SCRATCH_MAX || tmpdir[0] == '\0' ||
	    (size_t)snprintf(scratch[nscratch], sizeof(scratch[0]), "%s/%s",
			     tmpdir, name) >= sizeof(scratch[0]) ||
	    (size_t)snprintf(out, len, "%s", scratch[nscratch]) >= len)
		return -ENAMETOOLONG;
	nscratch++;
	return 0;
}

/* Async-signal-safe: on_signal calls it too. */
static void remove_private_files(void)
{
	if (tmpdir[0] == '\0')
		return;
	for (int i = 0; i < nscratch; i++)
		unlink(scratch[i]);
	if (sock_path[0] != '\0')
		unlink(sock_path);
	if (log_path[0] != '\0')
		unlink(log_path);
	if (conf_path[0] != '\0')
		unlink(conf_path);
	rmdir(tmpdir);
}

/*
 * The end of the daemon's log on stderr: the private directory goes when
 * the bench ends, so naming the log's path would name nothing.
 */
static void show_log(void)
{
	char buf[2048];
	ssize_t n;
	off_t size;
	int fd = open(log_path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	if (size > (off_t)sizeof(buf) - 1)
		lseek(fd, size - (off_t)sizeof(buf) + 1, SEEK_SET);
	else
		lseek(fd, 0, SEEK_SET);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0) {
		fputs("gpucmd-bench: gpucmdd's log is empty\n", stderr);
		return;
	}
	buf[n] = '\0';
	fprintf(stderr, "gpucmd-bench: gpucmdd's log%s:\n%s%s",
		size > n ? " (its end)" : "", buf,
		buf[n - 1] == '\n' ? "" : "\n");
}

static void stop_daemon(void)
{
	int status = 0;

	if (own_daemon <= 0)
		return;
	kill(own_daemon, SIGTERM);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(own_daemon, &status, WNOHANG) == own_daemon)
			goto reaped;
		usleep(10000);
	}
	kill(own_daemon, SIGKILL);
	waitpid(own_daemon, &status, 0);
reaped:
	own_daemon = 0;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		bench_error("gpucmdd did not exit cleanly after SIGTERM "
			    "(status %d)",
			    status);
		show_log();
	}
}

/*
 * Ctrl-C, or a SIGTERM to this process alone: leave no daemon and no
 * directory behind.  The daemon gets a second of grace, then SIGKILL, and
 * is reaped here, so that it is gone when we are.  Our other children
 * die with us (bench_fork's PR_SET_PDEATHSIG): a scaling echo server
 * would otherwise wait in epoll_wait forever.  Only async-signal-safe
 * calls.
 */
static void on_signal(int sig)
{
	const struct timespec tick = { 0, 10000000 };

	if (own_daemon > 0) {
		int i;

		kill(own_daemon, SIGTERM);
		for (i = 0; i < 100; i++) {
			if (waitpid(own_daemon, NULL, WNOHANG) == own_daemon)
				break;
			nanosleep(&tick, NULL);
		}
		if (i == 100) {
			kill(own_daemon, SIGKILL);
			waitpid(own_daemon, NULL, 0);
		}
	}
	remove_private_files();
	_exit(128 + sig);
}

/* The gpucmdd next to this binary. */
static int daemon_binary(char *out, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return -errno;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash == NULL)
		return -ENOENT;
	*slash = '\0';
	if ((size_t)snprintf(out, len, "%s/gpucmdd", self) >= len)
		return -ENAMETOOLONG;
	return access(out, X_OK) == 0 ? 0 : -errno;
}

static int socket_answers(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	return rc == 0;
}

static int start_daemon(void)
{
	char bin[PATH_MAX];
	int rc, fd;

	rc = daemon_binary(bin, sizeof(bin));
	if (rc != 0) {
		bench_error("cannot find gpucmdd next to this program: %s "
			    "(build it with make, or pass --socket)",
			    strerror(-rc));
		return rc;
	}
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/gpucmd-bench-XXXXXX");
	if (mkdtemp(tmpdir) == NULL) {
		rc = -errno;
		tmpdir[0] = '\0';
		bench_error("mkdtemp: %s", strerror(-rc));
		return rc;
	}
	snprintf(sock_path, sizeof(sock_path), "%s/gpucmd.sock", tmpdir);
	snprintf(log_path, sizeof(log_path), "%s/gpucmdd.log", tmpdir);
	snprintf(conf_path, sizeof(conf_path), "%s/gpucmdd.conf", tmpdir);
	/* An empty config: built-in defaults, whatever /etc says. */
	fd = open(conf_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		bench_error("%s: %s", conf_path, strerror(-rc));
		return rc;
	}
	close(fd);
	bench.tmpdir = tmpdir;

	own_daemon = fork();
	if (own_daemon < 0) {
		rc = -errno;
		own_daemon = 0;
		bench_error("fork: %s", strerror(-rc));
		return rc;
	}
	if (own_daemon == 0) {
		/*
		 * If we die without stopping it (SIGKILL), it stops itself:
		 * otherwise it would serve a private socket nobody knows of.
		 */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(bin, bin, "--socket", sock_path, "--config", conf_path,
		      "--backend", bench.backend, "--log-level", "warning",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 3000; i++) {
		if (socket_answers(sock_path)) {
			bench.socket = sock_path;
			return 0;
		}
		if (waitpid(own_daemon, NULL, WNOHANG) == own_daemon) {
			own_daemon = 0;
			bench_error("gpucmdd exited at start");
			show_log();
			return -ECHILD;
		}
		usleep(10000);
	}
	bench_error("gpucmdd did not listen on %s within 30 s", sock_path);
	show_log();
	return -ETIMEDOUT;
}

/* The daemon's pid, from the socket's peer credentials. */
static pid_t daemon_pid(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pid_t pid = 0;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
		pid = cred.pid;
	close(fd);
	return pid;
}

/* ---- the machine ------------------------------------------------------------ */

struct machine {
	char cpu[128];
	long cores;
	char kernel[128];
	uint64_t memory;
	char backend[16];
	char device[128];
	char date[32];
	double load[2]; /* 1-minute load average before, after */
};

static void machine_read(struct machine *m)
{
	struct utsname u;
	char line[256];
	FILE *f;
	time_t now = time(NULL);
	struct tm tm;

	memset(m, 0, sizeof(*m));
	snprintf(m->cpu, sizeof(m->cpu), "unknown");
	f = fopen("/proc/cpuinfo", "re");
	if (f != NULL) {
		while (fgets(line, sizeof(line), f) != NULL) {
			char *colon = strchr(line, ':');

			if (strncmp(line, "model name", 10) != 0 ||
			    colon == NULL)
				continue;
			colon += 2;
			colon[strcspn(colon, "\n")] = '\0';
			snprintf(m->cpu, sizeof(m->cpu), "%s", colon);
			break;
		}
		fclose(f);
	}
	m->cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (uname(&u) == 0)
		snprintf(m->kernel, sizeof(m->kernel), "%s %s %s", u.sysname,
			 u.release, u.machine);
	m->memory = (uint64_t)sysconf(_SC_PHYS_PAGES) *
		    (uint64_t)sysconf(_SC_PAGESIZE);
	/* Other work on the machine shows in every number: say how much. */
	if (getloadavg(m->load, 1) != 1)
		m->load[0] = NAN;
	m->load[1] = NAN;
	gmtime_r(&now, &tm);
	strftime(m->date, sizeof(m->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void machine_device(struct machine *m)
{
	struct gpucmd_conn *c = bench_connect("bench-info");
	const struct gpucmd_info *info;

	if (c == NULL)
		return;
	info = gpucmd_info(c);
	snprintf(m->backend, sizeof(m->backend), "%s", info->backend);
	snprintf(m->device, sizeof(m->device), "%s", info->device_name);
	gpucmd_close(c);
}

/* ---- output ----------------------------------------------------------------- */

static bool row_met(const struct bench_row *r)
{
	switch (r->target) {
	case TARGET_RATIO_LE:
		return r->ratio <= r->goal;
	case TARGET_RATIO_GE:
		return r->ratio >= r->goal;
	case TARGET_VALUE_LE:
		return r->value <= r->goal;
	case TARGET_VALUE_GE:
		return r->value >= r->goal;
	case TARGET_NONE:
		break;
	}
	return true;
}

/* "1.23 M" style: numbers of any size in a few columns. */
static void fmt_num(char *buf, size_t len, double v)
{
	double a = fabs(v);

	if (isnan(v))
		snprintf(buf, len, "-");
	else if (a >= 1e9)
		snprintf(buf, len, "%.2f G", v / 1e9);
	else if (a >= 1e6)
		snprintf(buf, len, "%.2f M", v / 1e6);
	else if (a >= 1e4)
		snprintf(buf, len, "%.1f k", v / 1e3);
	else if (a >= 100)
		snprintf(buf, len, "%.0f", v);
	else if (a >= 10)
		snprintf(buf, len, "%.1f", v);
	else if (a >= 0.01 || a == 0)
		snprintf(buf, len, "%.3f", v);
	else
		snprintf(buf, len, "%.2e", v);
}

static void fmt_target(char *buf, size_t len, const struct bench_row *r)
{
	char g[32];

	fmt_num(g, sizeof(g), r->goal);
	switch (r->target) {
	case TARGET_RATIO_LE:
		snprintf(buf, len, "ratio <= %s", g);
		break;
	case TARGET_RATIO_GE:
		snprintf(buf, len, "ratio >= %s", g);
		break;
	case TARGET_VALUE_LE:
		snprintf(buf, len, "<= %s %s", g, r->unit);
		break;
	case TARGET_VALUE_GE:
		snprintf(buf, len, ">= %s %s", g, r->unit);
		break;
	case TARGET_NONE:
		snprintf(buf, len, "-");
		break;
	}
}

static void print_table(const struct machine *m)
{
	size_t met = 0, targets = 0;

	printf("gpucmd-bench %s (%s run): %s, %ld cores, %s\n",
	       GPUCMD_VERSION_STRING, bench.quick ? "quick" : "default", m->cpu,
	       m->cores, m->kernel);
	printf("daemon backend: %s (%s); load average %.2f before, %.2f "
	       "after\n\n",
	       m->backend, m->device, m->load[0], m->load[1]);
	printf("%-40s %14s %-8s %10s %9s %-22s %s\n", "name", "value", "unit",
	       "floor", "ratio", "target", "met");
	for (size_t i = 0; i < bench_nrows; i++) {
		const struct bench_row *r = &bench_rows[i];
		char v[32], fl[32], ra[32], t[48];
		bool ok = row_met(r);

		fmt_num(v, sizeof(v), r->value);
		fmt_num(fl, sizeof(fl), r->floor);
		fmt_num(ra, sizeof(ra), r->ratio);
		fmt_target(t, sizeof(t), r);
		if (r->target != TARGET_NONE) {
			targets++;
			met += ok;
		}
		printf("%-40s %14s %-8s %10s %9s %-22s %s\n", r->name, v,
		       r->unit, fl, ra, t,
		       r->target == TARGET_NONE ? "-" :
		       ok			? "yes" :
						  "no");
	}
	printf("\n%zu of %zu targets met.  ratio = value / floor; rows without "
	       "a target are there to watch.\n",
	       met, targets);
	for (size_t i = 0; i < bench_nnotes; i++)
		printf("note: %s\n", bench_notes[i]);
}

static void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void json_number(double v)
{
	if (isnan(v) || isinf(v))
		printf("null");
	else
		printf("%.6g", v);
}

static void print_json(const struct machine *m, int argc, char **argv)
{
	printf("{\"machine\": {\"cpu\": ");
	json_string(m->cpu);
	printf(", \"cores\": %ld, \"kernel\": ", m->cores);
	json_string(m->kernel);
	printf(", \"memory_bytes\": %llu, \"backend\": ",
	       (unsigned long long)m->memory);
	json_string(m->backend);
	printf(", \"device\": ");
	json_string(m->device);
	printf(", \"date\": ");
	json_string(m->date);
	printf(", \"load_before\": ");
	json_number(m->load[0]);
	printf(", \"load_after\": ");
	json_number(m->load[1]);
	printf(", \"mode\": \"%s\", \"version\": \"%s\", \"command\": ",
	       bench.quick ? "quick" : "default", GPUCMD_VERSION_STRING);
	putchar('"');
	for (int i = 0; i < argc; i++) {
		const char *a = i == 0 ? "gpucmd-bench" : argv[i];

		printf("%s", i ? " " : "");
		for (; *a; a++)
			if (*a == '"' || *a == '\\')
				printf("\\%c", *a);
			else if ((unsigned char)*a >= 0x20)
				putchar(*a);
	}
	printf("\"},\n \"results\": [");
	for (size_t i = 0; i < bench_nrows; i++) {
		const struct bench_row *r = &bench_rows[i];
		char t[48];

		printf("%s\n  {\"name\": ", i ? "," : "");
		json_string(r->name);
		printf(", \"value\": ");
		json_number(r->value);
		printf(", \"unit\": ");
		json_string(r->unit);
		printf(", \"floor\": ");
		json_number(r->floor);
		printf(", \"ratio\": ");
		json_number(r->ratio);
		printf(", \"target\": ");
		if (r->target == TARGET_NONE) {
			printf("null");
		} else {
			fmt_target(t, sizeof(t), r);
			json_string(t);
		}
		printf(", \"met\": %s}", row_met(r) ? "true" : "false");
	}
	printf("\n ],\n \"notes\": [");
	for (size_t i = 0; i < bench_nnotes; i++) {
		printf("%s\n  ", i ? "," : "");
		json_string(bench_notes[i]);
	}
	printf("\n ]\n}\n");
}

/* ---- main ------------------------------------------------------------------- */

enum { OPT_QUICK = 256, OPT_JSON, OPT_SOCKET, OPT_BACKEND, OPT_ONLY };

static const struct option long_opts[] = {
	{ "quick", no_argument, NULL, OPT_QUICK },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "only", required_argument, NULL, OPT_ONLY },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

struct scenario {
	const char *name;
	void (*run)(void);
};

/*
 * Memory first: "idle" means a daemon nothing has run on yet.  gpu last: its
 * rows read best under the throughput and transfer rows they put a GPU
 * floor under.
 */
static const struct scenario scenarios[] = {
	{ "memory", bench_daemon_memory },
	{ "roundtrip", bench_roundtrip },
	{ "throughput", bench_throughput },
	{ "transfer", bench_transfer },
	{ "allocator", bench_allocator },
	{ "scaling", bench_scaling },
	{ "gpu", bench_gpu },
};

int main(int argc, char **argv)
{
	const size_t nscen = sizeof(scenarios) / sizeof(scenarios[0]);
	struct machine m;
	struct sigaction sa;
	int c;

	bench.backend = "host";
	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_QUICK:
			bench.quick = true;
			break;
		case OPT_JSON:
			bench.json = true;
			break;
		case OPT_SOCKET:
			bench.socket = optarg;
			break;
		case OPT_BACKEND:
			if (strcmp(optarg, "host") != 0 &&
			    strcmp(optarg, "cuda") != 0 &&
			    strcmp(optarg, "auto") != 0) {
				fprintf(stderr,
					"gpucmd-bench: unknown backend "
					"'%s' (host, cuda or auto)\n",
					optarg);
				return 2;
			}
			bench.backend = optarg;
			break;
		case OPT_ONLY:
			bench.only = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gpucmd-bench: unexpected argument '%s'\n",
			argv[optind]);
		usage(stderr);
		return 2;
	}
	if (bench.only != NULL) {
		size_t i;

		/* A misspelt --only would measure nothing and exit 0. */
		for (i = 0; i < nscen; i++)
			if (strstr(scenarios[i].name, bench.only) != NULL)
				break;
		if (i == nscen) {
			fprintf(stderr,
				"gpucmd-bench: no scenario matches "
				"--only '%s'\n",
				bench.only);
			usage(stderr);
			return 2;
		}
	}
	bench.progress = isatty(STDERR_FILENO);
	/* Clients write to sockets a daemon may close: errors, not signals. */
	signal(SIGPIPE, SIG_IGN);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	machine_read(&m);
	if (bench.socket == NULL) {
		bench_progress("starting gpucmdd (--backend %s)",
			       bench.backend);
		if (start_daemon() != 0) {
			stop_daemon();
			remove_private_files();
			return 1;
		}
	} else {
		/*
		 * Scratch space for the scenarios that need a socket path
		 * (bench_scratch_path); without it they fail and say so.
		 */
		snprintf(tmpdir, sizeof(tmpdir), "/tmp/gpucmd-bench-XXXXXX");
		if (mkdtemp(tmpdir) == NULL)
			tmpdir[0] = '\0';
		bench.tmpdir = tmpdir;
	}
	bench.daemon_pid = daemon_pid(bench.socket);
	machine_device(&m);
	if (bench_errors == 0) {
		for (size_t i = 0; i < nscen; i++) {
			if (bench.only != NULL &&
			    strstr(scenarios[i].name, bench.only) == NULL)
				continue;
			bench_progress("[%zu/%zu] %s", i + 1, nscen,
				       scenarios[i].name);
			scenarios[i].run();
		}
	}
	if (getloadavg(&m.load[1], 1) != 1)
		m.load[1] = NAN;
	stop_daemon();
	remove_private_files();
	if (bench.progress)
		fputs("\r\033[K", stderr);
	if (bench.json)
		print_json(&m, argc, argv);
	else
		print_table(&m);
	fflush(stdout);
	return bench_errors ? 1 : 0;
}
