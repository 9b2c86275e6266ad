#!/bin/sh
# report_cli.sh - gpucmd memory-report, services, evict and cleanup against
# a real daemon: the JSON has the exact bytes the clients hold, the text
# table (--bytes) shows the same numbers, --prometheus is valid exposition
# format with the same numbers, --service filters, --watch redraws, a
# refused allocation stays in the report as its client was told it, and a
# user who is not an admin sees only the service it speaks for.
#
# The last part runs the tool as nobody, so the test needs root (77
# otherwise) and a daemon whose socket is open to everyone (its config
# sets socket_mode = 0666).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root to run the tool as nobody"
command -v setpriv >/dev/null 2>&1 ||
	skip "needs setpriv (util-linux) to run the tool as nobody"
lib_init report
chmod 755 "$dir"
holders=""
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	# Closing the holders' input ends them; then the daemon.
	exec 4>&- 5>&-
	for h in $holders; do
		wait "$h" 2>/dev/null
	done
	lib_cleanup
}
trap cleanup EXIT
cat >"$dir/gpucmdd.conf" <<'CONF'
[daemon]
socket_mode = 0666

[service held]
memory_limit = 64M
max_modules = 3

[service capped]
region_limit = 3M
CONF
start_daemon --config "$dir/gpucmdd.conf"
# The tool as root (an admin) and as nobody, from a copy nobody can run.
cp "$BUILD/gpucmd" "$dir/gpucmd"
chmod 755 "$dir/gpucmd"
g() { "$dir/gpucmd" --socket "$sock" "$@"; }
gn() {
	setpriv --reuid=65534 --regid=65534 --clear-groups \
		"$dir/gpucmd" --socket "$sock" "$@"
}

# First, an admin observes: the reports, status, cleanup and evict join no
# service, so on a fresh daemon none of them makes (or shows) the service
# --service names, "default", and the counts hold no connection of theirs.
for cmd in "services" "memory-report --bytes" "status" \
	"services --json" "memory-report --json"; do
	# shellcheck disable=SC2086 # the words of cmd are the arguments
	out=$(g $cmd) || fail "$cmd as admin on a fresh daemon exited $?: $out"
	case "$out" in
	*default\ *) fail "$cmd as admin shows service default: $out" ;;
	*'"name":"default"'*) fail "$cmd as admin shows service default: $out" ;;
	esac
done
printf '%s\n' "$out" | grep -qF '"totals":{"connections":0,' ||
	fail "an admin's report counts a connection: $out"
out=$(g status)
printf '%s\n' "$out" | grep -qx 'connections  0' ||
	fail "status counts the admin's own connection: $out"
printf '%s\n' "$out" | grep -q '^this client  an observer in no service, connection [0-9]*$' ||
	fail "status does not say the admin observes: $out"
g status --json | grep -qF '"client":{"observer":true,"service":"","service_id":0,' ||
	fail "status --json: $(g status --json)"
# cleanup names --service ("default"), which no one made: it says so
# (it used to clean nothing and succeed, whatever the name)
g cleanup >/dev/null 2>"$dir/err" && fail "cleanup of an unknown service succeeded"
grep -q "no service 'default' is known.*GPUCMD_ENOTFOUND" "$dir/err" ||
	fail "cleanup of an unknown service: $(cat "$dir/err")"
# and so does evict (it used to say "evicted 0 connections")
g evict default >/dev/null 2>"$dir/err" && fail "evict of an unknown service succeeded"
grep -q "no service 'default' is known.*GPUCMD_ENOTFOUND" "$dir/err" ||
	fail "evict of an unknown service: $(cat "$dir/err")"
grep -q "joined service" "$dir/log" && fail "an admin's report joined a service"

# 0. The exec lines of the memory, profile and graph ops print what
#    gpucmd(1) says they print.
out=$(g exec <<'SCRIPT'
reserve r 96
bind r m
write m shape=3,2 strides=4,1 elem=4 hex:010000000200000003000000040000000500000006000000
read m shape=3,2 strides=4,1 elem=4
read m 16 8
cursor
reserve-cpu 4K
mode persistent
empty p 100
mode auto
profile begin t
kernel spin u32:20000
profile end t
submit
capture begin
kernel fill_u32 grid=1 block=64 m u32:7 u32:2
capture end g
launch g
read m 0 8
destroy g
report
SCRIPT
) || fail "exec of the new ops exited $?: $out"
line() { printf '%s\n' "$out" | sed -n "$1p"; }
[ "$(line 1)" = 010000000200000003000000040000000500000006000000 ] ||
	fail "layout read: $out"
# The pitch is 4 elements: the second row starts at byte 16.
[ "$(line 2)" = 0300000004000000 ] || fail "pitched write: $out"
[ "$(line 3)" = "cursor: 6" ] || fail "cursor: $out"
case "$(line 4)" in
"reserve_cpu: 4096 bytes pinned" | "reserve_cpu: 4096 bytes heap") ;;
*) fail "reserve-cpu: $out" ;;
esac
line 5 | awk '$1 == "profile" && $2 == "t:" && $3 >= 15 && $3 < 2000 && $4 == "ms" { ok = 1 }
	END { exit !ok }' || fail "profile: $out"
[ "$(line 6)" = 0700000007000000 ] || fail "graph replay: $out"
case "$(line 7)" in
"report: stream 0 (connection "*"): allocations=2 bytes_in_use=196 "*) ;;
*) fail "report: $out" ;;
esac
printf '%s\n' "$out" | grep -Eq '^  [0-9]+  persistent +- +1 +1 +100 ' ||
	fail "report has no persistent pool holding 100 bytes: $out"
err=$(printf 'empty a 100\npools custom sliced:page=1M\n' | g exec - 2>&1 >/dev/null)
[ $? -eq 1 ] || fail "pools with a live buffer did not exit 1"
case "$err" in
*"GPUCMD_EPOOLSINUSE"*"100 bytes"*) ;;
*) fail "pools in use: $err" ;;
esac
err=$(printf 'pools custom sliced:max=1G\n' | g exec - 2>&1 >/dev/null)
[ $? -eq 2 ] || fail "a pool option of the wrong kind is not a script error"
j=$(printf 'cursor\nprofile begin p\nprofile end p\n' | g exec --json -) ||
	fail "exec --json exited $?"
case "$j" in
'{"line":1,"op":"cursor","value":1}'*'{"line":3,"op":"profile_end","name":"p","valid":true,"device_ms":'*) ;;
*) fail "exec --json: $j" ;;
esac

# A client that holds its buffers until its input (fd $2 here) closes.
hold() {
	name=$1
	fd=$2
	shift 2
	mkfifo "$dir/$name.fifo"
	g exec --service "$name" - <"$dir/$name.fifo" >/dev/null &
	holders="$holders $!"
	eval "exec $fd>\"\$dir/\$name.fifo\""
	printf '%s\n' "$@" sync submit >&"$fd"
}
hold held 4 'empty a 1000' 'empty b 3000' 'stream 1' 'empty c 5M'
hold other 5 'empty x 777'

# 1. JSON: wait until both holders show up, then the exact numbers.
i=0
while :; do
	json=$(g memory-report --json) || fail "memory-report --json exited $?"
	case "$json" in
	*'"name":"held"'*'"bytes_in_use":5246880'*'"name":"other"'*'"bytes_in_use":777'* | \
	*'"name":"other"'*'"bytes_in_use":777'*'"name":"held"'*'"bytes_in_use":5246880'*)
		break ;;
	esac
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the report never showed both holders: $json"
	sleep 0.05
done
# The members of service $1 before its streams, as KEY VALUE lines.
members() {
	printf '%s\n' "$2" | sed -e "s/.*\"name\":\"$1\",//" -e 's/,"streams".*//' |
		tr ',' '\n' | sed -e 's/^"\([a-z_]*\)":/\1 /'
}
jget() { members "$1" "$json" | awk -v k="$2" '$1 == k { print $2 }'; }
[ "$(jget held bytes_in_use)" = 5246880 ] || fail "held bytes_in_use: $json"
[ "$(jget held allocations)" = 3 ] || fail "held allocations: $json"
[ "$(jget held limit_bytes)" = 67108864 ] || fail "held limit: $json"
[ "$(jget held connections)" = 1 ] || fail "held connections: $json"
[ "$(jget other bytes_in_use)" = 777 ] || fail "other bytes_in_use: $json"
for key in name id bytes_in_use bytes_reserved bytes_padding allocations \
	peak_bytes_in_use limit_bytes oom_count connections fragmentation \
	largest_free streams pools kind page_size pages largest_free totals \
	device backend total_memory; do
	case "$json" in *"\"$key\""*) ;; *) fail "json lacks $key" ;; esac
done
# Two streams for held, and their pools add up to the service.
nstreams=$(printf '%s\n' "$json" | sed -e 's/.*"name":"held",//' \
	-e 's/{"name":.*//' | grep -o '"stream":' | wc -l)
[ "$nstreams" -eq 2 ] || fail "held has $nstreams streams: $json"
if command -v python3 >/dev/null 2>&1; then
	printf '%s\n' "$json" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for s in r["services"]:
    keys = ("allocations", "bytes_in_use", "bytes_padding", "bytes_reserved")
    for k in keys:
        st = sum(x[k] for x in s["streams"])
        po = sum(p[k] for x in s["streams"] for p in x["pools"])
        assert st == s[k] == po, (s["name"], k, st, s[k], po)
    free = s["bytes_reserved"] - s["bytes_in_use"] - s["bytes_padding"]
    lf = sum(x["largest_free"] for x in s["streams"])
    want = 1 - lf / free if free > 0 else 0
    assert abs(s["fragmentation"] - want) < 1e-6, (s["name"], want)
for k in ("allocations", "bytes_in_use", "bytes_padding", "bytes_reserved"):
    assert r["totals"][k] == sum(s[k] for s in r["services"]), k
' || fail "the JSON does not add up: $json"
fi

# 2. The text table shows the JSON's numbers (--bytes: exact).
text=$(g memory-report --bytes) || fail "memory-report --bytes exited $?"
row=$(printf '%s\n' "$text" | awk '$1 == "held"')
set -- $row
[ $# -eq 11 ] || fail "held row has $# columns: '$row'"
[ "$2" = "$(jget held id)" ] || fail "id: '$row' vs $json"
[ "$3" = "$(jget held connections)" ] || fail "conn: '$row'"
[ "$4" = "$(jget held bytes_in_use)" ] || fail "in use: '$row'"
[ "$5" = "$(jget held bytes_reserved)" ] || fail "reserved: '$row'"
[ "$6" = "$(jget held bytes_padding)" ] || fail "padding: '$row'"
[ "$7" = "$(jget held allocations)" ] || fail "allocs: '$row'"
[ "$8" = "$(jget held peak_bytes_in_use)" ] || fail "peak: '$row'"
[ "$9" = "$(jget held limit_bytes)" ] || fail "limit: '$row'"
[ "${10}" = "$(jget held oom_count)" ] || fail "ooms: '$row'"
frag=$(awk -v f="$(jget held fragmentation)" 'BEGIN { printf "%.1f%%", f * 100 }')
[ "${11}" = "$frag" ] || fail "fragmentation: '$row' vs $frag"
case "$text" in
"device: "*"daemon overhead: "*) ;;
*) fail "no device and overhead lines: $text" ;;
esac
# Without --bytes the sizes are human-readable.
human=$(g memory-report | awk '$1 == "held" { print $4, $5 }')
[ "$human" = "5.0 MiB" ] || fail "human size: '$human'"
# --streams and --pools expand held into its streams and their pools.
g memory-report --streams --bytes | grep -q "^service held (id [0-9]*): 2 streams" ||
	fail "--streams: $(g memory-report --streams)"
g memory-report --pools --bytes | grep -Eq '^    [0-9]+  sliced .* 5242880 ' ||
	fail "--pools has no sliced pool holding 5 MiB: $(g memory-report --pools --bytes)"

# 3. --service filters, in every format.
f=$(g memory-report --service held --bytes) || fail "--service exited $?"
printf '%s\n' "$f" | awk '$1 == "other" { exit 1 }' || fail "--service showed other"
printf '%s\n' "$f" | grep -q '^held ' || fail "--service lost held: $f"
f=$(g memory-report --service other --json)
case "$f" in *'"name":"held"'*) fail "--service --json showed held" ;; esac
case "$f" in *'"totals":{"connections":1,"allocations":1,"bytes_in_use":777,'*) ;;
*) fail "--service totals: $f" ;; esac
g memory-report --service nosuch >/dev/null 2>&1
[ $? -eq 1 ] || fail "an unknown --service did not exit 1"

# 4. Prometheus: valid exposition format, and the same numbers.
prom=$(g memory-report --prometheus) || fail "--prometheus exited $?"
printf '%s\n' "$prom" | awk '
function bad(why) { printf "line %d: %s: %s\n", NR, why, $0; err = 1; exit 1 }
/^# HELP / {
	if ($3 !~ /^[a-zA-Z_:][a-zA-Z0-9_:]*$/) bad("bad name")
	if (help[$3]++) bad("second HELP")
	next
}
/^# TYPE / {
	if ($4 !~ /^(counter|gauge|histogram|summary|untyped)$/) bad("bad type")
	if (type[$3]) bad("second TYPE")
	if (seen[$3]) bad("TYPE after samples")
	type[$3] = $4
	next
}
/^#/ { next }
/^$/ { bad("empty line") }
{
	line = $0
	if (!match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*/)) bad("bad metric name")
	name = substr(line, 1, RLENGTH)
	rest = substr(line, RLENGTH + 1)
	if (substr(rest, 1, 1) == "{") {
		lab = "^\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\\n]|\\\\[\\\\\"n])*\"(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\\n]|\\\\[\\\\\"n])*\")*\\}"
		if (!match(rest, lab)) bad("bad labels")
		labels = substr(rest, 1, RLENGTH)
		rest = substr(rest, RLENGTH + 1)
	} else {
		labels = ""
	}
	if (rest !~ /^ [-+]?([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|NaN|[-+]?Inf)( [-+]?[0-9]+)?$/)
		bad("bad value")
	base = name
	if (!type[base]) bad("sample before its TYPE")
	if (last != "" && last != base && seen[base]) bad("family not contiguous")
	if (dup[name labels]++) bad("duplicate series")
	seen[base] = 1
	last = base
	n++
}
END { if (!err && n < 10) { print "only " n " samples"; exit 1 } }
' || fail "--prometheus is not valid exposition format"
if command -v python3 >/dev/null 2>&1 &&
	python3 -c 'import prometheus_client' 2>/dev/null; then
	printf '%s\n' "$prom" | python3 -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
n = sum(len(f.samples) for f in text_string_to_metric_families(sys.stdin.read()))
assert n > 10, n
' || fail "prometheus_client cannot parse --prometheus"
fi
printf '%s\n' "$prom" | grep -qx 'gpucmd_service_bytes_in_use{service="held"} 5246880' ||
	fail "prometheus in use of held"
printf '%s\n' "$prom" | grep -qx 'gpucmd_service_limit_bytes{service="held"} 67108864' ||
	fail "prometheus limit of held"
printf '%s\n' "$prom" | grep -q '^gpucmd_pool_bytes_in_use{service="held",connection="[0-9]*",stream="1",pool="[0-9]*",kind="sliced"} 5242880$' ||
	fail "prometheus pool of held stream 1"

# 5. --watch: several frames, no terminal codes into a pipe, exit 0 on SIGINT.
# SIGINT once three frames are out: the handler is in place by then (a
# shell without job control starts background commands with SIGINT
# ignored, and a signal before the handler would be lost).
# The file exists before the loop looks at it: the background shell may
# not have opened it yet (grep then failed, the loop ended at once, and the
# SIGINT came before the handler: exit 130).
: >"$dir/watch"
"$dir/gpucmd" --socket "$sock" memory-report --watch 0.2 --json >>"$dir/watch" &
wpid=$!
i=0
while [ "$(grep -c '^{"device"' "$dir/watch")" -lt 3 ]; do
	i=$((i + 1))
	[ $i -gt 600 ] && { kill -KILL "$wpid"; fail "--watch printed no frames in 30 s"; }
	sleep 0.05
done
kill -INT "$wpid"
i=0
while kill -0 "$wpid" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 400 ] && { kill -KILL "$wpid"; fail "--watch still runs 20 s after SIGINT"; }
	sleep 0.05
done
wait "$wpid"
rc=$?
[ $rc -eq 0 ] || fail "--watch exited $rc after SIGINT"
frames=$(grep -c '^{"device"' "$dir/watch")
[ "$frames" -ge 3 ] || fail "--watch printed $frames frames"
if grep -q "$(printf '\033')" "$dir/watch"; then
	fail "--watch wrote terminal codes into a file"
fi
g memory-report --watch 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--watch 0 is not a usage error"

# 6. services: one line per service.
s=$(g services --bytes) || fail "services exited $?"
printf '%s\n' "$s" | grep -Eq '^held +[0-9]+ +1 +5246880 +67108864 +0/3$' ||
	fail "services: $s"
printf '%s\n' "$s" | grep -Eq '^other +[0-9]+ +1 +777 +- +0/64$' || fail "services: $s"
sj=$(g services --json)
case "$sj" in
"[{"*"}]") ;;
*) fail "services --json is not an array: $sj" ;;
esac
printf '%s\n' "$sj" | grep -qF '"name":"held","id":' || fail "services --json: $sj"
printf '%s\n' "$sj" | grep -qF '"connections":1,"bytes_in_use":5246880,"limit_bytes":67108864,"modules":0,"max_modules":3,"module_bytes":0}' ||
	fail "services --json: $sj"

# 7. Not an admin: nobody sees only the service it speaks for, and may
#    neither clean up nor evict another.
nj=$(gn --service lowly memory-report --json) || fail "as nobody: exit $?"
case "$nj" in
*'"name":"held"'* | *'"name":"other"'*) fail "nobody sees other services: $nj" ;;
*'"services":[{"name":"lowly"'*) ;;
*) fail "nobody's report: $nj" ;;
esac
ns=$(gn --service lowly services) || fail "services as nobody: exit $?"
[ "$(printf '%s\n' "$ns" | wc -l)" -eq 2 ] || fail "nobody's services: $ns"
# Observing is for admins: nobody's tool speaks for the service it names,
# and its status shows that service's quotas, as the Welcome said them.
gn --service lowly status | grep -q '^this client  service lowly (id [1-9][0-9]*)' ||
	fail "nobody's status: $(gn --service lowly status)"
gn --service capped status | grep -q '^limits       memory unlimited, regions 3.0 MiB, streams 16, ' ||
	fail "nobody's status as capped: $(gn --service capped status)"
gn --service held status --json | grep -qF '"client":{"observer":false,"service":"held","service_id":1,"connection_id":' ||
	fail "nobody's status --json as held: $(gn --service held status --json)"
gn --service held status --json | grep -qF '"memory_limit":67108864,"region_limit":0,' ||
	fail "nobody's status --json as held: $(gn --service held status --json)"
gn --service capped status --json | grep -qF '"memory_limit":0,"region_limit":3145728,' ||
	fail "nobody's status --json as capped: $(gn --service capped status --json)"
gn --service lowly cleanup held >/dev/null 2>"$dir/err"
[ $? -eq 1 ] || fail "nobody cleaned up held"
grep -q GPUCMD_EPERM "$dir/err" || fail "cleanup as nobody: $(cat "$dir/err")"
grep -q "only an admin may clean up" "$dir/err" ||
	fail "cleanup as nobody does not say why: $(cat "$dir/err")"
gn --service lowly evict held >/dev/null 2>"$dir/err"
[ $? -eq 1 ] || fail "nobody evicted held"
grep -q GPUCMD_EPERM "$dir/err" || fail "evict as nobody: $(cat "$dir/err")"
# The daemon's own sentence reaches the user, not just the code.
grep -q "only an admin may evict service 'held'" "$dir/err" ||
	fail "evict as nobody does not say why: $(cat "$dir/err")"
gn --service lowly evict --connection 999999 >/dev/null 2>"$dir/err"
[ $? -eq 1 ] || fail "evict of a connection nobody has exited 0"
grep -q "no connection 999999 of service 'lowly' is open" "$dir/err" ||
	fail "evict --connection 999999: $(cat "$dir/err")"
out=$(gn --service lowly cleanup) || fail "nobody's own cleanup: exit $?"
[ "$out" = "cleanup: returned 0 bytes to the device" ] || fail "cleanup: $out"

# 8. cleanup and evict as an admin.
out=$(g cleanup held) || fail "cleanup held: exit $?"
case "$out" in "cleanup: returned "[0-9]*" bytes to the device") ;;
*) fail "cleanup held: $out" ;; esac
out=$(g evict held) || fail "evict held: exit $?"
[ "$out" = "evicted 1 connection" ] || fail "evict held: $out"
i=0
while :; do
	json=$(g memory-report --json --service held)
	[ "$(jget held bytes_reserved)" = 0 ] && [ "$(jget held connections)" = 0 ] && break
	i=$((i + 1))
	[ $i -gt 200 ] && fail "held still holds memory after evict: $json"
	sleep 0.05
done
g evict >/dev/null 2>&1
[ $? -eq 2 ] || fail "evict without a target is not a usage error"
g evict --connection 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "evict --connection 0 is not a usage error"
g evict "" >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "evict of an empty name is not a usage error"
grep -q "empty" "$dir/err" || fail "evict '': $(cat "$dir/err")"
# cleanup "" was the caller's own service for some and EPERM for an admin
g cleanup "" >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "cleanup of an empty name is not a usage error"
grep -q "the SERVICE name is empty" "$dir/err" || fail "cleanup '': $(cat "$dir/err")"
# A typo is not "evicted 0 connections" (exit 0); a known service with
# none open is.
g evict tarin >"$dir/out" 2>"$dir/err"
[ $? -eq 1 ] || fail "evict of an unknown service exited 0: $(cat "$dir/out")"
grep -q "no service 'tarin' is known to the daemon (gpucmd services lists them).*GPUCMD_ENOTFOUND" "$dir/err" ||
	fail "evict tarin: $(cat "$dir/err")"
out=$(g evict held) || fail "evict held (none open) exited $?"
[ "$out" = "evicted 0 connections" ] || fail "evict held (none open): $out"

# Usage errors, not an unreachable daemon: --socket "" (an unset "$SOCK")
# said "cannot reach gpucmdd at : ... Connection refused" and exited 69;
# --prometheus --watch into a pipe repeated every metric family.
"$dir/gpucmd" --socket "" status >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "--socket '' is not a usage error: $(cat "$dir/err")"
grep -q "^gpucmd: --socket needs a path (an empty one was given)$" "$dir/err" ||
	fail "--socket '': $(cat "$dir/err")"
# A value out of range says the range (ping's count, gpucmdd's flags).
g ping -c 0 >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "ping -c 0 is not a usage error"
grep -q "bad count '0' (a number of round trips from 1 to 4294967295)" "$dir/err" ||
	fail "ping -c 0: $(cat "$dir/err")"
: >"$dir/none.conf"
for bad in "--device 5000:a GPU index from 0 to 1024, a GPU UUID GPU-... or a PCI bus id 0000:3b:00.0" \
	"--log-level loud:error, warning, notice, info or debug" \
	"--max-connections 0:1 to 1048576"; do
	# shellcheck disable=SC2086 # the flag and its value, two words
	"$BUILD/gpucmdd" -c "$dir/none.conf" ${bad%%:*} --check-config \
		>/dev/null 2>"$dir/err"
	[ $? -eq 2 ] || fail "gpucmdd ${bad%%:*} is not a usage error"
	grep -qF "(${bad#*:})" "$dir/err" || fail "gpucmdd ${bad%%:*}: $(cat "$dir/err")"
done
# getopt's complaints name the program as every other message does, not
# the path it was started by.
"$dir/gpucmd" --bogus >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "gpucmd --bogus is not a usage error"
grep -q "^gpucmd: unrecognized option '--bogus'" "$dir/err" ||
	fail "gpucmd --bogus: $(cat "$dir/err")"
"$BUILD/gpucmdd" --bogus >/dev/null 2>"$dir/err"
[ $? -eq 2 ] || fail "gpucmdd --bogus is not a usage error"
grep -q "^gpucmdd: unrecognized option '--bogus'" "$dir/err" ||
	fail "gpucmdd --bogus: $(cat "$dir/err")"
g memory-report --prometheus --watch 1 >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] || fail "--prometheus --watch into a file is not a usage error"
[ -s "$dir/out" ] && fail "--prometheus --watch into a file wrote: $(head -3 "$dir/out")"
grep -q "would repeat every metric: run memory-report --prometheus once per scrape" "$dir/err" ||
	fail "--prometheus --watch into a file: $(cat "$dir/err")"

# ping stopped with Ctrl-C prints the summary of the pings it made, as
# ping(8) does, and exits 0 (it printed nothing and died of the signal).
# (not through g: $! must be the tool, not a subshell that ignores SIGINT)
"$dir/gpucmd" --socket "$sock" ping -c 1000000000 >"$dir/ping.out" 2>"$dir/ping.err" &
ppid=$!
i=0
# (the file may not be there yet: the tool's shell opens it)
until [ "$(cat "$dir/ping.out" 2>/dev/null | grep -c '^pong ')" -ge 3 ]; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "ping printed no pongs: $(cat "$dir/ping.err")"
	sleep 0.05
done
kill -INT $ppid
i=0
while kill -0 $ppid 2>/dev/null; do
	i=$((i + 1))
	if [ $i -gt 200 ]; then
		kill $ppid
		fail "ping goes on 10 s after SIGINT"
	fi
	sleep 0.05
done
wait $ppid || fail "ping stopped with SIGINT exited $?: $(cat "$dir/ping.err")"
last=$(tail -n 1 "$dir/ping.out")
n=$(grep -c '^pong ' "$dir/ping.out")
case "$last" in
"--- $n pings: min/avg/max = "*/*/*" us") ;;
*) fail "ping after SIGINT ended with '$last' ($n pongs)" ;;
esac

# A tool whose connection is evicted prints the daemon's reason (who
# evicted it) and exits 69, as exec does (ping: the one that joins a
# service; the others share its tool_fail_conn).
g --service victim ping -c 1000000000 >/dev/null 2>"$dir/victim.err" &
vpid=$!
wait_service victim
g evict victim >/dev/null || fail "evict victim: exit $?"
wait "$vpid"
rc=$?
[ $rc -eq 69 ] || fail "the evicted ping exited $rc, not 69"
grep -q "the daemon closed the connection: evicted by connection" \
	"$dir/victim.err" || fail "the evicted ping said: $(cat "$dir/victim.err")"
exec 4>&- 5>&-
for h in $holders; do
	wait "$h"
done
holders=""

# 9. A connection that closed while its kernel runs still holds its
#    memory until the work is done: --streams marks its streams (closed),
#    the JSON "closing":true, and both go once the work has run.
printf 'empty a 1M\nkernel spin grid=1 block=1 u32:2000000\n' >"$dir/drain.gs"
"$dir/gpucmd" --socket "$sock" --service drainer exec "$dir/drain.gs" \
	>/dev/null 2>&1 || fail "drainer exec exited $?"
out=$(g memory-report --streams --service drainer)
printf '%s\n' "$out" | grep -qE '^ +[0-9]+ \(closed\) +0 ' ||
	fail "a closed connection's stream is not marked: $out"
g memory-report --json --service drainer | grep -qF '"stream":0,"closing":true,' ||
	fail "closing in --json: $(g memory-report --json --service drainer)"
i=0
while g memory-report --json --service drainer | grep -qF '"closing":true'; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the closed connection's streams never went"
	sleep 0.05
done

# 10. A refused allocation stays in the report as the client was told it:
#     the text has when, how much, where and the sentence; the JSON its
#     members; nobody (another service) does not see it.
err=$(printf 'empty big 100M\n' | g --service held exec 2>&1) &&
	fail "100 MiB in held's 64 MiB was not refused"
told=${err#*"(GPUCMD_EQUOTA): "}
told=${told% \[script line 1\]}
text=$(TZ=UTC g memory-report --service held) ||
	fail "memory-report after the refusal exited $?"
printf '%s\n' "$text" | grep -qE '^  held: 100\.0 MiB at [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC \([0-9]+ s ago\), connection [0-9]+, stream 0: GPUCMD_EQUOTA$' ||
	fail "no refusal line for held: $text"
printf '%s\n' "$text" | grep -qxF "    $told" ||
	fail "the refusal's sentence is not what the client got ('$told'): $text"
if command -v python3 >/dev/null 2>&1; then
	g memory-report --json --service held | python3 -c '
import json, sys, time
s = json.load(sys.stdin)["services"][0]
r = s["last_refusal"]
assert r["code"] == "GPUCMD_EQUOTA" and r["size"] == 104857600, r
assert r["stream"] == 0 and sys.argv[1] == r["message"], r
assert abs(r["unix_ms"] / 1000 - time.time()) < 60, r
' "$told" || fail "last_refusal in the JSON: $(g memory-report --json --service held)"
fi
gn memory-report --json | grep -qF '"last_refusal":null' ||
	fail "nobody's own service shows a refusal: $(gn memory-report --json)"
gn memory-report | grep -q "last refused" &&
	fail "nobody sees held's refusal: $(gn memory-report)"

# 11. Buffers a service's connections share: who holds what.  A sharer
#     (its script from a fifo, so it stays connected) shares two buffers,
#     an importer holds one of them (after the sharer's sync: until the
#     copies have run the daemon refuses imports, and READY says no); the
#     text table, the JSON and the
#     metrics show each with its size, handles, imports and sharer (open),
#     and the service's in use counts each once.  When the sharer goes, the
#     buffer only it held goes with it, the other says its sharer is gone;
#     when the importer goes, the last.
mkfifo "$dir/sharer" "$dir/importer"
"$dir/gpucmd" --socket "$sock" --service infer exec - <"$dir/sharer" \
	>"$dir/sharer.out" 2>"$dir/sharer.err" &
sharer=$!
pids="$pids $sharer"
exec 6>"$dir/sharer"
printf '%s\n' 'create w hex:0102030405060708' 'share w weights' \
	'empty e 3M' 'share e model/emb:v1' sync report submit >&6
i=0
until grep -q '^report: ' "$dir/sharer.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the sharer never answered: $(cat "$dir/sharer.err")"
	sleep 0.05
done
conn=$(sed -n 's/^report: stream 0 (connection \([0-9]*\)).*/\1/p' "$dir/sharer.out")
[ -n "$conn" ] || fail "no connection in the sharer's report: $(cat "$dir/sharer.out")"
"$dir/gpucmd" --socket "$sock" --service infer exec - <"$dir/importer" \
	>"$dir/importer.out" 2>"$dir/importer.err" 6>&- &
importer=$!
pids="$pids $importer"
exec 7>"$dir/importer"
printf '%s\n' 'import v weights' ping submit >&7
i=0
until grep -q '^pong$' "$dir/importer.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 200 ] && fail "the importer never imported: $(cat "$dir/importer.err")"
	sleep 0.05
done
json=$(g memory-report --json) || fail "memory-report --json exited $?"
[ "$(jget infer shared_buffers)" = 2 ] || fail "infer shared_buffers: $json"
[ "$(jget infer shared_buffer_bytes)" = 3145736 ] || fail "infer shared_buffer_bytes: $json"
# Once each, whoever holds them, and in no stream.
[ "$(jget infer bytes_in_use)" = 3145736 ] || fail "infer bytes_in_use: $json"
[ "$(jget infer allocations)" = 2 ] || fail "infer allocations: $json"
[ "$(jget held shared_buffers)" = 0 ] || fail "held shared_buffers: $json"
for b in "{\"name\":\"weights\",\"bytes\":8,\"handles\":2,\"connection_id\":$conn,\"sharer_open\":true,\"imports\":1,\"ready\":true,\"lost\":false}" \
	"{\"name\":\"model/emb:v1\",\"bytes\":3145728,\"handles\":1,\"connection_id\":$conn,\"sharer_open\":true,\"imports\":0,\"ready\":true,\"lost\":false}"; do
	printf '%s\n' "$json" | grep -qF "$b" || fail "no $b in: $json"
done
printf '%s\n' "$json" | grep -qF '"shared_buffers":2,"shared_buffer_bytes":3145736}}' ||
	fail "totals of the shared buffers: $json"
if command -v python3 >/dev/null 2>&1; then
	printf '%s\n' "$json" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for s in r["services"]:
    assert s["shared_buffers"] == len(s["shared"]), s["name"]
    assert s["shared_buffer_bytes"] == sum(b["bytes"] for b in s["shared"]), s["name"]
    if s["name"] != "infer":
        assert s["shared"] == [], s["name"]
for k in ("shared_buffers", "shared_buffer_bytes"):
    assert r["totals"][k] == sum(s[k] for s in r["services"]), k
assert "shared" not in r["totals"]
' || fail "the shared buffers in the JSON do not add up: $json"
fi
text=$(g memory-report --bytes) || fail "memory-report --bytes exited $?"
printf '%s\n' "$text" | grep -qx "buffers shared between the connections of a service (counted once in in use above):" ||
	fail "no shared buffers section: $text"
printf '%s\n' "$text" | grep -qx '  SERVICE  NAME  *SIZE  HANDLES  IMPORTS  SHARED BY  *READY' ||
	fail "shared buffers headings: $text"
row=$(printf '%s\n' "$text" | awk '$1 == "infer" && $2 == "weights"' | tr -s ' ')
[ "$row" = " infer weights 8 2 1 connection $conn yes" ] || fail "weights row '$row': $text"
row=$(printf '%s\n' "$text" | awk '$1 == "infer" && $2 == "model/emb:v1"' | tr -s ' ')
[ "$row" = " infer model/emb:v1 3145728 1 0 connection $conn yes" ] ||
	fail "model/emb:v1 row '$row': $text"
human=$(g memory-report | awk '$1 == "infer" && $2 == "model/emb:v1" { print $3, $4 }')
[ "$human" = "3.0 MiB" ] || fail "shared size without --bytes: '$human'"
prom=$(g memory-report --prometheus) || fail "--prometheus exited $?"
for l in '# TYPE gpucmd_service_shared_buffers gauge' \
	'# TYPE gpucmd_service_shared_buffer_bytes gauge' \
	'gpucmd_service_shared_buffers{service="infer"} 2' \
	'gpucmd_service_shared_buffer_bytes{service="infer"} 3145736' \
	'gpucmd_service_shared_buffers{service="held"} 0' \
	'gpucmd_service_shared_buffer_bytes{service="held"} 0' \
	'# TYPE gpucmd_service_shared_buffers_sharer_gone gauge' \
	'gpucmd_service_shared_buffers_sharer_gone{service="infer"} 0' \
	'gpucmd_service_shared_buffers_sharer_gone{service="held"} 0'; do
	printf '%s\n' "$prom" | grep -qxF "$l" || fail "prometheus lacks '$l'"
done
# nobody, in service lowly, sees none of infer's.
gn --service lowly memory-report | grep -q "buffers shared" &&
	fail "nobody sees infer's shared buffers: $(gn --service lowly memory-report)"
gn --service lowly memory-report --json |
	grep -qF '"shared_buffers":0,"shared_buffer_bytes":0,' ||
	fail "nobody's shared buffers: $(gn --service lowly memory-report --json)"
# The sharer goes: model/emb:v1 (its handle alone) goes, weights stays
# with the importer's handle.
exec 6>&-
wait "$sharer" || fail "the sharer exited $?: $(cat "$dir/sharer.err")"
i=0
while :; do
	json=$(g memory-report --json --service infer)
	[ "$(jget infer shared_buffers)" = 1 ] && break
	i=$((i + 1))
	[ $i -gt 200 ] && fail "model/emb:v1 outlived its only handle: $json"
	sleep 0.05
done
[ "$(jget infer shared_buffer_bytes)" = 8 ] || fail "after the sharer left: $json"
printf '%s\n' "$json" | grep -qF "\"shared\":[{\"name\":\"weights\",\"bytes\":8,\"handles\":1,\"connection_id\":$conn,\"sharer_open\":false,\"imports\":1,\"ready\":true,\"lost\":false}]" ||
	fail "weights after the sharer left: $json"
text=$(g memory-report --bytes --service infer)
row=$(printf '%s\n' "$text" | awk '$1 == "infer" && $2 == "weights"' | tr -s ' ')
[ "$row" = " infer weights 8 1 1 connection $conn (gone) yes" ] ||
	fail "weights row after the sharer left '$row': $text"
g memory-report --prometheus |
	grep -qxF 'gpucmd_service_shared_buffers_sharer_gone{service="infer"} 1' ||
	fail "prometheus: weights' sharer is not gone: $(g memory-report --prometheus | grep sharer_gone)"
exec 7>&-
wait "$importer" || fail "the importer exited $?: $(cat "$dir/importer.err")"
i=0
while :; do
	json=$(g memory-report --json --service infer)
	[ "$(jget infer shared_buffers)" = 0 ] && break
	i=$((i + 1))
	[ $i -gt 200 ] && fail "weights outlived its last handle: $json"
	sleep 0.05
done
printf '%s\n' "$json" | grep -qF '"shared":[]}' || fail "infer's list after the last handle: $json"
[ "$(jget infer bytes_in_use)" = 0 ] || fail "infer bytes_in_use after the last handle: $json"
g memory-report | grep -q "buffers shared" &&
	fail "a shared buffers section with none shared: $(g memory-report)"

stop_daemon
exit 0
