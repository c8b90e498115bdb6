#!/bin/sh
# Fit the time model's two calibrated figures on the calibration runs only (docs/time_model.md,
# "Against published runs"; the split is scenarios/published/manifest.json's):
# compute.elementwise_forward (one figure for every GPU, backward twice it) by grid, and for each
# grid point compute.sustained per GPU by scripts/fit_sustained.sh on
#   A100: the 39 runs of MosaicML's "A100 40GB" table (source mosaicml-a100-40gb)
#   H100: the 20 runs of its "H100 80GB BF16" table, 8-64 GPUs (source mosaicml-h100)
# Prints, per grid point, each GPU's sustained and mean |error|, and the point with the lowest
# mean |error| over all 59 runs. The other tables and the Megatron, BLOOM and MT-NLG runs stay held
# out. About 12 minutes on a 2-core machine.
#   scripts/fit_time_model.sh [F...]     (default grid: 2 3 3.5 4 4.5 5)
set -eu
here=$(dirname "$0")
root=$here/..
manifest=$root/scenarios/published/manifest.json
# the calibration runs of one source in the manifest (one run per line), as paths
calibration() {
	grep "\"source\": \"$1\", \"split\": \"calibration\"" "$manifest" |
		sed -n "s|.*\"scenario\": \"\([^\"]*\)\".*|$root/\1|p"
}
a100=$(calibration mosaicml-a100-40gb)
h100=$(calibration mosaicml-h100)
[ -n "$a100" ] && [ -n "$h100" ] || { echo "$0: calibration runs not found in $manifest" >&2; exit 2; }
grid=${*:-2 3 3.5 4 4.5 5}
tmp=$(mktemp); out=$(mktemp); trap 'rm -f "$tmp" "$out"' EXIT
printf '# %-11s %-26s %-26s %s\n' elementwise "A100-40GB sustained, error" "H100-SXM sustained, error" "all runs"
fit() { # GPU SCENARIO...: "GPU k mean_abs_error runs" at elementwise $f, or exit on failure
	ELEMENTWISE=$f sh "$here/fit_sustained.sh" "$@" > "$out" || exit 1
	sed -n 's/^# fit //p' "$out"
}
for f in $grid; do
	# shellcheck disable=SC2086 # the file lists split on purpose
	a=$(fit A100-40GB $a100) || exit 1
	# shellcheck disable=SC2086
	h=$(fit H100-SXM $h100) || exit 1
	echo "$f $a $h" | awk '{ printf "  %-11s %-8s %5.2f%% (%d runs)    %-8s %5.2f%% (%d runs)    %5.2f%%\n",
		$1, $3, 100 * $4, $5, $7, 100 * $8, $9, 100 * ($4 * $5 + $8 * $9) / ($5 + $9) }' | tee -a "$tmp"
done
sort -k10 -n "$tmp" | head -n 1 | awk '{ printf "# lowest mean |error| over both tables: elementwise_forward %s (backward %s), sustained A100 %s, H100 %s\n", $1, 2 * $1, $2, $6 }'
