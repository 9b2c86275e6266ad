/*
 * check_spin.c - unit tests of the bounded busy waits (daemon/spin.h) that
 * the daemon's threads, libgpucmd and the bench's echo share: the budget,
 * spin_wait on a word, and spin_recv on a socket (bytes, nothing, the end
 * of the stream, and an error the look itself takes).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spin.h"
#include "unit.h"

START_TEST(budget_is_longer_while_awaiting_the_device)
{
	ck_assert_uint_eq(spin_budget(0, false), 0);
	ck_assert_uint_eq(spin_budget(0, true), 0);
	ck_assert_uint_eq(spin_budget(50, false), 50);
	ck_assert_uint_eq(spin_budget(50, true), SPIN_AWAIT_US);
	ck_assert_uint_eq(spin_budget(SPIN_MAX_US, true), SPIN_MAX_US);
}
END_TEST

START_TEST(wait_sees_a_set_word_and_gives_up_on_a_clear_one)
{
	atomic_uint word = 0;
	uint64_t t0;

	/* Off: no watching at all. */
	ck_assert(!spin_wait(&word, 0));
	t0 = spin_now_ns();
	ck_assert(!spin_wait(&word, 200));
	/* It gave up, and not before its time (or a yield found work). */
	ck_assert_uint_lt(spin_now_ns() - t0, UINT64_C(1000000000));
	atomic_store(&word, 1);
	ck_assert(spin_wait(&word, 0));
	ck_assert(spin_wait(&word, 200));
}
END_TEST

static void pair(int sv[2])
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
}

START_TEST(recv_returns_what_is_there)
{
	int sv[2];
	char buf[16];

	pair(sv);
	ck_assert_int_eq(send(sv[1], "pong", 4, 0), 4);
	ck_assert_int_eq(spin_recv(sv[0], buf, sizeof(buf), 1000), 4);
	ck_assert_int_eq(memcmp(buf, "pong", 4), 0);
	/* Off, or no room: it does not look. */
	ck_assert_int_eq(send(sv[1], "x", 1, 0), 1);
	ck_assert_int_eq(spin_recv(sv[0], buf, sizeof(buf), 0), 0);
	ck_assert_int_eq(spin_recv(sv[0], buf, 0, 1000), 0);
	ck_assert_int_eq(recv(sv[0], buf, sizeof(buf), 0), 1);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(recv_gives_up_with_nothing_and_at_the_end)
{
	int sv[2];
	char buf[16];

	pair(sv);
	ck_assert_int_eq(spin_recv(sv[0], buf, sizeof(buf), 100), 0);
	close(sv[1]);
	/* The end of the stream: 0, and the blocking read sees it too. */
	ck_assert_int_eq(spin_recv(sv[0], buf, sizeof(buf), 100), 0);
	ck_assert_int_eq(recv(sv[0], buf, sizeof(buf), 0), 0);
	close(sv[0]);
}
END_TEST

START_TEST(recv_reports_a_reset_it_took)
{
	int sv[2];
	char buf[16];

	/*
	 * A peer that closes with bytes it never read resets the connection;
	 * the error is given once, so the watch must pass it on: the next
	 * read would only see the end of the stream.
	 */
	pair(sv);
	ck_assert_int_eq(send(sv[0], "unread", 6, 0), 6);
	close(sv[1]);
	ck_assert_int_eq(spin_recv(sv[0], buf, sizeof(buf), 1000), -ECONNRESET);
	ck_assert_int_eq(recv(sv[0], buf, sizeof(buf), 0), 0);
	close(sv[0]);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("spin");
	TCase *tc = tcase_create("spin");

	tcase_add_test(tc, budget_is_longer_while_awaiting_the_device);
	tcase_add_test(tc, wait_sees_a_set_word_and_gives_up_on_a_clear_one);
	tcase_add_test(tc, recv_returns_what_is_there);
	tcase_add_test(tc, recv_gives_up_with_nothing_and_at_the_end);
	tcase_add_test(tc, recv_reports_a_reset_it_took);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(make_suite());
}
