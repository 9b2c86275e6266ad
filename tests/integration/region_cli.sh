#!/bin/sh
# region_cli.sh - shared regions through gpucmd exec, against a daemon whose
# frames hold at most 1 MiB: a file of several MiB round-trips through
# write/create/read file: (which only fits through a region) and compares
# equal with cmp; region lines write from and read into a named region and
# print where the bytes went; ranges past a region's end are refused while
# parsing, and ones past a buffer's end by the daemon, with the numbers.
# Where the service's region_limit (service capped) or the daemon's count
# of regions leaves no room for exec's scratch region, transfers go in the
# frame when they fit it, and are refused with the numbers when not.  A
# region the daemon has no address space to map is refused, saying so.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
lib_init region-cli
cat >"$dir/gpucmdd.conf" <<'CONF'
[service capped]
region_limit = 64K
CONF
start_daemon --max-frame-bytes 1M --config "$dir/gpucmdd.conf"

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

# 6c. a service whose region_limit has no room for exec's scratch region
#     (gpucmdd.conf(5) recommends a region_limit): the transfers over
#     32 KiB go in the frame instead, as gpucmd_write_buffer's do, when
#     they fit it
head -c 40K /dev/urandom >"$dir/m40" || fail "cannot make the 40 KiB file"
out=$(printf 'empty a 40K\nwrite a file:%s/m40\nread a file:%s/o40\n' "$dir" "$dir" |
	g --service capped exec) || fail "40 KiB under a 64 KiB region_limit: exit $?"
[ "$out" = "a: 40960 bytes -> $dir/o40" ] || fail "40 KiB under a region_limit: '$out'"
cmp "$dir/m40" "$dir/o40" || fail "40 KiB under a region_limit: the bytes differ"
#     ...and when they fit neither, the refusal gives the sizes, the
#     region_limit and the frame limit and what to do, and names the
#     scratch region as the user knows it, not by its id (2^62)
head -c 2M /dev/urandom >"$dir/m2" || fail "cannot make the 2 MiB file"
err=$(printf 'empty a 2M\nwrite a file:%s/m2\nread a file:%s/o2\n' "$dir" "$dir" |
	g --service capped exec 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "2 MiB under a 64 KiB region_limit: exit $rc ('$err')"
case "$err" in
*"gpucmd: <stdin>:2: cannot create exec's scratch region for the transfers over 32768 bytes: exec's scratch region of 4194304 bytes would take service 'capped' to 4194304 bytes of shared regions, over its region_limit of 65536 "*"(GPUCMD_EQUOTA)"*) ;;
*) fail "2 MiB under a region_limit, the refusal: '$err'" ;;
esac
case "$err" in
*"gpucmd: nor do they fit inline: the request of script lines 1-3 would send 2097152 bytes, over the 1044480 bytes a frame holds (max_frame_bytes is 1048576): raise the service's region_limit (65536 bytes) by 4194304 bytes, raise max_frame_bytes, or move the data in pieces of at most 1044480 bytes with submit between them"*) ;;
*) fail "2 MiB under a region_limit, what would fit: '$err'" ;;
esac
case "$err" in *4611686018427387904*) fail "the scratch region named by its id: '$err'" ;; esac
err=$(printf 'empty z 2M\nread z\n' | g --service capped exec 2>&1 >/dev/null)
case "$err" in
*"the request of script lines 1-2 would read back 2097152 bytes, over the 1044480"*) ;;
*) fail "a 2 MiB read under a region_limit: '$err'" ;;
esac

#     a named region over the region_limit is named as the script wrote it
err=$(printf 'region Big 128K\n' | g --service capped exec 2>&1 >/dev/null)
case "$err" in
*"gpucmd: script line 1: cannot create the region: region Big of 131072 bytes would take service 'capped' to 131072 bytes of shared regions, over its region_limit of 65536 "*"(GPUCMD_EQUOTA)"*) ;;
*) fail "a named region over the region_limit: '$err'" ;;
esac

# 6d. the same inline way when the daemon's count of regions a connection
#     may attach (64) is full (GPUCMD_ELIMIT)
{
	i=1
	while [ $i -le 64 ]; do
		echo "region r$i 4K"
		i=$((i + 1))
	done
	printf 'empty a 40K\nwrite a file:%s/m40\nread a file:%s/o40b\n' "$dir" "$dir"
} >"$dir/many.gs"
out=$(g exec "$dir/many.gs") || fail "40 KiB beside 64 regions: exit $?"
[ "$out" = "a: 40960 bytes -> $dir/o40b" ] || fail "40 KiB beside 64 regions: '$out'"
cmp "$dir/m40" "$dir/o40b" || fail "40 KiB beside 64 regions: the bytes differ"

# 6d'. writes each small enough for the frame (no region) whose data only
#      together are over max_frame_bytes: refused when sent (exit 1), with
#      the bytes the request carries and the daemon's limit
head -c 30000 /dev/urandom >"$dir/m30" || fail "cannot make the 30000-byte file"
{
	echo "empty a 1200000"
	i=0
	while [ $i -lt 40 ]; do
		echo "write a $((i * 30000)) file:$dir/m30"
		i=$((i + 1))
	done
} >"$dir/together.gs"
err=$(g exec "$dir/together.gs" 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "40 writes of 30000 bytes in one 1 MiB frame: exit $rc ('$err')"
case "$err" in
*"the request carries 1200000 bytes of data in its frame, over the daemon's max_frame_bytes of 1048576"*"split the group with submit"*) ;;
*) fail "40 writes of 30000 bytes in one 1 MiB frame: '$err'" ;;
esac

# 6e. a large file: operand is read into the scratch region when its group
#     runs, not held in the tool's memory as well: the peak RSS (GNU
#     time's %M, KiB) of a 32 MiB write grows by the file once, not twice
#     (not under a sanitizer: TSan's shadow memory alone is several times
#     what the program touches)
case "$BUILD" in
*san-*) measure_rss=false ;;
*) measure_rss=true ;;
esac
if $measure_rss && /usr/bin/time -f %M -o "$dir/rss" true 2>/dev/null; then
	head -c 32M /dev/urandom >"$dir/m32" || fail "cannot make the 32 MiB file"
	printf 'ping\n' | /usr/bin/time -f %M -o "$dir/rss0" \
		"$BUILD/gpucmd" --socket "$sock" exec >/dev/null ||
		fail "ping for the RSS baseline: exit $?"
	printf 'empty a 32M\nwrite a file:%s/m32\n' "$dir" |
		/usr/bin/time -f %M -o "$dir/rss1" \
		"$BUILD/gpucmd" --socket "$sock" exec >/dev/null ||
		fail "write of 32 MiB for the RSS: exit $?"
	grew=$(( $(tail -n 1 "$dir/rss1") - $(tail -n 1 "$dir/rss0") ))
	[ $grew -lt $((48 * 1024)) ] ||
		fail "a 32 MiB file: operand took $grew KiB of RSS, the file twice"
	rm -f "$dir/m32"
fi

# 6f. a file: operand that changes size between its line being parsed and
#     its group running is refused, not sent cut short: with the daemon
#     stopped the group waits in connecting (once it has a socket, it was
#     parsed), and the file grows meanwhile
has_socket() {
	for fd in "/proc/$1/fd"/*; do
		case $(readlink "$fd" 2>/dev/null) in socket:*) return 0 ;; esac
	done
	return 1
}
printf 'empty a 40K\nwrite a file:%s/grow\n' "$dir" >"$dir/grow.gs"
cp "$dir/m40" "$dir/grow"
kill -STOP "$pid"
"$BUILD/gpucmd" --socket "$sock" exec "$dir/grow.gs" >/dev/null 2>"$dir/grow.err" &
tool=$!
pids=$tool
i=0
until has_socket "$tool"; do
	i=$((i + 1))
	[ $i -gt 500 ] && { kill -CONT "$pid"; fail "exec never connected"; }
	sleep 0.02
done
head -c 100 /dev/urandom >>"$dir/grow"
kill -CONT "$pid"
wait "$tool"
rc=$?
pids=""
[ $rc -eq 1 ] || fail "a file that grew: exit $rc ($(cat "$dir/grow.err"))"
grep -qF "gpucmd: $dir/grow.gs:2: '$dir/grow' changed size after line 2 was parsed (it had 40960 bytes then)" \
	"$dir/grow.err" || fail "a file that grew: $(cat "$dir/grow.err")"

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

# 8. a region the daemon cannot map (its address space spent: ulimit -v)
#    is refused with what ran out and what to do, not as device memory,
#    and a smaller one still attaches (not under a sanitizer, whose shadow
#    memory needs the address space)
case "$BUILD" in
*san-*) ;;
*)
	(ulimit -v 1500000 && exec "$BUILD/gpucmdd" --socket "$sock" \
		--backend host >"$dir/log.as" 2>&1) &
	pid=$!
	wait_socket "$sock"
	err=$(printf 'region r 2G\nsync\n' | g exec 2>&1) &&
		fail "a 2 GiB region in 1.5 GB of address space was made"
	case "$err" in
	*"region r: the daemon cannot map 2147483648 bytes: "*"the daemon's address space or its count of mappings is spent, not the device: attach a smaller region"*"(GPUCMD_ENOMEM)") ;;
	*) fail "a region the daemon cannot map: '$err'" ;;
	esac
	printf 'region r 1M\nsync\n' | g exec >/dev/null ||
		fail "a 1 MiB region after the refusal: exit $?"
	stop_daemon
	;;
esac
exit 0
