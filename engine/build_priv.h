/* build_priv: the schedule builder's insides, shared by its files: build.c (set-up, stage 3's
 * gathers, a unit's forward and backward, the micro-batches, the entry points), build_grads.c
 * (gradient reductions: ZeRO's buckets, BF16_Optimizer's and the engine's all-reduces, DDP's
 * buckets), build_fsdp.c (FSDP's units), build_pipe.c (a pipeline stage's order, sends and
 * receives) and build_step.c (after the micro-batches: the optimizer step). Not for use outside
 * engine/build*.c. */
#ifndef PX_BUILD_PRIV_H
#define PX_BUILD_PRIV_H

#include "build.h"

/* Gradients waiting in a bucket for their reduction (stage 2-3): dense over dp, experts over edp. */
typedef struct Bucket {
	CommGroup group;
	long long elems, offset;
	int unit;                      /* the unit (stage 3) or bucket's first unit (stage 2) */
	int plan_bucket;               /* its BucketPlan (stage 2), -1 otherwise */
	long long part_off;            /* this rank's slice in its partition (SchedSlice), -1: none
					  stated */
	int buf;                       /* the buffer the reduction reads, -1 for none */
	int *bufs, n_bufs, cap_bufs;   /* unit gradients the reduction releases (a ZeRO-2 bucket
					  without contiguous gradients: each of its units') */
	int *prev, n_prev, cap_prev;   /* ZeRO-2 without contiguous gradients, with overlap_comm:
					  the last reduction's, released by the next one or at the
					  micro-batch's end (previous_reduced_grads) */
} Bucket;

typedef struct Builder {
	const Plan *p;
	int stage;              /* pipeline stage */
	long long m;            /* micro-batches it builds: the plan's, or a few to count ops */
	int mb;                 /* the micro-batch the ops being added belong to (Op.mb) */
	Schedule *s;
	int oom;
	int *gathered;          /* stage 3: buffer id per unit, -1 when not gathered */
	int secondary_held;     /* hpZ: this step's first forward has kept the secondary partition
				   (DeepSpeed's ds_secondary_tensor, dropped only after the optimizer
				   step): later forwards gather from it too */
	double live_elems;      /* stage 3: gathered elements now on the GPU */
	int *act, *ckpt;        /* per (micro-batch slot, unit): activation and checkpoint buffers */
	int *cast;              /* the same: torch autocast's 16-bit weight copies */
	int *pipe_in, *pipe_out; /* pipelined, per (micro-batch, local chunk): the received input and
				    the sent output (BUF_PIPE_INPUT, BUF_PIPE_OUTPUT) */
	int id_pipe_grad;       /* pipelined: the received gradient's buffer, -1 when none */
	long long *expert_start; /* each unit's first expert element in the stage's expert flat */
	int *bucket_of;          /* stage 0-2: each unit's bucket in its stage */
	Bucket dense, expert;
	int tied_grad;          /* head's gradient of the tied embedding, until the embedding's turn */
	int xl_grads;           /* ZeRO 2-3: the unit now in backward's extra-large gradients
				   (BUF_XL_GRADS), until the reduction that reads them */
	int own_grads;          /* ZeRO 2-3 without contiguous gradients: the unit now in backward's
				   own gradient buffer (its .grad tensors), -1 when none */
	int id_params, id_grads, id_part, id_persist; /* set-up buffers collectives work on */
	int id_gradpart;        /* stage 2-3's gradient partition (at 3 under offload the host's),
				   -1 when none */
	int id_ef;              /* the 1-bit optimizers' worker and server errors, -1 when none */
	int id_lp;              /* BF16_Optimizer's bf16 .grad tensors, -1 when none */
	int buckets[2], n_buckets, cur_bucket; /* contiguous gradient buffers, used in turn */
	int id_ddp;                /* DistributedDataParallel's bucket tensors (build_ddp_plan) */
	long long *ddp_at;         /* where each of its buckets starts in the flat, backward order */
	int n_ddp, ddp_next;       /* its buckets; the next to all-reduce in this backward */
	int ddp_sync;              /* this micro-batch's backward all-reduces them (the last's) */
	int *fsdp_acc;             /* FSDP: each unit's whole gradient kept under no_sync, -1 */
	int *fsdp_shard;           /* FSDP: each unit's gradient shard (_saved_grad_shard), from its
				      first reduce-scatter to the step's zero_grad, -1 */
	int *fsdp_post;            /* FSDP2: each unit's shard kept after its forward for its
				      backward (BUF_FSDP_POST_FORWARD), -1 */
	int fsdp_head;             /* FSDP: the root's last unit's gradients, until its first's */
	int *fsdp_left;            /* FSDP: each layer's gradients of what it leaves to the root
				      (BUF_FSDP_ROOT_GRADS), until the root's hook, -1 */
	int fsdp_sync;             /* FSDP: this micro-batch reduce-scatters (not under no_sync) */
} Builder;

#define DO(call)                      \
	do {                          \
		if ((call) != 0)      \
			b->oom = 1;   \
	} while (0)

static inline long long min_ll(long long a, long long b) { return a < b ? a : b; }
static inline long long max_ll(long long a, long long b) { return a > b ? a : b; }
static inline long long ceil_div(long long a, long long d) { return (a + d - 1) / d; }

static inline int alloc(Builder *b, Place place, MemCat cat, BufWhat what, int unit,
			double bytes)
{
	int id = -1;
	if (bytes > 0 && sched_alloc(b->s, place, cat, what, unit, bytes, &id))
		b->oom = 1;
	else if (id >= 0 && b->mb)
		sched_set_mb(b->s, b->mb);
	return id;
}

/* A unit's compute in the current micro-batch, moving `bytes` through memory beyond what its
 * unit's activations say (sim/opcost.c). */
static inline void compute_moving(Builder *b, CompKind kind, int unit, double flops,
				  double bytes)
{
	if (sched_compute(b->s, kind, unit, flops, bytes))
		b->oom = 1;
	else if (b->mb)
		sched_set_mb(b->s, b->mb);
}

static inline void compute(Builder *b, CompKind kind, int unit, double flops)
{
	compute_moving(b, kind, unit, flops, 0);
}

static inline void release(Builder *b, int *id)
{
	if (*id >= 0)
		DO(sched_free_buf(b->s, *id));
	*id = -1;
}

/* A collective over group g; a group of one rank has nothing to exchange. Returns the op, or NULL
 * when none was added. */
static inline Op *coll(Builder *b, CollKind kind, OpRole role, CommGroup g, int unit,
		       int64_t elems, int elem_bytes, int buf, int64_t off)
{
	long long n = b->p->spans[g].n;
	if ((n <= 1 && kind != COLL_P2P && kind != COLL_P2P_RECV) || elems <= 0)
		return NULL;
	if (sched_coll(b->s, kind, role, g, (int)n, unit, elems, elem_bytes, buf, off)) {
		b->oom = 1;
		return NULL;
	}
	return &b->s->ops[b->s->n - 1];
}

/* State where op's partitioned data lies (SchedSlice); op NULL (nothing was added): nothing. */
static inline void slice(Builder *b, const Op *op, int bucket, long long part_off,
			 long long part_elems)
{
	if (op && part_off >= 0)
		DO(sched_set_slice(b->s, bucket, part_off, part_elems));
}

static inline void copy(Builder *b, CopyDir dir, OpRole role, int unit, double bytes)
{
	DO(sched_copy(b->s, dir, role, unit, bytes));
}

/* A quantized collective (ZeRO++) over group g: elems at 1 byte (INT8) or half a byte (INT4, two
 * a byte), plus `scales` fp32 scales (the groups of every rank's piece together). */
static inline Op *quantized(Builder *b, CollKind kind, OpRole role, CommGroup g, int unit,
			    long long elems, int bits, long long scales, int buf, long long off)
{
	long long stored = bits == 4 ? ceil_div(elems, 2) : elems;
	Op *op = coll(b, kind, role, g, unit, stored, 1, buf, off);
	if (op)
		op->bytes += 4.0 * (double)scales;
	return op;
}

/* The tied token embedding's elements on this rank: its V/t vocabulary rows (0 untied). */
static inline long long tied_local(const Plan *p)
{
	return ceil_div(model_tied_elems(&p->sc->model), p->par.tp);
}

/* ---- build.c ---- */

void build_gather(Builder *b, int u, int backward);
void build_ungather(Builder *b, int u);
void build_forward_unit(Builder *b, int slot, int u);
void build_backward_unit(Builder *b, int slot, int u);
double build_exec_scratch_bytes(const Plan *p);

/* ---- build_grads.c ---- */

int build_bucket_count(const Plan *p);
void build_alloc_buckets(Builder *b, int n);
int build_next_bucket(Builder *b);
void build_release_buckets(Builder *b);
void build_release_prev(Builder *b, Bucket *k);
void build_flush_bucket(Builder *b, Bucket *k);
void build_reduce_dense(Builder *b, int unit, int plan_bucket, long long part_off,
			long long elems, int buf, long long offset);
int build_zero_cast(Builder *b, CollKind kind, int unit, long long elems, long long mine,
		    int *send);
void build_cast_through(Builder *b, int *cast, int *send, long long part_off);
int build_grads_direct(const Plan *p);
int build_ds_ipg_buffers(const Plan *p);
long long build_xl_grad_elems(const Plan *p, int u);
int build_expert_grads_held(const Plan *p, int u);
long long build_expert_part_off(const Builder *b, int u);
void build_grads_dest(Builder *b, int u, int *buf, long long *off);
void build_unit_grads(Builder *b, int u, int egrads);
void build_accumulate_hp(Builder *b, int lo, int hi);
void build_expert_flat(Builder *b, CollKind kind, OpRole role, long long total, int elem_bytes,
		       long long part_base);
void build_bf16_reduce(Builder *b);
void build_engine_allreduce(Builder *b);
int build_ddp_plan(Builder *b);
void build_ddp_ready(Builder *b, long long lo);

/* ---- build_fsdp.c ---- */

long long build_fsdp_tied(const Plan *p, int u);
void build_fsdp_forward_gather(Builder *b, int u);
void build_fsdp_forward_done(Builder *b, int u);
void build_fsdp_backward_gather(Builder *b, int u);
void build_fsdp_unit_grads(Builder *b, int u);

/* ---- build_pipe.c ---- */

long long build_pipe_elems(const Plan *p);
int build_pipelined(Builder *b, PxError *err);

/* ---- build_step.c ---- */

void build_optimizer_step(Builder *b);

#endif
