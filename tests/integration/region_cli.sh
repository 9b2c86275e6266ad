#!/bin/sh
# region_cli.sh - shared regions through gpucmd exec, against a daemon whose
# frames hold at most 1 MiB: a file of several MiB round-trips through
# write/create/read file: (which only fits through a region) and compares
# equal with cmp; region lines write from and read into a named region and
# print where the bytes went; ranges past a region's end are refused while
# parsing, and ones past a buffer's end by the daemon, with the numbers.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init region-cli
start_daemon --max-frame-bytes 1M

# 1. a file over the frame limit: write, create and read through regions
size=$((3 * 1024 * 1024 + 7))
head -c "$size" /dev/urandom >"$dir/in" || fail "cannot make the input file"
out=$(g exec <<SCRIPT
empty big $size
write big file:$dir/in
read big file:$dir/out
create copy file:$dir/in
read copy 5 $((size - 5)) file:$dir/out2
submit
read big file:$dir/out3
SCRIPT
) || fail "exec of the large file exited $?"
cmp "$dir/in" "$dir/out" || fail "write/read file: the bytes differ"
cmp "$dir/in" "$dir/out3" || fail "read in a later group: the bytes differ"
tail -c $((size - 5)) "$dir/in" >"$dir/in5"
cmp "$dir/in5" "$dir/out2" || fail "create/read at offset 5: the bytes differ"
expect="big: $size bytes -> $dir/out
copy: $((size - 5)) bytes -> $dir/out2
big: $size bytes -> $dir/out3"
[ "$out" = "$expect" ] || fail "large file output '$out'"

# 2. a large read printed as hex comes through the scratch region too
out=$(g exec <<'SCRIPT'
empty z 2M
kernel fill_u32 grid=2048 block=256 z u32:0x5a5a5a5a u32:524288
read z
SCRIPT
) || fail "exec of the large hex read exited $?"
[ ${#out} -eq $((4 * 1024 * 1024)) ] || fail "hex read of 2 MiB printed ${#out} characters"
case "$out" in *[!a5]*) fail "hex read of the filled buffer has other digits" ;; esac

# 3. named regions: write from one, read into one, create from one
out=$(g exec <<'SCRIPT'
region R 64K hex:00112233445566778899aabbccddeeff
empty a 16
write a 2 region:R:4:8
read a
read a 2 8 region:R:1000
create b region:R:1000:8
read b
release-region R
SCRIPT
) || fail "exec with regions exited $?"
expect="0000445566778899aabb000000000000
a: 8 bytes -> region R at 1000
445566778899aabb"
[ "$out" = "$expect" ] || fail "region script printed '$out'"

# 4. --json names the region and the offset
out=$(printf 'region R 4K hex:0102\nempty a 2\nwrite a region:R:0:2\nread a region:R:7\n' |
	g exec --json) || fail "exec --json exited $?"
[ "$out" = '{"line":4,"op":"read","name":"a","bytes":2,"region":"R","region_offset":7}' ] ||
	fail "json read into a region: '$out'"

# 5. a range past the region's end: a parse error (exit 2) with the numbers
err=$(printf 'region R 4K\nempty a 16\nwrite a region:R:4090:8\n' | g exec 2>&1 >/dev/null)
rc=$?
[ $rc -eq 2 ] || fail "range past the region: exit $rc"
case "$err" in
*"8 bytes at offset 4090 do not fit region 'R' of 4096 bytes"*) ;;
*) fail "range past the region: '$err'" ;;
esac

# 6. a released region is a parse error; past the buffer the daemon refuses
err=$(printf 'region R 4K\nrelease-region R\nempty a 8\nread a region:R\n' | g exec 2>&1 >/dev/null)
[ $? -eq 2 ] || fail "released region: exit status"
case "$err" in *"no region named 'R' (it was released)"*) ;; *) fail "released region: '$err'" ;; esac
err=$(printf 'region R 4K\nempty a 16\nwrite a region:R:0:100\n' | g exec 2>&1 >/dev/null)
[ $? -eq 1 ] || fail "write past the buffer: exit status"
case "$err" in
*"GPUCMD_EINVAL"*"100 bytes at offset 0"*"16 bytes"*) ;;
*) fail "write past the buffer: '$err'" ;;
esac

# 6b. a region this process cannot make is its own failure (exit 1), not
#     an unreachable daemon (69)
err=$(printf 'region huge 0x7fffffffffffffff\n' | g exec 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "a region too large to map here: exit $rc ('$err')"

# 7. after all that, the daemon holds nothing for the groups' regions and
#    serves the next client
#    (a connection that left is torn down once its streams are idle; the
#    report's own connection observes, in no service, and is not counted)
g ping -c 1 >/dev/null || fail "ping after the region scripts exited $?"
i=0
while :; do
	json=$(g memory-report --json) || fail "memory-report exited $?"
	case "$json" in *'"totals":{"connections":0,"allocations":0,"bytes_in_use":0'*) break ;; esac
	i=$((i + 1))
	[ $i -gt 200 ] && fail "memory still in use: $json"
	sleep 0.05
done

stop_daemon
exit 0
