#!/bin/bash
# The GPU checks of issue 6, in one command for a lent GPU machine (CI has no GPU). Writes under
# OUT (default results/gpu/): what each step printed, the database of every run, the calibration,
# and a summary table. Steps:
#   1. the device, the driver and the toolkit (nvidia-smi, nvcc --version)
#   2. the fast GPU test suites (kernels against the CPU reference, the GPT units, sparse
#      attention, the NCCL and staged backends)
#   3. parallax calibrate: this GPU's hardware profile; with 2+ GPUs also the collectives over
#      NCCL between all of them (the profile's nvlink link)
#   4. speed: GPT-2 124M, bf16, sequence 1024, on this executor (priced with the calibration)
#      and in PyTorch eager; PyTorch's host time per kernel (host.kernel_issue_s)
#   5. each kernel's GPU time and the host's CUDA calls over six steps (Nsight Systems), each
#      kernel's in one steady step (Nsight Compute), and every
#      kernel's memory accesses checked (compute-sanitizer memcheck), where they are there
#   6. the executor's GPU suite (losses against the CPU's, memory claims, step time)
#   7. ZeRO's claims on one GPU: stages 0-3 at N = 1, 2, 4, 8 ranks sharing it (MPI staged),
#      per-rank memory predicted (with the calibration) against measured, ZeRO's ideal beside
# A lease is short (minutes), so every command runs under `timeout`, a step that would start
# past PX_GPU_BUDGET_S seconds from the start is skipped and says so, the steps run in the order
# of what they are worth, and after each step everything under OUT is packed into PACK (when
# given), one archive that the device tool brings back even when the lease ends mid-step.
# Run from the repository root, after `. gpu-bundle/env.sh` when the machine lacks Debian's
# packages (scripts/gpu_bundle.sh makes gpu-bundle.tar.xz here), e.g. through the device tool,
# carrying gpu-bundle.tar.xz:
#   tar -xJf gpu-bundle.tar.xz && . gpu-bundle/env.sh &&
#   PX_GPU_BUDGET_S=420 bash scripts/gpu_session.sh /tmp/gpu "$OUT/gpu.tar.gz"
set -uo pipefail
OUT=${1:-results/gpu}
PACK=${2:-}
BIN=${PX_GPU_BIN:-build/rel}
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
BUDGET=${PX_GPU_BUDGET_S:-3600}
START=$(date +%s)
mkdir -p "$OUT"
DB="$OUT/gpu.db"
log() { echo "== $* (at $(($(date +%s) - START)) s)" | tee -a "$OUT/session.log"; }
note() { echo "$*" | tee -a "$OUT/session.log"; }
pack() {
	[ -n "$PACK" ] || return 0
	cp "$OUT/session.log" "$(dirname "$PACK")/session.log" 2>/dev/null
	tar -czf "$PACK.tmp" -C "$OUT" . && mv "$PACK.tmp" "$PACK"
}
# seconds left before the budget; a step needing more than that is skipped
left() { echo $((BUDGET - ($(date +%s) - START))); }
# run CAP CMD...: CMD under a timeout of CAP seconds or what the budget has left, if less
run() {
	local cap=$1 l
	shift
	l=$(left)
	[ "$l" -lt "$cap" ] && cap=$l
	if [ "$cap" -le 5 ]; then
		note "skipped (lease budget spent): $*"
		return 124
	fi
	timeout -k 5 "$cap" "$@"
}
# the test suites' binaries (steps 2 and 6), set whichever steps run (lease 4's step 6 ran
# without them when they were set in step 2)
export PX_BIN=$BIN/parallax PX_RUN_BIN=$BIN/parallax PX_ROOT=$PWD \
	PX_COMM_CHECK=$BIN/comm_mpi_check PX_NCCL_CHECK=$BIN/comm_nccl_check
# PX_GPU_STEPS="1 3 4": only those steps (a second, shorter lease); steps 4, 6 and 7 price
# their runs with step 3's calibration
# suites CAP FILE SUITES: px_tests on those suites into OUT/FILE, its summary and failures logged
suites() {
	PX_SUITE=$3 run "$1" "$BIN/px_tests" > "$OUT/$2" 2>&1
	note "px_tests ($3) exit $?"
	grep -E "^ +(suites|tests|asserts)|skipped|# cuda|FAILED" "$OUT/$2" | head -40 |
		tee -a "$OUT/session.log"
}
HW=()
want() { [ -z "${PX_GPU_STEPS:-}" ] || [[ " $PX_GPU_STEPS " == *" $1 "* ]]; }
# python3 is the machine's own: its libraries, not the bundle's
HOST_LD=${PX_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}

if want 1; then
log "1. device"
{ nvidia-smi; nvcc --version; date -u
  git rev-parse HEAD 2>/dev/null || cat "${BUNDLE_DIR:-gpu-bundle}/REVISION" 2>/dev/null
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$BIN/parallax"; } > "$OUT/device.txt" 2>&1
grep -E "NVIDIA|Driver|release|not found" "$OUT/device.txt" | head -8 | tee -a "$OUT/session.log"
pack

fi
if want 2; then
log "2. GPU tests"
suites 150 tests.txt kernels_cuda,gpt_cuda,sparse,comm-gpu
pack

fi
if want 3; then
log "3. calibrate"
# the executor computes in the parameters' dtype, bf16 in both scenarios below: a bf16
# calibration prices them; fp32's is kept beside it for fp32 scenarios
run 90 "$BIN/parallax" calibrate --dtype bf16 --out "$OUT/calibration.json" \
	> "$OUT/calibrate.txt" 2>&1
note "calibrate bf16 exit $?"
run 90 "$BIN/parallax" calibrate --dtype fp32 --out "$OUT/calibration-fp32.json" \
	>> "$OUT/calibrate.txt" 2>&1
note "calibrate fp32 exit $?"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$NGPU" -ge 2 ]; then
	# one rank per GPU over NCCL: the bf16 profile again, with the measured nvlink link
	run 120 "$BIN/parallax" calibrate --dtype bf16 --ranks "$NGPU" \
		--out "$OUT/calibration-${NGPU}gpu.json" >> "$OUT/calibrate.txt" 2>&1
else
	echo "collective calibration needs 2+ GPUs: this machine has $NGPU; the profile's nvlink" \
		"and network links keep the catalog's figures" >> "$OUT/calibrate.txt"
fi
tail -25 "$OUT/calibrate.txt"
# the runs below are priced as the GPU they run on (the catalog's name the calibration found)
HW=()
GPU=$(sed -n 's/^[[:space:]]*"gpu":[[:space:]]*"\([^"]*\)".*/\1/p' "$OUT/calibration.json" \
	2>/dev/null | head -1)
[ -s "$OUT/calibration.json" ] && HW=(--hw "$OUT/calibration.json")
[ -n "$GPU" ] && HW+=(--set "cluster.gpu=$GPU")
pack

fi
if want 4; then
log "4. speed: GPT-2 124M bf16, seq 1024"
run 120 "$BIN/parallax" run scenarios/gpt2-124m-cuda.json --backend cuda --steps 30 "${HW[@]}" \
	--db "$DB" > "$OUT/speed-parallax.txt" 2>&1
note "parallax run exit $?"
tail -12 "$OUT/speed-parallax.txt" | tee -a "$OUT/session.log"
# the same run with device memory taken the other ways (exec/compute_cuda.c, PX_CUDA_ALLOC):
# what the per-buffer synchronisations of cudaMalloc / cudaFree cost, and what a caching pool holds
for mode in async sync caching; do
	run 60 env PX_CUDA_ALLOC=$mode "$BIN/parallax" run scenarios/gpt2-124m-cuda.json \
		--backend cuda --steps 30 "${HW[@]}" --no-db > "$OUT/speed-parallax-$mode.txt" 2>&1
	note "parallax run, PX_CUDA_ALLOC=$mode: exit $?"
	grep -E "^# step time|^memory.gpu.(device_)?peak_bytes|^memory.gpu.torch" \
		"$OUT/speed-parallax-$mode.txt" | tee -a "$OUT/session.log"
done
run 120 env LD_LIBRARY_PATH="$HOST_LD" python3 scripts/bench_gpt2_pytorch.py --batch 8 \
	--seq 1024 --steps 30 --warmup 5 > "$OUT/speed-pytorch.txt" 2>&1
note "pytorch exit $?"
tail -5 "$OUT/speed-pytorch.txt" | tee -a "$OUT/session.log"
# the host's time per kernel in PyTorch eager: what host.kernel_issue_s assumes (10 us)
run 60 env LD_LIBRARY_PATH="$HOST_LD" python3 scripts/bench_torch_dispatch.py --reps 200 \
	> "$OUT/torch-dispatch.txt" 2>&1
note "torch dispatch exit $?"
tail -5 "$OUT/torch-dispatch.txt" | tee -a "$OUT/session.log"
pack

fi
if want 5; then
log "5. where the executor's step goes: each kernel's GPU time (Nsight Systems, Nsight Compute)"
# Nsight Systems first: no kernel replay (ncu's failed on a kernel in leases 2 and 3), and it
# sees the host's side too, so the gaps between kernels (synchronisations, allocations) show in
# the CUDA API summary beside each kernel's total
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
	2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
	run 90 "$NSYS" profile --trace cuda --sample none --cpuctx-switch none --force-overwrite true \
		-o "$OUT/nsys-gpt2-124m" "$BIN/parallax" run scenarios/gpt2-124m-cuda.json \
		--backend cuda --steps 6 --no-db > "$OUT/nsys.txt" 2>&1
	note "nsys exit $?"
	run 60 "$NSYS" stats --report cuda_gpu_kern_sum --report cuda_api_sum --format csv \
		--force-export true -o "$OUT/nsys" "$OUT/nsys-gpt2-124m.nsys-rep" >> "$OUT/nsys.txt" 2>&1
	note "nsys stats exit $?"
	head -12 "$OUT"/nsys_cuda_api_sum.csv 2>/dev/null | cut -c1-160 | tee -a "$OUT/session.log"
else
	note "no nsys on this machine"
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
	# step 3 alone (PX_CUDA_PROFILE_STEP brackets it with cudaProfilerStart/Stop): the warm-up
	# step's first-touch casts and cuBLAS's first choices left out
	run 150 env PX_CUDA_PROFILE_STEP=3 "$NCU" --profile-from-start off --clock-control none \
		--metrics gpu__time_duration.sum --csv --page raw \
		"$BIN/parallax" run scenarios/gpt2-124m-cuda.json --backend cuda --steps 3 --no-db \
		> "$OUT/ncu-gpt2-124m.csv" 2> "$OUT/ncu.err"
	note "ncu exit $? ($(grep -c '^"[0-9]' "$OUT/ncu-gpt2-124m.csv") kernels)"
	grep -E "==ERROR==" "$OUT/ncu.err" "$OUT/ncu-gpt2-124m.csv" | head -3 | tee -a "$OUT/session.log"
else
	note "no ncu on this machine"
fi
# every kernel's memory accesses checked once, on a 2-block model (lease 2's ncu failed on
# attention_softmax_backward_kernel: a fault there would show here)
SAN=$(command -v compute-sanitizer ||
	ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
	run 120 "$SAN" --tool memcheck --error-exitcode 9 "$BIN/parallax" run \
		scenarios/gpt2-small-cuda.json --backend cuda --steps 2 --no-db \
		--set model.n_layer=2 --set seq_length=128 > "$OUT/memcheck.txt" 2>&1
	note "compute-sanitizer memcheck exit $?"
	grep -E "ERROR SUMMARY|Invalid|========= " "$OUT/memcheck.txt" | head -8 |
		tee -a "$OUT/session.log"
else
	note "no compute-sanitizer on this machine"
fi
pack

fi
if want 6; then
log "6. the executor's GPU suite: losses against the CPU's, memory claims, step time"
# after the measurements above: its dozens of runs passed on lease 2 but the step time, and a
# lease that runs short should lose them rather than the kernel breakdown
suites 240 tests-exec.txt exec_cuda
pack

fi
if want 7; then
log "7. ZeRO on one GPU: stages 0-3 x N ranks"
for n in 1 2 4 8; do
	for stage in 0 1 2 3; do
		# device memory buffer by buffer (PX_CUDA_ALLOC=sync), so that the device's reading
		# is the buffers' own, not a pool's reserve beside them (exec/compute_cuda.c)
		run 60 env PX_CUDA_ALLOC=sync "$BIN/parallax" run scenarios/gpt2-small-cuda.json \
			--backend cuda --comm mpi \
			"${HW[@]}" --ranks "$n" --steps 5 --db "$DB" \
			--set deepspeed.zero_optimization.stage=$stage \
			> "$OUT/zero-s$stage-n$n.txt" 2>&1
		note "stage $stage ranks $n: exit $?"
	done
	pack
done
{
	printf '# per-rank GPU memory, rank 0: predicted peak (calibrated) vs the device'"'"'s reading\n'
	printf '%-6s %-6s %16s %16s %9s\n' stage ranks predicted_bytes measured_bytes error
	for n in 1 2 4 8; do
		for stage in 0 1 2 3; do
			awk -v s=$stage -v n=$n '$1 == "memory.gpu.device_peak_bytes" {
				printf "%-6s %-6s %16s %16s %9s\n", s, n, $2, $3, $4 }' \
				"$OUT/zero-s$stage-n$n.txt"
		done
	done
} | tee "$OUT/zero-claims.txt"
run 30 "$BIN/parallax" plot zero gpt2-small-cuda --db "$DB" --out "$OUT/zero-claims" > /dev/null
fi
log "done in $(($(date +%s) - START)) s"
pack
