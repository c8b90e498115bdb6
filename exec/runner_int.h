/* runner_int: the runner's insides, shared by its files: runner.c (what the executor runs, the
 * schedule interpreter and its streams of started collectives, set-up), runner_buf.c (the
 * buffers: their sizes, allocation and freeing), runner_unit.c (the units' forward, recompute
 * and backward: their parameters in, their gradients out), runner_coll.c (the collectives, and
 * the host copies under optimizer offload), runner_fsdp.c (FSDP's gradient shards and flats),
 * runner_state.c (the optimizer over this rank's partition, and checkpoints of the state it
 * keeps), runner_pipe.c (pipeline parallelism: the groups' communicators, the sends and receives
 * between stages), runner_tp.c (tensor parallelism), runner_moe.c (Mixture-of-Experts blocks and
 * their groups), runner_zpp.c (ZeRO++), runner_nvme.c (ZeRO-Infinity's optimizer on NVMe),
 * runner_onebit.c (1-bit Adam and 0/1 Adam) and runner_lamb.c (1-bit LAMB). Not for use outside
 * exec/runner*.c. */
#ifndef PX_EXEC_RUNNER_INT_H
#define PX_EXEC_RUNNER_INT_H

#include "../kernels/moe_cpu.h"
#include "../kernels/ops_cpu.h"
#include "runner.h"
#include "swapfile.h"

/* A slice of this rank's optimizer partition: its parameters and gradients where they live, and
 * where it sits in the master weights and optimizer states. */
typedef struct Seg {
	void *params, *grads;
	Dtype gdt;          /* the gradients' storage: fp32 on the host under optimizer offload */
	long long part_off, n;
	long long flat_off; /* stage 0-1: where it starts in the stage's flat buffer */
	void *dev_grads;    /* the device's gradients of the slice (in r->gdt) where grads are the
			       host's copy of them; NULL otherwise */
} Seg;

/* Elements lo .. hi - 1 of a buffer. */
typedef struct ElemRange {
	long long lo, hi;
} ElemRange;

/* Elements lo .. hi - 1 of the gradients in the optimizer's coordinates (the stage's flat at
 * ZeRO 0-2, Seg.flat_off; the partition at 3, Seg.part_off), at element `at` of a
 * tensor-parallel group's flattened copy of its replicated tensors' gradients (the same place
 * on every rank of the group). */
typedef struct RepPiece {
	long long lo, hi, at;
} RepPiece;

/* A collective started on a stream of its own (engine/streams.h: prefetch or reduction), waited
 * for where the schedule next needs its data or its buffer (runner.c, "streams"). */
typedef struct Pending {
	CommRequest *req;
	const Op *op;
	int stream;        /* SchedCollClass: SCC_PREFETCH or SCC_REDUCE */
	void *mine;        /* a stage 2-3 reduce-scatter's slice of this rank, added into the
			      gradient partition at the wait; NULL for none */
	size_t cnt;        /* its elements */
	int recycle_buf;   /* a buffer to recycle at the wait (persistent gradients), or -1 */
	void *back_to;     /* a DistributedDataParallel bucket's all-reduced sums (back_n
			      elements at back_from) go back into the gradients here at the wait;
			      NULL for none */
	const void *back_from;
	size_t back_n;
} Pending;

typedef struct RunnerZpp RunnerZpp; /* runner_zpp.c's */

struct Runner {
	const Plan *p;
	const Schedule *s;
	const StagePlan *st;    /* this rank's pipeline stage's */
	Comm *dp, *world;
	Comm *pp_act, *pp_grad, *tied; /* RunnerComms' */
	Comm *tp;               /* RunnerComms' tensor-parallel group, NULL without */
	Comm *hpz, *node, *xnode; /* RunnerComms' ZeRO++ groups, NULL without */
	RunnerZpp *zpp;         /* ZeRO++'s scratch, NULL without */
	int id_secondary;       /* hpZ's secondary partition, -1 without */
	GptTp gtp;              /* this rank in it (t = 1 without): the units' collectives */
	int tp_unit, tp_next;   /* the unit whose kernels run, the schedule op they take next */
	int tp_skip;            /* ops after the last compute its kernels took: passed over */
	int tp_failed;          /* a kernel's collective failed or matched no op: tp_err says */
	PxError tp_err;
	double tp_s;            /* time in the kernels' collectives, summed (op_s has it too) */
	Comm *ep, *edp;         /* RunnerComms' expert-parallel and expert-data-parallel groups */
	int moe_on;             /* the model has MoE blocks (runner_moe.c) */
	MoeCpu moe;             /* this rank in its expert-parallel group: the MoE blocks' kernels */
	int edp_rank, n_edp;    /* this rank in its expert-data-parallel group, and its size */
	long long *expert_off;  /* stage 0-2, by unit: where its expert tensors start in the flat
				   (after the dense buckets, flat_dense on; units in forward order) */
	long long own_expert;   /* of own_flat, the expert part (padded to a multiple of edp) */
	size_t moe_dense;       /* an MoE block's tensors before its experts (norm1 .. router) */
	/* dropless MoE blocks, by (micro-batch, unit) as u_act: the capacity the forward agreed
	 * (-1: none yet) and its saved activations' slot part (kernels/moe_cpu.h slot_acts),
	 * allocated once the gate has counted, at that capacity, and freed with the rest */
	int *moe_cap;
	void **moe_slot_acts;
	size_t *moe_slot_bytes;
	int stage, n_stages;    /* pipeline stage (the schedule's rank) and pp */
	const Op *pipe_recvd[2]; /* received, for the next backward [0] and forward [1] to take
				    into the hidden stream (runner_pipe_take); NULL: none waits */
	int slots;              /* micro-batches with buffers of their own: m when pipelined, else
				   1 (Op.mb) */
	/* Flat ranges left out of this rank's share of the gradient norm, in order: a tied
	 * parameter's replica (the head's copy of the token embedding on the last stage, counted
	 * on the first), and on tensor-parallel ranks other than 0 the tensors every rank of the
	 * group holds whole (counted on rank 0, as Megatron's param_is_not_tensor_parallel_
	 * duplicate) */
	ElemRange *norm_skip;
	int n_norm_skip;
	/* The pieces of the tensors a tensor-parallel group replicates (on every rank; none
	 * without tensor parallelism) that this rank's optimizer steps, in order: under sequence
	 * parallelism their gradients are summed over the group (runner_tp_replicated). rep_elems:
	 * the replicated tensors' elements in all. */
	RepPiece *rep;
	int n_rep;
	long long rep_elems;
	long long replica_lo, replica_hi; /* the replica's range; empty when none */
	const DataSource *data; /* runner_step's, while it runs */
	long step;
	int tokens_mb;          /* the micro-batch whose tokens the backend holds, -1: none */
	int micro;              /* the micro-batch runner_step's walk is in (the repeat block's
				   iteration; a pipeline's ops name theirs, Op.mb) */
	const ComputeBackend *cb;
	void *cx;               /* the backend's context */
	int own_cx;             /* created (and destroyed) here */
	float *scalar;          /* the backend's memory for one-value all-reduces (NCCL reads only
				   device memory); outside the arena, as the schedule has no buffer */
	RunnerRuntime rt;
	int rank, n;            /* data-parallel rank and size */
	uint64_t seed;          /* the model's initialisation seed (MoE's random token selection
				   draws from it too) */
	long long own_flat;     /* stage 0-2: the stage's flat as this executor counts it
				   (runner_own_flat_elems), -1 at stage 3 */
	GptConfig cfg;
	int B, T, head;
	Arena arena;
	void **buf;             /* by buffer id: cap_bufs of them (the largest of the schedules'
				   n_bufs: a 1-bit optimizer's kinds of step allocate apart) */
	int cap_bufs;
	size_t *size;
	const Op **alloc_of;
	int id_params, id_grads, id_part, id_persist, id_pgrads, id_gradpart, id_master, id_states;
	int id_grad32, id_hidden, id_scratch, id_tied;
	int id_lp;              /* BF16_Optimizer's bf16 .grad tensors (BUF_LP_GRADS), else -1 */
	int id_ddp;             /* DistributedDataParallel's bucket tensors (BUF_DDP_BUCKETS), else -1 */
	int id_upcast;          /* update_hp_grads' cast of one .grad tensor (BUF_LP_UPCAST) while
				   it lives, else -1 */
	int id_flat;            /* ZeRO 1-3: the step's flat of the partition's gradients while it
				   lives (Plan.flattens_grads), else -1 */
	int id_scores;          /* selective recompute: a block's scores while they live, else -1 */
	int id_egrads;          /* ZeRO-2: an MoE block's expert gradients (BUF_EXPERT_GRADS) while
				   they live, else -1 */
	int id_accum, id_gpu_temp; /* ZeRO 1-2 under offload: the host's accumulated gradients
				      (BUF_ACCUM_GRADS) and the device's temporary buffer
				      (BUF_OFFLOAD_GPU_TEMP), else -1 */
	int id_grad_copy;       /* ZeRO-3 under offload: the device's copy of a reduced slice's
				   host gradients (BUF_OFFLOAD_GRAD_COPY) while it lives, else -1 */
	int *u_fp32, *u_fp32g, *u_gathered, *u_loaded;
	int *u_grads;           /* ZeRO-2 without contiguous gradients: each unit's own gradient
				   buffer (BUF_UNIT_GRADS) while it lives, else -1 */
	int *u_shard, *u_flat;  /* FSDP: each unit's gradient shard (BUF_GRAD_PART) while it
				   lives, and its newest flat gradient (BUF_FSDP_UNSHARDED) */
	int *u_reduced;         /* FSDP: each unit's reduce-scatter output (its first live
				   BUF_FSDP_REDUCED), which HYBRID_SHARD all-reduces across nodes */
	int *u_act, *u_ckpt;    /* per (micro-batch slot, unit): slot * n_units + unit */
	char *zero_first;       /* per buffer: zero it before the next gradients go in (a
				   contiguous gradient buffer whose reduction has been consumed) */
	long long *persist_off, persist_cnt;
	Dtype pdt, gdt;
	Dtype sdt;              /* the stage-3 partition's storage: pdt, or FSDP's fp32 shards under
				   its MixedPrecision (gathered into pdt: runner_gather_source) */
	int offload;            /* optimizer offload: fp32 gradients, master and states on the host */
	/* ZeRO-Infinity's optimizer on NVMe (runner_nvme.c): the swap files, and which holds what
	   (-1: none); the master weights, states and gradients are staged in the host's swap
	   buffer (BUF_SWAP) while the step updates them, r->buf[] of the first two pointing there */
	SwapDir swap;
	int sw_master, sw_states, sw_grads;
	int id_gradswap;        /* BUF_GRAD_SWAP's id, else -1 */
	float *nv_grads;        /* the staged fp32 gradients, NULL until BUF_SWAP */
	long long nv_slot;      /* elements a slot of the swap buffer holds: the largest sub-group */
	/* ZeRO-Infinity's parameters on NVMe beyond DeepSpeed's host flat (runner_nvme.c): the
	   partition from param_resident on is a file in the parameters' own directory, brought in
	   a unit's slice at a time into the swapper's buffers (BUF_PARAM_STAGING) for its gather,
	   and written after each update of a swapped sub-group */
	SwapDir pswap;
	int sw_params, id_pswap; /* BUF_PARAM_SWAP's file and id, else -1 */
	long long resident;      /* the partition's elements in the host flat (all when none are
				    swapped) */
	void *pstage;            /* BUF_PARAM_STAGING, NULL until allocated */
	long long pstage_elems;  /* its size in elements */
	ElemRange staged[2];     /* the partition ranges it holds, one after the other (a unit's,
				    a tied head's embedding's; lo == hi: none) */
	int params_by_copy;     /* updated parameters reach the device by a copy after the update */
	double loss_scale, loss_sum, sumsq;
	long good_steps, opt_steps;
	int hysteresis, overflow, have_overflow, have_norm;
	/* fp16's dynamic loss scaling (fp16 0: none): DeepSpeed's loss scaler, or under FSDP torch's
	 * ShardedGradScaler; static: a fixed scale */
	int fp16, ls_static, ls_hysteresis;
	long ls_window;
	double ls_min;
	int *inputs, *targets, *sample;
	Seg *segs;
	int n_segs;
	double op_s[RUNNER_N_TIMES]; /* wall time per kind of op, summed over the steps */
	Pending *pend;          /* started collectives in start order; cap_pend of them at most */
	int n_pend, cap_pend;
	int fail_in_flight; /* PARALLAX_TEST_FAIL_IN_FLIGHT: fail at the first op with one pending */
	int opt_done;           /* this step's optimizer ran: later collectives block */
	int opt_begun;          /* this step's update has begun (its first sub-group) */
	int opt_updates;        /* and updates the master weights (no overflow, not a 1-bit
				   optimizer's first step) */
	double wait_s;          /* time in waits for started collectives, summed (op_s has it too) */
	RunnerOverlap ov;
	/* OneBitAdam and ZeroOneAdam (runner_onebit.c): the warm-up's schedule (runner_create's),
	 * the compressed steps' and 0/1 Adam's local steps' (runner_set_onebit's, NULL until
	 * then); r->s is the step's */
	int onebit, zero_one;
	const Schedule *s_warm, *s_compressed, *s_local, *s_init;
	int step_kind;          /* this step's OneBitStep */
	int frozen;             /* 0/1 Adam: this step's variance is frozen */
	int exchanged;          /* this step's compressed all-reduces ran */
	double lrs;             /* 0/1 Adam: the learning rates summed since the last
				   synchronisation (zoadam.py state['lrs']) */
	int id_errors;          /* the error-feedback buffer */
	/* OnebitLamb: per kernel tensor, its scaling coefficient (set at the first compressed
	 * step), the frozen LAMB coefficient's running average and the last factor (lamb.py's
	 * scaling_coeff, lamb_coeff_freeze, last_factor); the step's copy of the momenta */
	int lamb, n_lamb, have_scaling;
	float *lamb_scaling;
	double *lamb_coeff, *lamb_last;
	long long *lamb_off;    /* each tensor's place in the flat and its size */
	size_t *lamb_n;
	int id_step_temp;
	int have_factor;        /* factor and gnorm hold this step's (runner_grad_factor) */
	int predivide;          /* the data-parallel reduce-scatters divide each rank's gradients by
				   dp before they sum them, as DeepSpeed's ZeRO 1-3 do; else the
				   update divides the sums (runner_grad_factor) */
	float factor;
	double gnorm;
	int sparse;             /* deepspeed.sparse_attention: the blocks attend over ix */
	SparseIndex ix;
};

/* ---- storage in fp32, fp16 or bf16 ---- */

static inline size_t dt_bytes(Dtype d) { return (size_t)dtype_bytes(d); }

/* Conversions and sums through the compute backend (device memory on CUDA). */
static inline void to_f32(Runner *r, float *dst, const void *src, size_t n, Dtype d)
{
	r->cb->convert(r->cx, dst, DT_FP32, src, d, n);
}

static inline void from_f32(Runner *r, void *dst, const float *src, size_t n, Dtype d)
{
	r->cb->convert(r->cx, dst, d, src, DT_FP32, n);
}

/* dst += src, dst in storage dtype d, src in src_d */
static inline void add_into(Runner *r, void *dst, const void *src, Dtype src_d, size_t n, Dtype d)
{
	r->cb->add(r->cx, dst, d, src, src_d, n);
}

static inline void zero(Runner *r, int id)
{
	r->cb->zero(r->cx, r->alloc_of[id]->place, r->buf[id], r->size[id]);
}

static inline void *at(void *base, long long elems, Dtype d)
{
	return (char *)base + (size_t)elems * dt_bytes(d);
}

static inline CommDtype comm_dt(Dtype d)
{
	return comm_prec(compute_prec(d));
}

/* The hidden buffer: the gradient stream dx (B, T, C) in fp32, then the stream x in the compute
 * type. */
static inline float *hidden_dx(Runner *r)
{
	return r->buf[r->id_hidden];
}

static inline void *hidden_x(Runner *r)
{
	return hidden_dx(r) + (size_t)r->B * r->T * r->cfg.C;
}

/* Elements of the hidden stream this rank holds between units: B T C, or its B T / t rows under
 * sequence parallelism. */
static inline size_t stream_elems(const Runner *r)
{
	return (size_t)gpt_tp_rows(&r->gtp, r->B, r->T) * (size_t)r->cfg.C;
}

/* Elements of it a pipeline send of activations (grads 0) or their gradients (grads 1) carries,
 * and the sending buffer holds: this tensor-parallel rank's part (plan_pipe_parts). */
static inline size_t pipe_sent_elems(const Runner *r, int grads)
{
	return stream_elems(r) / (size_t)plan_pipe_parts(r->p, grads);
}

/* ZeRO-3 keeps a tensor of numel elements whole on every rank (stage3_param_persistence_
 * threshold). */
static inline int is_persistent(const Runner *r, long long numel)
{
	return r->p->stage == 3 && !r->p->fsdp &&
	       (double)numel <= r->p->sc->ds.zero.persistence_threshold_elems;
}

/* Whether unit u is an MoE block the executor runs on kernels/moe_cpu (runner_moe.c). */
static inline int is_moe_unit(const Runner *r, int u)
{
	return r->moe_on && r->p->units[u].moe;
}

/* A unit's parameters on this rank: the whole unit's, or its tensor-parallel shard's (the
 * head's own, without the tied token embedding). */
static inline size_t unit_params(const Runner *r, int u)
{
	if (is_moe_unit(r, u))
		return moe_cpu_unit_params(&r->cfg, &r->moe);
	return r->gtp.t > 1 ? gpt_tp_unit_params(&r->cfg, r->gtp.t, u) : gpt_cpu_unit_params(&r->cfg, u);
}

/* Of unit_params, those in the dense flat: all but an MoE block's local experts, which lie in the
 * expert flat after it (runner_moe.c). */
static inline size_t unit_dense(const Runner *r, int u)
{
	return is_moe_unit(r, u) ? r->moe_dense : unit_params(r, u);
}

/* The token embedding's elements on this rank: V C, or its V/t vocabulary rows. */
static inline size_t tied_elems(const Runner *r)
{
	return (size_t)(r->cfg.V / (r->gtp.t > 1 ? r->gtp.t : 1)) * (size_t)r->cfg.C;
}

/* ---- runner_state.c ---- */

/* This rank's gradient partition at element off (stage 2-3 on the device, stage 3 offload on
 * the host); NULL at stage 2 under offload, where the partition is the host's fp32 gradients. */
static inline void *runner_partition_grads(const Runner *r, long long off)
{
	return r->id_gradpart >= 0 ? at(r->buf[r->id_gradpart], off, r->gdt) : NULL;
}

/* Gradients about to be reduced over a data-parallel group (n elements of type dt from x):
 * divided by dp first where DeepSpeed does (r->predivide). */
static inline void runner_predivide(Runner *r, void *x, Dtype dt, size_t n)
{
	if (r->predivide)
		r->cb->scale(r->cx, x, dt, n, 1.0f / (float)r->n);
}

/* The optimizer's slices of this rank's partition (r->segs), once the set-up has allocated it. */
void runner_make_segments(Runner *r);
double runner_local_sumsq(const Runner *r);  /* of this rank's gradients, unscaled */
int runner_local_overflow(const Runner *r);  /* any inf or NaN in them */
/* The update of partition elements lo .. hi - 1 (a stage-3 sub-group, or the partition): the
 * step's first call decides for all (fp16 overflow skips the update, the factor and the learning
 * rate), the one reaching the partition's end zeroes the gradients. */
void runner_optimize(Runner *r, StepResult *res, long long lo, long long hi);
/* This step's factor on the gradients (1 / loss scale, 1 / dp for gradients summed over the
 * data-parallel ranks, the clipping coefficient) and, in *norm, their global norm before
 * clipping; computed once a step, from the gradients as they are at the first call. */
float runner_grad_factor(Runner *r, double *norm);

/* ---- runner_onebit.c ---- */

/* NULL when the executor runs plan p's 1-bit optimizer (or it has none), else what it runs
 * instead (runner_supported's message). */
const char *runner_onebit_supported(const Plan *p);
/* The error-feedback buffer's bytes as this executor counts them: a worker error per parameter
 * tensor (the kernels' tensors, each padded as DeepSpeed pads it) and its server error (1/dp). */
double runner_onebit_error_bytes(const Runner *r);
/* Unit u's tensors on this rank in the flat's order, as the 1-bit optimizers see them: its
 * shard's (gpt_tp_unit_tensors; whole without tensor parallelism), and on a pipeline's last
 * stage, after the head's own, its copy of the tied token embedding, which DeepSpeed's pipeline
 * engine keeps as a parameter of that stage. Their count; 0 for a unit of another stage. */
int runner_onebit_tensors(const Runner *r, int u, GptTensor t[GPT_CPU_MAX_TENSORS + 1]);
/* Before a step: r->s becomes the schedule of its kind (r->step_kind); -1 with err when that
 * is a compressed step and no compressed schedule was given. */
int runner_onebit_begin_step(Runner *r, PxError *err);
/* The four collectives of one compressed all-reduce (ROLE_ONEBIT_*): the signs' op runs it all
 * (the momentum's update from this rank's gradients, then onebit_comm_allreduce); the other three
 * were run with it. */
int runner_onebit_coll(Runner *r, const Op *op, PxError *err);
/* A slice of the stage-0 partition's fp32 gradients (fp16: unscaled into the fp32 copy first). */
const float *runner_onebit_grads(Runner *r, const SchedSlice *sl);
/* The optimizer's update of one segment (w, m, v and 0/1 Adam's accumulator after them at their
 * place in the partition; g its fp32 gradients, scaled by factor). */
void runner_onebit_update(Runner *r, const Seg *sg, float *w, float *m, float *v, const float *g,
			  const OpsAdamw *h, float factor);
/* OnebitLamb (runner_lamb.c): its per-tensor coefficients, set up by runner_lamb_create (0 or -1
 * with err) and freed by runner_lamb_free; the signs' op of its compressed step (the momenta
 * updated and scaled, averaged, then the update); its update outside that op (the warm-up's, and
 * a compressed step's on one rank, which exchanges nothing). */
int runner_lamb_create(Runner *r, PxError *err);
void runner_lamb_free(Runner *r);
int runner_lamb_exchange(Runner *r, const Op *op, PxError *err);
/* The compressed steps' schedule c allocates the copy of the momenta before the exchange and the
 * update read it; 0, or -1 with err naming the op (runner_check_step_temp). */
int runner_lamb_check(const Schedule *c, PxError *err);
void runner_lamb_update(Runner *r, const float *g, const OpsAdamw *h, float factor);

/* After a step's update (not a skipped one) at learning rate lr: 0/1 Adam's sum of learning rates
 * moves on, and its error buffers are zeroed where its variance freezes. */
void runner_onebit_step_done(Runner *r, double lr);

/* ---- runner.c ---- */

/* Completes every started collective, in start order, and what each completion allows. */
int runner_wait_all(Runner *r, PxError *err);

/* ---- runner_buf.c ---- */

/* Room for buffer ids up to n_bufs (a schedule with more of them than the first: a 1-bit
 * optimizer's compressed steps, where 1-bit LAMB copies its momenta). 0, or -1 out of memory. */
int runner_grow_bufs(Runner *r, int n_bufs);

/* The step's temporary (BUF_OPT_STEP_TEMP) is allocated in s before the first op of the step that
 * uses it: the optimizer's compute, or with signs also a compressed all-reduce's signs. 0, or -1
 * with err naming the op: "WHO before its COPY (BUF_OPT_STEP_TEMP) is allocated". */
int runner_check_step_temp(const Schedule *s, int signs, const char *who, const char *copy,
			   PxError *err);

/* The stage's flat of parameters at ZeRO 0-2 as this executor's kernels count it. */
long long runner_own_flat_elems(const Runner *r);
/* The schedule's allocation op, and the free of buffer id: each binds the buffer to its role or
 * unbinds it. */
int runner_do_alloc(Runner *r, const Op *op, PxError *err);
void runner_do_free(Runner *r, int id);

/* ---- runner_unit.c ---- */

/* A unit's compute ops (op: its forward, recompute or backward, which moves its gradients to
 * where the schedule reduces them), and BF16_Optimizer's update_hp_grads (COMP_GRAD_ACCUM). */
void runner_forward(Runner *r, const Op *op);
void runner_recompute(Runner *r, const Op *op);
void runner_backward(Runner *r, const Op *op);
void runner_accumulate_hp(Runner *r, const Op *op);
/* The head's token-embedding gradient into the tied buffer tied_id, which holds it until the
 * embedding's backward. */
void runner_head_grads(Runner *r, int tied_id);
/* Where the head's copy of the token embedding lies in the stage's flat buffers (stage 0-2). */
long long runner_tied_off(const Runner *r);

/* ---- runner_coll.c ---- */

/* A collective op: blocking, or started on its stream (r->pend). */
int runner_collective(Runner *r, const Op *op, PxError *err);
/* A copy op between host and device (optimizer offload) or NVMe. */
int runner_copy(Runner *r, const Op *op, PxError *err);
int runner_all_reduce_scalar(Runner *r, Comm *c, float *x, CommRedOp op, PxError *err);
/* This rank's reduced slice of reduction op (mine, cnt elements) into where the update reads
 * it. */
void runner_consume(Runner *r, const Op *op, const void *mine, size_t cnt);
/* A reduced buffer consumed: persistent gradients zeroed, a contiguous buffer zeroed before the
 * next gradients go in. */
void runner_recycle(Runner *r, int buf);
/* Whether op reduces stage 1's gradients through a contiguous buffer. */
int runner_stage1_via_bucket(const Runner *r, const Op *op);
/* Whether op is the updated parameters' copy after the update. */
int runner_is_params_copy(const Op *op);

/* ---- runner_fsdp.c ---- */

/* Unit u's gradient shard: buffer id, -1 once freed. */
void runner_fsdp_bind(Runner *r, int u, int id);
/* Autograd's cat of op's unit's gradients into its flat (bytes at flat). */
int runner_fsdp_cat(Runner *r, const Op *op, void *flat, size_t bytes, PxError *err);
/* FSDP's COMP_GRAD_ACCUM: under no_sync, the newest flat gradient added into the one kept. */
void runner_fsdp_accumulate(Runner *r, const Op *op);

/* ---- runner_pipe.c ---- */

/* A pipeline send or receive (op) of the hidden stream: a forward's activation, a backward's
 * gradient, through the op's buffer; a send is started into q (Pending), waited for where its
 * buffer is next freed or at the step's end. */
int runner_pipe_p2p(Runner *r, const Op *op, Pending *q, PxError *err);
/* Whether op is the all-gather over the tensor-parallel group that makes a received part of the
 * stream whole in its buffer (build_pipe.c pipe_gather); runner_pipe_gather runs it, blocking. */
int runner_pipe_is_gather(const Runner *r, const Op *op);
int runner_pipe_gather(Runner *r, const Op *op, PxError *err);
/* comm_split into *out, collective over world; a group of this rank alone is dropped (*out
 * NULL): nothing to exchange with it. */
int runner_comm_split(Comm *world, int color, int key, int tag, Comm **out, PxError *err);
/* Before a compute op: the received activation (before a forward) or gradient (before a
 * recompute or backward) into the hidden stream, if one waits (a receive may come a step before
 * its compute: Megatron's interleaved order batches it with the previous step's sends, before
 * that step's hidden stream is released). */
void runner_pipe_take(Runner *r, const Op *compute);
/* The communicator of a pipeline-group collective op, NULL when it has none. */
Comm *runner_pipe_comm(const Runner *r, const Op *op);

/* ---- runner_tp.c ---- */

/* This rank's place in its tensor-parallel group (r->gtp), handed to the compute backend;
 * t = 1 without tensor parallelism. */
int runner_tp_setup(Runner *r, PxError *err);
/* r->norm_skip from the replica's range and r->gtp; -1 when out of memory. */
int runner_norm_ranges(Runner *r);
/* Around compute op i: its kernels' collectives take the ops after it (begin), which must all
 * have been taken, and matched, when it returns (end). */
void runner_tp_begin(Runner *r, int i);
int runner_tp_end(Runner *r, int i, PxError *err);
/* The op a compute's kernels take for their collective of kind over group g (total elements of
 * elem_bytes, the schedule's size checked when sized): the next one after the last taken, or
 * NULL, tp_failed set and tp_err naming what the schedule has there. */
const Op *runner_kernel_take(Runner *r, CommGroup g, CollKind kind, size_t total,
			     size_t elem_bytes, int sized);
/* Time in a kernel's collective since t0, counted as the collective's and not its compute op's
 * (run_op). */
void runner_kernel_timed(Runner *r, CollKind kind, double t0);
/* A tensor-parallel collective op met by the walk: one the last compute's kernels took (passed
 * over), else an error naming it. */
int runner_tp_pass(Runner *r, int i, PxError *err);
/* Sequence parallelism's all-reduce of the replicated tensors' gradients (op: the schedule's,
 * its buffer the flattened copy): packed from the gradients (the full flat's at ZeRO 0-1, the
 * partition's pieces at 2-3), summed over the group, put back. */
int runner_tp_replicated(Runner *r, const Op *op, PxError *err);

/* ---- runner_zpp.c ---- */

/* ZeRO++'s communicators into c (those of a group of one rank stay NULL); collective over
 * world. */
int runner_zpp_comms_split(Comm *world, const Plan *p, RunnerComms *c, PxError *err);
int runner_zpp_create(Runner *r, PxError *err); /* its scratch, when the plan has ZeRO++ */
void runner_zpp_destroy(Runner *r);
/* A stage-3 gather runner_zpp_gather runs: qwZ's (1-byte elements), hpZ's (over GROUP_HPZ), and
 * under hpZ the forward's, which keeps the secondary partition. */
int runner_zpp_is_gather(const Runner *r, const Op *op);
int runner_zpp_gather(Runner *r, const Op *op, Comm *c, PxError *err);
/* A qgZ all-to-all (GROUP_NODE, then GROUP_XNODE, which adds this rank's summed slice into the
 * gradient partition at the op's slice). */
int runner_zpp_reduce(Runner *r, const Op *op, PxError *err);
/* The partition range op works on: its slice's (a stage-3 optimizer sub-group's), else the
 * whole partition. */
static inline void runner_op_range(const Runner *r, const Op *op, long long *lo, long long *hi)
{
	if (op->slice >= 0) {
		*lo = r->s->slices[op->slice].part_off;
		*hi = *lo + r->s->slices[op->slice].part_elems;
	} else {
		*lo = 0;
		*hi = r->st->part_elems;
	}
}

/* Where segment sg meets partition elements lo .. hi - 1: its elements *a .. *b - 1, in
 * partition coordinates; 0 when they do not meet. */
static inline int runner_seg_piece(const Seg *sg, long long lo, long long hi, long long *a,
				   long long *b)
{
	*a = sg->part_off > lo ? sg->part_off : lo;
	*b = sg->part_off + sg->n < hi ? sg->part_off + sg->n : hi;
	return *b > *a;
}

/* Where partition element a's master weight is, during the update of the range from lo: the
 * whole partition's buffer, or the NVMe swap buffer's slot, which holds the range alone. */
static inline float *runner_master_at(const Runner *r, long long a, long long lo)
{
	return (float *)r->buf[r->id_master] + (r->nv_grads ? a - lo : a);
}

/* ---- runner_nvme.c ---- */

/* NULL when the executor runs plan p's NVMe offload (or p has none), else what it runs instead. */
const char *runner_nvme_supported(const Plan *p);
/* The optimizer's nvme_path is a directory the swap files can be made in (p with the optimizer
 * on NVMe); err names the scenario and the key. */
int runner_nvme_check_path(const Plan *p, PxError *err);
/* An NVMe buffer of bytes (op: its allocation): a swap file; r->buf[op->buf] stays NULL until
 * the swap buffer stages it. */
int runner_nvme_alloc(Runner *r, const Op *op, size_t bytes, PxError *err);
void runner_nvme_free(Runner *r, int id);
/* The host's swap buffer as this executor sizes it, and its regions once allocated (swap). */
size_t runner_nvme_staging_bytes(const Runner *r);
int runner_nvme_stage(Runner *r, void *swap, size_t bytes, PxError *err);
/* An NVMe read or write of the schedule (op). */
int runner_nvme_copy(Runner *r, const Op *op, PxError *err);
/* The initial master weights into their file, from the parameters, after the set-up; the counts
 * of moved bytes start again. */
int runner_nvme_sync(Runner *r, PxError *err);
/* Partition elements off .. off + n - 1 of this rank's parameters into dst, from where they are
 * in memory: the host flat up to r->resident, beyond it the swapper's buffers, which the last
 * NVMe read filled. -1 (nothing copied) when that read did not bring them in. */
int runner_nvme_params_into(const Runner *r, long long off, long long n, void *dst);
/* What a stage-3 gather sends for this rank's partition elements off .. off + n - 1: the host
 * flat in place, or (beyond r->resident) those elements copied from the swapper's buffers into
 * piece, its place in the gathered buffer, so that the buffers are free again when the gather is
 * started. NULL with err when the last NVMe read did not bring them in. */
const void *runner_gather_source(const Runner *r, long long off, long long n, void *piece,
				 PxError *err);
/* The partition's elements off .. off + n - 1 between host (its storage dtype, r->sdt) and their
 * places, written there or read from there: the host flat, the swap file beyond r->resident. */
int runner_nvme_params_io(Runner *r, int write, long long off, void *host, long long n,
			  PxError *err);
/* Segment sg's parameters a .. b - 1 (partition elements) in fp32 into dst: from memory, or
 * beyond the host flat from the file through the swapper's buffers. */
int runner_nvme_params_f32(Runner *r, const Seg *sg, long long a, long long b, float *dst,
			   PxError *err);
/* r->segs' first n split where the host flat ends: those beyond it have no parameters in memory
 * (Seg.params NULL). Returns the new count. */
int runner_nvme_split_segments(Runner *r, int n);
/* Whether buffer id is an NVMe file; a state file's whole contents to or from host (its size:
 * r->size[id]), for checkpoints. */
int runner_nvme_is_file(const Runner *r, int id);
int runner_nvme_file_io(const Runner *r, int id, int write, void *host, PxError *err);

/* ---- runner_moe.c ---- */

/* NULL when the executor runs plan p's MoE layout, else what it runs instead (runner_supported's
 * message). */
const char *runner_moe_supported(const Plan *p);
/* The MoE blocks' kernels (r->moe) and where their experts lie (r->expert_off, r->own_expert),
 * after the tensor-parallel set-up; nothing for a dense model. */
int runner_moe_setup(Runner *r, PxError *err);
/* The sample index of the first of the B sequences this rank trains in micro-batch mb of step
 * (the run's sample order: every data-parallel rank's micro-batch in turn, each step after the
 * last's train_batch). */
uint64_t runner_first_sample(const Runner *r, long step, int mb);
/* An MoE block's forward (or full recompute) and backward of op's unit and micro-batch on the
 * CPU kernels; their all-to-alls take the schedule's next expert-parallel ops after the compute
 * op (runner_tp_begin / runner_tp_end). */
void runner_moe_forward(Runner *r, const Op *op, const void *params, const void *x, void *y,
			void *acts);
void runner_moe_backward(Runner *r, const Op *op, const void *params, float *grads,
			 const void *acts, float *dx);
/* Selective recompute: the MoE block's attention probabilities rebuilt into the live scores'
 * buffer from its kept q, k, v. */
void runner_moe_scores(Runner *r, void *acts);
/* The activations allocated by op being freed: a dropless MoE block's slot part with them. */
void runner_moe_free_acts(Runner *r, const Op *op);
/* What runner_moe_setup allocated (runner_destroy has freed every buffer, slot parts with
 * their activations). */
void runner_moe_free(Runner *r);
/* A collective over the expert-data-parallel group that names no buffer (the expert flat's
 * reductions and gathers, build_expert_flat): on the expert part of the flat. */
int runner_moe_flat_coll(Runner *r, const Op *op, PxError *err);
/* The optimizer's slices of the expert flat (Segs into out): one, the flat's contiguous slice,
 * at stage 0-1; at stage 2 one per MoE block. Returns how many (0 when the stage has none). */
int runner_moe_segments(const Runner *r, Seg *out);
/* Stage 2: where MoE block u's slice of its experts (1/edp of them) starts in the gradient
 * partition, after the dense partition. */
long long runner_moe_part_off(const Runner *r, int u);

#endif
