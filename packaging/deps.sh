#!/bin/sh
# deps.sh - install the Debian packages gpucmd needs to build and test.
#
# Run as root it installs what is missing with apt-get; run as anyone else it
# prints the exact command to run.  `make run` and `make check` call it first,
# so a fresh Debian 12 machine needs nothing else.  Exit 0 when everything is
# there (or was installed), 1 when something is still missing.
set -u

# package:probe  (probe is a file the package provides)
need="
build-essential:/usr/bin/cc
make:/usr/bin/make
pkg-config:/usr/bin/pkg-config
libuv1-dev:/usr/include/uv.h
libprotobuf-c-dev:/usr/include/protobuf-c/protobuf-c.h
protobuf-c-compiler:/usr/bin/protoc-c
libsystemd-dev:/usr/include/systemd/sd-daemon.h
libinih-dev:/usr/include/ini.h
libzstd-dev:/usr/include/zstd.h
check:/usr/include/check.h
"

missing=""
for entry in $need; do
	pkg=${entry%%:*}
	probe=${entry#*:}
	[ -e "$probe" ] || missing="$missing $pkg"
done

[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "gpucmd needs these Debian packages:$missing" >&2
	echo "install them with:  sudo apt-get install -y$missing" >&2
	exit 1
fi

echo "deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q $missing >/dev/null 2>&1; then
	apt-get update -q >/dev/null 2>&1 || true
	apt-get install -y -q $missing || {
		echo "deps.sh: apt-get could not install:$missing" >&2
		exit 1
	}
fi
exit 0
