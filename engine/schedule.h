/* schedule: the ordered list of what one rank does, shared by the simulator and the executors.
 * Owns the op vocabulary (allocate/free with a category and a place, compute, collectives, copies,
 * a repeat block for micro-batches) and the container. Building a schedule from a plan is build.c;
 * pricing one is sim/. */
#ifndef PX_SCHEDULE_H
#define PX_SCHEDULE_H

#include <stdint.h>

#include "err.h"

typedef enum { PLACE_GPU, PLACE_CPU, PLACE_NVME, N_PLACES } Place;
/* CAT_WORKSPACE: the executor's own working buffers (a unit's working copy of its parameters and
 * of their gradients, the hidden state between units, the kernels' backward scratch): what this
 * implementation holds beyond what DeepSpeed's does, accounted apart from the framework's
 * categories, predicted and measured alike. Only an executor's scenario has any. */
typedef enum {
	CAT_PARAMS, CAT_GRADS, CAT_OPTIM, CAT_ACTIV, CAT_BUFFERS, CAT_OVERHEAD, CAT_WORKSPACE, N_CATS
} MemCat;

typedef enum {
	OP_ALLOC,    /* buf, place, cat, what, bytes */
	OP_FREE,     /* buf */
	OP_COMPUTE,  /* sub = CompKind, unit, flops, bytes (memory traffic) */
	OP_COLL,     /* sub = CollKind, group, nranks, elems, elem_bytes, bytes = payload, buf, offset:
			the buffer it works on and the first element there (build.c says which) */
	OP_COPY,     /* sub = CopyDir, bytes */
	OP_LOOP,     /* count: run the ops up to the matching OP_END_LOOP this many times */
	OP_END_LOOP,
} OpKind;

/* COMP_GRAD_ACCUM: BF16_Optimizer's update_hp_grads after a backward, the bf16 .grad tensors
 * (op->buf, from element op->elems) added into the fp32 gradients at the same place: flops is the
 * number of elements added, one add each; bytes what it reads and writes. */
typedef enum {
	COMP_FWD, COMP_BWD, COMP_RECOMPUTE, COMP_OPTIMIZER, COMP_GRAD_ACCUM, N_COMPS
} CompKind;

typedef enum {
	COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_ALL_REDUCE, COLL_ALL_TO_ALL, COLL_BROADCAST,
	COLL_P2P,      /* a send to the next or previous pipeline stage */
	COLL_P2P_RECV, /* its matching receive: counted apart, it puts nothing on this rank's wire */
	N_COLLS
} CollKind;

/* dp: data parallel; tp, pp, ep: tensor, pipeline, expert parallel; hpz: ZeRO++'s secondary
 * partition group; edp: data-parallel ranks holding the same experts; node and xnode: the part of
 * the dp group inside one node and the peers with the same local index on the other nodes
 * (ZeRO++'s hierarchical gradient all-to-all). */
typedef enum {
	GROUP_DP, GROUP_TP, GROUP_PP, GROUP_EP, GROUP_HPZ, GROUP_EDP, GROUP_NODE, GROUP_XNODE,
	N_GROUPS
} CommGroup;

typedef enum { COPY_H2D, COPY_D2H, COPY_NVME_READ, COPY_NVME_WRITE, N_COPIES } CopyDir;

/* What a buffer holds, so that an executor knows which tensor an ALLOC stands for. */
typedef enum {
	BUF_CUDA_CONTEXT, BUF_CUBLAS_WORKSPACE, BUF_NCCL, BUF_LOSS_SCALER,
	BUF_PARAMS,        /* full 16-bit (or fp32) parameters, stage 0-2 */
	BUF_PARAM_PART,    /* this rank's parameter partition, stage 3 */
	BUF_PERSISTENT,    /* stage 3 parameters under the persistence threshold, kept whole */
	BUF_GATHERED,      /* stage 3: a unit's parameters gathered for its compute */
	BUF_GRADS,         /* full gradients, stage 0-1 */
	BUF_GRAD_PART,     /* this rank's gradient partition, stage 2-3 */
	BUF_GRAD_FP32,     /* fp32 gradient partition the optimizer reads */
	BUF_UNIT_GRADS,    /* a unit's gradients before they are reduced (no contiguous buckets) */
	BUF_MASTER,        /* fp32 master parameters */
	BUF_OPT_STATES,    /* optimizer states (Adam m and v) */
	BUF_REDUCE_BUCKET, /* contiguous gradient bucket */
	BUF_ACTIVATIONS,   /* a block's activations kept for backward */
	BUF_CHECKPOINT,    /* a block's input under full recompute */
	BUF_ENDS,          /* embedding and output-layer activations (logits) */
	BUF_SWAP,          /* host staging buffers for NVMe offload */
	BUF_SECONDARY,     /* ZeRO++ hpZ: the parameters of this rank's secondary partition */
	BUF_PERSIST_GRADS, /* stage 3: gradients of the parameters kept whole */
	BUF_UNIT_FP32,     /* executor: a unit's working copy of its parameters (compute dtype) */
	BUF_HIDDEN,        /* executor: the hidden state flowing between units and its gradient */
	BUF_SCRATCH,       /* executor: the kernels' backward workspace */
	BUF_ERROR_FEEDBACK, /* 1-bit optimizers: worker and server compression errors */
	BUF_OPT_STEP_TEMP, /* what the optimizer step copies while it runs (1-bit LAMB's momenta) */
	BUF_UNIT_GRAD32,   /* executor: a unit's fp32 gradients in backward, before they are moved */
	/* pipeline parallelism, as DeepSpeed's pipe engine holds them (engine/pipe/engine.py) */
	BUF_PIPE_INPUT,    /* a micro-batch's activation received from the previous stage, kept
			      until its backward has sent the input's gradient (pipe_buffers
			      'inputs') */
	BUF_PIPE_OUTPUT,   /* a micro-batch's activation sent to the next stage, kept until its
			      backward (pipe_buffers 'outputs', which autograd starts from) */
	BUF_PIPE_GRAD,     /* the gradient received from the next stage (grad_layer: allocated
			      once, reused by every backward) */
	BUF_PIPE_INPUT_GRAD, /* the input's gradient a backward sends to the previous stage
				(the received input's .grad, freed with it) */
	BUF_SP_GRADS,      /* sequence parallelism: the replicated tensors' gradients flattened for
			      their all-reduce over the tensor-parallel group (Megatron's
			      _allreduce_layernorm_grads coalesces them) */
	BUF_SCORES,        /* selective recompute: a block's attention scores rebuilt before its
			      backward, freed after it */
	/* inference (engine/infer_build.c) */
	BUF_KV_CACHE,      /* a unit's keys and values of every cached token, for every sequence */
	BUF_QUANT_SCALES,  /* a unit's quantization scales (and minimums) of its quantized weights */
	BUF_DEQUANT,       /* the compute-dtype copy a quantized linear's weight is dequantized
			      into before its GEMM (DeepSpeed's unfused weight quantization) */
	BUF_LOAD_STAGING,  /* a unit's weights in the checkpoint's dtype while they are quantized */
	BUF_GRAD_FLAT,     /* DeepSpeed's ZeRO optimizers (16-bit gradients): the gradients the
			      update steps (the partition; at stage 3 a sub-group) flattened
			      before their fp32 copy is made (Plan.flattens_grads) */
	BUF_GRAD_SWAP,     /* ZeRO-Infinity (the optimizer on NVMe): the fp32 gradient partition
			      swapped out at the gradient accumulation boundary and read back with
			      the optimizer states (stage3.py partition_grads: swap_out_gradients) */
	BUF_EXPERT_GRADS,  /* ZeRO-2: an MoE block's expert gradients from its backward until they
			      are reduced over the expert-data-parallel group (or copied to the
			      host); DeepSpeed's are the experts' .grad tensors, copied into its
			      reduction bucket */
	BUF_PARAM_STAGING, /* ZeRO-Infinity (parameters on NVMe): the parameter swapper's pinned host
			      buffers, offload_param.buffer_count of buffer_size elements */
	BUF_PARAM_SWAP,    /* ZeRO-Infinity (parameters on NVMe): the 16-bit partition's sub-groups
			      that do not fit in the host flat of offload_param.max_in_cpu
			      elements, kept on NVMe (stage3.py
			      _create_fp16_partitions_with_defragmentation) */
	/* ZeRO 1-2 with the optimizer on the CPU (stage_1_and_2.py, cpu_offload) */
	BUF_OFFLOAD_GPU_TEMP, /* temp_grad_buffer_for_gpu_offload: the largest parameter's elements
				 in the model's dtype on the device, through which the host's
				 accumulated gradients are added to a micro-batch's */
	BUF_OFFLOAD_CPU_TEMP, /* temp_grad_buffer_for_cpu_offload: its pinned host twin */
	BUF_ACCUM_GRADS,   /* accumulated_grads_in_cpu (gradient accumulation over more than one
			      micro-batch): the partition's gradients in the model's dtype on the
			      host, summed micro-batch by micro-batch before their fp32 copy */
	BUF_OFFLOAD_GRAD_COPY, /* ZeRO-3 with the optimizer offloaded: the device's copy of a
				  bucket's slice of the host gradient partition, in which the reduced
				  gradients are added before it goes back (stage3.py partition_grads:
				  grad_buffer.to(device)), held until the bucket is partitioned */
	BUF_TIED_GRADS,    /* the head's gradient of the tied token embedding, held from the head's
			      backward until the embedding's reduction sums it in */
	BUF_REDUCE_FLAT,   /* ZeRO 2-3 without contiguous gradients: a reduction's gradients
			      flattened from their units' own buffers (stage_1_and_2.py
			      allreduce_bucket: self.flatten(bucket); stage3.py
			      reduce_scatter_coalesced's concatenation); its slice names the
			      bucket (stage 2; -1 at stage 3, where op->unit is the unit). Stage
			      0: the engine's bucket (engine.py allreduce_bucket), unit -1, its
			      slice's bucket -1 and range the flat gradients it copies */
	BUF_LP_GRADS,      /* BF16_Optimizer: the backward's bf16 .grad tensors, which each
			      backward's clear_lp_grads drops and autograd makes again, so that they
			      are whole from one backward to the next (build.c says how the schedule
			      holds them); update_hp_grads adds them into the fp32 gradients */
	BUF_LP_UPCAST,     /* BF16_Optimizer's update_hp_grads: one .grad tensor cast to the
			      accumulation dtype (lp.grad.to(hp_grad.dtype)) before it is added,
			      the largest of a span's tensors held (build.c) */
	BUF_COMM_CAST,     /* a reduction's gradients cast to communication_data_type for it
			      (engine.py allreduce_bucket: tensor.to(self.communication_data_type)),
			      laid as the gradients it casts */
	BUF_DDP_BUCKETS,   /* plain PyTorch's DistributedDataParallel: its reducer's bucket tensors,
			      one flat copy of every gradient held from the wrapping on
			      (gradient_as_bucket_view false, the default); each bucket's
			      all-reduce runs there, its slice naming the gradients */
	BUF_LOSS_TEMP,     /* Hugging Face's causal-LM loss (ForCausalLMLoss) while it runs: the
			      logits and their fp32 upcast forward, the log-softmax's gradients
			      backward (build.c loss_temp_bytes) */
	BUF_XL_GRADS,      /* ZeRO 2-3: a unit's gradients of parameters larger than
			      reduce_bucket_size, each reduced from its own .grad
			      (stage_1_and_2.py extra_large_param_to_reduce) until its
			      reduction (build_xl_grad_elems) */
	BUF_AUTOCAST_WEIGHTS, /* torch autocast: the 16-bit copies of a unit's weights its products
				 read (the autocast cache until the forward ends, then autograd's
				 saved tensors until the unit's backward; build.c cast_bytes) */
	BUF_EXEC_CAST,     /* executor: a ZeRO 1-2 bucket's gradients cast whole to
			      communication_data_type, which its reduce-scatter sends, the
			      reduced slice landing in the bucket's comm_cast (DeepSpeed casts
			      and reduces one rank's slice at a time: build_zero_cast) */
	BUF_FSDP_UNSHARDED, /* FSDP: a unit's whole flat gradient in param_dtype (autograd's cat of
			       its tensors' gradients), from its backward until its reduce-scatter,
			       or under no_sync until the step's last micro-batch */
	BUF_FSDP_REDUCED,  /* FSDP: a reduce-scatter's output shard, and its cast to the shard's
			      dtype, until it is added into the unit's gradient shard */
	BUF_FSDP_AG_OUTPUT, /* FSDP2: a unit's all-gather output (every rank's shards), from its
			       copy-in until copied out into the unsharded parameters
			       (_fsdp_collectives.py foreach_all_gather, ..._copy_out) */
	BUF_FSDP_POST_FORWARD, /* FSDP2 with reshard_after_forward an int N: the 1/N of a unit's
				  parameters a rank keeps from its forward until its backward's
				  gather reads it */
	BUF_FSDP_ROOT_GRADS, /* FSDP, auto-wrap by size or none: a layer's gradients of the
				parameters it leaves to the root (FsdpWrap.leftover), autograd's
				per-tensor .grad from the layer's backward until the root's hook cats
				them into its flat */
	N_BUFS
} BufWhat;

/* What an op is for, so that no reader infers it from unit numbers, counts or order: the stream
 * a collective runs on (engine/streams.h) and what an executor does with its result follow from
 * its role. Compute ops take theirs from their CompKind; every collective and copy states one. */
typedef enum {
	ROLE_NONE,         /* allocations, frees and repeat-block markers */
	ROLE_FORWARD,      /* a unit's forward, its tensor/expert-parallel collectives, the pipeline
			      sends and receives of activations, a checkpoint's copy out */
	ROLE_RECOMPUTE,    /* full recompute of a block (and its checkpoint's copy back), or
			      selective recompute of its attention core */
	ROLE_BACKWARD,     /* a unit's backward and its collectives, the pipeline's gradient sends */
	ROLE_PREFETCH,     /* stage 3: fetching and gathering a unit's parameters before its compute */
	ROLE_GRAD_REDUCE,  /* reducing gradients (a bucket, a unit's flat, the persistent or expert
			      gradients, the tied embedding's two copies) and moving a reduced slice
			      to the optimizer's place */
	ROLE_OVERFLOW,     /* the one-value all-reduce (max) of the fp16 overflow flag */
	ROLE_GRAD_NORM,    /* the one-value all-reduce (sum) of the squared gradient norm */
	ROLE_OPTIMIZER,    /* the update and its state's swaps */
	ROLE_PARAM_UPDATE, /* the updated parameters back to where compute reads them: the copy from
			      the optimizer's place and the all-gathers after the update */
	ROLE_TIED_GRADS,   /* the all-reduce summing a tied parameter's gradient over its copies:
			      the word embedding's on the first and the last pipeline stage, over
			      the nranks (2) ranks of the pipeline group holding one (Megatron's
			      embedding group, DeepSpeed's tied_comms) */
	/* inference (engine/infer_build.c) */
	ROLE_WEIGHT_LOAD,  /* a unit's weights copied in from the host at start-up */
	ROLE_PREFILL,      /* a unit's forward over the prompt, and its tensor-parallel collectives */
	ROLE_DECODE,       /* a unit's forward for one generated token, and its collectives */
	/* the 1-bit optimizers' compressed all-reduce (engine/onebit.h), four collectives over the
	 * data-parallel group working on one tensor's (or flat's) worker and server errors: */
	ROLE_ONEBIT_SIGNS,        /* phase 1: each rank's packed sign bits, chunk j to rank j
				     (all-to-all; elems are bytes). Its buffer and offset: the
				     worker error; its slice: the part_elems elements of the
				     optimizer partition from part_off whose momentum it
				     exchanges (before the padding) */
	ROLE_ONEBIT_SCALES,       /* phase 1: each rank's one fp32 scale (all-gather) */
	ROLE_ONEBIT_SERVER_SIGNS, /* phase 2: each chunk owner's recompressed signs (all-gather;
				     elems are bytes); its buffer and offset: the server error */
	ROLE_ONEBIT_SERVER_SCALES, /* phase 2: each chunk owner's fp32 scale (all-gather) */
	N_ROLES
} OpRole;

/* Where a reduction's or a gather's partitioned data lies, for an executor (the simulator needs
 * only bytes): this rank's slice of the op's array is `part_elems` elements of its partition
 * (stage 3's parameter partition, stage 2-3's gradient partition, the optimizer's fp32 one)
 * starting at `part_off`; `bucket` is the stage's bucket (plan.h's BucketPlan index) the op
 * reduces or gathers at stage 0-2, -1 otherwise. At stage 3 the optimizer's ops of one
 * sub-group (the flat copies' allocations, the NVMe reads and writes, the update, the parameters'
 * copy) state the sub-group's range of the partition the same way. `cast`: a ZeRO reduction that
 * goes through a copy cast to communication_data_type (build_zero_cast) names that copy's
 * buffer (BUF_COMM_CAST, allocated before the reduction and freed after it), -1 for none. */
typedef struct SchedSlice {
	int32_t bucket;
	int32_t cast;
	int32_t cast_send; /* the executor's whole cast its reduce-scatter sends (BUF_EXEC_CAST), -1 */
	int64_t part_off, part_elems;
} SchedSlice;

typedef struct Op {
	uint8_t kind;       /* OpKind */
	uint8_t sub;        /* CompKind, CollKind or CopyDir */
	uint8_t place;      /* Place (ALLOC) */
	uint8_t cat;        /* MemCat (ALLOC) */
	uint8_t what;       /* BufWhat (ALLOC) */
	uint8_t group;      /* CommGroup (COLL) */
	uint8_t elem_bytes; /* COLL: bytes per element on the wire */
	uint8_t role;       /* OpRole */
	int32_t unit;       /* layer unit, -1 when none */
	int32_t buf;        /* ALLOC/FREE: buffer id; COLL: the buffer it works on, COPY: the one
			       it copies from (sched_copy_reduced); COMPUTE (backward): the buffer
			       its dense gradients go to (sched_grads_to); -1 for none */
	/* A collective's group size and the micro-batch of a unit's allocation or compute share a
	 * word: no kind reads both (see mb below), and Op has no room for another field. */
	union {
		int32_t nranks; /* COLL: ranks in the group */
		int32_t mb;     /* ALLOC, COMPUTE: the micro-batch it belongs to. A pipelined stage
				   has several in flight (activations, pipeline buffers), each in its
				   own buffers: 0..m-1. Without pipelining the repeat block's body is
				   every micro-batch in turn, in the same buffers: 0. Ops outside the
				   micro-batches (set-up, optimizer step): 0. A send or receive works
				   on a pipeline buffer, whose allocation states its micro-batch. */
	};
	int32_t slice;      /* COLL, COPY: its partitioned data (Schedule.slices), -1 for none */
	/* One word for the fields no kind reads together, so that an op is 48 bytes, not 64: the
	 * replays stream a pipelined stage's thousands of ops through memory several times. Each
	 * is 0 unless its kind writes it (push zeroes the op); read only for those kinds. */
	union {
		int64_t count;  /* LOOP: repetitions */
		int64_t offset; /* COLL, COPY: first element within the buffer it works on */
		double flops;   /* COMPUTE */
	};
	int64_t elems;      /* COLL, COPY of a reduced slice: elements of the whole array;
			       COMPUTE (backward, buf set; grad_accum): the first element of its
			       gradients in buf */
	double bytes;       /* ALLOC: size; COLL: payload (nccl-tests "size"); COPY: size;
			       COMPUTE: memory traffic */
} Op;

_Static_assert(sizeof(Op) == 48, "Op: 48 bytes, the replays' stride");

typedef struct Schedule {
	Op *ops;          /* owned */
	int n, cap;
	int step_begin;   /* ops[0..step_begin) set up the rank once; the rest is one optimizer step */
	int n_bufs;       /* buffer ids are 0..n_bufs-1 */
	int rank;
	int *step_at;     /* owned, n_steps: a pipelined stage's k-th step (pipe_order's) begins at
			     ops[step_at[k]]; none elsewhere (the time replay uses it to find the
			     1F1B steady state, docs/time_model.md) */
	int n_steps, cap_steps;
	SchedSlice *slices; /* owned: what Op.slice indexes */
	int n_slices, cap_slices;
	int valid;          /* sched_validate passed: a walk need not check each op again (an
			       appender clears it) */
} Schedule;

void sched_init(Schedule *s, int rank);
void sched_free(Schedule *s);
/* Room for at least n ops in all, so that appending up to there does not move the ops; -1 when
 * out of memory (the schedule then stays as it was). */
int sched_reserve(Schedule *s, long long n);
/* Note that the next op begins a pipeline step; 0, or -1 when out of memory. */
int sched_mark_step(Schedule *s);

/* Appenders return 0, or -1 when out of memory (the schedule then stays as it was). */
int sched_alloc(Schedule *s, Place place, MemCat cat, BufWhat what, int unit, double bytes,
		int *buf);
int sched_free_buf(Schedule *s, int buf);
int sched_compute(Schedule *s, CompKind kind, int unit, double flops, double bytes);
int sched_coll(Schedule *s, CollKind kind, OpRole role, CommGroup group, int nranks, int unit,
	       int64_t elems, int elem_bytes, int buf, int64_t offset);
int sched_copy(Schedule *s, CopyDir dir, OpRole role, int unit, double bytes);
/* A copy of a reduced gradient slice: the reduction's unit, buffer, first element and whole
 * array (elems), so that an executor knows what it moves; the simulator needs only bytes. */
int sched_copy_reduced(Schedule *s, CopyDir dir, int unit, double bytes, int buf, int64_t offset,
		       int64_t elems);
/* State the partitioned data of the last op (a collective or copy; an optimizer sub-group's
 * op): see SchedSlice. */
int sched_set_slice(Schedule *s, int bucket, int64_t part_off, int64_t part_elems);
/* The last op's slice (set) names its reduction's cast copy, buffer buf, and the executor's whole
 * cast it sends from, send (-1 for none) (see SchedSlice). */
void sched_set_cast(Schedule *s, int buf, int send);
/* The last op (a backward compute) writes its dense gradients into buffer buf from element off. */
void sched_grads_to(Schedule *s, int buf, int64_t off);
/* The last op (a compute) has role instead of its CompKind's (inference's prefill and decode). */
void sched_set_role(Schedule *s, OpRole role);
/* The last op (an allocation or a compute) belongs to micro-batch mb (Op.mb). */
void sched_set_mb(Schedule *s, int mb);
int sched_loop(Schedule *s, int64_t count);
int sched_end_loop(Schedule *s);

/* ---- walking a schedule: its structure, stated once ----
 * Ops run in order from the walk's start; a repeat block, OP_LOOP (count) .. OP_END_LOOP, runs
 * the ops between count times (none when count is 0); blocks do not nest. Each op is checked as
 * the walk reaches it: its kind, sub-kind, group, role, buffer and slice within range, a
 * collective's ranks at least 1 and its elements not negative; a block's markers matched and
 * not nested. A malformed schedule stops the walk with the op's index and why. sched_validate
 * walks a whole schedule once and also follows its buffers: each allocated once before it is
 * used, freed once while live, a collective's range inside its buffer's. The memory, traffic and
 * time replays (sim/) and the executor (exec/runner.c) all walk through this cursor:
 *
 *     SchedWalk w;
 *     sched_walk_init(&w, s, s->step_begin);
 *     for (int i; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w))
 *             ... s->ops[i], in iteration w.iter of its block ...
 *     if (i == SCHED_WALK_ERROR) ... err says which op and why ...
 *
 * Both markers are shown to the reader: at OP_LOOP the block is about to start; at OP_END_LOOP
 * iteration w.iter has ended, and sched_walk_leave there skips the iterations left (a reader
 * that knows the rest repeats the same). */
enum { SCHED_WALK_END = -1, SCHED_WALK_ERROR = -2 };

typedef struct SchedWalk {
	const Schedule *s;
	int i;            /* the op under the cursor */
	int body, end;    /* inside a block: its first body op and its OP_END_LOOP; -1 outside */
	int64_t iter, count; /* the block's iteration (0 outside) and its count */
	int leave;        /* at OP_END_LOOP: no further iteration */
	PxError *err;     /* where the last failure was written */
} SchedWalk;

void sched_walk_init(SchedWalk *w, const Schedule *s, int from);
/* The reason op i (the cursor's) is malformed, written to err; SCHED_WALK_ERROR. Out of line:
 * the walk's slow path. */
int sched_walk_check(SchedWalk *w, PxError *err);

/* Op's fields are in range for its kind (a block marker is not: the walk checks it). */
static inline int sched_op_ok(const Schedule *s, const Op *op)
{
	if (op->kind > OP_COPY || op->role >= N_ROLES || op->buf < -1 || op->buf >= s->n_bufs ||
	    op->slice < -1 || op->slice >= s->n_slices)
		return 0;
	switch (op->kind) {
	case OP_ALLOC:
		return op->buf >= 0 && op->place < N_PLACES && op->cat < N_CATS && op->what < N_BUFS &&
		       op->bytes >= 0 && op->mb >= 0;
	case OP_FREE: return op->buf >= 0;
	case OP_COMPUTE: return op->sub < N_COMPS && op->mb >= 0;
	case OP_COLL:
		return op->sub < N_COLLS && op->group < N_GROUPS && op->nranks >= 1 && op->elems >= 0;
	default: return op->sub < N_COPIES;
	}
}

/* The index of the op under the cursor, SCHED_WALK_END past the last, SCHED_WALK_ERROR (err
 * set) when it is malformed. Looking again without advancing gives the same op. */
static inline int sched_walk_op(SchedWalk *w, PxError *err)
{
	const Schedule *s = w->s;
	int i = w->i;
	if (i >= s->n)
		return w->body >= 0 ? sched_walk_check(w, err) : SCHED_WALK_END;
	if (s->ops[i].kind < OP_LOOP && (s->valid || sched_op_ok(s, &s->ops[i])))
		return i; /* the fast path: a well-formed op, no block marker */
	return sched_walk_check(w, err);
}

/* Past the op under the cursor: into a block at its OP_LOOP, back to the body's start or out at
 * its OP_END_LOOP. */
static inline void sched_walk_advance(SchedWalk *w)
{
	const Op *op = &w->s->ops[w->i];
	if (op->kind == OP_LOOP) {
		w->iter = 0;
		w->leave = 0;
		w->i = op->count > 0 ? w->body : w->end + 1;
		if (op->count <= 0)
			w->body = w->end = -1;
		return;
	}
	if (op->kind == OP_END_LOOP) {
		if (!w->leave && w->iter + 1 < w->count) {
			w->iter++;
			w->i = w->body;
			return;
		}
		w->body = w->end = -1;
		w->iter = 0;
	}
	w->i++;
}

/* At a block's OP_END_LOOP: the walk goes on after it, the iterations left not run. */
static inline void sched_walk_leave(SchedWalk *w)
{
	w->leave = 1;
}

/* Move the cursor to op i, outside any block (a reader that knows ops up to i repeat). */
void sched_walk_seek(SchedWalk *w, int i);
/* The run of ordinary ops from the cursor's: it ends at a block marker or at the block's or the
 * schedule's end. Its ops' fields are not checked one by one (the replays' hot path):
 * build_schedule's appenders write them in range, and sched_validate checks every field of a
 * schedule from elsewhere (the executor validates what it runs). A reader may take ops[w->i .. stop) in order, then move the cursor
 * past them with sched_walk_skip_to(w, stop): the fast path for long straight runs. At a block
 * marker the run is empty (stop == w->i): take the marker and sched_walk_advance. */
static inline int sched_walk_run(const SchedWalk *w)
{
	const Schedule *s = w->s;
	int i = w->i, end = w->end >= 0 ? w->end : s->n;
	if (s->ops[i].kind >= OP_LOOP)
		return i;
	for (i++; i < end && s->ops[i].kind < OP_LOOP;)
		i++;
	return i;
}

static inline void sched_walk_skip_to(SchedWalk *w, int i)
{
	w->i = i;
}

/* Following the buffers along a walk: each allocated once (again in each iteration of the block
 * that allocates it), freed once while live, used by a collective or copy only while live; a
 * block's body leaves as many live as it found. */
typedef struct SchedBufs {
	char *live, *seen;
	const Op **alloc_of;
	int n_live, live_at_loop;
} SchedBufs;

int sched_bufs_init(SchedBufs *b, const Schedule *s, PxError *err);
void sched_bufs_free(SchedBufs *b);
int sched_bufs_fail(const SchedBufs *b, const SchedWalk *w, int i, PxError *err);
void sched_bufs_renew(SchedBufs *b, const Schedule *s);

/* Op i of the walk: follows it, or fails naming it; *freed: a FREE's buffer's ALLOC op, else
 * NULL. At an OP_END_LOOP whose block runs again (the reader has not left it) the body's
 * buffers may be allocated anew. Inline: the memory replay steps every op through it. */
__attribute__((always_inline)) static inline int sched_bufs_step(SchedBufs *b, const SchedWalk *w, int i, const Op **freed,
				  PxError *err)
{
	const Op *op = &w->s->ops[i];
	*freed = NULL;
	switch (op->kind) {
	case OP_ALLOC:
		if (b->seen[op->buf])
			return sched_bufs_fail(b, w, i, err);
		b->live[op->buf] = b->seen[op->buf] = 1;
		b->n_live++;
		b->alloc_of[op->buf] = op;
		return 0;
	case OP_FREE:
		if (!b->live[op->buf])
			return sched_bufs_fail(b, w, i, err);
		b->live[op->buf] = 0;
		b->n_live--;
		*freed = b->alloc_of[op->buf];
		return 0;
	case OP_COLL:
	case OP_COPY:
		return op->buf >= 0 && !b->live[op->buf] ? sched_bufs_fail(b, w, i, err) : 0;
	case OP_LOOP:
		b->live_at_loop = b->n_live;
		return 0;
	case OP_END_LOOP:
		if (b->n_live != b->live_at_loop && w->count > 1)
			return sched_bufs_fail(b, w, i, err);
		if (!w->leave && w->iter + 1 < w->count) /* allocated anew next time */
			sched_bufs_renew(b, w->s);
		return 0;
	default:
		return 0;
	}
}

/* Walk the whole schedule once, each block's body once, its buffers followed (the memory replay,
 * sim/memory.c, does the same as it goes); 0 and s->valid set, so that later walks of it need not
 * check each op again, or -1 with err naming the op. */
int sched_validate(Schedule *s, PxError *err);

const char *place_name(Place p);
const char *cat_name(MemCat c);    /* "params", "grads", "optimizer", ... (JSON key stems) */
const char *coll_name(CollKind k); /* "all_gather", ... */
const char *group_name(CommGroup g);
const char *buf_name(BufWhat w);
/* 1 for a buffer the framework makes with torch.empty, not zeroed: a contiguous gradient bucket,
 * reduce_bucket_size elements of which the reductions use the front (they zero what they use).
 * The executor allocates it so (exec/runner_buf.c) and the CPU time model charges its allocation
 * no fill (sim/opcost_cpu.c); every other allocation comes zeroed. */
int buf_empty(BufWhat w);
const char *comp_name(CompKind k);
const char *copy_name(CopyDir d);
const char *role_name(OpRole r);
const char *op_kind_name(OpKind k);

#endif
