#!/bin/sh
# socket_activation.sh - gpucmdd started by systemd-socket-activate (the
# socket-passing half of systemd, as gpucmdd.socket uses it):
#   1. one inherited Unix stream socket: the first connection starts the
#      daemon, `gpucmd ping` and `gpucmd status` are served through it, the
#      daemon never binds its own --socket path, and after SIGTERM it exits
#      0 leaving the socket file (systemd's) in place;
#   2. two passed sockets: the daemon refuses to start, says why ("passed
#      2 sockets ... exactly one"), exits 1;
#   3. a SOCK_SEQPACKET socket (when python3 is there to connect to it):
#      refused with "not a listening Unix stream socket", exit 1.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
activate=$(command -v systemd-socket-activate ||
	command -v /lib/systemd/systemd-socket-activate ||
	command -v /usr/lib/systemd/systemd-socket-activate) ||
	skip "systemd-socket-activate is not installed (Debian package systemd)"
lib_init sockact
need gpucmdd
g() { "$BUILD/gpucmd" "$@"; }

# ---- 1. one socket -----------------------------------------------------------
sock=$dir/act.sock
own=$dir/own.sock
"$activate" -l "$sock" "$BUILD/gpucmdd" --backend host --host-memory 64M \
	--socket "$own" >"$dir/act1.log" 2>&1 &
pid=$!
wait_socket "$sock"
out=$(g --socket "$sock" ping -c 2 2>&1) || fail "ping through the activated socket: $out"
case $out in
*"pong 2:"*) ;;
*) fail "ping printed '$out'" ;;
esac
out=$(g --socket "$sock" status --json 2>&1) || fail "status: $out"
case $out in
*'"backend":"host"'*) ;;
*) fail "status printed '$out'" ;;
esac
[ -e "$own" ] && fail "the daemon bound its own socket $own instead of using the passed one"
grep -q "cannot start" "$dir/act1.log" && fail "the daemon complained"
stop_daemon
[ -S "$sock" ] || fail "the daemon removed the socket file systemd owns"

# ---- 2. two sockets ----------------------------------------------------------
a=$dir/a.sock
b=$dir/b.sock
"$activate" -l "$a" -l "$b" "$BUILD/gpucmdd" --backend host --host-memory 64M \
	--socket "$own" >"$dir/act2.log" 2>&1 &
pid=$!
wait_socket "$a"
wait_socket "$b"
g --socket "$a" ping -c 1 >/dev/null 2>&1 && fail "a daemon given two sockets answered"
wait_exit "the daemon given two sockets"
[ "$status" -eq 1 ] || fail "two sockets: exit status $status, expected 1"
grep -q "passed 2 sockets.*exactly one" "$dir/act2.log" ||
	fail "two sockets: no clear reason in the log"
[ -e "$own" ] && fail "two sockets: the daemon bound its own socket anyway"

# ---- 3. a socket of the wrong type -------------------------------------------
if command -v python3 >/dev/null; then
	sp=$dir/seq.sock
	"$activate" --seqpacket -l "$sp" "$BUILD/gpucmdd" --backend host \
		--host-memory 64M --socket "$own" >"$dir/act3.log" 2>&1 &
	pid=$!
	wait_socket "$sp"
	python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])' "$sp" || fail "cannot connect to the seqpacket socket"
	wait_exit "the daemon given a seqpacket socket"
	[ "$status" -eq 1 ] || fail "seqpacket socket: exit status $status, expected 1"
	grep -q "not a listening Unix stream socket" "$dir/act3.log" ||
		fail "seqpacket socket: no clear reason in the log"
fi
echo "ok: served through one passed socket; two sockets and a seqpacket socket refused"
exit 0
