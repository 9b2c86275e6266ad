/*
 * check_rounds.c - unit tests of the device thread's order of service
 * (daemon/rounds.h): services take turns by weight; a service whose queue
 * was empty goes first, once; a round stops when news comes, and the
 * services it had not reached go first next time; nobody starves.
 */
#include <check.h>
#include <stdatomic.h>
#include <string.h>

#include "rounds.h"
#include "service.h"
#include "unit.h"

enum { NSVC = 6, MAX_LOG = 256 };

/* Fake services: a count of batches waiting each, and the order served. */
struct world {
	struct rounds r;
	struct service svc[NSVC];
	unsigned waiting[NSVC];
	char log[MAX_LOG];
	size_t nlog;
	/* When the served count reaches at, add `add` batches to service
	 * `who` (and raise news), as a batch arriving mid-round would. */
	size_t at;
	int who;
	unsigned add;
	atomic_uint news;
};

static struct world w;

static int index_of(const struct service *s)
{
	return (int)(s - w.svc);
}

/* n batches for service i; rounds_add when its queue was empty. */
static void give(int i, unsigned n)
{
	bool was_empty = w.waiting[i] == 0;

	w.waiting[i] += n;
	if (was_empty && n > 0)
		rounds_add(&w.r, &w.svc[i]);
}

static bool serve(void *arg, struct service *s)
{
	int i = index_of(s);

	(void)arg;
	ck_assert_uint_gt(w.waiting[i], 0);
	w.waiting[i]--;
	ck_assert_uint_lt(w.nlog, MAX_LOG - 1);
	w.log[w.nlog++] = (char)('A' + i);
	w.log[w.nlog] = '\0';
	if (w.who >= 0 && w.nlog == w.at) {
		give(w.who, w.add);
		atomic_store(&w.news, 1);
		w.who = -1;
	}
	return w.waiting[i] > 0;
}

static void setup(void)
{
	memset(&w, 0, sizeof(w));
	rounds_init(&w.r);
	for (int i = 0; i < NSVC; i++)
		atomic_init(&w.svc[i].weight, 1);
	w.who = -1;
	atomic_init(&w.news, 0);
}

/* One round, the news word cleared first, as the device thread does. */
static void one_round(rounds_serve_fn fn)
{
	atomic_store(&w.news, 0);
	rounds_run(&w.r, fn, NULL, &w.news);
}

/* Rounds until every batch is served. */
static void run_all_with(rounds_serve_fn fn)
{
	for (int guard = 0; !rounds_empty(&w.r); guard++) {
		ck_assert_int_lt(guard, 1000);
		one_round(fn);
	}
}

static void run_all(void)
{
	run_all_with(serve);
}

START_TEST(services_take_turns)
{
	setup();
	give(0, 3);
	give(1, 3);
	give(2, 3);
	run_all();
	ck_assert_str_eq(w.log, "ABCABCABC");
	for (int i = 0; i < 3; i++)
		ck_assert(!w.svc[i].active);
}
END_TEST

START_TEST(weight_is_batches_a_turn)
{
	setup();
	atomic_store(&w.svc[0].weight, 3);
	give(0, 5);
	give(1, 3);
	run_all();
	ck_assert_str_eq(w.log, "AAABAABB");
}
END_TEST

/*
 * C, idle until now, gets a batch while A and B work through their
 * backlogs: it is served at the next round's start, not after A and B.
 */
START_TEST(a_service_that_was_idle_goes_first)
{
	setup();
	give(0, 4);
	give(1, 4);
	one_round(serve);
	ck_assert_str_eq(w.log, "AB");
	give(2, 1);
	run_all();
	ck_assert_str_eq(w.log, "ABCABABAB");
	/* It is fresh again for its next batch, once it had none. */
	ck_assert(!w.svc[2].active);
}
END_TEST

/*
 * A fresh service with more than one batch is served once ahead, then
 * takes its turn with the others, at the back.
 */
START_TEST(a_fresh_service_goes_first_once)
{
	setup();
	give(0, 3);
	give(1, 3);
	one_round(serve);
	give(2, 3);
	run_all();
	ck_assert_str_eq(w.log, "ABCABCABC");
}
END_TEST

/*
 * Five services with backlogs (served once already, fresh no longer);
 * while B is served, F's batch comes and news is raised: the round stops
 * after B, F goes next, then C, D, E (not reached in that round), then A
 * and B.
 */
START_TEST(news_cuts_a_round_short_and_its_rest_goes_first)
{
	setup();
	for (int i = 0; i < 5; i++)
		give(i, 3);
	one_round(serve);
	ck_assert_str_eq(w.log, "ABCDE");
	w.at = 7;
	w.who = 5;
	w.add = 1;
	run_all();
	ck_assert_str_eq(w.log, "ABCDE"
				"AB"
				"FCDEAB"
				"CDE");
}
END_TEST

/*
 * News after every batch (completions under load): the round still moves
 * on by one service at least each time, so every service is served in
 * turn and none starves.
 */
static bool serve_with_news(void *arg, struct service *s)
{
	bool more = serve(arg, s);

	atomic_store(&w.news, 1);
	return more;
}

START_TEST(news_all_the_time_starves_nobody)
{
	setup();
	for (int i = 0; i < 4; i++)
		give(i, 3);
	/* Fresh, they all go once, news or not; then in turn, one a round. */
	run_all_with(serve_with_news);
	ck_assert_str_eq(w.log, "ABCDABCDABCD");
}
END_TEST

/* Without a news word (NULL), a round serves every service. */
START_TEST(a_round_without_news_serves_everyone)
{
	setup();
	for (int i = 0; i < 3; i++)
		give(i, 2);
	rounds_run(&w.r, serve, NULL, NULL);
	ck_assert_str_eq(w.log, "ABC");
	rounds_run(&w.r, serve, NULL, NULL);
	ck_assert_str_eq(w.log, "ABCABC");
	/* Their places stay one more pass, in case a batch comes. */
	ck_assert(!rounds_empty(&w.r));
	rounds_run(&w.r, serve, NULL, NULL);
	ck_assert_str_eq(w.log, "ABCABC");
	ck_assert(rounds_empty(&w.r));
}
END_TEST

/*
 * n rounds with news after every batch, service paced given one batch
 * before each round it has none; served[i] counts service i's batches.
 */
static void paced_rounds(int paced, int n, unsigned *served)
{
	for (int k = 0; k < n; k++) {
		if (w.waiting[paced] == 0)
			give(paced, 1);
		rounds_run(&w.r, serve_with_news, NULL, &w.news);
	}
	for (size_t i = 0; i < w.nlog; i++)
		served[w.log[i] - 'A']++;
}

/*
 * A and B flood; C has exactly one batch waiting whenever the device
 * thread comes round (a client that paces itself), and news comes after
 * every batch.  C is fresh once; its emptied place then waits its turn,
 * so it gets no more than A or B, where being fresh at every round would
 * have served it at every round.
 */
START_TEST(a_paced_service_keeps_to_its_turn)
{
	unsigned served[3] = { 0 };

	setup();
	give(0, 100);
	give(1, 100);
	paced_rounds(2, 30, served);
	/* Fresh A, B, C in round one, then one service in turn a round. */
	ck_assert_uint_eq(w.nlog, 3 + 29);
	for (size_t i = 0; i < w.nlog; i++)
		ck_assert_msg(w.log[i] == 'A' + (char)(i % 3),
			      "batch %zu went to %c: %s", i, w.log[i], w.log);
	ck_assert_uint_le(served[2], served[0]);
	ck_assert_uint_le(served[2], served[1]);
}
END_TEST

/*
 * News already set when a round begins (completions that came while the
 * device thread was elsewhere): each round still serves the next service
 * in turn, so the turns move on.
 */
START_TEST(news_before_the_round_still_moves_the_turns)
{
	setup();
	for (int i = 0; i < 3; i++)
		give(i, 3);
	for (int guard = 0; !rounds_empty(&w.r); guard++) {
		ck_assert_int_lt(guard, 100);
		atomic_store(&w.news, 1);
		rounds_run(&w.r, serve, NULL, &w.news);
	}
	ck_assert_str_eq(w.log, "ABCABCABC");
}
END_TEST

/* Weight against a paced service: A (weight 3) floods, B paced. */
START_TEST(weight_holds_against_a_paced_service)
{
	unsigned served[2] = { 0 };

	setup();
	atomic_store(&w.svc[0].weight, 3);
	give(0, 200);
	paced_rounds(1, 40, served);
	ck_assert_msg(served[0] >= 3 * served[1] - 3,
		      "weight 3 got %u batches, the paced weight 1 %u: %s",
		      served[0], served[1], w.log);
}
END_TEST

static Suite *rounds_suite(void)
{
	Suite *s = suite_create("rounds");
	TCase *tc = tcase_create("rounds");

	tcase_add_test(tc, services_take_turns);
	tcase_add_test(tc, weight_is_batches_a_turn);
	tcase_add_test(tc, a_service_that_was_idle_goes_first);
	tcase_add_test(tc, a_fresh_service_goes_first_once);
	tcase_add_test(tc, news_cuts_a_round_short_and_its_rest_goes_first);
	tcase_add_test(tc, news_all_the_time_starves_nobody);
	tcase_add_test(tc, a_round_without_news_serves_everyone);
	tcase_add_test(tc, a_paced_service_keeps_to_its_turn);
	tcase_add_test(tc, news_before_the_round_still_moves_the_turns);
	tcase_add_test(tc, weight_holds_against_a_paced_service);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(rounds_suite());
}
