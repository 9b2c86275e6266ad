/*
 * soak.c - a bounded soak of gpucmdd: mixed load from several client
 * processes for a set time, every result verified, and the daemon's
 * resident memory and open descriptors watched for growth.
 *
 *   soak [--daemon PATH] [--socket PATH] [--seconds N] [--clients K]
 *        [--backend NAME] [--seed S] [--quiet]
 *
 * With --daemon (default $BUILD/gpucmdd, BUILD defaulting to "build") the
 * soak starts its own daemon on a private socket and stops it at the end
 * (SIGTERM, exit status 0 required).  With --socket and no --daemon it
 * loads a daemon that is already running and finds its pid through the
 * socket's peer credentials.
 *
 * Every client process loops over a random mix of work, checking every
 * byte it reads back against what it wrote: create/read/release of random
 * sizes, fill and copy kernels, writes at random offsets, data written on
 * one stream and read on another, pipelined batches answered out of order,
 * memory usage and reports, a faulting kernel whose fault must surface at
 * the next sync of its stream (and only there), short spins, and
 * reconnects.  Clients that hang up with work in flight are part of the mix.
 *
 * The daemon's VmRSS and descriptor count are sampled every 250 ms; the
 * soak fails when the last quarter's peak exceeds the first quarter's by
 * more than --rss-slack MiB (default 32) or --fd-slack descriptors
 * (default 4), when a client sees a wrong result, or when the memory report
 * is not back to zero at the end.
 *
 * Exit status: 0 passed, 1 failed, 2 usage, 77 skipped (no daemon binary).
 */
#include <errno.h>
#include <dirent.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpucmd.h"

#define MAX_CLIENTS 64
#define MAX_SAMPLES 100000

static struct {
	const char *daemon;
	const char *socket;
	const char *backend;
	unsigned seconds;
	unsigned clients;
	unsigned seed;
	long rss_slack_kb;
	int fd_slack;
	bool quiet;
} opt = {
	.backend = "host",
	.seconds = 60,
	.clients = 4,
	.seed = 1,
	.rss_slack_kb = 32 * 1024,
	.fd_slack = 4,
};

static char sock_path[128];
static char tmp_dir[64];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the client processes ------------------------------------------------- */

struct client {
	int index;
	unsigned seed;
	struct gpucmd_conn *conn;
	uint64_t next_handle;
	uint64_t ops;
	uint64_t batches;
};

#define fail_client(c, ...)                                                  \
	do {                                                                 \
		fprintf(stderr, "soak: client %d: ", (c)->index);            \
		fprintf(stderr, __VA_ARGS__);                                \
		fputc('\n', stderr);                                         \
		_exit(1);                                                    \
	} while (0)

static unsigned rnd(struct client *c, unsigned n)
{
	return n ? (unsigned)rand_r(&c->seed) % n : 0;
}

static void connect_client(struct client *c)
{
	char msg[256] = "";
	char service[32];
	int rc;

	snprintf(service, sizeof(service), "soak-%d", c->index % 3);
	for (int tries = 0;; tries++) {
		rc = gpucmd_connect(sock_path, service, &c->conn, msg,
				    sizeof(msg));
		if (rc == 0)
			return;
		if (tries > 100)
			fail_client(c, "connect: %s (%s)", gpucmd_strerror(rc),
				    msg);
		usleep(10000);
	}
}

static struct gpucmd_batch *new_batch(struct client *c, uint32_t stream)
{
	struct gpucmd_batch *b = NULL;

	if (gpucmd_batch_new(c->conn, stream, &b) != 0)
		fail_client(c, "batch_new failed");
	return b;
}

/* Run b; it must succeed; the response is returned. */
static struct gpucmd_response *run(struct client *c, struct gpucmd_batch *b,
				   const char *what)
{
	struct gpucmd_response *r = NULL;
	size_t n = gpucmd_batch_count(b);
	int rc = gpucmd_run(b, &r);

	if (rc != 0)
		fail_client(c, "%s: run: %s", what, gpucmd_strerror(rc));
	if (gpucmd_response_error(r) != 0)
		fail_client(c, "%s: op %d failed: %s (%s)", what,
			    gpucmd_response_failed_index(r),
			    gpucmd_errname(gpucmd_response_error(r)),
			    gpucmd_response_message(r));
	if (gpucmd_response_count(r) != n)
		fail_client(c, "%s: %zu results for %zu ops", what,
			    gpucmd_response_count(r), n);
	c->ops += n;
	c->batches++;
	return r;
}

static void expect_bytes(struct client *c, const struct gpucmd_response *r,
			 size_t i, const uint8_t *want, size_t len,
			 const char *what)
{
	const uint8_t *got;
	size_t got_len;

	if (gpucmd_response_data(r, i, (const void **)&got, &got_len) != 0)
		fail_client(c, "%s: result %zu carries no data", what, i);
	if (got_len != len)
		fail_client(c, "%s: read %zu bytes, expected %zu", what, got_len,
			    len);
	for (size_t k = 0; k < len; k++)
		if (got[k] != want[k])
			fail_client(c, "%s: byte %zu is 0x%02x, expected 0x%02x",
				    what, k, got[k], want[k]);
}

static void pattern(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(seed + i * 31 + (i >> 9));
}

static uint64_t handle(struct client *c)
{
	return ++c->next_handle;
}

/* create, read back, release: sizes from 1 byte to 256 KiB. */
static void work_roundtrip(struct client *c, uint8_t *buf)
{
	size_t len = 1 + rnd(c, 1u << (1 + rnd(c, 18)));
	uint32_t stream = rnd(c, 4);
	uint64_t h = handle(c);
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;

	pattern(buf, len, (unsigned)h);
	gpucmd_batch_create_with_data(b, h, buf, len);
	gpucmd_batch_read(b, h, 0, len);
	gpucmd_batch_release(b, h);
	r = run(c, b, "roundtrip");
	expect_bytes(c, r, 1, buf, len, "roundtrip");
	gpucmd_response_free(r);
}

/* fill_u32 on a fresh buffer (same stream), then read. */
static void work_fill(struct client *c, uint8_t *buf)
{
	uint32_t count = 1 + rnd(c, 16384), value = (uint32_t)rand_r(&c->seed);
	uint32_t grid[3] = { 1 + rnd(c, 64), 1, 1 }, block[3] = { 64, 1, 1 };
	uint32_t stream = rnd(c, 4);
	uint64_t h = handle(c);
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = h },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = value },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = count },
	};
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;

	gpucmd_batch_empty(b, h, (uint64_t)count * 4);
	gpucmd_batch_kernel(b, "fill_u32", grid, block, args, 3);
	gpucmd_batch_read(b, h, 0, (uint64_t)count * 4);
	gpucmd_batch_release(b, h);
	r = run(c, b, "fill");
	for (uint32_t i = 0; i < count; i++)
		memcpy(buf + (size_t)i * 4, &value, 4);
	expect_bytes(c, r, 2, buf, (size_t)count * 4, "fill");
	gpucmd_response_free(r);
}

/*
 * Data written on one stream and used on others: a copy kernel on a second
 * stream and a read on a third must see the write (the daemon orders them).
 */
static void work_cross_stream(struct client *c, uint8_t *buf)
{
	size_t len = 1 + rnd(c, 65536);
	uint64_t src = handle(c), dst = handle(c);
	uint32_t s1 = rnd(c, 4), s2 = rnd(c, 4), s3 = rnd(c, 4);
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = dst },
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = src },
		{ .kind = GPUCMD_ARG_U64, .v.u64 = len },
	};
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t ids[3];

	pattern(buf, len, (unsigned)src * 7);
	b = new_batch(c, s1);
	gpucmd_batch_create_with_data(b, src, buf, len);
	gpucmd_batch_create_with_data(b, dst, buf + 1, len);	/* not the answer */
	if (gpucmd_submit(b, &ids[0]) != 0)
		fail_client(c, "submit");
	b = new_batch(c, s2);
	gpucmd_batch_kernel(b, "copy", one, one, args, 3);
	if (gpucmd_submit(b, &ids[1]) != 0)
		fail_client(c, "submit");
	b = new_batch(c, s3);
	gpucmd_batch_read(b, dst, 0, len);
	gpucmd_batch_release(b, src);
	gpucmd_batch_release(b, dst);
	if (gpucmd_submit(b, &ids[2]) != 0)
		fail_client(c, "submit");
	/* Answers collected in reverse order. */
	for (int i = 2; i >= 0; i--) {
		if (gpucmd_wait(c->conn, ids[i], &r) != 0)
			fail_client(c, "wait");
		if (gpucmd_response_error(r) != 0)
			fail_client(c, "cross-stream batch %d: %s (%s)", i,
				    gpucmd_errname(gpucmd_response_error(r)),
				    gpucmd_response_message(r));
		if (i == 2)
			expect_bytes(c, r, 0, buf, len, "cross-stream copy");
		gpucmd_response_free(r);
		c->batches++;
	}
}

/* Writes at random offsets of a buffer, read back whole. */
static void work_writes(struct client *c, uint8_t *buf)
{
	size_t len = 64 + rnd(c, 32768);
	uint64_t h = handle(c);
	uint32_t stream = rnd(c, 4);
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;
	uint8_t *want = buf + 65536 * 4;

	pattern(want, len, 3);
	gpucmd_batch_create_with_data(b, h, want, len);
	for (int i = 0; i < 8; i++) {
		size_t off = rnd(c, (unsigned)len), n = 1 + rnd(c, (unsigned)(len - off));

		pattern(want + off, n, (unsigned)(i * 11 + off));
		gpucmd_batch_write(b, h, off, want + off, n);
	}
	gpucmd_batch_read(b, h, 0, len);
	gpucmd_batch_release(b, h);
	r = run(c, b, "writes");
	expect_bytes(c, r, 9, want, len, "writes");
	gpucmd_response_free(r);
}

/* A fault: reported at the next sync of its stream, once, and only there. */
static void work_fault(struct client *c)
{
	uint32_t one[3] = { 1, 1, 1 };
	uint32_t s = rnd(c, 4), other = (s + 1) % 4;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;

	b = new_batch(c, s);
	gpucmd_batch_kernel(b, "fault", one, one, NULL, 0);
	gpucmd_response_free(run(c, b, "fault launch"));
	b = new_batch(c, other);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "sync of another stream"));
	b = new_batch(c, s);
	gpucmd_batch_sync(b);
	if (gpucmd_run(b, &r) != 0)
		fail_client(c, "fault sync: run");
	if (gpucmd_response_error(r) != GPUCMD_ESTREAM)
		fail_client(c, "the sync after a fault got %s, not "
			    "GPUCMD_ESTREAM",
			    gpucmd_errname(gpucmd_response_error(r)));
	gpucmd_response_free(r);
	b = new_batch(c, s);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "sync after the reported fault"));
}

static void work_reports(struct client *c)
{
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u;
	struct gpucmd_report *rep = NULL;
	struct gpucmd_status st;

	gpucmd_batch_memory_usage(b);
	gpucmd_batch_ping(b);
	r = run(c, b, "usage");
	if (gpucmd_response_usage(r, 0, &u) != 0 || u.bytes_in_use > u.bytes_reserved)
		fail_client(c, "memory usage: %llu in use, %llu reserved",
			    (unsigned long long)u.bytes_in_use,
			    (unsigned long long)u.bytes_reserved);
	gpucmd_response_free(r);
	if (gpucmd_memory_report(c->conn, &rep) != 0)
		fail_client(c, "memory report");
	gpucmd_report_free(rep);
	if (gpucmd_status(c->conn, &st) != 0)
		fail_client(c, "status");
}

/* Pipelined batches, then a hang-up with some still in flight. */
static void work_hangup(struct client *c, uint8_t *buf)
{
	uint64_t id;

	for (int i = 0; i < 1 + (int)rnd(c, 16); i++) {
		struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
		uint64_t h = handle(c);

		gpucmd_batch_create_with_data(b, h, buf, 1 + rnd(c, 8192));
		if (rnd(c, 2))
			gpucmd_batch_sync(b);
		if (gpucmd_submit(b, &id) != 0)
			fail_client(c, "submit");
	}
	gpucmd_close(c->conn);
	c->conn = NULL;
	connect_client(c);
}

static void work_spin(struct client *c)
{
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U32, .v.u32 = 50 + rnd(c, 500) };
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));

	gpucmd_batch_kernel(b, "spin", one, one, &a, 1);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "spin"));
}

static void client_main(int index, uint64_t until_ms)
{
	struct client c = { .index = index, .seed = opt.seed * 7919 + index };
	uint8_t *buf = malloc(65536 * 8);

	if (buf == NULL)
		fail_client(&c, "out of memory");
	connect_client(&c);
	while (now_ms() < until_ms) {
		unsigned w = rnd(&c, 100);

		if (w < 30)
			work_roundtrip(&c, buf);
		else if (w < 45)
			work_fill(&c, buf);
		else if (w < 65)
			work_cross_stream(&c, buf);
		else if (w < 80)
			work_writes(&c, buf);
		else if (w < 85)
			work_fault(&c);
		else if (w < 92)
			work_reports(&c);
		else if (w < 95)
			work_hangup(&c, buf);
		else
			work_spin(&c);
	}
	gpucmd_close(c.conn);
	free(buf);
	if (!opt.quiet)
		printf("soak: client %d: %llu batches, %llu ops, all verified\n",
		       index, (unsigned long long)c.batches,
		       (unsigned long long)c.ops);
	fflush(stdout);
	_exit(0);
}

/* ---- the daemon ------------------------------------------------------------ */

static pid_t start_daemon(void)
{
	pid_t pid;
	char log[128];

	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/gpucmd-soak-XXXXXX");
	if (mkdtemp(tmp_dir) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(sock_path, sizeof(sock_path), "%s/s.sock", tmp_dir);
	snprintf(log, sizeof(log), "%s/daemon.log", tmp_dir);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		FILE *f = freopen(log, "w", stderr);

		(void)f;
		execl(opt.daemon, opt.daemon, "--socket", sock_path,
		      "--backend", opt.backend, "--log-level", "notice",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 2000; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
		rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		close(fd);
		if (rc == 0)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			fprintf(stderr, "soak: %s exited at start; see %s\n",
				opt.daemon, log);
			exit(1);
		}
		usleep(10000);
	}
	fprintf(stderr, "soak: the daemon did not listen within 20 s\n");
	kill(pid, SIGKILL);
	exit(1);
}

static pid_t peer_pid(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		fprintf(stderr, "soak: cannot reach the daemon on %s\n",
			sock_path);
		exit(1);
	}
	close(fd);
	return cred.pid;
}

static long rss_kb(pid_t pid)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "VmRSS:", 6) == 0)
			v = strtol(line + 6, NULL, 10);
	fclose(f);
	return v;
}

static int fd_count(pid_t pid)
{
	char path[64];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *out)
{
	fprintf(out,
		"usage: soak [--daemon PATH | --socket PATH] [--seconds N] "
		"[--clients K]\n"
		"            [--backend NAME] [--seed S] [--rss-slack MiB] "
		"[--fd-slack N] [--quiet]\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "socket", required_argument, NULL, 's' },
		{ "seconds", required_argument, NULL, 't' },
		{ "clients", required_argument, NULL, 'c' },
		{ "backend", required_argument, NULL, 'b' },
		{ "seed", required_argument, NULL, 'r' },
		{ "rss-slack", required_argument, NULL, 'R' },
		{ "fd-slack", required_argument, NULL, 'F' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static long rss[MAX_SAMPLES];
	static int fds[MAX_SAMPLES];
	static pid_t kids[MAX_CLIENTS];
	char default_daemon[256];
	const char *build = getenv("BUILD");
	bool own = false, failed = false;
	size_t n = 0;
	pid_t daemon;
	uint64_t until;
	int ch;

	snprintf(default_daemon, sizeof(default_daemon), "%s/gpucmdd",
		 build != NULL && build[0] ? build : "build");
	while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (ch) {
		case 'd':
			opt.daemon = optarg;
			break;
		case 's':
			opt.socket = optarg;
			break;
		case 't':
			opt.seconds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'c':
			opt.clients = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'b':
			opt.backend = optarg;
			break;
		case 'r':
			opt.seed = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'R':
			opt.rss_slack_kb = strtol(optarg, NULL, 10) * 1024;
			break;
		case 'F':
			opt.fd_slack = (int)strtol(optarg, NULL, 10);
			break;
		case 'q':
			opt.quiet = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (opt.clients < 1 || opt.clients > MAX_CLIENTS || opt.seconds < 4) {
		fprintf(stderr, "soak: 1 to %d clients and at least 4 seconds\n",
			MAX_CLIENTS);
		return 2;
	}
	if (opt.socket == NULL) {
		struct stat st;

		if (opt.daemon == NULL)
			opt.daemon = default_daemon;
		if (stat(opt.daemon, &st) != 0) {
			printf("soak: skipped: %s is not built\n", opt.daemon);
			return 77;
		}
		daemon = start_daemon();
		own = true;
	} else {
		snprintf(sock_path, sizeof(sock_path), "%s", opt.socket);
		daemon = peer_pid();
	}
	signal(SIGPIPE, SIG_IGN);
	printf("soak: %u clients for %u s against gpucmdd pid %d\n",
	       opt.clients, opt.seconds, (int)daemon);
	fflush(stdout);

	until = now_ms() + (uint64_t)opt.seconds * 1000;
	for (unsigned i = 0; i < opt.clients; i++) {
		kids[i] = fork();
		if (kids[i] < 0) {
			perror("fork");
			return 1;
		}
		if (kids[i] == 0)
			client_main((int)i, until);
	}
	while (now_ms() < until && n < MAX_SAMPLES) {
		rss[n] = rss_kb(daemon);
		fds[n] = fd_count(daemon);
		if (rss[n] < 0 || fds[n] < 0) {
			fprintf(stderr, "soak: the daemon (pid %d) is gone\n",
				(int)daemon);
			failed = true;
			break;
		}
		n++;
		usleep(250000);
	}
	for (unsigned i = 0; i < opt.clients; i++) {
		int status;

		waitpid(kids[i], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "soak: client %u failed (status 0x%x)\n",
				i, status);
			failed = true;
		}
	}

	/* Growth: the last quarter's peak against the first quarter's. */
	if (!failed && n >= 8) {
		long rss_first = 0, rss_last = 0;
		int fd_first = 0, fd_last = 0;

		for (size_t i = 0; i < n / 4; i++) {
			if (rss[i] > rss_first)
				rss_first = rss[i];
			if (fds[i] > fd_first)
				fd_first = fds[i];
		}
		for (size_t i = n - n / 4; i < n; i++) {
			if (rss[i] > rss_last)
				rss_last = rss[i];
			if (fds[i] > fd_last)
				fd_last = fds[i];
		}
		printf("soak: daemon RSS peak %ld KiB in the first quarter, %ld "
		       "KiB in the last; descriptors %d and %d (%zu samples)\n",
		       rss_first, rss_last, fd_first, fd_last, n);
		if (rss_last > rss_first + opt.rss_slack_kb) {
			fprintf(stderr, "soak: the daemon's RSS grew by %ld KiB "
				"(allowed %ld)\n", rss_last - rss_first,
				opt.rss_slack_kb);
			failed = true;
		}
		if (fd_last > fd_first + opt.fd_slack) {
			fprintf(stderr, "soak: the daemon's descriptors grew "
				"from %d to %d\n", fd_first, fd_last);
			failed = true;
		}
	}

	/* Every client is gone: nothing may be held any more. */
	if (!failed) {
		struct gpucmd_conn *c = NULL;
		struct gpucmd_report *rep = NULL;
		char msg[256];
		bool zero = false;

		if (gpucmd_connect(sock_path, "soak-check", &c, msg,
				   sizeof(msg)) != 0) {
			fprintf(stderr, "soak: cannot connect at the end: %s\n",
				msg);
			failed = true;
		}
		for (int i = 0; c != NULL && i < 500 && !zero; i++) {
			if (gpucmd_memory_report(c, &rep) != 0) {
				failed = true;
				break;
			}
			zero = rep->totals.bytes_in_use == 0 &&
			       rep->totals.allocations == 0 &&
			       rep->totals.connections == 1;
			if (!zero && i == 499)
				fprintf(stderr, "soak: at the end %llu bytes "
					"in %llu allocations are held, %u "
					"connections open\n",
					(unsigned long long)rep->totals.bytes_in_use,
					(unsigned long long)rep->totals.allocations,
					rep->totals.connections);
			gpucmd_report_free(rep);
			if (!zero)
				usleep(10000);
		}
		if (!zero)
			failed = true;
		if (c != NULL)
			gpucmd_close(c);
	}

	if (own) {
		int status = 0;

		kill(daemon, SIGTERM);
		for (int i = 0; i < 2000; i++) {
			if (waitpid(daemon, &status, WNOHANG) == daemon)
				break;
			usleep(10000);
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			char cmd[256];

			fprintf(stderr, "soak: gpucmdd did not exit 0 after "
				"SIGTERM (status 0x%x); its log:\n", status);
			snprintf(cmd, sizeof(cmd), "tail -n 20 %s/daemon.log >&2",
				 tmp_dir);
			if (system(cmd) != 0)
				fprintf(stderr, "(no log)\n");
			kill(daemon, SIGKILL);
			waitpid(daemon, NULL, 0);
			failed = true;
		}
		if (!failed) {
			char path[160];

			snprintf(path, sizeof(path), "%s/daemon.log", tmp_dir);
			unlink(path);
			unlink(sock_path);
			rmdir(tmp_dir);
		} else {
			fprintf(stderr, "soak: daemon log kept in %s\n", tmp_dir);
		}
	}
	printf("soak: %s\n", failed ? "FAILED" : "passed");
	return failed ? 1 : 0;
}
