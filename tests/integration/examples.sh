#!/bin/sh
# examples.sh - the client programs of examples/ (make examples) against a
# daemon on a private socket: each exits 0, prints its "OK" line, and says
# nothing on stderr.  graph also prints the three refusals it provokes,
# each with the daemon's message.  A second run of inference finds the
# daemon serving still, and with the threads example at once, the two
# services do not disturb each other.  reconnect serves on while its
# daemon is killed (SIGKILL, as a crash would) and another starts on the
# same socket, between requests and during one.  shared_weights forks
# workers that import the weights their parent shared: each checks its
# result, the parent prints the write it was refused and the report's
# count of handles and imports, and the weights go with the last worker.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init examples
for e in inference threads graph reconnect shared_weights; do
	[ -x "$BUILD/examples/$e" ] ||
		fail "$BUILD/examples/$e is missing: run make examples first"
done
# shellcheck disable=SC2119 # no arguments to pass on
start_daemon
export GPUCMD_SOCKET="$sock"

# run NAME ARG...: the example, its stdout in $dir/NAME.out; fails unless
# it exits 0 with an empty stderr
run() {
	name=$1
	shift
	"$BUILD/examples/$name" "$@" >"$dir/$name.out" 2>"$dir/$name.log"
	rc=$?
	[ $rc -eq 0 ] || fail "examples/$name $* exited $rc: $(cat "$dir/$name.log")"
	[ -s "$dir/$name.log" ] && fail "examples/$name $* wrote to stderr"
	return 0
}

# expect NAME TEXT: a line of NAME's output is TEXT
expect() {
	grep -qxF "$2" "$dir/$1.out" ||
		fail "examples/$1 did not print '$2': $(cat "$dir/$1.out")"
}

run inference 40
expect inference "inference: 40 requests, 4 in flight: OK"
grep -q '^connected to .* (host backend) as service example-inference$' \
	"$dir/inference.out" ||
	[ "${GPUCMD_TEST_BACKEND:-host}" != host ] ||
	fail "inference did not name its service: $(cat "$dir/inference.out")"

run threads 4 25
expect threads "threads: 4 threads x 25 rounds, 2 streams each: OK"

run graph 20
expect graph "graph: 20 replays checked"
expect graph "expected refusal, an unknown graph: op 0: GPUCMD_ENOTFOUND: graph 8 does not exist on this connection"
grep -q '^expected refusal, releasing what a graph uses: op 1: GPUCMD_EBUSY: handle 2 is used by 1 graph' \
	"$dir/graph.out" || fail "graph: no EBUSY refusal: $(cat "$dir/graph.out")"
expect graph "expected refusal, a launch past a buffer's end: op 0: GPUCMD_EINVAL: kernel add_f32 argument 0 (handle 3) needs 4100 bytes, the buffer has 4096"
expect graph "graph: OK"

run shared_weights 4
expect shared_weights "worker 0: y = w + 1 * x, sum 81912: OK"
expect shared_weights "worker 1: y = w + 2 * x, sum 114686: OK"
expect shared_weights "worker 2: y = w + 3 * x, sum 147453: OK"
expect shared_weights "worker 3: y = w + 4 * x, sum 180218: OK"
expect shared_weights "expected refusal, writing shared weights: op 0: GPUCMD_EINVAL: handle 1 names the buffer shared as 'example/weights', which is read-only for every connection: write into a buffer of your own, and pass shared ones to kernels as buffer_in (gpucmd_arg_buffer_in)"
expect shared_weights "shared: 'example/weights', 65536 bytes once, 5 handles, 4 imports"
expect shared_weights "shared_weights: 4 workers, one copy of 65536 bytes of weights: OK"

# Two services at once: neither sees the other's work.
"$BUILD/examples/threads" 8 20 >"$dir/threads2.out" 2>"$dir/threads2.log" &
tpid=$!
pids="$pids $tpid"
run inference 100
expect inference "inference: 100 requests, 4 in flight: OK"
wait "$tpid"
rc=$?
[ $rc -eq 0 ] || fail "threads beside inference exited $rc: $(cat "$dir/threads2.log")"
grep -qxF "threads: 8 threads x 20 rounds, 2 streams each: OK" "$dir/threads2.out" ||
	fail "threads beside inference printed: $(cat "$dir/threads2.out")"

# A daemon that dies and another on its socket.  Requests go to reconnect
# through a FIFO, so each step waits for what it needs (an answer, a
# listening daemon) instead of sleeping.  The FIFO is opened read-write
# here, after reconnect opened it (neither open blocks, a write never
# raises SIGPIPE), and closed from what starts later, so that closing it
# here is reconnect's end of input.
mkfifo "$dir/reconnect.in" || fail "mkfifo"
"$BUILD/examples/reconnect" 10000 <"$dir/reconnect.in" \
	>"$dir/reconnect.out" 2>"$dir/reconnect.log" &
rpid=$!
pids="$pids $rpid"
exec 3<>"$dir/reconnect.in"

# await WHAT CMD...: returns once CMD succeeds; fails after 10 s, or once
# reconnect has exited without it
await() {
	what=$1
	shift
	i=0
	until "$@"; do
		kill -0 "$rpid" 2>/dev/null || "$@" ||
			fail "reconnect exited before $what: $(cat "$dir/reconnect.out")"
		i=$((i + 1))
		[ $i -gt 500 ] &&
			fail "reconnect: no $what within 10 s: $(cat "$dir/reconnect.out")"
		sleep 0.02
	done
}
answered() {
	grep -q "^request $1: sum " "$dir/reconnect.out"
}
listening() {
	g status >/dev/null 2>&1
}
# crash: SIGKILL to the daemon, and another on the same socket (the dead
# one's socket file stays, as after a crash; the new daemon replaces it)
crash() {
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	pid=""
	# shellcheck disable=SC2119 # no arguments to pass on
	start_daemon 3>&-
	await "a daemon listening again" listening
}

echo 1 >&3
await "the answer to request 1" answered 1
# Between requests: the next one finds its connection dead.
crash
echo 2 >&3
await "the answer to request 2" answered 2
# During a request, or just before or after it: whichever it is, request
# 3 is answered, and request 4 finds the connection dead if 3 did not.
echo 3 >&3
crash
echo 4 >&3
await "the answer to request 4" answered 4
exec 3>&-
i=0
while kill -0 "$rpid" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 500 ] && fail "reconnect did not end at the end of its input"
	sleep 0.02
done
wait "$rpid"
rc=$?
[ $rc -eq 0 ] || fail "reconnect exited $rc: $(cat "$dir/reconnect.log")"
[ -s "$dir/reconnect.log" ] && fail "reconnect wrote to stderr"
expect reconnect "reconnect: 4 requests, 2 reconnects: OK"
n=$(grep -c '^reconnect: reconnected after ' "$dir/reconnect.out")
[ "$n" -eq 2 ] || fail "reconnect said it reconnected $n times, not 2: $(cat "$dir/reconnect.out")"
for r in 1 2 3 4; do
	[ "$(grep -c "^request $r: sum " "$dir/reconnect.out")" -eq 1 ] ||
		fail "request $r was not answered once: $(cat "$dir/reconnect.out")"
done

# Every example closed what it opened: once the daemon has freed what the
# closed connections held (when their streams are idle), nothing is left.
i=0
while :; do
	totals=$(g memory-report --json | grep -o '"totals":{[^}]*}') ||
		fail "memory-report has no totals"
	case "$totals" in
	*'"connections":0,"allocations":0,"bytes_in_use":0,'*'"region_bytes":0,"regions":0,'*) break ;;
	esac
	i=$((i + 1))
	[ $i -gt 100 ] && fail "left behind after the examples: $totals"
	sleep 0.1
done
stop_daemon
echo "examples: ok"
