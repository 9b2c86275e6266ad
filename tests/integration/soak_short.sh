#!/bin/sh
# soak_short.sh - a 20 s soak of the daemon (tests/soak/soak.c): mixed load
# from 4 client processes in four services with quotas (regions, graphs,
# modules, shared buffers, detached batches, helpers killed mid-batch among
# the work), every result verified,
# daemon RSS and open descriptors not growing.  The soak binary is built by
# `make soak` (tests/fuzz/fuzz.mk); without it this test is skipped.
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/soak" ]; then
	echo "skipped: $BUILD/soak is not built (make soak)"
	exit 77
fi
if [ ! -x "$BUILD/gpucmdd" ]; then
	echo "skipped: $BUILD/gpucmdd is not built"
	exit 77
fi
# Under a sanitizer the allocator holds freed memory in quarantine and its
# shadow grows with it: RSS says nothing about leaks there (LeakSanitizer
# and valgrind do), so the bound is wide; descriptors stay strict.
slack=32
case "$BUILD" in
*san-*) slack=1024 ;;
esac
exec "$BUILD/soak" --daemon "$BUILD/gpucmdd" --seconds "${SOAK_SECONDS:-20}" \
	--clients 4 --quiet --rss-slack "$slack"
