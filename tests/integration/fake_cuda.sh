#!/bin/sh
# fake_cuda.sh - the CUDA backend (daemon/driver/cuda.c) against the fake
# driver of tests/fakecuda: `gpucmdd --backend cuda` with LD_LIBRARY_PATH at
# $BUILD/fakecuda, so that machines without a GPU run cuda.c's control flow
# (init, properties, primary context, pinned memory, copies, streams and
# completion callbacks, events, capture and graphs, modules, launches).
#
# It starts its own daemon on a private socket and checks answers known to
# the bit; then it runs exec_cli.sh, region_cli.sh and report_cli.sh, and
# the Check binaries that pass on the fake (FAKE_CUDA_BINARIES below), with
# GPUCMD_TEST_BACKEND=cuda; then launches on the fake built as a driver
# without cuFuncGetParamInfo; last, a fault, which ends the daemon.  Exit 77
# when the fake or the daemon's CUDA backend is missing (make CUDA=no).
#
# What the fake does not do (tests/fakecuda/libcuda.c): run real kernels
# (only the built-ins and add_one are interpreted), compile CUDA C (NVRTC
# is not faked: such loads fail as on a machine without it), or take time.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
FAKE=$BUILD/fakecuda
[ -f "$FAKE/libcuda.so.1" ] ||
	skip "$FAKE/libcuda.so.1 is missing (make fakecuda)"
lib_init fakecuda
# The fake, and nothing else, is the driver for everything started here.
LD_LIBRARY_PATH=$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
if ! "$BUILD/gpucmdd" --backend cuda --probe >"$dir/probe" 2>&1; then
	grep -q "without the CUDA backend" "$dir/probe" &&
		skip "$(tail -n 1 "$dir/probe")"
	fail "gpucmdd --backend cuda --probe on the fake: $(cat "$dir/probe")"
fi

# Pinned pool off, as tests/gpu/run.sh does: read staging then comes from
# the heap and is registered per read (cuMemHostRegister/Unregister).
cat >"$dir/gpucmdd.conf" <<'CONF'
[daemon]
pinned_memory = 0
[service capped]
memory_limit = 64M
CONF
GPUCMD_TEST_BACKEND=cuda
start_daemon --config "$dir/gpucmdd.conf" --log-level debug
g() { timeout 60 "$BUILD/gpucmd" --socket "$sock" "$@"; }

# expect NAME WANT: the exec script on stdin must print exactly WANT.
expect() {
	out=$(g exec - 2>"$dir/err") ||
		fail "$1: exec exited $?: $(cat "$dir/err")"
	[ "$out" = "$2" ] || fail "$1: got '$out', want '$2'"
}

# ---- the device, as the backend reports it ----------------------------------

out=$(g status) || fail "status exited $?"
case "$out" in
*"gpucmd fake CUDA device, cuda backend, 8.0 GiB"*) ;;
*) fail "status does not show the fake CUDA device: $out" ;;
esac
out=$(g memory-report) || fail "memory-report exited $?"
case "$out" in
*"cuda backend, 8.0 GiB total"*) ;;
*) fail "memory-report: $out" ;;
esac

# Which GPU: the UUID and PCI bus id, as nvidia-smi prints them, in status
# (text and JSON), the memory report and the start line.
uuid0=GPU-facec0da-0000-0000-0000-000000000000
out=$(g status) || fail "status exited $?"
case "$out" in
*"gpu          $uuid0, PCI 0000:3b:00.0"*) ;;
*) fail "status does not show the GPU's UUID and PCI bus id: $out" ;;
esac
out=$(g status --json) || fail "status --json exited $?"
case "$out" in
*"\"device_uuid\":\"$uuid0\",\"device_pci_bus_id\":\"0000:3b:00.0\""*) ;;
*) fail "status --json: $out" ;;
esac
out=$(g memory-report --json) || fail "memory-report --json exited $?"
case "$out" in
*"\"uuid\":\"$uuid0\",\"pci_bus_id\":\"0000:3b:00.0\""*) ;;
*) fail "memory-report --json: $out" ;;
esac
out=$(g memory-report --prometheus) || fail "memory-report --prometheus exited $?"
case "$out" in
*"gpucmd_device_memory_bytes{device=\"gpucmd fake CUDA device\",backend=\"cuda\",uuid=\"$uuid0\"} 8589934592"*) ;;
*) fail "memory-report --prometheus: $out" ;;
esac
grep -qF "serving gpucmd fake CUDA device ($uuid0, PCI 0000:3b:00.0; cuda backend" "$dir/log" ||
	fail "the start line does not name the GPU: $(grep serving "$dir/log")"

# --device by UUID, by a prefix only one UUID has, or by PCI bus id, among
# three fake GPUs; a prefix of several, or an id of none, is refused with
# the devices there are; what is no id at all is a usage error (2).
probe() {
	FAKECUDA_DEVICES=3 "$BUILD/gpucmdd" --backend cuda --probe "$@" 2>&1
}
for dev in GPU-facec0da-0000-0000-0000-000000000002 \
	gpu-FACEC0DA-0000-0000-0000-000000000002 \
	GPU-facec0da-0000-0000-0000-0000000000 0000:3d:00.0 3d:00.0 \
	00000000:3D:00.0; do
	case "$dev" in
	GPU-facec0da-0000-0000-0000-0000000000) want=0 ;; # 3 match: refused
	*) want=1 ;;
	esac
	out=$(probe --device "$dev")
	rc=$?
	if [ $want -eq 1 ]; then
		[ $rc -eq 0 ] || fail "--device $dev: exit $rc: $out"
		case "$out" in
		*"gpu: GPU-facec0da-0000-0000-0000-000000000002, PCI 0000:3d:00.0"*) ;;
		*) fail "--device $dev opened another GPU: $out" ;;
		esac
	else
		[ $rc -eq 1 ] || fail "--device $dev (ambiguous): exit $rc: $out"
		case "$out" in
		*"$dev is the start of 3 devices' UUIDs: give more of it; the devices this daemon sees are 0 $uuid0 0000:3b:00.0, 1 GPU-facec0da-0000-0000-0000-000000000001 0000:3c:00.0, 2 "*) ;;
		*) fail "--device $dev (ambiguous): $out" ;;
		esac
	fi
done
for dev in GPU-0bad 0000:7f:00.0; do
	out=$(probe --device "$dev")
	rc=$?
	[ $rc -eq 1 ] || fail "--device $dev (none): exit $rc: $out"
	case "$out" in
	*"no CUDA device is $dev; the devices this daemon sees are 0 $uuid0 0000:3b:00.0,"*) ;;
	*) fail "--device $dev (none): $out" ;;
	esac
done
for dev in GPU-xyz 3d-00 ""; do
	out=$(probe --device "$dev")
	rc=$?
	[ $rc -eq 2 ] || fail "--device '$dev' (no id): exit $rc: $out"
	case "$out" in
	*"bad --device '$dev'"*) ;;
	*) fail "--device '$dev' (no id): $out" ;;
	esac
done
# --backend auto falls back to the host backend when CUDA has no device;
# one named by UUID or bus id that no GPU is does not, as an index past
# the last does not: the operator chose a GPU, and would get the CPU.
for dev in GPU-0bad 0000:7f:00.0; do
	out=$(FAKECUDA_DEVICES=3 "$BUILD/gpucmdd" --backend auto --probe \
		--device "$dev" 2>&1)
	rc=$?
	[ $rc -eq 1 ] || fail "--backend auto --device $dev (none): exit $rc: $out"
	case "$out" in
	*"device $dev names a GPU, and no CUDA device is it (no CUDA device is $dev; the devices this daemon sees are 0 $uuid0 0000:3b:00.0,"*"the host backend serves none"*) ;;
	*) fail "--backend auto --device $dev (none): $out" ;;
	esac
done
# A MIG instance: refused with how to choose one (CUDA_VISIBLE_DEVICES).
out=$(probe --device MIG-8a2f3b1c-4d5e)
rc=$?
[ $rc -eq 2 ] || fail "--device MIG-... : exit $rc: $out"
case "$out" in
*"start gpucmdd with CUDA_VISIBLE_DEVICES=MIG-8a2f3b1c-4d5e in its environment"*) ;;
*) fail "--device MIG-...: $out" ;;
esac
printf '[daemon]\ndevice = GPU-facec0da-0000-0000-0000-000000000001\n' \
	>"$dir/by-uuid.conf"
out=$(probe -c "$dir/by-uuid.conf")
case "$out" in
*"gpu: GPU-facec0da-0000-0000-0000-000000000001, PCI 0000:3c:00.0"*) ;;
*) fail "device = GPU-... in the config: $out" ;;
esac
printf '[daemon]\ndevice = GPU-nope\n' >"$dir/bad-id.conf"
out=$("$BUILD/gpucmdd" --check-config -c "$dir/bad-id.conf" 2>&1) &&
	fail "--check-config took device = GPU-nope: $out"
case "$out" in
*"device = GPU-nope: expected an index from 0 to 1024, a GPU UUID"*) ;;
*) fail "device = GPU-nope: $out" ;;
esac

# ---- copies ---------------------------------------------------------------

expect "empty, write, read" "0000aabbccdd0000" <<'EOF'
empty a 8
write a 2 hex:aabbccdd
read a
EOF

expect "create, read at an offset" "33445566" <<'EOF'
create b hex:0011223344556677
read b 3 4
EOF

# A pitched write and read (cuMemcpy2DAsync both ways): rows of 2 u32 at a
# pitch of 4 elements.
expect "2D write and read" \
	"$(printf '%s\n' 010000000200000003000000040000000500000006000000 \
		0300000004000000)" <<'EOF'
empty m 48
write m shape=3,2 strides=4,1 elem=4 hex:010000000200000003000000040000000500000006000000
read m shape=3,2 strides=4,1 elem=4
read m 16 8
EOF

# ---- built-in kernels -----------------------------------------------------

expect "fill_u32, read back" "efbeaddeefbeaddeefbeaddeefbeadde" <<'EOF'
empty buf 16
kernel fill_u32 grid=1 block=64 buf u32:3735928559 u32:4
sync
read buf
EOF

expect "copy, add_f32, scale_f32" \
	"$(printf '%s\n' 0011223344 0000c03f0000c03f)" <<'EOF'
create src hex:0011223344
empty dst 5
kernel copy grid=1 block=32 dst src u64:5
read dst
empty a 400
empty b 400
empty o 400
kernel fill_u32 grid=1 block=64 a u32:1065353216 u32:100
kernel fill_u32 grid=1 block=64 b u32:1073741824 u32:100
kernel add_f32 grid=1 block=64 o a b u32:100
kernel scale_f32 grid=1 block=64 o f32:0.5 u32:100
read o 392 8
EOF

# Work on two streams, the second reading what the first wrote: the daemon
# orders it with cuEventRecord / cuStreamWaitEvent behind a 100 ms kernel.
expect "cross-stream order" "07000000" <<'EOF'
empty x 4
kernel spin grid=1 block=1 u32:100000
kernel fill_u32 grid=1 block=1 x u32:7 u32:1
stream 1
read x
EOF

# A connection that closes with device memory: its pages go back through
# cuMemFree, which waits for the whole device (fakecuda's as CUDA's), so it
# runs off the device thread.  On it, the close held every other service
# until a third one's kernel ended (here, another's read took 5 s).
printf 'kernel spin grid=1 block=1 u32:5000000\nsync\n' |
	g exec --service slow - >/dev/null 2>"$dir/slow.err" &
slow=$!
sleep 0.3
printf 'empty a 16777216\nempty b 16777216\nsync\n' |
	g exec --service holder - >/dev/null 2>"$dir/err" ||
	fail "holder: $(cat "$dir/err")"
t0=$(date +%s%N)
out=$(printf 'empty x 4\nread x\n' | g exec --service other - 2>"$dir/err") ||
	fail "a read after a close: $(cat "$dir/err")"
t1=$(date +%s%N)
wait "$slow" || fail "the 5 s spin: $(cat "$dir/slow.err")"
[ $(((t1 - t0) / 1000000)) -lt 2500 ] ||
	fail "a read after another connection's close took $(((t1 - t0) / 1000000)) ms: the frees waited for a 5 s kernel"

# ---- capture and graphs -----------------------------------------------------

expect "capture, launch twice" "$(printf '%s\n' 0a0000000a000000 0b0000000b000000)" <<'EOF'
empty m 8
capture begin
kernel fill_u32 grid=1 block=64 m u32:10 u32:2
capture end g
launch g
read m
kernel fill_u32 grid=1 block=64 m u32:11 u32:2
read m
launch g
destroy g
EOF

# ---- modules --------------------------------------------------------------

cat >"$dir/add_one.ptx" <<'PTX'
.version 7.0
.target sm_75
.address_size 64
.visible .entry add_one(
	.param .u64 add_one_param_0,
	.param .u32 add_one_param_1
)
{
	ret;
}
PTX
expect "a user's PTX module" "0100000002000000" <<EOF
module m ptx:file:$dir/add_one.ptx
create b hex:0000000001000000
kernel m.add_one grid=1 block=32 b u32:2
read b
EOF
err=$(printf 'module m ptx:file:%s\nkernel m.nope grid=1 block=1\n' \
	"$dir/add_one.ptx" | g exec - 2>&1 >/dev/null)
case "$err" in
*GPUCMD_ENOKERNEL*'no kernel named "nope"'*) ;;
*) fail "a missing kernel: '$err'" ;;
esac
# The driver reads as many arguments as the kernel takes, each as wide as
# its parameter: one too few, too many or too wide is refused (through
# cuFuncGetParamInfo), where the driver would read past the daemon's array
# and the kernel fault for every client.
# add_one given one argument, three, or a u64 for its u32, refused with
# the numbers ($1 says which way the daemon knew them).
bad_add_one_refused() {
	for args in "b" "b u32:2 u32:3" "b u64:2"; do
		err=$(printf 'module m ptx:file:%s\ncreate b hex:00000000\nkernel m.add_one grid=1 block=32 %s\nsync\n' \
			"$dir/add_one.ptx" "$args" | g exec - 2>&1 >/dev/null) &&
			fail "add_one with arguments '$args' was launched ($1)"
		case "$err" in
		*GPUCMD_ELAUNCH*"kernel add_one takes 2 arguments, not 1"*) ;;
		*GPUCMD_ELAUNCH*"kernel add_one takes 2 arguments, not 3"*) ;;
		*GPUCMD_ELAUNCH*"argument 1 of kernel add_one is a value of 8 bytes, but the kernel's parameter 1 takes 4"*) ;;
		*) fail "add_one with arguments '$args' ($1): '$err'" ;;
		esac
	done
}
bad_add_one_refused "cuFuncGetParamInfo"
expect "served after refused launches" "07000000" <<'EOF'
create b hex:00000000
kernel fill_u32 grid=1 block=1 b u32:7 u32:1
read b
EOF
# Where the driver describes a kernel, it wins over what the image declares:
# this add_one's PTX lists a third parameter the fake's kernel (the code
# that runs) does not take.
sed 's/add_one_param_1$/add_one_param_1,\n\t.param .u32 add_one_param_2/' \
	"$dir/add_one.ptx" >"$dir/add_one3.ptx"
grep -q add_one_param_2 "$dir/add_one3.ptx" ||
	fail "add_one3.ptx: $(cat "$dir/add_one3.ptx")"
expect "the driver's parameters over the image's" "0100000002000000" <<EOF
module m ptx:file:$dir/add_one3.ptx
create b hex:0000000001000000
kernel m.add_one grid=1 block=32 b u32:2
read b
EOF
# Both answers go to the debug log, for tests/gpu/run.sh to compare on a
# driver that gives them: the plain add_one's agree, this one's do not.
grep -q 'kernel add_one: the module image declares 2 parameters, the driver 2: they agree' "$dir/log" ||
	fail "no agreeing comparison in the log: $(grep 'module image declares' "$dir/log")"
grep -q 'kernel add_one: the module image declares 3 parameters, the driver 2: they disagree' "$dir/log" ||
	fail "no disagreeing comparison in the log: $(grep 'module image declares' "$dir/log")"

# ---- module globals and the quota ---------------------------------------------

# A module's __device__ globals take device memory while it is loaded: the
# report counts them (services --json module_bytes, a memory-report line)
# and so does the service's memory_limit (gpucmdd.conf(5)).
cat >"$dir/globals.ptx" <<'PTX'
.version 7.0
.target sm_75
.address_size 64
.global .align 4 .b8 table[8388608];
.visible .entry touch(
	.param .u64 touch_param_0
)
{
	ret;
}
PTX
# wait_services PATTERN WHAT: until services --json matches (10 s at most).
wait_services() {
	i=0
	until g services --json 2>/dev/null | grep -q "$1"; do
		i=$((i + 1))
		[ $i -gt 1000 ] && fail "$2: $(g services --json)"
		sleep 0.01
	done
}
printf 'module t ptx:file:%s\nkernel spin grid=1 block=1 u32:5000000\nsync\n' \
	"$dir/globals.ptx" | g --service capped exec - >/dev/null 2>&1 &
holder=$!
wait_services '"name":"capped".*"module_bytes":8388608}' \
	"services --json never showed capped's 8 MiB of module globals"
out=$(g memory-report --bytes) || fail "memory-report exited $?"
case "$out" in
*"globals of loaded modules"*"capped: 1 module, 8388608"*) ;;
*) fail "memory-report does not show the module's globals: $out" ;;
esac
wait "$holder" || fail "the exec holding the module exited $?"
# Beside 60 MiB of live buffers the 8 MiB of globals do not fit 64M.
err=$(printf 'empty a 60M\nmodule t ptx:file:%s\n' "$dir/globals.ptx" |
	g --service capped exec - 2>&1 >/dev/null)
case "$err" in
*GPUCMD_EQUOTA*"global variables take 8388608 bytes"*) ;;
*) fail "a module whose globals exceed the quota: '$err'" ;;
esac
# And with a module's 8 MiB held, 60 MiB more does not fit either (once
# the last exec's buffer, freed as its connection closed, is back).
wait_services '"name":"capped","id":[0-9]*,"connections":0,"bytes_in_use":0,' \
	"capped's buffers never came back"
err=$(printf 'module t ptx:file:%s\nempty a 60M\n' "$dir/globals.ptx" |
	g --service capped exec - 2>&1 >/dev/null)
case "$err" in
*GPUCMD_EQUOTA*"globals of its loaded modules 8388608"*) ;;
*) fail "an allocation beside a module's globals: '$err'" ;;
esac
# Nor when the stream could serve it from its own releases behind a kernel
# (96 MiB of them, over twice the limit with it): the reuse of busy memory
# answered at once and never looked at the globals, so 60 MiB live and
# 8 MiB of globals held 68 MiB under a 64M quota.
wait_services '"name":"capped","id":[0-9]*,"connections":0,"bytes_in_use":0,' \
	"capped's buffers never came back"
err=$(g --service capped exec - 2>&1 >/dev/null <<EOF
module t ptx:file:$dir/globals.ptx
empty a1 56M
kernel spin grid=1 block=1 u32:2000000
release a1
empty a2 40M
release a2
submit
empty c 60M
EOF
)
case "$err" in
*GPUCMD_EQUOTA*"globals of its loaded modules 8388608"*) ;;
*) fail "60 MiB from busy releases beside 8 MiB of globals: '$err'" ;;
esac

# ---- regions --------------------------------------------------------------

# A shared region is registered with cuMemHostRegister and copied from and
# into directly.
out=$(g exec <<'EOF'
region R 64K hex:00112233445566778899aabbccddeeff
empty a 16
write a 2 region:R:4:8
read a 2 8 region:R:1000
read a
EOF
) || fail "region exec exited $?"
case "$out" in
"a: 8 bytes -> region R at 1000
0000445566778899aabb000000000000") ;;
*) fail "region round trip: $out" ;;
esac

# The fake complains on stderr (the daemon's log) about calls the driver
# forbids: from a stream callback, or on a thread with no current context.
grep 'fakecuda:' "$dir/log" && fail "the backend made calls the driver refuses"

# ---- the shell tests and Check binaries on the cuda backend ------------------

kill "$pid"
wait "$pid" 2>/dev/null
pid=
for t in exec_cli region_cli report_cli; do
	GPUCMD_TEST_BACKEND=cuda sh "tests/integration/$t.sh" >"$dir/out" 2>&1 ||
		{ cat "$dir/out" >"$dir/log"; fail "$t.sh on the fake CUDA backend"; }
done
# BINARY or BINARY:TCASE (CK_RUN_CASE).  Left out, as they assume the host
# backend: test_services (page sizes from host_memory, a throughput floor
# that the fake on two cores misses), test_region_api (a fault that the
# daemon survives; on CUDA it exits), and test_modules' compile case (it
# expects the driver to refuse PTX that the fake loads).
for t in ${FAKE_CUDA_BINARIES:-test_basic test_ops test_regions test_clients \
	test_hostile test_hostile2 test_fake_daemon test_modules:quota \
	test_modules:globals test_services:faults test_shared}; do
	bin=$BUILD/tests/${t%%:*}
	[ -x "$bin" ] || continue
	if [ "$t" != "${t%%:*}" ]; then
		CK_RUN_CASE=${t#*:} GPUCMD_TEST_BACKEND=cuda "$bin" >"$dir/out" 2>&1
	else
		GPUCMD_TEST_BACKEND=cuda "$bin" >"$dir/out" 2>&1
	fi || { cat "$dir/out" >"$dir/log"; fail "$t on the fake CUDA backend"; }
done

# ---- a region the driver cannot pin ----------------------------------------
# On CUDA a region is pinned at attach; when the driver cannot pin it
# (FAKECUDA_REGISTER_MAX_MB), the attach is GPUCMD_ENOMEM and gpucmd exec
# moves the transfers inline, where they fit a frame, and otherwise names
# the memory to free.
rm -f "$sock"
FAKECUDA_REGISTER_MAX_MB=1 "$BUILD/gpucmdd" --socket "$sock" --backend cuda \
	--max-frame-bytes 8M >"$dir/log" 2>&1 &
pid=$!
wait_socket "$sock"
head -c $((3 * 1024 * 1024 + 5)) /dev/urandom >"$dir/pin_in" ||
	fail "cannot make the input file"
printf 'empty p %s\nwrite p file:%s\nread p file:%s\n' \
	$((3 * 1024 * 1024 + 5)) "$dir/pin_in" "$dir/pin_out" |
	g exec - >"$dir/out" 2>&1 ||
	fail "exec with an unpinnable scratch region: $(cat "$dir/out")"
cmp "$dir/pin_in" "$dir/pin_out" ||
	fail "the bytes that went inline came back different"
head -c $((12 * 1024 * 1024)) /dev/zero >"$dir/pin_big"
printf 'empty q 12M\nwrite q file:%s\n' "$dir/pin_big" |
	g exec - >"$dir/out" 2>&1 &&
	fail "12 MiB through an 8 MiB frame succeeded"
grep -q "GPUCMD_ENOMEM" "$dir/out" && grep -q "pinned memory" "$dir/out" ||
	fail "the refusal of 12 MiB does not name the memory: $(cat "$dir/out")"
kill "$pid"
wait "$pid" 2>/dev/null
pid=

# ---- a driver older than CUDA 12.4 --------------------------------------------
# It has no cuFuncGetParamInfo (Debian bookworm's 535 is CUDA 12.2): the
# backend checks a launch against the parameters the module image declares
# (module_image.h), a PTX .entry list, a cubin's KPARAM records, a fatbin's
# entries.  Unchecked, add_one given one argument makes the driver (here the
# fake, in the daemon) read kernelParams[1] past the daemon's array.
OLD=$BUILD/fakecuda/cuda-12.2
[ -f "$OLD/libcuda.so.1" ] ||
	fail "$OLD/libcuda.so.1 is missing (make fakecuda)"
rm -f "$sock"
LD_LIBRARY_PATH=$OLD:$LD_LIBRARY_PATH "$BUILD/gpucmdd" --socket "$sock" \
	--backend cuda >"$dir/log" 2>&1 &
pid=$!
wait_socket "$sock"
bad_add_one_refused "no cuFuncGetParamInfo: the PTX's list"
expect "add_one checked by its PTX" "0100000002000000" <<EOF
module m ptx:file:$dir/add_one.ptx
create b hex:0000000001000000
kernel m.add_one grid=1 block=32 b u32:2
read b
EOF
# nvcc's own output (tests/unit/fixtures/params.cu): ptrs(int *, const
# float *, unsigned) and mixed(char, short, int, long long, float, double,
# __half, bool, int *), whose fourth parameter takes 8 bytes.
fx=$(dirname "$0")/../unit/fixtures
for img in "cubin:file:$fx/params.sm_90.cubin" \
	"fatbin:file:$fx/params.zstd.fatbin"; do
	for bad in "ptrs b" \
		"mixed u32:1 u32:2 u32:3 u32:4 f32:1 u64:0 u32:0 u32:1 b"; do
		err=$(printf 'module m %s\nempty b 16\nkernel m.%s grid=1 block=1 %s\nsync\n' \
			"$img" "${bad%% *}" "${bad#* }" | g exec - 2>&1 >/dev/null) &&
			fail "$img: '$bad' was launched"
		case "$err" in
		*GPUCMD_ELAUNCH*"kernel ptrs takes 3 arguments, not 1"*) ;;
		*GPUCMD_ELAUNCH*"argument 3 of kernel mixed is a value of 4 bytes, but the kernel's parameter 3 takes 8"*) ;;
		*) fail "$img: '$bad': '$err'" ;;
		esac
	done
	expect "$img, launched as declared" "00000000" <<EOF
module m $img
create b hex:00000000
kernel m.ptrs grid=1 block=1 b b u32:1
kernel m.mixed grid=1 block=1 u32:1 u32:2 u32:3 u64:4 f32:1 u64:0 u32:0 u32:1 b
read b
EOF
done
# A list the scanner cannot read leaves the kernel unchecked, as before:
# never a refusal the driver would not make.
cat >"$dir/opaque.ptx" <<'PTX'
.version 7.0
.target sm_75
.address_size 64
.visible .entry opaque(
	.param .texref t,
	.param .u32 n
)
{
	ret;
}
PTX
expect "a kernel whose parameters cannot be read" "00000000" <<EOF
module m ptx:file:$dir/opaque.ptx
create b hex:00000000
kernel m.opaque grid=1 block=1 u32:1
read b
EOF
# Unchecked, a launch with too few arguments gets zeros past them, never
# what the slots of the daemon's array last held: here, the u32:1 of the
# launch before it, which would have added one more.
cat >"$dir/opaque_add_one.ptx" <<'PTX'
.version 7.0
.target sm_75
.address_size 64
.visible .entry add_one(
	.param .texref p,
	.param .u32 n
)
{
	ret;
}
PTX
expect "an unchecked kernel given too few arguments reads zeros" "01000000" <<EOF
module m ptx:file:$dir/opaque_add_one.ptx
create b hex:00000000
kernel m.add_one grid=1 block=1 b u32:1
kernel m.add_one grid=1 block=1 b
read b
EOF
grep 'fakecuda:' "$dir/log" && fail "the backend made calls the driver refuses"
kill "$pid"
wait "$pid" 2>/dev/null
pid=

# ---- last: a fault ends the daemon -------------------------------------------
# On CUDA a fault is sticky: the batch gets GPUCMD_ESTREAM and the daemon
# exits 1 so that systemd restarts it with a fresh context.  Twice: with
# the kernel faulting on the fake's stream thread (usually after the daemon
# enqueued the batch's completion), and with FAKECUDA_FAULT_AT_LAUNCH, as
# if it faulted at once, so that the completion itself is refused with the
# fault's code (what a fast fault on a GPU does; under TSan the first way
# did it too, and the batch got GPUCMD_EDRIVER).  And once with an
# uncorrectable NVLink error (220), which cuda.h does not call sticky but
# the daemon takes as such.
for mode in "" FAKECUDA_FAULT_AT_LAUNCH=1 \
	"FAKECUDA_FAULT_AT_LAUNCH=1 FAKECUDA_FAULT_CODE=220"; do
	rm -f "$sock"
	env $mode "$BUILD/gpucmdd" --socket "$sock" --backend cuda \
		>"$dir/log" 2>&1 &
	pid=$!
	wait_socket "$sock"
	# A bystander: another service's connection is told why it ends.
	g --service bystander ping -c 1000000000 >/dev/null \
		2>"$dir/bystander.err" &
	bpid=$!
	wait_service bystander
	out=$(printf 'kernel fault grid=1 block=1\nsync\n' |
		g exec --json - 2>&1) &&
		fail "the faulting script succeeded ($mode)"
	# Never "the stream stays usable": the daemon is going away.
	case "$out" in
	*"stays usable"*) fail "fault answered '$out' ($mode)" ;;
	*GPUCMD_ESTREAM*"lost for every client"*) ;;
	*GPUCMD_ESTREAM*"loses the device for every client"*) ;;
	*) fail "fault answered '$out' ($mode)" ;;
	esac
	wait_exit "the daemon, after a fault ($mode),"
	[ "$status" -eq 1 ] ||
		fail "the daemon exited $status after a fault, not 1 ($mode)"
	grep -q 'device is lost' "$dir/log" ||
		fail "no log line about the lost device ($mode)"
	wait "$bpid"
	grep -q "faulted.*lost for every client; gpucmdd stops and restarts with a fresh device context: connect again" \
		"$dir/bystander.err" ||
		fail "the bystander was not told why ($mode): $(cat "$dir/bystander.err")"
	# Whole: the sentence is longer than 255 bytes.
	grep -q "(libgpucmd(3), examples/reconnect.c)$" "$dir/bystander.err" ||
		fail "the bystander's sentence was cut ($mode): $(cat "$dir/bystander.err")"
done
exit 0
