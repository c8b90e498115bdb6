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
	else if (p->fsdp2)
		why = "FSDP1 (fsdp.version 1): FSDP2's fully_shard (its all-gather output copied out, "
		      "reshard_after_forward's kept shards) is priced by predict, not run";
	else if (p->fsdp && sc->fsdp.wrap != FSDP_WRAP_TRANSFORMER)
		why = "FSDP's TRANSFORMER_BASED_WRAP: auto_wrap_policy SIZE_BASED_WRAP and NO_WRAP "
		      "(what the layers leave held by the root) are priced by predict, not run";
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
		 (sc->framework == FRAMEWORK_PYTORCH ||
		  sc->model.experts > 0 || p->qgz ||
		  (ds->opt && ds->opt->error_feedback != EF_NONE)))
		why = "communication_data_type other than the gradients' type under DeepSpeed without "
		      "experts, qgZ or a 1-bit optimizer";
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

/* ---- the interpreter ---- */

uint64_t runner_first_sample(const Runner *r, long step, int mb)
{
	return (uint64_t)(step - 1) * (uint64_t)r->p->sc->ds.train_batch +
	       ((uint64_t)mb * (uint64_t)r->n + (uint64_t)r->rank) * (uint64_t)r->B;
}

static void load_micro_batch(Runner *r, const DataSource *data, long step, int mb)
{
	for (int i = 0; i < r->B; i++) {
		data_sample(data, runner_first_sample(r, step, mb) + (uint64_t)i, r->T, r->sample);
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
		runner_consume(r, q->op, q->mine, q->cnt);
	if (!rc && q->recycle_buf >= 0)
		runner_recycle(r, q->recycle_buf);
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

int runner_wait_all(Runner *r, PxError *err)
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
			return runner_wait_all(r, err);
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
			return runner_wait_all(r, err);
		if (runner_stage1_via_bucket(r, op)) /* the buffer it is about to copy into */
			return wait_buf(r, op->buf, err);
		return sched_coll_overlaps(k) ? 0 : wait_buf(r, op->buf, err);
	}
	case OP_COPY:
		if (op->sub == COPY_NVME_READ || op->sub == COPY_NVME_WRITE)
			return runner_wait_all(r, err); /* the optimizer's: every reduction is in */
		if (op->buf >= 0)
			return wait_buf(r, op->buf, err);
		return op->sub == COPY_D2H ? wait_stream(r, SCC_REDUCE, err) : 0;
	case OP_FREE:
		return wait_buf(r, op->buf, err);
	case OP_ALLOC: /* the step's flat copies read every reduced gradient */
		if (op->what == BUF_GRAD_FLAT || (op->what == BUF_GRAD_FP32 && r->p->flattens_grads))
			return runner_wait_all(r, err);
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
		return runner_do_alloc(r, op, err);
	case OP_FREE:
		if (op->buf == r->id_tied)
			r->id_tied = -1;
		runner_do_free(r, op->buf);
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
			runner_forward(r, op);
		else if (op->sub == COMP_RECOMPUTE)
			runner_recompute(r, op);
		else if (op->sub == COMP_BWD)
			runner_backward(r, op);
		else if (op->sub == COMP_GRAD_ACCUM && r->p->fsdp)
			runner_fsdp_accumulate(r, op);
		else if (op->sub == COMP_GRAD_ACCUM)
			runner_accumulate_hp(r, op);
		return runner_tp_end(r, i, err);
	case OP_COLL:
		return runner_collective(r, op, err);
	case OP_COPY:
		return runner_copy(r, op, err);
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
			if (runner_wait_all(r, err) || sync_streams(r, err))
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
	if (runner_wait_all(r, err) || sync_streams(r, err) || r->cb->check(r->cx, err))
		return -1;
	/* the mean over the data-parallel ranks of the last stage, which computed the losses (0
	 * elsewhere; every rank of a tensor-parallel group the same), outside the schedule */
	float lf = (float)(r->loss_sum / (double)r->p->m);
	if (r->world && comm_size(r->world) > 1) {
		if (runner_all_reduce_scalar(r, r->world, &lf, COMM_SUM, err))
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

/* Every partitioned reduction and gather the runner places by the schedule's slice states one
 * (stage 2-3 reductions, the copies of their slices, stage 3's gathers). */
static int needs_slices(const Plan *p, const Schedule *s, PxError *err)
{
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		int partitioned = (op->kind == OP_COLL && p->stage >= 2 &&
				   (op->role == ROLE_GRAD_REDUCE || op->role == ROLE_PREFETCH)) ||
				  (op->kind == OP_COPY && op->buf >= 0);
		/* qgZ's all-to-all inside the node leaves no slice: the one across nodes does;
		 * sequence parallelism's sum of the replicated gradients over the tensor-parallel
		 * group is not a partition's (runner_tp_replicated) */
		if (partitioned && op->slice < 0 && op->group != GROUP_NODE && op->group != GROUP_TP)
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
		r->params_by_copy |= runner_is_params_copy(&s->ops[i]);
	/* fp16's loss scale: DeepSpeed's (the deepspeed section's fp16 keys), or under FSDP torch's
	 * ShardedGradScaler with GradScaler's defaults (init_scale 2^16, doubled after
	 * growth_interval 2000 steps without an inf, halved at every inf: backoff_factor 0.5, no
	 * hysteresis, no floor) */
	const DsConfig *ds = &p->sc->ds;
	r->fp16 = p->fsdp ? r->pdt == DT_FP16 : ds->dtype == DT_FP16;
	r->ls_static = !p->fsdp && ds->loss_scale > 0;
	r->ls_window = p->fsdp ? 2000 : ds->loss_scale_window;
	r->ls_hysteresis = p->fsdp ? 1 : (int)ds->hysteresis;
	r->ls_min = p->fsdp ? 0 : ds->min_loss_scale;
	r->loss_scale = !r->fp16 ? 1.0 : r->ls_static ? ds->loss_scale :
			ldexp(1.0, p->fsdp ? 16 : (int)ds->initial_scale_power);
	r->hysteresis = r->ls_hysteresis;
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
	r->seed = seed;
	if (runner_tp_setup(r, err) || sparse_setup(r, err) || runner_moe_setup(r, err))
		return -1;
	if (r->n_stages > 1 && r->stage == r->n_stages - 1 && model_tied_elems(m)) {
		/* DeepSpeed leaves a tied parameter's copies other than the first stage's out of
		 * the gradient norm (ds_pipe_replicated) */
		r->replica_lo = runner_tied_off(r);
		r->replica_hi = r->replica_lo + (long long)tied_elems(r);
	}
	r->own_flat = p->stage < 3 ? runner_own_flat_elems(r) : -1;
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
			runner_do_free(r, i);
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
	runner_moe_free(r);
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
