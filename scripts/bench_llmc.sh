#!/bin/sh
# The CPU executor's training speed on GPT-2 124M in fp32 (make bench), at 1 and 2 threads, and
# beside it llm.c's CPU reference trainer (train_gpt2.c) at the same batch, sequence and thread
# count when an llm.c build directory is given. B = 4, T = 64: train_gpt2.c's own (fixed in its
# main). Each figure is the median step time of the steady steps: the executor's first step and
# llm.c's step 0 (warm-up: first touch of every buffer) are left out. tokens/s = B T / that median.
#
#   [PX_BIN=build/rel/parallax] [BENCH_STEPS=6] scripts/bench_llmc.sh [LLMC_DIR]
#
# LLMC_DIR: a directory where llm.c's train_gpt2 is built (`make train_gpt2` there; its code is
# not ours and stays out of this repository). Its inputs, a random-weight GPT-2 124M checkpoint
# and token files in llm.c's formats, are written there by scripts/llmc_files.c when missing.
# Threads: OPENBLAS_NUM_THREADS for the executor (its kernels use OpenBLAS's count,
# kernels/par_cpu.h), OMP_NUM_THREADS for llm.c. The pairs run one after the other, executor
# first, so the ratio at each thread count comes from one stretch of the machine's load.
set -eu
px=${PX_BIN:-build/rel/parallax}
steps=${BENCH_STEPS:-6}
llmc=${1:-}
[ -x "$px" ] || { echo "$0: $px not built (make $px)" >&2; exit 2; }
[ "$steps" -ge 2 ] || { echo "$0: BENCH_STEPS must be at least 2, got $steps" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
B=4 T=64

# median of the numbers on stdin, one a line
median() {
	sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan";
		else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# the executor: GPT-2 124M (the bundled CUDA scenario's model) in fp32 on the CPU, B x T a step,
# AdamW without clipping as train_gpt2.c; prints the median steady step in ms, and the steps
# into $tmp/px.$1
px_run() {
	OPENBLAS_NUM_THREADS=$1 "$px" run scenarios/gpt2-124m-cuda.json --backend cpu --no-db \
		--steps "$steps" --set deepspeed.bf16.enabled=false \
		--set deepspeed.train_batch_size=$B --set deepspeed.train_micro_batch_size_per_gpu=$B \
		--set seq_length=$T --set deepspeed.gradient_clipping=0 > "$tmp/px.out.$1" 2>&1 ||
		{ cat "$tmp/px.out.$1" >&2; echo "$0: parallax run failed" >&2; exit 1; }
	awk '$1 == "step" { for (i = 2; i <= NF; i++) if ($i == "ms") print $2, $(i - 1) }' \
		"$tmp/px.out.$1" > "$tmp/px.$1"
	awk '$1 > 1 { print $2 }' "$tmp/px.$1" | median
}

# llm.c at $1 threads until its step $steps; prints the median of steps 1.. in ms (step 0 left
# out), the steps into $tmp/llmc.$1. Stopped as soon as the last step is printed: its main goes
# on to 40 steps with sampling in between.
llmc_run() {
	out="$tmp/llmc.out.$1"
	(cd "$llmc" && OMP_NUM_THREADS=$1 exec stdbuf -oL ./train_gpt2) > "$out" 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null && ! grep -q "^step $steps:" "$out"; do
		sleep 1
	done
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	grep -q "^step $steps:" "$out" ||
		{ cat "$out" >&2; echo "$0: llm.c's train_gpt2 stopped early" >&2; exit 1; }
	sed -n 's/^step \([0-9]*\): .*(took \([0-9.]*\) ms).*/\1 \2/p' "$out" > "$tmp/llmc.$1"
	awk '$1 > 0 { print $2 }' "$tmp/llmc.$1" | median
}

if [ -n "$llmc" ]; then
	[ -x "$llmc/train_gpt2" ] ||
		{ echo "$0: $llmc/train_gpt2 not built (make train_gpt2 in $llmc)" >&2; exit 2; }
	gen=${BUILD:-build}/bench/llmc_files
	mkdir -p "$(dirname "$gen")"
	cc -O2 -o "$gen" scripts/llmc_files.c -lm
	"$gen" "$llmc" 2> "$tmp/gen.err" || { cat "$tmp/gen.err" >&2; exit 1; }
fi

echo "# GPT-2 124M fp32, B $B x T $T, AdamW; median of steps 2-$steps (executor) and 1-$steps (llm.c)"
echo "# $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# malloc environment: $(env | grep '^MALLOC_' | tr '\n' ' ')"
printf '%-8s %12s %12s %14s %14s %8s\n' threads px_step_ms px_tokens/s llmc_step_ms \
	llmc_tokens/s ratio
for th in 1 2; do
	p=$(px_run $th)
	l=nan
	[ -z "$llmc" ] || l=$(llmc_run $th)
	awk -v th=$th -v p="$p" -v l="$l" -v bt=$((B * T)) 'BEGIN {
		if (l == "nan")
			printf "%-8d %12.1f %12.1f %14s %14s %8s\n", th, p, bt * 1000 / p, "-", "-", "-"
		else
			printf "%-8d %12.1f %12.1f %14.1f %14.1f %8.2f\n", th, p, bt * 1000 / p, l,
			       bt * 1000 / l, l / p }'
	echo "# steps (ms), executor at $th: $(awk '{ printf "%.1f ", $2 }' "$tmp/px.$th")"
	[ -z "$llmc" ] ||
		echo "# steps (ms), llm.c at $th: $(awk '{ printf "%.1f ", $2 }' "$tmp/llmc.$th")"
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); ratio: the executor's tokens/s over llm.c's"
[ -z "$llmc" ] || echo "# llm.c: $(cat "$llmc/COMMIT" 2>/dev/null || echo "commit unknown") in $llmc; its inputs: $(
	grep -c 'left as it is' "$tmp/gen.err" || true) of 3 files were there, the rest written by scripts/llmc_files.c"
[ -n "$llmc" ] || echo "# llm.c was not given: scripts/bench_llmc.sh LLMC_DIR (make bench LLMC=DIR) runs it beside"
