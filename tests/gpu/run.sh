#!/bin/sh
# tests/gpu/run.sh - check the CUDA backend on a machine with a GPU.
#
#   BUILD=build sh tests/gpu/run.sh
#
# Builds nothing: it runs a build/ made elsewhere and carried here, and the
# caller sets LD_LIBRARY_PATH for any library that is not installed (libuv,
# libprotobuf-c, ...).  It starts $BUILD/gpucmdd --backend cuda on a private
# socket and runs `gpucmd exec` scripts whose answers are known to the bit
# (fill, copy, add, scale, saxpy, reduce, spin), with odd launch geometries
# on purpose: the built-ins must cover every element exactly once whatever
# the grid and block.  Then it runs every integration binary
# $BUILD/tests/test_* with GPUCMD_TEST_BACKEND=cuda, prints the GPU floors
# of gpucmd-bench (--only gpu), and last the fault test, because on CUDA a
# fault loses the daemon's context for good.
#
# Ends with "N passed, N failed".  Exit 0: all passed; 1: something failed;
# 77: no usable GPU here (the reason is printed).
set -u

BUILD=${BUILD:-build}
GPUCMDD=$BUILD/gpucmdd
GPUCMD=$BUILD/gpucmd
passed=0
failed=0
skipped=0
daemon_pid=

skip_all() {
	echo "skipped: $*"
	exit 77
}

if [ ! -x "$GPUCMDD" ] || [ ! -x "$GPUCMD" ]; then
	echo "$GPUCMDD or $GPUCMD is missing: build first (this script builds nothing)" >&2
	exit 1
fi
command -v nvidia-smi >/dev/null 2>&1 ||
	skip_all "no nvidia-smi: the NVIDIA driver is not installed here"
nvidia-smi -L >/dev/null 2>&1 ||
	skip_all "nvidia-smi sees no GPU: $(nvidia-smi -L 2>&1 | head -n 1)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpucmd-gpu.XXXXXX") || exit 1
SOCK=$TMP/s.sock
LOG=$TMP/daemon.log
OUT=$TMP/out
ERR=$TMP/err

# Called by the EXIT trap only.
# shellcheck disable=SC2317
cleanup() {
	if [ -n "$daemon_pid" ]; then
		kill "$daemon_pid" 2>/dev/null
		wait "$daemon_pid" 2>/dev/null
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Every tool call is bounded: a completion that never fires must fail the
# run, not hang it.
tool() {
	if command -v timeout >/dev/null 2>&1; then
		timeout 120 "$GPUCMD" --socket "$SOCK" "$@"
	else
		"$GPUCMD" --socket "$SOCK" "$@"
	fi
}

# ---- the daemon ------------------------------------------------------------
# The pinned pool is off, so every read's staging comes from the heap and is
# pinned for its copy (command_reserve_cpu): the built-in checks below run
# through that path, and "reads behind a kernel" checks that it does not
# hold the device thread.  Two services test max_modules.

cat >"$TMP/gpucmdd.conf" <<'CONF'
[daemon]
pinned_memory = 0
[service builtins]
max_modules = 0
[service capped]
max_modules = 1
CONF
"$GPUCMDD" --config "$TMP/gpucmdd.conf" --socket "$SOCK" --backend cuda \
	--log-level debug >"$LOG" 2>&1 &
daemon_pid=$!
i=0
until tool ping >/dev/null 2>&1; do
	if ! kill -0 "$daemon_pid" 2>/dev/null; then
		wait "$daemon_pid" 2>/dev/null
		daemon_pid=
		# driver_cuda_create's sentence: no libcuda, cuInit failed, no device.
		if grep -qiE 'libcuda|cuInit|CUDA device|CUDA backend' "$LOG"; then
			skip_all "gpucmdd --backend cuda did not start: $(tail -n 1 "$LOG")"
		fi
		echo "gpucmdd exited at start:" >&2
		sed 's/^/    /' "$LOG" >&2
		exit 1
	fi
	i=$((i + 1))
	if [ "$i" -ge 300 ]; then
		echo "gpucmdd did not answer on $SOCK within 30 s:" >&2
		sed 's/^/    /' "$LOG" >&2
		exit 1
	fi
	sleep 0.1
done
echo "gpucmdd: $(grep -m 1 'serving' "$LOG" || echo started)"

pass() {
	echo "ok"
	passed=$((passed + 1))
}

fail() {
	echo "FAILED: $*"
	sed 's/^/    /' "$ERR" | tail -n 20
	failed=$((failed + 1))
}

# expect NAME WANT: run the script on stdin through gpucmd exec; what it
# prints must be exactly WANT (reads print their bytes as hex, one line each).
expect() {
	name=$1
	want=$2
	printf '%-40s ' "$name"
	tool exec - >"$OUT" 2>"$ERR"
	rc=$?
	got=$(cat "$OUT")
	if [ "$rc" -ne 0 ]; then
		fail "gpucmd exec exited $rc"
	elif [ "$got" != "$want" ]; then
		fail "got '$got', want '$want'"
	else
		pass
	fi
}

now_ms() {
	t=$(date +%s%N 2>/dev/null)
	case $t in
	*[!0-9]*|'') echo "" ;;
	*) echo $((t / 1000000)) ;;
	esac
}

# ---- built-in kernels with known answers -------------------------------------
# Floats in little-endian hex: 1.0 = 0000803f, 2.0 = 00000040, 1.5 = 0000c03f.

expect "fill_u32, read back" "efbeaddeefbeaddeefbeaddeefbeadde" <<'EOF'
empty buf 16
kernel fill_u32 grid=1 block=64 buf u32:3735928559 u32:4
read buf
EOF

# Three blocks of 100 threads for a million elements: the grid-stride loop.
expect "fill_u32, 1M elements, small grid" \
	"$(printf '%s\n' 0700000007000000 0700000007000000)" <<'EOF'
empty big 4000000
kernel fill_u32 grid=3 block=100 big u32:7 u32:1000000
read big 0 8
read big 3999992 8
EOF

# 18 bytes: one 16-byte word and a byte tail.
expect "copy, 18 bytes" "00112233445566778899aabbccddeeff0102" <<'EOF'
create src hex:00112233445566778899aabbccddeeff0102
empty dst 18
kernel copy grid=2 block=32 dst src u64:18
read dst
EOF

# (1 + 2) * 0.5 = 1.5 over 1000 elements; first and last two checked.
expect "add_f32 then scale_f32" \
	"$(printf '%s\n' 0000c03f0000c03f 0000c03f0000c03f)" <<'EOF'
empty a 4000
empty b 4000
empty o 4000
kernel fill_u32 grid=4 block=256 a u32:1065353216 u32:1000
kernel fill_u32 grid=4 block=256 b u32:1073741824 u32:1000
kernel add_f32 grid=2 block=128 o a b u32:1000
kernel scale_f32 grid=1 block=96 o f32:0.5 u32:1000
read o 0 8
read o 3992 8
EOF

# y = 2x + y with x = 1 2 3 4, y = 10 20 30 40: 12 24 36 48.  A 2D grid and
# a 2D block give 8 threads for 4 elements: a kernel that visited an
# element twice would apply the update twice.
expect "saxpy_f32, 2D geometry" "000040410000c0410000104200004042" <<'EOF'
create x hex:0000803f000000400000404000008040
create y hex:000020410000a0410000f04100002042
kernel saxpy_f32 grid=2,2 block=1,2 y x f32:2 u32:4
read y
EOF

# 1 + 2 + 3 + 4 + 5 = 15 (00007041) with 3 threads: fewer threads than
# elements and not a power of two.
expect "reduce_sum_f32, 5 elements" "00007041" <<'EOF'
create x hex:0000803f0000004000004040000080400000a040
empty s 4
kernel reduce_sum_f32 grid=1 block=3 s x u32:5
read s
EOF

# A million ones sum to 1e6 (00247449) exactly; 3 blocks of 1000 threads.
expect "reduce_sum_f32, 1M ones" "00247449" <<'EOF'
empty x 4000000
empty s 4
kernel fill_u32 grid=64 block=256 x u32:1065353216 u32:1000000
kernel reduce_sum_f32 grid=3 block=1000 s x u32:1000000
read s
EOF

# spin(200 ms) then sync: the sync must not come back sooner.
printf '%-40s ' "spin 200 ms, sync waits for it"
t0=$(now_ms)
printf 'kernel spin grid=1 block=32 u32:200000\nsync\n' | tool exec - >"$OUT" 2>"$ERR"
rc=$?
t1=$(now_ms)
if [ "$rc" -ne 0 ]; then
	fail "gpucmd exec exited $rc"
elif [ -z "$t0" ] || [ -z "$t1" ]; then
	echo "skipped (date has no %N)"
	skipped=$((skipped + 1))
elif [ $((t1 - t0)) -lt 200 ]; then
	fail "sync returned after $((t1 - t0)) ms"
else
	pass
fi

# A read queued behind a 1 s kernel, with its staging from the heap: another
# connection's device work must still be answered at once.  Before the heap
# staging was pinned, cuMemcpyDtoHAsync into pageable memory held the
# device thread until the kernel ended.  The same for an inline write of
# 64 KiB (from the request's pageable bytes), which CUDA's documentation
# leaves open ("might be synchronous").
# behind NAME SCRIPT: run SCRIPT (which queues its last op behind a 1 s
# kernel) in the background; another connection's read must be answered
# within 400 ms meanwhile.
behind() {
	printf '%-40s ' "$1"
	printf '%s' "$2" | tool exec - >/dev/null 2>"$ERR" &
	slow=$!
	sleep 0.2
	t0=$(now_ms)
	printf 'empty x 16\nread x\n' | tool exec --service other - >"$OUT" 2>>"$ERR"
	rc=$?
	t1=$(now_ms)
	wait "$slow"
	slow_rc=$?
	if [ "$rc" -ne 0 ] || [ "$slow_rc" -ne 0 ]; then
		fail "gpucmd exec exited $rc (the slow one $slow_rc)"
	elif [ -z "$t0" ] || [ -z "$t1" ]; then
		echo "skipped (date has no %N)"
		skipped=$((skipped + 1))
	elif [ $((t1 - t0)) -gt 400 ]; then
		fail "another connection's read took $((t1 - t0)) ms meanwhile"
	else
		pass
	fi
}
spin='kernel spin grid=1 block=32 u32:1000000'
behind "read behind a kernel holds nobody" \
	"$(printf 'empty buf 4096\n%s\nread buf 0 16\n' "$spin")"
hex=$(head -c 65536 /dev/zero | od -An -v -tx1 | tr -d ' \n')
behind "write behind a kernel holds nobody" \
	"$(printf 'empty buf 65536\n%s\nwrite buf 0 hex:%s\nsync\n' "$spin" "$hex")"

# ---- the integration suite on the CUDA backend -------------------------------

for bin in "$BUILD"/tests/test_*; do
	[ -x "$bin" ] || continue
	printf '%-40s ' "${bin##*/} (cuda)"
	GPUCMD_TEST_BACKEND=cuda BUILD=$BUILD "$bin" >"$ERR" 2>&1
	rc=$?
	case $rc in
	0) pass ;;
	77)
		echo "skipped: $(tail -n 1 "$ERR")"
		skipped=$((skipped + 1))
		;;
	*) fail "exit $rc" ;;
	esac
done

# ---- GPU floors: gpucmd-bench's gpu scenario --------------------------------
# The daemon against cuLaunchKernel and cuMemcpy from pinned memory called by
# the bench itself (tests/bench/bench_gpu.c), printed for the record; the
# bench starts a private daemon of its own.  A missed target is a finding,
# not a failure: this fails only when the bench could not measure, or made
# no GPU rows.

printf '%-40s ' "gpucmd-bench --only gpu (cuda)"
if [ ! -x "$BUILD/gpucmd-bench" ]; then
	echo "skipped: $BUILD/gpucmd-bench is missing (make $BUILD/gpucmd-bench)"
	skipped=$((skipped + 1))
else
	if command -v timeout >/dev/null 2>&1; then
		timeout 300 "$BUILD/gpucmd-bench" --quick --only gpu \
			--backend cuda >"$OUT" 2>"$ERR"
	else
		"$BUILD/gpucmd-bench" --quick --only gpu --backend cuda \
			>"$OUT" 2>"$ERR"
	fi
	rc=$?
	if [ "$rc" -ne 0 ]; then
		cat "$OUT" >>"$ERR"
		fail "gpucmd-bench exited $rc"
	elif ! grep -q 'vs cuLaunchKernel' "$OUT" ||
		! grep -q 'vs cuMemcpy pinned' "$OUT"; then
		cat "$OUT" >>"$ERR"
		fail "no GPU floor rows"
	else
		pass
		sed 's/^/    /' "$OUT"
	fi
fi

# ---- a user's PTX through gpucmd exec -------------------------------------
# add_one(p, n): p[i] += 1 for i < n (nvcc -ptx -arch=compute_75, .version 7.0)
cat >"$TMP/add_one.ptx" <<'PTX'
.version 7.0
.target sm_75
.address_size 64
	// .globl	add_one
.visible .entry add_one(
	.param .u64 add_one_param_0,
	.param .u32 add_one_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd1, [add_one_param_0];
	ld.param.u32 	%r2, [add_one_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.u32 	%r6, [%rd4];
	add.s32 	%r7, %r6, 1;
	st.global.u32 	[%rd4], %r7;
$L__BB0_2:
	ret;
}
PTX
expect "module: a user's PTX kernel" "0100000002000000" <<EOF
module m ptx:file:$TMP/add_one.ptx
create b hex:0000000001000000
kernel m.add_one grid=1 block=32 b u32:2
read b
EOF

# max_modules: 0 refuses every load (EPERM); 1 refuses a second module on
# the connection, and a module goes with its connection.
sed 's/^\.address_size 64$/.address_size 64\n\/\/ another module/' \
	"$TMP/add_one.ptx" >"$TMP/add_two.ptx"
printf '%-40s ' "module: max_modules = 0 refuses (EPERM)"
printf 'module m ptx:file:%s\n' "$TMP/add_one.ptx" |
	tool --service builtins exec - >"$OUT" 2>"$ERR"
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q 'GPUCMD_EPERM' "$ERR"; then
	fail "exit $rc"
else
	pass
fi
printf '%-40s ' "module: max_modules = 1"
printf 'module a ptx:file:%s\nmodule b ptx:file:%s\n' "$TMP/add_one.ptx" \
	"$TMP/add_two.ptx" | tool --service capped exec - >"$OUT" 2>"$ERR"
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q 'GPUCMD_ELIMIT' "$ERR"; then
	fail "two modules under max_modules = 1: exit $rc"
elif ! printf 'module b ptx:file:%s\n' "$TMP/add_two.ptx" |
	tool --service capped exec - >"$OUT" 2>"$ERR"; then
	fail "the first connection's module was not given back"
elif ! tool --service capped services --json >"$OUT" 2>"$ERR" ||
	! grep -q '"name":"capped"[^}]*"modules":0,"max_modules":1' "$OUT"; then
	cat "$OUT" >>"$ERR"
	fail "services does not show capped at 0/1"
else
	pass
fi

# ---- last: a fault --------------------------------------------------------
# On CUDA a device fault is sticky for the whole context: the daemon answers
# the faulting batch with GPUCMD_ESTREAM, then stops with exit status 1 and a
# log line, so that systemd (Restart=on-failure) starts it with a fresh
# context.  This runs last for that reason.

printf '%-40s ' "fault -> GPUCMD_ESTREAM, daemon exits 1"
printf 'kernel fault grid=1 block=1\nsync\n' | tool exec --json - >"$OUT" 2>"$ERR"
rc=$?
status=
i=0
while [ $i -lt 100 ] && kill -0 "$daemon_pid" 2>/dev/null; do
	sleep 0.1
	i=$((i + 1))
done
if ! kill -0 "$daemon_pid" 2>/dev/null; then
	wait "$daemon_pid"
	status=$?
	daemon_pid=
fi
if [ "$rc" -eq 0 ]; then
	fail "the faulting script succeeded"
elif ! grep -q 'GPUCMD_ESTREAM' "$OUT"; then
	cat "$OUT" >>"$ERR"
	fail "no GPUCMD_ESTREAM in the answer"
elif [ "$status" != 1 ]; then
	fail "the daemon did not exit 1 after the fault (status '${status:-still running}')"
elif ! grep -q 'device is lost' "$LOG"; then
	fail "no log line about the lost device"
else
	pass
fi

echo "$passed passed, $failed failed, $skipped skipped"
if [ "$failed" -ne 0 ]; then
	echo "daemon log: last lines" >&2
	tail -n 30 "$LOG" | sed 's/^/    /' >&2
	exit 1
fi
exit 0
