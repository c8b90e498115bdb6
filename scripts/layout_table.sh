#!/bin/sh
# The executor's layouts measured against predicted, one row per layout, from `parallax compare`
# on runs of the bundled CPU scenario (README's "Real executor" table; readme_examples.sh runs it).
# Each run trains 3 steps into a private database; compare gives every metric's largest relative
# error over the ranks, and a row shows the worst of each kind:
#   categories  memory by category as requested under the schedule's labels (memory.*.X_bytes)
#   pool peak   the CPU backend's pool high-water against the predicted peak (memory.*.peak_bytes),
#               and the NVMe swap files' disk blocks (memory.nvme.bytes)
#   comm        issued bytes per collective kind (comm.*_bytes but the wire), and the bytes read
#               from and written to the NVMe swap files (copy.nvme_*_bytes)
#   wire        bytes the transport sent, counted message by message (comm.wire_bytes)
# A layout the executor refuses shows the refusal instead.
#
# Usage: scripts/layout_table.sh   (parallax on PATH, or PARALLAX_BIN)
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PARALLAX_BIN:-parallax}
scn=$root/scenarios/gpt2-mini-cpu-zero3.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

printf '%-50s %5s %11s %10s %9s %9s\n' layout ranks categories "pool peak" comm wire
row() { # NAME RANKS SETTINGS...
	name=$1 ranks=$2
	shift 2
	db=$work/run.db
	rm -f "$db"
	if ! "$bin" run "$scn" --ranks "$ranks" --steps 3 --db "$db" "$@" > "$work/out" 2>&1; then
		why=$(grep -m1 'the executor runs' "$work/out" | sed 's/.*: the executor runs/runs/')
		printf '%-50s %5s refused: it %s\n' "$name" "$ranks" "${why:-failed}"
		return
	fi
	"$bin" compare --db "$db" | awk -v name="$name" -v ranks="$ranks" '
		function worse(a, b) { return a > b ? a : b }
		/^# measured, not predicted/ { done = 1 }
		done || !/^(memory|comm|copy)[.]/ { next }
		{ e = $5; sub("%", "", e); e += 0 }
		/^memory[.].*[.]peak_bytes |^memory[.]nvme[.]bytes / { peak = worse(peak, e); next }
		/^memory[.]/ { cat = worse(cat, e); next }
		/^comm[.]wire_bytes / { wire = worse(wire, e); next }
		{ comm = worse(comm, e) }
		END { printf "%-50s %5s %10.4f%% %9.2f%% %8.4f%% %8.4f%%\n", name, ranks, cat, peak, comm, wire }'
}

row "dp 4, ZeRO-3, bf16" 4
row "dp 4, ZeRO-0, bf16 (BF16_Optimizer)" 4 --set deepspeed.zero_optimization.stage=0
row "dp 4, ZeRO-2, bf16, optimizer offload" 4 \
	--set deepspeed.zero_optimization.stage=2 \
	--set deepspeed.zero_optimization.offload_optimizer.device=cpu
row "dp 4, ZeRO-2, bf16, non-contiguous gradients" 4 \
	--set deepspeed.zero_optimization.stage=2 \
	--set deepspeed.zero_optimization.contiguous_gradients=false
row "dp 4, ZeRO-3, bf16, non-contiguous gradients" 4 \
	--set deepspeed.zero_optimization.contiguous_gradients=false
row "dp 4, ZeRO-3, bf16, optimizer+param offload" 4 \
	--set deepspeed.zero_optimization.offload_optimizer.device=cpu \
	--set deepspeed.zero_optimization.offload_param.device=cpu
mkdir "$work/nvme"
row "dp 4, ZeRO-3, bf16, optimizer on NVMe (files)" 4 \
	--set deepspeed.zero_optimization.offload_optimizer.device=nvme \
	--set deepspeed.zero_optimization.offload_optimizer.nvme_path="$work/nvme"
row "dp 4, ZeRO-3, bf16, params past max_in_cpu on NVMe" 4 \
	--set deepspeed.zero_optimization.offload_optimizer.device=nvme \
	--set deepspeed.zero_optimization.offload_optimizer.nvme_path="$work/nvme" \
	--set deepspeed.zero_optimization.offload_param.device=nvme \
	--set deepspeed.zero_optimization.offload_param.nvme_path="$work/nvme" \
	--set deepspeed.zero_optimization.sub_group_size=50000 \
	--set deepspeed.zero_optimization.offload_param.max_in_cpu=100000 \
	--set deepspeed.zero_optimization.offload_param.buffer_size=100000
row "tp 2 x dp 2, ZeRO-1, fp32" 4 --set parallelism.tp=2 \
	--set deepspeed.zero_optimization.stage=1 --set deepspeed.bf16.enabled=false
row "tp 2 x dp 2, sequence parallel, ZeRO-1, fp32" 4 --set parallelism.tp=2 \
	--set parallelism.sequence_parallel=true --set deepspeed.zero_optimization.stage=1 \
	--set deepspeed.bf16.enabled=false
row "tp 2 x dp 2, sequence parallel, ZeRO-1, bf16" 4 --set parallelism.tp=2 \
	--set parallelism.sequence_parallel=true --set deepspeed.zero_optimization.stage=1
row "tp 2 x dp 2, ZeRO-3, fp32, optimizer+param offload" 4 --set parallelism.tp=2 \
	--set deepspeed.bf16.enabled=false \
	--set deepspeed.zero_optimization.offload_optimizer.device=cpu \
	--set deepspeed.zero_optimization.offload_param.device=cpu
row "tp 4, ZeRO-0, fp32, full recompute" 4 --set parallelism.tp=4 \
	--set deepspeed.zero_optimization.stage=0 --set deepspeed.bf16.enabled=false \
	--set activation_checkpointing=full
row "tp 2 x pp 2 x dp 2, 1F1B, ZeRO-1, fp32" 8 --set parallelism.tp=2 \
	--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1 \
	--set deepspeed.bf16.enabled=false
row "tp 2 x pp 2 x dp 2, 1F1B, ZeRO-1, bf16" 8 --set parallelism.tp=2 \
	--set parallelism.pp=2 --set deepspeed.zero_optimization.stage=1
row "pp 2 x dp 2, 1F1B, ZeRO-1, bf16" 4 --set parallelism.pp=2 \
	--set deepspeed.zero_optimization.stage=1
row "pp 4, GPipe, ZeRO-0, bf16" 4 --set parallelism.pp=4 \
	--set parallelism.pipeline_schedule=gpipe --set deepspeed.zero_optimization.stage=0
row "ep 2 (MoE, 4 experts top-2), ZeRO-2, fp32" 2 --set moe.num_experts=4 --set moe.k=2 \
	--set parallelism.ep=2 --set deepspeed.zero_optimization.stage=2 \
	--set deepspeed.bf16.enabled=false
row "ep 2 x edp 2 (MoE, 4 experts top-1), ZeRO-1, fp32" 4 --set moe.num_experts=4 \
	--set moe.use_rts=false --set parallelism.ep=2 --set deepspeed.zero_optimization.stage=1 \
	--set deepspeed.bf16.enabled=false
row "ep 2 x edp 2 (MoE, 4 experts top-1), ZeRO-2, bf16" 4 --set moe.num_experts=4 \
	--set moe.use_rts=false --set parallelism.ep=2 --set deepspeed.zero_optimization.stage=2
row "ep 2 x edp 2 (MoE, 4 experts top-1), ZeRO-0, bf16" 4 \
	--set moe.num_experts=4 --set moe.use_rts=false --set parallelism.ep=2 \
	--set deepspeed.zero_optimization.stage=0
row "pp 2 x ep 2 (MoE, 4 experts top-1), ZeRO-1, bf16" 4 --set moe.num_experts=4 \
	--set moe.use_rts=false --set parallelism.ep=2 --set parallelism.pp=2 \
	--set deepspeed.zero_optimization.stage=1
row "ep 2 x tp 2 (MoE, 4 experts top-1), ZeRO-1, bf16" 4 --set moe.num_experts=4 \
	--set moe.use_rts=false --set parallelism.ep=2 --set parallelism.tp=2 \
	--set deepspeed.zero_optimization.stage=1
