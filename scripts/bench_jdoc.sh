#!/bin/sh
# How fast a large JSON input is read (make bench): a scenario that carries an object of N keys
# (default 100,000) under a comment key, predicted with --no-db, against the same scenario without
# it. The difference is the cost of loading those keys (parsing, the duplicate-key check); prints it
# and keys per second.
#   [PX_BIN=build/rel/parallax] scripts/bench_jdoc.sh [N]
set -eu
n=${1:-100000}
px=${PX_BIN:-build/rel/parallax}
[ -x "$px" ] || { echo "$0: $px not built (make $px)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# a small GPT-2 on one GPU: priced in milliseconds, so that loading dominates the difference
scenario() {
	printf '{"model": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, '
	printf '"n_positions": 128, "vocab_size": 1000}, "deepspeed": {"train_batch_size": 8}, '
	printf '"cluster": {"gpu": "H100-SXM", "gpus_per_node": 1}, "seq_length": 128'
}
{ scenario; printf '}\n'; } > "$tmp/plain.json"
{
	scenario
	printf ',\n"_keys": {\n'
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "  \"key_%d\": %d%s\n", i, i,
				 i + 1 < n ? "," : "" }'
	printf '}}\n'
} > "$tmp/keys.json"

now() { date +%s.%N; }
# the best of three runs of each, so that a busy machine's noise counts less
best() {
	b=
	for _ in 1 2 3; do
		t0=$(now)
		"$px" predict --no-db "$1" > /dev/null
		t=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }')
		b=$(awk -v a="${b:-$t}" -v t="$t" 'BEGIN { print (t < a ? t : a) }')
	done
	echo "$b"
}
plain=$(best "$tmp/plain.json")
keys=$(best "$tmp/keys.json")
awk -v n="$n" -v p="$plain" -v k="$keys" -v sz="$(wc -c < "$tmp/keys.json")" 'BEGIN {
	d = k - p; if (d < 1e-4) d = 1e-4
	printf "%d keys (%.1f MiB) loaded in %.3f s (%.3f s with them, %.3f s without): %.0f keys/s\n",
	       n, sz / 1048576, d, k, p, n / d }'
