#include "build.h"

#include <stdlib.h>
#include <string.h>

#define MAX_PENDING 64

typedef struct Builder {
	const Plan *p;
	Schedule *s;
	int oom;
	int *gathered;          /* stage 3: buffer id per unit, -1 when not gathered */
	double live_elems;      /* stage 3: gathered elements now on the GPU */
	int *act, *ckpt;        /* activation and checkpoint buffer per unit */
	long long *flat_start;  /* first flat element of each unit (forward order) */
	/* gradient bucket being filled in backward (stage 2-3) */
	long long pending_elems, pending_offset;
	int pending_bufs[MAX_PENDING], n_pending_bufs; /* unit gradients the bucket will release */
	int tied_grad;          /* head's gradient of the tied embedding, until the embedding's turn */
} Builder;

#define DO(call)                      \
	do {                          \
		if ((call) != 0)      \
			b->oom = 1;   \
	} while (0)

static int alloc(Builder *b, Place place, MemCat cat, BufWhat what, int unit, double bytes)
{
	int id = -1;
	if (bytes > 0 && sched_alloc(b->s, place, cat, what, unit, bytes, &id))
		b->oom = 1;
	return id;
}

static void release(Builder *b, int *id)
{
	if (*id >= 0)
		DO(sched_free_buf(b->s, *id));
	*id = -1;
}

/* A data-parallel collective; a group of one rank has nothing to exchange. */
static void coll(Builder *b, CollKind kind, int unit, int64_t elems, int elem_bytes, int64_t off)
{
	if (b->p->dp > 1)
		DO(sched_coll(b->s, kind, GROUP_DP, (int)b->p->dp, unit, elems, elem_bytes, off));
}

static long long min_ll(long long a, long long b) { return a < b ? a : b; }
static long long max_ll(long long a, long long b) { return a > b ? a : b; }
static long long ceil_div(long long a, long long d) { return (a + d - 1) / d; }

/* ---- set-up: what lives for the whole run ---- */

static void setup(Builder *b)
{
	const Plan *p = b->p;
	const ClusterSpec *c = &p->sc->cluster;
	const DsZero *z = &p->sc->ds.zero;

	alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUDA_CONTEXT, -1, c->cuda_context_bytes);
	alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_CUBLAS_WORKSPACE, -1, c->cublas_workspace_bytes);
	alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_NCCL, -1, c->nccl_buffers_bytes);
	if (p->sc->ds.dtype == DT_FP16) /* loss scale and overflow flag */
		alloc(b, PLACE_GPU, CAT_OVERHEAD, BUF_LOSS_SCALER, -1, 8);

	if (p->stage < 3) {
		alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PARAMS, -1, (double)p->flat_elems * p->param_bytes);
		alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRADS, -1,
		      p->stage < 2 ? (double)p->flat_elems * p->grad_bytes : 0);
	} else {
		alloc(b, p->param_place, CAT_PARAMS, BUF_PARAM_PART, -1,
		      (double)p->part_elems * p->param_bytes);
		alloc(b, PLACE_GPU, CAT_PARAMS, BUF_PERSISTENT, -1,
		      (double)p->persist_elems * p->param_bytes);
		if (p->param_place == PLACE_NVME)
			alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_SWAP, -1,
			      (double)z->offload_param.buffer_count * z->offload_param.buffer_size *
				      p->param_bytes);
	}
	if (p->stage >= 2 && p->opt_place == PLACE_GPU)
		alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_PART, -1, (double)p->part_elems * p->grad_bytes);
	if (p->stage >= 1 && p->opt_place != PLACE_GPU) /* offload accumulates fp32 on the host */
		alloc(b, PLACE_CPU, CAT_GRADS, BUF_GRAD_FP32, -1, (double)p->part_elems * 4);

	alloc(b, p->opt_place, CAT_OPTIM, BUF_MASTER, -1, (double)p->part_elems * p->master_bytes);
	alloc(b, p->opt_place, CAT_OPTIM, BUF_OPT_STATES, -1, (double)p->part_elems * p->state_bytes);
	if (p->opt_place == PLACE_NVME) /* each swap buffer holds one fp32 tensor of a sub-group */
		alloc(b, PLACE_CPU, CAT_BUFFERS, BUF_SWAP, -1,
		      (double)z->offload_optimizer.buffer_count *
			      (double)min_ll((long long)z->sub_group_elems, p->part_elems) * 4);
}

/* ---- stage 3: gathering units ---- */

static void gather(Builder *b, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	if (b->gathered[u] >= 0 || up->gather_elems == 0)
		return;
	double part_bytes = (double)up->gather_part * p->param_bytes;
	if (p->param_place == PLACE_NVME)
		DO(sched_copy(b->s, COPY_NVME_READ, u, part_bytes));
	if (p->param_place != PLACE_GPU)
		DO(sched_copy(b->s, COPY_H2D, u, part_bytes));
	b->gathered[u] = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_GATHERED, u,
			       (double)up->gather_elems * p->param_bytes);
	coll(b, COLL_ALL_GATHER, u, up->gather_elems, p->param_bytes, 0);
	b->live_elems += (double)up->gather_elems;
}

static void ungather(Builder *b, int u)
{
	if (b->gathered[u] < 0)
		return;
	release(b, &b->gathered[u]);
	b->live_elems -= (double)b->p->units[u].gather_elems;
}

/* Gather u, then prefetch the units that follow in direction dir while the not-yet-used gathered
 * elements stay within stage3_prefetch_bucket_size and everything live within
 * stage3_max_live_parameters. */
static void gather_with_prefetch(Builder *b, int u, int dir)
{
	const Plan *p = b->p;
	const DsZero *z = &p->sc->ds.zero;
	double ahead = 0;

	gather(b, u);
	for (int j = u + dir; j >= 0 && j < p->n_units; j += dir) {
		double g = (double)p->units[j].gather_elems;
		if (g == 0)
			continue;
		if (ahead + g > z->prefetch_bucket_elems)
			break;
		ahead += g;
		if (b->gathered[j] >= 0)
			continue;
		if (b->live_elems + g > z->max_live_elems)
			break;
		gather(b, j);
	}
}

/* ---- gradients: buckets (stage 2-3) ---- */

static void flush_bucket(Builder *b)
{
	const Plan *p = b->p;
	if (b->pending_elems == 0)
		return;
	CollKind kind = p->sc->ds.zero.reduce_scatter ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE;
	coll(b, kind, -1, b->pending_elems, p->comm_bytes, b->pending_offset);
	if (p->opt_place != PLACE_GPU) /* this rank's reduced slice goes to the host's fp32 grads */
		DO(sched_copy(b->s, COPY_D2H, -1,
			      (double)ceil_div(b->pending_elems, p->dp) * p->grad_bytes));
	for (int i = 0; i < b->n_pending_bufs; i++)
		release(b, &b->pending_bufs[i]);
	b->n_pending_bufs = 0;
	b->pending_elems = 0;
}

static void bucket_tensor(Builder *b, long long elems, long long offset)
{
	const Plan *p = b->p;
	if (p->stage == 3)
		elems = ceil_div(elems, p->dp) * p->dp; /* each tensor is split into dp equal pieces */
	if (b->pending_elems > 0 && (double)(b->pending_elems + elems) > p->reduce_bucket_elems)
		flush_bucket(b);
	b->pending_elems += elems;
	b->pending_offset = offset; /* buckets fill backwards through the flat buffer */
}

static void unit_grads(Builder *b, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	int last = p->n_units - 1;

	if (p->stage < 2)
		return; /* stage 0-1 accumulate into the full gradient buffer */
	if (u == last && model_tied_elems(&p->sc->model)) /* held until the embedding's turn */
		b->tied_grad = alloc(b, PLACE_GPU, CAT_GRADS, BUF_UNIT_GRADS, u,
				     (double)model_tied_elems(&p->sc->model) * p->grad_bytes);
	if (!p->sc->ds.zero.contiguous_gradients && up->params > 0 &&
	    b->n_pending_bufs < MAX_PENDING - 1) {
		int id = alloc(b, PLACE_GPU, CAT_GRADS, BUF_UNIT_GRADS, u,
			       (double)up->params * p->grad_bytes);
		b->pending_bufs[b->n_pending_bufs++] = id;
	}
	long long off = b->flat_start[u] + up->params;
	for (int i = up->n_tensors - 1; i >= 0; i--) {
		off -= up->tensor_elems[i];
		bucket_tensor(b, up->tensor_elems[i], off);
	}
	if (u == 0 && b->tied_grad >= 0 && b->n_pending_bufs < MAX_PENDING) {
		b->pending_bufs[b->n_pending_bufs++] = b->tied_grad;
		b->tied_grad = -1;
	}
}

/* ---- one micro-batch ---- */

static int is_block(const Plan *p, int u)
{
	return u >= 1 && u <= p->sc->model.L;
}

static void forward_unit(Builder *b, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];

	if (p->stage == 3)
		gather_with_prefetch(b, u, +1);
	if (is_block(p, u) && p->sc->ckpt == CKPT_FULL) {
		b->ckpt[u] = alloc(b, p->ckpt_place, CAT_ACTIV, BUF_CHECKPOINT, u, up->ckpt_bytes);
		if (p->ckpt_place == PLACE_CPU)
			DO(sched_copy(b->s, COPY_D2H, u, up->ckpt_bytes));
	} else {
		b->act[u] = alloc(b, PLACE_GPU, CAT_ACTIV, is_block(p, u) ? BUF_ACTIVATIONS : BUF_ENDS,
				  u, up->act_bytes);
	}
	DO(sched_compute(b->s, COMP_FWD, u, up->fwd_flops, 0));
	if (p->stage == 3)
		ungather(b, u);
}

static void backward_unit(Builder *b, int u)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];

	if (p->stage == 3)
		gather_with_prefetch(b, u, -1);
	if (b->ckpt[u] >= 0) { /* full recompute: rebuild the block's activations from its input */
		if (p->ckpt_place == PLACE_CPU)
			DO(sched_copy(b->s, COPY_H2D, u, up->ckpt_bytes));
		b->act[u] = alloc(b, PLACE_GPU, CAT_ACTIV, BUF_ACTIVATIONS, u, up->act_bytes);
		DO(sched_compute(b->s, COMP_RECOMPUTE, u, up->fwd_flops, 0));
	}
	DO(sched_compute(b->s, COMP_BWD, u, 2 * up->fwd_flops, 0));
	release(b, &b->act[u]);
	release(b, &b->ckpt[u]);
	unit_grads(b, u);
	if (p->stage == 3)
		ungather(b, u);
}

static long long bucket_buffer_elems(const Plan *p)
{
	long long total = 0, largest = 0;
	for (int u = 0; u < p->n_units; u++)
		for (int i = 0; i < p->units[u].n_tensors; i++) {
			long long n = p->units[u].tensor_elems[i];
			if (p->stage == 3)
				n = ceil_div(n, p->dp) * p->dp;
			total += n;
			largest = max_ll(largest, n);
		}
	return max_ll(min_ll((long long)p->reduce_bucket_elems, total), largest);
}

static void micro_batch(Builder *b)
{
	const Plan *p = b->p;
	const DsZero *z = &p->sc->ds.zero;
	int buckets[2] = {-1, -1};

	for (int u = 0; u < p->n_units; u++)
		forward_unit(b, u);
	if (p->stage >= 2 && z->contiguous_gradients) {
		double bytes = (double)bucket_buffer_elems(p) * p->grad_bytes;
		for (int i = 0; i < (z->overlap_comm ? 2 : 1); i++)
			buckets[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_REDUCE_BUCKET, -1, bytes);
	}
	for (int u = p->n_units - 1; u >= 0; u--)
		backward_unit(b, u);
	flush_bucket(b);
	release(b, &buckets[0]);
	release(b, &buckets[1]);
}

/* ---- after the micro-batches: reduction, optimizer, parameter gather ---- */

/* A collective over the flat buffer in chunks of at most chunk elements. */
static void chunked(Builder *b, CollKind kind, long long total, double chunk, int elem_bytes)
{
	long long step = (long long)chunk > 0 ? (long long)chunk : total;
	for (long long off = 0; off < total; off += step)
		coll(b, kind, -1, min_ll(step, total - off), elem_bytes, off);
}

static void optimizer_step(Builder *b)
{
	const Plan *p = b->p;
	double part = (double)p->part_elems;

	if (p->stage < 2)
		chunked(b, p->stage == 0 ? COLL_ALL_REDUCE : COLL_REDUCE_SCATTER, p->flat_elems,
			p->reduce_bucket_elems, p->comm_bytes);
	if (p->stage == 1 && p->opt_place != PLACE_GPU)
		DO(sched_copy(b->s, COPY_D2H, -1, part * p->grad_bytes));

	int fp32_grads = -1;
	if (p->stage >= 1 && p->mixed && p->grad_bytes != 4 && p->opt_place == PLACE_GPU)
		fp32_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_FP32, -1, part * 4);
	double state = part * (p->master_bytes + p->state_bytes);
	if (p->opt_place == PLACE_NVME)
		DO(sched_copy(b->s, COPY_NVME_READ, -1, state));
	/* an Adam-like update reads and writes every state and reads the gradient, about 10 FLOPs
	 * per element */
	DO(sched_compute(b->s, COMP_OPTIMIZER, -1, 10 * part, 2 * state + part * (4 + p->param_bytes)));
	if (p->opt_place == PLACE_NVME)
		DO(sched_copy(b->s, COPY_NVME_WRITE, -1, state));
	release(b, &fp32_grads);
	if (p->opt_place != p->param_place || (p->stage < 3 && p->opt_place != PLACE_GPU))
		DO(sched_copy(b->s, COPY_H2D, -1, part * p->param_bytes));

	if (p->stage == 1 || p->stage == 2)
		chunked(b, COLL_ALL_GATHER, p->flat_elems, p->allgather_bucket_elems, p->param_bytes);
	if (p->stage == 3 && p->persist_elems > 0)
		coll(b, COLL_ALL_GATHER, -1, ceil_div(p->persist_elems, p->dp) * p->dp,
		     p->param_bytes, 0);
}

/* ---- entry ---- */

int build_schedule(const Plan *p, int rank, Schedule *s, PxError *err)
{
	Builder bb = {.p = p, .s = s, .tied_grad = -1}, *b = &bb;
	int n = p->n_units;

	sched_init(s, rank);
	b->gathered = malloc((size_t)n * sizeof(int));
	b->act = malloc((size_t)n * sizeof(int));
	b->ckpt = malloc((size_t)n * sizeof(int));
	b->flat_start = malloc((size_t)n * sizeof(long long));
	if (!b->gathered || !b->act || !b->ckpt || !b->flat_start) {
		b->oom = 1;
		goto out;
	}
	long long off = 0;
	for (int u = 0; u < n; u++) {
		b->gathered[u] = b->act[u] = b->ckpt[u] = -1;
		b->flat_start[u] = off;
		off += p->units[u].params;
	}

	setup(b);
	s->step_begin = s->n;
	DO(sched_loop(s, p->sc->ds.grad_accum));
	micro_batch(b);
	DO(sched_end_loop(s));
	optimizer_step(b);
out:
	free(b->gathered);
	free(b->act);
	free(b->ckpt);
	free(b->flat_start);
	if (b->oom) {
		sched_free(s);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory building the schedule");
	}
	return 0;
}
