#!/bin/sh
# builtin_ptx.sh - the CUDA backend is in the daemon, and the built-in
# kernels' PTX kept in the tree (daemon/driver/kernels/builtin.ptx, embedded
# by builds without nvcc, as a distribution's) matches builtin.cu: every
# built-in kernel of the daemon's table is an entry of it, with as many
# parameters as its signature, and, where this build ran nvcc, the same
# entries as nvcc's PTX of builtin.cu (refresh it with `make ptx`).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init ptx
kept=daemon/driver/kernels/builtin.ptx

# The daemon was built with its CUDA backend (no toolkit needed for it):
# it tries the driver, and says what it found.
conf=$dir/empty.conf
: >"$conf"
out=$("$BUILD/gpucmdd" --backend cuda --probe -c "$conf" 2>&1)
case "$out" in
*"built without the CUDA backend"*) fail "gpucmdd has no CUDA backend: $out" ;;
*libcuda* | *"cuda backend"* | *CUDA*) ;;
*) fail "gpucmdd --backend cuda --probe said: $out" ;;
esac

# name and parameter count of each entry of a PTX file
entries() {
	awk '/^\.visible \.entry/ { name = $3; sub(/\(.*/, "", name); n = 0; inside = 1; next }
	     inside && /\.param/ { n++ }
	     inside && /^\)/ { print name, n; inside = 0 }
	     inside && /^\{/ { print name, n; inside = 0 }' "$1" | sort
}
[ -s "$kept" ] || fail "$kept is missing"
got=$(entries "$kept")
# The table: { "name", "signature", ... } in builtin.c
want=$(sed -n 's/^\t{ "\([a-z_0-9]*\)", "\([A-Za-z]*\)",.*/\1 \2/p' daemon/driver/kernels/builtin.c |
	awk '{ print $1, length($2) }' | sort)
[ -n "$want" ] || fail "no built-in kernels found in builtin.c"
[ "$got" = "$want" ] ||
	fail "$kept does not match builtin.c's table (make ptx): got '$got', want '$want'"
if [ -s "$BUILD/kernels/builtin.ptx" ]; then
	fresh=$(entries "$BUILD/kernels/builtin.ptx")
	[ "$fresh" = "$got" ] ||
		fail "$kept is older than builtin.cu (make ptx): '$got' against nvcc's '$fresh'"
fi
exit 0
