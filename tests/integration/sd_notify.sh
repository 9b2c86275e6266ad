#!/bin/sh
# sd_notify.sh - what gpucmdd tells systemd (Type=notify), read from the
# datagram socket that NOTIFY_SOCKET names, the way systemd reads it:
#   - STATUS= while the device opens, then READY=1 with a STATUS= summary;
#   - with WATCHDOG_USEC and WATCHDOG_PID=<the daemon's pid>, WATCHDOG=1
#     arrives repeatedly (at half the interval), and the STATUS= refreshed
#     on the same tick counts a batch a client ran;
#   - SIGHUP (systemctl reload): RELOADING=1 with MONOTONIC_USEC=, then
#     READY=1 once the file is read, for a file that loads and for one the
#     daemon refuses (it serves on with its settings);
#   - SIGTERM with a batch in flight: STOPPING=1, a STATUS=stopping: line
#     while it waits that counts down the seconds to stop_timeout, pings
#     going on; a second SIGTERM exits 1 at once;
#   - SIGTERM with a batch that runs past [daemon] stop_timeout: exit 1 at
#     the deadline, a last STATUS= and a log line that name what was left;
#   - SIGTERM: STOPPING=1, then exit status 0;
#   - without WATCHDOG_USEC no WATCHDOG=1 is sent.
# python3 listens on the socket (each datagram is appended to a file).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null ||
	skip "python3 is not installed: nothing to listen on NOTIFY_SOCKET"
lib_init notify
need gpucmdd

# listen NAME: bind $dir/NAME.notify, append each datagram to $dir/NAME.msgs
# as "<message>" lines followed by a "--" line.
listen() {
	python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(30)
with open(sys.argv[2], "a") as out:
    while True:
        try:
            msg = s.recv(4096)
        except socket.timeout:
            break
        out.write(msg.decode("utf-8", "replace") + "\n--\n")
        out.flush()' "$dir/$1.notify" "$dir/$1.msgs" &
	pids=$!
	i=0
	while [ ! -S "$dir/$1.notify" ]; do
		i=$((i + 1))
		[ $i -gt 500 ] && fail "the listener did not start"
		sleep 0.02
	done
	: >>"$dir/$1.msgs"
}

# until_ok WHAT COMMAND...: run COMMAND every 20 ms until it succeeds, for
# up to 10 s, the daemon ($pid) alive all along; else fail saying WHAT.
until_ok() {
	what=$1
	shift
	i=0
	until "$@"; do
		i=$((i + 1))
		[ $i -gt 500 ] && fail "$what"
		kill -0 "$pid" 2>/dev/null || fail "the daemon exited: $what"
		sleep 0.02
	done
}

# wait_for NAME PATTERN: a line of NAME.msgs matches (grep -E).
wait_for() {
	until_ok "no '$2' from the daemon" grep -Eq "$2" "$dir/$1.msgs"
}

# ---- with the watchdog ------------------------------------------------------
listen wd
sock=$dir/wd.sock
# The watchdog is only for the process WATCHDOG_PID names: set it to the
# daemon's own pid by exec'ing from a shell that knows its $$.
# shellcheck disable=SC2016 # $$ and $0 belong to the inner shell
NOTIFY_SOCKET=$dir/wd.notify WATCHDOG_USEC=200000 \
	sh -c 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$0" "$@"' \
	"$BUILD/gpucmdd" --socket "$sock" --backend host --host-memory 64M \
	2>"$dir/wd.log" &
pid=$!
wait_for wd '^READY=1$'
grep -q '^STATUS=opening the device' "$dir/wd.msgs" ||
	fail "no STATUS= while the device opens"
# READY=1 comes with its summary in the same datagram.
awk '/^READY=1$/ { r = 1 } /^--$/ { if (r && s) ok = 1; r = s = 0 }
	/^STATUS=serving / { s = 1 } END { exit !ok }' "$dir/wd.msgs" ||
	fail "READY=1 came without a STATUS=serving ... summary"
# Opening the device is reported before readiness.
first_ready=$(grep -n '^READY=1$' "$dir/wd.msgs" | head -n 1 | cut -d: -f1)
first_open=$(grep -n '^STATUS=opening' "$dir/wd.msgs" | head -n 1 | cut -d: -f1)
[ "$first_open" -lt "$first_ready" ] || fail "STATUS=opening came after READY=1"

# 100 ms pings: three of them within a few seconds (three_more: three more
# than $pings).
pings=0
three_more() { [ "$(grep -c '^WATCHDOG=1$' "$dir/wd.msgs")" -ge $((pings + 3)) ]; }
until_ok "fewer than 3 WATCHDOG=1 in 10 s with WatchdogSec=0.2" three_more

# A batch shows up in the refreshed STATUS= (a sync on a new stream; the
# event loop answers pings itself, uncounted).
printf 'sync\n' | "$BUILD/gpucmd" --socket "$sock" exec >/dev/null 2>&1 ||
	fail "exec failed"
wait_for wd '^STATUS=serving .*: [0-9]+ connections, [0-9]+ services, [1-9][0-9]* batches$'

# A stop waits for the batches in flight (here a 20 s spin): the STATUS=
# line says so and the watchdog pings go on; a second SIGTERM exits at
# once, with status 1 and a line that says what was left.
printf 'kernel spin grid=1 block=1 u32:20000000\nsync\n' |
	"$BUILD/gpucmd" --socket "$sock" exec >/dev/null 2>&1 &
spinner=$!
wait_for wd '^STATUS=serving .*: 1 connections'
sleep 1
kill -TERM "$pid"
wait_for wd '^STOPPING=1$'
# The default stop_timeout (60 s): the seconds left count down.
wait_for wd '^STATUS=stopping: waiting for the batches in flight of 1 connection, 60 s left before the daemon exits anyway \(stop_timeout; '
wait_for wd '^STATUS=stopping: waiting for the batches in flight of 1 connection, 5[0-9] s left '
pings=$(grep -c '^WATCHDOG=1$' "$dir/wd.msgs")
until_ok "the watchdog pings stopped while the stop waits" three_more
kill -TERM "$pid"
wait_exit "the daemon, after a second SIGTERM,"
[ "$status" -eq 1 ] || fail "a second SIGTERM: exit $status, not 1"
grep -q 'again: exiting now, without waiting for the batches in flight of 1 connection$' \
	"$dir/wd.log" || fail "no log line for the second SIGTERM: $(cat "$dir/wd.log")"
wait "$spinner" && fail "the client of the abandoned spin succeeded"
pid=
grep -q '^STOPPING=1$' "$dir/wd.msgs" || fail "no STOPPING=1 after SIGTERM"
kill "$pids" 2>/dev/null
wait "$pids" 2>/dev/null
pids=""

# ---- a stop past stop_timeout ---------------------------------------------
# A 20 s spin holds the stop past stop_timeout = 1: the daemon exits 1 at
# the deadline by itself, with a STATUS= and log lines that say what it
# left and whose it was, rather than waiting for systemd's SIGKILL.
listen dl
printf '[daemon]\nstop_timeout = 1\n' >"$dir/dl.conf"
NOTIFY_SOCKET=$dir/dl.notify "$BUILD/gpucmdd" --socket "$dir/dl.sock" \
	--config "$dir/dl.conf" --backend host --host-memory 64M \
	2>"$dir/dl.log" &
pid=$!
wait_for dl '^READY=1$'
printf 'kernel spin grid=1 block=1 u32:20000000\nsync\n' |
	"$BUILD/gpucmd" --socket "$dir/dl.sock" --service holder exec \
	>/dev/null 2>&1 &
spinner=$!
until_ok "the spin's connection did not join" \
	grep -q 'joined service holder' "$dir/dl.log"
sleep 0.5
kill -TERM "$pid"
wait_exit "the daemon, at stop_timeout,"
[ "$status" -eq 1 ] || fail "a stop past stop_timeout: exit $status, not 1"
grep -q '^STATUS=stopping: waiting for the batches in flight of 1 connection, 1 s left ' \
	"$dir/dl.msgs" || fail "no STATUS= with the second left before stop_timeout"
grep -q '^STATUS=stopped at stop_timeout (1 s) with 1 batch in flight on 1 connection$' \
	"$dir/dl.msgs" || fail "no last STATUS= at stop_timeout"
grep -q 'stop_timeout: connection [0-9]* (pid [0-9]* uid [0-9]*, service holder) still had 1 batch in flight, ' \
	"$dir/dl.log" || fail "no log line naming the connection left at stop_timeout"
# Its work began before the stop, so it has had work for longer.
grep -q 'in flight, with work for [1-9][0-9]*\.[0-9] s without a pause, [0-9]*\.[0-9] s into the stop' \
	"$dir/dl.log" || fail "the stop_timeout line does not say for how long the connection had work: $(grep 'still had' "$dir/dl.log")"
grep -q 'stop_timeout (1 s) passed with 1 batch in flight on 1 connection (service holder): exiting with status 1' \
	"$dir/dl.log" || fail "no log line summing up at stop_timeout"
wait "$spinner" && fail "the client of the spin cut off at stop_timeout succeeded"
kill "$pids" 2>/dev/null
wait "$pids" 2>/dev/null
pids=""

# ---- without the watchdog; reloads ------------------------------------------
listen plain
printf '[limits]\nmax_connections = 32\n' >"$dir/plain.conf"
NOTIFY_SOCKET=$dir/plain.notify "$BUILD/gpucmdd" --socket "$dir/plain.sock" \
	--config "$dir/plain.conf" --backend host --host-memory 64M \
	2>"$dir/plain.log" &
pid=$!
wait_for plain '^READY=1$'
sleep 0.5
grep -q '^WATCHDOG=1$' "$dir/plain.msgs" && fail "WATCHDOG=1 sent without WATCHDOG_USEC"
grep -q '^RELOADING=1$' "$dir/plain.msgs" && fail "RELOADING=1 sent before any SIGHUP"

# reloaded N: the Nth RELOADING=1 came with MONOTONIC_USEC= in its datagram,
# and a READY=1 datagram followed it.
reloaded() {
	wait_for plain '^RELOADING=1$'
	until_ok "reload $1: no RELOADING=1 with MONOTONIC_USEC=, then READY=1" \
		awk -v n="$1" '/^RELOADING=1$/ { r = 1 } /^MONOTONIC_USEC=[0-9]+$/ { m = 1 }
		/^READY=1$/ { if (seen == n) ready = 1 }
		/^--$/ { if (r && m) seen++; r = m = 0 }
		END { exit !(seen >= n && ready) }' "$dir/plain.msgs"
}
kill -HUP "$pid"
reloaded 1
grep -q 'reloaded' "$dir/plain.log" || fail "reload 1: the log does not say reloaded"
# A file the daemon refuses: it keeps serving, and says ready again.
printf '[limits]\nmax_connections = many\n' >"$dir/plain.conf"
kill -HUP "$pid"
reloaded 2
grep -q 'reload failed' "$dir/plain.log" || fail "reload 2: the refused file is not logged"
"$BUILD/gpucmd" --socket "$dir/plain.sock" status >/dev/null 2>&1 ||
	fail "the daemon does not answer after a refused reload"
stop_daemon
grep -q '^STOPPING=1$' "$dir/plain.msgs" || fail "no STOPPING=1 after SIGTERM (no watchdog)"
echo "ok: STATUS, READY, WATCHDOG (only when asked), live STATUS, RELOADING, STOPPING, stop_timeout"
exit 0
