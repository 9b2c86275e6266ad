/*
 * check_log.c - unit tests of the daemon's log (daemon/log.h): the rate
 * limit for lines a client can cause at will passes its burst in a window,
 * counts the rest, and says how many it left out once the window is over
 * (at the next line or at a flush), with the count and the bound; lines
 * below the level are not printed.  stderr goes to a file for each test.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "unit.h"

static char path[] = "/tmp/gpucmd-check-log-XXXXXX";

/* stderr into a fresh file (each test runs in its own fork). */
static void capture(void)
{
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	close(fd);
	unlink(path); /* the descriptor keeps it */
}

/* What was written to stderr so far. */
static void captured(char *buf, size_t len)
{
	off_t end = lseek(STDERR_FILENO, 0, SEEK_CUR);
	ssize_t n;

	ck_assert_int_ge(end, 0);
	ck_assert_uint_lt((size_t)end, len);
	n = pread(STDERR_FILENO, buf, (size_t)end, 0);
	ck_assert_int_eq(n, end);
	buf[n] = '\0';
}

static int count(const char *text, const char *needle)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

START_TEST(limit_passes_its_burst_and_counts_the_rest)
{
	struct log_limit l = LOG_LIMIT_INIT("test lines", 1, 3);
	char out[4096];
	int passed = 0;

	capture();
	for (int i = 0; i < 10; i++)
		if (log_limit_take(&l)) {
			log_notice("line %d", i);
			passed++;
		}
	ck_assert_int_eq(passed, 3);
	ck_assert_uint_eq(l.dropped, 7);
	/* Within the window a flush says nothing yet. */
	log_limit_flush(&l);
	captured(out, sizeof(out));
	ck_assert_int_eq(count(out, "line "), 3);
	ck_assert_int_eq(count(out, "left out"), 0);
	/* After it, the next line first says what was left out. */
	usleep(1100 * 1000);
	ck_assert(log_limit_take(&l));
	captured(out, sizeof(out));
	ck_assert_msg(strstr(out, "gpucmdd: notice: 7 test lines left out of "
				  "the log in the last 1 s (at most 3 pass in "
				  "1 s)\n") != NULL,
		      "%s", out);
	ck_assert_uint_eq(l.dropped, 0);
	ck_assert_uint_eq(l.taken, 1);
}
END_TEST

START_TEST(flush_reports_a_window_with_no_line_after_it)
{
	struct log_limit l = LOG_LIMIT_INIT("quiet lines", 1, 1);
	char out[4096];

	capture();
	ck_assert(log_limit_take(&l));
	ck_assert(!log_limit_take(&l));
	ck_assert(!log_limit_take(&l));
	usleep(1100 * 1000);
	log_limit_flush(&l);
	captured(out, sizeof(out));
	ck_assert_int_eq(count(out, "2 quiet lines left out"), 1);
	/* Said once: the next window starts with nothing left out. */
	usleep(1100 * 1000);
	log_limit_flush(&l);
	captured(out, sizeof(out));
	ck_assert_int_eq(count(out, "left out"), 1);
}
END_TEST

START_TEST(lines_below_the_level_are_not_printed)
{
	char out[4096];

	capture();
	log_set_level(LOG_LEVEL_NOTICE);
	log_info("not this one");
	log_notice("this one");
	captured(out, sizeof(out));
	ck_assert_str_eq(out, "gpucmdd: notice: this one\n");
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, limit_passes_its_burst_and_counts_the_rest);
	tcase_add_test(tc, flush_reports_a_window_with_no_line_after_it);
	tcase_add_test(tc, lines_below_the_level_are_not_printed);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(make_suite());
}
