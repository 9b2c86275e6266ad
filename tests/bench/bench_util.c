/*
 * bench_util.c - the result table, clocks, statistics, /proc readers and
 * the raw socket floor of gpucmd-bench.  See bench.h.
 *
 * The echo child is the floor of every round-trip number: one process that
 * reads exactly a request's bytes and writes exactly a response's bytes on a
 * Unix stream socket, with blocking calls and no parsing.  A daemon that
 * decodes, schedules and answers the same bytes can only be slower; the
 * ratio says by how much.
 */
#include "bench.h"
#include "spin.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The table: bench_add appends, gpucmd_bench.c prints. */
struct bench_row *bench_rows;
size_t bench_nrows;
static size_t bench_rows_cap;
char **bench_notes;
size_t bench_nnotes;
int bench_errors;

void bench_add(const char *name, double value, const char *unit, double floor,
	       double ratio, enum bench_target target, double goal)
{
	struct bench_row *r;

	if (bench_nrows == bench_rows_cap) {
		size_t cap = bench_rows_cap ? 2 * bench_rows_cap : 64;
		struct bench_row *p = realloc(bench_rows, cap * sizeof(*p));

		if (p == NULL) {
			bench_error("out of memory for the result table");
			return;
		}
		bench_rows = p;
		bench_rows_cap = cap;
	}
	r = &bench_rows[bench_nrows++];
	snprintf(r->name, sizeof(r->name), "%s", name);
	snprintf(r->unit, sizeof(r->unit), "%s", unit);
	r->value = value;
	r->floor = floor;
	r->ratio = ratio;
	r->target = target;
	r->goal = goal;
}

void bench_note(const char *fmt, ...)
{
	char buf[512], **p;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	p = realloc(bench_notes, (bench_nnotes + 1) * sizeof(*p));
	if (p == NULL)
		return;
	bench_notes = p;
	bench_notes[bench_nnotes] = strdup(buf);
	if (bench_notes[bench_nnotes] != NULL)
		bench_nnotes++;
}

void bench_progress(const char *fmt, ...)
{
	va_list ap;

	if (!bench.progress)
		return;
	fputs("\r\033[K", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fflush(stderr);
}

void bench_error(const char *fmt, ...)
{
	va_list ap;

	if (bench.progress)
		fputs("\r\033[K", stderr);
	fputs("gpucmd-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	bench_errors++;
}

pid_t bench_fork(void)
{
	pid_t parent = getpid(), pid;
	sigset_t stop, old;

	fflush(stdout);
	fflush(stderr);
	/*
	 * Until the child has its own handling, a Ctrl-C must not run the
	 * parent's handler in it (which would stop the daemon and _exit).
	 */
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigprocmask(SIG_BLOCK, &stop, &old);
	pid = fork();
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		bench.progress = false;
		/*
		 * A SIGTERM to the bench alone, or a SIGKILL, must not leave
		 * an echo server or a flooder running: die with the parent
		 * (which may already be gone by now).
		 */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 ||
		    getppid() != parent)
			_exit(1);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	return pid;
}

/* ---- clocks and statistics ---------------------------------------------- */

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double bench_percentile(uint64_t *samples, size_t n, double p)
{
	size_t i;

	if (n == 0)
		return NAN;
	qsort(samples, n, sizeof(*samples), cmp_u64);
	/* Nearest rank: the smallest sample with at least p% at or below. */
	i = (size_t)ceil(p / 100.0 * (double)n);
	if (i > 0)
		i--;
	if (i >= n)
		i = n - 1;
	return (double)samples[i];
}

double bench_median(double *v, size_t n)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_jain(const double *x, size_t n)
{
	double sum = 0, sq = 0;

	for (size_t i = 0; i < n; i++) {
		sum += x[i];
		sq += x[i] * x[i];
	}
	if (n == 0 || sq == 0)
		return NAN;
	return sum * sum / ((double)n * sq);
}

/* ---- talking to the daemon ---------------------------------------------- */

struct gpucmd_conn *bench_connect(const char *service)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	int rc = gpucmd_connect(bench.socket, service, &c, msg, sizeof(msg));

	if (rc != 0) {
		bench_error("connect to %s as %s: %s (%s)", bench.socket,
			    service, gpucmd_strerror(rc), msg);
		return NULL;
	}
	return c;
}

int bench_run_ok(struct gpucmd_batch *b, const char *what)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	if (rc == 0) {
		rc = gpucmd_response_error(r);
		if (rc != 0)
			bench_error("%s: op %d failed: %s (%s)", what,
				    gpucmd_response_failed_index(r),
				    gpucmd_strerror(rc),
				    gpucmd_response_message(r));
		gpucmd_response_free(r);
	} else {
		bench_error("%s: %s", what, gpucmd_strerror(rc));
	}
	return rc;
}

int bench_add_spin0(struct gpucmd_batch *b)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	const struct gpucmd_arg arg = { .kind = GPUCMD_ARG_U32, .v.u32 = 0 };

	return gpucmd_batch_kernel(b, "spin", one, one, &arg, 1);
}

/* ---- /proc ----------------------------------------------------------------- */

/*
 * CPU time of one thread in nanoseconds: schedstat's run time (exact) where
 * the kernel has it, else utime + stime from stat (clock ticks).
 */
static int thread_cpu_ns(const char *dir, uint64_t *ns, char *comm,
			 size_t comm_len)
{
	char path[128], buf[1024], *p, *q;
	unsigned long long run, ut, st;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/schedstat", dir);
	f = fopen(path, "re");
	if (f != NULL) {
		int ok = fscanf(f, "%llu", &run) == 1;

		fclose(f);
		snprintf(path, sizeof(path), "%s/comm", dir);
		f = fopen(path, "re");
		if (ok && f != NULL && fgets(comm, (int)comm_len, f) != NULL) {
			fclose(f);
			comm[strcspn(comm, "\n")] = '\0';
			*ns = run;
			return 0;
		}
		if (f != NULL)
			fclose(f);
	}
	snprintf(path, sizeof(path), "%s/stat", dir);
	f = fopen(path, "re");
	if (f == NULL)
		return -errno;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The name is in parentheses and may itself hold spaces. */
	p = strchr(buf, '(');
	q = strrchr(buf, ')');
	if (p == NULL || q == NULL || q < p)
		return -EINVAL;
	snprintf(comm, comm_len, "%.*s", (int)(q - p - 1), p + 1);
	/* After ")": state is field 3; utime and stime are fields 14, 15. */
	p = q + 2;
	for (int field = 3; field < 14 && p != NULL; field++) {
		p = strchr(p, ' ');
		if (p != NULL)
			p++;
	}
	if (p == NULL || sscanf(p, "%llu %llu", &ut, &st) != 2)
		return -EINVAL;
	*ns = (ut + st) *
	      (1000000000ull / (unsigned long long)sysconf(_SC_CLK_TCK));
	return 0;
}

int bench_cpu_read(pid_t pid, struct bench_cpu *out)
{
	char path[64];
	struct dirent *de;
	DIR *dir;

	memset(out, 0, sizeof(*out));
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (dir == NULL)
		return -errno;
	while ((de = readdir(dir)) != NULL) {
		char tdir[96], comm[64];
		uint64_t ns = 0;

		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		snprintf(tdir, sizeof(tdir), "/proc/%d/task/%s", (int)pid,
			 de->d_name);
		if (thread_cpu_ns(tdir, &ns, comm, sizeof(comm)) != 0)
			continue; /* a thread that just ended */
		if (strcmp(comm, "gpucmd-stream") == 0)
			out->streams_ns += ns;
		else
			out->daemon_ns += ns;
	}
	closedir(dir);
	return 0;
}

uint64_t bench_rss(pid_t pid)
{
	char path[64], line[256];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* ---- the echo floor --------------------------------------------------------- */

/*
 * Before a blocking read (bench_echo_start_spinning), watch the socket the
 * way libgpucmd and gpucmdd do ($GPUCMD_SPIN_US, spin.h), so that the floor
 * uses the same technique as what it judges and a ratio below 1 is not an
 * artefact of a sleeping echo.
 */
/* $GPUCMD_SPIN_US, as libgpucmd reads it (its default when unset). */
static unsigned echo_spin_us(void)
{
	static int spin_us = -1;

	if (spin_us < 0) {
		const char *env = getenv("GPUCMD_SPIN_US");

		spin_us = env != NULL && env[0] != '\0' ? atoi(env) :
							  SPIN_DEFAULT_US;
		if (spin_us < 0)
			spin_us = 0;
	}
	return (unsigned)spin_us;
}

/* Watching first (spin_recv, as libgpucmd does) for spin_us, if any. */
static int read_all(int fd, void *buf, size_t len, unsigned spin_us)
{
	uint8_t *p = buf;

	if (spin_us > 0) {
		ssize_t n = spin_recv(fd, p, len, spin_us);

		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
	}
	while (len > 0) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n == 0 ? -EPIPE : -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += (size_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* How long e's side watches its socket before it blocks. */
static unsigned echo_watch_us(const struct bench_echo *e)
{
	if (!e->spin)
		return 0;
	return spin_budget(echo_spin_us(), e->copy_len > 0);
}

/* The child: answer every request, copying first when asked to. */
static void __attribute__((noreturn)) echo_child(struct bench_echo *e)
{
	uint8_t *own = NULL;

	if (e->copy_len > 0) {
		own = malloc(e->copy_len);
		if (own == NULL)
			_exit(1);
		memset(own, 0, e->copy_len); /* faulted in, as device memory */
	}
	while (read_all(3, e->req, e->req_len, echo_watch_us(e)) == 0) {
		if (own != NULL) {
			memcpy(own, e->copy_src, e->copy_len);
			__asm__ volatile("" : : "r"(own) : "memory");
		}
		if (write_all(3, e->resp, e->resp_len) != 0)
			break;
	}
	_exit(0);
}

static int echo_start(struct bench_echo *e, size_t req_len, size_t resp_len,
		      bool spin, const void *src, size_t copy_len)
{
	int sv[2];

	memset(e, 0, sizeof(*e));
	e->spin = spin;
	e->copy_src = src;
	e->copy_len = copy_len;
	e->req_len = req_len;
	e->resp_len = resp_len;
	e->req = calloc(1, req_len);
	e->resp = calloc(1, resp_len);
	if (e->req == NULL || e->resp == NULL)
		goto fail;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		goto fail;
	e->pid = bench_fork();
	if (e->pid < 0) {
		close(sv[0]);
		close(sv[1]);
		goto fail;
	}
	if (e->pid == 0) {
		/*
		 * Keep only our end: a copy of another echo's socket would
		 * keep that child from ever seeing its EOF.
		 */
		if (dup2(sv[1], 3) != 3)
			_exit(1);
		close_range(4, ~0u, 0);
		echo_child(e);
	}
	close(sv[1]);
	e->fd = sv[0];
	return 0;
fail:
	free(e->req);
	free(e->resp);
	e->req = e->resp = NULL;
	return -ENOMEM;
}

int bench_echo_send(struct bench_echo *e)
{
	return write_all(e->fd, e->req, e->req_len);
}

int bench_echo_recv(struct bench_echo *e)
{
	return read_all(e->fd, e->resp, e->resp_len, echo_watch_us(e));
}

int bench_echo_start(struct bench_echo *e, size_t req_len, size_t resp_len)
{
	return echo_start(e, req_len, resp_len, false, NULL, 0);
}

int bench_echo_start_spinning(struct bench_echo *e, size_t req_len,
			      size_t resp_len)
{
	return echo_start(e, req_len, resp_len, true, NULL, 0);
}

int bench_echo_start_copying(struct bench_echo *e, size_t req_len,
			     size_t resp_len, const void *src, size_t copy_len)
{
	return echo_start(e, req_len, resp_len, true, src, copy_len);
}

int bench_echo_roundtrip(struct bench_echo *e)
{
	int rc = bench_echo_send(e);

	return rc != 0 ? rc : bench_echo_recv(e);
}

void bench_echo_stop(struct bench_echo *e)
{
	if (e->pid > 0) {
		close(e->fd); /* the child sees EOF and leaves */
		waitpid(e->pid, NULL, 0);
		e->pid = 0;
	}
	free(e->req);
	free(e->resp);
	e->req = e->resp = NULL;
}
