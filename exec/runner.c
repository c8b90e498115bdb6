#include "runner_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/build.h"
#include "../engine/clock.h"
#include "../engine/onebit.h"
#include "../engine/sparse_layout.h"
#include "../engine/streams.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/ops_cpu.h"


/* ---- support ---- */

/* What a unit's ZeRO++ pieces need: qwZ's (over dp, and over hpz for hpZ's gathers) a
 * multiple of 8 elements, which DeepSpeed's quantizer groups (engine/build.h); qgZ's slices an
 * even number (two INT4 values a byte). NULL when every unit has them. */
static const char *zpp_unsupported(const Plan *p)
{
	for (int u = 0; u < p->n_units; u++) {
		long long n = p->units[u].own_gather;
		if (n == 0)
			continue;
		if (p->qwz && (build_qwz_groups(n / p->dp) < 0 ||
			       (p->hpz > 1 && build_qwz_groups(n / p->hpz) < 0)))
			return "qwZ on units whose pieces are a multiple of 8 elements (DeepSpeed's "
			       "quantizer groups no other)";
		if (p->qgz && (n / p->dp) % 2)
			return "qgZ on units whose slices are an even number of elements";
	}
	return NULL;
}

/* Whether a block-sparse layout keeps unequal numbers of blocks on the tensor-parallel ranks'
 * heads (DeepSpeed's per-head random blocks can): the prediction prices every rank the mean
 * head's. 0 when even, or dense. */
static int sparse_uneven(const Plan *p)
{
	const SparseAttn *sa = &p->sc->ds.sparse;
	long long t = p->par.tp, NH = p->sc->model.a;
	if (sa->mode == SPARSE_OFF || t <= 1 || NH % t)
		return 0;
	long long nb = sparse_layout_blocks(sa, p->sc->seq), per = nb * nb;
	unsigned char *layout = sparse_layout_create(sa, (int)NH, nb);
	if (!layout)
		return 0; /* out of memory: the run's own set-up says so */
	long long total = 0, *kept = calloc((size_t)t, sizeof(*kept));
	for (long long i = 0; kept && i < NH * per; i++) {
		kept[i / per / (NH / t)] += layout[i];
		total += layout[i];
	}
	int uneven = 0;
	for (long long r = 0; kept && r < t; r++)
		uneven |= kept[r] * t != total;
	free(kept);
	free(layout);
	return uneven;
}

int runner_supported(const Plan *p, PxError *err)
{
	const Scenario *sc = p->sc;
	const ModelSpec *m = &sc->model;
	const DsConfig *ds = &sc->ds;
	const char *why = NULL;
	if (!model_is_family(m, "gpt2") || !m->lay.tied || !m->lay.lm_head)
		why = "a GPT-2 language model (GPT2LMHeadModel: its tied head)";
	else if (m->experts && (why = runner_moe_supported(p)))
		;
	else if (p->par.tp > 1 && sc->backend != BACKEND_CPU)
		why = "tensor parallelism on backend \"cpu\" only (its units are kernels/gpt_tp_cpu's)";
	else if (p->par.tp > 1 && p->shape.sp && p->stage > 1)
		why = "sequence parallelism with ZeRO stage 0 or 1 (the replicated gradients are summed "
		      "in the whole gradient flat, which stage 2 does not keep)";
	else if (p->par.tp > 1 && (m->V % p->par.tp || m->a % p->par.tp))
		why = "tensor parallelism whose degree divides the vocabulary and the heads (pad the "
		      "vocabulary as Megatron does: parallelism.make_vocab_size_divisible_by)";
	else if (p->par.pp > 1 && sc->backend != BACKEND_CPU)
		why = "pipeline parallelism on backend \"cpu\" only (its sends are started MPI "
		      "ones)";
	else if (p->par.pp > 1 && p->param_place != PLACE_GPU)
		why = "pipeline parallelism without parameter offload";
	else if ((why = runner_nvme_supported(p)))
		;
	else if (p->ckpt_place != PLACE_GPU && sc->backend != BACKEND_CPU)
		why = "cpu_checkpointing on backend \"cpu\" only (its kernels write the checkpoint "
		      "where it is kept)";
	else if ((p->hpz > 1 || p->qwz || p->qgz) && (p->par.pp > 1 || p->par.ep > 1 ||
						      sc->backend != BACKEND_CPU))
		why = "ZeRO++ with data and tensor parallelism on backend \"cpu\"";
	else if ((why = zpp_unsupported(p)))
		;
	else if ((why = runner_onebit_supported(p)))
		;
	else if (p->fsdp && (p->param_bytes == 2 && (ds->autocast == DT_FP16 || ds->fp16)))
		why = "FSDP in fp32 or bf16 (its fp16 MixedPrecision, with ShardedGradScaler, is "
		      "priced by predict, not run)";
	else if (p->fsdp && p->opt_place != PLACE_GPU && p->sc->fsdp.sync_each_batch && p->m > 1)
		why = "FSDP's CPUOffload with no_sync over the micro-batches (with sync_each_batch "
		      "torch's FSDP1 keeps only the last micro-batch's gradients: the TODO in "
		      "flat_param.py prepare_gradient_for_backward)";
	else if (p->fsdp && p->shard_group == GROUP_NODE && p->shards < 2)
		why = "FSDP's HYBRID_SHARD with at least 2 ranks a node (with one it is "
		      "DistributedDataParallel's all-reduce)";
	else if (ds->autocast != DT_FP32 && !p->fsdp)
		why = "DeepSpeed's or fp32 precision: torch autocast (training_args.fp16 or bf16 with "
		      "framework \"pytorch\") is priced by predict, not run";
	else if (ds->comm_dtype != ds->grad_dtype && !p->bf16_optimizer && !p->fsdp &&
		 (sc->framework == FRAMEWORK_PYTORCH || p->opt_place != PLACE_GPU ||
		  sc->model.experts > 0 || p->qgz ||
		  (ds->opt && ds->opt->error_feedback != EF_NONE)))
		why = "communication_data_type other than the gradients' type under DeepSpeed without "
		      "experts, qgZ, a 1-bit optimizer or optimizer offload";
	else if (strcasecmp(ds->optimizer, "Adam") && strcasecmp(ds->optimizer, "AdamW") &&
		 strcasecmp(ds->optimizer, "SGD") && strcasecmp(ds->optimizer, "OneBitAdam") &&
		 strcasecmp(ds->optimizer, "ZeroOneAdam") && strcasecmp(ds->optimizer, "OneBitLamb"))
		why = "the Adam, AdamW, SGD, OneBitAdam, ZeroOneAdam or OneBitLamb optimizer";
	else if (p->opt_impl == OPT_IMPL_FOREACH && sc->backend != BACKEND_CPU)
		why = "torch's foreach AdamW update on backend \"cpu\" only (kernels/ops_cpu's)";
	else if (p->opt_impl != OPT_IMPL_FUSED && p->opt_impl != OPT_IMPL_FOREACH)
		why = "a fused or torch foreach Adam update: the for-loop one (params.foreach false, "
		      "or an offloaded torch optimizer) and transformers' AdamW (training_args.optim "
		      "adamw_hf) are priced by predict, not run";
	else if (ds->sched_unresolved)
		why = "a learning-rate schedule it can follow: scheduler.params.total_num_steps or "
		      "warmup_num_steps is \"auto\" and needs training_args.max_steps";
	else if (ds->sparse.mode != SPARSE_OFF && sc->backend != BACKEND_CPU &&
		 (sc->backend != BACKEND_CUDA || ds->dtype != DT_FP32))
		why = "deepspeed.sparse_attention on backend \"cpu\", or \"cuda\" in fp32 (the "
		      "block-sparse units are gpt_cpu's, gpt16_cpu's, gpt_tp_cpu's, moe_cpu's and "
		      "gpt_cuda's fp32 ones)";
	else if (sparse_uneven(p))
		why = "deepspeed.sparse_attention under tensor parallelism with a layout whose kept "
		      "blocks spread evenly over the ranks' heads (the prediction prices each rank "
		      "the mean head's; per-head random blocks give a rank another count)";
	else if (sc->backend == BACKEND_GPU)
		why = "backend \"cpu\" or \"cuda\"";
	else if (sc->attention != ATTN_EAGER)
		why = "eager attention (attention \"eager\": its kernels keep the scores)";
	if (why)
		return px_fail(err, PX_ERR_INPUT, "%s: the executor runs %s", sc->path, why);
	return runner_nvme_check_path(p, err);
}

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
static long long own_flat_elems(const Runner *r)
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

static void head_grads(Runner *r, int tied_id);

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

/* ---- FSDP (Plan.fsdp; engine/build.c fsdp_*) ---- */

/* Where the flat gradient unit u's reduction reads starts: its own flat (the root's last unit's
 * lies in its first unit's, after the first's own elements); NULL when none is live. */
static void *fsdp_flat_of(const Runner *r, int u)
{
	int root_tail = u == r->p->n_units - 1;
	int id = r->u_flat[root_tail ? 0 : u];
	return id < 0 ? NULL : at(r->buf[id], root_tail ? r->p->units[0].own_gather : 0, r->gdt);
}

/* One rank: the builder adds no reduce-scatter over a group of one (build.c coll), so unit u's
 * shard takes its flat's elements itself, added in (as the reduction's slice would be). */
static void fsdp_local_reduce(Runner *r, int u)
{
	void *flat = fsdp_flat_of(r, u);
	if (r->n == 1 && flat && r->u_shard[u] >= 0)
		add_into(r, r->buf[r->u_shard[u]], flat, r->gdt, (size_t)r->p->units[u].part_dense,
			 DT_FP32);
}

/* Unit u's gradient shard (buffer id, -1 once freed): where its reductions' slices go
 * (consume) and what the update reads (its segment's gradients). */
static void fsdp_bind(Runner *r, int u, int id)
{
	r->u_shard[u] = id;
	for (int i = 0; i < r->n_segs && !r->offload; i++) /* CPUOffload: the host's (segments) */
		if (r->segs[i].part_off == r->p->units[u].part_off)
			r->segs[i].grads = id >= 0 ? r->buf[id] : NULL;
	if (id >= 0)
		fsdp_local_reduce(r, u);
}

/* Autograd's cat of unit u's tensors' gradients (its BUF_UNIT_GRADS, laid as its flat) into the
 * flat's gradient, the padding zero; the root's (unit 0's) after its first unit's the head's
 * own, and the head's share of the tied token embedding added into the embedding's (unit 0's
 * first tensor). */
static int fsdp_cat(Runner *r, const Op *op, void *flat, size_t bytes, PxError *err)
{
	int u = op->unit, h = r->head, g = u >= 0 ? r->u_grads[u] : -1;
	int gh = u == 0 ? r->u_grads[h] : -1;
	long long cap = (long long)(bytes / dt_bytes(r->gdt)), own = (long long)unit_params(r, h);
	long long n = g >= 0 ? (long long)(r->size[g] / dt_bytes(r->gdt)) : 0;
	long long at_h = u == 0 ? r->p->units[0].own_gather : 0, vc = (long long)tied_elems(r);
	if (g < 0 || n > cap || (u == 0 && (gh < 0 || at_h + own > cap || vc > n)))
		return px_fail(err, PX_ERR_RUNTIME, "schedule allocation of %s for unit %d: its "
			       "gradients are in no live buffer, or do not fit it",
			       buf_name(op->what), u);
	r->cb->zero(r->cx, op->place, flat, bytes);
	r->cb->convert(r->cx, flat, r->gdt, r->buf[g], r->gdt, (size_t)n);
	if (u == 0) {
		r->cb->convert(r->cx, at(flat, at_h, r->gdt), r->gdt, r->buf[gh], r->gdt, (size_t)own);
		add_into(r, flat, at(r->buf[gh], own, r->gdt), r->gdt, (size_t)vc, r->gdt);
	}
	r->u_flat[u] = op->buf;
	return 0;
}

/* FSDP's COMP_GRAD_ACCUM: under no_sync, the unit's newest flat gradient added into the one kept
 * (the op's buffer), which its reduction reads from then on; into a shard, the reduction's slice
 * went already (consume), or on one rank goes now. */
static void fsdp_accumulate(Runner *r, const Op *op)
{
	int u = op->unit;
	if (op->buf < 0 || u < 0)
		return;
	if (r->alloc_of[op->buf]->what != BUF_FSDP_UNSHARDED) {
		fsdp_local_reduce(r, u);
		return;
	}
	int src = r->u_flat[u];
	if (src >= 0 && src != op->buf)
		add_into(r, r->buf[op->buf], r->buf[src], r->gdt,
			 r->size[op->buf] / dt_bytes(r->gdt), r->gdt);
	r->u_flat[u] = op->buf;
}

static int do_alloc(Runner *r, const Op *op, PxError *err)
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
	int empty = op->what == BUF_REDUCE_BUCKET;
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
			fsdp_bind(r, u, op->buf);
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
	case BUF_TIED_GRADS: r->id_tied = op->buf, head_grads(r, op->buf); break;
	case BUF_UNIT_GRADS: r->u_grads[u] = op->buf; break;
	case BUF_REDUCE_FLAT: return flatten_bucket(r, op, ptr, bytes, err);
	case BUF_FSDP_UNSHARDED: return fsdp_cat(r, op, ptr, bytes, err);
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

static void do_free(Runner *r, int id)
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
		fsdp_bind(r, a->unit, -1);
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
	arena_free(&r->arena, a->place, a->cat, r->buf[id], r->size[id]);
	r->buf[id] = NULL;
}

/* ---- unit parameters and gradients ---- */


/* The working copy is of the storage type: its copies are plain ones (convert of like to like). */
static void to_work(Runner *r, void *dst, const void *src, size_t n)
{
	r->cb->convert(r->cx, dst, r->pdt, src, r->pdt, n);
}

/* Stage 3: copy unit u's tensors (model layout, compute type) from its own flat at `own`
 * (storage) and the persistent buffer, or (grads) the other way, adding into the persistent
 * gradients. Only the first max_t tensors. */
static void unit3_load(Runner *r, int u, void *dst, const void *own, int max_t)
{
	const UnitPlan *up = &r->p->units[u];
	long long o = 0, q = r->persist_off[u], d = 0;
	for (int i = 0; i < up->n_tensors && i < max_t; i++) {
		long long n = up->tensor_local[i];
		void *to = at(dst, d, r->pdt);
		if (is_persistent(r, n))
			to_work(r, to, at(r->buf[r->id_persist], q, r->pdt), (size_t)n), q += n;
		else
			to_work(r, to, at((void *)own, o, r->pdt), (size_t)n), o += n;
		d += n;
	}
}

/* Where persistent gradients accumulate: their own buffer, reduce-scattered (or, offloaded,
 * copied to the host) after each micro-batch; with one rank and no offload (nothing in the
 * schedule moves them) straight into the partition. */
static void *persist_grads(Runner *r)
{
	return r->n == 1 && !r->offload ?
		at(r->buf[r->id_gradpart], r->st->persist_part_off, r->gdt) : r->buf[r->id_pgrads];
}

static void unit3_store_grads(Runner *r, int u, const float *src, void *own, int max_t)
{
	const UnitPlan *up = &r->p->units[u];
	long long o = 0, q = r->persist_off[u], d = 0;
	for (int i = 0; i < up->n_tensors && i < max_t; i++) {
		long long n = up->tensor_local[i];
		if (is_persistent(r, n))
			add_into(r, at(persist_grads(r), q, r->gdt), src + d, DT_FP32, (size_t)n, r->gdt),
				q += n;
		else
			add_into(r, at(own, o, r->gdt), src + d, DT_FP32, (size_t)n, r->gdt), o += n;
		d += n;
	}
}

/* Where the head's copy of the token embedding lies in the stage's flat buffers (stage 0-2): the
 * embedding's own, unit 0's first tensor; pipelined, the last stage's copy after the head's own
 * tensors (plan.c). */
static long long tied_off(const Runner *r)
{
	const UnitPlan *h = &r->p->units[r->head];
	return r->n_stages > 1 ? h->flat_off + (long long)unit_params(r, r->head) :
				 r->p->units[0].flat_off;
}

/* The unit's model-layout parameters in the compute type (the head's followed by the tied token
 * embedding). */
static void load_params(Runner *r, int u)
{
	void *dst = r->buf[r->u_fp32[u]];
	size_t own = unit_params(r, u), vc = tied_elems(r);
	if (r->u_loaded[u])
		return;
	r->u_loaded[u] = 1;
	if (r->p->stage < 3) {
		void *flat = r->buf[r->id_params];
		size_t dense = unit_dense(r, u); /* an MoE block's experts lie in the expert flat */
		to_work(r, dst, at(flat, r->p->units[u].flat_off, r->pdt), dense);
		if (dense < own)
			to_work(r, at(dst, (long long)dense, r->pdt), at(flat, r->expert_off[u], r->pdt),
				own - dense);
		if (u == r->head)
			to_work(r, at(dst, (long long)own, r->pdt), at(flat, tied_off(r), r->pdt), vc);
		return;
	}
	void *g = r->buf[r->u_gathered[u]];
	unit3_load(r, u, dst, g, MODEL_MAX_TENSORS);
	if (u == r->head) /* embed.tokens, unit 0's first tensor, gathered after the head's own
			     (FSDP's root holds it once: unit 0's gathered flat) */
		unit3_load(r, 0, at(dst, (long long)own, r->pdt),
			   r->p->fsdp ? r->buf[r->u_gathered[0]] :
					at(g, r->p->units[u].own_gather, r->pdt), 1);
}

/* The type of what gradient buffer id holds: BF16_Optimizer's .grad tensors the parameters',
 * a reduction's cast communication_data_type, any other the accumulation type. */
static Dtype grads_dt(const Runner *r, int id)
{
	BufWhat w = (BufWhat)r->alloc_of[id]->what;
	return w == BUF_LP_GRADS ? r->pdt : w == BUF_COMM_CAST ? r->p->sc->ds.comm_dtype : r->gdt;
}

/* Where a backward op's dense gradients go, as the schedule states it (sched_grads_to): at stage
 * 0-1 the full gradients, or BF16_Optimizer's .grad tensors, zeroed first once update_hp_grads
 * has added them; at stage 2-3 the contiguous buffer the next reduction (or offload copy) reads,
 * at the unit's place in it, zeroed first when its last reduction has been consumed; or, with
 * nothing to reduce them, the partition itself. NULL when the schedule names none. */
static void *grad_dest(Runner *r, const Op *bwd)
{
	if (bwd->buf < 0)
		return NULL;
	if (r->zero_first[bwd->buf]) {
		size_t n = r->size[bwd->buf];
		if (r->alloc_of[bwd->buf]->what == BUF_REDUCE_BUCKET) { /* the front reductions use */
			size_t fill = (size_t)r->p->stages[r->stage].bucket_fill * dt_bytes(r->gdt);
			n = fill < n ? fill : n;
		}
		r->cb->zero(r->cx, r->alloc_of[bwd->buf]->place, r->buf[bwd->buf], n);
		r->zero_first[bwd->buf] = 0;
	}
	return at(r->buf[bwd->buf], bwd->elems, grads_dt(r, bwd->buf));
}

/* After unit u's backward (op): its fp32 gradients to where the schedule reduces them from. */
static void move_grads(Runner *r, const Op *op)
{
	int u = op->unit;
	const Plan *p = r->p;
	float *g = r->buf[r->u_fp32g[u]];
	size_t own = unit_dense(r, u), vc = tied_elems(r), experts = unit_params(r, u) - own;
	if (p->stage < 2)
		(void)grad_dest(r, op); /* a buffer to be zeroed first is, before anything goes in */

	if (experts > 0 && r->n_edp == 1) /* no reduce-scatter over edp divides them: DeepSpeed's
					     bucket divides them by dp all the same */
		runner_predivide(r, g + own, DT_FP32, experts);

	if (experts > 0 && r->id_egrads >= 0 && r->alloc_of[r->id_egrads]->unit == u)
		/* an MoE block's experts at stage 2, into their own buffer for the reduction over
		   the expert-data-parallel group (or the copy to the host) after this backward */
		from_f32(r, r->buf[r->id_egrads], g + own, experts, r->gdt);
	else if (experts > 0) { /* into the expert flat's gradients (stage 0-1), or straight into
				   the partition at stage 2 (edp 1, the optimizer on the device:
				   nothing reduces or copies them) */
		Dtype d = p->stage < 2 ? grads_dt(r, op->buf) : r->gdt;
		void *dst = p->stage < 2 ? at(r->buf[op->buf], r->expert_off[u], d) :
			runner_partition_grads(r, runner_moe_part_off(r, u));
		add_into(r, dst, g + own, DT_FP32, experts, d);
	}
	if (p->stage < 2) { /* into the full gradients, accumulating over micro-batches; under
			       BF16_Optimizer into its bf16 .grad tensors, over this backward */
		Dtype d = grads_dt(r, op->buf);
		void *flat = r->buf[op->buf];
		add_into(r, at(flat, p->units[u].flat_off, d), g, DT_FP32, own, d);
		if (u == r->head)
			add_into(r, at(flat, tied_off(r), d), g + own, DT_FP32, vc, d);
		return;
	}
	if (u == r->head) { /* its own now; the token embedding's share waits for its buffer
			       (head_grads) unless that tensor is persistent */
		if (p->stage == 2)
			add_into(r, grad_dest(r, op), g, DT_FP32, own, r->gdt);
		else
			unit3_store_grads(r, u, g, p->units[u].own_gather > 0 ? grad_dest(r, op) : NULL,
					  MODEL_MAX_TENSORS);
		if (p->fsdp) /* its share of the tied embedding's, after its own (fsdp_cat) */
			add_into(r, at(grad_dest(r, op), (long long)own, r->gdt), g + own, DT_FP32, vc,
				 r->gdt);
		if (p->stage == 3 && is_persistent(r, (long long)vc))
			unit3_store_grads(r, 0, g + own, NULL, 1);
		return;
	}
	void *dst = grad_dest(r, op);
	if (p->stage == 2)
		add_into(r, dst, g, DT_FP32, own, r->gdt);
	else
		unit3_store_grads(r, u, g, dst, MODEL_MAX_TENSORS);
	if (u == 0 && r->id_tied >= 0) /* the head's share of the token embedding's gradient */
		add_into(r, dst, r->buf[r->id_tied], r->gdt,
			 p->stage == 2 ? vc : (size_t)p->units[0].own_gather, r->gdt);
}

/* The tied buffer, held until the embedding's backward: the head's token-embedding gradient
 * (stage 3: in the embedding flat's layout; a persistent token embedding went elsewhere). */
static void head_grads(Runner *r, int tied_id)
{
	const float *g = r->buf[r->u_fp32g[r->head]];
	size_t own = unit_params(r, r->head), vc = tied_elems(r);
	if (r->p->stage == 2)
		from_f32(r, r->buf[tied_id], g + own, vc, r->gdt);
	else if (!is_persistent(r, (long long)vc))
		unit3_store_grads(r, 0, g + own, r->buf[tied_id], 1);
}

/* BF16_Optimizer's update_hp_grads (op: COMP_GRAD_ACCUM): the bf16 .grad tensors of op's span
 * added into the gradients at the same place; in another dtype each cast first into the
 * schedule's copy (BUF_LP_UPCAST, the span's largest tensor), here a copy's worth at a time (the
 * same sums: an elementwise add). The next backward finds them cleared (clear_lp_grads): the
 * buffer is zeroed before its first write there (grad_dest). */
static void accumulate_hp(Runner *r, const Op *op)
{
	long long n = (long long)op->flops, step = n;
	void *tmp = NULL;
	if (r->id_upcast >= 0 && r->gdt != r->pdt) {
		tmp = r->buf[r->id_upcast];
		step = (long long)(r->size[r->id_upcast] / dt_bytes(r->gdt));
	}
	for (long long a = 0; a < n; a += step) {
		size_t k = (size_t)(n - a < step ? n - a : step);
		void *hp = at(r->buf[r->id_grads], op->elems + a, r->gdt);
		const void *lp = at(r->buf[op->buf], op->elems + a, r->pdt);
		if (tmp) {
			r->cb->convert(r->cx, tmp, r->gdt, lp, r->pdt, k);
			add_into(r, hp, tmp, r->gdt, k, r->gdt);
		} else {
			add_into(r, hp, lp, r->pdt, k, r->gdt);
		}
	}
	r->zero_first[op->buf] = 1;
}

/* ---- compute ---- */

/* The activation (or checkpoint) buffer of op's unit in op's micro-batch. */
static void *unit_buf(Runner *r, const int *ids, const Op *op)
{
	int id = ids[op->mb * r->p->n_units + op->unit];
	return id >= 0 ? r->buf[id] : NULL;
}

/* The backward scratch, which the tensor-parallel units use forward too (NULL when the schedule
 * holds none then). */
static float *scratch_buf(Runner *r)
{
	return r->id_scratch >= 0 ? r->buf[r->id_scratch] : NULL;
}

static void forward(Runner *r, const Op *op)
{
	int u = op->unit, ckpt = r->u_ckpt[op->mb * r->p->n_units + u];
	void *x = hidden_x(r), *params = r->buf[r->u_fp32[u]], *acts = unit_buf(r, r->u_act, op);
	load_params(r, u);
	if (u == 0) {
		r->cb->embed_forward(r->cx, params, x, scratch_buf(r));
	} else if (u == r->head) {
		long long own = (long long)unit_params(r, u);
		r->loss_sum += r->cb->head_forward(r->cx, params, at(params, own, r->pdt), x, acts,
						   scratch_buf(r));
	} else {
		if (ckpt >= 0) /* full recompute keeps the block's input */
			to_work(r, r->buf[ckpt], x, r->size[ckpt] / dt_bytes(r->pdt));
		if (is_moe_unit(r, u))
			runner_moe_forward(r, params, x, x, acts);
		else
			r->cb->block_forward(r->cx, params, x, x, acts, scratch_buf(r));
	}
}

static void recompute(Runner *r, const Op *op)
{
	if (r->id_scores >= 0) { /* selective: the attention core's scores */
		if (is_moe_unit(r, op->unit))
			runner_moe_scores(r, unit_buf(r, r->u_act, op));
		else
			r->cb->block_scores(r->cx, unit_buf(r, r->u_act, op));
		return;
	}
	load_params(r, op->unit);
	void *in = unit_buf(r, r->u_ckpt, op), *params = r->buf[r->u_fp32[op->unit]];
	if (is_moe_unit(r, op->unit)) /* gates, dispatches and combines again */
		runner_moe_forward(r, params, in, in, unit_buf(r, r->u_act, op));
	else
		r->cb->block_forward(r->cx, params, in, in, unit_buf(r, r->u_act, op),
				     scratch_buf(r));
}

static void backward(Runner *r, const Op *op)
{
	int u = op->unit;
	float *dx = hidden_dx(r), *grads = r->buf[r->u_fp32g[u]];
	void *params = r->buf[r->u_fp32[u]], *acts = unit_buf(r, r->u_act, op);
	float *scratch = r->buf[r->id_scratch];
	load_params(r, u);
	if (u == r->head) {
		long long own = (long long)unit_params(r, u);
		float dloss = (float)(r->loss_scale / (double)r->p->m);
		r->cb->head_backward(r->cx, params, at(params, own, r->pdt), grads, grads + own, acts,
				     dloss, dx, scratch);
	} else if (u == 0) {
		r->cb->embed_backward(r->cx, grads, dx, scratch);
	} else if (is_moe_unit(r, u)) {
		runner_moe_backward(r, params, grads, acts, dx);
	} else {
		r->cb->block_backward(r->cx, params, grads, acts, dx, dx, scratch);
	}
	move_grads(r, op);
}

/* ---- collectives ---- */

/* *x over c's ranks, through the backend's memory */
static int all_reduce_scalar(Runner *r, Comm *c, float *x, CommRedOp op, PxError *err)
{
	r->cb->from_host(r->cx, r->scalar, x, sizeof(*x));
	if (comm_all_reduce(c, r->scalar, r->scalar, 1, COMM_FP32, op, err))
		return -1;
	r->cb->to_host(r->cx, x, r->scalar, sizeof(*x));
	return 0;
}

/* Where a stage 2-3 gradient reduction's slice (op: the reduction, or the offload copy naming
 * it) starts in this rank's partition: the schedule's slice (build.c states one on every
 * reduction the executor runs; runner_supported refuses the layouts without). */
static long long partition_offset(const Runner *r, const Op *op)
{
	return r->s->slices[op->slice].part_off;
}

/* A reduced buffer was consumed: persistent gradients are whole again for the next micro-batch;
 * a contiguous buffer is zeroed before the next gradients go in. */
static void recycle(Runner *r, int buf)
{
	if (buf == r->id_pgrads)
		zero(r, r->id_pgrads);
	else if (buf >= 0)
		r->zero_first[buf] = 1;
}

/* Whether op reduces stage 1's gradients through a contiguous buffer (build.c): copied in from
 * the full gradients, the slice going back (stage1_slice_back). */
static int stage1_via_bucket(const Runner *r, const Op *op)
{
	return r->p->stage == 1 && op->role == ROLE_GRAD_REDUCE && op->buf >= 0 &&
	       r->alloc_of[op->buf]->what == BUF_REDUCE_BUCKET;
}

/* Stage 1: where a bucket's reduction through a contiguous buffer reads and leaves its elements
 * in the full gradients (the stage's bucket the op's slice names, whole). */
static void *stage1_bucket_grads(Runner *r, const Op *op)
{
	const BucketPlan *k = &r->st->buckets[r->s->slices[op->slice].bucket];
	return at(r->buf[r->id_grads], k->flat_off, r->gdt);
}

/* This rank's reduced slice of a stage 2-3 reduction, into its gradient partition; of a stage-1
 * one through a contiguous buffer, back into its place in the full gradients, where the update
 * reads it (stage_1_and_2.py copy_grads_in_partition). */
static void consume(Runner *r, const Op *op, const void *mine, size_t cnt)
{
	if (stage1_via_bucket(r, op)) {
		size_t from = (size_t)((const char *)mine - (const char *)r->buf[op->buf]);
		r->cb->convert(r->cx, (char *)stage1_bucket_grads(r, op) + from, r->gdt, mine, r->gdt,
			       cnt);
		return;
	}
	if (r->p->fsdp) { /* into the unit's shard, fp32 (allocated before the reduction); under
			     HYBRID_SHARD over several nodes into the output the all-reduce over them
			     reads, where the schedule has one (else the fresh shard is that output) */
		int u = op->unit, o = r->u_reduced[u];
		if (r->p->shard_group == GROUP_NODE && r->p->spans[GROUP_XNODE].n > 1 && o >= 0) {
			r->cb->convert(r->cx, r->buf[o], r->gdt, mine, r->gdt, cnt);
			return;
		}
		add_into(r, at(r->buf[r->u_shard[u]], partition_offset(r, op) -
			       r->p->units[u].part_off, DT_FP32), mine, r->gdt, cnt, DT_FP32);
		return;
	}
	add_into(r, at(r->buf[r->id_gradpart], partition_offset(r, op), r->gdt), mine, r->gdt, cnt,
		 r->gdt);
}

/* The communicator of op's group (op->group is obeyed): the tensor-parallel one, the
 * data-parallel one, which the expert-data-parallel group equals when every rank holds every
 * expert, the expert-data-parallel one, the pipeline's (runner_pipe_comm) and ZeRO++'s. The
 * executor has no other yet (runner_supported refuses the layouts that need one). */
static Comm *group_comm(Runner *r, const Op *op, PxError *err)
{
	if (op->group == GROUP_TP && r->tp && op->nranks == comm_size(r->tp))
		return r->tp;
	if (op->group == GROUP_EDP && r->edp && op->nranks == comm_size(r->edp))
		return r->edp;
	if (r->dp && op->nranks == comm_size(r->dp) &&
	    (op->group == GROUP_DP || (op->group == GROUP_EDP && r->p->edp == r->p->dp)))
		return r->dp;
	if (op->group == GROUP_PP && runner_pipe_comm(r, op))
		return runner_pipe_comm(r, op);
	Comm *zpp = op->group == GROUP_HPZ ? r->hpz : op->group == GROUP_NODE ? r->node :
		    op->group == GROUP_XNODE ? r->xnode : NULL;
	if (zpp && op->nranks == comm_size(zpp))
		return zpp;
	px_fail(err, PX_ERR_RUNTIME, "a %s over the %s group of %d ranks: the executor has no "
		"communicator for that group", coll_name(op->sub), group_name(op->group), op->nranks);
	return NULL;
}

/* The collective op stands for, over c: blocking, or started into q when q is not NULL. */
static int issue(Comm *c, const Op *op, const void *send, void *recv, size_t count, Dtype d,
		 Pending *q, PxError *err)
{
	CommDtype dt = comm_dt(d);
	if (op->sub == COLL_ALL_GATHER)
		return q ? comm_all_gather_start(c, send, recv, count, dt, &q->req, err)
			 : comm_all_gather(c, send, recv, count, dt, err);
	if (op->sub == COLL_REDUCE_SCATTER)
		return q ? comm_reduce_scatter_start(c, send, recv, count, dt, COMM_SUM, &q->req, err)
			 : comm_reduce_scatter(c, send, recv, count, dt, COMM_SUM, err);
	return q ? comm_all_reduce_start(c, send, recv, count, dt, COMM_SUM, &q->req, err)
		 : comm_all_reduce(c, send, recv, count, dt, COMM_SUM, err);
}

static int pend_push(Runner *r, Pending *q)
{
	if (q) {
		r->n_pend++;
		r->ov.started++;
	}
	return 0;
}

/* A stage 2-3 gradient reduction issued: this rank's reduced slice (mine, cnt elements) is
 * added into the gradient partition now when it was blocking, or when q completes; offload
 * copies it to the host instead (copy). The bucket is zeroed for reuse. */
static int slice_reduced(Runner *r, const Op *op, void *mine, size_t cnt, Pending *q)
{
	if (r->offload && !stage1_via_bucket(r, op) && !r->p->fsdp) /* FSDP's go to the device's
									shard, then copied */
		return pend_push(r, q);
	if (!q) {
		consume(r, op, mine, cnt);
		recycle(r, op->buf);
		return 0;
	}
	q->mine = mine, q->cnt = cnt;
	if (op->buf == r->id_pgrads)
		q->recycle_buf = op->buf; /* zeroed once reduced */
	else
		recycle(r, op->buf);
	return pend_push(r, q);
}

/* n gradients g all-reduced through their copy x in communication_data_type: cast into it,
 * divided by dp there where DeepSpeed divides, all-reduced, and cast back into g. */
static int all_reduce_cast(Runner *r, Comm *c, void *g, void *x, size_t n, PxError *err)
{
	Dtype cdt = r->p->sc->ds.comm_dtype;
	r->cb->convert(r->cx, x, cdt, g, r->gdt, n);
	runner_predivide(r, x, cdt, n);
	if (comm_all_reduce(c, x, x, n, comm_dt(cdt), COMM_SUM, err))
		return -1;
	r->cb->convert(r->cx, g, r->gdt, x, cdt, n);
	return 0;
}

/* BF16_Optimizer's reduction in communication_data_type (build.c bf16_reduce): op's elements
 * of the gradients cast into the same place of its cast buffer, all-reduced there (divided by
 * dp first where DeepSpeed does), and cast back. Blocking: the step follows at once. */
static int cast_reduce(Runner *r, const Op *op, Comm *c, PxError *err)
{
	return all_reduce_cast(r, c, at(r->buf[r->id_grads], op->offset, r->gdt),
			       at(r->buf[op->buf], op->offset, r->p->sc->ds.comm_dtype),
			       (size_t)op->elems, err);
}

/* Whether buffer id is live, of kind w and at least bytes long. */
static int live_as(const Runner *r, int id, BufWhat w, size_t bytes)
{
	return id >= 0 && id < r->s->n_bufs && r->buf[id] && r->alloc_of[id]->what == w &&
	       r->size[id] >= bytes;
}

/* A ZeRO reduction through a copy cast to communication_data_type (its slice's cast, build.c
 * zero_cast), blocking (the cast back follows at once), this rank's reduced slice then going
 * where a reduced slice goes:
 * - an all-reduce (ZeRO 1-2 with reduce_scatter off, gradient_reduction_w_predivide) or a ZeRO-3
 *   reduce-scatter (__avg_scatter_grads): the gradients cast whole into the copy, divided by dp
 *   there where DeepSpeed divides (in the communication type), reduced in it, and cast back: an
 *   all-reduce's whole array, as gradient_reduction_w_predivide copies it back, a
 *   reduce-scatter's slice of this rank;
 * - a ZeRO 1-2 reduce-scatter (average_tensor): the bucket divided by dp first in its own type
 *   (tensor.div_), cast whole into the executor's workspace (cast_send), reduce-scattered from
 *   there into the copy, which DeepSpeed's per-rank casts and reduces would leave this rank's
 *   reduced slice in, and that cast back. */
static int zero_cast_reduce(Runner *r, const Op *op, Comm *c, const SchedSlice *sl,
			    PxError *err)
{
	Dtype cdt = r->p->sc->ds.comm_dtype;
	size_t n = (size_t)op->elems, cnt = n / (size_t)op->nranks, e = dt_bytes(cdt);
	int all = op->sub == COLL_ALL_REDUCE, slices = !all && r->p->stage < 3;
	if (op->buf < 0 || (!all && op->sub != COLL_REDUCE_SCATTER) ||
	    !live_as(r, sl->cast, BUF_COMM_CAST, (slices ? cnt : n) * e) ||
	    (slices && !live_as(r, sl->cast_send, BUF_EXEC_CAST, n * e)))
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a %s of %zu gradients through "
			       "cast copies that are not live communication_data_type buffers of "
			       "their sizes", (int)(op - r->s->ops), coll_name(op->sub), n);
	long long rank = comm_rank(c), from = rank * (long long)cnt;
	void *a = at(r->buf[op->buf], op->offset, r->gdt), *x = r->buf[sl->cast];
	void *send = slices ? r->buf[sl->cast_send] : x;
	if (stage1_via_bucket(r, op))
		r->cb->convert(r->cx, a, r->gdt, stage1_bucket_grads(r, op), r->gdt, n);
	if (all) {
		if (all_reduce_cast(r, c, a, x, n, err))
			return -1;
	} else {
		if (slices)
			runner_predivide(r, a, r->gdt, n);
		r->cb->convert(r->cx, send, cdt, a, r->gdt, n);
		if (!slices)
			runner_predivide(r, x, cdt, n);
		void *mine = slices ? x : at(x, from, cdt);
		if (comm_reduce_scatter(c, send, mine, cnt, comm_dt(cdt), COMM_SUM, err))
			return -1;
		r->cb->convert(r->cx, at(a, from, r->gdt), r->gdt, mine, cdt, cnt);
	}
	return slice_reduced(r, op, at(a, from, r->gdt), cnt, NULL);
}

/* Stage 0's engine bucket (build.c engine_allreduce), flattened when it was allocated, or a
 * DistributedDataParallel bucket (build.c ddp_ready), copied into the reducer's flat now:
 * all-reduced there (divided by dp first where DeepSpeed does) and copied back where its slice
 * says: at once when blocking (q NULL: the engine's, after the backward), or when a started one
 * completes (finish_pending: DDP's, on the reduction stream while the backward goes on,
 * Plan.overlap_comm; the optimizer and the one-value all-reduces wait for them). */
static int flat_reduce(Runner *r, const Op *op, Comm *c, Pending *q, PxError *err)
{
	const SchedSlice *sl = op->slice >= 0 ? &r->s->slices[op->slice] : NULL;
	size_t n = (size_t)op->elems;
	void *x = at(r->buf[op->buf], op->offset, r->gdt);
	if (!sl || sl->part_elems != op->elems || sl->part_off < 0 ||
	    (size_t)(op->offset + op->elems) * dt_bytes(r->gdt) > r->size[op->buf] ||
	    sl->part_off + sl->part_elems > r->own_flat)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: an all-reduce of %lld flattened "
			       "gradients whose slice does not say where they go back, or that "
			       "falls outside its buffer", (int)(op - r->s->ops), (long long)op->elems);
	void *g = at(r->buf[r->id_grads], sl->part_off, r->gdt);
	if (op->buf == r->id_ddp)
		r->cb->convert(r->cx, x, r->gdt, g, r->gdt, n);
	if (sl->cast >= 0) { /* allreduce_bucket's cast: divided in it, reduced, copied back */
		Dtype cdt = r->p->sc->ds.comm_dtype;
		if (!live_as(r, sl->cast, BUF_COMM_CAST, n * dt_bytes(cdt)))
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a cast copy that is not a "
				       "live communication_data_type buffer of %zu elements",
				       (int)(op - r->s->ops), n);
		if (all_reduce_cast(r, c, x, r->buf[sl->cast], n, err))
			return -1;
		r->cb->convert(r->cx, g, r->gdt, x, r->gdt, n);
		return 0;
	}
	runner_predivide(r, x, r->gdt, n);
	if (issue(c, op, x, x, n, r->gdt, q, err))
		return -1;
	if (!q) {
		r->cb->convert(r->cx, g, r->gdt, x, r->gdt, n);
		return 0;
	}
	q->back_to = g, q->back_from = x, q->back_n = n;
	return pend_push(r, q);
}

static int wait_all(Runner *r, PxError *err);

/* FSDP's HYBRID_SHARD: a unit's reduce-scatter output (or its fresh shard) summed over the nodes
 * (allreduce_hook), blocking once the reduce-scatter into it has landed, then cast into the
 * unit's fp32 shard. */
static int fsdp_hybrid_all_reduce(Runner *r, const Op *op, Comm *c, PxError *err)
{
	int u = op->unit, into_shard = r->alloc_of[op->buf]->what == BUF_GRAD_PART;
	Dtype dt = into_shard ? DT_FP32 : r->gdt;
	if (wait_all(r, err) || comm_all_reduce(c, r->buf[op->buf], r->buf[op->buf],
						(size_t)op->elems, comm_dt(dt), COMM_SUM, err))
		return -1;
	if (!into_shard)
		add_into(r, r->buf[r->u_shard[u]], r->buf[op->buf], r->gdt, (size_t)op->elems,
			 DT_FP32);
	return 0;
}

/* Blocking, or (prefetch and reduction streams, engine/streams.h) started: then the work its
 * completion allows (a stage 2-3 slice into the partition, persistent gradients zeroed) waits
 * for finish_pending, and the next gradients go to the other bucket now. */
static int collective(Runner *r, const Op *op, PxError *err)
{
	const Plan *p = r->p;
	size_t cnt = (size_t)(op->elems / op->nranks);
	if (op->sub == COLL_P2P || op->sub == COLL_P2P_RECV)
		return runner_pipe_p2p(r, op, &r->pend[r->n_pend], err);
	if (op->role >= ROLE_ONEBIT_SIGNS && op->role <= ROLE_ONEBIT_SERVER_SCALES)
		return runner_onebit_coll(r, op, err);
	if (op->group == GROUP_TP && op->role == ROLE_GRAD_REDUCE)
		return runner_tp_replicated(r, op, err);
	if (runner_pipe_is_gather(r, op))
		return runner_pipe_gather(r, op, err);
	if ((op->group == GROUP_TP || op->group == GROUP_EP) && op->role != ROLE_OVERFLOW &&
	    op->role != ROLE_GRAD_NORM)
		return runner_tp_pass(r, (int)(op - r->s->ops), err); /* the kernels ran it */
	if (op->group == GROUP_EDP && op->buf < 0) /* the expert flat's, named by offset */
		return runner_moe_flat_coll(r, op, err);
	Comm *c = group_comm(r, op, err);
	if (!c)
		return -1;
	if (op->role == ROLE_OVERFLOW || op->role == ROLE_GRAD_NORM) {
		/* over the data-parallel group, then the pipeline's: each from the last's result;
		 * at stage 0 the data-parallel one comes last and averages the ranks' norms
		 * (runtime/utils.py clip_grad_norm_: each rank's norm over the group size, summed),
		 * which differ where the gradients were not all-reduced (1-bit compressed steps) or
		 * hold different experts */
		int mean = op->role == ROLE_GRAD_NORM && op->group == GROUP_DP && p->stage == 0;
		double local = op->role == ROLE_OVERFLOW ?
			(r->have_overflow ? r->overflow : runner_local_overflow(r)) :
			(r->have_norm ? r->sumsq : runner_local_sumsq(r));
		float x = (float)(mean ? sqrt(local) / (double)comm_size(c) : local);
		if (all_reduce_scalar(r, c, &x, op->role == ROLE_OVERFLOW ? COMM_MAX : COMM_SUM, err))
			return -1;
		if (op->role == ROLE_OVERFLOW)
			r->overflow = x != 0, r->have_overflow = 1;
		else
			r->sumsq = mean ? (double)x * x : x, r->have_norm = 1;
		return 0;
	}
	if (p->fsdp && op->group == GROUP_XNODE && op->sub == COLL_ALL_REDUCE &&
	    op->role == ROLE_GRAD_REDUCE)
		return fsdp_hybrid_all_reduce(r, op, c, err);
	if (op->buf >= 0 && r->alloc_of[op->buf]->what == BUF_COMM_CAST)
		return cast_reduce(r, op, c, err);
	if (p->stage > 0 && op->slice >= 0 && r->s->slices[op->slice].cast >= 0)
		return zero_cast_reduce(r, op, c, &r->s->slices[op->slice], err);
	if (runner_zpp_is_gather(r, op))
		return runner_zpp_gather(r, op, c, err);
	if (op->sub == COLL_ALL_TO_ALL && op->role == ROLE_GRAD_REDUCE) { /* qgZ */
		if (runner_zpp_reduce(r, op, err))
			return -1;
		if (op->group == GROUP_XNODE && !r->offload) /* offloaded, the copy to the host
								 reads the slice, then recycles */
			recycle(r, op->buf);
		return 0;
	}
	SchedCollClass k = sched_coll_class(p, op);
	Pending *q = NULL;
	if (sched_coll_overlaps(k) && r->n_pend < r->cap_pend) {
		q = &r->pend[r->n_pend];
		*q = (Pending){.op = op, .stream = k, .recycle_buf = -1};
	}
	if (op->buf >= 0 && ((r->alloc_of[op->buf]->what == BUF_REDUCE_FLAT && p->stage == 0) ||
			     op->buf == r->id_ddp))
		return flat_reduce(r, op, c, q, err);
	void *base = op->buf >= 0 ? r->buf[op->buf] : NULL;
	long long rank = comm_rank(c); /* in the op's group */
	/* a stage 2-3 bucket all-reduced (reduce_scatter off: DeepSpeed's allreduce_bucket) leaves
	 * the sum on every rank, of which this rank keeps its slice, as a reduce-scatter's; stage
	 * 1's gradients are copied into the contiguous buffer its reduction names (the buffer's
	 * last reduction done: await_for) and its slice goes back, offload or not */
	int via = stage1_via_bucket(r, op);
	int keeps_slice = op->role == ROLE_GRAD_REDUCE && (p->stage >= 2 || via);
	if (via)
		r->cb->convert(r->cx, at(base, op->offset, r->gdt), r->gdt, stage1_bucket_grads(r, op),
			       r->gdt, (size_t)op->elems);
	if (op->sub == COLL_ALL_REDUCE) {
		void *a = at(base, op->offset, r->gdt);
		if (op->role == ROLE_GRAD_REDUCE)
			runner_predivide(r, a, r->gdt, (size_t)op->elems);
		if (issue(c, op, a, a, (size_t)op->elems, r->gdt, q, err))
			return -1;
		return keeps_slice ? slice_reduced(r, op, at(a, rank * (long long)cnt, r->gdt), cnt, q) :
				     pend_push(r, q);
	}
	if (op->sub == COLL_REDUCE_SCATTER) {
		void *send = at(base, op->offset, r->gdt), *mine = at(send, rank * (long long)cnt, r->gdt);
		if (op->role == ROLE_GRAD_REDUCE)
			runner_predivide(r, send, r->gdt, (size_t)op->elems);
		if (issue(c, op, send, mine, cnt, r->gdt, q, err))
			return -1;
		/* stage 1 reduced in place keeps its slice in the full gradients */
		return keeps_slice ? slice_reduced(r, op, mine, cnt, q) : pend_push(r, q);
	}
	if (op->sub == COLL_ALL_GATHER) {
		void *recv = at(base, op->offset, r->pdt);
		/* a stage-3 gather sends this rank's slice of the partition (the schedule's slice);
		 * the others gather in place, each rank's piece already where it belongs */
		void *piece = at(recv, rank * (long long)cnt, r->pdt);
		const void *send = p->stage == 3 && op->buf != r->id_persist ?
			runner_gather_source(r, partition_offset(r, op), (long long)cnt, piece, err) :
			piece;
		return !send || issue(c, op, send, recv, cnt, r->pdt, q, err) ? -1 : pend_push(r, q);
	}
	return px_fail(err, PX_ERR_RUNTIME, "the CPU executor does not run %s", coll_name(op->sub));
}

/* ---- host copies (optimizer offload) ---- */

/* ZeRO-2 under offload with gradient accumulation (stage_1_and_2.py
 * async_accumulate_grad_in_cpu_via_gpu, then async_inplace_copy_grad_to_fp32_buffer_from_gpu):
 * micro-batch 0's reduced slice of cnt elements at partition offset off is copied into the
 * host's accumulated gradients (the parameters' dtype); each later one's is added to them on
 * the device, the host's sums coming through the device's temporary buffer a piece at a time
 * and going back; at the accumulation boundary the sums are copied into the fp32 gradients. */
static void accumulate_on_host(Runner *r, long long off, const void *mine, long long cnt)
{
	void *acc = at(r->buf[r->id_accum], off, r->pdt);
	if (r->micro == 0) {
		r->cb->convert(r->cx, acc, r->pdt, mine, r->gdt, (size_t)cnt);
	} else {
		long long room = (long long)(r->size[r->id_gpu_temp] / dt_bytes(r->pdt));
		void *tmp = r->buf[r->id_gpu_temp];
		for (long long a = 0; a < cnt; a += room) {
			size_t n = (size_t)(cnt - a < room ? cnt - a : room);
			r->cb->convert(r->cx, tmp, r->pdt, at(acc, a, r->pdt), r->pdt, n);
			add_into(r, tmp, at((void *)mine, a, r->gdt), r->gdt, n, r->pdt);
			r->cb->convert(r->cx, at(acc, a, r->pdt), r->pdt, tmp, r->pdt, n);
		}
	}
	if (r->micro == r->p->m - 1)
		to_f32(r, (float *)r->buf[r->id_grad32] + off, acc, (size_t)cnt, r->pdt);
}

/* The updated parameters' copy after the update: to the device from the host's optimizer, or to
 * the host's partition (stage-3 parameter offload) from the device's. */
static int is_params_copy(const Op *op)
{
	return op->kind == OP_COPY && op->role == ROLE_PARAM_UPDATE &&
	       (op->sub == COPY_H2D || op->sub == COPY_D2H);
}

/* ZeRO-3 under offload: a reduced slice (cnt elements at off in the partition) added to the
 * host's gradient partition as stage3.py partition_grads does, on the device: the host slice
 * copied into the schedule's device buffer (grad_buffer.to(device)), the slice added there and
 * the sum copied back. -1 when the schedule gave no such buffer of that size. */
static int stage3_accumulate_on_host(Runner *r, long long off, const void *mine, size_t cnt)
{
	void *host = at(r->buf[r->id_gradpart], off, r->gdt);
	int c = r->id_grad_copy;
	if (c < 0 || !r->buf[c] || r->size[c] < cnt * dt_bytes(r->gdt))
		return -1;
	r->cb->convert(r->cx, r->buf[c], r->gdt, host, r->gdt, cnt);
	add_into(r, r->buf[c], mine, r->gdt, cnt, r->gdt);
	r->cb->convert(r->cx, host, r->gdt, r->buf[c], r->gdt, cnt);
	return 0;
}

/* The schedule's copies under optimizer offload. Host and device are both this process's memory
 * here, so a copy is the data movement (and conversion) it stands for, between buffers the arena
 * counts in their places:
 * - device to host, naming a reduction (stage 2-3): this rank's reduced slice, added into the
 *   host's gradient partition (accumulating over micro-batches, as DeepSpeed does): stage 2's
 *   fp32 one (or accumulated_grads_in_cpu), stage 3's in the accumulation dtype
 *   (grad_partitions_flat_buffer, through the device's copy), which the update turns into fp32;
 * - device to host after the reductions (stage 1): this rank's slices of the full gradients,
 *   converted to fp32;
 * - after the optimizer (is_params_copy): the updated master weights, rounded into the
 *   parameters (unless the step was skipped);
 * - host to device of a unit (stage 3 parameter offload): the partition's slice, which the
 *   all-gather after it reads from the host partition directly. */
static int copy(Runner *r, const Op *op, PxError *err)
{
	const Plan *p = r->p;
	if (op->sub == COPY_NVME_READ || op->sub == COPY_NVME_WRITE)
		return runner_nvme_copy(r, op, err);
	if (op->sub == COPY_D2H && p->fsdp && op->unit >= 0 && r->u_shard[op->unit] >= 0) {
		/* FSDP's CPUOffload: the unit's device shard into its slice of the host's pinned
		 * gradients (_cpu_grad.copy_) */
		const UnitPlan *up = &p->units[op->unit];
		r->cb->convert(r->cx, (float *)r->buf[r->id_grad32] + up->part_off, DT_FP32,
			       r->buf[r->u_shard[op->unit]], DT_FP32, (size_t)up->part_dense);
		return 0;
	}
	if (op->sub == COPY_D2H && op->buf >= 0 && r->offload) {
		/* an MoE block's expert gradients were reduced over its expert-data-parallel group */
		int experts = r->alloc_of[op->buf]->what == BUF_EXPERT_GRADS;
		long long n = experts ? r->n_edp : r->n, rank = experts ? r->edp_rank : r->rank;
		size_t cnt = (size_t)(op->elems / n);
		const void *mine = at(r->buf[op->buf], op->offset + rank * (long long)cnt, r->gdt);
		if (p->stage == 3) { /* the host's partition in the accumulation dtype */
			if (stage3_accumulate_on_host(r, partition_offset(r, op), mine, cnt))
				return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a reduced slice "
					       "of %zu elements to the host at ZeRO-3 without a live "
					       "%s buffer that holds it", (int)(op - r->s->ops), cnt,
					       buf_name(BUF_OFFLOAD_GRAD_COPY));
		} else if (r->id_accum >= 0)
			accumulate_on_host(r, partition_offset(r, op), mine, (long long)cnt);
		else
			add_into(r, (float *)r->buf[r->id_grad32] + partition_offset(r, op), mine,
				 r->gdt, cnt, DT_FP32);
		recycle(r, op->buf);
		return 0;
	}
	if (op->sub == COPY_D2H && op->unit < 0 && p->stage == 1 && r->offload) {
		for (int i = 0; i < r->n_segs; i++) /* this rank's slices of the full gradients */
			to_f32(r, r->segs[i].grads, r->segs[i].dev_grads, (size_t)r->segs[i].n, r->gdt);
		return 0;
	}
	if (is_params_copy(op)) {
		/* the op's range (a stage-3 sub-group's), from its master weights: whole in memory,
		 * or in the NVMe swap buffer's slot from the range's start */
		long long lo, hi, a, b;
		runner_op_range(r, op, &lo, &hi);
		for (int i = 0; p->master_bytes && r->opt_updates && i < r->n_segs; i++) {
			const Seg *sg = &r->segs[i];
			if (runner_seg_piece(sg, lo, hi, &a, &b))
				from_f32(r, at(sg->params, a - sg->part_off, r->pdt),
					 runner_master_at(r, a, lo), (size_t)(b - a), r->pdt);
		}
		return 0;
	}
	if (op->sub == COPY_H2D && op->unit >= 0 && p->param_place != PLACE_GPU) /* host or its flat */
		return 0;
	/* cpu_checkpointing: the block's input lives in its host checkpoint buffer, where the
	 * forward wrote it and the recompute reads it */
	if (op->unit >= 0 && p->ckpt_place == PLACE_CPU &&
	    (op->role == ROLE_FORWARD || op->role == ROLE_RECOMPUTE))
		return 0;
	return px_fail(err, PX_ERR_RUNTIME, "the CPU executor does not run a %s copy of %.0f bytes "
		       "here", copy_name(op->sub), op->bytes);
}

/* ---- the interpreter ---- */

static void load_micro_batch(Runner *r, const DataSource *data, long step, int mb)
{
	const DsConfig *ds = &r->p->sc->ds;
	for (int i = 0; i < r->B; i++) {
		uint64_t id = (uint64_t)(step - 1) * (uint64_t)ds->train_batch +
			      ((uint64_t)mb * (uint64_t)r->n + (uint64_t)r->rank) * (uint64_t)r->B + (uint64_t)i;
		data_sample(data, id, r->T, r->sample);
		for (int t = 0; t < r->T; t++) {
			r->inputs[i * r->T + t] = r->sample[t];
			r->targets[i * r->T + t] = r->sample[t + 1];
		}
	}
	r->cb->set_tokens(r->cx, r->inputs, r->targets);
	r->tokens_mb = mb;
}

/* Which time counter an op adds to: a compute kind, then a collective kind. */
static int time_slot(const Op *op)
{
	if (op->kind == OP_COMPUTE)
		return op->sub;
	if (op->kind == OP_COLL)
		return N_COMPS + op->sub;
	if (op->kind == OP_COPY)
		return N_COMPS + N_COLLS + op->sub;
	return -1;
}

/* ---- streams: started collectives and the waits the schedule implies ----
 * docs/gpu_comm.md. A collective that engine/streams.h puts on the prefetch or reduction stream
 * is started at its op and appended here; each stream completes in start order (as a device
 * stream would). The waits: a compute waits for the gathers of its unit's buffer; a backward
 * for the bucket it is about to zero and the gradients it adds into; a free, a blocking
 * collective or a copy for the collectives on the buffer it names (a unit-less device-to-host
 * copy for the whole reduction stream); the one-value all-reduces, the optimizer and the step's
 * end for everything. */

/* Complete q: the call, then what its completion allows. Its time is the collective's. */
static int finish_pending(Runner *r, Pending *q, PxError *err)
{
	double t0 = px_now_s();
	int rc = comm_wait(q->req, err);
	q->req = NULL;
	if (!rc && q->mine)
		consume(r, q->op, q->mine, q->cnt);
	if (!rc && q->recycle_buf >= 0)
		recycle(r, q->recycle_buf);
	if (!rc && q->back_to)
		r->cb->convert(r->cx, q->back_to, r->gdt, q->back_from, r->gdt, q->back_n);
	double dt = px_now_s() - t0;
	r->op_s[N_COMPS + q->op->sub] += dt;
	r->wait_s += dt;
	return rc;
}

/* Complete pend[k] and everything started before it on its stream; keep the rest in order. A
 * pipeline send is a stream of its own: it completes when its receive matches it, whatever the
 * sends started before it to another stage. */
static int wait_upto(Runner *r, int k, PxError *err)
{
	int stream = r->pend[k].stream, rc = 0, n = 0;
	for (int i = 0; i <= k && !rc; i++)
		if (r->pend[i].stream == stream && (stream != SCC_SEND || i == k))
			rc = finish_pending(r, &r->pend[i], err);
	for (int i = 0; i < r->n_pend; i++)
		if (r->pend[i].req)
			r->pend[n++] = r->pend[i];
	r->n_pend = n;
	return rc;
}

/* Until no started collective works on buffer id (-1: none). */
static int wait_buf(Runner *r, int id, PxError *err)
{
	for (int k = r->n_pend - 1; id >= 0 && k >= 0; k--)
		if (r->pend[k].op->buf == id)
			return wait_upto(r, k, err);
	return 0;
}

static int wait_stream(Runner *r, int stream, PxError *err)
{
	for (int k = r->n_pend - 1; k >= 0; k--)
		if (r->pend[k].stream == stream)
			return wait_upto(r, k, err);
	return 0;
}

static int wait_all(Runner *r, PxError *err)
{
	int rc = 0;
	for (int i = 0; i < r->n_pend && !rc; i++)
		rc = finish_pending(r, &r->pend[i], err);
	r->n_pend = rc ? r->n_pend : 0;
	return rc;
}

/* What op must wait for before it runs. */
static int await_for(Runner *r, const Op *op, PxError *err)
{
	if (!r->n_pend)
		return 0;
	switch (op->kind) {
	case OP_COMPUTE:
		if (op->sub == COMP_OPTIMIZER)
			return wait_all(r, err);
		if (op->unit >= 0 && wait_buf(r, r->u_gathered[op->unit], err))
			return -1;
		if (op->sub != COMP_BWD)
			return 0;
		if (op->buf >= 0 && r->zero_first[op->buf] && wait_buf(r, op->buf, err))
			return -1; /* the buffer it is about to zero */
		return wait_buf(r, r->id_pgrads, err) || wait_buf(r, r->id_grads, err) ? -1 : 0;
	case OP_COLL: {
		SchedCollClass k = sched_coll_class(r->p, op);
		if (k == SCC_BARRIER)
			return wait_all(r, err);
		if (stage1_via_bucket(r, op)) /* the buffer it is about to copy into */
			return wait_buf(r, op->buf, err);
		return sched_coll_overlaps(k) ? 0 : wait_buf(r, op->buf, err);
	}
	case OP_COPY:
		if (op->sub == COPY_NVME_READ || op->sub == COPY_NVME_WRITE)
			return wait_all(r, err); /* the optimizer's: every reduction is in */
		if (op->buf >= 0)
			return wait_buf(r, op->buf, err);
		return op->sub == COPY_D2H ? wait_stream(r, SCC_REDUCE, err) : 0;
	case OP_FREE:
		return wait_buf(r, op->buf, err);
	case OP_ALLOC: /* the step's flat copies read every reduced gradient */
		if (op->what == BUF_GRAD_FLAT || (op->what == BUF_GRAD_FP32 && r->p->flattens_grads))
			return wait_all(r, err);
		return 0;
	default:
		return 0;
	}
}

/* A device's waits queued on the compute stream, seen through under the deadline before the
 * host synchronises that stream (comm_sync). */
static int sync_streams(Runner *r, PxError *err)
{
	Comm *c = r->dp ? r->dp : r->pp_act;
	return c ? comm_sync(c, err) : 0;
}

static int run_op_timed(Runner *r, int i, PxError *err);

/* Started collectives in flight (pipeline sends are not collectives on a stream). */
static int pending_colls(const Runner *r)
{
	int n = 0;
	for (int i = 0; i < r->n_pend; i++)
		n += r->pend[i].stream != SCC_SEND;
	return n;
}

static int run_op(Runner *r, int i, PxError *err)
{
	int slot = time_slot(&r->s->ops[i]);
	if (slot < 0)
		return run_op_timed(r, i, err);
	double t0 = px_now_s(), w0 = r->wait_s, p0 = r->tp_s;
	/* check waits for an asynchronous backend, so that the op's time is its own; waits for
	 * started collectives inside it are theirs (finish_pending), and so are the tensor-parallel
	 * collectives inside its kernels (runner_tp.c) */
	int rc = run_op_timed(r, i, err) || sync_streams(r, err) || r->cb->check(r->cx, err) ? -1 : 0;
	r->op_s[slot] += px_now_s() - t0 - (r->wait_s - w0) - (r->tp_s - p0);
	return rc;
}

static int run_op_timed(Runner *r, int i, PxError *err)
{
	const Op *op = &r->s->ops[i];
	if (r->fail_in_flight && pending_colls(r) > 0) /* tests only: an error mid-collective */
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: failed by the test hook "
			       "PARALLAX_TEST_FAIL_IN_FLIGHT with %d collectives in flight", i,
			       pending_colls(r));
	if (await_for(r, op, err))
		return -1;
	switch (op->kind) {
	case OP_ALLOC:
		return do_alloc(r, op, err);
	case OP_FREE:
		if (op->buf == r->id_tied)
			r->id_tied = -1;
		do_free(r, op->buf);
		return 0;
	case OP_COMPUTE:
		r->ov.computes++;
		r->ov.computes_overlapped += pending_colls(r) > 0;
		/* pipelined, the ends read the tokens of the op's own micro-batch (without, the
		 * repeat block loads each in turn: runner_step) */
		if (r->slots > 1 && (op->unit == 0 || op->unit == r->head) && op->mb != r->tokens_mb)
			load_micro_batch(r, r->data, r->step, op->mb);
		runner_pipe_take(r, op);
		runner_tp_begin(r, i);
		if (op->sub == COMP_FWD)
			forward(r, op);
		else if (op->sub == COMP_RECOMPUTE)
			recompute(r, op);
		else if (op->sub == COMP_BWD)
			backward(r, op);
		else if (op->sub == COMP_GRAD_ACCUM && r->p->fsdp)
			fsdp_accumulate(r, op);
		else if (op->sub == COMP_GRAD_ACCUM)
			accumulate_hp(r, op);
		return runner_tp_end(r, i, err);
	case OP_COLL:
		return collective(r, op, err);
	case OP_COPY:
		return copy(r, op, err);
	default:
		return 0;
	}
}

int runner_step(Runner *r, long step, const DataSource *data, StepResult *res, PxError *err)
{
	memset(res, 0, sizeof(*res));
	r->loss_sum = 0;
	r->data = data, r->step = step, r->tokens_mb = -1, r->micro = 0;
	r->have_overflow = r->have_norm = r->have_factor = r->opt_done = 0;
	r->opt_begun = r->opt_updates = 0;
	if (runner_onebit_begin_step(r, err))
		return -1;
	const Schedule *s = r->s;
	res->onebit_step = r->onebit ? r->step_kind : ONEBIT_FULL;
	SchedWalk w; /* the micro-batches are the repeat blocks' iterations, block after block */
	int i;
	sched_walk_init(&w, s, s->step_begin);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP && op->count > 0) {
			load_micro_batch(r, data, step, r->micro);
		} else if (op->kind == OP_END_LOOP) {
			r->micro++;
			if (w.iter + 1 < w.count)
				load_micro_batch(r, data, step, r->micro);
		} else if (op->kind == OP_COMPUTE && op->sub == COMP_OPTIMIZER) {
			/* DeepSpeed synchronises every stream before the step */
			if (wait_all(r, err) || sync_streams(r, err))
				return -1;
			double t0 = px_now_s();
			long long lo, hi; /* a stage-3 sub-group, or the partition */
			runner_op_range(r, op, &lo, &hi);
			runner_optimize(r, res, lo, hi);
			r->op_s[COMP_OPTIMIZER] += px_now_s() - t0;
			r->opt_done = 1;
		} else if (run_op(r, i, err)) {
			return -1;
		}
	}
	if (i == SCHED_WALK_ERROR)
		return -1;
	if (wait_all(r, err) || sync_streams(r, err) || r->cb->check(r->cx, err))
		return -1;
	/* the mean over the data-parallel ranks of the last stage, which computed the losses (0
	 * elsewhere; every rank of a tensor-parallel group the same), outside the schedule */
	float lf = (float)(r->loss_sum / (double)r->p->m);
	if (r->world && comm_size(r->world) > 1) {
		if (all_reduce_scalar(r, r->world, &lf, COMM_SUM, err))
			return -1;
		lf /= (float)(r->p->dp * r->p->par.tp);
	}
	res->loss = lf;
	return 0;
}

/* ---- set-up ---- */

/* Unit u's parameters from seed: the whole unit's, or this tensor-parallel rank's shard of the
 * same values. */
static void init_unit(Runner *r, int u, float *dst, uint64_t seed)
{
	if (is_moe_unit(r, u))
		moe_cpu_init_unit(&r->cfg, &r->moe, u, dst, seed);
	else if (r->gtp.t > 1)
		gpt_tp_init_unit(&r->cfg, r->gtp.t, r->gtp.r, u, dst, seed);
	else
		gpt_cpu_init_unit(&r->cfg, u, dst, seed);
}

/* Every unit's parameters from the seed (each tensor its own stream), into this rank's storage:
 * whole (stage 0-2) or its partition and the persistent tensors (stage 3). Then the fp32 master
 * weights from the 16-bit values, as DeepSpeed builds them. */
static int init_params(Runner *r, uint64_t seed, PxError *err)
{
	const Plan *p = r->p;
	size_t largest = 0;
	for (int u = 0; u < p->n_units; u++) {
		if (gpt_cpu_unit_params(&r->cfg, u) > largest) /* a shard is no larger */
			largest = gpt_cpu_unit_params(&r->cfg, u);
		if (unit_params(r, u) > largest) /* an MoE block's local experts may be */
			largest = unit_params(r, u);
	}
	/* initialisation scratch, freed before the first step; the arena's peaks are reset after */
	float *tmp = arena_alloc(&r->arena, PLACE_CPU, CAT_OVERHEAD, 4 * largest);
	void *own = arena_alloc(&r->arena, PLACE_CPU, CAT_OVERHEAD, 4 * largest + 4 * (size_t)r->n);
	if (!tmp || !own)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory initialising the model");
	for (int u = 0; u < p->n_units; u++) {
		size_t n = unit_params(r, u);
		if (p->units[u].stage != r->stage) /* another pipeline stage's */
			continue;
		/* the host rewrites tmp and own: the last unit's conversions must be done with them */
		if (r->cb->check(r->cx, err))
			return -1;
		init_unit(r, u, tmp, seed);
		if (p->stage < 3) {
			size_t dense = unit_dense(r, u);
			from_f32(r, at(r->buf[r->id_params], p->units[u].flat_off, r->pdt), tmp, dense,
				 r->pdt);
			if (dense < n) /* an MoE block's experts */
				from_f32(r, at(r->buf[r->id_params], r->expert_off[u], r->pdt),
					 tmp + dense, n - dense, r->pdt);
			if (u != r->head || r->replica_hi <= r->replica_lo)
				continue;
			/* the last stage's copy of the token embedding starts as the first's (unit 0's
			 * first tensor, from the same seed); their summed gradients keep them equal */
			if (r->cb->check(r->cx, err))
				return -1;
			init_unit(r, 0, tmp, seed);
			from_f32(r, at(r->buf[r->id_params], r->replica_lo, r->pdt), tmp,
				 (size_t)(r->replica_hi - r->replica_lo), r->pdt);
			continue;
		}
		const UnitPlan *up = &p->units[u];
		long long o = 0, q = r->persist_off[u], d = 0;
		memset(own, 0, 4 * largest + 4 * (size_t)r->n);
		for (int i = 0; i < up->n_tensors; i++) {
			long long k = up->tensor_local[i];
			if (is_persistent(r, k))
				from_f32(r, at(r->buf[r->id_persist], q, r->pdt), tmp + d, (size_t)k, r->pdt), q += k;
			else
				from_f32(r, at(own, o, r->sdt), tmp + d, (size_t)k, r->sdt), o += k;
			d += k;
		}
		/* this rank's slice: by its data-parallel rank, or under HYBRID_SHARD its rank in
		 * the node (consecutive data-parallel ranks: exec/runner_zpp.c) */
		long long sr = p->shard_group == GROUP_NODE ? r->rank % p->shards : r->rank;
		if (runner_nvme_params_io(r, 1, up->part_off, at(own, sr * up->part_dense, r->sdt),
					  up->part_dense, err))
			return -1;
	}
	arena_free(&r->arena, PLACE_CPU, CAT_OVERHEAD, tmp, 4 * largest);
	arena_free(&r->arena, PLACE_CPU, CAT_OVERHEAD, own, 4 * largest + 4 * (size_t)r->n);
	runner_make_segments(r);
	/* on NVMe the master weights go to their file a slot at a time (runner_nvme_sync) */
	for (int i = 0; p->master_bytes && !r->nv_grads && i < r->n_segs; i++) {
		const Seg *sg = &r->segs[i];
		if (runner_nvme_params_f32(r, sg, sg->part_off, sg->part_off + sg->n,
					   (float *)r->buf[r->id_master] + sg->part_off, err))
			return -1;
	}
	arena_reset_peaks(&r->arena);
	return r->cb->check(r->cx, err);
}

/* Every partitioned reduction and gather the runner places by the schedule's slice states one
 * (stage 2-3 reductions, the copies of their slices, stage 3's gathers). */
/* deepspeed.sparse_attention: the layout's kept blocks (engine/sparse_layout.c, DeepSpeed's
 * layouts), the blocks' attention from then on; a tensor-parallel rank's those of its heads,
 * which must keep their share of the blocks (the prediction prices each rank the mean head's:
 * a layout that spreads them unevenly, as per-head random blocks can, is refused). */
static int sparse_setup(Runner *r, PxError *err)
{
	const SparseAttn *sa = &r->p->sc->ds.sparse;
	if (sa->mode == SPARSE_OFF)
		return 0;
	long long nb = sparse_layout_blocks(sa, r->T);
	int t = r->gtp.t > 1 ? r->gtp.t : 1, heads = r->cfg.NH / t;
	int first = t > 1 ? r->gtp.r * heads : 0;
	unsigned char *layout = sparse_layout_create(sa, r->cfg.NH, nb);
	/* the rank's heads: runner_supported (sparse_uneven) has refused a layout whose ranks
	 * would keep unequal shares */
	int rc = layout ? sparse_index_build(&r->ix, layout + (size_t)first * nb * nb, heads,
					     (int)nb, (int)sa->block) : -1;
	free(layout);
	if (rc)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory for the sparse attention layout");
	r->sparse = 1;
	r->cb->set_sparse(r->cx, &r->ix);
	return 0;
}

static int needs_slices(const Plan *p, const Schedule *s, PxError *err)
{
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		int partitioned = (op->kind == OP_COLL && p->stage >= 2 &&
				   (op->role == ROLE_GRAD_REDUCE || op->role == ROLE_PREFETCH)) ||
				  (op->kind == OP_COPY && op->buf >= 0);
		/* qgZ's all-to-all inside the node leaves no slice: the one across nodes does */
		if (partitioned && op->slice < 0 && op->group != GROUP_NODE)
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d (%s, %s) states no "
				       "partition slice; the executor places its data by one", i,
				       op_kind_name(op->kind), role_name(op->role));
	}
	return 0;
}

static int layout(Runner *r)
{
	const Plan *p = r->p;
	int n = p->n_units;
	long long persist = 0;
	r->persist_off = calloc((size_t)n, sizeof(long long));
	r->zero_first = calloc((size_t)r->s->n_bufs + 1, 1);
	if (!r->persist_off || !r->zero_first)
		return -1;
	for (int u = 0; u < n; u++) { /* the persistent buffer: units' tensors in order */
		r->persist_off[u] = persist;
		persist += p->units[u].persist_elems;
	}
	r->persist_cnt = (persist + r->n - 1) / r->n;
	return 0;
}

static void gpu_peak(void *ctx, Place place)
{
	Runner *r = ctx;
	if (place == PLACE_GPU) {
		r->cb->check(r->cx, NULL); /* what was queued has taken its memory */
		r->rt.on_gpu_peak(r->rt.peak_ctx);
	}
}

ComputeShape runner_shape(const Plan *p, int device)
{
	const ModelSpec *m = &p->sc->model;
	GptConfig cfg = {(int)m->V, (int)m->max_pos, (int)m->h, (int)m->L, (int)m->a};
	return (ComputeShape){cfg, (int)p->sc->ds.micro_batch, (int)p->sc->seq, device,
			      p->sc->ds.dtype, p->sc->alloc_conf};
}

int runner_create(const Plan *p, Schedule *s, const RunnerComms *comms, uint64_t seed,
		  const ComputeBackend *cb, void *cx, const RunnerRuntime *rt, Runner **out,
		  PxError *err)
{
	const ModelSpec *m = &p->sc->model;
	Runner *r = calloc(1, sizeof(*r));
	int n = p->n_units;
	if (!r)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	*out = r;
	if (sched_validate(s, err) || needs_slices(p, s, err)) /* every field, the buffers followed */
		return -1;
	/* torch's foreach update writes its denominators into the step's temporary */
	if (p->opt_impl == OPT_IMPL_FOREACH &&
	    runner_check_step_temp(s, 0, "torch's foreach update", "copy of the second moment", err))
		return -1;
	Comm *dp = comms ? comms->dp : NULL;
	r->p = p, r->s = r->s_warm = s, r->dp = dp, r->world = comms ? comms->world : NULL;
	r->fail_in_flight = getenv("PARALLAX_TEST_FAIL_IN_FLIGHT") != NULL; /* tests only */
	r->onebit = p->sc->ds.opt && p->sc->ds.opt->error_feedback != EF_NONE;
	r->zero_one = optim_zero_one(p->sc->ds.opt);
	r->lamb = r->onebit && p->sc->ds.opt->error_feedback == EF_FLAT;
	if (comms)
		r->pp_act = comms->pp_act, r->pp_grad = comms->pp_grad, r->tied = comms->tied,
		r->tp = comms->tp, r->hpz = comms->hpz, r->node = comms->node, r->xnode = comms->xnode,
		r->ep = comms->ep, r->edp = comms->edp;
	r->stage = s->rank, r->n_stages = (int)p->par.pp, r->st = &p->stages[r->stage];
	r->slots = p->par.pp > 1 ? (int)p->m : 1;
	r->rank = dp ? comm_rank(dp) : 0;
	r->n = (int)p->dp;
	r->cfg = (GptConfig){(int)m->V, (int)m->max_pos, (int)m->h, (int)m->L, (int)m->a};
	r->B = (int)p->sc->ds.micro_batch, r->T = (int)p->sc->seq, r->head = n - 1;
	r->pdt = p->sc->ds.dtype, r->gdt = p->sc->ds.grad_dtype, r->sdt = r->pdt;
	if (p->fsdp) { /* MixedPrecision's param and reduce dtype over fp32 shards */
		const DsConfig *ds = &p->sc->ds;
		r->pdt = r->gdt = ds->autocast != DT_FP32 ? ds->autocast : ds->dtype;
		r->sdt = DT_FP32;
	}
	r->offload = p->opt_place != PLACE_GPU;
	for (int i = s->step_begin; i < s->n; i++)
		r->params_by_copy |= is_params_copy(&s->ops[i]);
	r->loss_scale = p->sc->ds.dtype == DT_FP16 ?
		(p->sc->ds.loss_scale > 0 ? p->sc->ds.loss_scale :
					    ldexp(1.0, (int)p->sc->ds.initial_scale_power)) : 1.0;
	r->hysteresis = (int)p->sc->ds.hysteresis;
	if (gpt_cpu_check(&r->cfg, r->B, r->T, err))
		return -1;
	r->cb = cb ? cb : &compute_cpu_backend;
	r->cx = cx;
	/* DeepSpeed's ZeRO 1-3 divide before they sum, so that 16-bit sums do not overflow:
	 * stage_1_and_2.py average_tensor (contiguous gradients, reduce_scatter on) and
	 * allreduce_bucket (without contiguous gradients), stage 3's reduce_scatter_coalesced
	 * ("pre-divide") and __avg_scatter_contiguous_grads; the engine's stage-0 all-reduce and
	 * stage 1-2's with reduce_scatter off (gradient_reduction_w_predivide, postscale) sum, then
	 * divide. qgZ's quantized reduction is left summing here. */
	const DsZero *z = &p->sc->ds.zero;
	r->predivide = r->cb->scale && !p->qgz && p->dp > 1 &&
		       (p->stage == 3 ||
			(p->stage >= 1 && !(p->contiguous_grads && !z->reduce_scatter)));
	if (!cb) {
		ComputeShape shape = runner_shape(p, 0);
		if (r->cb->create(&shape, &r->cx, err))
			return -1;
		r->own_cx = 1;
	}
	if (runner_tp_setup(r, err) || sparse_setup(r, err) || runner_moe_setup(r, err))
		return -1;
	if (r->n_stages > 1 && r->stage == r->n_stages - 1 && model_tied_elems(m)) {
		/* DeepSpeed leaves a tied parameter's copies other than the first stage's out of
		 * the gradient norm (ds_pipe_replicated) */
		r->replica_lo = tied_off(r);
		r->replica_hi = r->replica_lo + (long long)tied_elems(r);
	}
	r->own_flat = p->stage < 3 ? own_flat_elems(r) : -1;
	if (r->own_flat >= 0 && r->own_flat < r->st->flat_dense) /* placed by the plan's offsets */
		return px_fail(err, PX_ERR_RUNTIME, "the plan lays out a flat of %lld parameters on "
			       "this rank; the kernels count %lld: the simulator's parameter count "
			       "disagrees with the executor's", r->st->flat_dense, r->own_flat);
	arena_init(&r->arena, r->cb->alloc, r->cb->release, r->cx);
	r->arena.alloc_empty = r->cb->alloc_empty;
	r->arena.held = r->cb->held; /* the measured peak: the backend's allocator's */
	r->arena.settle = r->cb->settle;
	r->arena.held_caching = r->cb->caching && r->cb->caching(r->cx);
	if (rt) {
		r->rt = *rt;
		r->arena.on_peak = rt->on_gpu_peak ? gpu_peak : NULL;
		r->arena.peak_ctx = r;
	}
	r->scalar = r->cb->alloc(r->cx, PLACE_GPU, sizeof(float));
	if (!r->scalar)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	r->buf = calloc((size_t)s->n_bufs + 1, sizeof(void *));
	r->size = calloc((size_t)s->n_bufs + 1, sizeof(size_t));
	r->alloc_of = calloc((size_t)s->n_bufs + 1, sizeof(Op *));
	r->cap_bufs = s->n_bufs;
	size_t n_ids = (size_t)n * (8 + 2 * (size_t)r->slots);
	int *ids = malloc(n_ids * sizeof(int));
	r->inputs = malloc((size_t)r->B * r->T * sizeof(int));
	r->targets = malloc((size_t)r->B * r->T * sizeof(int));
	r->sample = malloc((size_t)(r->T + 1) * sizeof(int));
	/* buckets, MoE blocks, the host flat's end (runner_nvme_split_segments) */
	r->segs = calloc(2 * (size_t)n + 8, sizeof(Seg));
	for (int i = s->step_begin; i < s->n; i++) /* at most every collective of a step in flight */
		r->cap_pend += s->ops[i].kind == OP_COLL;
	r->pend = calloc((size_t)r->cap_pend + 1, sizeof(Pending));
	if (dp && r->cb->stream) /* started collectives order against the compute stream */
		comm_set_stream(dp, r->cb->stream(r->cx));
	if (!r->pend || !r->buf || !r->size || !r->alloc_of || !ids || !r->inputs || !r->targets ||
	    !r->sample || !r->segs || layout(r)) {
		free(ids);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	for (size_t i = 0; i < n_ids; i++)
		ids[i] = -1;
	if (runner_norm_ranges(r)) /* after layout(): stage 3's persistent offsets */
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	r->u_fp32 = ids, r->u_fp32g = ids + n, r->u_gathered = ids + 2 * n, r->u_loaded = ids + 3 * n;
	r->u_grads = ids + 4 * n, r->u_shard = ids + 5 * n, r->u_flat = ids + 6 * n;
	r->u_reduced = ids + 7 * n;
	r->u_act = ids + 8 * n, r->u_ckpt = r->u_act + (size_t)n * r->slots;
	r->tokens_mb = -1;
	r->id_params = r->id_grads = r->id_part = r->id_persist = r->id_pgrads = -1;
	r->id_gradpart = r->id_master = r->id_states = r->id_grad32 = r->id_errors = -1;
	r->id_accum = r->id_gpu_temp = r->id_grad_copy = -1;
	r->id_flat = -1;
	r->id_step_temp = -1;
	if (r->lamb && runner_lamb_create(r, err))
		return -1;
	r->id_hidden = r->id_scratch = r->id_tied = r->id_scores = r->id_secondary = -1;
	r->id_lp = r->id_upcast = r->id_ddp = -1;
	r->id_egrads = r->id_gradswap = -1;
	r->sw_master = r->sw_states = r->sw_grads = r->sw_params = r->id_pswap = -1;
	r->resident = p->param_place == PLACE_NVME ? r->st->param_resident : r->st->part_elems;
	if (runner_zpp_create(r, err))
		return -1;
	SchedWalk w; /* the set-up: straight ops (sched_validate has checked them) */
	sched_walk_init(&w, s, 0);
	for (int i; w.i < s->step_begin && (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w))
		if (run_op(r, i, err))
			return -1;
	if (w.i < s->step_begin)
		return -1;
	return init_params(r, seed, err) || runner_nvme_sync(r, err) ? -1 : 0;
}

void runner_destroy(Runner *r)
{
	if (!r)
		return;
	for (int i = 0; r->buf && i < r->cap_bufs; i++)
		if (r->buf[i])
			do_free(r, i);
	free(r->u_fp32);
	free(r->buf);
	free(r->size);
	free(r->alloc_of);
	free(r->inputs);
	free(r->targets);
	free(r->sample);
	free(r->segs);
	free(r->norm_skip);
	runner_lamb_free(r);
	free(r->rep);
	free(r->pend);
	free(r->zero_first);
	free(r->persist_off);
	runner_zpp_destroy(r);
	swap_close(&r->swap);
	swap_close(&r->pswap);
	if (r->sparse)
		r->cb->set_sparse(r->cx, NULL);
	sparse_index_free(&r->ix);
	free(r->expert_off);
	if (r->scalar)
		r->cb->release(r->cx, PLACE_GPU, r->scalar);
	if (r->own_cx)
		r->cb->destroy(r->cx);
	free(r);
}

void runner_abandon(Runner *r)
{
	if (!r)
		return;
	swap_close(&r->swap); /* read and written by blocking calls: no request holds them */
	swap_close(&r->pswap);
}

const Arena *runner_arena(const Runner *r)
{
	return &r->arena;
}

const double *runner_op_times(const Runner *r)
{
	return r->op_s;
}

const RunnerOverlap *runner_overlap(const Runner *r)
{
	return &r->ov;
}
