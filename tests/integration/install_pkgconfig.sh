#!/bin/sh
# install_pkgconfig.sh - `make install PREFIX=/usr DESTDIR=...` puts every
# file where it belongs (binaries, the versioned shared library and its
# links, the static library, the header, gpucmd.pc, units, sysusers.d,
# tmpfiles.d, the example config, bash completion, man pages); a client
# built only with `pkg-config --cflags --libs gpucmd` against that tree
# (PKG_CONFIG_SYSROOT_DIR) links to the installed libgpucmd.so.0, connects
# to a daemon from $BUILD and gets its ping answered; the same client links
# statically with `pkg-config --static`; under PREFIX=/usr/local the units
# run (and check the file on reload with) /usr/local/sbin/gpucmdd;
# `make uninstall` removes every file again.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
CC=${CC:-cc}
lib_init install
root=$dir/root

command -v pkg-config >/dev/null || skip "pkg-config is not installed"
command -v "$CC" >/dev/null || skip "no C compiler ($CC)"
need gpucmdd

# MAKEFLAGS from an enclosing `make check` carries its command-line
# variables (SANITIZER=...), so this install matches $BUILD.
make -s install PREFIX=/usr DESTDIR="$root" BUILD="$BUILD" >"$dir/install.log" 2>&1 ||
	fail "make install failed"

for f in usr/sbin/gpucmdd usr/bin/gpucmd usr/include/gpucmd.h \
	usr/lib/libgpucmd.a usr/lib/libgpucmd.so.0.1.0 usr/lib/pkgconfig/gpucmd.pc \
	usr/lib/systemd/system/gpucmdd.service usr/lib/systemd/system/gpucmdd.socket \
	usr/lib/systemd/system/gpucmdd@.service usr/lib/systemd/system/gpucmdd@.socket \
	usr/lib/sysusers.d/gpucmd.conf usr/lib/tmpfiles.d/gpucmd.conf \
	etc/gpucmd/gpucmdd.conf.example \
	usr/share/bash-completion/completions/gpucmd \
	usr/share/man/man1/gpucmd.1 usr/share/man/man3/libgpucmd.3; do
	[ -f "$root/$f" ] || fail "make install did not install /$f"
done
for m in man/*.[1-8]; do
	s=${m##*.}
	[ -f "$root/usr/share/man/man$s/${m##*/}" ] || fail "man page $m not installed"
done
[ -x "$root/usr/sbin/gpucmdd" ] || fail "/usr/sbin/gpucmdd is not executable"
# The soname chain: libgpucmd.so -> .so.0 -> .so.0.1.0, soname libgpucmd.so.0.
[ "$(readlink "$root/usr/lib/libgpucmd.so")" = libgpucmd.so.0 ] ||
	fail "libgpucmd.so does not point to libgpucmd.so.0"
[ "$(readlink "$root/usr/lib/libgpucmd.so.0")" = libgpucmd.so.0.1.0 ] ||
	fail "libgpucmd.so.0 does not point to libgpucmd.so.0.1.0"
if command -v objdump >/dev/null; then
	objdump -p "$root/usr/lib/libgpucmd.so.0.1.0" | grep -q 'SONAME *libgpucmd\.so\.0$' ||
		fail "the soname of libgpucmd.so.0.1.0 is not libgpucmd.so.0"
fi

PKG_CONFIG_SYSROOT_DIR=$root
PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
export PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
[ "$(pkg-config --modversion gpucmd)" = "$(sed -n 's/^#define GPUCMD_VERSION_STRING "\(.*\)"/\1/p' include/gpucmd.h)" ] ||
	fail "gpucmd.pc version '$(pkg-config --modversion gpucmd)' is not the header's"
cflags=$(pkg-config --cflags gpucmd) || fail "pkg-config --cflags gpucmd failed"
libs=$(pkg-config --libs gpucmd) || fail "pkg-config --libs gpucmd failed"
slibs=$(pkg-config --static --libs gpucmd) || fail "pkg-config --static --libs failed"
case " $cflags " in
*" -I$root/usr/include "*) ;;
*) fail "cflags '$cflags' do not name $root/usr/include" ;;
esac

# A library built with sanitizers needs them in the program too.
san=""
undef=$(nm -D --undefined-only "$root/usr/lib/libgpucmd.so.0" 2>/dev/null)
case $undef in *__asan_*) san="$san,address" ;; esac
case $undef in *__ubsan_*) san="$san,undefined" ;; esac
case $undef in *__tsan_*) san="$san,thread" ;; esac
[ -n "$san" ] && san="-fsanitize=${san#,}"

cat >"$dir/client.c" <<'EOF'
#include <gpucmd.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	struct gpucmd_conn *conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	char msg[256] = "";
	int rc;

	if (argc != 2)
		return 2;
	rc = gpucmd_connect(argv[1], "pkgconfig-test", &conn, msg, sizeof(msg));
	if (rc != 0) {
		fprintf(stderr, "connect: %s: %s\n", gpucmd_errname(rc), msg);
		return 1;
	}
	if (gpucmd_batch_new(conn, 0, &b) != 0 || gpucmd_batch_ping(b) != 0 ||
	    (rc = gpucmd_run(b, &r)) != 0) {
		fprintf(stderr, "ping: %s\n", gpucmd_errname(rc));
		return 1;
	}
	rc = gpucmd_response_error(r);
	printf("pong %s %zu %s %s\n", gpucmd_errname(rc),
	       gpucmd_response_count(r), GPUCMD_VERSION_STRING,
	       gpucmd_info(conn)->service);
	gpucmd_response_free(r);
	gpucmd_close(conn);
	return rc == 0 ? 0 : 1;
}
EOF
# shellcheck disable=SC2086 # word splitting of the flags is intended
"$CC" $san $cflags -o "$dir/client" "$dir/client.c" $libs >"$dir/cc.log" 2>&1 ||
	fail "the client does not build with pkg-config's flags ($cflags $libs)"
# The header declares extern "C" for C++: its types must be nameable there
# as in C (a struct defined inside another is a nested type in C++).
CXX=${CXX:-c++}
if command -v "$CXX" >/dev/null; then
	cat >"$dir/client.cc" <<'EOF'
#include <gpucmd.h>

unsigned long long last_refusal_ms(const struct gpucmd_service_report *s)
{
	const struct gpucmd_refusal *r = &s->last_refusal;

	return r->unix_ms;
}
EOF
	# shellcheck disable=SC2086
	"$CXX" $cflags -fsyntax-only "$dir/client.cc" >"$dir/cxx.log" 2>&1 ||
		fail "the header does not compile as C++: $(cat "$dir/cxx.log")"
fi
# Static: libgpucmd.a and what pkg-config --static adds for it.
slibs_a=$(printf '%s\n' "$slibs" | sed "s|-lgpucmd|$root/usr/lib/libgpucmd.a|")
# shellcheck disable=SC2086
"$CC" $san $cflags -o "$dir/client-static" "$dir/client.c" $slibs_a >"$dir/cc-static.log" 2>&1 ||
	fail "the client does not link statically with pkg-config --static ($slibs_a)"

LD_LIBRARY_PATH=$root/usr/lib
export LD_LIBRARY_PATH
if command -v ldd >/dev/null; then
	ldd "$dir/client" | grep -q "libgpucmd.so.0 => $root/usr/lib/libgpucmd.so.0" ||
		fail "the client does not load the installed library: $(ldd "$dir/client" | grep gpucmd)"
	ldd "$dir/client-static" | grep -q libgpucmd &&
		fail "the static client still needs libgpucmd.so"
fi

# The host backend whatever the run's: --host-memory is the host's.
GPUCMD_TEST_BACKEND=host
start_daemon --host-memory 64M
out=$("$dir/client" "$sock" 2>"$dir/client.log") || fail "client exited $?: $out"
[ "$out" = "pong GPUCMD_OK 1 0.1.0 pkgconfig-test" ] || fail "client printed '$out'"
out=$("$dir/client-static" "$sock" 2>"$dir/client.log") || fail "static client exited $?: $out"
[ "$out" = "pong GPUCMD_OK 1 0.1.0 pkgconfig-test" ] || fail "static client printed '$out'"

# Another prefix: the units run the daemon from there.
make -s install-extra PREFIX=/usr/local DESTDIR="$dir/local" BUILD="$BUILD" \
	>"$dir/install-local.log" 2>&1 || fail "make install-extra PREFIX=/usr/local failed"
grep -qx 'ExecStart=/usr/local/sbin/gpucmdd' "$dir/local/usr/local/lib/systemd/system/gpucmdd.service" ||
	fail "PREFIX=/usr/local: gpucmdd.service does not run /usr/local/sbin/gpucmdd"
grep -qx 'ExecReload=/usr/local/sbin/gpucmdd --check-config' \
	"$dir/local/usr/local/lib/systemd/system/gpucmdd@.service" ||
	fail "PREFIX=/usr/local: gpucmdd@.service does not check the file with /usr/local/sbin/gpucmdd"
grep -qx 'prefix=/usr/local' "$dir/local/usr/local/lib/pkgconfig/gpucmd.pc" ||
	fail "PREFIX=/usr/local: gpucmd.pc has another prefix"

make -s uninstall PREFIX=/usr DESTDIR="$root" BUILD="$BUILD" >"$dir/uninstall.log" 2>&1 ||
	fail "make uninstall failed"
left=$(find "$root" ! -type d)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "ok: installed tree, pkg-config client (shared and static, the header in C++), uninstall"
exit 0
