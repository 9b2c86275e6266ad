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
# the grid and block.  It checks that no service's kernel holds another's
# work (reads, writes, frees at a close, unpinning), that a captured write
# replays, that stop_timeout ends a daemon with a kernel running, and what
# the daemon reads of kernel parameters against the driver.  Then it runs
# every integration binary $BUILD/tests/test_* with
# GPUCMD_TEST_BACKEND=cuda (GPU_RUN_SUITES=0 skips them and the bench),
# prints the GPU floors of gpucmd-bench (--only gpu), and last the fault
# test, because on CUDA a fault loses the daemon's context for good.
#
# Without a GPU, the checks run on the fake driver with a stand-in for
# nvidia-smi (the parameter comparison is skipped there):
#   printf '#!/bin/sh\necho "GPU 0: fake (UUID: GPU-facec0da-0000-0000-0000-000000000000)"\n' >/tmp/bin/nvidia-smi
#   PATH=/tmp/bin:$PATH LD_LIBRARY_PATH=build/fakecuda GPU_RUN_SUITES=0 \
#       sh tests/gpu/run.sh
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
	[ -n "${stop_pid:-}" ] && kill -KILL "$stop_pid" 2>/dev/null
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

now_ms() {
	t=$(date +%s%N 2>/dev/null)
	case $t in
	*[!0-9]*|'') echo "" ;;
	*) echo $((t / 1000000)) ;;
	esac
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
started=$(now_ms)
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
# The built-ins are JIT compiled at open, before READY: how long that takes.
ready=$(now_ms)
[ -n "$started" ] && [ -n "$ready" ] &&
	echo "gpucmdd: answered $((ready - started)) ms after its start (built-ins JIT compiled at open)"

pass() {
	echo "ok"
	passed=$((passed + 1))
}

fail() {
	echo "FAILED: $*"
	sed 's/^/    /' "$ERR" | tail -n 20
	failed=$((failed + 1))
}

# judge RC SLOW_RC MS WHY: the verdict of a check timed from t0 to t1 while
# a slow client ran: both exited 0, and the time is within MS, else WHY
# (which may name $((t1 - t0))).
judge() {
	if [ "$1" -ne 0 ] || [ "$2" -ne 0 ]; then
		fail "gpucmd exec exited $1 (the slow one $2)"
	elif [ -z "$t0" ] || [ -z "$t1" ]; then
		echo "skipped (date has no %N)"
		skipped=$((skipped + 1))
	elif [ $((t1 - t0)) -gt "$3" ]; then
		fail "$4"
	else
		pass
	fi
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

# ---- which GPU ----------------------------------------------------------------
# status names the GPU by UUID and PCI bus id; nvidia-smi must list that
# UUID, and --device by that UUID must open the same GPU.

printf '%-40s ' "the GPU's UUID, as nvidia-smi has it"
tool status >"$OUT" 2>"$ERR"
gpu_line=$(grep '^gpu ' "$OUT")
uuid=$(echo "$gpu_line" | sed -n 's/^gpu *\(GPU-[0-9a-f-]*\),.*/\1/p')
echo "$gpu_line" >"$ERR"
if [ -z "$uuid" ]; then
	fail "status names no UUID: $(cat "$OUT")"
elif ! nvidia-smi -L 2>&1 | grep -qi "$uuid"; then
	nvidia-smi -L >>"$ERR" 2>&1
	fail "nvidia-smi -L does not list $uuid"
else
	pass
fi
printf '%-40s ' "--device by UUID opens that GPU"
if [ -n "$uuid" ] &&
	"$GPUCMDD" --backend cuda --device "$uuid" --probe >"$OUT" 2>"$ERR" &&
	grep -q "^gpu: $uuid, " "$OUT"; then
	pass
else
	cat "$OUT" >>"$ERR"
	fail "gpucmdd --device $uuid --probe"
fi

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
	judge "$rc" $? 400 "another connection's read took $((t1 - t0)) ms meanwhile"
}
spin='kernel spin grid=1 block=32 u32:1000000'
behind "read behind a kernel holds nobody" \
	"$(printf 'empty buf 4096\n%s\nread buf 0 16\n' "$spin")"
hex=$(head -c 65536 /dev/zero | od -An -v -tx1 | tr -d ' \n')
behind "write behind a kernel holds nobody" \
	"$(printf 'empty buf 65536\n%s\nwrite buf 0 hex:%s\nsync\n' "$spin" "$hex")"

# A connection that closes holding device memory: the device thread gives
# its pages back (cuMemFree) while another service's kernel runs.  Should
# cuMemFree wait for the whole device, every service would wait for that
# kernel, and the pages must be freed on a thread of their own.
# A 3 s kernel: a free that waited for it would take seconds, well past
# the 1 s that a loaded machine's process starts may take.
printf '%-40s ' "frees at a close hold nobody"
: >"$ERR"
printf 'kernel spin grid=1 block=32 u32:3000000\nsync\n' |
	tool exec --service slow - >/dev/null 2>>"$ERR" &
slow=$!
sleep 0.2
printf 'empty a 268435456\nempty b 268435456\nsync\n' |
	tool exec --service holder - >/dev/null 2>>"$ERR"
hold_rc=$?
t0=$(now_ms)
printf 'empty x 16\nread x\n' | tool exec --service other - >"$OUT" 2>>"$ERR"
rc=$?
t1=$(now_ms)
wait "$slow"
judge $((rc + hold_rc)) $? 1000 "a read after another connection's close took $((t1 - t0)) ms: cuMemFree waited for the kernel"

# A read's staging (heap memory, pinned for its copy) is unpinned by the
# loop thread once the reply is out (cuMemHostUnregister).  Should that wait
# for the device, the loop, which serves every connection, would stop
# behind another service's kernel: three reads one after the other, each a
# connection of its own, must all be answered while a 3 s kernel runs.
printf '%-40s ' "unpinning staging holds nobody"
: >"$ERR"
printf 'kernel spin grid=1 block=32 u32:3000000\nsync\n' |
	tool exec --service slow - >/dev/null 2>>"$ERR" &
slow=$!
sleep 0.2
t0=$(now_ms)
rc=0
for i in 1 2 3; do
	printf 'empty x 65536\nread x 0 16\n' |
		tool exec --service other - >"$OUT" 2>>"$ERR" || rc=1
done
t1=$(now_ms)
wait "$slow"
judge "$rc" $? 1500 "three reads took $((t1 - t0)) ms: unpinning waited for the kernel"

# A captured write keeps its bytes in the daemon's heap (pageable memory),
# and every replay copies them to the device.  CUDA may refuse a pageable
# copy in a capture, or make it synchronous: the replays must write them.
expect "graph: a captured write replays" "0500000006000000
0500000006000000" <<'EOF'
empty b 8
capture begin
write b 0 hex:0500000006000000
capture end g
kernel fill_u32 grid=1 block=32 b u32:0 u32:2
launch g
read b
kernel fill_u32 grid=1 block=32 b u32:0 u32:2
launch g
read b
EOF

# [daemon] stop_timeout with a kernel running: at the deadline the daemon
# exits 1 without waiting for the device, and the driver tears its context
# down.  A second daemon, so that the main one shows the GPU still serves.
printf '%-40s ' "stop_timeout with a kernel running"
: >"$ERR"
printf '[daemon]\nstop_timeout = 2\n' >"$TMP/stop.conf"
"$GPUCMDD" --config "$TMP/stop.conf" --socket "$TMP/stop.sock" \
	--backend cuda >"$TMP/stop.log" 2>&1 &
stop_pid=$!
i=0
until "$GPUCMD" --socket "$TMP/stop.sock" status >/dev/null 2>&1 ||
	[ $i -ge 300 ]; do
	sleep 0.1
	i=$((i + 1))
done
printf 'kernel spin grid=1 block=32 u32:20000000\nsync\n' |
	"$GPUCMD" --socket "$TMP/stop.sock" exec - >/dev/null 2>&1 &
spinner=$!
sleep 0.5
t0=$(now_ms)
kill -TERM "$stop_pid"
i=0
while kill -0 "$stop_pid" 2>/dev/null && [ $i -lt 300 ]; do
	sleep 0.1
	i=$((i + 1))
done
t1=$(now_ms)
if kill -0 "$stop_pid" 2>/dev/null; then
	kill -KILL "$stop_pid"
	stop_status=hung
fi
wait "$stop_pid"
[ "${stop_status:-}" = hung ] || stop_status=$?
stop_pid=
kill "$spinner" 2>/dev/null
wait "$spinner" 2>/dev/null
sed 's/^/    /' "$TMP/stop.log" >>"$ERR"
if [ "$stop_status" != 1 ]; then
	fail "exit status $stop_status, not 1"
elif ! grep -q 'stop_timeout (2 s) passed' "$TMP/stop.log"; then
	fail "no stop_timeout line in the log"
elif [ -n "$t0" ] && [ -n "$t1" ] && [ $((t1 - t0)) -gt 8000 ]; then
	fail "it exited $((t1 - t0)) ms after SIGTERM: the exit waited for the kernel"
elif ! printf 'empty x 16\nread x\n' | tool exec - >"$OUT" 2>"$ERR"; then
	fail "the main daemon no longer answers"
else
	pass
	[ -n "$t0" ] && [ -n "$t1" ] && echo "    exited $((t1 - t0)) ms after SIGTERM"
fi

# ---- the integration suite on the CUDA backend -------------------------------
# GPU_RUN_SUITES=0 skips the suites and the bench (a quick rerun of the
# checks above and below).

for bin in "$BUILD"/tests/test_*; do
	[ "${GPU_RUN_SUITES:-1}" = 0 ] && break
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
if [ "${GPU_RUN_SUITES:-1}" = 0 ]; then
	echo "skipped: GPU_RUN_SUITES=0"
	skipped=$((skipped + 1))
elif [ ! -x "$BUILD/gpucmd-bench" ]; then
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

# The driver's parameter list (cuFuncGetParamInfo, CUDA 12.4 on) or the
# image's: add_one with one argument, or three, is refused before launch.
printf '%-40s ' "module: wrong argument counts refused"
: >"$ERR"
bad=0
for args in "b" "b u32:2 u32:3"; do
	printf 'module m ptx:file:%s\ncreate b hex:00000000\nkernel m.add_one grid=1 block=32 %s\nsync\n' \
		"$TMP/add_one.ptx" "$args" | tool exec - >"$OUT" 2>>"$ERR" &&
		bad=1
done
if [ "$bad" -ne 0 ] ||
	[ "$(grep -c 'GPUCMD_ELAUNCH.*kernel add_one takes 2 arguments' "$ERR")" -ne 2 ]; then
	fail "add_one with the wrong count was launched, or refused otherwise"
else
	pass
fi

# module_image's parameter lists (what drivers without cuFuncGetParamInfo
# check launches against) beside the driver's, for nvcc's PTX, cubin and
# fatbin of tests/unit/fixtures/params.cu: the daemon's debug log compares
# them at each kernel's first launch (refused here: no arguments).
printf '%-40s ' "module: image parameters = the driver's"
fixtures=$(dirname "$0")/../unit/fixtures
: >"$ERR"
for image in ptx:params.ptx cubin:params.sm_90.cubin fatbin:params.zstd.fatbin; do
	for k in ptrs mixed structs grid_const large _Z7mangledPi6float24int4; do
		printf 'module m %s:file:%s/%s\nkernel m.%s grid=1 block=1\n' \
			"${image%%:*}" "$fixtures" "${image#*:}" "$k" |
			tool exec - >/dev/null 2>>"$ERR"
	done
done
names='kernel (ptrs|mixed|structs|grid_const|large|_Z7mangledPi6float24int4): the module image'
agree=$(grep -cE "$names.*they agree" "$LOG")
if grep -E "$names.*they disagree" "$LOG" >>"$ERR"; then
	fail "the image and the driver disagree"
elif [ "$agree" -eq 0 ]; then
	echo "skipped: the driver described none (no cuFuncGetParamInfo?)"
	skipped=$((skipped + 1))
else
	pass
	echo "    $agree kernels compared (PTX, cubin, fatbin)"
fi

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
