#!/bin/sh
# exec_cli.sh - the gpucmd tool against a real daemon: an exec script fills
# a buffer with a built-in kernel and reads back the right bytes; an error
# prints "gpucmd: op N (KIND): message" and exits 1; memory-report --json
# has the documented keys and the right numbers; a buffer shared by one
# exec is imported by another of the same service, with its bytes, and the
# daemon's refusals name shared buffers by the script's names.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init cli
# shellcheck disable=SC2119 # no arguments to pass on
start_daemon

# 1. fill and read back
out=$(g exec <<'SCRIPT'
# fill 4 u32 with 0x01020304 and read them
empty buf 16
kernel fill_u32 grid=1 block=32 buf u32:0x01020304 u32:4
read buf
SCRIPT
) || fail "exec exited $?"
[ "$out" = "04030201040302010403020104030201" ] || fail "read back '$out'"

# 2. write at an offset, two submits, usage
out=$(g exec <<'SCRIPT'
empty a 8
write a 2 hex:aabb
submit
read a
usage
SCRIPT
) || fail "exec 2 exited $?"
expect="0000aabb00000000
usage: allocations=1 bytes_in_use=8"
case "$out" in
"$expect"*) ;;
*) fail "exec 2 printed '$out'" ;;
esac

# 3. an error: exit 1 and the documented line on stderr
err=$(printf 'empty a 8\nread a 4 8\n' | g exec - 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "error exit status $rc"
case "$err" in
"gpucmd: op "*"("*"): "*) ;;
*) fail "error line '$err'" ;;
esac

# 4. a kernel that would overrun its buffer is refused with the numbers
err=$(printf 'empty a 8\nkernel fill_u32 grid=1 block=1 a u32:1 u32:3\n' | g exec - 2>&1 >/dev/null)
case "$err" in
*"GPUCMD_EINVAL"*"needs 12 bytes, the buffer has 8"*) ;;
*) fail "overrun message '$err'" ;;
esac

# 4b. a user's module: the host backend refuses it clearly
if [ "${GPUCMD_TEST_BACKEND:-host}" = host ]; then
	err=$(printf 'module m ptx:hex:00\n' | g exec - 2>&1 >/dev/null)
	case "$err" in
	*"GPUCMD_EUNSUPPORTED"*"CUDA backend"*) ;;
	*) fail "module on the host backend: '$err'" ;;
	esac
fi

# 5. memory-report --json while a client holds memory
mkfifo "$dir/hold"
(printf 'empty keep 1000\nsync\nsubmit\n'; cat "$dir/hold") | g exec --service held - >/dev/null &
holder=$!
json=""
i=0
while :; do
	json=$(g memory-report --json) || fail "memory-report exited $?"
	case "$json" in *'"name":"held"'*'"bytes_in_use":1000'*) break ;; esac
	i=$((i + 1))
	[ $i -gt 200 ] && fail "report never showed the held buffer: $json"
	sleep 0.05
done
for key in name id bytes_in_use bytes_reserved bytes_padding allocations totals; do
	case "$json" in *"\"$key\""*) ;; *) fail "json lacks $key: $json" ;; esac
done
echo sync >"$dir/hold"
wait "$holder"

# 6. status and ping answer
g status >/dev/null || fail "status exited $?"
g ping -c 2 >/dev/null || fail "ping exited $?"

# 7. no daemon: exit 69
"$BUILD/gpucmd" --socket "$dir/none.sock" ping >/dev/null 2>&1
rc=$?
[ $rc -eq 69 ] || fail "unreachable daemon gave exit $rc"

# 8. a wedged daemon (stopped: the kernel still accepts connections, nobody
# answers): --timeout gives up with exit 69 and says so; exec, which waits
# for the user's work, still obeys an explicit --timeout
echo "empty a 8" >"$dir/one.txt"
kill -STOP "$pid"
for cmd in status "ping -c 1" "--timeout=0.2 exec $dir/one.txt"; do
	start=$(date +%s)
	# shellcheck disable=SC2086
	"$BUILD/gpucmd" --socket "$sock" --timeout 0.3 $cmd </dev/null \
		>/dev/null 2>"$dir/err"
	rc=$?
	took=$(( $(date +%s) - start ))
	[ $rc -eq 69 ] || { kill -CONT "$pid"; fail "$cmd on a stopped daemon: exit $rc"; }
	[ $took -le 5 ] || { kill -CONT "$pid"; fail "$cmd took $took s to time out"; }
	grep -q "did not answer Hello within" "$dir/err" ||
		{ kill -CONT "$pid"; fail "$cmd said: $(cat "$dir/err")"; }
done
kill -CONT "$pid"
g --timeout 5 status >/dev/null || fail "status after SIGCONT exited $?"
"$BUILD/gpucmd" --socket "$sock" --timeout -1 status >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "--timeout -1 gave exit $rc, not 2"

# 9. output that cannot be written is a failure (1), not a success; a
# script that cannot be read is not an empty one; help COMMAND; odd flags
if [ -w /dev/full ]; then
	g status --json >/dev/full 2>"$dir/err"
	rc=$?
	[ $rc -eq 1 ] || fail "status into /dev/full: exit $rc"
	grep -q "cannot write the output" "$dir/err" || fail "/dev/full: $(cat "$dir/err")"
fi
# a closed stdout: the output must not go into the daemon's socket
g memory-report >&- 2>"$dir/err"
rc=$?
[ $rc -eq 1 ] || fail "memory-report with stdout closed: exit $rc"
grep -q "bad frame magic" "$dir/log" && fail "the report went into the socket"
g exec "$dir" >/dev/null 2>"$dir/err"
rc=$?
[ $rc -eq 2 ] || fail "exec of a directory: exit $rc"
grep -q "cannot read script" "$dir/err" || fail "exec of a directory: $(cat "$dir/err")"
g help exec | head -1 | grep -q "^usage: gpucmd exec" || fail "help exec: $(g help exec | head -1)"
g help nope >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "help nope: exit $rc"
g status --bytes >/dev/null 2>"$dir/err"
rc=$?
[ $rc -eq 2 ] || fail "status --bytes: exit $rc"
grep -q "not an option of this command" "$dir/err" || fail "status --bytes: $(cat "$dir/err")"
out=$(printf 'empty a 16\nread a file:%s/no/such/x\nping\n' "$dir" | g exec --json 2>/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "read into an impossible file: exit $rc"
printf '%s\n' "$out" | grep -q '^{"line":2,"op":"read","error":"ENOENT",' ||
	fail "exec --json printed no error record: $out"
"$BUILD/gpucmd" --socket "$dir/$(printf 'x%.0s' $(seq 120))" status >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "an overlong --socket path: exit $rc, not 2"

# the caret of a layout error points at the word it is about (the fuzz
# harness found an index read uninitialised there)
err=$(printf 'empty a 8\nread a shape=0x100000000,0x100000000,2\n' | g exec 2>&1 >/dev/null)
case "$err" in *"<stdin>:2:8: the layout holds more than 2^64 bytes"*) ;;
*) fail "layout overflow: $err" ;; esac
err=$(printf 'empty a 8\nread a 0 8 elem=4\n' | g exec 2>&1 >/dev/null)
case "$err" in *"<stdin>:2:12: a layout needs shape="*) ;;
*) fail "elem= without shape=: $err" ;; esac

# 9a. a NUL byte in a script line is refused (exit 2, nothing of the group
# runs), not the rest of its line dropped: getline counts it, the words are
# C strings that end there, so a binary file given by mistake ran as a
# shorter script
printf 'ping\nempty a 8\000 junk\nping\n' >"$dir/nul.gs"
out=$(g exec "$dir/nul.gs" 2>"$dir/err")
rc=$?
[ $rc -eq 2 ] || fail "a NUL byte in the script: exit $rc"
[ -z "$out" ] || fail "a NUL byte in the script: the group ran: '$out'"
grep -qF "$dir/nul.gs:2:10: line 2 contains a NUL byte: is '$dir/nul.gs' a text script?" \
	"$dir/err" || fail "a NUL byte in the script: $(cat "$dir/err")"

# 9a'. a file: operand over the 1 GiB one op carries says so with its size
# and what the grammar offers instead (not a bare "File too large"); a
# sparse file, so its size is known without reading a byte
if truncate -s 1073741825 "$dir/huge.bin" 2>/dev/null; then
	err=$(printf 'empty a 8\nwrite a file:%s/huge.bin\n' "$dir" | g exec 2>&1 >/dev/null)
	rc=$?
	[ $rc -eq 2 ] || fail "a write of a file over 1 GiB: exit $rc"
	case "$err" in
	*"<stdin>:2:9: '$dir/huge.bin' is over the 1 GiB one exec operand can carry (1073741825 bytes): split it (split -b 1G) and write each piece with \`write a OFFSET file:PIECE\`, or use libgpucmd's regions (libgpucmd(3))"*) ;;
	*) fail "a write of a file over 1 GiB: '$err'" ;;
	esac
	err=$(printf 'create b file:%s/huge.bin\n' "$dir" | g exec 2>&1 >/dev/null)
	case "$err" in
	*"(1073741825 bytes): make the buffer with \`empty b BYTES\`, split the file"*) ;;
	*) fail "a create of a file over 1 GiB: '$err'" ;;
	esac
	rm -f "$dir/huge.bin"
fi

# 9b. a connection the daemon ends says why: an evicted exec names the
# eviction (gpucmd(1), evict: "their next request fails with
# GPUCMD_EDISCONNECTED"), in text and in --json, and exits 69.  Twice in
# CI runs (not reproduced by hand, 40 tries under load) an evicted exec
# exited without the reason (see the issue note), so each mode gets three
# tries to show it; every try must exit 69.
for json in "" --json; do
	said=""
	for try in 1 2 3; do
		(printf 'empty a 16\nkernel spin u32:3000000\nsync\n' |
			g --service victim exec $json >"$dir/ev.out" 2>"$dir/ev.err"
		echo $? >"$dir/ev.rc") &
		victim=$!
		i=0
		# Its batch is in (its 16 bytes live), so the eviction finds
		# it waiting for the kernel, not still sending.  The stream
		# must be a live one: the previous try's victim keeps its 16
		# bytes on a closing stream until its 3 s kernel ends.
		until g memory-report --json --service victim 2>/dev/null |
			grep -qF '"closing":false,"allocations":1,"bytes_in_use":16,'; do
			i=$((i + 1))
			[ $i -gt 500 ] && fail "the victim never connected"
			sleep 0.02
		done
		out=$(g evict victim) || fail "evict exited $?"
		[ "$out" = "evicted 1 connection" ] || fail "evict printed '$out'"
		wait "$victim"
		[ "$(cat "$dir/ev.rc")" -eq 69 ] ||
			fail "evicted exec$json exited $(cat "$dir/ev.rc"), not 69: $(cat "$dir/ev.err")"
		if grep -q "the daemon closed the connection: evicted by connection" \
			"$dir/ev.err"; then
			said=yes
			break
		fi
		echo "note: try $try: evicted exec$json gave no reason: $(cat "$dir/ev.err")"
	done
	[ -n "$said" ] ||
		fail "evicted exec$json does not say it was evicted: $(cat "$dir/ev.err")"
	if [ -n "$json" ]; then
		grep -q '"error":"GPUCMD_EDISCONNECTED".*evicted by connection' \
			"$dir/ev.out" ||
			fail "exec --json record of an eviction: $(cat "$dir/ev.out")"
	fi
done

# 9c. a long wait shows on a terminal what it waits for, and is erased
# (gpucmd(1), exec); with stderr not a terminal nothing is added.  It
# names the request's lines, as a --timeout that runs out names them: the
# request is waited for whole, and the slow op is often not its last.
printf 'kernel spin grid=1 block=1 u32:2200000\nsync\n' >"$dir/long.gs"
if command -v script >/dev/null 2>&1; then
	script -qec "\"$BUILD/gpucmd\" --socket \"$sock\" exec \"$dir/long.gs\"" \
		"$dir/long.tty" >/dev/null 2>&1 </dev/null ||
		fail "exec on a terminal exited $?"
	grep -qE "waiting for script lines 1-2 \(kernel to sync\): [0-9]+ s" "$dir/long.tty" ||
		fail "no progress on a terminal: $(cat -v "$dir/long.tty")"
	grep -q "$(printf '\033')\[K" "$dir/long.tty" ||
		fail "the progress line is not erased: $(cat -v "$dir/long.tty")"
	script -qec "\"$BUILD/gpucmd\" --socket \"$sock\" --timeout 1.5 exec \"$dir/long.gs\"" \
		"$dir/late.tty" >/dev/null 2>&1 </dev/null
	rc=$?
	[ $rc -eq 69 ] || fail "exec past its --timeout: exit $rc"
	grep -qE "waiting for script lines 1-2 \(kernel to sync\): 1 s" "$dir/late.tty" ||
		fail "no progress before the timeout: $(cat -v "$dir/late.tty")"
	grep -qF "gpucmd: script lines 1-2: the daemon did not answer within 1.5 s" "$dir/late.tty" ||
		fail "the timeout names other lines: $(cat -v "$dir/late.tty")"
fi
g exec "$dir/long.gs" >/dev/null 2>"$dir/long.err" || fail "exec exited $?"
[ ! -s "$dir/long.err" ] || fail "progress without a terminal: $(cat "$dir/long.err")"

# 9c. capture abort: the recording is discarded, the recorded fill never
#     runs, and the stream reads again (test_ops checks it after a failed
#     batch)
out=$(g exec 2>&1 <<'SCRIPT'
empty z 4
write z hex:00000000
submit
capture begin
kernel fill_u32 grid=1 block=1 z u32:7 u32:1
submit
capture abort
read z
SCRIPT
) || fail "capture abort: exit $?: $out"
[ "$out" = "00000000" ] || fail "capture abort: read '$out'"
err=$(printf 'capture abort extra\n' | g exec 2>&1) && fail "capture abort extra parsed"
case "$err" in
*"capture abort takes no operands"*) ;;
*) fail "capture abort extra: '$err'" ;;
esac

# 9d. share and import (gpucmd(1), exec): one exec is one connection, so
#     the sharer reads its script from a fifo and stays connected; its ping
#     answers once the share's copy has run (the sync waits for it: the
#     daemon answers a share before, and an import until then is EBUSY).  Another exec of the same service
#     imports the buffer, reads its bytes and copies it with a kernel that
#     takes it as in:NAME; the memory outlives the sharer while an import
#     holds it; a write into it, a kernel that writes an in: argument,
#     another service and an unknown name are refused by the daemon (1);
#     a bare read of an import, a bad shared name and in: without a name
#     by the parser (2), nothing of the group sent.
mkfifo "$dir/sharer" "$dir/keeper"
"$BUILD/gpucmd" --socket "$sock" --service infer exec - <"$dir/sharer" \
	>"$dir/sharer.out" 2>"$dir/sharer.err" &
sharer=$!
pids="$pids $sharer"
exec 6>"$dir/sharer"
printf 'create w hex:0102030405060708\nshare w weights\nsync\nread w\nping\nsubmit\n' >&6
i=0
until grep -q '^pong$' "$dir/sharer.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the sharer never answered: $(cat "$dir/sharer.err")"
	sleep 0.05
done
# The sharer still reads its buffer (read-only, not gone).
[ "$(head -1 "$dir/sharer.out")" = 0102030405060708 ] ||
	fail "the sharer's read after share: $(cat "$dir/sharer.out")"
out=$(g --service infer exec <<'SCRIPT'
import v weights
empty o 8
kernel copy grid=1 block=1 o in:v u64:8
read v 0 8
read o
read v 2 4
SCRIPT
) || fail "import and read exited $?: $out"
[ "$out" = "0102030405060708
0102030405060708
03040506" ] || fail "import and read printed '$out'"
# A keeper holds an import; the sharer goes; the bytes stay.
# (not holding the sharer's fifo open: 6>&-)
"$BUILD/gpucmd" --socket "$sock" --service infer exec - <"$dir/keeper" \
	>"$dir/keeper.out" 2>"$dir/keeper.err" 6>&- &
keeper=$!
pids="$pids $keeper"
exec 7>"$dir/keeper"
printf 'import k weights\nping\nsubmit\n' >&7
i=0
until grep -q '^pong$' "$dir/keeper.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the keeper never imported: $(cat "$dir/keeper.err")"
	sleep 0.05
done
exec 6>&-
wait "$sharer" || fail "the sharer exited $?: $(cat "$dir/sharer.err")"
out=$(printf 'import v weights\nread v 0 8\n' | g --service infer exec) ||
	fail "import after the sharer left exited $?: $out"
[ "$out" = 0102030405060708 ] || fail "import after the sharer left read '$out'"
# --json: share and import print nothing, the read its record.
out=$(printf 'import v weights\nread v 4 4\n' | g --service infer exec --json) ||
	fail "import --json exited $?"
[ "$out" = '{"line":2,"op":"read","name":"v","data":"05060708"}' ] ||
	fail "import --json printed '$out'"
err=$(printf 'import v weights\nwrite v hex:00\n' | g --service infer exec 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "a write into an import: exit $rc"
case "$err" in
"gpucmd: op 1 (GPUCMD_EINVAL): handle 1 ('v') names the buffer shared as 'weights', which is read-only for every connection"*"[script line 2]") ;;
*) fail "a write into an import: '$err'" ;;
esac
# The sharer's own handle, and a kernel's output argument: the same
# sentence, with the script's name.
err=$(printf 'create s hex:01020304\nshare s mine\nwrite s hex:00\n' |
	g --service infer exec 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "a write into the sharer's own buffer: exit $rc"
case "$err" in
"gpucmd: op 2 (GPUCMD_EINVAL): handle 1 ('s') names the buffer shared as 'mine', which is read-only for every connection"*"[script line 3]") ;;
*) fail "a write into the sharer's own buffer: '$err'" ;;
esac
err=$(printf 'import v weights\nkernel fill_u32 grid=1 block=1 v u32:1 u32:1\n' |
	g --service infer exec 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "fill_u32 into an import: exit $rc"
case "$err" in
"gpucmd: op 1 (GPUCMD_EINVAL): handle 1 ('v') names the buffer shared as 'weights', which is read-only"*"[script line 2]") ;;
*) fail "fill_u32 into an import: '$err'" ;;
esac
# A fault reported at a read loses the share after it: the sentence says
# which, by the script's name (host only: on CUDA a fault loses the device).
if [ "${GPUCMD_TEST_BACKEND:-host}" = host ]; then
	err=$(printf '%s\n' 'create s hex:01020304' 'empty x 4' \
		'kernel fault grid=1 block=1' 'read x' 'share s faulted' |
		g --service infer exec 2>&1)
	rc=$?
	[ $rc -eq 1 ] || fail "a share lost to a fault: exit $rc"
	case "$err" in
	"gpucmd: op 3 (GPUCMD_ESTREAM): stream fault: work on stream 0 faulted before this read;"*"; handle 1 ('s'), shared as 'faulted' at op 4, is lost: release it and share it again [script line 4]") ;;
	*) fail "a share lost to a fault: '$err'" ;;
	esac
fi
err=$(printf 'import v weights\nkernel fill_u32 grid=1 block=1 in:v u32:1 u32:1\n' |
	g --service infer exec 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "fill_u32 of an in: argument: exit $rc"
case "$err" in
*"(GPUCMD_EINVAL): kernel fill_u32 writes argument 0, which was passed as buffer_in (read only)"*) ;;
*) fail "fill_u32 of an in: argument: '$err'" ;;
esac
err=$(printf 'import v weights\n' | g --service elsewhere exec 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "an import from another service: exit $rc"
case "$err" in
"gpucmd: op 0 (GPUCMD_ENOTFOUND): service 'elsewhere' shares no buffer as 'weights'"*) ;;
*) fail "an import from another service: '$err'" ;;
esac
err=$(printf 'import v biases\n' | g --service infer exec 2>&1)
[ $? -eq 1 ] || fail "an import of an unknown name did not exit 1"
case "$err" in
*"GPUCMD_ENOTFOUND"*"shares no buffer as 'biases'"*) ;;
*) fail "an import of an unknown name: '$err'" ;;
esac
# Sharing a name the service shares already.
err=$(printf 'empty a 4\nshare a weights\n' | g --service infer exec 2>&1)
[ $? -eq 1 ] || fail "a second share of 'weights' did not exit 1"
case "$err" in
*"GPUCMD_EEXIST"*"shares a buffer as 'weights' already (8 bytes"*) ;;
*) fail "a second share of 'weights': '$err'" ;;
esac
long=$(printf 'n%.0s' $(seq 64))
for bad in \
	"ping|import v weights|read v|3:6: the script does not know how large 'v' is (import does not say): read v OFFSET LEN" \
	"ping|import v bad*name|2:10: 'bad*name' cannot name a shared buffer: use 1 to 63 letters, digits, '.', '_', '-', '/' or ':'" \
	"ping|empty a 4|share a $long|3:9: '$long' cannot name a shared buffer" \
	"ping|empty a 4|share b w|3:7: no buffer named 'b' (create it with empty, create, bind or import)" \
	"ping|empty o 4|kernel copy o in: u64:4|3:15: in: needs a buffer name: in:NAME" \
	"ping|empty o 4|kernel copy o in:x u64:4|3:15: no buffer named 'x' (create it with empty, create, bind or import)" \
	"ping|empty o 4|kernel copy o out:o u64:4|3:15: unknown argument type 'out': use a buffer name, in:, u32:, i32:, u64: or f32:" \
	"ping|import v|2:9: missing operand: usage: import NAME SHARED" \
	"ping|empty a 4|share a w x|3:11: too many operands: usage: share NAME SHARED"; do
	want=${bad##*|}
	script=$(printf '%s\n' "${bad%|*}" | tr '|' '\n')
	out=$(printf '%s\n' "$script" | g --service infer exec 2>"$dir/err")
	rc=$?
	[ $rc -eq 2 ] || fail "'$script': exit $rc, not 2"
	[ -z "$out" ] || fail "'$script': the group ran: '$out'"
	grep -qF "gpucmd: <stdin>:$want" "$dir/err" || fail "'$script': $(cat "$dir/err")"
done
exec 7>&-
wait "$keeper" || fail "the keeper exited $?: $(cat "$dir/keeper.err")"

# 10. SIGTERM: a clean exit 0
stop_daemon
exit 0
