#!/bin/sh
# Fit a hardware profile's compute.sustained (docs/time_model.md, "Against published runs") on
# published runs: the k for which the predicted tokens/s of the given scenarios are right on
# average (geometric mean of predicted/published = 1), by bisection on [0.3, 1].
#   [ELEMENTWISE=F] scripts/fit_sustained.sh GPU SCENARIO...
# Each scenario carries "_published": {"tokens_per_s_per_gpu": X}. Prints k and each run's error
# at k, and last a line "# fit GPU k mean_abs_error runs". With ELEMENTWISE set, the profile's
# compute.elementwise_forward is F and elementwise_backward 2F during the fit (what
# scripts/fit_time_model.sh varies). The held-out runs must not be among the scenarios: the fit
# would no longer be judged by runs it has not seen.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 GPU SCENARIO..." >&2; exit 2; }
gpu=$1; shift
px=${PX_BIN:-build/rel/parallax}
[ -x "$px" ] || { echo "$0: $px not built (make $px)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# the published tokens/s per GPU of a scenario
published() {
	sed -n 's/.*"tokens_per_s_per_gpu":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$1" | head -n 1
}

# one line per scenario: name, published and predicted tokens/s per GPU at sustained = $1
predict_all() {
	ew=
	if [ -n "${ELEMENTWISE:-}" ]; then
		ew=$(awk -v f="$ELEMENTWISE" 'BEGIN {
			printf ", \"elementwise_forward\": %s, \"elementwise_backward\": %s", f, 2 * f }')
	fi
	printf '{"gpu": "%s", "compute": {"sustained": %s%s}}\n' "$gpu" "$1" "$ew" > "$tmp/hw.json"
	for sc in $scenarios; do
		pub=$(published "$sc")
		[ -n "$pub" ] || { echo "$0: $sc: no _published.tokens_per_s_per_gpu" >&2; exit 2; }
		"$px" predict "$sc" --hw "$tmp/hw.json" --json --no-db > "$tmp/p.json"
		tps=$(sed -n 's/.*"tokens_per_s":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$tmp/p.json" | head -n 1)
		world=$(sed -n 's/.*"world_size":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/p.json" | head -n 1)
		echo "$(basename "$sc" .json) $pub $tps $world"
	done
}

scenarios="$*"
lo=0.3 hi=1
i=0
while [ $i -lt 20 ]; do # 0.7 / 2^20: well under the 0.001 printed
	mid=$(awk -v a=$lo -v b=$hi 'BEGIN { printf "%.6f", (a + b) / 2 }')
	bias=$(predict_all "$mid" | awk '{ s += log($3 / $4 / $2) } END { print (s > 0) }')
	if [ "$bias" = 1 ]; then hi=$mid; else lo=$mid; fi
	i=$((i + 1))
done
k=$(awk -v a=$lo -v b=$hi 'BEGIN { printf "%.3f", (a + b) / 2 }')
echo "# $gpu: sustained $k, fitted on $# runs; error of predicted tokens/s per GPU at $k:"
predict_all "$k" | awk '{ e = $3 / $4 / $2 - 1; m += (e < 0 ? -e : e); printf "%-40s %+6.1f%%\n", $1, 100 * e }
	END { printf "# mean |error| %.1f%%\n", 100 * m / NR; printf "# fit %s %s %.4f %d\n", gpu, k, m / NR, NR }' gpu="$gpu" k="$k"
