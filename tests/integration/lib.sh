# shellcheck shell=sh
# lib.sh - what the integration scripts (tests/integration/*.sh) share.
# Sourced, never run on its own (tests/run.sh passes it by):
#
#   . "$(dirname "$0")/lib.sh"
#   lib_init NAME
#
# After lib_init:
#   $BUILD        the build folder ($BUILD, else build)
#   $dir          a fresh folder /tmp/gpucmd-NAME-XXXXXX, removed at exit
#   $sock         $dir/s.sock, where start_daemon listens
#   $pid $pids    what the script started in the background: at exit each
#                 one still running is killed and waited for (a script with
#                 more to undo sets its own EXIT trap and calls lib_cleanup
#                 last)
#   fail MSG      prints "FAIL: MSG", the end of each log in $dir (log,
#                 *.log, *.msgs), "FAIL: MSG" again (tests/run.sh shows
#                 only the end of a failed script's output), exits 1
#   skip MSG      prints "skipped: MSG" and exits 77, which run.sh counts
#                 as a skip
#   need PROG...  fails unless each $BUILD/PROG is built
#   wait_socket PATH
#                 returns once PATH is a socket; fails after 10 s, or as
#                 soon as $pid (when set) has exited
#   start_daemon [ARG]...
#                 gpucmdd on $sock and $GPUCMD_TEST_BACKEND (host unless
#                 set), with ARGs, its output in $dir/log, as $pid; returns
#                 once it listens
#   wait_exit WHAT
#                 returns once $pid has exited, its exit status in $status
#                 and $pid empty; fails ("WHAT did not exit") after 10 s
#   stop_daemon   SIGTERM to $pid; fails unless it exits 0 within 10 s
#   g ARG...      the gpucmd tool on $sock
set -u
BUILD=${BUILD:-build}
dir=""
sock=""
pid=""
pids=""

lib_init() {
	dir=$(mktemp -d "/tmp/gpucmd-$1-XXXXXX") || {
		echo "FAIL: cannot make a folder under /tmp"
		exit 1
	}
	sock=$dir/s.sock
	trap lib_cleanup EXIT
	trap 'exit 1' INT TERM
}

# shellcheck disable=SC2317 # called by the trap
lib_cleanup() {
	for p in $pid $pids; do
		kill "$p" 2>/dev/null
		kill -CONT "$p" 2>/dev/null # one a test stopped
		wait "$p" 2>/dev/null
	done
	[ -n "$dir" ] && rm -rf "$dir"
}

fail() {
	echo "FAIL: $*"
	for f in "$dir/log" "$dir"/*.log "$dir"/*.msgs; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }
	done
	echo "FAIL: $*"
	exit 1
}

skip() {
	echo "skipped: $*"
	exit 77
}

need() {
	for b in "$@"; do
		[ -x "$BUILD/$b" ] || fail "$BUILD/$b is missing: run make first"
	done
}

# wait_socket PATH [ID]: until PATH is a socket, and not the one whose
# inode and change time were ID (sock_id): what a killed daemon left there
# is not the new daemon's
wait_socket() {
	i=0
	while [ ! -S "$1" ] ||
		{ [ -n "${2:-}" ] && [ "$(sock_id "$1")" = "$2" ]; }; do
		i=$((i + 1))
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			fail "process $pid exited before $1 was there"
		fi
		[ $i -gt 500 ] && fail "no socket at $1 within 10 s"
		sleep 0.02
	done
}

# A socket file's inode and change time (an inode number alone may be
# reused at once).
sock_id() {
	stat -c '%i %z' "$1" 2>/dev/null
}

start_daemon() {
	sock_was=""
	[ -S "$sock" ] && sock_was=$(sock_id "$sock")
	"$BUILD/gpucmdd" --socket "$sock" \
		--backend "${GPUCMD_TEST_BACKEND:-host}" "$@" >"$dir/log" 2>&1 &
	pid=$!
	wait_socket "$sock" "$sock_was"
}

wait_exit() {
	i=0
	while kill -0 "$pid" 2>/dev/null; do
		i=$((i + 1))
		[ $i -gt 500 ] && fail "$1 did not exit within 10 s"
		sleep 0.02
	done
	wait "$pid"
	# shellcheck disable=SC2034 # for the script that sources this
	status=$?
	pid=""
}

stop_daemon() {
	kill -TERM "$pid"
	wait_exit "the daemon (sent SIGTERM)"
	[ "$status" -eq 0 ] || fail "the daemon exited $status after SIGTERM, not 0"
}

# wait_service NAME: until the daemon lists service NAME (a background
# client has joined it), at most 10 s
wait_service() {
	i=0
	until g services | grep -q "^$1 "; do
		i=$((i + 1))
		[ $i -gt 200 ] && fail "no client joined service $1 within 10 s"
		sleep 0.05
	done
}

g() {
	"$BUILD/gpucmd" --socket "$sock" "$@"
}
