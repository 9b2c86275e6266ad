#!/bin/sh
# systemd_units.sh - the unit files in packaging/systemd, checked with
# systemd's own tools:
#   - `systemd-analyze verify` on gpucmdd.{socket,service}, the templates
#     and an instance (gpucmdd@3) prints nothing: no unknown keys, no bad
#     values, the ExecStart binary exists (a copy of each unit points at
#     $BUILD/gpucmdd), and every Documentation= man page exists (man/ is
#     put on MANPATH);
#   - the settings the design fixes are there (Type=notify, WatchdogSec=,
#     User/Group gpucmd, socket mode 0660 group gpucmd, the socket paths,
#     --device %i, hardening, a reload that checks the file before it
#     signals), and both services share one [Service] section apart from
#     ExecStart; TimeoutStopSec= is above the default [daemon] stop_timeout;
#   - sysusers.d creates the user and group the units name, and tmpfiles.d
#     creates the socket directory with that owner (in a scratch --root);
#   - `systemd-analyze security --offline` rates the service 2.0 or better.
set -u
BUILD=${BUILD:-build}
dir=$(mktemp -d /tmp/gpucmd-units-XXXXXX)
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	rm -rf "$dir"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	[ -f "$dir/out" ] && sed 's/^/    /' "$dir/out"
	exit 1
}
command -v systemd-analyze >/dev/null || {
	echo "systemd-analyze is not installed (Debian package systemd)"
	exit 77
}
[ -x "$BUILD/gpucmdd" ] || fail "$BUILD/gpucmdd is missing: run make first"
src=packaging/systemd
daemon=$(cd "$BUILD" && pwd)/gpucmdd

# ---- systemd-analyze verify ------------------------------------------------
mkdir -p "$dir/units"
for u in gpucmdd.service gpucmdd.socket gpucmdd@.service gpucmdd@.socket; do
	[ -f "$src/$u" ] || fail "$src/$u is missing"
	grep -q '^ExecStart=/usr/sbin/gpucmdd' "$src/$u" ||
		[ "${u##*.}" = socket ] || fail "$u does not run /usr/sbin/gpucmdd"
	sed "s|^\(Exec[A-Za-z]*=\)/usr/sbin/gpucmdd|\1$daemon|" "$src/$u" >"$dir/units/$u"
done
man_opt=""
if command -v man >/dev/null; then
	for m in man/*.[1-8]; do
		mkdir -p "$dir/man/man${m##*.}"
		cp "$m" "$dir/man/man${m##*.}/"
	done
	MANPATH=$dir/man
	export MANPATH
else
	man_opt=--man=no
	echo "note: man is not installed; Documentation= is not checked"
fi
(
	cd "$dir/units" || exit 1
	systemd-analyze verify $man_opt gpucmdd.socket gpucmdd.service \
		gpucmdd@.socket gpucmdd@.service gpucmdd@3.socket gpucmdd@3.service
) >"$dir/out" 2>&1 || fail "systemd-analyze verify failed"
[ -s "$dir/out" ] && fail "systemd-analyze verify complained"

# ---- what the units must say -----------------------------------------------
# has FILE LINE: FILE has exactly that line.
has() {
	grep -qxF "$2" "$src/$1" || fail "$1 lacks '$2'"
}
for u in gpucmdd.service gpucmdd@.service; do
	# shellcheck disable=SC2016 # $MAINPID is systemd's, not ours
	for line in Type=notify WatchdogSec=30 Restart=on-failure User=gpucmd \
		Group=gpucmd RuntimeDirectory=gpucmd NoNewPrivileges=yes \
		ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
		CapabilityBoundingSet= SystemCallFilter=@system-service \
		RestrictAddressFamilies=AF_UNIX LockPersonality=yes \
		MemoryDenyWriteExecute=yes DevicePolicy=closed \
		'DeviceAllow=char-nvidia* rw' \
		'ExecReload=/usr/sbin/gpucmdd --check-config' \
		'ExecReload=/bin/kill -HUP $MAINPID'; do
		has "$u" "$line"
	done
	# A file that does not load fails the reload before the signal goes.
	[ "$(grep '^ExecReload=' "$src/$u" | head -n 1)" = \
		'ExecReload=/usr/sbin/gpucmdd --check-config' ] ||
		fail "$u: the first ExecReload= does not check the file"
	grep -q '^Documentation=man:gpucmdd(8)' "$src/$u" || fail "$u: no man:gpucmdd(8)"
done
for u in gpucmdd.socket gpucmdd@.socket; do
	for line in SocketMode=0660 SocketGroup=gpucmd; do
		has "$u" "$line"
	done
done
has gpucmdd.socket ListenStream=/run/gpucmd/gpucmd.sock
has gpucmdd@.socket ListenStream=/run/gpucmd/gpu%i.sock
has gpucmdd.service ExecStart=/usr/sbin/gpucmdd
has gpucmdd@.service 'ExecStart=/usr/sbin/gpucmdd --backend cuda --device %i --socket /run/gpucmd/gpu%i.sock'
has gpucmdd.service Requires=gpucmdd.socket
has gpucmdd@.service Requires=gpucmdd@%i.socket
# The daemon's own stop deadline ([daemon] stop_timeout) comes before
# systemd's SIGKILL, so that a stop that runs over ends with the line that
# names who held it up: its default (config.h, and the example config that
# shows it) is below TimeoutStopSec= of both services.
stop_default=$(sed -n 's/^#define CONFIG_STOP_TIMEOUT \([0-9][0-9]*\)$/\1/p' daemon/config.h)
[ -n "$stop_default" ] || fail "no CONFIG_STOP_TIMEOUT in daemon/config.h"
grep -qx ";stop_timeout = $stop_default" packaging/gpucmdd.conf.example ||
	fail "the example config does not show stop_timeout = $stop_default"
for u in gpucmdd.service gpucmdd@.service; do
	tss=$(sed -n 's/^TimeoutStopSec=\([0-9][0-9]*\)$/\1/p' "$src/$u")
	[ -n "$tss" ] || fail "$u: no TimeoutStopSec= in whole seconds"
	[ "$stop_default" -lt "$tss" ] ||
		fail "$u: TimeoutStopSec=$tss is not above stop_timeout's default $stop_default"
done
# One hardening block for both: only ExecStart may differ.
sed -n '/^\[Service\]/,/^\[Install\]/p' "$src/gpucmdd.service" | grep -v '^ExecStart=' >"$dir/a"
sed -n '/^\[Service\]/,/^\[Install\]/p' "$src/gpucmdd@.service" | grep -v '^ExecStart=' >"$dir/b"
diff "$dir/a" "$dir/b" >"$dir/out" || fail "the [Service] sections of the two services differ"

# ---- sysusers.d and tmpfiles.d ------------------------------------------------
root=$dir/root
mkdir -p "$root/etc"
if command -v systemd-sysusers >/dev/null; then
	if systemd-sysusers --root="$root" "$PWD/packaging/sysusers/gpucmd.conf" >"$dir/out" 2>&1; then
		grep -q '^gpucmd:' "$root/etc/group" || fail "sysusers.d: no group gpucmd"
		uid=$(awk -F: '$1 == "gpucmd" { print $3 }' "$root/etc/passwd")
		gid=$(awk -F: '$1 == "gpucmd" { print $4 }' "$root/etc/passwd")
		[ -n "$uid" ] || fail "sysusers.d: no user gpucmd"
		[ "$gid" = "$(awk -F: '$1 == "gpucmd" { print $3 }' "$root/etc/group")" ] ||
			fail "sysusers.d: the gpucmd user's group is not gpucmd"
		if command -v systemd-tmpfiles >/dev/null; then
			systemd-tmpfiles --root="$root" --create "$PWD/packaging/tmpfiles/gpucmd.conf" \
				>"$dir/out" 2>&1 || fail "systemd-tmpfiles --create failed"
			[ -d "$root/run/gpucmd" ] || fail "tmpfiles.d did not create /run/gpucmd"
			[ "$(stat -c '%a %u' "$root/run/gpucmd")" = "755 $uid" ] ||
				fail "/run/gpucmd is $(stat -c '%a %u' "$root/run/gpucmd"), expected 755 $uid"
		fi
	elif [ "$(id -u)" -ne 0 ]; then
		echo "note: systemd-sysusers --root needs root here; sysusers.d not checked"
	else
		fail "systemd-sysusers failed"
	fi
fi
grep -q '^d /run/gpucmd ' packaging/tmpfiles/gpucmd.conf ||
	fail "tmpfiles.d does not declare /run/gpucmd, the sockets' directory"

# ---- exposure -----------------------------------------------------------------
if (cd "$dir/units" && systemd-analyze security --offline=true --no-pager \
	gpucmdd.service) >"$dir/out" 2>&1; then
	level=$(sed -n 's/.*Overall exposure level for gpucmdd.service: \([0-9.]*\).*/\1/p' "$dir/out")
	[ -n "$level" ] || fail "no exposure level in systemd-analyze security's output"
	awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' ||
		fail "exposure level $level is worse than 2.0: hardening was lost"
else
	echo "note: this systemd-analyze has no 'security --offline'; exposure not rated"
fi
echo "ok: units verified, settings present, sysusers/tmpfiles consistent"
exit 0
