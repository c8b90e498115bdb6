#!/bin/sh
# Regenerate (or, with --check, verify) every example output quoted in README.md from the current
# binary, so that the README never shows numbers the program no longer prints.
#
# An example is a fenced block right after a marker line naming the command that prints it:
#
#     <!-- example: parallax predict scenarios/llama2-13b-zero3-h100.json | sed -n 1,20p -->
#     ```
#     (the command's stdout, replaced by this script)
#     ```
#
# The command runs with sh from the repository's root, `parallax` being the release binary
# (PARALLAX_BIN, else build/rel/parallax), with a private results database (PARALLAX_DB) in a
# temporary folder that is removed afterwards, so examples never touch results/parallax.db, and
# no CPU profile (PARALLAX_CPU_PROFILE empty), so a machine's calibration changes none of them.
# Output that depends on the machine (timings, rates) is named by a mask:
#
#     <!-- example mask='ms|tokens/s|points/s': parallax run ... -->
#
# Lines matching the mask (an extended regular expression) are compared with every number in
# them replaced by '#' and runs of spaces by one (a wider number shifts the columns): --check
# still sees a line appear, vanish or change its words.
#
# Usage: scripts/readme_examples.sh [--check] [README]
#   (no flag)  rewrite README in place (whole or not at all: written to README.tmp, renamed)
#   --check    rewrite nothing; print the difference and exit 1 when an example is stale
set -eu

check=0
if [ "${1:-}" = "--check" ]; then
	check=1
	shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
readme=${1:-$root/README.md}
bin=${PARALLAX_BIN:-$root/build/rel/parallax}
[ -x "$bin" ] || { echo "readme_examples: $bin not built (make)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
mkdir "$work/bin"
ln -s "$bin" "$work/bin/parallax"
new=$work/README.new

# one pass: copy the README, replacing each example block's body by its command's output
n=0
in_block=0
: > "$new"
while IFS= read -r line || [ -n "$line" ]; do
	if [ $in_block = 1 ]; then # skipping the old body until the closing fence
		case $line in '```'*)
			printf '%s\n' "$line" >> "$new"
			in_block=0 ;;
		esac
		continue
	fi
	printf '%s\n' "$line" >> "$new"
	case $line in
	'<!-- example'*' -->') ;;
	*) continue ;;
	esac
	n=$((n + 1))
	cmd=${line#*: }
	cmd=${cmd% -->}
	mask=
	case $line in "<!-- example mask='"*)
		mask=${line#"<!-- example mask='"}
		mask=${mask%%"':"*} ;;
	esac
	printf '%s\n' "$mask" > "$work/mask.$n"
	IFS= read -r fence || { echo "readme_examples: $readme: example $n: no block after the marker" >&2; exit 1; }
	case $fence in '```'*) ;; *)
		echo "readme_examples: $readme: example $n ($cmd): the line after the marker must open a fenced block" >&2
		exit 1 ;;
	esac
	printf '%s\n' "$fence" >> "$new"
	# no machine's CPU profile (results/cpu-profile.json): the examples are the same everywhere
	if ! (cd "$root" && PATH="$work/bin:$PATH" PARALLAX_DB="$work/examples.db" \
		PARALLAX_CPU_PROFILE= sh -c "$cmd" < /dev/null) > "$work/out.$n" 2> "$work/err.$n"; then
		echo "readme_examples: example $n failed: $cmd" >&2
		sed 's/^/  /' "$work/err.$n" >&2
		exit 1
	fi
	cat "$work/out.$n" >> "$new"
	in_block=1
done < "$readme"
[ $in_block = 0 ] || { echo "readme_examples: $readme: an example block is not closed" >&2; exit 1; }

if [ $check = 0 ]; then
	cp "$new" "$readme.tmp" && mv "$readme.tmp" "$readme"
	echo "readme_examples: $n example(s) regenerated in $readme"
	exit 0
fi

# --check: mask both sides' volatile lines, example by example, then compare the whole text
masked() { # masked FILE: the README with each example's masked lines' numbers replaced
	awk -v dir="$work" '
		function load(i,   f) { f = dir "/mask." i; mask = ""; getline mask < f; close(f) }
		/^<!-- example.* -->$/ { i++; load(i); print; getline; print; body = 1; next }
		body && /^```/ { body = 0; print; next }
		body && mask != "" && $0 ~ mask { gsub(/[0-9]+([.][0-9]+)?(e[-+]?[0-9]+)?/, "#"); gsub(/ +/, " ") }
		{ print }' "$1"
}
masked "$readme" > "$work/old.masked"
masked "$new" > "$work/new.masked"
if ! diff -u "$work/old.masked" "$work/new.masked" > "$work/diff"; then
	echo "readme_examples: $readme has stale examples (run scripts/readme_examples.sh):" >&2
	cat "$work/diff" >&2
	exit 1
fi
echo "readme_examples: all $n example(s) in $readme match the binary"
