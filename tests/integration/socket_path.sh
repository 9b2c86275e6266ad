#!/bin/sh
# socket_path.sh - what gpucmdd does with the path it is told to listen on
# (server.c, clear_stale_socket and listen_failed), as gpucmdd(8) says:
#   - a second daemon on the path of a live one exits 1 and says so, and
#     the first one goes on serving;
#   - a socket file left by a daemon killed with SIGKILL is replaced;
#   - a socket file removed while the daemon runs is bound again, and
#     clients connected before go on; one replaced by another daemon's is
#     warned about, and the first daemon's stop does not remove it;
#   - a path that is a regular file is left alone: exit 1, and why;
#   - a directory that does not exist is named as the reason (libuv would
#     report EACCES), exit 1;
#   - socket_mode and socket_group set the socket's mode and group, and a
#     socket_group that does not exist is named as the reason, exit 1;
#   - gpucmd on a path that is not a socket says what it is, and on a
#     socket not open to its user the socket's mode, owner and group (69).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init sockpath
need gpucmdd gpucmd
: >"$dir/empty.conf"

# The config file start and refused use.
conf=$dir/empty.conf

# start NAME: a daemon on $sock in the background ($pid), up within 10 s.
start() {
	"$BUILD/gpucmdd" -c "$conf" -s "$sock" -b host \
		-l info >"$dir/$1.log" 2>&1 &
	pid=$!
	i=0
	until "$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1; do
		i=$((i + 1))
		kill -0 "$pid" 2>/dev/null || fail "$1: gpucmdd exited at start"
		[ $i -gt 500 ] && fail "$1: gpucmdd did not answer within 10 s"
		sleep 0.02
	done
}

# said FILE TEXT WHAT: wait until FILE has a line with TEXT, at most 10 s,
# else fail with WHAT and the end of FILE.
said() {
	i=0
	until grep -qF "$2" "$1"; do
		i=$((i + 1))
		[ $i -gt 500 ] && fail "$3: $(tail -n 5 "$1")"
		sleep 0.02
	done
}

# refused NAME PATH WANT: gpucmdd on PATH exits 1 within 10 s and logs WANT.
refused() {
	timeout 10 "$BUILD/gpucmdd" -c "$conf" -s "$2" -b host \
		>"$dir/$1.log" 2>&1
	rc=$?
	[ $rc -eq 1 ] || fail "$1: gpucmdd exited $rc, want 1"
	grep -qF "$3" "$dir/$1.log" ||
		fail "$1: the log does not say '$3'"
}

# A live daemon keeps its socket.
start first
refused second "$sock" "another gpucmdd is already serving on $sock"
[ -S "$sock" ] || fail "the second daemon removed the first one's socket"
"$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1 ||
	fail "the first daemon no longer answers after the second one tried"

# A dead one's socket is replaced.
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=""
[ -S "$sock" ] || fail "SIGKILL left no socket file to test with"
start replacement
grep -qF "already serving" "$dir/replacement.log" &&
	fail "the stale socket was taken for a live daemon"
stop_daemon
[ -e "$sock" ] && fail "a clean shutdown left $sock behind"

# A socket file removed while the daemon runs is bound again at the 2 s
# tick, with its mode: new clients reach the daemon, and a client
# connected before goes on (its ping after the re-bind is answered).
start removed
mkfifo "$dir/kept"
"$BUILD/gpucmd" --socket "$sock" exec - <"$dir/kept" >"$dir/kept.out" \
	2>"$dir/kept.err" &
kept=$!
pids="$pid $kept"
exec 6>"$dir/kept"
printf 'ping\nsubmit\n' >&6
i=0
until grep -q '^pong$' "$dir/kept.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 500 ] && fail "the kept client never answered: $(cat "$dir/kept.err")"
	sleep 0.02
done
mode=$(stat -c %a "$sock")
rm -f "$sock"
said "$dir/removed.log" "the socket $sock was removed while gpucmdd runs: bound it again, new clients can connect (1 connection open carried on)" \
	"not bound again within 10 s"
[ -S "$sock" ] || fail "the log says bound again, but $sock is no socket"
[ "$(stat -c %a "$sock")" = "$mode" ] ||
	fail "bound again with mode $(stat -c %a "$sock"), was $mode"
"$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1 ||
	fail "a new client cannot reach the daemon after the re-bind"
printf 'ping\nsubmit\n' >&6
exec 6>&-
wait "$kept" || fail "the kept client exited $?: $(cat "$dir/kept.err")"
[ "$(grep -c '^pong$' "$dir/kept.out")" -eq 2 ] ||
	fail "the kept client's second ping: $(cat "$dir/kept.out")"
pids=""
stop_daemon
[ -e "$sock" ] && fail "a clean shutdown left the re-bound $sock behind"

# A socket whose directory went too: the daemon says once that binding
# it again failed, and why, and binds it once the directory is back.
mkdir "$dir/sub"
sock0=$sock
sock=$dir/sub/s.sock
start nodir
rm -rf "$dir/sub"
said "$dir/nodir.log" "the socket $sock was removed while gpucmdd runs, and binding it again failed: cannot listen on $sock: the directory $dir/sub does not exist" \
	"no word within 10 s that binding again failed"
mkdir "$dir/sub"
i=0
until "$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -gt 500 ] && fail "not bound again within 10 s of the directory's return"
	sleep 0.02
done
[ "$(grep -c "binding it again failed" "$dir/nodir.log")" -eq 1 ] ||
	fail "the failure to bind again was said more than once"
stop_daemon

# Binding again failed, then another daemon took the path: the first
# stops trying, and says so (its last word was "trying again every 2 s");
# once the other has gone, it binds the path again.  SIGSTOP keeps its
# tick from winning the path before the other listens.
mkdir -p "$dir/sub"
start gone2
first=$pid
pids=$first
rm -rf "$dir/sub"
said "$dir/gone2.log" "binding it again failed" \
	"gone2: no word within 10 s that binding again failed"
kill -STOP "$first"
mkdir "$dir/sub"
start other
second=$pid
pids="$first $second"
kill -CONT "$first"
said "$dir/gone2.log" "the socket $sock was replaced while gpucmdd runs" \
	"gone2: not said within 10 s that the path is another's now"
pid=$second
pids=$first
stop_daemon
said "$dir/gone2.log" "the socket $sock was removed while gpucmdd runs: bound it again" \
	"gone2: not bound again within 10 s of the other's stop"
"$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1 ||
	fail "gone2: the first daemon does not answer after binding again"
pid=$first
pids=""
stop_daemon
sock=$sock0

# A listen that fails on the socket bound again (listen_fail.so: the 3rd
# listen(2), after the start's and socket_rebind's): the daemon tries
# again, and listens within a few seconds.  The handle that failed had
# closed the socket with itself, and the retry used that closed
# descriptor: it failed with EBADF every second, for good.
if [ -f "$BUILD/tests/listen_fail.so" ]; then
	# Under ASan the shim comes before ASan's runtime in the list of
	# libraries loaded: harmless here, and ASan must be told so.
	asan_was=${ASAN_OPTIONS-}
	export LD_PRELOAD="$BUILD/tests/listen_fail.so" LISTEN_FAIL_AT=3 \
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
	start relisten
	unset LD_PRELOAD LISTEN_FAIL_AT
	ASAN_OPTIONS=$asan_was
	pids=$pid
	rm -f "$sock"
	said "$dir/relisten.log" "cannot listen again: address already in use" \
		"relisten: the failed listen not said within 10 s"
	i=0
	until "$BUILD/gpucmd" --socket "$sock" ping -c 1 >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -gt 250 ] && fail "relisten: not listening within 5 s of a failed listen"
		sleep 0.02
	done
	pids=""
	stop_daemon
else
	echo "note: $BUILD/tests/listen_fail.so is missing (make tests): a failed listen not tested"
fi

# A socket file replaced while the daemon runs (another daemon started on
# the path) is the other's: the first warns, and its stop leaves that
# socket alone (it used to remove it).  The first is stopped (SIGSTOP)
# from the removal until the second listens, so that its tick cannot bind
# the path again in between.
start replaced
first=$pid
pids=$first
kill -STOP "$first"
rm -f "$sock"
start rebound
second=$pid
pids="$first $second"
kill -CONT "$first"
said "$dir/replaced.log" "the socket $sock was replaced while gpucmdd runs" \
	"no warning within 10 s that the socket is another's"
pid=$first
stop_daemon
[ -S "$sock" ] || fail "the first daemon's stop removed the second one's socket"
"$BUILD/gpucmd" --socket "$sock" ping >/dev/null 2>&1 ||
	fail "the second daemon no longer answers after the first one stopped"
pid=$second
pids=""
stop_daemon
[ -e "$sock" ] && fail "a clean shutdown left $sock behind"

# Not a socket: left alone.
echo "keep me" >"$dir/file"
refused file "$dir/file" "$dir/file exists and is not a socket"
[ "$(cat "$dir/file")" = "keep me" ] || fail "the regular file was changed"

# gpucmd pointed at something that is not a socket says what it is.
for what in "$dir/file:a regular file" "$dir:a directory"; do
	err=$("$BUILD/gpucmd" --socket "${what%%:*}" status 2>&1)
	rc=$?
	[ $rc -eq 69 ] || fail "gpucmd on ${what#*:}: exit $rc ('$err')"
	case "$err" in
	*"${what%%:*} is ${what#*:}, not a socket: check --socket"*) ;;
	*) fail "gpucmd on ${what#*:}: '$err'" ;;
	esac
done

# A directory that does not exist is the reason given.
refused nodir "$dir/missing/s.sock" \
	"the directory $dir/missing does not exist"

# socket_mode and socket_group.  Root may give the socket any group: one
# it is not in shows the setting took; anyone else, a group of its own.
if [ "$(id -u)" -eq 0 ]; then
	group=$(getent group | awk -F: '$3 != 0 { print $1; exit }')
else
	group=$(id -gn)
fi
[ -n "$group" ] || fail "no group to give the socket"
printf '[daemon]\nsocket_mode = 0600\nsocket_group = %s\n' "$group" \
	>"$dir/group.conf"
conf=$dir/group.conf
start grouped
[ "$(stat -c %G "$sock")" = "$group" ] ||
	fail "the socket's group is $(stat -c %G "$sock"), not $group"
[ "$(stat -c %a "$sock")" = 600 ] ||
	fail "the socket's mode is $(stat -c %a "$sock"), not 600 (socket_mode)"
# gpucmd as a user the socket is not open to says the socket's mode, owner
# and group and who may connect, and then a directory in the way (root
# only, to become someone else)
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
	nobody() {
		setpriv --reuid=65534 --regid=65534 --clear-groups \
			"$BUILD/gpucmd" --socket "$sock" status 2>&1
	}
	chmod 0755 "$dir"
	err=$(nobody)
	rc=$?
	[ $rc -eq 69 ] || fail "a socket not open to the user: exit $rc ('$err')"
	case "$err" in
	*"the socket (mode 0600, owner root, group $group) is not open to this user; only root may connect"*) ;;
	*) fail "a socket not open to the user: '$err'" ;;
	esac
	chmod 0700 "$dir"
	err=$(nobody)
	case "$err" in
	*"a directory on the way to $sock is not open to this user"*) ;;
	*) fail "a socket in a directory closed to the user: '$err'" ;;
	esac
fi
stop_daemon
printf '[daemon]\nsocket_group = no-such-group-gpucmd\n' >"$dir/nogroup.conf"
conf=$dir/nogroup.conf
refused nogroup "$sock" \
	"socket_group 'no-such-group-gpucmd' does not exist"
# --check-config names the file, as for every other error in it.
err=$("$BUILD/gpucmdd" -c "$conf" --check-config 2>&1) &&
	fail "--check-config passed a missing socket_group"
case "$err" in
*"$conf: socket_group 'no-such-group-gpucmd' does not exist"*) ;;
*) fail "--check-config of a missing socket_group: '$err'" ;;
esac

[ -n "${SOCKPATH_DEBUG:-}" ] && tail -n 3 "$dir"/*.log
echo "ok: live socket kept, stale socket replaced, removed socket bound again, replaced one warned about and kept, file and missing directory refused, socket mode and group set, unknown group refused, gpucmd says why it cannot connect"
