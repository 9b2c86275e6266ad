#!/bin/sh
# man_flags.sh - the documentation says what the programs do, both ways:
#   - every flag (long and short) that `gpucmdd --help` prints is in
#     gpucmdd(8), and every flag gpucmdd(8) names is in --help;
#   - the same for gpucmd(1) against `gpucmd --help` and each
#     `gpucmd COMMAND --help`; every command has its own subsection, which
#     names each of that command's flags;
#   - every configuration key daemon/config.c accepts is in gpucmdd.conf(5)
#     and in packaging/gpucmdd.conf.example, and the example is valid both as
#     shipped and with every line uncommented (gpucmdd --check-config);
#   - every operation of proto/gpucmd.proto (name and field number), every
#     Frame kind and every GPUCMD_E* code with its number is in
#     gpucmd-protocol(7);
#   - the bash completion offers every command and flag;
#   - `mandoc -Tlint` finds nothing in man/ (when mandoc is installed;
#     "referenced manual not found" is ignored: pages of this tree and of
#     other packages need not be installed here).
set -u
BUILD=${BUILD:-build}
dir=$(mktemp -d /tmp/gpucmd-manflags-XXXXXX)
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	rm -rf "$dir"
}
trap cleanup EXIT
problems=0
bad() {
	echo "FAIL: $*"
	problems=$((problems + 1))
}
for b in gpucmdd gpucmd; do
	[ -x "$BUILD/$b" ] || { echo "FAIL: $BUILD/$b is missing: run make first"; exit 1; }
done

# Flags a --help text offers: those of its usage lines, and the leading
# ones of its option lines ("  -c, --count N  text"), not flags that a
# description mentions in passing.
help_flags() {
	awk '/^usage:/ || (u && /^[ \t]+(\[|gpucmd)/) { u = 1; print; next }
		{ u = 0 }
		/^[ \t]+-/ {
			n = split($0, w, /[ \t,]+/)
			for (i = 1; i <= n; i++)
				if (w[i] ~ /^-/) print w[i]
				else if (w[i] != "") break
		}' |
		grep -oE '(^|[^[:alnum:]_-])--?[[:alpha:]][[:alnum:]-]*' |
		sed -E 's/^[^-]*//' | sort -u
}

# Flags in mdoc source (stdin): the arguments of Fl, "Fl -name" being
# --name and "Fl c" -c, including "Fl h | -help" chains.
man_flags() {
	awk '/^\./ {
		n = split($0, w, /[ \t]+/)
		infl = 0
		for (i = 1; i <= n; i++) {
			t = w[i]
			if (i == 1) sub(/^\./, "", t)
			if (t == "Fl") { infl = 1; continue }
			if (!infl || t == "|") continue
			if (t ~ /^-[A-Za-z][A-Za-z0-9-]*$/) print "-" t
			else if (t ~ /^[A-Za-z]$/) print "-" t
			else infl = 0
		}
	}' | sort -u
}

# The text of subsection NAME (.Ss NAME up to the next .Ss or .Sh).
subsection() {
	awk -v name="$2" '
		/^\.S[sh] / { on = ($1 == ".Ss" && $2 == name && NF == 2) ; next }
		on' "$1"
}

# compare WHAT A B: report lines of A missing from B.
missing() {
	comm -23 "$2" "$3" | while read -r f; do
		echo "FAIL: $1: $f"
	done
	[ -z "$(comm -23 "$2" "$3")" ]
}

# ---- gpucmdd(8) -------------------------------------------------------------
# The test suite's fault flags: in gpucmdd(8), said to be left out of --help.
{ "$BUILD/gpucmdd" --help | help_flags
  printf '%s\n' --test-fail-alloc-at --test-compile-delay-ms; } |
	sort -u >"$dir/d.help"
man_flags <man/gpucmdd.8 >"$dir/d.man"
[ -s "$dir/d.help" ] || bad "no flags found in gpucmdd --help"
missing "in gpucmdd --help but not in man/gpucmdd.8" "$dir/d.help" "$dir/d.man" ||
	problems=$((problems + 1))
missing "in man/gpucmdd.8 but not in gpucmdd --help" "$dir/d.man" "$dir/d.help" ||
	problems=$((problems + 1))

# ---- gpucmd(1) --------------------------------------------------------------
"$BUILD/gpucmd" --help >"$dir/g.txt"
commands=$(sed -n '/^commands:/,/^$/p' "$dir/g.txt" | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p')
[ -n "$commands" ] || bad "no commands found in gpucmd --help"
help_flags <"$dir/g.txt" >"$dir/g.help"
for c in $commands; do
	"$BUILD/gpucmd" "$c" --help >"$dir/c.txt" 2>&1 ||
		bad "gpucmd $c --help exited $?"
	help_flags <"$dir/c.txt" >"$dir/c.$c"
	cat "$dir/c.$c" >>"$dir/g.help"
	grep -qx "\.Ss $c" man/gpucmd.1 || bad "man/gpucmd.1 has no subsection '.Ss $c'"
	subsection man/gpucmd.1 "$c" | man_flags >"$dir/s.man"
	grep -vxE -- '-h|--help' "$dir/c.$c" >"$dir/c.need"
	missing "gpucmd $c --help names it but the '$c' subsection of man/gpucmd.1 does not" \
		"$dir/c.need" "$dir/s.man" || problems=$((problems + 1))
done
sort -u "$dir/g.help" -o "$dir/g.help"
man_flags <man/gpucmd.1 >"$dir/g.man"
missing "in gpucmd --help output but not in man/gpucmd.1" "$dir/g.help" "$dir/g.man" ||
	problems=$((problems + 1))
missing "in man/gpucmd.1 but in no gpucmd --help output" "$dir/g.man" "$dir/g.help" ||
	problems=$((problems + 1))

# ---- the bash completion ----------------------------------------------------
comp=packaging/bash-completion/gpucmd
for w in $commands $(cat "$dir/g.help"); do
	grep -qE -- "(^|[ \"])$w([ \"]|$)" "$comp" || bad "$comp does not offer '$w'"
done

# ---- gpucmdd.conf(5) and the example -----------------------------------------
# Keys are what the parser matches with strcmp(name, "key") == 0, plus
# default_KEY for each key of a service section (service_key()); sections
# are strcmp(section, "name").
{
	grep -oE 'strcmp\(name, "[a-z_]+"\) == 0' daemon/config.c | sed -E 's/.*"(.*)".*/\1/'
	sed -n '/^static int service_key(/,/^}/p' daemon/config.c |
		grep -oE 'strcmp\(name, "[a-z_]+"\) == 0' | sed -E 's/.*"(.*)".*/default_\1/'
} | sort -u >"$dir/keys"
[ -s "$dir/keys" ] || bad "no configuration keys found in daemon/config.c"
grep -oE 'strcmp\(section, "[a-z]+"\)' daemon/config.c | sed -E 's/.*"(.*)".*/\1/' |
	sort -u >"$dir/sections"
while read -r sec; do
	grep -qxF ".Sh THE [$sec] SECTION" man/gpucmdd.conf.5 || bad "section [$sec] has no '.Sh THE [$sec] SECTION' in man/gpucmdd.conf.5"
	grep -qE "^;?\[$sec\]" packaging/gpucmdd.conf.example || bad "section [$sec] is not in packaging/gpucmdd.conf.example"
done <"$dir/sections"
while read -r k; do
	grep -qE "^\.It Cm $k( |\$)" man/gpucmdd.conf.5 || bad "key '$k' is not an item of man/gpucmdd.conf.5"
	grep -qE "^;?$k =" packaging/gpucmdd.conf.example || bad "key '$k' is not in packaging/gpucmdd.conf.example"
done <"$dir/keys"
"$BUILD/gpucmdd" --config packaging/gpucmdd.conf.example --check-config >"$dir/out" 2>&1 ||
	bad "the example config as shipped: $(cat "$dir/out")"
sed 's/^;//' packaging/gpucmdd.conf.example >"$dir/all.conf"
"$BUILD/gpucmdd" --config "$dir/all.conf" --check-config >"$dir/out" 2>&1 ||
	bad "the example config with every key set: $(cat "$dir/out")"

# ---- gpucmd-protocol(7) ------------------------------------------------------
proto=proto/gpucmd.proto
page=man/gpucmd-protocol.7
sed -n '/^message Op {/,/^}/p' "$proto" |
	sed -nE 's/^ *Op[A-Za-z]+ ([a-z_]+) = ([0-9]+);.*/\1 \2/p' >"$dir/ops"
[ -s "$dir/ops" ] || bad "no operations found in $proto"
while read -r name num; do
	grep -qxF ".It Cm $name Pq $num" "$page" || bad "op '$name = $num' is not described in $page"
done <"$dir/ops"
sed -n '/^message Frame {/,/^}/p' "$proto" |
	sed -nE 's/^ *([A-Z][A-Za-z]+ [a-z_]+ = [0-9]+);.*/\1/p' >"$dir/frames"
while read -r f; do
	grep -qF "$f;" "$page" || bad "Frame field '$f' is not in $page"
done <"$dir/frames"
sed -nE 's/^[[:space:]]*(GPUCMD_E[A-Z]+) = -([0-9]+),.*/\1 \2/p' include/gpucmd.h >"$dir/codes"
[ -s "$dir/codes" ] || bad "no error codes found in include/gpucmd.h"
while read -r name num; do
	grep -qxF ".It Dv $name Pq \\-$num" "$page" || bad "error $name (-$num) is not in $page"
done <"$dir/codes"

# ---- mandoc -Tlint ------------------------------------------------------------
if command -v mandoc >/dev/null; then
	mandoc -Tlint -W style man/*.[1-8] 2>&1 |
		grep -v -e 'referenced manual not found' -e 'mandoc.db' >"$dir/lint"
	if [ -s "$dir/lint" ]; then
		bad "mandoc -Tlint:"
		sed 's/^/    /' "$dir/lint"
	fi
else
	echo "note: mandoc is not installed; man pages not linted"
fi

[ "$problems" -eq 0 ] || exit 1
echo "ok: flags, commands, keys, ops and codes documented; completion complete; lint clean"
exit 0
