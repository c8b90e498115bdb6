#!/bin/bash
# The GPU checks of issue 6, in one command for a lent GPU machine (CI has no GPU). Writes under
# OUT (default results/gpu/): what each step printed, the database of every run, the calibration,
# and a summary table. Steps:
#   1. the device, the driver and the toolkit (nvidia-smi, nvcc --version)
#   2. every test suite, the GPU ones included (kernels against the CPU reference, the NCCL and
#      staged backends, the executor on CUDA)
#   3. parallax calibrate: this GPU's hardware profile; with 2+ GPUs also the collectives over
#      NCCL between all of them (the profile's nvlink link)
#   4. ZeRO's claims on one GPU: stages 0-3 at N = 1, 2, 4, 8 ranks sharing it (MPI staged),
#      per-rank memory predicted (with the calibration) against measured, ZeRO's ideal beside
#   5. speed: GPT-2 124M, bf16, sequence 1024, on this executor and in PyTorch eager
# Run from the repository root, after `. gpu-bundle/env.sh` when the machine lacks Debian's
# packages (scripts/gpu_bundle.sh makes gpu-bundle.tar.xz here), e.g. through the device tool,
# carrying gpu-bundle.tar.xz:
#   tar -xJf gpu-bundle.tar.xz && . gpu-bundle/env.sh && bash scripts/gpu_session.sh "$OUT"
set -uo pipefail
OUT=${1:-results/gpu}
BIN=${PX_GPU_BIN:-build/rel}
mkdir -p "$OUT"
DB="$OUT/gpu.db"
log() { echo "== $*" | tee -a "$OUT/session.log"; }

log "1. device"
{ nvidia-smi; nvcc --version; date -u; git rev-parse HEAD; } > "$OUT/device.txt" 2>&1
head -20 "$OUT/device.txt"

log "2. tests"
PX_BIN=$PWD/$BIN/parallax PX_RUN_BIN=$PWD/$BIN/parallax PX_ROOT=$PWD \
	PX_COMM_CHECK=$PWD/$BIN/comm_mpi_check PX_NCCL_CHECK=$PWD/$BIN/comm_nccl_check \
	"$BIN/px_tests" > "$OUT/tests.txt" 2>&1
echo "px_tests exit $?" | tee -a "$OUT/session.log"
grep -E "^ +(suites|tests|asserts)|skipped|# cuda" "$OUT/tests.txt" | tee -a "$OUT/session.log"

log "3. calibrate"
# the executor computes in the parameters' dtype, bf16 in both scenarios below: a bf16
# calibration prices them; fp32's is kept beside it for fp32 scenarios
"$BIN/parallax" calibrate --dtype bf16 --out "$OUT/calibration.json" 2>&1 | tee "$OUT/calibrate.txt"
"$BIN/parallax" calibrate --dtype fp32 --out "$OUT/calibration-fp32.json" 2>&1 |
	tee -a "$OUT/calibrate.txt"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$NGPU" -ge 2 ]; then
	# one rank per GPU over NCCL: the bf16 profile again, with the measured nvlink link
	"$BIN/parallax" calibrate --dtype bf16 --ranks "$NGPU" \
		--out "$OUT/calibration-${NGPU}gpu.json" 2>&1 | tee -a "$OUT/calibrate.txt"
else
	echo "collective calibration needs 2+ GPUs: this machine has $NGPU; the profile's nvlink" \
		"and network links keep the catalog's figures" | tee -a "$OUT/calibrate.txt"
fi

log "4. ZeRO on one GPU: stages 0-3 x N ranks"
for n in 1 2 4 8; do
	for stage in 0 1 2 3; do
		"$BIN/parallax" run scenarios/gpt2-small-cuda.json --backend cuda --comm mpi \
			--hw "$OUT/calibration.json" --ranks "$n" --steps 5 --db "$DB" \
			--set deepspeed.zero_optimization.stage=$stage \
			> "$OUT/zero-s$stage-n$n.txt" 2>&1
		echo "stage $stage ranks $n: exit $?" | tee -a "$OUT/session.log"
	done
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
"$BIN/parallax" plot zero gpt2-small-cuda --db "$DB" --out "$OUT/zero-claims" > /dev/null

log "5. speed: GPT-2 124M bf16, seq 1024"
"$BIN/parallax" run scenarios/gpt2-124m-cuda.json --backend cuda --hw "$OUT/calibration.json" \
	--steps 30 --db "$DB" > "$OUT/speed-parallax.txt" 2>&1
tail -30 "$OUT/speed-parallax.txt"
python3 scripts/bench_gpt2_pytorch.py --batch 8 --seq 1024 --steps 30 --warmup 5 \
	> "$OUT/speed-pytorch.txt" 2>&1
tail -5 "$OUT/speed-pytorch.txt"
