/*
 * harness.h - start a real gpucmdd on a private socket for an integration
 * test, and helpers to talk to it.  Header-only: each test_*.c includes it.
 *
 * The daemon binary is $BUILD/gpucmdd (BUILD defaults to "build"); the
 * backend is $GPUCMD_TEST_BACKEND (default host).  Each test gets its own
 * temporary directory and socket, and the daemon is stopped with SIGTERM at
 * the end, which must make it exit 0.
 */
#pragma once

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpucmd.h"

struct daemon_proc {
	pid_t pid;
	char dir[128];
	char sock[128];
	char log[128];
};

static struct daemon_proc the_daemon;

/*
 * RLIMIT_NOFILE for the daemons started from now on, when rlim_cur is not
 * 0 (a test of the daemon out of descriptors); the test's own is kept.
 */
static struct rlimit harness_nofile;

static inline const char *harness_build(void)
{
	const char *b = getenv("BUILD");
	return b != NULL && b[0] ? b : "build";
}

static inline uint64_t harness_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000;
}

/* Start gpucmdd with extra arguments (NULL-terminated). */
/*
 * $GPUCMD_TEST_VALGRIND=1 runs the daemon under valgrind (make
 * check-valgrind): any memory error or definite leak makes it exit 99,
 * which the teardown reports as a failure.
 */
static inline int harness_valgrind(const char **argv)
{
	const char *v = getenv("GPUCMD_TEST_VALGRIND");
	int n = 0;

	if (v == NULL || v[0] != '1')
		return 0;
	argv[n++] = "valgrind";
	argv[n++] = "-q";
	argv[n++] = "--error-exitcode=99";
	argv[n++] = "--leak-check=full";
	argv[n++] = "--errors-for-leak-kinds=definite";
	argv[n++] = "--show-leak-kinds=definite";
	return n;
}

static inline void daemon_start_args(struct daemon_proc *d, ...)
{
	const char *argv[40];
	const char *backend = getenv("GPUCMD_TEST_BACKEND");
	char bin[256];
	int argc = 0;
	va_list ap;

	const char *base = getenv("GPUCMD_TEST_TMP");

	snprintf(d->dir, sizeof(d->dir), "%s/d-XXXXXX",
		 base != NULL && base[0] ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(d->dir));
	snprintf(d->sock, sizeof(d->sock), "%s/s.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);
	snprintf(bin, sizeof(bin), "%s/gpucmdd", harness_build());
	argc = harness_valgrind(argv);
	argv[argc++] = bin;
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--backend";
	argv[argc++] = backend != NULL && backend[0] ? backend : "host";
	argv[argc++] = "--log-level";
	argv[argc++] = "debug";
	va_start(ap, d);
	for (const char *a;
	     (a = va_arg(ap, const char *)) != NULL && argc < 39;)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;

	d->pid = fork();
	ck_assert_int_ge(d->pid, 0);
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		/* A test that fails skips its teardown: the daemon goes too. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (harness_nofile.rlim_cur != 0 &&
		    setrlimit(RLIMIT_NOFILE, &harness_nofile) != 0)
			_exit(126);
		if (fd >= 0) {
			dup2(fd, 2);
			dup2(fd, 1);
		}
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	/* Wait until the socket answers (at most 20 s under sanitizers). */
	for (int i = 0; i < 2000; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM, 0), rc;

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->sock);
		rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		close(fd);
		if (rc == 0)
			return;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid)
			ck_abort_msg("gpucmdd exited at start; see %s", d->log);
		usleep(10000);
	}
	ck_abort_msg("gpucmdd did not listen on %s within 20 s", d->sock);
}

/*
 * Wait (20 s at most, then SIGKILL) for a daemon told to stop; its exit
 * status, 128 + the signal if one ended it.
 */
static inline int daemon_wait_exit(struct daemon_proc *d)
{
	int status = -1;

	if (d->pid <= 0)
		return 0;
	for (int i = 0; i < 2000; i++) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid)
			break;
		usleep(10000);
	}
	if (!WIFEXITED(status)) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, &status, 0);
	}
	d->pid = 0;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Stop it with SIGTERM; it must exit 0 within 20 s. */
static inline int daemon_stop(struct daemon_proc *d)
{
	if (d->pid <= 0)
		return 0;
	kill(d->pid, SIGTERM);
	return daemon_wait_exit(d);
}

static inline void daemon_cleanup_dir(struct daemon_proc *d)
{
	unlink(d->sock);
	unlink(d->log);
	rmdir(d->dir);
}

/*
 * Write text to the config file path atomically: a daemon that reloads
 * meanwhile reads the old file or the new one, never half of one.
 */
static inline void harness_config_write(const char *path, const char *text)
{
	char tmp[256];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_ge(fputs(text, f), 0);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, path), 0);
}

/*
 * A fresh config file (gpucmdd.conf in a directory of its own) with text in
 * it, for daemon_start_args(..., "--config", path, ...); path gets its name.
 * It lives under the runner's directory, which removes it.
 */
static inline void harness_config(const char *text, char *path, size_t len)
{
	const char *base = getenv("GPUCMD_TEST_TMP");
	char dir[160];

	snprintf(dir, sizeof(dir), "%s/conf-XXXXXX",
		 base != NULL && base[0] ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_lt(snprintf(path, len, "%s/gpucmdd.conf", dir), (int)len);
	harness_config_write(path, text);
}

/* Checked fixtures: one daemon per test. */
static inline void harness_setup(void)
{
	daemon_start_args(&the_daemon, NULL);
}

static inline void harness_teardown(void)
{
	int rc = daemon_stop(&the_daemon);

	if (rc != 0) {
		char cmd[256];
		snprintf(cmd, sizeof(cmd), "tail -n 30 %s >&2", the_daemon.log);
		if (system(cmd) != 0) {
			/* the log is only a help */
		}
	}
	daemon_cleanup_dir(&the_daemon);
	ck_assert_msg(rc == 0, "gpucmdd exited with %d after SIGTERM", rc);
}

static inline struct gpucmd_conn *connect_as(const char *service)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	int rc = gpucmd_connect(the_daemon.sock, service, &c, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "connect as %s: %s (%s)", service,
		      gpucmd_strerror(rc), msg);
	return c;
}

/* Kernel arguments. */
static inline struct gpucmd_arg buf_arg(uint64_t h)
{
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_BUFFER, .v.handle = h };
	return a;
}

static inline struct gpucmd_arg u32_arg(uint32_t v)
{
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U32, .v.u32 = v };
	return a;
}

static inline struct gpucmd_arg u64_arg(uint64_t v)
{
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U64, .v.u64 = v };
	return a;
}

static inline struct gpucmd_arg f32_arg(float v)
{
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_F32, .v.f32 = v };
	return a;
}

/* Run a batch and insist that it succeeds. */
static inline struct gpucmd_response *run_ok(struct gpucmd_batch *b)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	ck_assert_msg(rc == 0, "run: %s", gpucmd_strerror(rc));
	ck_assert_msg(gpucmd_response_error(r) == 0,
		      "batch failed at op %d: %s (%s)",
		      gpucmd_response_failed_index(r),
		      gpucmd_errname(gpucmd_response_error(r)),
		      gpucmd_response_message(r));
	return r;
}

/* The daemon-wide usage as the memory report sees it. */
static inline struct gpucmd_service_report report_totals(struct gpucmd_conn *c)
{
	struct gpucmd_report *rep = NULL;
	struct gpucmd_service_report t;

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	t = rep->totals;
	gpucmd_report_free(rep);
	return t;
}

/*
 * A client process for the tests of clients that die.  body(arg) runs in a
 * child and returns 0 once what the test needs is in place (connections,
 * memory, work in flight), or an exit status; the child then waits to be
 * killed, or dies with the test.  Returns the child's pid once body
 * returned 0; fails the test with the status otherwise.
 */
static inline pid_t harness_child_ready(int (*body)(void *arg), void *arg)
{
	int ready[2], st = 0;
	pid_t pid;
	char x;

	ck_assert_int_eq(pipe(ready), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int rc;

		close(ready[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		rc = body(arg);
		if (rc != 0)
			_exit(rc);
		if (write(ready[1], "r", 1) != 1)
			_exit(125);
		for (;;)
			pause();
	}
	close(ready[1]);
	if (read(ready[0], &x, 1) != 1) {
		close(ready[0]);
		waitpid(pid, &st, 0);
		ck_abort_msg("the child client failed before it was ready "
			     "(exit status %d)",
			     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	close(ready[0]);
	return pid;
}

/* SIGKILL a child from harness_child_ready and reap it. */
static inline void harness_child_kill(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* Bytes of the daemon's pinned host pool in use (the memory report's line). */
static inline uint64_t report_pinned_in_use(struct gpucmd_conn *c)
{
	struct gpucmd_report *rep = NULL;
	uint64_t v;

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	ck_assert_int_eq(rep->has_pinned_host, 1);
	v = rep->pinned_host.bytes_in_use;
	gpucmd_report_free(rep);
	return v;
}

/*
 * sendmsg len bytes of buf on sock with nfds descriptors (up to 250) as
 * SCM_RIGHTS, as a client passes memfds for region_attach; its result.
 */
static inline ssize_t harness_send_fds(int sock, const void *buf, size_t len,
				       const int *fds, int nfds)
{
	char ctl[CMSG_SPACE(sizeof(int) * 250)];
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	ck_assert_int_le(nfds, 250);
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
	return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

/* Descriptors the process pid has open now. */
static inline int daemon_fds(pid_t pid)
{
	char path[64];
	DIR *d;
	struct dirent *e;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* The whole output of gpucmd ARGS against the daemon; it must exit 0. */
static inline void harness_tool_output(const char *args, char *out,
				       size_t out_len)
{
	char cmd[512], rest[4096];
	size_t n, more = 0, m;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "%s/gpucmd --socket %s %s", harness_build(),
		 the_daemon.sock, args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	n = fread(out, 1, out_len - 1, p);
	out[n] = '\0';
	/* Read to the end, so the tool never dies of a full pipe. */
	while ((m = fread(rest, 1, sizeof(rest), p)) > 0)
		more += m;
	st = pclose(p);
	ck_assert_msg(st == 0, "%s exited with status %#x: %.2000s", cmd, st,
		      out);
	ck_assert_msg(more == 0,
		      "%s printed %zu bytes more than the %zu "
		      "read",
		      cmd, more, out_len - 1);
}

/* How many lines of the daemon's log so far hold needle. */
static inline int harness_log_count(const char *needle)
{
	char line[2048];
	int n = 0;
	FILE *f = fopen(the_daemon.log, "r");

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strstr(line, needle) != NULL)
			n++;
	fclose(f);
	return n;
}

/* Wait (20 s at most) until needle is in the log more than `before` times. */
static inline void harness_wait_log(const char *needle, int before)
{
	for (int i = 0; i < 2000; i++) {
		if (harness_log_count(needle) > before)
			return;
		usleep(10000);
	}
	ck_abort_msg("'%s' did not appear in %s within 20 s", needle,
		     the_daemon.log);
}

/*
 * Run a Check suite built by make_suite and exit with its verdict.  Every
 * test's directory lives under one the runner removes at the end, so a
 * failed test (whose teardown does not run) leaves nothing in /tmp.
 */
static inline int harness_main(Suite *s)
{
	SRunner *sr = srunner_create(s);
	char base[] = "/tmp/gpucmd-test-XXXXXX";
	char cmd[64];
	int failed;

	if (mkdtemp(base) != NULL) {
		/* Tests that run a client as another user must get through. */
		chmod(base, 0711);
		setenv("GPUCMD_TEST_TMP", base, 1);
	}
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	if (system(cmd) != 0) {
		/* only a leftover directory */
	}
	return failed ? 1 : 0;
}
