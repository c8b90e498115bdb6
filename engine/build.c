#include "build.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onebit.h"
#include "optim.h"
#include "pipeline.h"

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
	int id_ddp;                /* DistributedDataParallel's bucket tensors (ddp_plan) */
	long long *ddp_at;         /* where each of its buckets starts in the flat, backward order */
	int n_ddp, ddp_next;       /* its buckets; the next to all-reduce in this backward */
	int ddp_sync;              /* this micro-batch's backward all-reduces them (the last's) */
	int *fsdp_acc;             /* FSDP: each unit's whole gradient kept under no_sync, -1 */
	int *fsdp_shard;           /* FSDP: each unit's gradient shard (_saved_grad_shard), from its
				      first reduce-scatter to the step's zero_grad, -1 */
	int fsdp_head;             /* FSDP: the root's last unit's gradients, until its first's */
	int fsdp_sync;             /* FSDP: this micro-batch reduce-scatters (not under no_sync) */
} Builder;

#define DO(call)                      \
	do {                          \
		if ((call) != 0)      \
			b->oom = 1;   \
	} while (0)

static long long min_ll(long long a, long long b) { return a < b ? a : b; }
static long long max_ll(long long a, long long b) { return a > b ? a : b; }
static long long ceil_div(long long a, long long d) { return (a + d - 1) / d; }

static int alloc(Builder *b, Place place, MemCat cat, BufWhat what, int unit, double bytes)
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
static void compute_moving(Builder *b, CompKind kind, int unit, double flops, double bytes)
{
	if (sched_compute(b->s, kind, unit, flops, bytes))
		b->oom = 1;
	else if (b->mb)
		sched_set_mb(b->s, b->mb);
}

static void compute(Builder *b, CompKind kind, int unit, double flops)
{
	compute_moving(b, kind, unit, flops, 0);
}

static void release(Builder *b, int *id)
{
	if (*id >= 0)
		DO(sched_free_buf(b->s, *id));
	*id = -1;
}

/* A collective over group g; a group of one rank has nothing to exchange. Returns the op, or NULL
 * when none was added. */
static Op *coll(Builder *b, CollKind kind, OpRole role, CommGroup g, int unit, int64_t elems,
		int elem_bytes, int buf, int64_t off)
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
static void slice(Builder *b, const Op *op, int bucket, long long part_off, long long part_elems)
{
	if (op && part_off >= 0)
		DO(sched_set_slice(b->s, bucket, part_off, part_elems));
}

static void copy(Builder *b, CopyDir dir, OpRole role, int unit, double bytes)
{
	DO(sched_copy(b->s, dir, role, unit, bytes));
}

long long build_qwz_groups(long long elems)
{
	if (elems <= 0)
		return -1;
	long long g = ceil_div(elems, BUILD_QWZ_TARGET_GROUP);
	while (g < elems && elems % (8 * g))
		g++;
	while (elems % (16 * g) == 0 && elems / g > BUILD_QWZ_TARGET_GROUP)
		g *= 2;
	return elems % (8 * g) == 0 && elems > g ? g : -1;
}

/* A quantized collective (ZeRO++) over group g: elems at 1 byte (INT8) or half a byte (INT4, two
 * a byte), plus `scales` fp32 scales (the groups of every rank's piece together). */
static Op *quantized(Builder *b, CollKind kind, OpRole role, CommGroup g, int unit, long long elems,
		     int bits, long long scales, int buf, long long off)
{
	long long stored = bits == 4 ? ceil_div(elems, 2) : elems;
	Op *op = coll(b, kind, role, g, unit, stored, 1, buf, off);
	if (op)
		op->bytes += 4.0 * (double)scales;
	return op;
}

/* qwZ's scales for a gather of n elements over k ranks: each rank's n / k in its groups (a piece
 * DeepSpeed cannot group is counted in groups of the target size: the executor refuses it). */
static long long qwz_scales(long long n, long long k)
{
	long long g = build_qwz_groups(n / k);
	return k * (g > 0 ? g : ceil_div(n / k, BUILD_QWZ_TARGET_GROUP));
}

/* Elements of the stream a pipeline stage sends per micro-batch (and its boundary buffers hold):
 * b s h, or under sequence parallelism this tensor-parallel rank's rows of it, b s h / t (Megatron
 * sends each rank's sequence shard to the same rank of the next stage: nothing to gather). */
static long long pipe_elems(const Plan *p)
{
	long long bsh = p->shape.b * p->shape.s * p->sc->model.h;
	return p->shape.sp ? ceil_div(bsh, p->par.tp) : bsh;
}

/* Elements of that stream one send carries (plan_pipe_parts). */
static long long pipe_part(const Plan *p, long long bsh, int grads)
{
	return bsh / plan_pipe_parts(p, grads);
}

/* A receive of part of the stream into buf, made whole there by the all-gather over the
 * tensor-parallel group. */
static void pipe_gather(Builder *b, OpRole role, long long bsh, int buf)
{
	const Plan *p = b->p;
	long long part = pipe_part(p, bsh, role == ROLE_BACKWARD);
	coll(b, COLL_P2P_RECV, role, GROUP_PP, -1, part, p->param_bytes, buf, 0);
	if (part < bsh)
		coll(b, COLL_ALL_GATHER, role, GROUP_TP, -1, bsh, p->param_bytes, buf, 0);
}

/* ---- set-up: what lives for the whole run ---- */

static void alloc_buckets(Builder *b, int n);
static void ddp_ready(Builder *b, long long lo);

static void setup(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	const ClusterSpec *c = &p->sc->cluster;
	const DsZero *z = &p->sc->ds.zero;
	double part = (double)st->part_elems, flat = (double)(st->flat_dense + st->flat_expert);

	if (p->cuda_runtime) { /* the CUDA runtime's own memory */
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUDA_CONTEXT, -1, c->cuda_context_bytes);
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUBLAS_WORKSPACE, -1, c->cublas_workspace_bytes);
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_NCCL, -1, c->nccl_buffers_bytes);
	}
	if (p->sc->ds.dtype == DT_FP16) /* loss scale and overflow flag */
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_LOSS_SCALER, -1, 8);

	if (p->stage < 3) {
		b->id_params = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PARAMS, -1, flat * p->param_bytes);
		if (p->stage < 2)
			b->id_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRADS, -1, flat * p->grad_bytes);
		/* BF16_Optimizer's bf16 .grad tensors: each backward drops them first
		 * (clear_lp_grads) and autograd makes them again as it goes, so that they are
		 * whole from one backward to the next, through the optimizer step and the next
		 * forward. The schedule holds them whole throughout: exact wherever they are
		 * whole, as at the end of every forward; a backward's early moments are
		 * over-stated by the .grad tensors it has not made yet (docs/models.md). */
		if (p->bf16_optimizer)
			b->id_lp = alloc(b, PLACE_GPU, CAT_GRADS, BUF_LP_GRADS, -1,
					 flat * p->param_bytes);
		if (p->sc->framework == FRAMEWORK_PYTORCH && p->dp > 1)
			b->id_ddp = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_DDP_BUCKETS, -1,
					  (double)st->local_dense * p->grad_bytes);
	} else {
		/* parameters on NVMe: DeepSpeed's pinned host flat, holding the partition's first
		 * sub-groups, and the rest on NVMe (plan.c plan_param_host) */
		int nvme = p->param_place == PLACE_NVME;
		b->id_part = alloc(b, nvme ? PLACE_CPU : p->param_place, CAT_PARAMS, BUF_PARAM_PART,
				   -1, (nvme ? (double)st->param_host_flat : part) * p->shard_bytes);
		if (nvme && st->param_resident < st->part_elems)
			alloc(b, PLACE_NVME, CAT_PARAMS, BUF_PARAM_SWAP, -1,
			      (double)(st->part_elems - st->param_resident) * p->param_bytes);
		/* padded to dp, so that their collectives can run in place */
		double persist = (double)(ceil_div(st->persist_elems, p->dp) * p->dp);
		b->id_persist = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PERSISTENT, -1,
				      persist * p->param_bytes);
		b->id_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_PERSIST_GRADS, -1,
				    persist * p->grad_bytes);
		/* hpZ's secondary partition lies where the primary does: on the host under
		 * parameter offload (partition_parameters.py _partition_param_sec allocates it on
		 * remote_device, pinned) */
		alloc(b, p->param_place == PLACE_CPU ? PLACE_CPU : PLACE_GPU, CAT_PARAMS,
		      BUF_SECONDARY, -1, (double)st->secondary_elems * p->param_bytes);
		if (p->param_place == PLACE_NVME)
			alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_PARAM_STAGING, -1,
			      (double)z->offload_param.buffer_count * z->offload_param.buffer_size *
				      p->param_bytes);
	}
	/* the reduced gradients' partition in the accumulation dtype: on the device, or at stage 3
	 * under offload on the host (stage3.py grad_partitions_flat_buffer, on its self.device);
	 * stage 1-2 offload reduces straight into the host's fp32 gradients (stage_1_and_2.py) */
	Place gp = p->opt_place == PLACE_GPU ? PLACE_GPU : PLACE_CPU;
	if ((p->stage == 3 && !p->fsdp) || (p->stage == 2 && gp == PLACE_GPU)) /* FSDP: per unit */
		b->id_gradpart = alloc(b, gp, CAT_GRADS, BUF_GRAD_PART, -1, part * p->grad_bytes);
	/* the fp32 gradients the host's optimizer reads: with the optimizer on NVMe they live in
	 * the swap buffer while a sub-group steps, and in their files between steps (its
	 * initialize_optimizer_states' gradient_buffer does not outlive the call); FSDP's
	 * CPUOffload pins them at wrapping (flat_param._cpu_grad) */
	if (p->stage >= 1 && p->opt_place == PLACE_CPU)
		alloc(b, PLACE_CPU, CAT_GRADS, BUF_GRAD_FP32, -1, part * 4);

	/* ZeRO 1-2 with the optimizer on the CPU (stage_1_and_2.py __init__ under cpu_offload): two
	 * buffers of the largest parameter in the model's dtype, one on each side; with gradient
	 * accumulation, the host's copy of the partition's gradients in the parameters' dtype
	 * (accumulated_grads_in_cpu, made by copy_grads_in_partition, which runs with contiguous
	 * gradients). DeepSpeed keeps each tensor the partition touches there whole; the tensors'
	 * parts beyond the partition's ends, which differ rank to rank, are left out. */
	if (p->stage >= 1 && p->stage <= 2 && p->opt_place == PLACE_CPU) {
		double big = (double)st->max_tensor * p->param_bytes;
		alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_OFFLOAD_GPU_TEMP, -1, big);
		alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_OFFLOAD_CPU_TEMP, -1, big);
		if (p->m > 1 && p->contiguous_grads)
			alloc(b, PLACE_CPU, CAT_GRADS, BUF_ACCUM_GRADS, -1, part * p->param_bytes);
	}
	if (p->opt_place == PLACE_NVME) /* the gradients' swap files beside the states' */
		alloc(b, PLACE_NVME, CAT_GRADS, BUF_GRAD_SWAP, -1, part * 4);
	alloc(b, p->opt_place, CAT_OPTIM, BUF_MASTER, -1, part * p->master_bytes);
	alloc(b, p->opt_place, CAT_OPTIM, BUF_OPT_STATES, -1, st->opt_state_bytes);
	if (st->error_feedback_bytes > 0)
		b->id_ef = alloc(b, p->opt_place, CAT_OPTIM, BUF_ERROR_FEEDBACK, -1,
				 st->error_feedback_bytes);
	if (p->opt_place == PLACE_NVME) /* each swap buffer holds one fp32 tensor of the largest
					   sub-group (plan.c plan_subgroups) */
		alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_SWAP, -1,
		      (double)z->offload_optimizer.buffer_count * (double)st->step_elems * 4);
	/* a stage holding a chunk before the model's last receives gradients from the next stage
	 * into one buffer, allocated at its first receive and kept (DeepSpeed's grad_layer) */
	if (p->par.pp > 1 && (b->stage < p->par.pp - 1 || p->par.virtual_stages > 1))
		b->id_pipe_grad = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_PIPE_GRAD, -1,
					(double)pipe_elems(p) * p->param_bytes);
	if (p->stage == 3) /* stage 3's contiguous gradient buffer lives as long as the optimizer */
		alloc_buckets(b, 1);
}

/* ---- stage 3: gathering units ---- */

static void gather(Builder *b, int u, int backward)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	long long whole = up->gather_dense + up->gather_expert;
	if (b->gathered[u] >= 0 || whole == 0)
		return;
	long long off[2], len[2]; /* the partition slices it reads */
	plan_gather_slices(p, u, off, len);
	/* hpZ's gathers read the secondary partition instead: 1/hpz of each dense piece */
	int secondary = (backward || b->secondary_held) && p->hpz > 1;
	double part_bytes = (secondary ? (double)(up->gather_dense / p->hpz + up->part_expert) :
					 (double)(len[0] + len[1])) * p->shard_bytes;
	/* from NVMe: those partitions beyond what the host flat holds (plan_param_host) */
	long long swapped = 0, resident = p->stages[b->stage].param_resident;
	for (int k = 0; k < 2; k++)
		swapped += off[k] + len[k] - min_ll(off[k] + len[k], max_ll(off[k], resident));
	if (p->param_place == PLACE_NVME && swapped > 0)
		copy(b, COPY_NVME_READ, ROLE_PREFETCH, u, (double)swapped * p->param_bytes);
	if (p->param_place != PLACE_GPU)
		copy(b, COPY_H2D, ROLE_PREFETCH, u, part_bytes);
	int id = b->gathered[u] = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_GATHERED, u,
					(double)whole * p->param_bytes);
	/* the unit's own flat, then (a tied head) the embedding's flat after it; op->unit names
	 * whose partition is gathered, the slice where this rank's piece of it lies (hpZ's: in the
	 * secondary partition) */
	long long pieces[2][2] = {{u, up->own_gather}, {0, up->gather_dense - up->own_gather}};
	long long at = 0;
	for (int k = 0; k < 2; k++) {
		int src = (int)pieces[k][0];
		long long n = pieces[k][1];
		long long h = p->hpz;
		if (secondary)
			/* hpZ: from the secondary partition, inside the node; qwZ quantizes it too
			 * (DeepSpeed's all_gather_coalesced takes the same quantize flag for either
			 * partition) */
			slice(b, p->qwz ? quantized(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_HPZ, src, n,
						    8, qwz_scales(n, h), id, at)
					: coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_HPZ, src, n,
					       p->param_bytes, id, at),
			      -1, p->units[src].secondary_off, n / h);
		else if (p->qwz) /* qwZ: INT8 weights with their scales */
			slice(b, quantized(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_DP, src, n, 8,
					   qwz_scales(n, p->dp), id, at),
			      -1, p->units[src].part_off, n / p->dp);
		else /* over the partition's group (FSDP's HYBRID_SHARD: the node's) */
			slice(b, coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, p->shard_group, src, n,
				      p->param_bytes, id, at), -1, p->units[src].part_off,
			      n / p->shards);
		at += n;
	}
	slice(b, coll(b, COLL_ALL_GATHER, ROLE_PREFETCH, GROUP_EDP, u, up->gather_expert,
		      p->param_bytes, id, at), -1, up->part_off + up->part_dense, up->part_expert);
	b->live_elems += (double)whole;
}

static void ungather(Builder *b, int u)
{
	if (b->gathered[u] < 0)
		return;
	release(b, &b->gathered[u]);
	b->live_elems -= (double)(b->p->units[u].gather_dense + b->p->units[u].gather_expert);
}

/* Gather u, then prefetch the units that follow in direction dir while the not-yet-used gathered
 * elements stay within stage3_prefetch_bucket_size and everything live within
 * stage3_max_live_parameters. */
static void gather_with_prefetch(Builder *b, int u, int dir)
{
	const Plan *p = b->p;
	const DsZero *z = &p->sc->ds.zero;
	double ahead = 0;

	gather(b, u, dir < 0);
	for (int j = u + dir; j >= 0 && j < p->n_units; j += dir) {
		double g = (double)(p->units[j].gather_dense + p->units[j].gather_expert);
		if (g == 0)
			continue;
		if (ahead + g > z->prefetch_bucket_elems)
			break;
		ahead += g;
		if (b->gathered[j] >= 0)
			continue;
		if (b->live_elems + g > z->max_live_elems)
			break;
		gather(b, j, dir < 0);
	}
}

/* ---- gradients: buckets (stage 2-3) ---- */

/* How ZeRO 1-3 reduce a bucket of gradients over their data-parallel group. Stage 1-2
 * (stage_1_and_2.py reduce_ipg_grads): with contiguous gradients, average_tensor's
 * reduce-scatter, or with reduce_scatter off its all-reduce; without, buffered_reduce_fallback's
 * all-reduce of flattened buckets. Stage 3 (stage3.py __reduce_and_partition_ipg_grads): an
 * all-reduce only with contiguous gradients and reduce_scatter off, else reduce_scatter_coalesced.
 * Stage 1 under BF16_Optimizer (Plan.zero_optimizer 0) all-reduces: engine.py's
 * allreduce_gradients finds no reduce_gradients on it and falls back to
 * buffered_allreduce_fallback over the fp32 gradients it returns (get_grads_for_reduction).
 * Stage 1 without contiguous gradients is priced as with them (a reduce-scatter, half
 * DeepSpeed's all-reduce bytes): a known deviation that keeps contiguous_gradients unread below
 * stage 2, where the sweep shares results between points (sim/sweep.c UNREAD). */
CollKind build_zero_reduce_kind(const Plan *p)
{
	const DsZero *z = &p->sc->ds.zero;
	if (p->bf16_optimizer) /* it has no reduce_gradients: the engine's
				  buffered_allreduce_fallback */
		return COLL_ALL_REDUCE;
	int contiguous = p->contiguous_grads || p->stage == 1;
	int rs = p->stage == 3 ? z->reduce_scatter || !contiguous : z->reduce_scatter && contiguous;
	return rs ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE;
}

/* Append id to the list (*ids, *n, *cap), growing it; b->oom when it cannot. */
static void push_id(Builder *b, int **ids, int *n, int *cap, int id)
{
	if (id < 0)
		return;
	if (*n == *cap) {
		int c = *cap ? 2 * *cap : 16;
		int *grown = realloc(*ids, (size_t)c * sizeof(*grown));
		if (!grown) {
			b->oom = 1;
			return;
		}
		*ids = grown;
		*cap = c;
	}
	(*ids)[(*n)++] = id;
}

static void hold(Builder *b, Bucket *k, int id)
{
	push_id(b, &k->bufs, &k->n_bufs, &k->cap_bufs, id);
}

/* The previous reduction's deferred gradients go (the next reduction, or the epilogue). */
static void release_prev(Builder *b, Bucket *k)
{
	for (int i = 0; i < k->n_prev; i++)
		release(b, &k->prev[i]);
	k->n_prev = 0;
}

/* Whether bucket k's reduction reads a flattened copy of its units' own gradient buffers:
 * without contiguous gradients, the dense reduction of a ZeRO-2 bucket (stage_1_and_2.py
 * buffered_reduce_fallback: allreduce_bucket flattens them) or of a ZeRO-3 unit
 * (stage3.py __avg_scatter_grads: reduce_scatter_coalesced concatenates the ranks' pieces). */
static int flattens(const Builder *b, const Bucket *k)
{
	const Plan *p = b->p;
	return k == &b->dense && k->buf < 0 && !p->contiguous_grads && p->spans[k->group].n > 1 &&
	       (p->stage == 2 ? k->plan_bucket >= 0 : p->stage == 3 && k->unit >= 0);
}

/* communication_data_type other than the gradients' under ZeRO 1-3: DeepSpeed reduces a copy
 * cast to it, live for the collective (stage_1_and_2.py gradient_reduction_w_predivide and
 * allreduce_bucket, stage3.py __avg_scatter_grads and __avg_scatter_contiguous_grads:
 * tensor.to(communication_data_type)): under ZeRO 1-2's reduce-scatter one rank's slice (mine
 * elements) at a time, average_tensor reducing each destination's slice to it in turn; else the
 * whole reduction (elems), all the unit's gradients at once at stage 3. -1 when the types agree.
 * The executor runs ZeRO 1-2's reduce-scatter as one collective: it casts the whole bucket into
 * a workspace of its own (*send, BUF_EXEC_CAST, else -1), sends from it and receives its slice
 * into the cast copy. The casts' own kernels are not timed, as the engine's (engine_bucket). */
static int zero_cast(Builder *b, CollKind kind, int unit, long long elems, long long mine,
		     int *send)
{
	const Plan *p = b->p;
	*send = -1;
	if (p->comm_bytes == p->grad_bytes)
		return -1;
	int slices = p->stage < 3 && kind == COLL_REDUCE_SCATTER;
	int cast = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_COMM_CAST, unit,
			 (double)(slices ? mine : elems) * p->comm_bytes);
	if (slices && p->executor)
		*send = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_EXEC_CAST, unit,
			      (double)elems * p->comm_bytes);
	return cast;
}

/* The reduction just issued (its slice stated when part_off >= 0) goes through cast copy cast,
 * the executor sending from send (-1: none); both freed. */
static void cast_through(Builder *b, int *cast, int *send, long long part_off)
{
	if (*cast >= 0 && part_off >= 0 && !b->oom)
		sched_set_cast(b->s, *cast, *send);
	release(b, send);
	release(b, cast);
}

static void flush_bucket(Builder *b, Bucket *k)
{
	const Plan *p = b->p;
	if (k->elems == 0)
		return;
	long long mine = ceil_div(k->elems, p->spans[k->group].n);
	int buf = k->buf, flat = -1;
	long long offset = k->offset;
	if (flattens(b, k)) { /* its slice states the bucket (stage 2) and this rank's part */
		flat = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_REDUCE_FLAT, k->unit,
			     (double)k->elems * p->grad_bytes);
		if (!b->oom && flat >= 0)
			DO(sched_set_slice(b->s, k->plan_bucket, k->part_off, mine));
		buf = flat, offset = 0;
	}
	if (p->qgz && k->group == GROUP_DP && p->spans[GROUP_XNODE].n > 1) {
		/* qgZ (DeepSpeed runs it only across nodes, else the reduce-scatter): an INT4
		 * all-to-all inside the node, after which each GPU reduces and holds 1/g of the
		 * bucket (every node's slice of its own share); that goes across nodes in a second
		 * INT4 all-to-all. Each of the dp slices is quantized in groups from its start. */
		long long g = p->spans[GROUP_NODE].n, nodes = p->spans[GROUP_XNODE].n;
		long long per_slice = ceil_div(mine, BUILD_QGZ_GROUP_ELEMS(p));
		quantized(b, COLL_ALL_TO_ALL, ROLE_GRAD_REDUCE, GROUP_NODE, k->unit, k->elems, 4,
			  p->spans[GROUP_DP].n * per_slice, buf, offset);
		slice(b, quantized(b, COLL_ALL_TO_ALL, ROLE_GRAD_REDUCE, GROUP_XNODE, k->unit,
				   ceil_div(k->elems, g), 4, nodes * per_slice, buf, offset),
		      k->plan_bucket, k->part_off, mine);
	} else {
		CollKind kind = build_zero_reduce_kind(p);
		int send, cast = zero_cast(b, kind, k->unit, k->elems, mine, &send);
		slice(b, coll(b, kind, ROLE_GRAD_REDUCE, k->group, k->unit, k->elems, p->comm_bytes,
			      buf, offset), k->plan_bucket, k->part_off, mine);
		cast_through(b, &cast, &send, k->part_off);
	}
	if (p->opt_place != PLACE_GPU) { /* this rank's reduced slice goes to the host's fp32 grads */
		/* stage 3 adds it on the device, into a copy of the host partition's slice there
		 * (stage3.py partition_grads: grad_buffer.to(device), kept in its list until the
		 * bucket is done), and copies the sum back */
		int dev = p->stage == 3 ? alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_OFFLOAD_GRAD_COPY,
						k->unit, (double)mine * p->grad_bytes) : -1;
		DO(sched_copy_reduced(b->s, COPY_D2H, k->unit, (double)mine * p->grad_bytes, buf,
				      offset, k->elems));
		if (!b->oom && k->part_off >= 0)
			DO(sched_set_slice(b->s, k->plan_bucket, k->part_off, mine));
		release(b, &dev);
	}
	/* without contiguous gradients and with overlap_comm, stage_1_and_2.py clears the reduced
	 * gradients of the other partitions only at the next reduction (or the epilogue), after the
	 * previous ones (reduce_ipg_grads: previous_reduced_grads) */
	int defer = flat >= 0 && p->stage == 2 && p->overlap_comm;
	release(b, &flat);
	release_prev(b, k);
	for (int i = 0; i < k->n_bufs; i++) {
		if (defer)
			push_id(b, &k->prev, &k->n_prev, &k->cap_prev, k->bufs[i]);
		else
			release(b, &k->bufs[i]);
	}
	k->n_bufs = 0;
	k->elems = 0;
}

static void bucket_tensor(Builder *b, Bucket *k, long long elems, long long offset)
{
	const Plan *p = b->p;
	if (p->stage == 3) /* each tensor is split into equal pieces over the group */
		elems = ceil_div(elems, p->spans[k->group].n) * p->spans[k->group].n;
	if (k->elems > 0 && (double)(k->elems + elems) > p->reduce_bucket_elems)
		flush_bucket(b, k);
	k->elems += elems;
	k->offset = offset; /* buckets fill backwards through the flat buffer */
	k->unit = -1;
	k->buf = -1;
	k->plan_bucket = -1; /* stage 3's experts are partitioned tensor by tensor (none stated) */
	k->part_off = -1;
}

/* A dense reduction of gradients held in buffer buf from element offset: a bucket of whole units
 * (stage 2, unit = its first unit, plan_bucket its BucketPlan) or one unit's flat (stage 3),
 * whose reduced slice lands at part_off in this rank's partition. The contiguous gradient
 * buffers are used in turn, one reduction each. */
static void reduce_dense(Builder *b, int unit, int plan_bucket, long long part_off,
			 long long elems, int buf, long long offset)
{
	b->dense.elems = elems;
	b->dense.unit = unit;
	b->dense.plan_bucket = plan_bucket;
	b->dense.part_off = part_off;
	b->dense.buf = buf;
	b->dense.offset = offset;
	flush_bucket(b, &b->dense);
}

/* Stage 1-2's contiguous gradient buffers at a backward: two under overlap_comm. */
static int bucket_count(const Plan *p)
{
	return p->overlap_comm && p->stage < 3 ? 2 : 1;
}

static void release_buckets(Builder *b)
{
	release(b, &b->buckets[0]);
	release(b, &b->buckets[1]);
	b->n_buckets = 0;
}

static int next_bucket(Builder *b)
{
	if (b->n_buckets == 0)
		return -1;
	int id = b->buckets[b->cur_bucket];
	b->cur_bucket = (b->cur_bucket + 1) % b->n_buckets;
	return id;
}

/* Stage 2-3 on one data-parallel rank with the optimizer on the device: nothing reduces or
 * copies the gradients, which go straight into the partition. */
static int grads_direct(const Plan *p)
{
	if (p->fsdp) /* FSDP's hooks run the same on one rank */
		return 0;
	return p->spans[GROUP_DP].n <= 1 && p->opt_place == PLACE_GPU;
}

/* Where unit u's backward writes its dense gradients (sched_grads_to): stage 0-1 the full
 * gradients at its place in the flat; stage 2-3 the contiguous buffer the next reduction reads
 * (the bucket in turn), at its place in the bucket; or, when nothing reduces or copies them (one
 * rank, the optimizer on the device), straight into the gradient partition. Without contiguous
 * gradients, the unit's own buffer (allocated before its backward: autograd's .grad tensors). */
static void grads_dest(Builder *b, int u, int *buf, long long *off)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	*buf = -1, *off = 0;
	if (p->stage < 2) {
		*buf = b->id_lp >= 0 ? b->id_lp : b->id_grads, *off = up->flat_off;
		return;
	}
	if (grads_direct(p)) {
		*buf = b->id_gradpart, *off = p->stage == 2 ? up->flat_off : up->part_off;
		return;
	}
	if (b->own_grads >= 0) { /* without contiguous gradients: the unit's own buffer */
		*buf = b->own_grads;
		return;
	}
	if (b->n_buckets == 0)
		return;
	*buf = b->buckets[b->cur_bucket];
	if (p->stage == 2 && b->bucket_of[u] >= 0)
		*off = up->flat_off - p->stages[b->stage].buckets[b->bucket_of[u]].flat_off;
}

/* The tied token embedding's elements on this rank: its V/t vocabulary rows (0 untied). */
static long long tied_local(const Plan *p)
{
	return ceil_div(model_tied_elems(&p->sc->model), p->par.tp);
}

/* Whether the contiguous gradient buffers are DeepSpeed's own (alloc_buckets): the executor's
 * copy whole units instead. */
static int ds_ipg_buffers(const Plan *p)
{
	return p->zero_optimizer && p->contiguous_grads && !p->executor;
}

/* Unit u's dense gradients of parameters larger than reduce_bucket_size on this rank: DeepSpeed
 * reduces each from its own .grad, not through the contiguous buffers
 * (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads: param.numel() >
 * reduce_bucket_size makes it extra_large_param_to_reduce; stage3.py __add_grad_to_ipg_bucket
 * moves a gradient into the buffer only where it fits, after a reduction has emptied it when it
 * would not); at ZeRO 2-3 that gradient lives from the unit's backward until its reduction, at
 * ZeRO 1 in the full gradients. */
static long long xl_grad_elems(const Plan *p, int u)
{
	const UnitPlan *up = &p->units[u];
	long long n = 0;
	for (int i = 0; i < up->n_tensors; i++)
		if (!up->tensor_expert[i] && (double)up->tensor_local[i] > p->reduce_bucket_elems)
			n += up->tensor_local[i];
	return n;
}

/* Whether an MoE block's expert gradients at ZeRO-2 need a buffer of their own: when a
 * reduction over the expert-data-parallel group or the copy to the optimizer's host reads them.
 * Otherwise (edp 1, the optimizer on the device) its backward adds them into the partition. */
static int expert_grads_held(const Plan *p, int u)
{
	return p->stage == 2 && p->units[u].local_expert > 0 &&
	       (p->edp > 1 || p->opt_place != PLACE_GPU);
}

/* Stage 2: where MoE block u's slice of its experts (1/edp of them) starts in this rank's
 * partition: after the dense partition, the blocks in the expert flat's order. */
static long long expert_part_off(const Builder *b, int u)
{
	return b->p->stages[b->stage].flat_dense / b->p->dp + b->expert_start[u] / b->p->edp;
}

/* ZeRO-2's reduction of an MoE block's expert gradients, held in buffer egrads: one
 * reduce-scatter of the block's experts over the expert-data-parallel group (DeepSpeed reduces
 * them with the bucket they fall in, each piece to the rank owning it: the same bytes), whose
 * slices lie after the dense partition in the expert flat's order, 1/edp of each block's. */
static void reduce_experts(Builder *b, int u, int egrads)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	Bucket *k = &b->expert;
	k->elems = up->local_expert;
	k->unit = u;
	k->plan_bucket = -1;
	k->part_off = expert_part_off(b, u);
	k->buf = egrads;
	k->offset = 0;
	hold(b, k, egrads);
	flush_bucket(b, k);
}

static void unit_grads(Builder *b, int u, int egrads)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	const ModelSpec *m = &p->sc->model;

	if (p->stage < 2)
		return; /* stage 0-1 accumulate into the full gradient buffer */
	if (u == p->n_units - 1 && model_tied_elems(m) && p->par.pp == 1)
		/* the head's gradient of the tied embedding waits for the embedding's own */
		b->tied_grad = alloc(b, PLACE_GPU, CAT_GRADS, BUF_TIED_GRADS, u,
				     (double)(p->stage == 3 ? p->units[0].own_gather :
							      tied_local(p)) *
					     p->grad_bytes);
	hold(b, &b->dense, b->own_grads); /* released by the reduction that reads it */
	hold(b, &b->dense, b->xl_grads);
	b->own_grads = b->xl_grads = -1;
	long long eoff = b->expert_start[u] + up->local_expert;
	for (int i = up->n_tensors - 1; p->stage == 3 && i >= 0; i--)
		if (up->tensor_expert[i])
			bucket_tensor(b, &b->expert, up->tensor_local[i], eoff -= up->tensor_local[i]);
	if (egrads >= 0)
		reduce_experts(b, u, egrads);
	if (u == 0 && b->tied_grad >= 0) {
		hold(b, &b->dense, b->tied_grad);
		b->tied_grad = -1;
	}
	if (p->stage == 3) { /* held gradients (the tied head's) are summed into the reduction */
		if (up->own_gather > 0)
			reduce_dense(b, u, -1, up->part_off, up->own_gather, next_bucket(b), 0);
		return;
	}
	int i = b->bucket_of[u];
	const BucketPlan *k = i >= 0 ? &p->stages[b->stage].buckets[i] : NULL;
	if (k && u == k->u_lo) /* the bucket's last unit to finish backward */
		reduce_dense(b, k->u_lo, i, k->flat_off / p->dp, k->padded, next_bucket(b), 0);
}

/* ---- one unit, forward and backward ---- */

static int is_block(const Plan *p, int u)
{
	return u >= 1 && u <= p->sc->model.L;
}

/* Megatron's tensor-parallel collectives around a unit, one per sublayer of the unit's own
 * tokens (b s h elements; b s_dec h in an encoder-decoder's decoder): per block an all-reduce
 * after attention and after the MLP in forward (a decoder also after its attention over the
 * encoder), and one per sublayer for the input gradients in backward, where a decoder block adds
 * the gradient of the encoder output its cross-attention's K and V read (b s h); with sequence
 * parallelism each becomes an all-gather plus a reduce-scatter, and backward adds the gather of
 * dy for the row-split layer and the column-split layer's input gathered again (Korthikanti et
 * al. 2022, section 4.2.2, and Megatron-LM's layers: the gathered input is not kept). The
 * vocabulary-parallel embedding reduces its output (an encoder-decoder looks up both stacks'
 * tokens; under sequence parallelism a reduce-scatter, whose backward gathers dy), the head
 * gathers its input under sequence parallelism (forward and again backward), reduces its input
 * gradient, and its cross-entropy reduces 3 fp32 values per token in three
 * all-reduces (Megatron's vocab_parallel_cross_entropy: max, target logit, sum of exponentials).
 * A block of DeepSpeed's MoE layer has no MLP all-reduce (moe_colls gathers its tokens). */
/* Whether the MoE blocks are DeepSpeed's MoE layers under tensor parallelism, which split their
 * tokens over the tensor-parallel ranks (moe_colls) and leave an MoE block's MLP without
 * Megatron's all-reduce: its output is whole on every rank once gathered. */
static int moe_tp_splits(const Plan *p)
{
	return p->sc->model.ds_gate && p->par.tp > 1;
}

static void tp_colls(Builder *b, int u, OpRole role)
{
	int forward = role != ROLE_BACKWARD;
	const Plan *p = b->p;
	if (p->par.tp <= 1 || !p->activations_known)
		return;
	const ModelSpec *m = &p->sc->model;
	long long bs = p->shape.b * p->shape.s, h = m->h;
	long long bs_dec = p->shape.b * (p->shape.s_dec ? p->shape.s_dec : p->shape.s);
	long long bs_head = m->lay.L_enc ? bs_dec : bs;
	int d = p->param_bytes, sp = p->shape.sp;
	if (is_block(p, u)) {
		int dec = model_unit_is_decoder(m, u);
		long long bsh = (dec ? bs_dec : bs) * h;
		int mlp = !(p->units[u].moe && moe_tp_splits(p)); /* moe_colls has its own */
		for (int i = 0; i < 1 + mlp + dec; i++) {
			if (sp) {
				/* backward gathers dy for the row-split layer, then the column-split
				 * layer's input again (not kept: Megatron's
				 * LinearWithGradAccumulationAndAsyncCommunication re-gathers it) */
				if (!forward)
					coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bsh, d, -1, 0);
				coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bsh, d, -1, 0);
				coll(b, COLL_REDUCE_SCATTER, role, GROUP_TP, u, bsh, d, -1, 0);
			} else {
				coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bsh, d, -1, 0);
			}
		}
		if (dec && !forward) /* sequence parallelism is refused for encoder-decoders */
			coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs * h, d, -1, 0);
	} else if (u == 0 && forward) {
		coll(b, sp ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE, role, GROUP_TP, u, bs * h, d, -1, 0);
		if (m->lay.L_enc)
			coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs_dec * h, d, -1, 0);
	} else if (u == 0 && sp) { /* the reduce-scatter's backward: dy gathered */
		coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bs * h, d, -1, 0);
	} else if (u == p->n_units - 1 && m->lay.lm_head) {
		if (sp) /* the final norm's output gathered for the head, forward and again backward */
			coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, bs_head * h, d, -1, 0);
		if (forward) /* Megatron's cross-entropy: the max, the target logits, the sums */
			for (int i = 0; i < 3; i++)
				coll(b, COLL_ALL_REDUCE, role, GROUP_TP, u, bs_head, 4, -1, 0);
		else
			coll(b, sp ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE, role, GROUP_TP, u, bs_head * h, d,
			     -1, 0);
	}
}

/* An MoE block moves its tokens to their experts and back: two all-to-alls forward (dispatch,
 * combine) and two backward, of E x capacity x h elements each. DeepSpeed's MoE layer under
 * tensor parallelism (sharded_moe.py MOELayer.forward; with Megatron's mpu its groups make the
 * experts count as tensor-parallel too, groups.py _create_expert_data_and_model_parallel) sends
 * each tensor-parallel rank's 1/t of every expert's capacity (drop_tokens), then all-gathers
 * the capacity whole over the tensor-parallel group (gather_tokens) for the experts, which
 * compute every token on every rank, and likewise after the combine: an all-gather of
 * E x capacity x h after each all-to-all, forward, and backward where drop_tokens' gradient is
 * gather_tokens. */
static void moe_colls(Builder *b, int u, OpRole role)
{
	const Plan *p = b->p;
	if (!p->units[u].moe)
		return;
	long long whole = p->moe_slots * p->sc->model.h;
	long long t = moe_tp_splits(p) ? p->par.tp : 1;
	for (int i = 0; i < 2; i++) {
		coll(b, COLL_ALL_TO_ALL, role, GROUP_EP, u, whole / t, p->param_bytes, -1, 0);
		if (t > 1)
			coll(b, COLL_ALL_GATHER, role, GROUP_TP, u, whole, p->param_bytes, -1, 0);
	}
}

/* The executor: the kernels run on a model-layout working copy of the unit's parameters in the
 * compute dtype (the parameters' own: fp32, or 16-bit under mixed precision), and write their
 * gradients into an fp32 one in backward; the head's copies include the tied token embedding it
 * uses, an MoE block's its local experts. elem_bytes: the copy's element size. */
static double unit_work_bytes(const Plan *p, int u, int elem_bytes)
{
	if (!p->executor)
		return 0;
	double n = (double)(p->units[u].local_dense + p->units[u].local_expert);
	if (u == p->n_units - 1 && p->par.pp == 1)
		n += (double)tied_local(p);
	return elem_bytes * n;
}

/* Hugging Face's causal-LM loss (loss_utils.py ForCausalLMLoss: logits.float(), then
 * cross_entropy) over the head's rows while it runs, beyond the fp32 log-softmax output the head
 * keeps (activ.c): forward, the logits in the model's type (the model's output holds them) and
 * their fp32 upcast (none in fp32, where .float() is the tensor itself), live beside the
 * log-softmax; backward, nll_loss's gradient and log_softmax's input gradient, fp32 both,
 * beside the kept output, 8 bytes a logit (the input gradient's cast back to the model's type
 * comes once the kept output is freed, within that). BertForMaskedLM's and T5's loss
 * (CrossEntropyLoss on the scores as they are) the same without the upcast: the logits, then the two
 * gradients in their type (fp32 under autocast). 0 under Megatron's code (its
 * vocabulary-parallel cross-entropy works in the upcast copy in place) and for other heads. */
static double loss_temp_bytes(const Plan *p, int u, int backward)
{
	const ModelSpec *m = &p->sc->model;
	const ModelLayout *y = &m->lay;
	if (!p->shape.hf_eager || u != p->n_units - 1 || !y->lm_head || !p->activations_known)
		return 0;
	long long s = y->L_enc && p->shape.s_dec ? p->shape.s_dec : p->shape.s;
	double logits = (double)(p->shape.b * s) * (double)m->V / (double)p->par.tp;
	double d = p->shape.elem_bytes; /* the logits' type: the parameters', or autocast's */
	/* the loss's type: fp32 after ForCausalLMLoss's upcast or under autocast (log_softmax is
	 * an fp32 op there); BertForMaskedLM's and T5's CrossEntropyLoss take the logits as they
	 * are */
	double ls = model_hf_loss_upcasts(m) || p->shape.autocast ? 4 : d;
	return logits * (backward ? 2 * ls : d + (ls > d ? ls : 0));
}

/* torch autocast (plain PyTorch with the Trainer's fp16 or bf16): the 16-bit copies of unit u's
 * weights its products read, the head's of the tied embedding too (plan.c cast_elems). The
 * autocast cache keeps each cast until the forward ends (torch's cached_cast caches a leaf
 * weight's cast whatever the grad mode), and autograd's saved tensors until the unit's
 * backward; a checkpointed block saves nothing, so its copies go when the forward ends and are
 * made again by its recompute. */
static double cast_bytes(const Plan *p, int u)
{
	const DsConfig *ds = &p->sc->ds;
	if (ds->autocast == DT_FP32)
		return 0;
	return (double)p->units[u].cast_elems * dtype_bytes(ds->autocast);
}

/* ---- FSDP (Plan.fsdp): FullyShardedDataParallel's units, as torch's FSDP1 runs them
 * (torch/distributed/fsdp/_runtime_utils.py). Each transformer layer is a unit; the root unit holds
 * the rest (the model's first and last units: the embedding, the final norm and the head), one
 * flat gathered before the first unit's forward and kept until the backward ends
 * (_post_forward_reshard does not free the root's). ---- */

static int fsdp_is_root(const Plan *p, int u)
{
	return u == 0 || u == p->n_units - 1;
}

/* FSDP: the tied embedding's elements whose gradient the head makes (its lm_head reads the
 * embedding the root holds once), 0 for other units or an untied head. */
static long long fsdp_tied(const Plan *p, int u)
{
	return p->fsdp && u == p->n_units - 1 ? tied_local(p) : 0;
}

/* Before unit u's forward: its flat (the root's two units at the first), and the next layer's,
 * which the host issues while the device computes this one (limit_all_gathers lets it run one
 * unit ahead; forward_prefetch asks for the same). */
static void fsdp_forward_gather(Builder *b, int u)
{
	int last = b->p->n_units - 1;
	gather(b, u, 0);
	if (u == 0)
		gather(b, last, 0);
	if (u + 1 < last)
		gather(b, u + 1, 0);
}

/* After unit u's forward: FULL_SHARD frees a layer's gathered flat (reshard after forward);
 * SHARD_GRAD_OP keeps it for the backward. */
static void fsdp_forward_done(Builder *b, int u)
{
	if (scenario_fsdp_reshards(b->p->sc->fsdp.sharding) && !fsdp_is_root(b->p, u))
		ungather(b, u);
}

/* Before unit u's backward: its flat (gathered again under FULL_SHARD), and under BACKWARD_PRE the
 * next unit's in backward order, issued by u's pre-backward hook (_prefetch_handles). */
static void fsdp_backward_gather(Builder *b, int u)
{
	gather(b, u, 1);
	if (b->p->sc->fsdp.backward_prefetch == FSDP_BACKWARD_PRE && u >= 1)
		gather(b, u - 1, 1);
}

/* Unit u's gradients are whole: its post-backward hook frees its gathered flat (both strategies
 * when it reduces; under no_sync SHARD_GRAD_OP keeps it: _should_free_in_backward), and under
 * BACKWARD_POST gathers the next unit. The root's hook runs once, after its first unit's
 * backward. */
static void fsdp_reshard(Builder *b, int u)
{
	const Plan *p = b->p;
	if (u == p->n_units - 1)
		return;
	if (scenario_fsdp_reshards(p->sc->fsdp.sharding) || b->fsdp_sync) {
		ungather(b, u);
		if (u == 0)
			ungather(b, p->n_units - 1);
	}
	if (p->sc->fsdp.backward_prefetch == FSDP_BACKWARD_POST && u >= 1)
		gather(b, u - 1, 1);
}

/* One reduce-scatter of unit u's flat gradient, held in buf from element off, over the
 * data-parallel group in param_dtype (_post_backward_hook): the output shard (new_sharded_grad),
 * cast to the shard's dtype (_cast_grad_to_param_dtype), becomes the unit's gradient shard the
 * first time and is added into it after. */
static void fsdp_reduce(Builder *b, int u, int buf, long long off)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	double mine = (double)up->part_dense;
	int first = b->fsdp_shard[u] < 0, same = p->comm_bytes == p->shard_bytes;
	/* the shard is allocated first: in the reduce dtype FSDP casts the output into it, both
	 * live at that moment; the executor adds the reduced slice straight in (exec/runner.c) */
	if (first)
		b->fsdp_shard[u] = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_PART, u,
					 mine * p->shard_bytes);
	int out = first && same ? -1 : alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_REDUCED, u,
					      mine * p->comm_bytes);
	slice(b, coll(b, COLL_REDUCE_SCATTER, ROLE_GRAD_REDUCE, p->shard_group, u, up->own_gather,
		      p->comm_bytes, buf, off), -1, up->part_off, up->part_dense);
	if (p->shard_group == GROUP_NODE) /* HYBRID_SHARD: the shard summed over the replicas
					     (allreduce_hook on new_sharded_grad) */
		slice(b, coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_XNODE, u, up->part_dense,
			      p->comm_bytes, first && same ? b->fsdp_shard[u] : out, 0),
		      -1, up->part_off, up->part_dense);
	int cast = !first && !same ? alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_REDUCED, u,
					   mine * p->shard_bytes) : -1;
	release(b, &out);
	if (!first) { /* into the shard (the op names it: sched_grads_to) */
		compute_moving(b, COMP_GRAD_ACCUM, u, mine, 3 * mine * p->shard_bytes);
		if (!b->oom)
			sched_grads_to(b->s, b->fsdp_shard[u], 0);
	}
	release(b, &cast);
	if (p->opt_place != PLACE_GPU) /* CPUOffload: _cpu_grad.copy_(the shard) */
		copy(b, COPY_D2H, ROLE_GRAD_REDUCE, u, mine * p->shard_bytes);
}

/* Unit u's gradients after its backward, held in b->own_grads (its tensors' .grad, autograd's
 * separate pieces until the unit is done): autograd's cat of them into the flat's gradient (the
 * split's backward: a whole flat beside them for a moment), added in place into the one kept
 * under no_sync; then the hook frees the gathered weights and, when this micro-batch reduces,
 * reduce-scatters it and frees it, or under no_sync keeps it. The root's last unit waits for
 * its first. */
static void fsdp_unit_grads(Builder *b, int u)
{
	const Plan *p = b->p;
	int last = p->n_units - 1;
	if (u == last) {
		b->fsdp_head = b->own_grads;
		b->own_grads = -1;
		return;
	}
	double elems = (double)(p->units[u].own_gather + (u == 0 ? p->units[last].own_gather : 0));
	int flat = alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_UNSHARDED, u, elems * p->grad_bytes);
	release(b, &b->own_grads);
	if (u == 0)
		release(b, &b->fsdp_head);
	if (b->fsdp_acc[u] >= 0) { /* AccumulateGrad adds the new one into .grad, the op's */
		compute_moving(b, COMP_GRAD_ACCUM, u, elems, 3 * elems * p->grad_bytes);
		if (!b->oom)
			sched_grads_to(b->s, b->fsdp_acc[u], 0);
		release(b, &flat);
		flat = b->fsdp_acc[u];
		b->fsdp_acc[u] = -1;
	}
	fsdp_reshard(b, u);
	if (!b->fsdp_sync) {
		b->fsdp_acc[u] = flat;
		return;
	}
	fsdp_reduce(b, u, flat, 0);
	if (u == 0)
		fsdp_reduce(b, last, flat, p->units[0].own_gather);
	release(b, &flat);
}

static void forward_unit(Builder *b, int slot, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	int i = slot * p->n_units + u;

	if (p->fsdp)
		fsdp_forward_gather(b, u);
	else if (p->stage == 3)
		gather_with_prefetch(b, u, +1);
	int temp = -1, fp32 = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_FP32, u,
				    unit_work_bytes(p, u, p->param_bytes));
	if (is_block(p, u) && p->sc->ckpt == CKPT_FULL) {
		b->ckpt[i] = alloc(b, p->ckpt_place, CAT_ACTIV, BUF_CHECKPOINT, u, up->ckpt_bytes);
		/* the forward still builds the layer's activations; they go when it ends */
		temp = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, u, up->act_bytes);
	} else {
		b->act[i] = alloc(b, PLACE_GPU, CAT_ACTIV, is_block(p, u) ? BUF_ACTIVATIONS : BUF_ENDS,
				  u, up->act_bytes);
	}
	/* selective recompute: the attention core still computes its scores forward, and
	 * drops them once its output is made (Megatron runs it under checkpoint) */
	int scores = is_block(p, u) && p->sc->ckpt == CKPT_SELECTIVE && up->score_bytes > 0 ?
			     alloc(b, PLACE_GPU, CAT_ACTIV, BUF_SCORES, u, up->score_bytes) : -1;
	b->cast[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_AUTOCAST_WEIGHTS, u, cast_bytes(p, u));
	int loss = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_LOSS_TEMP, u, loss_temp_bytes(p, u, 0));
	compute(b, COMP_FWD, u, up->fwd_flops);
	release(b, &loss);
	/* the unit's collectives are its kernels' (the executor's tensor-parallel units issue them
	 * while they compute), before what the compute op leaves to free; nothing is allocated
	 * between, so the peaks are those of freeing the scores first */
	tp_colls(b, u, ROLE_FORWARD);
	moe_colls(b, u, ROLE_FORWARD);
	release(b, &scores);
	release(b, &temp);
	release(b, &fp32);
	if (b->ckpt[i] >= 0 && p->ckpt_place == PLACE_CPU)
		copy(b, COPY_D2H, ROLE_FORWARD, u, up->ckpt_bytes);
	if (p->fsdp)
		fsdp_forward_done(b, u);
	else if (p->stage == 3)
		ungather(b, u);
}

/* Selective recompute (Korthikanti et al. 2022, section 5): forward kept everything but the
 * attention core's scores; before the block's backward, QK^T, softmax, dropout and softmax x V
 * run again (the attention products' FLOPs on this rank: 4 b s^2 h / t for multi-head
 * attention), rebuilding the scores (their bytes are the op's traffic), which live until the
 * backward is done. Eager attention only: FlashAttention keeps no scores (score_bytes 0) and its
 * backward kernel recomputes them itself. Returns the scores' buffer, -1 when nothing runs. */
static int recompute_attention_core(Builder *b, int u)
{
	const Plan *p = b->p;
	double scores = p->units[u].score_bytes;
	if (p->sc->ckpt != CKPT_SELECTIVE || !is_block(p, u) || scores <= 0)
		return -1;
	int id = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_SCORES, u, scores);
	compute_moving(b, COMP_RECOMPUTE, u, p->units[u].attn_flops, scores);
	return id;
}

static void backward_unit(Builder *b, int slot, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	int i = slot * p->n_units + u;

	if (p->fsdp)
		fsdp_backward_gather(b, u);
	else if (p->stage == 3)
		gather_with_prefetch(b, u, -1);
	int fp32 = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_FP32, u,
			 unit_work_bytes(p, u, p->param_bytes));
	int fp32_grads = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_UNIT_GRAD32, u,
			       unit_work_bytes(p, u, 4));
	if (b->ckpt[i] >= 0) { /* full recompute: rebuild the block's activations from its input */
		if (p->ckpt_place == PLACE_CPU)
			copy(b, COPY_H2D, ROLE_RECOMPUTE, u, up->ckpt_bytes);
		b->act[i] = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, u, up->act_bytes);
		b->cast[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_AUTOCAST_WEIGHTS, u,
				   cast_bytes(p, u));
		compute(b, COMP_RECOMPUTE, u, up->fwd_flops);
		tp_colls(b, u, ROLE_RECOMPUTE);
		moe_colls(b, u, ROLE_RECOMPUTE);
	}
	int scores = recompute_attention_core(b, u);
	int egrads = expert_grads_held(p, u) ?
		alloc(b, PLACE_GPU, CAT_GRADS, BUF_EXPERT_GRADS, u,
		      (double)up->local_expert * p->grad_bytes) : -1;
	if (p->stage >= 2 && ds_ipg_buffers(p)) {
		long long xl = xl_grad_elems(p, u), tied = tied_local(p);
		if (u == 0 && b->tied_grad >= 0 && (double)tied > p->reduce_bucket_elems)
			xl -= tied; /* the tied embedding's one .grad: the head's held buffer */
		b->xl_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_XL_GRADS, u,
				    (double)xl * p->grad_bytes);
	}
	if (p->stage >= 2 && !p->contiguous_grads && !grads_direct(p) && up->local_dense > 0)
		/* at stage 3 at least the unit's flat, padded to the group, in which they are
		 * laid for the reduction; FSDP's tensors' own, a tied head's share of the
		 * embedding's gradient after them (autograd sums it at the embedding's backward) */
		b->own_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_UNIT_GRADS, u,
				     (double)(p->stage == 3 && !p->fsdp ?
						      max_ll(up->local_dense, up->own_gather) :
						      up->local_dense + fsdp_tied(p, u)) *
					     p->grad_bytes);
	int loss = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_LOSS_TEMP, u, loss_temp_bytes(p, u, 1));
	compute(b, COMP_BWD, u, 2 * up->fwd_flops);
	if (!b->oom) { /* stated on the backward op itself */
		int gbuf;
		long long goff;
		grads_dest(b, u, &gbuf, &goff);
		sched_grads_to(b->s, gbuf, goff);
	}
	release(b, &loss);
	/* backward runs the block's MLP before its attention: an MoE block's exchanges come
	 * before the attention's tensor-parallel all-reduce */
	moe_colls(b, u, ROLE_BACKWARD);
	tp_colls(b, u, ROLE_BACKWARD);
	release(b, &b->act[i]);
	release(b, &b->ckpt[i]);
	release(b, &b->cast[i]);
	release(b, &scores);
	if (p->fsdp) {
		fsdp_unit_grads(b, u);
	} else {
		unit_grads(b, u, egrads);
		if (p->stage == 3)
			ungather(b, u);
	}
	release(b, &fp32_grads);
	release(b, &fp32);
}

/* ---- micro-batches ---- */

/* One update_hp_grads op over n elements of the gradients from element first, whose largest
 * tensor has most elements. In another dtype than the .grad tensors' each is cast first
 * (bf16_optimizer.py _update_hp_grad: lp.grad.data.to(hp_grad.dtype), a copy freed after its
 * add): the largest copy is held, and the op reads and writes it too. */
static void accumulate_span(Builder *b, long long first, long long n, long long most)
{
	const Plan *p = b->p;
	if (n <= 0)
		return;
	int cast = p->grad_bytes != p->param_bytes;
	int up = cast ? alloc(b, PLACE_GPU, CAT_GRADS, BUF_LP_UPCAST, -1,
			      (double)min_ll(most, n) * p->grad_bytes) : -1;
	compute_moving(b, COMP_GRAD_ACCUM, -1, (double)n,
		       (double)n * (p->param_bytes + (cast ? 4.0 : 2.0) * p->grad_bytes));
	if (!b->oom)
		sched_grads_to(b->s, b->id_lp, first);
	release(b, &up);
}

/* BF16_Optimizer after the backward of this stage's units in [lo, hi) (bf16_optimizer.py
 * backward, or the pipe engine's _exec_backward_pass: update_hp_grads): their bf16 .grad
 * tensors added into the fp32 gradients, the dense span and the expert span, one op each. */
static void accumulate_hp(Builder *b, int lo, int hi)
{
	const Plan *p = b->p;
	if (b->id_lp < 0)
		return;
	long long d_lo = -1, d_hi = 0, e_lo = -1, e_hi = 0, dense = p->stages[b->stage].flat_dense;
	long long d_most = 0, e_most = 0; /* the largest tensor of each span */
	for (int u = lo; u < hi; u++) {
		const UnitPlan *up = &p->units[u];
		if (up->stage != b->stage)
			continue;
		for (int i = 0; i < up->n_tensors; i++) {
			long long *most = up->tensor_expert[i] ? &e_most : &d_most;
			*most = max_ll(*most, up->tensor_local[i]);
		}
		if (up->local_dense > 0) {
			d_lo = d_lo < 0 ? up->flat_off : min_ll(d_lo, up->flat_off);
			d_hi = max_ll(d_hi, up->flat_off + up->local_dense);
		}
		if (up->local_expert > 0) {
			long long at = dense + b->expert_start[u];
			e_lo = e_lo < 0 ? at : min_ll(e_lo, at);
			e_hi = max_ll(e_hi, at + up->local_expert);
		}
	}
	if (d_lo >= 0)
		accumulate_span(b, d_lo, d_hi - d_lo, d_most);
	if (e_lo >= 0)
		accumulate_span(b, e_lo, e_hi - e_lo, e_most);
}

/* ZeRO 1-3's contiguous gradient buffers (DeepSpeed's ipg buffers): reduce_bucket_size
 * elements in the model's dtype each (stage_1_and_2.py: torch.empty(reduce_bucket_size)); a
 * parameter larger than that is reduced from its own gradient instead (xl_grad_elems), and
 * DeepSpeed splits a unit larger than the buffer between buckets a tensor at a time, whose
 * reductions the schedule keeps a unit's (the same bytes). The executor, which copies whole units
 * into its buckets, sizes its buffers to the largest reduction of whole units where that is
 * more. Stage 1-2 allocate n of them at each backward,
 * two under overlap_comm (stage_1_and_2.py backward: buf_0, buf_1; bucket_count), freed at the
 * epilogue (stage 2 each micro-batch; stage 1 fills them only at the boundary's reductions,
 * reduce_gradients, which under pipelining makes one of its own, the pipe engine's backward
 * having no epilogue); stage 3 one at set-up, kept (stage3.py __init__:
 * __ipg_bucket_flat_buffer), whose next copy waits on the reduction stream. */
static void alloc_buckets(Builder *b, int n)
{
	const Plan *p = b->p;
	b->n_buckets = b->cur_bucket = 0;
	b->buckets[0] = b->buckets[1] = -1;
	if (!p->zero_optimizer || !p->contiguous_grads)
		return;
	double elems = ds_ipg_buffers(p) ? p->reduce_bucket_elems :
		       fmax(p->reduce_bucket_elems, (double)p->stages[b->stage].bucket_fill);
	for (int i = 0; i < n && i < 2; i++)
		if ((b->buckets[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_REDUCE_BUCKET, -1,
					   elems * p->grad_bytes)) >= 0)
			b->n_buckets = i + 1;
}

/* The executor's scratch: 8 bsh floats for gpt_cpu's backward; on a tensor-parallel rank what
 * kernels/gpt_tp_cpu.c's units use (gpt_tp_scratch_bytes): the larger of a block's two widest
 * activations (b s max(4h/t, h) each) and the head's three per-token values with its (b s, h)
 * gradient, plus a gathered (b s, h) stream under sequence parallelism. */
static double exec_scratch_bytes(const Plan *p)
{
	if (!p->executor)
		return 0;
	double bs = (double)(p->shape.b * p->shape.s), h = (double)p->sc->model.h;
	double t = (double)p->par.tp, sp = p->shape.sp ? bs * h : 0;
	const ModelSpec *m = &p->sc->model;
	if (m->experts) { /* kernels/moe_cpu.c's moe_cpu_scratch_bytes; its 8 b s h also hold a
			     tensor-parallel rank's units without sequence parallelism (2 b s
			     max(4h/t, h), and the head's b s (h + 3)) */
		double slots = (double)p->moe_slots, cap = (double)p->moe_capacity;
		double I = (double)(m->moe_I ? m->moe_I : m->I), E = (double)m->experts;
		double mlp = 2 * slots * h + 2 * cap * I + bs * h + 2 * bs * E;
		return 4 * (fmax(8 * bs * h, mlp) + 3 * bs * (double)m->top_k);
	}
	if (p->par.tp <= 1)
		return 4 * 8 * bs * h;
	double block = 2 * bs * fmax(4 * h / t, h) + sp, head = 3 * bs + bs * h + sp;
	return 4 * fmax(fmax(block, head), sp);
}

/* Without pipelining: every unit forward, then backward, repeated for each micro-batch. The
 * executor's hidden-state streams (x in the compute dtype, its gradient in fp32) live for the
 * micro-batch, its scratch for the backward (and the forward too on a tensor-parallel rank, whose
 * head and gathers use it, and in an MoE model, whose blocks dispatch through it). */
static void micro_batch(Builder *b)
{
	const Plan *p = b->p;
	double bsh = p->executor ? (double)(p->shape.b * p->shape.s * p->sc->model.h) : 0;
	double bsh4 = 4 * bsh;
	int hidden = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_HIDDEN, -1, bsh4 + p->param_bytes * bsh);
	int scratch = -1, early = p->par.tp > 1 || p->sc->model.experts > 0;
	if (early)
		scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1, exec_scratch_bytes(p));

	for (int u = 0; u < p->n_units; u++)
		forward_unit(b, 0, u);
	for (int u = 0; u < p->n_units; u++) /* autocast's cache goes with the forward */
		if (b->ckpt[u] >= 0)
			release(b, &b->cast[u]);
	if (p->stage == 1 || p->stage == 2)
		alloc_buckets(b, bucket_count(p));
	if (!early)
		scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1, exec_scratch_bytes(p));
	b->ddp_next = 0;
	for (int u = p->n_units - 1; u >= 0; u--) {
		backward_unit(b, 0, u);
		ddp_ready(b, p->units[u].flat_off);
	}
	accumulate_hp(b, 0, p->n_units);
	release_prev(b, &b->dense); /* the epilogue's _clear_previous_reduced_grads */
	flush_bucket(b, &b->expert);
	const StagePlan *st = &p->stages[b->stage];
	if (p->stage == 3 && st->persist_elems > 0) /* parameters kept whole still reduce-scatter */
		reduce_dense(b, -1, -1, st->persist_part_off, ceil_div(st->persist_elems, p->dp) * p->dp,
			     b->id_grads, 0);
	release(b, &scratch);
	if (p->stage == 1 || p->stage == 2)
		release_buckets(b);
	/* FSDP with CPUOffload: the backward's last callback hands the optimizer the host's
	 * gradients and drops the device's shards (prepare_gradient_for_optim) */
	for (int u = 0; p->fsdp && p->opt_place != PLACE_GPU && b->fsdp_sync && u < p->n_units; u++)
		release(b, &b->fsdp_shard[u]);
	release(b, &hidden);
}

/* The receive step st starts from, if any (its micro-batch's ops): a forward's input from the
 * previous stage, into a buffer kept until its backward; a backward's gradient from the next,
 * into the set-up's buffer. */
static void pipe_recv(Builder *b, const PipeStep *st, long long bsh)
{
	const Plan *p = b->p;
	int j = st->chunk * (int)p->par.pp + b->stage, d = p->param_bytes;
	b->mb = st->mb;
	if (st->forward && j > 0) {
		int *in = &b->pipe_in[st->mb * p->par.virtual_stages + st->chunk];
		*in = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_PIPE_INPUT, p->chunk_bounds[j], (double)bsh * d);
		pipe_gather(b, ROLE_FORWARD, bsh, *in);
	} else if (!st->forward && j < p->n_chunks - 1) {
		pipe_gather(b, ROLE_BACKWARD, bsh, b->id_pipe_grad);
	}
}

/* Megatron's interleaved batches (schedules.py, forward_backward_pipelining_with_interleaving):
 * in its steady state each iteration runs a forward and a backward and then exchanges, in one
 * batch, both outputs and both inputs of the next iteration; warming up, a forward's batch
 * receives the next forward's input, and the last warm-up batch the first backward's gradient
 * too, unless every forward is a warm-up one (then the first backward receives its own);
 * cooling down, a backward's batch receives the next backward's. In this order's terms: posted
 * at the end of step k, the receives of step k + 1, and of step k + 2 too when k + 1 is a
 * forward that a backward follows and some backward comes before the stage's last forward;
 * *posted: the last step whose receives are posted. */
static void pipe_batch_recvs(Builder *b, const PipeStep *order, int n, int k, int all_warmup,
			     int *posted, long long bsh)
{
	int upto = k + 1;
	if (k + 2 < n && order[k + 1].forward && !order[k + 2].forward && !all_warmup)
		upto = k + 2;
	for (int j = *posted + 1; j <= upto && j < n; j++)
		pipe_recv(b, &order[j], bsh);
	if (upto > *posted)
		*posted = upto;
}

/* With pipelining: the stage's own order of forwards and backwards (pipeline.c), each step's
 * ops in the step's micro-batch. A chunk receives its input from the previous stage and sends
 * its output to the next, bsh elements per micro-batch each way; gradients come back the same
 * way. The boundary buffers are DeepSpeed's pipe engine's: the received input is kept until the
 * backward has sent its gradient, the sent output until the backward (its autograd root), the
 * received gradient lands in the set-up's buffer, and the input's gradient lives until it is
 * sent (in the interleaved order, until the end of its step: below). The executor's hidden
 * stream (x in the compute dtype, its gradient in fp32) lives for each step, its scratch
 * (exec_scratch_bytes) for each backward step and, on a tensor-parallel rank or in an MoE
 * model, each forward step too. */
static int pipelined(Builder *b, PxError *err)
{
	const Plan *p = b->p;
	long long pp = p->par.pp, v = p->par.virtual_stages, m = b->m;
	long long bsh = pipe_elems(p), whole = p->shape.b * p->shape.s * p->sc->model.h;
	double exec_bsh = p->executor ? (double)whole : 0;
	int d = p->param_bytes;
	PipeStep *order = malloc((size_t)(2 * m * v) * sizeof(*order));
	if (!order)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	int n = pipe_order(p->par.schedule, pp, v, m, b->stage, order);
	/* Megatron's interleaved order batches the sends of a forward-backward pair with the
	 * receives of the next pair and waits for them all (batch_isend_irecv): the receives come
	 * at the end of the step before (pipe_batch_recvs), and the sent input gradient lives until
	 * then */
	int batched = p->par.schedule == PIPE_INTERLEAVED, sent_grad = -1, posted = -1;
	int first_bwd = 0; /* every forward before any backward: all of them warm-up ones */
	while (first_bwd < n && order[first_bwd].forward)
		first_bwd++;
	int all_warmup = first_bwd == n / 2;

	for (int k = 0; k < n; k++) {
		const PipeStep *st = &order[k];
		int j = st->chunk * (int)pp + b->stage; /* the global model chunk */
		int first = j == 0, last = j == p->n_chunks - 1;
		int lo = p->chunk_bounds[j], hi = p->chunk_bounds[j + 1];
		int *in = &b->pipe_in[st->mb * v + st->chunk], *out = &b->pipe_out[st->mb * v + st->chunk];
		DO(sched_mark_step(b->s));
		b->mb = st->mb;
		int hidden = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_HIDDEN, -1, (4 + d) * exec_bsh);
		int scratch = -1; /* backward's, and forward's too on a tensor-parallel rank or in
				     an MoE model, whose blocks dispatch through it */
		if (!st->forward || p->par.tp > 1 || p->sc->model.experts > 0)
			scratch = alloc(b, PLACE_GPU, CAT_WORKSPACE, BUF_SCRATCH, -1,
					exec_scratch_bytes(p));
		if (!batched)
			pipe_recv(b, st, bsh);
		else if (k == 0)
			pipe_batch_recvs(b, order, n, -1, all_warmup, &posted, bsh);
		if (st->forward) {
			for (int u = lo; u < hi; u++)
				forward_unit(b, st->mb, u);
			if (!last) {
				/* the pipe engine keeps the sent part (the output's own data is
				 * cleared: only its graph stays for the backward) */
				long long part = pipe_part(p, bsh, 0);
				*out = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_PIPE_OUTPUT, hi - 1,
					     (double)part * d);
				coll(b, COLL_P2P, ROLE_FORWARD, GROUP_PP, -1, part, d, *out, 0);
			}
		} else {
			/* the pipe engine's last stage runs its backwards through the ZeRO optimizer's
			 * (pipe/engine.py _exec_backward_pass: super().backward), which makes its
			 * contiguous gradient buffers each time, replacing the last ones, and no
			 * epilogue frees them before the boundary's reductions */
			if (last && p->stage == 1 && b->n_buckets == 0)
				alloc_buckets(b, bucket_count(p));
			for (int u = hi - 1; u >= lo; u--)
				backward_unit(b, st->mb, u);
			accumulate_hp(b, lo, hi);
			release(b, out);
			if (!first) {
				long long part = pipe_part(p, bsh, 1);
				sent_grad = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_PIPE_INPUT_GRAD, lo,
						  (double)part * d);
				coll(b, COLL_P2P, ROLE_BACKWARD, GROUP_PP, -1, part, d, sent_grad, 0);
				if (!batched)
					release(b, &sent_grad);
				release(b, in);
			}
		}
		if (batched && k + 1 < n)
			pipe_batch_recvs(b, order, n, k, all_warmup, &posted, bsh);
		release(b, &sent_grad);
		b->mb = st->mb;
		release(b, &scratch);
		release(b, &hidden);
	}
	b->mb = 0;
	free(order);
	return 0;
}

/* ---- after the micro-batches: reduction, optimizer, parameter gather ---- */

/* One collective over the stage's expert flat (after its dense one, named by offset); part_base:
 * where this rank's slice of it starts in its partition (-1: none stated). */
static void expert_flat(Builder *b, CollKind kind, OpRole role, long long total, int elem_bytes,
			long long part_base)
{
	long long n = b->p->spans[GROUP_EDP].n;
	slice(b, coll(b, kind, role, GROUP_EDP, -1, total, elem_bytes, -1, 0), -1,
	      part_base < 0 ? -1 : part_base, total / n);
}

/* BF16_Optimizer's gradients reduced at the boundary (engine.py allreduce_gradients, which
 * finds no reduce_gradients on it: buffered_allreduce_fallback over get_grads_for_reduction's
 * flats, one a parameter group, each all-reduced whole by allreduce_no_retain, whose bucket
 * only splits between tensors): the dense flat over dp, the experts' over their group. In
 * another type than the gradients', allreduce_bucket all-reduces a copy cast to
 * communication_data_type (bf16 by default) and copies it back: the copy, laid as the
 * gradients, lives for the reductions. DeepSpeed casts one flat at a time; with experts the
 * schedule holds both casts at once, over-stating that moment by the smaller. The casts' own
 * kernels are not timed. One parameter group is assumed (the Hugging Face Trainer's two, decay
 * and none, would each be cast and reduced alone). */
static void bf16_reduce(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	int cast = -1;
	if (p->comm_bytes != p->grad_bytes)
		cast = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_COMM_CAST, -1,
			     (double)(st->flat_dense + st->flat_expert) * p->comm_bytes);
	coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_DP, -1, st->flat_dense, p->comm_bytes,
	     cast >= 0 ? cast : b->id_grads, 0);
	if (cast >= 0)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_EDP, -1, st->flat_expert,
		     p->comm_bytes, cast, st->flat_dense);
	else
		expert_flat(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, st->flat_expert, p->comm_bytes,
			    st->flat_dense / p->dp);
	release(b, &cast);
}

/* engine.py's MEMORY_OPT_ALLREDUCE_SIZE: the gradient elements DeepSpeed's engine gathers into
 * one bucket before flattening and all-reducing it (allreduce_gradients' default). */
#define DS_ENGINE_BUCKET_ELEMS 500000000LL

/* One of the engine's buckets (engine_allreduce): elems gradients from element off of the stage's
 * flat (the experts after the dense elements) copied into a new tensor, cast to
 * communication_data_type where that differs (a second copy, both live, which the all-reduce's
 * slice names), all-reduced over group g and copied back. The slices state where the elements
 * lie. */
static void engine_bucket(Builder *b, CommGroup g, long long off, long long elems)
{
	const Plan *p = b->p;
	int flat = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_REDUCE_FLAT, -1,
			 (double)elems * p->grad_bytes), cast = -1;
	if (!b->oom && flat >= 0)
		DO(sched_set_slice(b->s, -1, off, elems));
	if (p->comm_bytes != p->grad_bytes)
		cast = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_COMM_CAST, -1,
			     (double)elems * p->comm_bytes);
	slice(b, coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, g, -1, elems, p->comm_bytes, flat, 0),
	      -1, off, elems);
	int none = -1;
	cast_through(b, &cast, &none, off);
	release(b, &flat);
}

/* Stage 0's gradients reduced by DeepSpeed's engine at the boundary (engine.py
 * allreduce_gradients -> buffered_allreduce_fallback; the pipe engine's _exec_reduce_grads
 * the same): the parameters' gradients in named_parameters order, the experts' after them over
 * their group, each list cut into buckets once a bucket's elements pass MEMORY_OPT_ALLREDUCE_SIZE
 * (the tensor that passes it stays in: allreduce_no_retain); each bucket is flattened into a new
 * tensor (allreduce_bucket), all-reduced and copied back (allreduce_and_copy). One data-parallel
 * rank still flattens (an all-reduce over a group of one). reduce_bucket_size is not read. An
 * MoE block's stacked expert tensor counts as its local experts' tensors, one each. The copies'
 * own kernels are not timed. */
static void engine_allreduce(Builder *b)
{
	const Plan *p = b->p;
	long long local_experts = p->par.ep > 0 ? p->sc->model.experts / p->par.ep : 0;
	for (int expert = 0; expert < 2; expert++) {
		long long start = expert ? p->stages[b->stage].flat_dense : 0, at = start;
		for (int u = 0; u < p->n_units; u++) {
			const UnitPlan *up = &p->units[u];
			for (int i = 0; up->stage == b->stage && i < up->n_tensors; i++) {
				if (up->tensor_expert[i] != expert)
					continue;
				long long n = up->tensor_local[i];
				long long k = expert && local_experts > 1 ? local_experts : 1;
				for (long long j = 0; j < k; j++) {
					at += n / k + (j < n % k);
					if (at - start > DS_ENGINE_BUCKET_ELEMS) {
						engine_bucket(b, expert ? GROUP_EDP : GROUP_DP, start,
							      at - start);
						start = at;
					}
				}
			}
		}
		if (at > start)
			engine_bucket(b, expert ? GROUP_EDP : GROUP_DP, start, at - start);
	}
}

/* torch.distributed's first bucket for DistributedDataParallel (_DEFAULT_FIRST_BUCKET_BYTES,
 * 1 MiB); the others are bucket_cap_mb MiB (training_args.ddp_bucket_cap_mb, 25 by default). */
#define DDP_FIRST_BUCKET_BYTES (1024.0 * 1024)

/* Plain PyTorch's DistributedDataParallel (Scenario.framework): its reducer lays the parameters
 * in reverse order into buckets, closing one once its bytes reach the limit (the tensor that
 * reaches it included; 1 MiB for the first, bucket_cap_mb after: the Trainer's
 * ddp_bucket_cap_mb, torch's 25 by default; compute_bucket_assignment_by_size, as the buckets
 * are rebuilt after the first iteration in the backward's order), copies each
 * gradient into its bucket's flat (BUF_DDP_BUCKETS, held throughout), all-reduces the bucket there
 * as soon as its last gradient is ready, on a stream of its own (Plan.overlap_comm), and copies
 * it back; the backward's end waits for them. Gradient accumulation runs the other micro-batches
 * under no_sync (as Accelerate and the Trainer do): only the last one's backward reduces. The
 * buckets' starts, in the order they are reduced; one process has no DDP. */
static int ddp_plan(Builder *b)
{
	const Plan *p = b->p;
	double limit = DDP_FIRST_BUCKET_BYTES;
	long long end = p->stages[b->stage].local_dense, at = end;
	b->n_ddp = 0;
	if (p->sc->framework != FRAMEWORK_PYTORCH || p->dp <= 1)
		return 0;
	int n = 0;
	for (int u = 0; u < p->n_units; u++)
		n += p->units[u].stage == b->stage ? p->units[u].n_tensors : 0;
	if (!(b->ddp_at = malloc((size_t)(n + 1) * sizeof(long long))))
		return -1;
	for (int u = p->n_units - 1; u >= 0; u--) {
		const UnitPlan *up = &p->units[u];
		for (int i = up->n_tensors - 1; up->stage == b->stage && i >= 0; i--) {
			at -= up->tensor_local[i];
			if ((double)(end - at) * p->grad_bytes >= limit) {
				b->ddp_at[b->n_ddp++] = at;
				end = at;
				limit = (double)p->sc->train_args.ddp_bucket_cap_mb * 1024 * 1024;
			}
		}
	}
	if (end > at)
		b->ddp_at[b->n_ddp++] = at;
	return 0;
}

/* After the backward of units down to the one whose flat starts at lo: the buckets whose every
 * gradient is now ready, all-reduced in the reducer's flat. */
static void ddp_ready(Builder *b, long long lo)
{
	const Plan *p = b->p;
	for (; b->ddp_sync && b->ddp_next < b->n_ddp && b->ddp_at[b->ddp_next] >= lo; b->ddp_next++) {
		long long at = b->ddp_at[b->ddp_next];
		long long end = b->ddp_next ? b->ddp_at[b->ddp_next - 1] :
					      p->stages[b->stage].local_dense;
		slice(b, coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_DP, -1, end - at,
			      p->grad_bytes, b->id_ddp, at), -1, at, end - at);
	}
}

/* ---- the 1-bit optimizers' compressed all-reduce ---- */

/* One compressed all-reduce (onebit.h) of the elems elements of the optimizer partition from
 * part_off (-1: where they lie is not stated), whose worker error starts at element w_off of the
 * error buffer and server error at s_off. */
static void onebit_allreduce(Builder *b, long long elems, long long part_off, long long w_off,
			     long long s_off)
{
	OneBitVolume v = onebit_volume(elems, b->p->dp);
	if (v.padded_elems == 0)
		return;
	slice(b, coll(b, COLL_ALL_TO_ALL, ROLE_ONEBIT_SIGNS, GROUP_DP, -1, v.sign_bytes, 1, b->id_ef,
		      w_off), -1, part_off, elems);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SCALES, GROUP_DP, -1, b->p->dp, 4, -1, 0);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SERVER_SIGNS, GROUP_DP, -1, v.sign_bytes, 1, b->id_ef,
	     s_off);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SERVER_SCALES, GROUP_DP, -1, b->p->dp, 4, -1, 0);
}

/* The compressed step's exchange: one compressed all-reduce per parameter tensor in forward order
 * (OnebitAdam, ZeroOneAdam in fp32: each tensor's state), or one of the flat (OnebitLamb's fused
 * momentum; FP16_Optimizer's one fp32 flat per group). The error buffer holds the worker errors
 * one after another, then the server errors in the same order (plan.c sized it). A tensor's
 * place in the partition (stage 0's: the stage's flat) is its unit's flat offset and the tensors
 * before it; an MoE block's is not stated (its experts lie after the dense flat). */
static void onebit_exchange(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	long long local = st->local_dense + st->local_expert, n = p->dp;
	if (p->sc->ds.opt->error_feedback == EF_FLAT || p->mixed) {
		long long padded = optim_onebit_padded_elems(local, n);
		onebit_allreduce(b, local, 0, 0, padded);
		return;
	}
	long long total = 0, w_off = 0, s_off;
	for (int u = 0; u < p->n_units; u++)
		for (int i = 0; p->units[u].stage == b->stage && i < p->units[u].n_tensors; i++)
			if (p->units[u].tensor_local[i] > 0)
				total += optim_onebit_padded_elems(p->units[u].tensor_local[i], n);
	s_off = total;
	for (int u = 0; u < p->n_units; u++) {
		const UnitPlan *up = &p->units[u];
		long long at = up->flat_off;
		for (int i = 0; up->stage == b->stage && i < up->n_tensors; i++) {
			long long e = up->tensor_local[i];
			if (e <= 0)
				continue;
			long long padded = optim_onebit_padded_elems(e, n);
			onebit_allreduce(b, e, up->moe ? -1 : at, w_off, s_off);
			at += e;
			w_off += padded;
			s_off += padded / n;
		}
	}
}

/* The last op (a stage-3 sub-group's) covers partition elements lo .. lo + n - 1. */
static void in_group(Builder *b, int ranged, long long lo, long long n)
{
	if (ranged && !b->oom)
		DO(sched_set_slice(b->s, -1, lo, n));
}

/* The update of partition elements lo .. lo + n - 1 (a stage-3 sub-group when ranged, whose
 * ops state its range; else the partition). The fp32 gradients it reads (FP16_Optimizer's flat
 * of them): DeepSpeed's ZeRO optimizers make them from the gradient tensors they update in two
 * copies (stage_1_and_2.py step: flatten(averaged_gradients).to(fp32); stage3.py
 * _prepare_fp32_grad_for_sub_group, freed after the sub-group's update): torch.cat's flat in
 * the gradients' type, live until its fp32 copy exists; in fp32 training the flat is the copy.
 * On NVMe the optimizer swaps in the sub-group's fp32 master weights and states and the fp32
 * gradients swapped out at the boundary (partitioned_optimizer_swapper.py
 * swap_in_optimizer_state), and after the update swaps out the first two. */
static void group_step(Builder *b, long long lo, long long n, int ranged, int onebit)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	double part = (double)st->part_elems, elems = (double)n;
	double fp32_elems = p->flattens_grads ? elems : part;
	int fp32_grads = -1, flat = -1;
	if (p->flattens_grads && p->grad_bytes != 4 &&
	    (flat = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_FLAT, -1, fp32_elems * p->grad_bytes)) >= 0)
		in_group(b, ranged, lo, n);
	if (((p->mixed && p->grad_bytes != 4 && !p->fsdp) || p->flattens_grads) &&
	    p->opt_place == PLACE_GPU &&
	    (fp32_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_FP32, -1, fp32_elems * 4)) >= 0)
		in_group(b, ranged, lo, n);
	release(b, &flat);
	/* what the update allocates while it runs (plan.c plan_step_temp_bytes): torch's Adam's
	 * copies of the second moment, or 1-bit LAMB's copy of its momenta (lamb.py
	 * exp_avg_last_step), taken before the exchange that averages them, in compressed steps
	 * only (its warm-up steps take none; the prediction's memory is its highest kind of step's,
	 * sim/predict.c) */
	const OptimKind *ok = p->sc->ds.opt;
	int step_temp = -1, lamb = ok && ok->error_feedback == EF_FLAT;
	/* a 1-bit optimizer's initialisation step exchanges its zero momenta and updates nothing */
	int init = ok && ok->error_feedback != EF_NONE && p->onebit_step == ONEBIT_INIT;
	double temp = st->opt_step_temp_bytes; /* the largest sub-group's at stage 3: this one's */
	if (ranged && st->step_elems > 0)
		temp *= elems / (double)st->step_elems;
	if (temp > 0 && !init && !(lamb && p->onebit_step == ONEBIT_FULL) &&
	    (step_temp = alloc(b, p->opt_place, CAT_OPTIM, BUF_OPT_STEP_TEMP, -1, temp)) >= 0)
		in_group(b, ranged, lo, n);
	if ((onebit && p->onebit_step == ONEBIT_COMPRESSED) || init)
		onebit_exchange(b);
	double state = elems * p->master_bytes +
		       (part > 0 ? st->opt_state_bytes * (elems / part) : 0);
	if (p->opt_place == PLACE_NVME) {
		copy(b, COPY_NVME_READ, ROLE_OPTIMIZER, -1, state + elems * 4);
		in_group(b, ranged, lo, n);
	}
	/* an Adam-like update reads and writes every state and reads the gradient, about 10 FLOPs
	 * per element, in one pass when fused, in several otherwise (optim.h's extra_bytes) */
	double passes = elems * optim_impl(p->opt_impl)->extra_bytes;
	/* (the initialisation step's is the step that sets up its states and moves nothing) */
	DO(sched_compute(b->s, COMP_OPTIMIZER, -1, init ? 0 : 10 * elems,
			 init ? 0 : 2 * state + elems * (4 + p->shard_bytes) + passes));
	in_group(b, ranged, lo, n);
	if (p->opt_place == PLACE_NVME) {
		copy(b, COPY_NVME_WRITE, ROLE_OPTIMIZER, -1, state);
		in_group(b, ranged, lo, n);
	}
	release(b, &fp32_grads);
	release(b, &step_temp);
	/* the updated 16-bit parameters: to the device's partition from the host's optimizer, to
	 * the host's partition (stage-3 parameter offload) from the device's, or with the partition
	 * on NVMe (stage 3) into the host flat (a host copy, not priced as one) and the part beyond
	 * it swapped out to NVMe */
	long long swapped = lo + n - max_ll(lo, st->param_resident);
	if (p->param_place == PLACE_NVME && swapped > 0) {
		copy(b, COPY_NVME_WRITE, ROLE_PARAM_UPDATE, -1, (double)swapped * p->param_bytes);
		in_group(b, ranged, lo, n);
	} else if (p->param_place != PLACE_NVME &&
		   (p->opt_place != p->param_place || (p->stage < 3 && p->opt_place != PLACE_GPU))) {
		/* from the host's optimizer to the device, or from the device's to the host */
		copy(b, p->opt_place == PLACE_GPU ? COPY_D2H : COPY_H2D, ROLE_PARAM_UPDATE, -1,
		     elems * p->param_bytes);
		in_group(b, ranged, lo, n);
	}
}

static void optimizer_step(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	double part = (double)st->part_elems;
	long long tied = tied_local(p);

	/* ZeRO-Infinity: at the gradient accumulation boundary the last backward's hooks swap the
	 * partition's fp32 gradients out to NVMe (stage3.py partition_grads, swap_out_gradients),
	 * for the optimizer to read back with its states */
	if (p->opt_place == PLACE_NVME)
		copy(b, COPY_NVME_WRITE, ROLE_GRAD_REDUCE, -1, part * 4);

	/* sequence parallelism: each rank's gradients of the replicated tensors (norms, the row-split
	 * layers' biases, the positions) are its rows' share, summed over the tensor-parallel group
	 * in one flattened buffer before the data-parallel reduction (Megatron's
	 * finalize_model_grads: _allreduce_layernorm_grads) */
	if (p->par.tp > 1 && p->shape.sp) {
		long long rep = 0;
		for (int u = 0; u < p->n_units; u++)
			rep += p->units[u].stage == b->stage ? p->units[u].tp_replicated : 0;
		int flat = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_SP_GRADS, -1,
				 (double)rep * p->grad_bytes);
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_TP, -1, rep, p->grad_bytes, flat, 0);
		release(b, &flat);
	}

	/* the tied embedding's two copies (first and last stage) sum their gradients: unit 0's
	 * first tensor (embed.tokens) on the first stage, the copy after the head's own tensors on
	 * the last (plan.c) */
	if (p->par.pp > 1 && tied && (b->stage == 0 || b->stage == p->par.pp - 1)) {
		const UnitPlan *at = &p->units[b->stage == 0 ? 0 : p->n_units - 1];
		long long off = b->stage == 0 ? at->flat_off : at->flat_off + at->local_dense - tied;
		DO(sched_coll(b->s, COLL_ALL_REDUCE, ROLE_TIED_GRADS, GROUP_PP, 2, -1, tied,
			      p->grad_bytes, b->id_grads, off));
	}

	/* a 1-bit optimizer's compressed and local steps turn the gradient all-reduce off
	 * (enable_backward_allreduce = False): the compressed exchange replaces it */
	const OptimKind *ok = p->sc->ds.opt;
	int onebit = ok && ok->error_feedback != EF_NONE &&
		     (p->onebit_step == ONEBIT_COMPRESSED || p->onebit_step == ONEBIT_LOCAL);
	if (p->bf16_optimizer) {
		bf16_reduce(b);
	} else if (p->sc->framework == FRAMEWORK_PYTORCH || p->fsdp) {
		/* DistributedDataParallel reduced them in the last backward (ddp_ready), FSDP in
		 * each unit's post-backward hook (fsdp_unit_grads) */
	} else if (p->stage == 0 && !onebit) {
		engine_allreduce(b);
	} else if (p->stage == 1 && !onebit) {
		CollKind kind = build_zero_reduce_kind(p);
		/* stage 1 copies each bucket's gradients into a contiguous buffer and reduces it
		 * there (reduce_independent_p_g_buckets_and_remove_grads), its slice going back to
		 * where the update reads it (copy_grads_in_partition) */
		release_buckets(b); /* a pipelined last stage's, from its backwards */
		alloc_buckets(b, p->par.pp > 1 ? 1 : bucket_count(p));
		for (int i = st->n_buckets - 1; i >= 0; i--) { /* in the order backward filled them */
			int via = next_bucket(b);
			int send, cast = zero_cast(b, kind, st->buckets[i].u_lo,
						   st->buckets[i].padded, st->buckets[i].padded / p->dp,
						   &send);
			slice(b, coll(b, kind, ROLE_GRAD_REDUCE, GROUP_DP, st->buckets[i].u_lo,
				      st->buckets[i].padded, p->comm_bytes,
				      via >= 0 ? via : b->id_grads, via >= 0 ? 0 : st->buckets[i].flat_off),
			      i, st->buckets[i].flat_off / p->dp, st->buckets[i].padded / p->dp);
			cast_through(b, &cast, &send, st->buckets[i].flat_off);
		}
		/* one reduce-scatter of the expert flat, whose slices are the contiguous partition
		 * the parameter update gathers whole (below); chunks of it would leave each rank a
		 * piece of every chunk, not the slice it updates and sends; cast as the dense
		 * buckets are (its memory only: the executor runs no cast with experts) */
		int send, cast = zero_cast(b, kind, -1, st->flat_expert,
					   st->flat_expert / p->spans[GROUP_EDP].n, &send);
		expert_flat(b, kind, ROLE_GRAD_REDUCE, st->flat_expert, p->comm_bytes,
			    st->flat_dense / p->dp);
		cast_through(b, &cast, &send, -1); /* no slice names it */
		release_buckets(b);
	}
	if (p->stage == 1 && p->opt_place != PLACE_GPU)
		copy(b, COPY_D2H, ROLE_GRAD_REDUCE, -1, part * p->grad_bytes);

	/* DeepSpeed agrees on fp16 overflow and on the global gradient norm with one-value
	 * all-reduces: over the data-parallel group (a partitioned stage holds only part of the
	 * gradients), then over the pipeline's stages, each of which holds its own layers'
	 * (stage_1_and_2.py and runtime/utils.py all-reduce over the model-parallel group, of which
	 * the pipe grid's stages are part, as are the tensor-parallel ranks, each of which holds
	 * its shards; Megatron's clip_grad_norm likewise) */
	int fp16 = p->sc->ds.dtype == DT_FP16, clip = p->sc->ds.gradient_clipping > 0;
	/* plain PyTorch's ranks hold the same all-reduced gradients: its GradScaler and
	 * clip_grad_norm_ look at their own, with no all-reduce; FSDP's ShardedGradScaler
	 * all-reduces its inf check over the group, as its clip_grad_norm_ does the norm */
	int ds = p->sc->framework == FRAMEWORK_DEEPSPEED || p->fsdp;
	if (p->fsdp)
		fp16 = fp16 || p->sc->ds.autocast == DT_FP16;
	if (fp16 && ds)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_DP, -1, 1, 4, -1, 0);
	if (fp16)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_TP, -1, 1, 4, -1, 0);
	if (fp16)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_PP, -1, 1, 4, -1, 0);
	/* (BF16_Optimizer takes the norm of its whole all-reduced gradients on every rank,
	 * all-reduced over the model-parallel group only: the schedule sums the partitions'
	 * squares over dp instead, the same norm for one 4-byte all-reduce more) */
	if (clip && p->stage >= 1) /* FSDP's clip_grad_norm_ over its process group: under
				      HYBRID_SHARD the node's, whose shards make the whole model */
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, p->shard_group, -1, 1, 4, -1, 0);
	if (clip)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_TP, -1, 1, 4, -1, 0);
	if (clip)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_PP, -1, 1, 4, -1, 0);
	/* fp32 without ZeRO the engine clips itself (engine.py clip_fp32_gradients): its
	 * clip_grad_norm_ (runtime/utils.py) then averages the ranks' norms over the data-parallel
	 * group, MoE or not */
	if (clip && p->stage == 0 && !p->mixed && ds)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_DP, -1, 1, 4, -1, 0);

	/* stage 3 steps its sub-groups one after another (stage3.py step: _prepare_sub_group,
	 * _optimizer_step, _reassign_or_swap_out_partitioned_parameters, _release_sub_group), each
	 * op stating the sub-group's range; stage 0-2 the partition at once */
	long long whole[1] = {st->part_elems};
	const long long *ends = st->n_subgroups ? st->subgroup_end : whole;
	int n_groups = st->n_subgroups ? st->n_subgroups : 1, ranged = st->n_subgroups > 0;
	for (int k = 0; k < n_groups; k++) {
		long long lo = k ? ends[k - 1] : 0;
		group_step(b, lo, ends[k] - lo, ranged, onebit);
	}

	if (p->stage == 1 || p->stage == 2) {
		for (int i = st->n_buckets - 1; i >= 0; i--)
			slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_DP,
				      st->buckets[i].u_lo, st->buckets[i].padded, p->param_bytes,
				      b->id_params, st->buckets[i].flat_off),
			      i, st->buckets[i].flat_off / p->dp, st->buckets[i].padded / p->dp);
		/* one all_gather_into_tensor per parameter group (runtime/utils.py): the expert
		 * group's flat whole at stage 1, whose reduce-scatter left each rank its contiguous
		 * slice; at stage 2 each block's experts, as their reductions left the slices */
		if (p->stage == 1)
			expert_flat(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, st->flat_expert,
				    p->param_bytes, st->flat_dense / p->dp);
		for (int u = 0; p->stage == 2 && u < p->n_units; u++) {
			const UnitPlan *up = &p->units[u];
			if (up->stage == b->stage && up->local_expert > 0)
				slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_EDP, u,
					      up->local_expert, p->param_bytes, -1,
					      b->expert_start[u]),
				      -1, expert_part_off(b, u), up->local_expert / p->edp);
		}
	}
	/* FSDP: the Trainer's zero_grad after the step drops the gradient shards (set_to_none) */
	for (int u = 0; p->fsdp && u < p->n_units; u++)
		release(b, &b->fsdp_shard[u]);
	if (p->stage == 3 && st->persist_elems > 0) {
		long long persist = ceil_div(st->persist_elems, p->dp);
		slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_DP, -1, persist * p->dp,
			      p->param_bytes, b->id_persist, 0), -1, st->persist_part_off, persist);
	}
}

/* ---- entry ---- */

static int builder_init(Builder *b, const Plan *p, int stage, long long m, Schedule *s)
{
	int n = p->n_units;
	long long slots = p->par.pp > 1 ? m : 1;
	memset(b, 0, sizeof(*b));
	b->p = p;
	b->stage = stage;
	b->m = m;
	b->s = s;
	b->tied_grad = b->own_grads = b->xl_grads = b->fsdp_head = -1;
	b->fsdp_sync = 1;
	b->dense.group = GROUP_DP;
	b->expert.group = GROUP_EDP;
	b->id_params = b->id_grads = b->id_part = b->id_persist = b->id_gradpart = -1;
	b->id_ef = b->id_lp = b->id_ddp = -1;
	b->id_pipe_grad = -1;
	b->buckets[0] = b->buckets[1] = -1;
	long long chunks = slots * p->par.virtual_stages;
	b->gathered = malloc((size_t)n * sizeof(int));
	b->act = malloc((size_t)(n * slots) * sizeof(int));
	b->ckpt = malloc((size_t)(n * slots) * sizeof(int));
	b->cast = malloc((size_t)(n * slots) * sizeof(int));
	b->pipe_in = malloc((size_t)chunks * sizeof(int));
	b->pipe_out = malloc((size_t)chunks * sizeof(int));
	b->expert_start = malloc((size_t)n * sizeof(long long));
	b->bucket_of = malloc((size_t)n * sizeof(int));
	b->fsdp_acc = malloc((size_t)n * sizeof(int));
	b->fsdp_shard = malloc((size_t)n * sizeof(int));
	if (!b->gathered || !b->act || !b->ckpt || !b->cast || !b->pipe_in || !b->pipe_out ||
	    !b->expert_start || !b->bucket_of || !b->fsdp_acc || !b->fsdp_shard)
		return -1;
	for (int u = 0; u < n; u++)
		b->gathered[u] = b->fsdp_acc[u] = b->fsdp_shard[u] = -1;
	for (long long i = 0; i < n * slots; i++)
		b->act[i] = b->ckpt[i] = b->cast[i] = -1;
	for (long long i = 0; i < chunks; i++)
		b->pipe_in[i] = b->pipe_out[i] = -1;
	long long expert = 0; /* the stage's expert flat holds its units in forward order */
	for (int u = 0; u < n; u++) {
		b->bucket_of[u] = -1;
		b->expert_start[u] = expert;
		if (p->units[u].stage == stage)
			expert += p->units[u].local_expert;
	}
	const StagePlan *st = &p->stages[stage];
	for (int i = 0; i < st->n_buckets; i++)
		for (int u = st->buckets[i].u_lo; u <= st->buckets[i].u_hi; u++)
			if (p->units[u].stage == stage)
				b->bucket_of[u] = i;
	return ddp_plan(b);
}

static void builder_free(Builder *b)
{
	free(b->gathered);
	free(b->act);
	free(b->cast);
	free(b->ckpt);
	free(b->pipe_in);
	free(b->pipe_out);
	free(b->expert_start);
	free(b->bucket_of);
	free(b->fsdp_acc);
	free(b->fsdp_shard);
	free(b->ddp_at);
	free(b->dense.bufs);
	free(b->expert.bufs);
	free(b->dense.prev);
	free(b->expert.prev);
}

static long long stage_units(const Plan *p, int stage)
{
	long long n = 0;
	for (int u = 0; u < p->n_units; u++)
		n += p->units[u].stage == stage;
	return n;
}

/* Stage `stage`'s schedule with m micro-batches (the plan's m, or fewer to count ops);
 * *pipe_ops (may be NULL) receives the ops of the micro-batches themselves. */
static int build(const Plan *p, int stage, long long m, Schedule *s, long long *pipe_ops,
		 PxError *err)
{
	Builder bb, *b = &bb;
	int rc = 0;

	sched_init(s, stage);
	if (builder_init(b, p, stage, m, s)) {
		b->oom = 1;
		goto out;
	}
	setup(b);
	s->step_begin = s->n;
	/* a pipelined stage unrolls its micro-batches: 4 to 16 ops per micro-batch and unit on
	 * the bundled sweeps, so reserve the most of these and the optimizer step's few hundred
	 * at once instead of growing the ops by copies (a hint: appending still grows past it,
	 * and where the room cannot be had, doubling may still find what is needed) */
	if (p->par.pp > 1)
		(void)sched_reserve(s, s->n + 16 * m * stage_units(p, stage) + 512);
	if (p->par.pp > 1) {
		if ((rc = pipelined(b, err)))
			goto out;
	} else if (p->fsdp && p->m > 1) {
		/* FSDP: the first micro-batch makes what the others find (under no_sync each unit's
		 * kept gradient, and SHARD_GRAD_OP's gathered units; with sync_each_batch the
		 * gradient shards), the middle ones add into it, the last reduce-scatters */
		int each = p->sc->fsdp.sync_each_batch;
		b->fsdp_sync = each;
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		if (p->m > 2 || each) {
			DO(sched_loop(s, each ? p->m - 1 : p->m - 2));
			micro_batch(b);
			DO(sched_end_loop(s));
		}
		if (!each) {
			b->fsdp_sync = 1;
			DO(sched_loop(s, 1));
			micro_batch(b);
			DO(sched_end_loop(s));
		}
	} else if (p->stage == 3 && p->hpz > 1 && p->m > 1) {
		/* hpZ: the first micro-batch's forward gathers over dp and keeps the secondary
		 * partition; the others' forwards gather from it, inside the node (stage3.py drops
		 * it after the step: invalidate_secondary_tensor) */
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		b->secondary_held = 1;
		DO(sched_loop(s, p->m - 1));
		micro_batch(b);
		DO(sched_end_loop(s));
	} else if (b->n_ddp > 0 && p->m > 1) { /* DDP: no_sync but for the last micro-batch */
		DO(sched_loop(s, p->m - 1));
		micro_batch(b);
		DO(sched_end_loop(s));
		b->ddp_sync = 1;
		DO(sched_loop(s, 1));
		micro_batch(b);
		DO(sched_end_loop(s));
	} else {
		b->ddp_sync = b->n_ddp > 0;
		DO(sched_loop(s, p->m));
		micro_batch(b);
		DO(sched_end_loop(s));
	}
	if (pipe_ops)
		*pipe_ops = s->n - s->step_begin;
	optimizer_step(b);
out:
	builder_free(b);
	if (b->oom)
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory building the schedule");
	if (rc)
		sched_free(s);
	return rc;
}

int build_schedule(const Plan *p, int stage, Schedule *s, PxError *err)
{
	return build(p, stage, p->m, s, NULL, err);
}

/* Without pipelining the micro-batches are one repeat block, whatever their number: the schedule
 * is built. With it (ZeRO 0-1 only, plan.c refuses 2-3), every micro-batch adds the same ops, a
 * forward and a backward of each of the stage's chunks; so the schedule of the fewest
 * micro-batches its order allows (1; the interleaved order needs pp) gives the count of any. */
int build_count_ops(const Plan *p, int stage, long long *n_ops, PxError *err)
{
	long long m = p->par.pp == 1 ? p->m :
		      p->par.schedule == PIPE_INTERLEAVED ? p->par.pp : 1, per_m = 0;
	Schedule s;

	if (m > p->m)
		m = p->m;
	if (build(p, stage, m, &s, &per_m, err))
		return -1;
	*n_ops = s.n;
	if (p->par.pp > 1)
		*n_ops += (p->m - m) * (per_m / m);
	sched_free(&s);
	return 0;
}

long long build_ops_bound(const Plan *p, int stage)
{
	long long passes = (p->par.pp == 1 ? 1 : p->m) + 2;
	return passes * BUILD_OPS_PER_UNIT * stage_units(p, stage) + 1024;
}

int build_check_size(const Plan *p, PxError *err)
{
	long long total = 0, bound = 0;

	if (p->par.pp == 1) /* one repeat block: the micro-batches add nothing */
		return 0;
	for (int s = 0; s < p->par.pp; s++)
		bound += build_ops_bound(p, s);
	if (bound <= BUILD_MAX_OPS) /* far inside: nothing to count (a sweep's usual point) */
		return 0;
	for (int s = 0; s < p->par.pp; s++) {
		long long n;
		if (build_count_ops(p, s, &n, err))
			return -1;
		total += n;
	}
	if (total <= BUILD_MAX_OPS)
		return 0;
	return px_fail(err, PX_ERR_INPUT, "%s: the pipelined schedule of %lld micro-batches (gradient "
		       "accumulation) on %lld stages would hold %lld ops, over the limit of %lld (%.0f "
		       "MiB of schedule); use fewer micro-batches: a larger "
		       "train_micro_batch_size_per_gpu gives the same batch in fewer",
		       p->sc->path, p->m, p->par.pp, total, (long long)BUILD_MAX_OPS,
		       (double)BUILD_MAX_OPS * sizeof(Op) / (1 << 20));
}
