#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp_wrap.h"
#include "optim.h"
#include "pipeline.h"

static long long ceil_div(long long a, long long b)
{
	return (a + b - 1) / b;
}

IdealStates plan_ideal_states(double psi, long long nd, int stage, int p_bytes, int g_bytes,
			      int k_bytes)
{
	IdealStates s;
	double n = (double)nd;
	s.params_bytes = p_bytes * psi / (stage >= 3 ? n : 1);
	s.grads_bytes = g_bytes * psi / (stage >= 2 ? n : 1);
	s.optimizer_bytes = k_bytes * psi / (stage >= 1 ? n : 1);
	s.total_bytes = s.params_bytes + s.grads_bytes + s.optimizer_bytes;
	return s;
}

const char *plan_optimizer_wrapper(const Plan *p)
{
	if (p->sc->framework == FRAMEWORK_PYTORCH)
		return "none";
	if (p->bf16_optimizer)
		return "BF16_Optimizer";
	if (p->zero_optimizer)
		return p->stage == 3 ? "DeepSpeedZeroOptimizer_Stage3" : "DeepSpeedZeroOptimizer";
	return p->sc->ds.dtype == DT_FP16 ? "FP16_Optimizer" : "none";
}

IdealStates plan_stage_ideal(const Plan *p, int stage)
{
	const StagePlan *st = &p->stages[stage];
	int k = (p->mixed ? 4 : 0) + p->state_bytes; /* the paper's K: mixed precision's master */
	/* FSDP's states are its fp32 shards, their fp32 gradients and the optimizer's (16 bytes a
	 * parameter under Adam, as the paper's mixed-precision K = 12 plus 2 + 2) */
	int pb = p->fsdp ? p->shard_bytes : p->param_bytes, gb = p->fsdp ? p->shard_bytes :
								 p->grad_bytes;
	if (p->fsdp)
		k = p->state_bytes;
	IdealStates d = plan_ideal_states((double)st->local_dense, p->shards, p->stage, pb, gb, k);
	IdealStates e = plan_ideal_states((double)st->local_expert, p->edp, p->stage, pb, gb, k);
	return (IdealStates){d.params_bytes + e.params_bytes, d.grads_bytes + e.grads_bytes,
			     d.optimizer_bytes + e.optimizer_bytes, d.total_bytes + e.total_bytes};
}

void plan_gather_slices(const Plan *p, int u, long long off[2], long long len[2])
{
	const UnitPlan *up = &p->units[u];
	off[0] = up->part_off, len[0] = up->part_dense + up->part_expert;
	off[1] = p->units[0].part_off, len[1] = (up->gather_dense - up->own_gather) / p->dp;
}

/* The expected largest of n counts, each the number of S tokens choosing a given expert when
 * each token chooses k of E experts uniformly: binomial (S, k / E), taken as normal with a
 * continuity correction and the counts as independent (those of one rank sum to k S, which
 * makes the largest a little smaller). E[max] = sum over x >= 1 of P(max >= x), and
 * P(max >= x) = 1 - P(count <= x - 1)^n, 1 below 12 standard deviations under the mean. */
static double expected_busiest(double S, double E, double k, double n)
{
	double p = k / E, mu = S * p, sd = sqrt(S * p * (1 - p));
	if (sd <= 0)
		return mu;
	double lo = floor(fmax(0, mu - 12 * sd)), sum = lo;
	for (double x = lo + 1; x <= ceil(mu + 12 * sd) + 1; x++)
		sum += 1 - pow(0.5 * erfc(-(x - 0.5 - mu) / (sd * M_SQRT2)), n);
	return sum;
}

/* ---- refusals ---- */

static int check_degrees(const Plan *p, PxError *err)
{
	const ParallelSpec *q = &p->par;
	const ModelSpec *m = &p->sc->model;
	const char *src = p->sc->path;

	if (p->world % (q->tp * q->pp))
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism: the world of %lld GPUs does not "
			       "divide into tp %lld x pp %lld", src, p->world, q->tp, q->pp);
	if (model_known(m) && !q->tp_uneven_heads && (m->a % q->tp || m->kv_heads % q->tp))
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.tp = %lld does not divide the %lld "
			       "attention heads and %lld key/value heads", src, q->tp, m->a,
			       m->kv_heads);
	if (!model_known(m) && (q->tp > 1 || q->pp > 1))
		return px_fail(err, PX_ERR_INPUT, "%s: tensor and pipeline parallelism need a model "
			       "architecture; the model gives only num_parameters", src);
	if (m->lay.L_enc && (q->pp > 1 || (q->tp > 1 && q->sequence_parallel)))
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism: pp %lld%s: pipeline and "
			       "sequence parallelism of an encoder-decoder (%s) are not modelled; "
			       "use pp 1 without sequence_parallel (tensor parallelism, data "
			       "parallelism and ZeRO are)", src, q->pp,
			       q->sequence_parallel ? ", sequence_parallel" : "", m->type);
	/* DeepSpeed's MOELayer under tensor parallelism keeps each rank's 1/t of every expert's
	 * capacity (drop_tokens), taking the ranks to hold the same tokens; under sequence
	 * parallelism each holds its own s/t of them, which Megatron-DeepSpeed's transformer.py
	 * passes to the layer unchanged, so the rest would be dropped unseen */
	if (m->experts && m->ds_gate && q->tp > 1 && q->sequence_parallel)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.sequence_parallel with "
			       "DeepSpeed's MoE layer (the scenario's \"moe\" object) under tp %lld: "
			       "its MOELayer keeps each tensor-parallel rank's 1/tp of every expert's "
			       "capacity (moe/mappings.py drop_tokens), taking the ranks to hold the "
			       "same tokens, which under sequence parallelism they do not (each holds "
			       "s/tp of its own, passed unchanged by Megatron-DeepSpeed); set "
			       "sequence_parallel false", src, q->tp);
	if (q->ep > 1 && !m->experts)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.ep = %lld but the model has no "
			       "experts (give moe.num_experts or a Mixtral config)", src, q->ep);
	if (m->experts && m->experts % q->ep)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.ep = %lld does not divide the %lld "
			       "experts", src, q->ep, m->experts);
	if (p->dp % q->ep)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.ep = %lld does not divide the "
			       "data-parallel size %lld (= %lld GPUs / (tp %lld x pp %lld))", src,
			       q->ep, p->dp, p->world, q->tp, q->pp);
	if (q->pp > 1 && p->stage >= 2) /* deepspeed/runtime/pipe/engine.py */
		return px_fail(err, PX_ERR_INPUT, "%s: ZeRO stage %d with pipeline parallelism (pp "
			       "%lld): DeepSpeed refuses: ZeRO-2 and ZeRO-3 are incompatible with "
			       "pipeline parallelism", src, p->stage, q->pp);
	if (q->schedule == PIPE_INTERLEAVED && q->virtual_stages < 2)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism: the interleaved schedule needs "
			       "virtual_stages >= 2, got %lld", src, q->virtual_stages);
	if (q->schedule != PIPE_INTERLEAVED && q->virtual_stages > 1)
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism.virtual_stages = %lld needs "
			       "pipeline_schedule \"interleaved\"", src, q->virtual_stages);
	if (q->schedule == PIPE_INTERLEAVED && p->m % q->pp)
		return px_fail(err, PX_ERR_INPUT, "%s: the interleaved schedule needs the %lld "
			       "micro-batches to divide by pp %lld (Megatron's rule)", src, p->m,
			       q->pp);
	if (p->dp % p->hpz)
		return px_fail(err, PX_ERR_INPUT, "%s: zero_hpz_partition_size = %lld does not divide "
			       "the data-parallel size %lld", src, p->hpz, p->dp);
	if (m->ds_gate && p->stage == 3) /* deepspeed/runtime/engine.py, _configure_zero_optimizer */
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.zero_optimization.stage = 3 with "
			       "DeepSpeed's MoE layers (the scenario's \"moe\" object): DeepSpeed "
			       "refuses (\"MoE not supported with Stage 3\"); use stage 0-2 (a "
			       "Hugging Face MoE model, whose experts are its own modules, runs at "
			       "stage 3)", src);
	return 0;
}

/* ---- per-unit split, partition and cost ---- */

long long plan_pipe_parts(const Plan *p, int grads)
{
	const DsConfig *ds = &p->sc->ds;
	int on = grads ? ds->grad_partitioned : ds->pipe_partitioned;
	return p->par.tp > 1 && !p->shape.sp && on ? p->par.tp : 1;
}

GemmShape plan_gemm_shape(const Plan *p)
{
	return (GemmShape){.s = p->shape.s, .s_dec = p->shape.s_dec ? p->shape.s_dec : p->shape.s,
			   .b = p->shape.b, .t = (int)p->par.tp, .ep = (int)p->par.ep,
			   .expert_tokens = (double)p->moe_capacity * (double)p->par.ep,
			   .attn_block = p->shape.attn_block, .attn_blocks = p->shape.attn_blocks};
}

/* Forward FLOPs of one micro-batch through a unit on one rank: 2 per multiply-add of every
 * product model.c lists for it (its weights', the attention's QK^T and AV over the full square,
 * an MoE block's experts' over the tokens routed to them); a params-only model's blocks, 2 per
 * parameter per token. */
static double unit_fwd_flops(const Plan *p, int unit, UnitPlan *u)
{
	const ModelSpec *m = &p->sc->model;
	u->attn_flops = 0;
	if (!model_known(m))
		return 2.0 * (double)(p->shape.s * p->shape.b) * (double)u->local_dense;
	ModelGemm g[MODEL_MAX_GEMMS];
	GemmShape gs = plan_gemm_shape(p);
	int n = model_unit_gemms(m, unit, &gs, g);
	for (int i = 0; i < n; i++) /* the attention's products: no bias */
		if (g[i].kind != GEMM_WEIGHT)
			u->attn_flops += 2 * g[i].m * g[i].k * g[i].n * g[i].batch;
	return model_gemms_flops(g, n);
}

/* Muon's split as DeepSpeed's users make it (param.use_muon) after Keller Jordan's: the 2-D weights
 * inside the transformer blocks; embeddings, the head, norms and biases stay with its Adam. A
 * block's weight vectors (norms) hold at most h elements, its matrices h times at least a few
 * columns (per expert); a params-only model's blocks count as matrices. */
static int is_bias(const ModelTensor *t)
{
	size_t len = strlen(t->name);
	return len >= 4 && !strcmp(t->name + len - 4, "bias");
}

static int is_hidden_matrix(const ModelSpec *m, int unit, const ModelTensor *t)
{
	if (unit < 1 || unit > m->L)
		return 0;
	if (!model_known(m))
		return 1;
	long long per_copy = t->expert && m->experts ? t->numel / m->experts : t->numel;
	return !is_bias(t) && per_copy > m->h;
}

/* Whether torch autocast casts tensor t of unit `unit` to 16 bits for a product: the weight
 * matrices of the blocks' and the head's linear layers (F.linear and torch.addmm are on its
 * 16-bit list); not the embeddings (F.embedding is on no list), norms or biases (cast too, but
 * a fraction of a percent, left out). */
static int casts_weight(const ModelSpec *m, int unit, const ModelTensor *t)
{
	if (unit == 0)
		return 0;
	if (unit >= 1 && unit <= m->L)
		return is_hidden_matrix(m, unit, t);
	return !is_bias(t) && t->numel > m->h;
}

static void plan_unit(Plan *p, int idx)
{
	const ModelSpec *m = &p->sc->model;
	const DsZero *z = &p->sc->ds.zero;
	UnitPlan *u = &p->units[idx];
	ModelTensor t[MODEL_MAX_TENSORS];

	int muon = p->sc->ds.opt && p->sc->ds.opt->muon; /* the split only Muon reads */
	u->n_tensors = model_unit_tensors(m, idx, t);
	u->moe = model_unit_is_moe(m, idx);
	for (int i = 0; i < u->n_tensors; i++) {
		long long n = t[i].numel;
		if (t[i].tp_split)
			n = ceil_div(n, p->par.tp);
		if (t[i].expert)
			n /= p->par.ep;
		u->params += t[i].numel;
		u->tensor_local[i] = n;
		if (n > u->max_tensor)
			u->max_tensor = n;
		if (muon && is_hidden_matrix(m, idx, &t[i]))
			u->muon_elems += n;
		if (p->sc->ds.autocast != DT_FP32 && !p->fsdp && casts_weight(m, idx, &t[i]))
			u->cast_elems += n;
		u->tensor_expert[i] = (unsigned char)t[i].expert;
		if (t[i].expert)
			u->local_expert += n;
		else
			u->local_dense += n;
		if (!t[i].expert && !t[i].tp_split)
			u->tp_replicated += n;
		if (p->stage == 3 && !p->fsdp && (double)n <= z->persistence_threshold_elems)
			u->persist_elems += n;
		else if (t[i].expert)
			u->part_expert += ceil_div(n, p->edp);
		else
			u->own_gather += n;
	}
	if (p->par.pp > 1 && idx == model_n_units(m) - 1 && model_tied_elems(m) &&
	    u->n_tensors < MODEL_MAX_TENSORS) {
		/* Megatron keeps a copy of the tied word embedding on the last stage for the LM head
		 * and all-reduces its gradient with the first stage's (build.c) */
		long long n = ceil_div(model_tied_elems(m), p->par.tp);
		u->tensor_local[u->n_tensors] = n;
		u->tensor_expert[u->n_tensors++] = 0;
		u->local_dense += n;
		u->own_gather += p->stage == 3 ? n : 0;
	}
	if (p->sc->ds.autocast != DT_FP32 && !p->fsdp && idx == model_n_units(m) - 1 &&
	    m->lay.lm_head)
		u->cast_elems += ceil_div(model_tied_elems(m), p->par.tp); /* the lm_head casts it */
	u->part_dense = ceil_div(u->own_gather, p->shards);
	u->own_gather = u->part_dense * p->shards;
	u->gather_dense = u->own_gather;
	u->gather_expert = u->part_expert * p->edp;

	u->act_bytes = activ_unit_bytes(m, idx, &p->shape, p->sc->ckpt, p->moe_slots);
	u->score_bytes = activ_unit_scores_bytes(m, idx, &p->shape, CKPT_NONE); /* built, kept or not */
	u->ckpt_bytes = activ_unit_checkpoint_bytes(m, idx, &p->shape,
						    p->sc->ds.partition_activations);
	u->fwd_flops = unit_fwd_flops(p, idx, u);
}

/* FSDP's auto-wrap by size or none (FsdpSpec.wrap; engine/fsdp_wrap.c): what each layer leaves
 * to no unit of its own moves into the root's flat, unit 0's, which the root gathers, keeps and
 * reduces with the last unit's (build_fsdp.c); the layer's own flat keeps the rest (none: the
 * layer has no gathers or reductions of its own). FSDP is data parallel only: a rank's elements
 * are the model's. The model's own unit (LlamaModel's, where what it holds reaches
 * min_num_params) is taken for the root (scenario.c notes the difference). */
static int plan_fsdp_wrap(Plan *p, PxError *err)
{
	const FsdpSpec *f = &p->sc->fsdp;
	const ModelSpec *m = &p->sc->model;
	p->fsdp_pieces = 1; /* TRANSFORMER_BASED_WRAP: each layer a unit */
	if (!p->fsdp || f->wrap == FSDP_WRAP_TRANSFORMER)
		return 0;
	p->fsdp_pieces = 0;
	long long root = p->units[0].local_dense;
	FsdpWrap w = {0};
	for (int u = 1; u < p->n_units - 1; u++) {
		UnitPlan *up = &p->units[u];
		if (u == 1 || model_unit_kind(m, u) != model_unit_kind(m, u - 1)) {
			if (f->wrap == FSDP_WRAP_NONE)
				w = (FsdpWrap){.leftover = model_unit_params(m, u)};
			else if (fsdp_wrap_size_based(m, u, f->min_num_params, &w))
				return px_fail(err, PX_ERR_RUNTIME, "unit %d: more tensors than the "
					       "auto-wrap walk holds", u);
		}
		if (w.pieces > p->fsdp_pieces)
			p->fsdp_pieces = w.pieces;
		up->fsdp_left = w.leftover < up->local_dense ? w.leftover : up->local_dense;
		up->part_dense = ceil_div(up->local_dense - up->fsdp_left, p->shards);
		up->own_gather = up->gather_dense = up->part_dense * p->shards;
		root += up->fsdp_left;
	}
	UnitPlan *r = &p->units[0];
	r->part_dense = ceil_div(root, p->shards);
	r->own_gather = r->gather_dense = r->part_dense * p->shards;
	return 0;
}

/* ---- optimizer memory ---- */

/* FSDP: the largest flat shard a rank holds (its step works on each unit's; use_orig_params
 * would hand it the original tensors' pieces instead): a layer's, or the root's, which holds
 * the first and last units (the embedding, the final norm and the head). */
static long long fsdp_largest_shard(const Plan *p, const StagePlan *st)
{
	long long most = p->units[0].part_dense + p->units[p->n_units - 1].part_dense;
	for (int u = 1; u < p->n_units - 1; u++)
		most = p->units[u].part_dense > most ? p->units[u].part_dense : most;
	return most < st->part_elems ? most : st->part_elems;
}

/* The elements of the tensor an Adam-type step works on at once, by who holds the tensors: ZeRO
 * stage 1-2 and DeepSpeed's FP16/BF16 optimizers hand it one flat partition; stage 3 one
 * sub-group at a time (stage3.py _optimizer_step), the largest of them counting; otherwise (fp32 at stage 0, or the
 * Trainer's own optimizer under torch autocast, which keeps fp32 parameters per tensor) the
 * model's tensors one by one. */
static double step_tensor_elems(const Plan *p, const StagePlan *st)
{
	const DsConfig *ds = &p->sc->ds;
	long long part = st->part_elems;
	if (p->fsdp) /* one flat shard per unit, the root's two units' together */
		return (double)fsdp_largest_shard(p, st);
	if (p->stage == 3) { /* the largest sub-group (plan_subgroups) */
		long long most = 0;
		for (int k = 0; k < st->n_subgroups; k++) {
			long long n = st->subgroup_end[k] - (k ? st->subgroup_end[k - 1] : 0);
			most = n > most ? n : most;
		}
		return (double)(st->n_subgroups ? most : part);
	}
	if (p->stage >= 1 || (p->mixed && !ds->opt_impl_trainer))
		return (double)part;
	return (double)st->max_tensor;
}

/* What the update allocates while it runs (optim.h's implementations): the copies of the second
 * moment, fp32, over everything one step() holds (foreach: the whole partition; at stage 3 a
 * sub-group, as stage3.py _optimizer_step calls step() with one sub-group's flat) or one step
 * tensor at a time. */
static double plan_step_temp_bytes(const Plan *p, const StagePlan *st)
{
	const OptimImpl *im = optim_impl(p->opt_impl);
	double elems = im->whole_group && (p->stage != 3 || p->fsdp) ? (double)st->part_elems :
									 step_tensor_elems(p, st);
	return im->copies * 4.0 * elems;
}

/* A rank's optimizer state for stage s (see optim.c for each type's buffers). The states are
 * fp32 per element of the partition. Muon keeps Adam's two on the partition's share of
 * non-matrix elements and one momentum on its matrices, in the gradient-accumulation dtype at
 * stage 1-2 (stage_1_and_2.py get_flat_partition), the communication dtype at stage 3
 * (stage3.py _create_momentum_buffer) and none at stage 0, where MuonWithAuxAdam.step applies
 * the gradient as is. The 1-bit optimizers (stage 0 only) add a worker error of the padded
 * compressed buffer and a server error of 1/N of it, N = dp: one buffer per parameter tensor
 * in fp32 training, one per parameter group in fp16/bf16, where FP16_Optimizer hands the
 * optimizer one fp32 flat (one group assumed here). 1-bit LAMB compresses one flat of all
 * momenta (its padding is a dummy momentum) and clones every momentum during the step. */
static void plan_optimizer(Plan *p, int s)
{
	StagePlan *st = &p->stages[s];
	const DsConfig *ds = &p->sc->ds;
	const OptimKind *k = ds->opt;
	double part = (double)st->part_elems;
	long long local = st->local_dense + st->local_expert, n = p->dp;

	st->opt_state_bytes = part * p->state_bytes;
	st->error_feedback_bytes = 0;
	st->opt_step_temp_bytes = plan_step_temp_bytes(p, st);
	st->step_elems = p->stage == 3 ? (long long)step_tensor_elems(p, st) : st->part_elems;
	if (!k)
		return;
	if (k->muon && local > 0) {
		double muon = part * (double)st->muon_elems / (double)local;
		int width = p->stage == 0 ? 0 : p->stage == 3 ? p->comm_bytes : p->grad_bytes;
		st->opt_state_bytes = (part - muon) * p->state_bytes + muon * width;
	}
	if (k->error_feedback == EF_NONE)
		return;
	long long padded = 0;
	if (k->error_feedback == EF_FLAT || p->mixed) {
		padded = optim_onebit_padded_elems(local, n);
	} else {
		for (int u = 0; u < p->n_units; u++)
			for (int i = 0; p->units[u].stage == s && i < p->units[u].n_tensors; i++)
				if (p->units[u].tensor_local[i] > 0)
					padded += optim_onebit_padded_elems(
						p->units[u].tensor_local[i], n);
	}
	/* every padded size divides by n, so the server errors sum to padded / n */
	st->error_feedback_bytes = 4.0 * (double)padded + 4.0 * (double)(padded / n);
	if (k->error_feedback == EF_FLAT) {
		st->opt_state_bytes += 4.0 * (double)(padded - local);
		st->opt_step_temp_bytes = 4.0 * (double)local;
	}
}

/* ---- stages ---- */

/* Stage 1-2 buckets: walk the stage's units backwards, closing a bucket when the next unit would
 * take it past reduce_bucket_size (a larger unit gets a bucket of its own); then lay the buckets
 * out in forward order, each padded to a multiple of dp. Without a ZeRO optimizer (stage 0, and
 * BF16_Optimizer) the stage's units form one bucket: DeepSpeed's engine reduces stage 0's
 * gradients in buckets of its own (build_engine_allreduce), and BF16_Optimizer partitions
 * one flat into dp contiguous slices and all-gathers it whole (bf16_optimizer.py
 * _setup_for_real_optimizer, update_lp_params: all_gather_into_tensor_dp_groups); neither reads
 * reduce_bucket_size. */
static int plan_buckets(Plan *p, int s)
{
	StagePlan *st = &p->stages[s];
	BucketPlan *b = calloc((size_t)p->n_units, sizeof(*b));
	double cap = p->zero_optimizer ? p->reduce_bucket_elems : INFINITY;
	int n = 0;
	if (!b)
		return -1;
	for (int u = p->n_units - 1; u >= 0; u--) {
		const UnitPlan *up = &p->units[u];
		if (up->stage != s || up->local_dense == 0)
			continue;
		if (n == 0 || (double)(b[n - 1].elems + up->local_dense) > cap)
			b[n++].u_hi = u;
		b[n - 1].u_lo = u;
		b[n - 1].elems += up->local_dense;
	}
	for (int i = 0; i < n / 2; i++) { /* into forward order */
		BucketPlan t = b[i];
		b[i] = b[n - 1 - i];
		b[n - 1 - i] = t;
	}
	long long off = 0;
	for (int i = 0; i < n; i++) {
		b[i].padded = ceil_div(b[i].elems, p->dp) * p->dp;
		b[i].flat_off = off;
		long long in = off;
		for (int u = b[i].u_lo; u <= b[i].u_hi; u++)
			if (p->units[u].stage == s) {
				p->units[u].flat_off = in;
				in += p->units[u].local_dense;
			}
		off += b[i].padded;
		if (b[i].padded > st->max_bucket)
			st->max_bucket = b[i].padded;
	}
	st->n_buckets = n;
	st->buckets = b;
	st->flat_dense = off;
	return 0;
}

/* What a contiguous gradient buffer holds at most: stage 2's largest bucket; stage 3's largest
 * unit flat, or its experts' bucket (each tensor padded to edp, filled up to reduce_bucket_size
 * or one tensor past it); stage 2's experts have buffers of their own (BUF_EXPERT_GRADS). */
static long long bucket_fill(const Plan *p, int stage)
{
	if (p->stage != 3)
		return p->stages[stage].max_bucket;
	long long experts = 0, largest = 0;
	for (int u = 0; u < p->n_units; u++) {
		if (p->units[u].stage != stage)
			continue;
		for (int i = 0; i < p->units[u].n_tensors; i++)
			if (p->units[u].tensor_expert[i]) {
				long long n = ceil_div(p->units[u].tensor_local[i], p->edp) * p->edp;
				experts += n;
				largest = n > largest ? n : largest;
			}
	}
	long long cap = (long long)p->reduce_bucket_elems;
	experts = experts < cap ? experts : cap;
	experts = experts > largest ? experts : largest;
	return experts > p->stages[stage].max_bucket ? experts : p->stages[stage].max_bucket;
}

/* ---- stage 3: the optimizer's sub-groups ---- */

/* Stage s's tensors in DeepSpeed's order, each its ceil(numel / dp) share of the partition,
 * closed into sub-groups once one reaches sub_group_size (stage3.py _create_fp16_sub_groups: so at
 * least one tensor's share; 0: every tensor alone): the size of the next sub-group from tensor
 * *ti of unit *ui on, 0 when none is left. */
static long long next_subgroup(const Plan *p, int s, int *ui, int *ti)
{
	long long sub = (long long)p->sc->ds.zero.sub_group_elems, group = 0;
	for (; *ui < p->n_units; (*ui)++, *ti = 0) {
		const UnitPlan *u = &p->units[*ui];
		while (u->stage == s && *ti < u->n_tensors) {
			group += ceil_div(u->tensor_local[(*ti)++], p->dp);
			if (group > 0 && group >= sub)
				return group;
		}
	}
	return group;
}

/* The sub-groups' ends in the plan's partition: their shares summed, bounded by the partition
 * (which pads per unit, not per tensor), the last at its end. The update steps them one after
 * another, so that the largest is what a step's fp32 copies and swap buffers hold. */
static int plan_subgroups(Plan *p, int s)
{
	StagePlan *st = &p->stages[s];
	st->n_subgroups = 0;
	st->subgroup_end = NULL;
	if (p->stage != 3 || p->fsdp || st->part_elems <= 0) /* FSDP has no sub-groups */
		return 0;
	size_t cap = 1;
	for (int u = 0; u < p->n_units; u++)
		cap += (size_t)p->units[u].n_tensors;
	st->subgroup_end = malloc(cap * sizeof(*st->subgroup_end));
	if (!st->subgroup_end)
		return -1;
	int ui = 0, ti = 0, n = 0;
	long long at = 0, g;
	while ((g = next_subgroup(p, s, &ui, &ti)) > 0) {
		at += g;
		long long end = at < st->part_elems ? at : st->part_elems;
		if (n == 0 || end > st->subgroup_end[n - 1])
			st->subgroup_end[n++] = end;
	}
	if (n == 0)
		n = 1;
	st->subgroup_end[n - 1] = st->part_elems;
	st->n_subgroups = n;
	return 0;
}


/* engine.py _do_optimizer_sanity_check, for a config resolved by dsconfig_resolve: which
 * optimizer wraps the basic one without ZeRO, and when stage 1 is BF16_Optimizer's. Without ZeRO,
 * bf16 takes BF16_Optimizer (fp32 accumulation, or bf16 under pipelining), fp16 FP16_Optimizer,
 * fp32 none; any other mix of the model's and the accumulation's dtypes is refused. At stage 1,
 * bf16 with fp32 accumulation and the optimizer on the device takes BF16_Optimizer too. The
 * 1-bit optimizers in bf16 are refused: DeepSpeed's BF16_Optimizer would hand each rank its own
 * partition, which their compressed exchange cannot work on. BF16_Optimizer partitions as ZeRO-1 does: the plan's stage becomes 1. */
static int bf16_optimizer(Plan *p, PxError *err)
{
	const DsConfig *ds = &p->sc->ds;
	const char *src = p->sc->path;
	int bf16 = ds->dtype == DT_BF16, fp32_accum = ds->grad_dtype == DT_FP32;
	p->bf16_optimizer = 0;
	if (p->stage == 0 && ds->dtype != ds->grad_dtype && !(bf16 && fp32_accum))
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.data_types.grad_accum_dtype = %s with "
			       "%s parameters and ZeRO stage 0: DeepSpeed refuses (\"unsupported mix "
			       "of model dtype and gradient accumulation type\"); leave it unset",
			       src, dtype_name(ds->grad_dtype), dtype_name(ds->dtype));
	if (p->stage == 0 && bf16 && !fp32_accum && p->par.pp == 1)
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.data_types.grad_accum_dtype = bf16 "
			       "with bf16 and ZeRO stage 0: DeepSpeed refuses (\"Bfloat16 wrapper must "
			       "use a gradient accumulation type of fp32, enable ZeRO to use Bfloat16 "
			       "gradient accumulation\"); leave it unset (fp32) or use ZeRO stage 1",
			       src);
	const OptimKind *k = ds->opt;
	if (p->sc->framework == FRAMEWORK_FSDP) /* FSDP's MixedPrecision, not DeepSpeed's wrappers */
		return 0;
	if (k && k->error_feedback != EF_NONE && bf16 && p->stage == 0)
		/* _configure_bf16_optimizer wraps whatever basic optimizer it is given */
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.optimizer.type = %s with bf16 and ZeRO "
			       "stage 0: DeepSpeed wraps it in BF16_Optimizer (engine.py "
			       "_do_optimizer_sanity_check), whose ranks each step their own partition "
			       "of the flat (bf16_optimizer.py), so its compressed all-reduce would sum "
			       "the momenta of different parameters (DeepSpeed warns that 1-bit "
			       "convergence is verified under fp16 only); use fp16", src, k->name);
	if (k && k->error_feedback != EF_NONE)
		return 0;
	if (bf16 && (p->stage == 0 ||
		     (p->stage == 1 && fp32_accum && p->opt_place == PLACE_GPU))) {
		p->bf16_optimizer = 1;
		p->stage = 1;
	}
	return 0;
}

/* What only DeepSpeed's engine has here, which plain PyTorch and FSDP are refused with: 1 and
 * *key, *why (the scenario key, and why, after "plain PyTorch" or "FSDP") for the first found,
 * else 0. */
static int deepspeed_only(const Plan *p, const char **key, const char **why)
{
	const Scenario *sc = p->sc;
	const DsConfig *ds = &sc->ds;
	if (p->par.tp > 1 || p->par.pp > 1)
		*key = p->par.tp > 1 ? "parallelism.tp" : "parallelism.pp",
		*why = "has no tensor or pipeline parallelism here (1)";
	else if (sc->model.experts > 0)
		*key = "model", *why = "has no expert parallelism here (a dense model)";
	else if (ds->opt && ds->opt->error_feedback != EF_NONE)
		*key = "deepspeed.optimizer.type", *why = "has no 1-bit optimizers";
	else if (ds->sparse.mode != SPARSE_OFF)
		*key = "deepspeed.sparse_attention", *why = "has no block-sparse attention";
	else if (ds->cpu_checkpointing)
		*key = "deepspeed.activation_checkpointing.cpu_checkpointing",
		*why = "keeps its checkpoints on the device";
	else
		return 0;
	return 1;
}

/* Plain PyTorch (Scenario.framework): one process or DistributedDataParallel, without what only
 * DeepSpeed has. */
static int plain_pytorch(const Plan *p, PxError *err)
{
	const Scenario *sc = p->sc;
	const DsConfig *ds = &sc->ds;
	const char *key = NULL, *why = "";
	if (sc->framework != FRAMEWORK_PYTORCH)
		return 0;
	if (ds->zero.stage != 0)
		key = "deepspeed.zero_optimization.stage", why = "has no ZeRO (stage 0)";
	else if (deepspeed_only(p, &key, &why))
		;
	else if (ds->dtype == DT_BF16)
		key = "deepspeed.bf16.enabled", why = "in bf16 is not modelled (fp32, or fp16 read as "
						      "DeepSpeed's)";
	if (!key)
		return 0;
	return px_fail(err, PX_ERR_INPUT, "%s: framework \"pytorch\" with %s: plain PyTorch %s; "
		       "use framework \"deepspeed\" for it", sc->path, key, why);
}

/* PyTorch's FullyShardedDataParallel (Scenario.framework "fsdp", FsdpSpec): stage 3's
 * partitioning, each unit's parameters one flat padded to the group and sharded over it (FSDP's
 * FlatParameter; every tensor, none persistent), kept as the model was loaded, fp32 (the
 * Trainer's default), with the optimizer's states over them and no master copy. MixedPrecision
 * (the deepspeed section's fp16 or bf16, or training_args') gathers the weights, computes and
 * reduce-scatters the gradients in 16 bits; fp32 otherwise. The Trainer runs autocast over it
 * too, whose casts of 16-bit weights are the weights themselves. offload_params puts the shards,
 * their gradients and the optimizer's step on the host. */
static int fsdp_plan(Plan *p, PxError *err)
{
	const Scenario *sc = p->sc;
	const DsConfig *ds = &sc->ds;
	const char *key = NULL, *why = "";
	if (sc->framework != FRAMEWORK_FSDP)
		return 0;
	if (ds->zero.stage != 0)
		key = "deepspeed.zero_optimization.stage",
		why = "shards by fsdp.sharding_strategy, not ZeRO (leave the stage out, or 0)";
	else if (deepspeed_only(p, &key, &why))
		;
	else if (sc->backend == BACKEND_CUDA)
		key = "backend \"cuda\"", why = "runs on the CPU executor only (backend \"cpu\"), "
						 "or is predicted (backend \"gpu\")";
	if (key)
		return px_fail(err, PX_ERR_INPUT, "%s: framework \"fsdp\" with %s: FSDP %s", sc->path,
			       key, why);
	Dtype mp = ds->autocast != DT_FP32 ? ds->autocast : ds->dtype;
	p->fsdp = 1;
	p->stage = 3;
	p->mixed = mp != DT_FP32;
	p->param_bytes = p->grad_bytes = p->comm_bytes = dtype_bytes(mp);
	p->shard_bytes = 4;
	p->master_bytes = 0;
	/* CPUOffload: the shards, their gradients and the optimizer on the host, where torch's
	 * Adam takes the for-loop update (foreach only for CUDA tensors) */
	p->opt_place = p->param_place = sc->fsdp.offload_params ? PLACE_CPU : PLACE_GPU;
	/* HYBRID_SHARD: FSDP's intra-node process group (_init_intra_and_inter_node_groups: the
	 * ranks of one node), its replicas one a node */
	if (scenario_fsdp_hybrid(sc->fsdp.sharding)) {
		p->shards = parallel_group_span(&p->par, LAYOUT_DP, sc->cluster.gpus_per_node,
						p->hpz).per_node;
		p->shard_group = GROUP_NODE;
	}
	/* FSDP2 (fully_shard): reshard_after_forward's int is a secondary group, as hpZ's: the
	 * backward gathers a unit from the 1/N each rank kept after its forward, over N ranks
	 * (FSDPParamGroup's post_forward_mesh_info); a non-trivial divisor of the shard world */
	p->fsdp2 = sc->fsdp.version == 2;
	long long n = sc->fsdp.post_forward;
	if (n > 1 && (n >= p->dp || p->dp % n))
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.reshard_after_forward = %lld: expected a "
			       "divisor of the %lld ranks FSDP shards over, between 2 and %lld (fully_shard "
			       "refuses 1 and the whole group)", sc->path, n, p->dp, p->dp / 2);
	if (n > 1 && sc->fsdp.offload_params)
		return px_fail(err, PX_ERR_INPUT, "%s: fsdp.reshard_after_forward = %lld with "
			       "offload_params: not modelled (where the kept 1/%lld lives); use true or "
			       "false", sc->path, n, n);
	if (n > 1)
		p->hpz = n;
	if (sc->fsdp.offload_params && p->opt_impl == OPT_IMPL_FOREACH)
		p->opt_impl = OPT_IMPL_FOR_LOOP;
	return 0;
}

/* ZeRO-Infinity with parameters on NVMe (stage3.py): a pinned host flat of min(partition,
 * offload_param.max_in_cpu) elements is allocated (_create_param_groups_fp16_flat_cpu_memory);
 * the partition's sub-groups go into it from its start while they fit whole, and the first that
 * does not fit and every one after it stay on NVMe (_create_fp16_partitions_with_defragmentation).
 * So a partition under max_in_cpu lives in host memory, and one whose first sub-group is larger
 * than the flat has the flat allocated and unused. The fit is decided in DeepSpeed's elements
 * (each tensor's share), the resident part bounded by the plan's partition. */
static void plan_param_host(Plan *p, int s)
{
	StagePlan *st = &p->stages[s];
	long long max_in_cpu = (long long)p->sc->ds.zero.offload_param.max_in_cpu, whole = 0;
	st->param_host_flat = st->param_resident = 0;
	if (p->stage != 3 || p->param_place != PLACE_NVME)
		return;
	for (int u = 0; u < p->n_units; u++)
		for (int i = 0; p->units[u].stage == s && i < p->units[u].n_tensors; i++)
			whole += ceil_div(p->units[u].tensor_local[i], p->dp);
	long long cap = max_in_cpu < whole ? max_in_cpu : whole, at = 0, g;
	int ui = 0, ti = 0;
	while ((g = next_subgroup(p, s, &ui, &ti)) > 0 && at + g <= cap)
		at += g;
	st->param_host_flat = max_in_cpu < st->part_elems ? max_in_cpu : st->part_elems;
	st->param_resident = at >= whole || at > st->part_elems ? st->part_elems : at;
}

static int plan_stages(Plan *p, PxError *err)
{
	const ModelSpec *m = &p->sc->model;
	long long v = p->par.virtual_stages, pp = p->par.pp;
	long long *unit_params = malloc((size_t)p->n_units * sizeof(*unit_params));
	p->n_chunks = (int)(pp * v);
	p->chunk_bounds = malloc((size_t)(p->n_chunks + 1) * sizeof(int));
	p->stages = calloc((size_t)pp, sizeof(*p->stages));
	if (!unit_params || !p->chunk_bounds || !p->stages) {
		free(unit_params);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	for (int u = 0; u < p->n_units; u++)
		unit_params[u] = p->units[u].params;
	int rc = pipe_partition(p->par.partition, unit_params, p->n_units, m->L, pp, v,
				p->chunk_bounds, err);
	free(unit_params);
	if (rc) {
		char why[sizeof(err->msg)];
		memcpy(why, err->msg, sizeof(why));
		return px_fail(err, PX_ERR_INPUT, "%s: %s", p->sc->path, why);
	}
	for (int j = 0; j < p->n_chunks; j++)
		for (int u = p->chunk_bounds[j]; u < p->chunk_bounds[j + 1]; u++) {
			UnitPlan *up = &p->units[u];
			StagePlan *st = &p->stages[j % pp];
			up->stage = (int)(j % pp);
			up->chunk = (int)(j / pp);
			st->local_dense += up->local_dense;
			st->local_expert += up->local_expert;
			st->persist_elems += up->persist_elems;
			up->part_off = st->part_elems;
			st->part_elems += up->part_dense + up->part_expert;
			/* a tied head's gather of the embedding reads the embedding's own */
			up->secondary_off = st->secondary_elems;
			st->secondary_elems += up->own_gather / p->hpz;
			st->muon_elems += up->muon_elems;
			if (up->max_tensor > st->max_tensor)
				st->max_tensor = up->max_tensor;
		}
	for (int s = 0; s < pp; s++) {
		StagePlan *st = &p->stages[s];
		if (p->stage < 3 && plan_buckets(p, s))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		st->flat_expert = ceil_div(st->local_expert, p->edp) * p->edp;
		if (p->stage == 0) /* the whole flat buffer, padding included */
			st->part_elems = st->flat_dense + st->flat_expert;
		else if (p->stage < 3)
			st->part_elems = st->flat_dense / p->dp + st->flat_expert / p->edp;
		else { /* persistent tensors still have a partition for the optimizer */
			st->persist_part_off = st->part_elems;
			st->part_elems += ceil_div(st->persist_elems, p->dp);
		}
		if (p->hpz <= 1 || p->fsdp) /* FSDP2's kept shards are each unit's own (build) */
			st->secondary_elems = 0;
		for (int u = 0; p->stage == 3 && u < p->n_units; u++)
			if (p->units[u].stage == s && p->units[u].own_gather > st->max_bucket)
				st->max_bucket = p->units[u].own_gather;
		st->bucket_fill = bucket_fill(p, s);
		st->max_tensor_part = ceil_div(st->max_tensor, p->dp); /* stage 3's sub-groups */
		if (plan_subgroups(p, s))
			return px_fail(err, PX_ERR_RUNTIME, "out of memory");
		plan_optimizer(p, s);
		plan_param_host(p, s);
	}
	return 0;
}

static Place offload_place(OffloadDevice d)
{
	return d == DEV_CPU ? PLACE_CPU : d == DEV_NVME ? PLACE_NVME : PLACE_GPU;
}

static void plan_spans(Plan *p)
{
	const ParallelSpec *q = &p->par;
	long long gpn = p->sc->cluster.gpus_per_node;
	static const LayoutGroup of[N_GROUPS] = {LAYOUT_DP, LAYOUT_TP, LAYOUT_PP, LAYOUT_EP,
						 LAYOUT_HPZ, LAYOUT_EDP, LAYOUT_DP, LAYOUT_DP};
	for (int g = 0; g < N_GROUPS; g++)
		p->spans[g] = parallel_group_span(q, of[g], gpn, p->hpz);
	GroupSpan dp = p->spans[GROUP_DP]; /* node: dp members in one node; xnode: one per node */
	p->spans[GROUP_NODE] = (GroupSpan){dp.per_node, 1, dp.per_node};
	p->spans[GROUP_XNODE] = (GroupSpan){dp.nodes, dp.nodes, 1};
}

int plan_build(Plan *p, const Scenario *sc, PxError *err)
{
	const DsConfig *ds = &sc->ds;
	const ModelSpec *m = &sc->model;

	memset(p, 0, sizeof(*p));
	p->sc = sc;
	p->par = sc->par;
	p->world = cluster_world(&sc->cluster);
	p->dp = p->world / (p->par.tp * p->par.pp);
	p->par.dp = p->dp;
	p->edp = p->par.ep > 0 && p->dp % p->par.ep == 0 ? p->dp / p->par.ep : p->dp;
	p->m = ds->grad_accum;
	p->stage = ds->zero.stage;
	p->n_params = (long long)llround(m->n_params);
	p->hpz = ds->zero.hpz_partition_size;
	p->qwz = ds->zero.quantized_weights;
	p->qgz = ds->zero.quantized_gradients;
	if (check_degrees(p, err))
		return -1;

	p->mixed = ds->dtype != DT_FP32;
	p->param_bytes = dtype_bytes(ds->dtype);
	p->grad_bytes = dtype_bytes(ds->grad_dtype);
	p->comm_bytes = dtype_bytes(ds->comm_dtype);
	p->master_bytes = p->mixed || p->stage >= 1 ? 4 : 0;
	p->state_bytes = 4 * ds->optimizer_states;
	p->opt_place = offload_place(ds->zero.offload_optimizer.device);
	p->opt_impl = ds->opt_impl == OPT_IMPL_FOREACH && p->opt_place != PLACE_GPU ?
			      OPT_IMPL_FOR_LOOP : ds->opt_impl;
	p->param_place = offload_place(ds->zero.offload_param.device);
	p->contiguous_grads = ds->zero.contiguous_gradients ||
			      (p->stage >= 1 && p->stage <= 2 && p->opt_place != PLACE_GPU);
	/* stage_1_and_2.py _configure_moe_settings, for DeepSpeed's MoE layers */
	if (m->ds_gate && p->stage == 2 && !p->contiguous_grads)
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.zero_optimization.contiguous_gradients "
			       "= false at stage 2 with DeepSpeed's MoE layers: DeepSpeed refuses "
			       "(\"Contiguous Gradients in ZeRO Stage 2 must be set to True for MoE\"); "
			       "set it true", sc->path);
	if (m->ds_gate && p->stage >= 1 && p->stage <= 2 && !ds->zero.reduce_scatter)
		return px_fail(err, PX_ERR_INPUT, "%s: deepspeed.zero_optimization.reduce_scatter = "
			       "false at stage %d with DeepSpeed's MoE layers: DeepSpeed refuses "
			       "(\"Reduce Scatter in ZeRO Stage 2 must be set to True for MoE\"); set "
			       "it true", sc->path, p->stage);
	if (p->hpz > 1 && p->stage == 3 && p->param_place == PLACE_NVME)
		/* partition_parameters.py _partition_param_sec: torch.empty(..., device=
		 * self.remote_device), which is offload_param.device */
		return px_fail(err, PX_ERR_INPUT, "%s: zero_hpz_partition_size = %lld with "
			       "offload_param.device \"nvme\": DeepSpeed allocates hpZ's secondary "
			       "partition on the parameters' offload device, which cannot be nvme; "
			       "offload them to \"cpu\" or leave hpZ off", sc->path, p->hpz);
	p->shard_bytes = p->param_bytes;
	p->shards = p->dp;
	p->shard_group = GROUP_DP;
	if (plain_pytorch(p, err) || bf16_optimizer(p, err) || fsdp_plan(p, err))
		return -1;
	if (sc->model_code == MODEL_CODE_HUGGINGFACE && sc->backend != BACKEND_GPU)
		return px_fail(err, PX_ERR_INPUT, "%s: model_code \"huggingface\" with backend \"%s\": "
			       "the executor runs its own kernels, not Hugging Face's modules; leave "
			       "model_code out (or \"megatron\") for backend cpu and cuda", sc->path,
			       sc->backend == BACKEND_CPU ? "cpu" : "cuda");
	p->zero_optimizer = p->stage >= 1 && !p->bf16_optimizer && !p->fsdp;
	if (p->fsdp) /* each unit's gradients are its own, reduced from them */
		p->contiguous_grads = 0;
	p->overlap_comm = (p->zero_optimizer && ds->zero.overlap_comm && p->par.pp == 1) ||
			  (sc->framework == FRAMEWORK_PYTORCH && p->dp > 1); /* DDP's buckets */
	p->flattens_grads = p->zero_optimizer && p->opt_place == PLACE_GPU;
	p->ckpt_place = ds->cpu_checkpointing && sc->ckpt == CKPT_FULL ? PLACE_CPU : PLACE_GPU;
	p->reduce_bucket_elems = ds->zero.reduce_bucket_elems;
	p->allgather_bucket_elems = ds->zero.allgather_bucket_elems;
	p->shape = (ActivShape){.s = sc->seq, .s_dec = sc->seq_dec, .b = ds->micro_batch,
				.t = (int)p->par.tp,
				.sp = p->par.sequence_parallel && p->par.tp > 1,
				.flash = sc->attention == ATTN_FLASH,
				.attn_block = ds->sparse.mode != SPARSE_OFF ? ds->sparse.block : 0,
				.attn_blocks = sc->sparse_blocks,
				.elem_bytes = p->param_bytes, /* the executor's too: it computes in
								 * the parameters' dtype */
				.hf_eager = sc->model_code == MODEL_CODE_HUGGINGFACE,
				.autocast = ds->autocast != DT_FP32};
	if (p->shape.autocast && !p->fsdp) /* fp32 weights, 16-bit GEMM outputs */
		p->shape.elem_bytes = dtype_bytes(ds->autocast);
	p->executor = sc->backend != BACKEND_GPU;
	if (p->fsdp) /* 16-bit weights under the Trainer's autocast, or fp32; the executor's
			kernels compute in the weights' dtype, with no autocast */
		p->shape.autocast = p->shape.weights16 = p->mixed && !p->executor;
	p->cuda_runtime = sc->backend != BACKEND_CPU;
	if (sc->backend == BACKEND_CUDA) /* the CUDA executor's logits rows (exec/compute_cuda.c) */
		p->shape.logits_align = 8;
	p->activations_known = model_known(m);

	if (m->experts) { /* DeepSpeed sharded_moe.py: capacity per expert from this rank's tokens */
		const MoeSpec *q = &p->par.moe;
		double tokens = (double)(sc->seq * ds->micro_batch);
		double per_expert = (double)m->top_k * tokens / (double)m->experts;
		if (q->drop_tokens) {
			p->moe_capacity = (long long)ceil(q->capacity_factor * per_expert);
			if (p->moe_capacity < q->min_capacity)
				p->moe_capacity = q->min_capacity;
		} else { /* the busiest expert's count, all-reduced (max) over the expert-parallel
			    group: imbalance x the mean, or without one the count expected under
			    uniform routing; no expert receives more than the rank's tokens (a
			    token's choices are distinct experts), and min_capacity is not applied
			    (top1gating, top2gating without drop_tokens) */
			p->moe_capacity = (long long)ceil(
				q->imbalance > 0 ? q->imbalance * per_expert :
				expected_busiest(tokens, (double)m->experts, (double)m->top_k,
						 (double)(m->experts * p->par.ep)));
			if (p->moe_capacity > (long long)tokens)
				p->moe_capacity = (long long)tokens;
		}
		/* DeepSpeed's MoE layer splits each expert's capacity over the tensor-parallel ranks
		 * (moe/mappings.py _drop_tokens asserts that it divides). Without dropping, the
		 * capacity is the busiest expert's count, which the estimate here rounds up to a
		 * multiple of tp (a run would assert wherever the count does not divide). */
		long long t = p->par.tp;
		if (m->ds_gate && t > 1 && p->moe_capacity % t) {
			if (q->drop_tokens)
				return px_fail(err, PX_ERR_INPUT, "%s: parallelism.tp = %lld does not "
					       "divide the experts' capacity, %lld tokens (moe.capacity_factor "
					       "%g x top-k %lld x %lld tokens / %lld experts, at least "
					       "moe.min_capacity %lld): DeepSpeed's MoE layer splits it over the "
					       "tensor-parallel ranks (drop_tokens) and asserts that it divides; "
					       "choose a capacity_factor or min_capacity that makes it a "
					       "multiple of %lld", sc->path, t, p->moe_capacity,
					       q->capacity_factor, m->top_k, (long long)tokens, (long long)m->experts,
					       (long long)q->min_capacity, t);
			p->moe_capacity = ceil_div(p->moe_capacity, t) * t;
			if (m->top_k == 1 && p->moe_capacity > (long long)tokens) /* top1gating's min */
				p->moe_capacity = (long long)tokens;
		}
		p->moe_slots = m->experts * p->moe_capacity;
	}

	p->n_units = model_n_units(m);
	p->units = calloc((size_t)p->n_units, sizeof(*p->units));
	if (!p->units)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < p->n_units; i++) { /* one walk per kind of block (model.h) */
		if (i > 1 && i <= m->L && model_unit_kind(m, i) == model_unit_kind(m, i - 1))
			p->units[i] = p->units[i - 1];
		else
			plan_unit(p, i);
	}
	if (plan_fsdp_wrap(p, err)) {
		plan_free(p);
		return -1;
	}
	/* the tied head gathers the embedding's flat; FSDP's root unit holds both */
	if (p->stage == 3 && !p->fsdp && model_tied_elems(m))
		p->units[p->n_units - 1].gather_dense += p->units[0].own_gather;
	if (plan_stages(p, err)) {
		plan_free(p);
		return -1;
	}
	plan_spans(p);
	return 0;
}

void plan_free(Plan *p)
{
	if (!p)
		return;
	free(p->units);
	free(p->chunk_bounds);
	for (long long s = 0; p->stages && s < p->par.pp; s++)
		free(p->stages[s].buckets), free(p->stages[s].subgroup_end);
	free(p->stages);
	p->units = NULL;
	p->chunk_bounds = NULL;
	p->stages = NULL;
}
