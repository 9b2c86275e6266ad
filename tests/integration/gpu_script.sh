#!/bin/sh
# gpu_script.sh - tests/gpu/run.sh, the script a machine with a GPU runs,
# here on the fake driver (tests/fakecuda) with a stand-in for nvidia-smi,
# its suites and bench skipped (GPU_RUN_SUITES=0; fake_cuda.sh runs those
# on the fake).  GPUs are lent rarely and briefly: the script must work the
# first time, so every check of it runs here too, but for the comparison of
# kernel parameters, which needs the real driver's.  Exit 77 when the fake
# or the daemon's CUDA backend is missing.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
FAKE=$BUILD/fakecuda
[ -f "$FAKE/libcuda.so.1" ] ||
	skip "$FAKE/libcuda.so.1 is missing (make fakecuda)"
lib_init gpuscript
mkdir -p "$dir/bin"
printf '#!/bin/sh\necho "GPU 0: gpucmd fake CUDA device (UUID: GPU-facec0da-0000-0000-0000-000000000000)"\n' \
	>"$dir/bin/nvidia-smi"
chmod +x "$dir/bin/nvidia-smi"
PATH=$dir/bin:$PATH LD_LIBRARY_PATH=$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
	GPU_RUN_SUITES=0 BUILD=$BUILD TMPDIR=$dir \
	sh "$(dirname "$0")/../gpu/run.sh" >"$dir/out" 2>&1
rc=$?
[ $rc -eq 77 ] && skip "$(tail -n 1 "$dir/out")"
[ $rc -eq 0 ] || fail "tests/gpu/run.sh exited $rc on the fake: $(grep -A8 FAILED "$dir/out" | head -n 40)"
grep -q '^[0-9]* passed, 0 failed, 2 skipped$' "$dir/out" ||
	fail "tests/gpu/run.sh on the fake: $(tail -n 1 "$dir/out"), not 2 skipped"
echo "gpu_script: $(tail -n 1 "$dir/out")"
