/*
 * bench_scaling.c - many client processes at once.
 *
 * Throughput and fairness: 1, 4, 16 and 64 client processes (fork), each
 * its own service, each doing ping round trips back to back for the same
 * window.  The aggregate is the sum of their round trips per second; Jain's
 * index, (sum x)^2 / (n sum x^2), says how evenly the daemon shared itself
 * (1 = perfectly even).  The floor is the same clients against a single-
 * threaded epoll echo server moving the same bytes: what one event loop
 * can do on this machine, and how fair the kernel's scheduler is by itself.
 *
 * Latency under load: one latency client measures its idle ping round trip,
 * then again while 16 flooding clients (each its own service) keep batches
 * of 256 spin(0) four deep in flight.  Target: its p99 under the flood at
 * most 5x its own idle p50.  The same client's {spin(0); sync} round trips,
 * idle and under the flood, show what a client that runs kernels sees (the
 * device thread's rounds and a stream take part, not only the loop); they
 * have no target.
 *
 * Clients connect first and then wait on a pipe that the parent closes, so
 * that they all start together and connecting is not timed.  Children only
 * leave through _exit.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define SCALE_MAX_CLIENTS 64
#define FLOOD_CLIENTS 16
#define FLOOD_BATCH 256
#define FLOOD_DEPTH 4

/* Shared between the parent and its children (MAP_SHARED). */
struct shared {
	atomic_int ready;	 /* children connected and waiting */
	atomic_int failed;	 /* children that could not do their part */
	atomic_int stop;	 /* flooders: leave now */
	_Atomic uint64_t end_ns; /* clients: stop at this time */
	uint64_t count[SCALE_MAX_CLIENTS + FLOOD_CLIENTS];
};

static struct shared *sh;

/* ---- clients ---------------------------------------------------------------- */

/* Block until the parent closes the start pipe. */
static void wait_start(int fd)
{
	char c;

	while (read(fd, &c, 1) < 0 && errno == EINTR)
		;
}

/*
 * One round trip of c: a ping, or with work, a {spin(0); sync} batch, the
 * least a client that runs kernels waits for (the device thread and the
 * stream take part).
 */
static int roundtrip_once(struct gpucmd_conn *c, bool work)
{
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	int rc = gpucmd_batch_new(c, 0, &b);

	if (rc != 0)
		return rc;
	if (work) {
		rc = bench_add_spin0(b);
		if (rc == 0)
			rc = gpucmd_batch_sync(b);
	} else {
		rc = gpucmd_batch_ping(b);
	}
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	rc = gpucmd_run(b, &r);
	if (rc == 0)
		rc = gpucmd_response_error(r);
	gpucmd_response_free(r);
	return rc;
}

static int ping_once(struct gpucmd_conn *c)
{
	return roundtrip_once(c, false);
}

static void __attribute__((noreturn)) client_daemon(int idx, int start_fd)
{
	char service[32];
	struct gpucmd_conn *c;
	uint64_t n = 0;

	snprintf(service, sizeof(service), "bench-c%d", idx);
	c = bench_connect(service);
	if (c == NULL || ping_once(c) != 0) {
		atomic_fetch_add(&sh->failed, 1);
		atomic_fetch_add(&sh->ready, 1);
		_exit(1);
	}
	atomic_fetch_add(&sh->ready, 1);
	wait_start(start_fd);
	while (bench_now_ns() < atomic_load(&sh->end_ns)) {
		if (ping_once(c) != 0) {
			atomic_fetch_add(&sh->failed, 1);
			break;
		}
		n++;
	}
	sh->count[idx] = n;
	gpucmd_close(c);
	_exit(0);
}

static int full_io(int fd, void *buf, size_t len, bool wr)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n =
			wr ? send(fd, p, len, MSG_NOSIGNAL) : read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void __attribute__((noreturn))
client_echo(int idx, int start_fd, const char *path, size_t req, size_t resp)
{
	uint8_t *q = calloc(1, req), *a = calloc(1, resp);
	int fd = unix_connect(path);
	uint64_t n = 0;

	atomic_fetch_add(&sh->ready, 1);
	if (fd < 0 || q == NULL || a == NULL) {
		atomic_fetch_add(&sh->failed, 1);
		_exit(1);
	}
	wait_start(start_fd);
	while (bench_now_ns() < atomic_load(&sh->end_ns)) {
		if (full_io(fd, q, req, true) != 0 ||
		    full_io(fd, a, resp, false) != 0) {
			atomic_fetch_add(&sh->failed, 1);
			break;
		}
		n++;
	}
	sh->count[idx] = n;
	close(fd);
	_exit(0);
}

/* ---- the epoll echo server (the floor) -------------------------------------- */

struct echo_conn {
	int fd;
	size_t have;
};

static void __attribute__((noreturn)) echo_server(int lfd, size_t req,
						  size_t resp)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN }, evs[64];
	uint8_t *buf = calloc(1, req > resp ? req : resp);

	if (ep < 0 || buf == NULL)
		_exit(1);
	ev.data.ptr = NULL; /* NULL: the listening socket */
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			_exit(1);
		for (int i = 0; i < n; i++) {
			struct echo_conn *c = evs[i].data.ptr;
			ssize_t got;

			if (c == NULL) {
				int fd = accept4(lfd, NULL, NULL,
						 SOCK_CLOEXEC | SOCK_NONBLOCK);

				c = fd >= 0 ? calloc(1, sizeof(*c)) : NULL;
				if (c == NULL) {
					if (fd >= 0)
						close(fd);
					continue;
				}
				c->fd = fd;
				ev.events = EPOLLIN;
				ev.data.ptr = c;
				epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
				continue;
			}
			got = read(c->fd, buf, req - c->have);
			if (got <= 0) {
				if (got < 0 && errno == EAGAIN)
					continue;
				close(c->fd);
				free(c);
				continue;
			}
			c->have += (size_t)got;
			if (c->have < req)
				continue;
			c->have = 0;
			/* The client waits for this: a small blocking write. */
			if (full_io(c->fd, buf, resp, true) != 0) {
				close(c->fd);
				free(c);
			}
		}
	}
}

/* ---- running a wave of clients ---------------------------------------------- */

struct wave {
	size_t nclients;
	uint64_t dur_ns;
	bool floor;	  /* echo server instead of the daemon */
	const char *path; /* echo server socket */
	size_t req, resp;
};

/* Run one wave; per-client counts in sh->count.  0 or -1. */
static int run_wave(const struct wave *w)
{
	pid_t pids[SCALE_MAX_CLIENTS];
	int start[2], rc = 0;
	size_t forked = 0;

	if (pipe2(start, O_CLOEXEC) != 0)
		return -1;
	atomic_store(&sh->ready, 0);
	atomic_store(&sh->failed, 0);
	memset(sh->count, 0, sizeof(sh->count));
	atomic_store(&sh->end_ns, UINT64_MAX);
	for (; forked < w->nclients; forked++) {
		pids[forked] = bench_fork();
		if (pids[forked] < 0)
			break;
		if (pids[forked] == 0) {
			close(start[1]);
			if (w->floor)
				client_echo((int)forked, start[0], w->path,
					    w->req, w->resp);
			client_daemon((int)forked, start[0]);
		}
	}
	for (int i = 0; i < 3000 && (size_t)atomic_load(&sh->ready) < forked;
	     i++)
		usleep(10000);
	/* Everyone is connected: start the window now. */
	atomic_store(&sh->end_ns, bench_now_ns() + w->dur_ns);
	close(start[1]);
	close(start[0]);
	for (size_t i = 0; i < forked; i++)
		waitpid(pids[i], NULL, 0);
	if (forked < w->nclients || atomic_load(&sh->failed) > 0)
		rc = -1;
	return rc;
}

static void wave_stats(size_t n, uint64_t dur_ns, double *aggregate,
		       double *jain)
{
	double x[SCALE_MAX_CLIENTS], sum = 0;

	for (size_t i = 0; i < n; i++) {
		x[i] = (double)sh->count[i];
		sum += x[i];
	}
	*aggregate = sum * 1e9 / (double)dur_ns;
	*jain = bench_jain(x, n);
}

static int start_echo_server(const char *path, size_t req, size_t resp,
			     pid_t *pid)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (lfd < 0)
		return -1;
	unlink(path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(lfd, 128) != 0) {
		close(lfd);
		return -1;
	}
	*pid = bench_fork();
	if (*pid == 0)
		echo_server(lfd, req, resp);
	close(lfd);
	return *pid > 0 ? 0 : -1;
}

static void scaling_waves(void)
{
	static const size_t counts[] = { 1, 4, 16, 64 };
	const size_t req = bench_wire_request(BENCH_OP_PING, 1);
	const size_t resp = bench_wire_response(1);
	char path[160] = "";
	pid_t echo;

	if (bench_scratch_path("echo.sock", path, sizeof(path)) != 0 ||
	    start_echo_server(path, req, resp, &echo) != 0) {
		bench_error("scaling: cannot start the echo server on %s",
			    path[0] ? path : "a path in the private directory");
		return;
	}
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		size_t n = counts[i];
		/* The 64-client wave is kept short. */
		uint64_t dur = bench.quick ? 400000000ull : 3000000000ull;
		struct wave w = {
			.nclients = n, .path = path, .req = req, .resp = resp
		};
		double agg, jain, f_agg, f_jain;
		char name[64];

		if (n == 64)
			dur = bench.quick ? 300000000ull : 1500000000ull;
		w.dur_ns = dur;
		bench_progress("scaling: %zu clients", n);
		if (run_wave(&w) != 0) {
			bench_error("scaling: a wave of %zu daemon clients "
				    "failed",
				    n);
			break;
		}
		wave_stats(n, dur, &agg, &jain);
		w.floor = true;
		if (run_wave(&w) != 0) {
			bench_error("scaling: a wave of %zu echo clients "
				    "failed",
				    n);
			break;
		}
		wave_stats(n, dur, &f_agg, &f_jain);
		snprintf(name, sizeof(name), "scaling %zu clients: aggregate",
			 n);
		bench_add(name, agg, "rt/s", f_agg, agg / f_agg, TARGET_NONE,
			  0);
		if (n > 1) {
			snprintf(name, sizeof(name),
				 "scaling %zu clients: fairness", n);
			bench_add(name, jain, "jain", f_jain, jain / f_jain,
				  TARGET_VALUE_GE, 0.9);
		}
	}
	kill(echo, SIGTERM);
	waitpid(echo, NULL, 0);
	unlink(path);
}

/* ---- latency under a flood ---------------------------------------------------- */

static void __attribute__((noreturn)) flooder(int idx, int start_fd)
{
	uint64_t ids[FLOOD_DEPTH], n = 0;
	size_t head = 0, inflight = 0;
	char service[32];
	struct gpucmd_conn *c;

	snprintf(service, sizeof(service), "bench-flood%d", idx);
	c = bench_connect(service);
	atomic_fetch_add(&sh->ready, 1);
	if (c == NULL) {
		atomic_fetch_add(&sh->failed, 1);
		_exit(1);
	}
	wait_start(start_fd);
	for (;;) {
		bool more = !atomic_load(&sh->stop);
		struct gpucmd_response *r = NULL;

		while (more && inflight < FLOOD_DEPTH) {
			struct gpucmd_batch *b;
			int rc = gpucmd_batch_new(c, 0, &b);

			for (int k = 0; rc == 0 && k < FLOOD_BATCH; k++)
				rc = bench_add_spin0(b);
			if (rc == 0)
				rc = gpucmd_submit(b, &ids[(head + inflight) %
							   FLOOD_DEPTH]);
			else
				gpucmd_batch_free(b);
			if (rc != 0)
				goto fail;
			inflight++;
		}
		if (inflight == 0)
			break;
		if (gpucmd_wait(c, ids[head], &r) != 0 ||
		    gpucmd_response_error(r) != 0) {
			gpucmd_response_free(r);
			goto fail;
		}
		gpucmd_response_free(r);
		head = (head + 1) % FLOOD_DEPTH;
		inflight--;
		/*
		 * The parent's window ends at stop: what drains after it
		 * (up to FLOOD_DEPTH batches) is not counted against it.
		 */
		if (!atomic_load(&sh->stop))
			n += FLOOD_BATCH;
	}
	sh->count[SCALE_MAX_CLIENTS + idx] = n;
	gpucmd_close(c);
	_exit(0);
fail:
	atomic_fetch_add(&sh->failed, 1);
	_exit(1);
}

/*
 * Up to n ping round trips of c into samples (ns), for at most max_ns: a
 * flooded daemon may take milliseconds per ping.  The count, or 0 on error.
 */
static size_t sample_roundtrips(struct gpucmd_conn *c, bool work,
				uint64_t *samples, size_t n, uint64_t max_ns,
				struct bench_echo *echo, uint64_t *echo_samples)
{
	uint64_t end = bench_now_ns() + max_ns;
	size_t i;

	for (i = 0; i < n && bench_now_ns() < end; i++) {
		uint64_t t0 = bench_now_ns();

		if (roundtrip_once(c, work) != 0)
			return 0;
		samples[i] = bench_now_ns() - t0;
		/* The machine's own: the same bytes to an echo, in turn. */
		if (echo != NULL) {
			t0 = bench_now_ns();
			if (bench_echo_roundtrip(echo) != 0)
				return 0;
			echo_samples[i] = bench_now_ns() - t0;
		}
	}
	return i;
}

static size_t sample_pings(struct gpucmd_conn *c, uint64_t *samples, size_t n,
			   uint64_t max_ns, struct bench_echo *echo,
			   uint64_t *echo_samples)
{
	return sample_roundtrips(c, false, samples, n, max_ns, echo,
				 echo_samples);
}

static void latency_under_flood(void)
{
	const size_t n = bench.quick ? 2000 : 10000;
	const uint64_t cap = bench.quick ? 3000000000ull : 10000000000ull;
	uint64_t *idle = calloc(n, sizeof(*idle));
	uint64_t *busy = calloc(n, sizeof(*busy));
	uint64_t *ebusy = calloc(n, sizeof(*ebusy));
	/* A client that runs kernels: {spin(0); sync}, fewer of them. */
	const size_t nw = n / 4;
	uint64_t *widle = calloc(nw, sizeof(*widle));
	uint64_t *wbusy = calloc(nw, sizeof(*wbusy));
	struct bench_echo echo;
	bool have_echo = false;
	pid_t pids[FLOOD_CLIENTS];
	struct gpucmd_conn *c = bench_connect("bench-latency");
	uint64_t t0, flood_ns, flood_ops = 0;
	double idle50, busy50, busy99;
	int start[2];
	size_t forked = 0, nidle = 0, nbusy = 0, nwidle = 0, nwbusy = 0;
	bool ok;

	if (c == NULL || idle == NULL || busy == NULL || ebusy == NULL ||
	    widle == NULL || wbusy == NULL)
		goto out;
	have_echo =
		bench_echo_start(&echo, bench_wire_request(BENCH_OP_PING, 1),
				 bench_wire_response(1)) == 0;
	bench_progress("scaling: latency client alone");
	/* Warm up, then the idle reference. */
	ok = sample_pings(c, idle, n / 10, cap, NULL, NULL) > 0 &&
	     (nidle = sample_pings(c, idle, n, cap, NULL, NULL)) > 0 &&
	     sample_roundtrips(c, true, widle, nw / 10, cap, NULL, NULL) > 0 &&
	     (nwidle = sample_roundtrips(c, true, widle, nw, cap, NULL, NULL)) >
		     0;
	if (!ok || pipe2(start, O_CLOEXEC) != 0) {
		bench_error("scaling: latency client failed");
		goto out;
	}
	atomic_store(&sh->ready, 0);
	atomic_store(&sh->failed, 0);
	atomic_store(&sh->stop, 0);
	for (; forked < FLOOD_CLIENTS; forked++) {
		pids[forked] = bench_fork();
		if (pids[forked] < 0)
			break;
		if (pids[forked] == 0) {
			close(start[1]);
			flooder((int)forked, start[0]);
		}
	}
	for (int i = 0; i < 3000 && (size_t)atomic_load(&sh->ready) < forked;
	     i++)
		usleep(10000);
	bench_progress("scaling: latency client under %d flooders",
		       FLOOD_CLIENTS);
	close(start[1]);
	close(start[0]);
	t0 = bench_now_ns();
	usleep(50000); /* let the flood build up */
	nbusy = sample_pings(c, busy, n, cap, have_echo ? &echo : NULL, ebusy);
	nwbusy = sample_roundtrips(c, true, wbusy, nw, cap, NULL, NULL);
	ok = nbusy > 0 && nwbusy > 0;
	atomic_store(&sh->stop, 1);
	flood_ns = bench_now_ns() - t0;
	for (size_t i = 0; i < forked; i++)
		waitpid(pids[i], NULL, 0);
	for (size_t i = 0; i < forked; i++)
		flood_ops += sh->count[SCALE_MAX_CLIENTS + i];
	if (!ok || forked < FLOOD_CLIENTS || atomic_load(&sh->failed) > 0) {
		bench_error("scaling: the flood run failed");
		goto out;
	}
	idle50 = bench_percentile(idle, nidle, 50) / 1e3;
	busy50 = bench_percentile(busy, nbusy, 50) / 1e3;
	busy99 = bench_percentile(busy, nbusy, 99) / 1e3;
	if (nbusy < 100)
		bench_note("latency under flood: only %zu round trips fitted "
			   "in %.0f s, so its p99 is nearly the maximum",
			   nbusy, (double)cap / 1e9);
	bench_add("latency client idle p50", idle50, "us", NAN, NAN,
		  TARGET_NONE, 0);
	bench_add("latency p50 under 16 flooders", busy50, "us", idle50,
		  busy50 / idle50, TARGET_NONE, 0);
	bench_add("latency p99 under 16 flooders", busy99, "us", idle50,
		  busy99 / idle50, TARGET_RATIO_LE, 5);
	if (have_echo)
		bench_add("raw echo p99 under the same flood",
			  bench_percentile(ebusy, nbusy, 99) / 1e3, "us",
			  idle50,
			  bench_percentile(ebusy, nbusy, 99) / 1e3 / idle50,
			  TARGET_NONE, 0);
	{
		double w50 = bench_percentile(widle, nwidle, 50) / 1e3;
		double b50 = bench_percentile(wbusy, nwbusy, 50) / 1e3;
		double b99 = bench_percentile(wbusy, nwbusy, 99) / 1e3;

		bench_add("latency spin+sync idle p50", w50, "us", NAN, NAN,
			  TARGET_NONE, 0);
		bench_add("latency spin+sync p50 under 16 flooders", b50, "us",
			  w50, b50 / w50, TARGET_NONE, 0);
		bench_add("latency spin+sync p99 under 16 flooders", b99, "us",
			  w50, b99 / w50, TARGET_NONE, 0);
	}
	bench_add("flood throughput (16 x spin(0) x256)",
		  (double)flood_ops * 1e9 / (double)flood_ns, "op/s", NAN, NAN,
		  TARGET_NONE, 0);
out:
	if (have_echo)
		bench_echo_stop(&echo);
	free(idle);
	free(busy);
	free(ebusy);
	free(widle);
	free(wbusy);
	gpucmd_close(c);
}

void bench_scaling(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		bench_error("scaling: mmap: %s", strerror(errno));
		return;
	}
	memset(sh, 0, sizeof(*sh));
	scaling_waves();
	latency_under_flood();
	munmap(sh, sizeof(*sh));
}
