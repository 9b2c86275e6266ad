#!/bin/sh
# bench_smoke.sh - gpucmd-bench measures what its rows say and cleans up
# (tests/bench):
#   - --quick --only memory --json exits 0 with one JSON object whose
#     results have exactly the fields the issue asked for (name, value,
#     unit, floor, ratio, target, met), met a boolean;
#   - the "per connection (1 stream)" row costs more than the handshake
#     alone (it did not while its batch was a ping, which runs on no
#     stream);
#   - --only that matches no scenario exits 2;
#   - a SIGTERM to the bench alone in the middle of the scaling scenario
#     leaves no daemon, no child (the epoll echo server) and no private
#     directory behind.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init benchsmoke
[ -x "$BUILD/gpucmd-bench" ] ||
	skip "$BUILD/gpucmd-bench is not built (make $BUILD/gpucmd-bench)"
need gpucmdd
command -v python3 >/dev/null 2>&1 || skip "python3 is needed to read the JSON"

# The JSON, and the memory rows.
"$BUILD/gpucmd-bench" --quick --only memory --json --backend host \
	>"$dir/bench.json" 2>"$dir/bench.log" ||
	fail "gpucmd-bench --quick --only memory exited $?"
python3 - "$dir/bench.json" >"$dir/check.log" 2>&1 <<'PY' ||
import json, sys
d = json.load(open(sys.argv[1]))
keys = {"name", "value", "unit", "floor", "ratio", "target", "met"}
rows = {}
for r in d["results"]:
    assert set(r) == keys, "fields %s" % sorted(r)
    assert isinstance(r["met"], bool), "met %r" % r["met"]
    rows[r["name"]] = r
hello = rows["daemon RSS per connection (hello)"]["value"]
stream = rows["daemon RSS per connection (1 stream)"]["value"]
assert stream >= hello + 4, "1 stream %.3f KiB, hello %.3f KiB" % (stream, hello)
PY
	{ cat "$dir/check.log"; fail "the JSON or the memory rows are wrong"; }

# A misspelt --only.
"$BUILD/gpucmd-bench" --only nosuch >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "--only nosuch exited $rc, want 2"

# SIGTERM to the bench alone, while its scaling children run.
command -v pgrep >/dev/null 2>&1 || skip "pgrep is needed for the rest"
"$BUILD/gpucmd-bench" --quick --only scaling --backend host \
	>"$dir/scaling.out" 2>"$dir/scaling.log" &
pid=$!
i=0
daemon=""
while [ -z "$daemon" ]; do
	i=$((i + 1))
	[ $i -gt 500 ] && fail "gpucmd-bench started no gpucmdd within 10 s"
	daemon=$(pgrep -P "$pid" -x gpucmdd)
	sleep 0.02
done
private=$(tr '\0' '\n' <"/proc/$daemon/cmdline" | sed -n '/^--socket$/{n;p;}')
private=${private%/*}
case $private in
/tmp/gpucmd-bench-*) ;;
*) fail "the daemon's socket is not in a private directory: '$private'" ;;
esac
sleep 1
children=$(pgrep -P "$pid")
[ -n "$children" ] || fail "no children to check (the scenario ended early?)"
kill -TERM "$pid"
wait_exit "gpucmd-bench (sent SIGTERM)"
[ "$status" -eq 143 ] || fail "gpucmd-bench exited $status after SIGTERM, not 143"
i=0
for c in $children; do
	while kill -0 "$c" 2>/dev/null; do
		i=$((i + 1))
		[ $i -gt 250 ] && fail "child $c of gpucmd-bench outlived it by 5 s"
		sleep 0.02
	done
done
[ -e "$private" ] && fail "$private is left: $(find "$private" -mindepth 1 | tr '\n' ' ')"
exit 0
