/*
 * unit.h - what every Check unit suite (tests/unit/check_*.c) shares: its
 * main.  Each suite builds its Suite and ends with
 *
 *	int main(void) { return unit_main(my_suite()); }
 *
 * The runner forks each test (Check's default), so one that crashes fails
 * alone; the exit status is 0 only when every test passed.
 */
#pragma once

#include <check.h>

static inline int unit_main(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? 0 : 1;
}
