/* runner_buf: the runner's buffers. What this executor needs for each allocation the schedule
 * makes (its own count of the model states at ZeRO 0-2, the kernels' sizes for activations and
 * workspaces, the plan's layout for the rest), what an allocation fills as it is made (the step's
 * flats of the gradients, a reduction's flattened bucket), and the allocation and free ops
 * themselves, which bind each buffer to the role the runner reads it in. */
#include <stdlib.h>
#include <string.h>

#include "runner_int.h"

/* ---- buffers: what this executor needs for each allocation ---- */

static size_t unit_fp32_elems(const Runner *r, int u)
{
	size_t n = unit_params(r, u);
	return u == r->head ? n + tied_elems(r) : n;
}

/* Unit u's dense elements in this stage's flat as the kernels count them (kernels/gpt_cpu.c,
 * gpt_tp_cpu.c: this rank's shards; the last stage's copy of the tied embedding after the head's
 * own); 0 for another stage's unit (an interleaved pipeline's bucket spans their chunks). */
static long long own_unit_elems(const Runner *r, int u)
{
	if (r->p->units[u].stage != r->stage)
		return 0;
	return (long long)unit_dense(r, u) +
	       (u == r->head && r->n_stages > 1 ? (long long)tied_elems(r) : 0);
}

/* The stage's flat of parameters at ZeRO 0-2 as this executor counts it: each of the plan's
 * buckets (whole units in backward order up to reduce_bucket_size: DeepSpeed's grouping; one
 * without a ZeRO optimizer) holds its units (own_unit_elems), padded to a multiple of dp; never
 * the plan's element counts, so that a simulator that miscounted a model's parameters would
 * show it in measured against predicted. */
long long runner_own_flat_elems(const Runner *r)
{
	long long flat = 0, n = r->n;
	for (int i = 0; i < r->st->n_buckets; i++) {
		long long e = 0;
		for (int u = r->st->buckets[i].u_lo; u <= r->st->buckets[i].u_hi; u++)
			e += own_unit_elems(r, u);
		flat += (e + n - 1) / n * n;
	}
	return flat + r->own_expert; /* the experts after the dense buckets (runner_moe.c) */
}

/* The stage's dense gradients, unpadded (DistributedDataParallel's buckets hold them). */
static long long own_dense_elems(const Runner *r)
{
	long long n = 0;
	for (int u = 0; u < r->p->n_units; u++)
		n += own_unit_elems(r, u);
	return n;
}

/* Model states at ZeRO 0-2 from own_flat: the parameters and gradients whole, the optimizer's
 * partition (stage 0: the whole flat; else its 1/dp) for the fp32 master weights (where the
 * plan has them: Plan.master_bytes), Adam's two fp32 moments or SGD's momentum, the gradient
 * partition (stage 2) and its fp32 copy under offload. -1 for anything else. */
static double own_state_bytes(const Runner *r, const Op *op)
{
	const DsConfig *ds = &r->p->sc->ds;
	double flat = (double)r->own_flat, experts = (double)r->own_expert;
	double part = r->p->stage == 0 ? flat : (flat - experts) / r->n + experts / r->n_edp;
	int sgd = !strcasecmp(ds->optimizer, "SGD");
	switch (op->what) {
	case BUF_PARAMS: return flat * (double)dt_bytes(r->pdt);
	case BUF_GRADS: return flat * (double)dt_bytes(r->gdt);
	case BUF_LP_GRADS: return flat * (double)dt_bytes(r->pdt);
	case BUF_COMM_CAST: /* BF16_Optimizer's, laid as the flat; a ZeRO bucket's as the plan's */
		return r->p->bf16_optimizer ? flat * (double)dt_bytes(ds->comm_dtype) : -1;
	case BUF_DDP_BUCKETS: return (double)own_dense_elems(r) * (double)dt_bytes(r->gdt);
	case BUF_GRAD_PART: return part * (double)dt_bytes(r->gdt);
	case BUF_GRAD_FP32: return part * 4;
	case BUF_ACCUM_GRADS: return part * (double)dt_bytes(r->pdt);
	case BUF_MASTER: return r->p->master_bytes ? part * 4 : 0;
	case BUF_OPT_STATES: /* 0/1 Adam keeps its momentum accumulator there too, 1-bit LAMB its
			       fresh variance and its fused momenta's padding */
		if (r->lamb)
			return part * 12 + 4.0 * (double)(optim_onebit_padded_elems((long long)part,
										    r->n) - (long long)part);
		return part * (sgd ? (ds->momentum != 0 ? 4 : 0) : r->zero_one ? 12 : 8);
	case BUF_ERROR_FEEDBACK: return r->onebit ? runner_onebit_error_bytes(r) : -1;
	default: return -1;
	}
}

/* Elements of the partition the update steps: the end of the executor's last segment. */
static long long step_extent(const Runner *r)
{
	long long end = 0;
	for (int i = 0; i < r->n_segs; i++)
		if (r->segs[i].part_off + r->segs[i].n > end)
			end = r->segs[i].part_off + r->segs[i].n;
	return end;
}

/* What a step's flat copy of op's range holds: the executor's segments in it (a stage-3
 * sub-group's, or the partition's). */
static long long range_extent(const Runner *r, const Op *op, long long *lo)
{
	long long hi, end = step_extent(r);
	runner_op_range(r, op, lo, &hi);
	return (hi < end ? hi : end) - *lo;
}

int runner_check_step_temp(const Schedule *s, int signs, const char *who, const char *copy,
			   PxError *err)
{
	int temp = 0;
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		temp |= op->kind == OP_ALLOC && op->what == BUF_OPT_STEP_TEMP;
		int needs = (op->kind == OP_COMPUTE && op->sub == COMP_OPTIMIZER) ||
			    (signs && op->kind == OP_COLL && op->role == ROLE_ONEBIT_SIGNS);
		if (needs && !temp)
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: %s before its %s "
				       "(BUF_OPT_STEP_TEMP) is allocated", i, who, copy);
	}
	return 0;
}

/* The executor's own size for a buffer: the kernels' for activations and workspaces, its own
 * count for the model states at ZeRO 0-2 (own_state_bytes), the plan's layout for the rest (stage
 * 3's partitions, buckets). A difference from op->bytes shows in measured against predicted.
 * The units compute in the parameters' dtype (compute.h): their working parameters, the hidden
 * stream x and the saved activations are of that type; gradients and scratch fp32. */
static size_t needed_bytes(const Runner *r, const Op *op)
{
	size_t btc = (size_t)r->B * (size_t)r->T * (size_t)r->cfg.C, e = dt_bytes(r->pdt);
	PrecisionType t = compute_prec(r->pdt);
	if (r->moe_on && op->what == BUF_SCRATCH) /* the same bytes in any type; a
						     tensor-parallel rank's units' within them */
		return moe_cpu_scratch_bytes(&r->cfg, &r->moe, r->B, r->T);
	if (r->moe_on && op->what == BUF_ACTIVATIONS && op->unit >= 0 && r->p->units[op->unit].moe)
		return moe_cpu_block_act_bytes(&r->cfg, &r->moe, r->B, r->T);
	if (op->what == BUF_SCORES) /* the rank's heads' probabilities, or their kept blocks' */
		return precision_bytes(t) *
		       (r->sparse ? sparse_eager_probs_elems(&r->ix, r->B) :
				    (size_t)r->B * (r->cfg.NH / (r->gtp.t > 1 ? r->gtp.t : 1)) * r->T *
					    r->T);
	if (r->gtp.t > 1)
		switch (op->what) {
		case BUF_ACTIVATIONS: /* selective recompute: the scores apart (BUF_SCORES) */
			if (r->p->sc->ckpt == CKPT_SELECTIVE)
				return precision_bytes(t) *
				       gpt_tp_block_acts(&r->cfg, &r->gtp, r->B, r->T).att;
			return r->sparse ? gpt_tp_block_sparse_act_bytes(&r->cfg, &r->gtp, t, r->B,
									 r->T, &r->ix) :
					   gpt_tp_block_act_bytes(&r->cfg, &r->gtp, t, r->B, r->T);
		case BUF_ENDS:
			return op->unit == r->head ?
				       gpt_tp_head_act_bytes(&r->cfg, &r->gtp, t, r->B, r->T) : 0;
		case BUF_SCRATCH: return gpt_tp_scratch_bytes(&r->cfg, &r->gtp, r->B, r->T);
		default: break;
		}
	/* the step's temporary, from the segments the update steps (a stage-3 sub-group's): torch
	 * foreach's denominators, or 1-bit LAMB's copy of its momenta (runner_lamb.c copies the
	 * whole partition). DeepSpeed's ZeRO step's flat of those segments' gradients and its fp32
	 * copy (both on the device: Plan.flattens_grads holds only for an optimizer there) */
	long long lo;
	if (op->what == BUF_OPT_STEP_TEMP)
		return 4 * (size_t)range_extent(r, op, &lo);
	if (op->what == BUF_GRAD_FLAT)
		return dt_bytes(r->gdt) * (size_t)range_extent(r, op, &lo);
	if (op->what == BUF_GRAD_FP32 && r->p->flattens_grads)
		return 4 * (size_t)range_extent(r, op, &lo);
	double own = r->own_flat >= 0 ? own_state_bytes(r, op) : -1;
	if (own >= 0)
		return (size_t)own;
	switch (op->what) {
	case BUF_ACTIVATIONS:
		if (r->p->sc->ckpt == CKPT_SELECTIVE) /* the scores apart (BUF_SCORES) */
			return precision_bytes(t) * gpt_cpu_block_acts(&r->cfg, r->B, r->T).att;
		if (r->sparse) /* the kept blocks' probabilities for the scores */
			return r->pdt == DT_FP32 ?
				gpt_cpu_block_sparse_act_bytes(&r->cfg, r->B, r->T, &r->ix) :
				gpt16_block_sparse_act_bytes(&r->cfg, t, r->B, r->T, &r->ix);
		return gpt16_block_act_bytes(&r->cfg, t, r->B, r->T);
	case BUF_ENDS:
		if (op->unit != r->head)
			return 0;
		return r->cb->head_act_bytes ? r->cb->head_act_bytes(&r->cfg, r->pdt, r->B, r->T) :
					       gpt16_head_act_bytes(&r->cfg, t, r->B, r->T);
	case BUF_CHECKPOINT: /* the block's input: this rank's rows under sequence parallelism */
		return e * stream_elems(r);
	case BUF_HIDDEN: return 4 * btc + e * btc; /* dx (fp32), then x */
	case BUF_PIPE_INPUT: case BUF_PIPE_GRAD: /* the hidden stream in the compute type */
		return e * stream_elems(r);
	case BUF_PIPE_OUTPUT: return e * pipe_sent_elems(r, 0); /* as sent */
	case BUF_PIPE_INPUT_GRAD: return e * pipe_sent_elems(r, 1);
	case BUF_SCRATCH: return gpt_cpu_scratch_bytes(&r->cfg, r->B, r->T);
	case BUF_UNIT_FP32: return e * unit_fp32_elems(r, op->unit);
	case BUF_UNIT_GRAD32: return 4 * unit_fp32_elems(r, op->unit);
	case BUF_EXPERT_GRADS: /* the block's tensors after its dense ones */
		return dt_bytes(r->gdt) * (unit_params(r, op->unit) - r->moe_dense);
	case BUF_GRAD_SWAP: /* what it swaps out: the gradient partition in fp32 */
		return 4 * (size_t)r->st->part_elems;
	case BUF_SWAP: return runner_nvme_staging_bytes(r);
	default: return (size_t)op->bytes;
	}
}

/* DeepSpeed's ZeRO 1-3 step (Plan.flattens_grads): the partition's gradients, segment by
 * segment, into one flat of type dt at their places in the partition (torch.cat of
 * averaged_gradients), and that flat into the fp32 gradients the update reads (.to(fp32)); in
 * fp32 training the segments go straight into the fp32 buffer, which is the flat. At stage 3
 * a sub-group at a time: the range of n elements from lo, whose flat starts at lo. */
static void flatten_grads(Runner *r, void *flat, Dtype dt, long long lo, long long n)
{
	long long a, b;
	for (int i = 0; i < r->n_segs; i++) {
		const Seg *sg = &r->segs[i];
		if (runner_seg_piece(sg, lo, lo + n, &a, &b))
			r->cb->convert(r->cx, at(flat, a - lo, dt), dt,
				       at(sg->grads, a - sg->part_off, sg->gdt), sg->gdt, (size_t)(b - a));
	}
}

static void fp32_grads_from_flat(Runner *r, void *g32, long long lo, long long n)
{
	if (r->id_flat >= 0)
		r->cb->convert(r->cx, g32, DT_FP32, r->buf[r->id_flat], r->gdt, (size_t)n);
	else
		flatten_grads(r, g32, DT_FP32, lo, n);
}

int runner_grow_bufs(Runner *r, int n_bufs)
{
	if (n_bufs <= r->cap_bufs)
		return 0;
	size_t n = (size_t)n_bufs + 1, old = (size_t)r->cap_bufs + 1;
	void **b = realloc(r->buf, n * sizeof(*b));
	if (b)
		r->buf = b;
	size_t *z = b ? realloc(r->size, n * sizeof(*z)) : NULL;
	if (z)
		r->size = z;
	const Op **a = z ? realloc(r->alloc_of, n * sizeof(*a)) : NULL;
	if (a)
		r->alloc_of = a;
	char *f = a ? realloc(r->zero_first, n) : NULL;
	if (!f)
		return -1;
	r->zero_first = f;
	memset(b + old, 0, (n - old) * sizeof(*b));
	memset(z + old, 0, (n - old) * sizeof(*z));
	memset(a + old, 0, (n - old) * sizeof(*a));
	memset(f + old, 0, n - old);
	r->cap_bufs = n_bufs;
	return 0;
}

/* The CUDA runtime's own memory, which the runtime allocated: counted as measured, for the run. */
static int runtime_alloc(Runner *r, const Op *op)
{
	double bytes = op->what == BUF_CUDA_CONTEXT ? r->rt.cuda_context_bytes :
		       op->what == BUF_CUBLAS_WORKSPACE ? r->rt.cublas_workspace_bytes :
		       op->what == BUF_NCCL ? r->rt.nccl_bytes : -1;
	if (bytes >= 0)
		arena_count(&r->arena, op->place, op->cat, bytes);
	return bytes >= 0;
}

/* ZeRO 2-3 without contiguous gradients: the reduction's gradients, each unit's from its own
 * buffer, into the flat; the padding zero. Stage 2 (stage_1_and_2.py allreduce_bucket's
 * flatten): the bucket's units at their places in it (the plan's offsets, as in a contiguous
 * bucket). Stage 3: op's unit, whose own buffer holds its flat as the backward laid it
 * (unit3_store_grads). */
static int flatten_bucket(Runner *r, const Op *op, void *flat, size_t bytes, PxError *err)
{
	const SchedSlice *sl = op->slice >= 0 ? &r->s->slices[op->slice] : NULL;
	long long cap = (long long)(bytes / dt_bytes(r->gdt));
	r->cb->zero(r->cx, op->place, flat, bytes);
	if (r->p->stage == 0) { /* the engine's bucket: the elements its slice names */
		long long flat_elems = r->own_flat;
		if (!sl || sl->part_off < 0 || sl->part_elems > cap ||
		    sl->part_off + sl->part_elems > flat_elems)
			return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s: its slice "
				       "names no range of the %lld gradients", buf_name(op->what),
				       flat_elems);
		r->cb->convert(r->cx, flat, r->gdt, at(r->buf[r->id_grads], sl->part_off, r->gdt),
			       r->gdt, (size_t)sl->part_elems);
		return 0;
	}
	if (r->p->stage == 3) {
		int g = op->unit >= 0 ? r->u_grads[op->unit] : -1;
		if (g < 0)
			return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s for unit %d: "
				       "its gradients are in no live buffer", buf_name(op->what),
				       op->unit);
		long long n = (long long)(r->size[g] / dt_bytes(r->gdt));
		r->cb->convert(r->cx, flat, r->gdt, r->buf[g], r->gdt, (size_t)(n < cap ? n : cap));
		return 0;
	}
	if (!sl || sl->bucket < 0 || sl->bucket >= r->st->n_buckets)
		return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s names no bucket",
			       buf_name(op->what));
	const BucketPlan *k = &r->st->buckets[sl->bucket];
	for (int u = k->u_lo; u <= k->u_hi; u++) {
		if (r->p->units[u].stage != r->stage)
			continue;
		long long at_u = r->p->units[u].flat_off - k->flat_off, n = (long long)unit_dense(r, u);
		int g = r->u_grads[u];
		if (g < 0 || at_u < 0 || at_u + n > cap)
			return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s for bucket %d: "
				       "unit %d's %lld gradients %s", buf_name(op->what), sl->bucket, u,
				       n, g < 0 ? "are in no live buffer" : "fall outside it");
		r->cb->convert(r->cx, at(flat, at_u, r->gdt), r->gdt, r->buf[g], r->gdt, (size_t)n);
	}
	return 0;
}

int runner_do_alloc(Runner *r, const Op *op, PxError *err)
{
	if (runtime_alloc(r, op))
		return 0;
	size_t bytes = needed_bytes(r, op);
	if (op->mb >= r->slots)
		return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s in micro-batch %d: "
			       "the plan has %d", buf_name(op->what), op->mb, r->slots);
	if (op->place == PLACE_NVME)
		return runner_nvme_alloc(r, op, bytes, err);
	/* a contiguous gradient buffer is torch.empty's: reduce_bucket_size elements, of which the
	 * reductions use the front (grad_dest zeroes it) */
	int empty = buf_empty(op->what);
	void *ptr = empty ? arena_alloc_empty(&r->arena, op->place, op->cat, bytes) :
			    arena_alloc(&r->arena, op->place, op->cat, bytes);
	if (!ptr)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory allocating %s (%zu bytes)",
			       buf_name(op->what), bytes);
	r->buf[op->buf] = ptr;
	r->size[op->buf] = bytes;
	r->alloc_of[op->buf] = op;
	int u = op->unit, slot = op->mb * r->p->n_units + u;
	long long lo, hi; /* a step's flat copies: the range they hold */
	switch (op->what) {
	case BUF_PARAMS: r->id_params = op->buf; break;
	case BUF_GRADS: r->id_grads = op->buf; break;
	case BUF_LP_GRADS: r->id_lp = op->buf; break;
	case BUF_DDP_BUCKETS: r->id_ddp = op->buf; break;
	case BUF_LP_UPCAST: r->id_upcast = op->buf; break;
	case BUF_PARAM_PART: r->id_part = op->buf; break;
	case BUF_PERSISTENT: r->id_persist = op->buf; break;
	case BUF_PERSIST_GRADS: r->id_pgrads = op->buf; break;
	case BUF_SECONDARY: r->id_secondary = op->buf; break;
	case BUF_GRAD_PART:
		if (r->p->fsdp)
			runner_fsdp_bind(r, u, op->buf);
		else
			r->id_gradpart = op->buf;
		break;
	case BUF_MASTER: r->id_master = op->buf; break;
	case BUF_OPT_STATES: r->id_states = op->buf; break;
	case BUF_ERROR_FEEDBACK: r->id_errors = op->buf; break;
	case BUF_OPT_STEP_TEMP: r->id_step_temp = op->buf; break;
	case BUF_GRAD_FLAT:
		r->id_flat = op->buf;
		runner_op_range(r, op, &lo, &hi);
		flatten_grads(r, ptr, r->gdt, lo, bytes / dt_bytes(r->gdt));
		break;
	case BUF_GRAD_FP32:
		r->id_grad32 = op->buf;
		runner_op_range(r, op, &lo, &hi);
		if (r->p->flattens_grads)
			fp32_grads_from_flat(r, ptr, lo, (long long)bytes / 4);
		break;
	case BUF_HIDDEN: r->id_hidden = op->buf; break;
	case BUF_SCRATCH: r->id_scratch = op->buf; break;
	case BUF_ACCUM_GRADS: r->id_accum = op->buf; break;
	case BUF_PARAM_STAGING:
		r->pstage = ptr, r->pstage_elems = (long long)(bytes / dt_bytes(r->pdt));
		break;
	case BUF_OFFLOAD_GPU_TEMP: r->id_gpu_temp = op->buf, zero(r, op->buf); break;
	case BUF_OFFLOAD_CPU_TEMP: zero(r, op->buf); break; /* torch.zeros: written, not used */
	case BUF_SCORES: r->cb->set_scores(r->cx, ptr), r->id_scores = op->buf; break;
	case BUF_EXPERT_GRADS: r->id_egrads = op->buf; break;
	case BUF_OFFLOAD_GRAD_COPY: r->id_grad_copy = op->buf; break;
	case BUF_TIED_GRADS: r->id_tied = op->buf, runner_head_grads(r, op->buf); break;
	case BUF_UNIT_GRADS: r->u_grads[u] = op->buf; break;
	case BUF_REDUCE_FLAT: return flatten_bucket(r, op, ptr, bytes, err);
	case BUF_FSDP_UNSHARDED: return runner_fsdp_cat(r, op, ptr, bytes, err);
	case BUF_FSDP_REDUCED:
		if (u >= 0 && r->u_reduced[u] < 0)
			r->u_reduced[u] = op->buf;
		break;
	case BUF_SWAP: return runner_nvme_stage(r, ptr, bytes, err);
	case BUF_UNIT_FP32: r->u_fp32[u] = op->buf, r->u_loaded[u] = 0; break;
	case BUF_UNIT_GRAD32: r->u_fp32g[u] = op->buf; break;
	case BUF_ACTIVATIONS: case BUF_ENDS: r->u_act[slot] = op->buf; break;
	case BUF_CHECKPOINT: r->u_ckpt[slot] = op->buf; break;
	case BUF_GATHERED:
		r->u_gathered[u] = op->buf;
		if (r->n == 1) { /* one rank: the schedule gathers nothing; the partition is whole */
			long long own = r->p->units[u].own_gather;
			long long n[2] = {own, r->p->units[u].gather_dense - own};
			int src[2] = {u, 0};
			for (int k = 0; k < (u == r->head ? 2 : 1); k++)
				if (runner_nvme_params_into(r, r->p->units[src[k]].part_off, n[k],
							    at(ptr, k ? own : 0, r->pdt)))
					return px_fail(err, PX_ERR_RUNTIME, "schedule op: unit %d's "
						       "parameters gathered from NVMe before they are read",
						       src[k]);
		}
		break;
	case BUF_REDUCE_BUCKET: r->zero_first[op->buf] = 1; break;
	default: break;
	}
	return 0;
}

void runner_do_free(Runner *r, int id)
{
	const Op *a = r->alloc_of[id];
	if (id == r->id_flat)
		r->id_flat = -1;
	if (id == r->id_egrads)
		r->id_egrads = -1;
	if (id == r->id_grad_copy)
		r->id_grad_copy = -1;
	if (id == r->id_upcast)
		r->id_upcast = -1;
	if (a->what == BUF_UNIT_GRADS && a->unit >= 0)
		r->u_grads[a->unit] = -1;
	if (a->what == BUF_GRAD_PART && r->p->fsdp && a->unit >= 0)
		runner_fsdp_bind(r, a->unit, -1);
	if (a->what == BUF_FSDP_REDUCED && a->unit >= 0 && r->u_reduced[a->unit] == id)
		r->u_reduced[a->unit] = -1;
	if (id == r->id_scores) {
		r->cb->set_scores(r->cx, NULL);
		r->id_scores = -1;
	}
	if (a->place == PLACE_NVME) {
		runner_nvme_free(r, id);
		return;
	}
	if (a->what == BUF_ACTIVATIONS)
		runner_moe_free_acts(r, a);
	arena_free(&r->arena, a->place, a->cat, r->buf[id], r->size[id]);
	r->buf[id] = NULL;
}
