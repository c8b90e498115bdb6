/* plan: a scenario resolved into numbers every rank agrees on: the parallel degrees and rank
 * layout, batch arithmetic, byte widths of each state, where each state lives, which units each
 * pipeline stage holds and how every unit's parameters are split (tensor and expert parallelism)
 * and partitioned (ZeRO over data-parallel groups). It refuses what DeepSpeed and Megatron refuse.
 * It does not order anything in time: build.c turns a plan into each stage's schedule. */
#ifndef PX_PLAN_H
#define PX_PLAN_H

#include "parallel.h"
#include "scenario.h"
#include "schedule.h"

typedef struct UnitPlan {
	long long params;          /* whole-model elements the unit owns */
	int moe;                   /* an MoE block */
	int stage, chunk;          /* pipeline stage and the stage's local chunk holding it */
	int n_tensors;
	long long tensor_local[MODEL_MAX_TENSORS]; /* this rank's elements of each owned tensor */
	unsigned char tensor_expert[MODEL_MAX_TENSORS];
	long long local_dense, local_expert; /* this rank's elements, by ZeRO group */
	long long tp_replicated;   /* of local_dense, those in tensors every tensor-parallel rank
				      holds whole (norms, row-split biases, positions) */
	long long persist_elems;   /* stage 3: local elements in tensors under the threshold */
	long long muon_elems;      /* local elements of its hidden matrices (what Muon updates) */
	long long cast_elems;      /* torch autocast: local elements of the weights it casts to 16
				      bits (plan.c casts_weight), a head's with the tied embedding
				      its lm_head reads */
	long long max_tensor;      /* its largest local tensor */
	long long flat_off;        /* stage 0-2: first element in its stage's padded flat buffer */
	/* stage 3: the unit's other dense tensors form one flat, padded to a multiple of dp, of
	 * which rank r owns slice r: an all-gather gives the flat back whole */
	long long own_gather;      /* that padded flat */
	long long part_dense, part_expert; /* this rank's slice, and its share of expert tensors */
	long long part_off;        /* stage 3: where its dense slice starts in the stage's partition
				      (its expert share follows it; units in order, then the
				      persistent parameters' slice at StagePlan.persist_part_off) */
	long long gather_dense, gather_expert; /* what the unit's gathers bring in: own_gather, plus
						 the embedding unit's flat for a tied head */
	long long fsdp_left;       /* FSDP, a layer: its elements no unit of its own holds under the
				      auto-wrap policy, held by the root (in unit 0's flat) */
	long long secondary_off;   /* ZeRO++ hpZ: where this rank's secondary piece of the unit
				      (own_gather / hpz) starts in the stage's secondary partition */
	double fwd_flops;          /* one micro-batch on this rank */
	double attn_flops;         /* of those, the attention's QK^T and AV products (blocks) */
	double act_bytes;          /* kept for backward (or rebuilt by recompute) */
	double score_bytes;        /* eager attention's scores (blocks only): part of act_bytes,
				      except under selective recompute, which rebuilds them before
				      the block's backward (build.c) */
	double ckpt_bytes;         /* kept for backward under full recompute */
} UnitPlan;

/* Stage 1-2 reduce and gather dense gradients and parameters in buckets of whole units, formed
 * in backward order up to reduce_bucket_size and padded to a multiple of dp; rank r owns slice r
 * of every bucket. The stage's flat buffer holds the buckets in forward order. Without a ZeRO
 * optimizer (stage 0, BF16_Optimizer) one bucket holds every unit (plan.c plan_buckets). */
typedef struct BucketPlan {
	int u_lo, u_hi;            /* units u_lo .. u_hi of this stage */
	long long elems, padded;   /* their dense elements, and rounded up to a multiple of dp */
	long long flat_off;        /* where the bucket starts in the flat buffer */
} BucketPlan;

typedef struct StagePlan {
	long long local_dense, local_expert; /* elements on each rank of the stage */
	long long flat_dense, flat_expert;   /* stage 0-2: padded to multiples of dp and edp */
	long long part_elems;      /* parameters whose optimizer state a rank owns */
	long long persist_elems;   /* stage 3 */
	long long persist_part_off; /* stage 3: the persistent parameters' slice in the partition */
	long long muon_elems, max_tensor; /* the units' sums and largest, as in UnitPlan */
	long long secondary_elems; /* ZeRO++ hpZ: the secondary partition a rank keeps */
	int n_buckets;
	BucketPlan *buckets;       /* owned; stage 0-2, forward order */
	long long max_bucket;      /* largest padded bucket (stage 0-2) or unit flat (stage 3) */
	long long bucket_fill;     /* stage 2-3: the most a contiguous gradient buffer holds at once
				      (the largest dense reduction, or at stage 3 the experts'
				      bucket); DeepSpeed's buffers are reduce_bucket_size elements,
				      and hold this much when a reduction of whole units exceeds
				      that (build_alloc_buckets) */
	long long max_tensor_part; /* a rank's share of the stage's largest tensor */
	/* optimizer memory of a rank, bytes (plan_optimizer): the states besides the master copy,
	 * the 1-bit optimizers' error feedback, and what the step itself copies (1-bit LAMB) */
	double opt_state_bytes, error_feedback_bytes, opt_step_temp_bytes;
	long long step_elems;      /* what the update steps at once: the partition, at stage 3 its
				      largest sub-group (DeepSpeed's fp32 gradients are made for it) */
	int n_subgroups;
	long long *subgroup_end;   /* owned; stage 3: where each of DeepSpeed's optimizer sub-groups
				      ends in the partition (plan.c plan_subgroups), the last at
				      part_elems; NULL at stage 0-2 (the partition is one) */
	/* stage 3 with parameters on NVMe: the pinned host flat DeepSpeed allocates (min(partition,
	 * max_in_cpu) elements), and how much of the partition, from its start, it holds there (the
	 * sub-groups that fit whole); the rest is on NVMe. Else 0 and 0. */
	long long param_host_flat, param_resident;
} StagePlan;

typedef struct Plan {
	const Scenario *sc;
	ParallelSpec par;          /* degrees, with dp derived */
	long long world, dp, edp;  /* edp: data-parallel ranks holding the same experts */
	long long m;               /* micro-batches per step per pipeline (gradient accumulation) */
	int stage;                 /* ZeRO stage */
	long long n_params;        /* Ψ, the whole model */
	int param_bytes, grad_bytes, comm_bytes;
	int master_bytes;          /* 4 where the optimizer updates an fp32 copy of the partition,
				      else 0: mixed precision, or any DeepSpeed ZeRO optimizer (stage
				      1-3), which clones the partition into fp32 even from fp32
				      parameters (stage_1_and_2.py single_partition_of_fp32_groups,
				      stage3.py fp32_partitioned_groups_flat: .clone().float()) */
	int state_bytes;           /* 4 per optimizer state */
	int fsdp2;                 /* FSDP's version 2 (fully_shard; FsdpSpec.version): each gather
				      through a group all-gather output copied out into the
				      parameters; FsdpSpec.post_forward's group is hpz's */
	int fsdp_pieces;           /* FSDP: the most units a layer's own parameters make under the
				      auto-wrap policy (0: none, the layer the root's) */
	int fsdp;                  /* framework "fsdp": stage 3's schedule as FSDP runs it (build_fsdp):
				      param_bytes, grad_bytes and comm_bytes are MixedPrecision's
				      param_dtype (the gathered weights, the unsharded gradients and
				      their reduce-scatter), the shards and their gradients
				      shard_bytes, no master copy (master_bytes 0) */
	int shard_bytes;           /* bytes of a partition element: param_bytes, or FSDP's fp32 */
	long long shards;          /* ranks a stage-3 partition is split over: dp, or under FSDP's
				      HYBRID_SHARD a node's (the rest hold replicas) */
	CommGroup shard_group;     /* their group: GROUP_DP, or HYBRID_SHARD's GROUP_NODE */
	int mixed;
	Place opt_place, param_place, ckpt_place;
	OptimImplKind opt_impl;    /* the Adam update as it runs: the config's (DsConfig.opt_impl),
				      but torch's foreach loops off the GPU, where torch takes it
				      only for CUDA tensors (optimizer.py _default_to_fused_or_foreach) */
	int contiguous_grads;      /* gradients gathered into contiguous buffers for their
				      reduction: zero_optimization.contiguous_gradients, which
				      stage 1-2's optimizer offload turns on (stage_1_and_2.py:
				      contiguous_gradients or cpu_offload) */
	int zero_optimizer;        /* DeepSpeed's ZeRO optimizer steps (stage_1_and_2.py, stage3.py):
				      stage 2-3, or stage 1 but under BF16_Optimizer */
	int overlap_comm;          /* zero_optimization.overlap_comm as it takes effect: a ZeRO
				      optimizer's, off under pipelining (engine.py
				      _configure_zero_optimizer: "Pipeline parallelism does not
				      support overlapped communication, will be disabled"); without
				      ZeRO and under BF16_Optimizer nothing reads it; on for plain
				      PyTorch's DistributedDataParallel, whose buckets always overlap */
	int bf16_optimizer;        /* engine.py _do_optimizer_sanity_check gives BF16_Optimizer:
				      bf16 without ZeRO (fp32 accumulation by default; bf16 under
				      pipelining), or at stage 1 with fp32 accumulation and the
				      optimizer on the device. It partitions the fp32 master weights
				      and states over the data-parallel ranks as ZeRO-1 does, so the
				      plan's stage is 1 (the config's stays in sc->ds.zero.stage); it
				      keeps the full gradients in the accumulation dtype beside the
				      backward's bf16 .grad tensors, all-reduces them (no contiguous
				      gradient buffers, no flat) and all-gathers the parameters. */
	int flattens_grads;        /* DeepSpeed's ZeRO optimizer on the device: its step copies the
				      gradients it updates into
				      one flat, then into fp32 (stage_1_and_2.py step; stage3.py
				      _prepare_fp32_grad_for_sub_group, a sub-group at a time) */
	double reduce_bucket_elems, allgather_bucket_elems;
	int n_units;
	UnitPlan *units;           /* owned */
	int n_chunks;              /* pp * virtual stages */
	int *chunk_bounds;         /* owned, n_chunks + 1: chunk j holds units [b[j], b[j+1]) */
	StagePlan *stages;         /* owned, pp */
	ActivShape shape;
	int activations_known;
	int executor;              /* the executor's own buffers are scheduled (backend cpu, cuda) */
	int cuda_runtime;          /* the CUDA runtime's own memory is (backend gpu, cuda) */
	/* ZeRO++ */
	long long hpz;             /* secondary partition group (1: off) */
	int qwz, qgz;              /* quantized weights (INT8) and gradients (INT4) */
	/* 1-bit optimizers: the kind of step (OneBitStep) the schedules are built for; plan_build
	 * sets ONEBIT_FULL (the warm-up's), a caller pricing the other kinds sets it and builds
	 * again (sim/onebit.c) */
	int onebit_step;
	/* MoE, per micro-batch on one rank */
	long long moe_capacity;    /* tokens per expert */
	long long moe_slots;       /* E x capacity: tokens an all-to-all moves */
	GroupSpan spans[N_GROUPS]; /* where each communication group's members sit */
} Plan;

int plan_build(Plan *p, const Scenario *sc, PxError *err);
/* The sizes a unit's products take on this rank (model_unit_gemms): its tokens, the
 * tensor-parallel split, and the tokens each local expert receives per micro-batch, its capacity
 * from every expert-parallel rank. */
GemmShape plan_gemm_shape(const Plan *p);
/* How many parts a pipeline send cuts the stream into: tp when each tensor-parallel rank sends
 * its 1/t of it and the receiving stage all-gathers it over its tensor-parallel group, as
 * DeepSpeed's pipe engine does by default (pipe/engine.py PartitionedTensor; pipeline.
 * pipe_partitioned for activations, grads 0; grad_partitioned for their gradients, grads 1) and
 * Megatron-LM's scatter_gather_tensors_in_pipeline did (p2p_communication.py); else 1 (no
 * tensor parallelism, or sequence parallelism, whose stream is already a rank's rows). */
long long plan_pipe_parts(const Plan *p, int grads);
void plan_free(Plan *p);
/* Stage 3: the partition slices unit u's gather reads on this rank, as offsets and lengths in
 * the stage's partition: its own, and for a tied head the embedding's (unit 0's) too, which
 * DeepSpeed fetches again for the head's module (length 0 otherwise). */
void plan_gather_slices(const Plan *p, int u, long long off[2], long long len[2]);

/* The ZeRO paper's accounting of model states per device (bytes), for Ψ parameters over nd ranks:
 * 16-bit params and grads (2 + 2) and K = 12 bytes of fp32 optimizer state with mixed-precision
 * Adam; the widths come from the plan so fp32 and other optimizers follow the same formulas. */
typedef struct IdealStates {
	double params_bytes, grads_bytes, optimizer_bytes, total_bytes;
} IdealStates;
IdealStates plan_ideal_states(double psi, long long nd, int stage, int p_bytes, int g_bytes,
			      int k_bytes);
/* The same for one pipeline stage of the plan: dense states over dp, experts over edp. */
IdealStates plan_stage_ideal(const Plan *p, int stage);
/* The DeepSpeed class that wraps the basic optimizer (engine.py _configure_optimizer):
 * BF16_Optimizer, FP16_Optimizer, DeepSpeedZeroOptimizer(_Stage3), or "none" (fp32 without
 * ZeRO: the basic optimizer alone). */
const char *plan_optimizer_wrapper(const Plan *p);

#endif
