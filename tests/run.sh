#!/bin/sh
# run.sh - run every test binary and script, and end with one line
# "N passed, N failed" (", N skipped") counting every test case.
#
#   sh tests/run.sh [unit|integration|valgrind]     BUILD=build by default
#
# Unit suites are Check programs (build/tests/check_*); their summary line
# "NN%: Checks: C, Failures: F, Errors: E" gives the counts.  Integration
# tests are Check programs too (build/tests/test_*) plus shell scripts
# (tests/integration/*.sh but lib.sh, which they share), each script one
# test: exit 0 passes, 77 skips (with its reason printed), anything else
# fails.  A suite or script that
# runs past TEST_SUITE_TIMEOUT / TEST_SCRIPT_TIMEOUT seconds is killed and
# fails, so one hang cannot stall the whole run.
set -u
BUILD=${BUILD:-build}
what=${1:-all}
export BUILD
passed=0
failed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_check() {
	bin=$1
	name=${bin##*/}
	printf '%-40s ' "$name"
	# A hang fails the suite instead of stalling the run (Check's own
	# timeouts cover each test, not what happens around them).
	timeout -k 10 "${TEST_SUITE_TIMEOUT:-1800}" "$bin" >"$log" 2>&1
	rc=$?
	line=$(grep -E '^[0-9]+%: Checks: ' "$log" | tail -n 1)
	if [ -z "$line" ]; then
		if [ "$rc" -eq 77 ]; then
			echo "skipped: $(tail -n 1 "$log")"
			skipped=$((skipped + 1))
			return
		fi
		echo "FAILED (exit $rc, no summary)"
		sed 's/^/    /' "$log" | tail -n 30
		failed=$((failed + 1))
		return
	fi
	c=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
	f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
	e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
	bad=$((f + e))
	passed=$((passed + c - bad))
	failed=$((failed + bad))
	if [ "$bad" -ne 0 ] || [ "$rc" -ne 0 ]; then
		echo "FAILED ($line)"
		grep -vE '^[0-9]+%: Checks: |^Running suite' "$log" | sed 's/^/    /' | tail -n 40
		[ "$bad" -eq 0 ] && failed=$((failed + 1))
	else
		echo "ok ($c checks)"
	fi
}

run_script() {
	script=$1
	name=${script##*/}
	printf '%-40s ' "$name"
	timeout -k 10 "${TEST_SCRIPT_TIMEOUT:-900}" sh "$script" >"$log" 2>&1
	rc=$?
	[ $rc -eq 124 ] || [ $rc -eq 137 ] &&
		echo "    (timed out; TEST_SCRIPT_TIMEOUT=${TEST_SCRIPT_TIMEOUT:-900} s)" >>"$log"
	case $rc in
	0)
		echo ok
		passed=$((passed + 1))
		;;
	77)
		echo "skipped: $(tail -n 1 "$log")"
		skipped=$((skipped + 1))
		;;
	*)
		echo "FAILED (exit $rc)"
		sed 's/^/    /' "$log" | tail -n 40
		failed=$((failed + 1))
		;;
	esac
}

if [ "$what" = all ] || [ "$what" = unit ]; then
	for t in "$BUILD"/tests/check_*; do
		[ -x "$t" ] && run_check "$t"
	done
fi
if [ "$what" = valgrind ]; then
	# The integration suites with the daemon under valgrind (harness.h):
	# slower, so Check's timeouts are stretched.
	export GPUCMD_TEST_VALGRIND=1 CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-6}
	for t in "$BUILD"/tests/test_*; do
		[ -x "$t" ] && run_check "$t"
	done
fi
if [ "$what" = all ] || [ "$what" = integration ]; then
	for t in "$BUILD"/tests/test_*; do
		[ -x "$t" ] && run_check "$t"
	done
	for t in tests/integration/*.sh; do
		# lib.sh is what the scripts share, not a test.
		[ -f "$t" ] && [ "${t##*/}" != lib.sh ] && run_script "$t"
	done
fi

if [ "$skipped" -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
