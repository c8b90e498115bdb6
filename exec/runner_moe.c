/* runner_moe: the runner's Mixture-of-Experts blocks with expert parallelism. The blocks run on
 * kernels/moe_cpu (DeepSpeed's gating, dispatch and combine, the local experts); each of their
 * all-to-alls takes the schedule's next op after the block's compute op, which must be an
 * expert-parallel all-to-all of the same size (engine/build.c's moe_colls), and runs on the
 * expert-parallel communicator, as runner_tp.c does for tensor parallelism; under tensor
 * parallelism each is followed by the tensor-parallel all-gather of the capacity (gather_tokens),
 * through runner_tp.c's callback. The experts' share
 * of the flat (after the dense buckets, ZeRO 0-2), its reductions and gathers over the
 * expert-data-parallel group and the optimizer's slice of it are here too. */
#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"
#include "runner_int.h"

/* ---- what runs ---- */

const char *runner_moe_supported(const Plan *p)
{
	const Scenario *sc = p->sc;
	const ModelSpec *m = &sc->model;
	if (sc->backend != BACKEND_CPU)
		return "MoE blocks on backend \"cpu\" only (kernels/moe_cpu)";
	if (sc->ds.dtype != DT_FP32 && !m->ds_gate)
		return "MoE blocks in 16-bit with DeepSpeed's gate only (the scenario's \"moe\" "
		       "object; kernels/moe_cpu keeps TopKGate's fp32 copies)";
	if (p->par.tp > 1 && !m->ds_gate) /* with it, sequence parallelism is refused (plan.c) */
		return "MoE blocks under tensor parallelism with DeepSpeed's MoE layer (the "
		       "scenario's \"moe\" object)";
	if (p->stage > 2)
		return "MoE blocks with ZeRO stage 0-2 (not 3)";
	if (p->param_place != PLACE_GPU || (p->opt_place != PLACE_GPU && p->stage == 0))
		return "MoE blocks without parameter offload (the optimizer offloaded at ZeRO stage "
		       "1-2)";
	for (int u = 0; p->stage == 2 && u < p->n_units; u++)
		if (p->units[u].local_expert % p->edp)
			return "MoE blocks at ZeRO stage 2 whose local expert elements divide by the "
			       "expert-data-parallel size (each block's reduce-scatter splits them "
			       "evenly)";
	if (m->top_k > 2 || m->experts > 64)
		return "top-1 or top-2 gating of at most 64 experts";
	if ((m->moe_I && m->moe_I != m->I) || m->I != 4 * m->h)
		return "MoE experts of GPT-2's intermediate size, 4 x n_embd";
	return NULL;
}

/* ---- the kernels' all-to-alls ---- */

/* The expert-parallel all-to-all of total elements over the group, as the schedule's next op
 * (its elements: what this rank sends); from in to out. */
static void ep_exchange(Runner *r, const void *in, void *out, size_t total)
{
	/* dropless, the schedule's size is the plan's estimate of the capacity, and what moves is
	 * the capacity the gate agreed */
	if (!runner_kernel_take(r, GROUP_EP, COLL_ALL_TO_ALL, total, dt_bytes(r->pdt),
				!r->moe.dropless))
		return;
	double t0 = px_now_s();
	if (comm_all_to_all(r->ep, in, out, total / (size_t)r->moe.ep, comm_dt(r->pdt),
			    &r->tp_err))
		r->tp_failed = 1;
	runner_kernel_timed(r, COLL_ALL_TO_ALL, t0);
}

/* The kernels' all-to-all of (E, cap, C) slots, n = E/ep cap C elements to each rank of the
 * group. Under tensor parallelism as DeepSpeed's MOELayer runs it (kernels/moe_cpu.h): this
 * rank's capacity rows [r cap/t, (r+1) cap/t) of every expert packed at in's front (drop_tokens),
 * exchanged over the expert-parallel group (ep > 1), all-gathered over the tensor-parallel group
 * (gather_tokens: rank q's piece, (E, cap/t, C), q-th) and laid back out as (E, cap, C): the
 * slots an exchange of the whole capacity would bring, every tensor-parallel rank's in being the
 * same. */
static void moe_all_to_all(void *ctx, void *in, void *out, size_t n)
{
	Runner *r = ctx;
	if (r->tp_failed)
		return;
	const MoeCpu *m = &r->moe;
	size_t total = n * (size_t)m->ep;
	int t = r->gtp.t;
	if (t <= 1) {
		ep_exchange(r, in, out, total);
		return;
	}
	size_t e = dt_bytes(r->pdt), C = (size_t)r->cfg.C;
	size_t cap = total / ((size_t)m->E * C), rows = cap / (size_t)t; /* dropless: the gate's */
	size_t piece = rows * C, mine = total / (size_t)t; /* elements a row block, a rank's part */
	char *a = in, *b = out;
	for (int x = 0; x < m->E; x++) /* forward in memory: each block moves down or stays */
		memmove(a + (size_t)x * piece * e,
			a + ((size_t)x * cap + (size_t)r->gtp.r * rows) * C * e, piece * e);
	char *gathered = a, *from = a;
	if (m->ep > 1) { /* in's front to out's, then gathered back into in */
		ep_exchange(r, a, b, mine);
		from = b;
	} else { /* gathered into out, laid out in in, copied back */
		gathered = b;
	}
	if (r->tp_failed)
		return;
	r->gtp.all_gather(r, from, gathered, mine, m->t);
	if (r->tp_failed)
		return;
	char *laid = gathered == a ? b : a;
	for (int q = 0; q < t; q++)
		for (int x = 0; x < m->E; x++)
			memcpy(laid + ((size_t)x * cap + (size_t)q * rows) * C * e,
			       gathered + ((size_t)q * mine + (size_t)x * piece) * e, piece * e);
	if (laid != b)
		memcpy(b, laid, total * e);
}

/* Selective recompute's scores buffer while one is live, else NULL */
static void *scores(const Runner *r)
{
	return r->id_scores >= 0 ? r->buf[r->id_scores] : NULL;
}

/* The gate's draw (random token selection's priorities, second-expert sampling's noise) for
 * op's block, and the global index of the first token this rank gates in op's micro-batch
 * (runner_first_sample's sequence x T): the same token draws the same in forward, recompute
 * and backward, and in any layout. */
static void name_draw(Runner *r, const Op *op)
{
	if (!r->moe.rts && !r->moe.gumbel)
		return;
	int mb = r->slots > 1 ? op->mb : r->micro;
	r->moe.rts_first = runner_first_sample(r, r->step, mb) * (uint64_t)r->T;
	r->moe.rts_stream = r->seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(op->unit + 1));
}

/* ---- dropless ---- */

/* The capacity every rank of the expert-parallel group runs at: the largest of their busiest
 * counts, all-reduced (max) as the schedule's next op states (engine/build.c's moe_colls), or
 * this rank's own without a group; -1 on failure (tp_err says why). */
static long long agree_capacity(Runner *r, long long busiest)
{
	if (!r->ep || comm_size(r->ep) == 1)
		return busiest;
	if (!runner_kernel_take(r, GROUP_EP, COLL_ALL_REDUCE, 1, sizeof(int64_t), 1))
		return -1;
	int64_t v = busiest;
	double t0 = px_now_s();
	if (comm_all_reduce(r->ep, &v, &v, 1, COMM_INT64, COMM_MAX, &r->tp_err)) {
		r->tp_failed = 1;
		return -1;
	}
	runner_kernel_timed(r, COLL_ALL_REDUCE, t0);
	return v;
}

/* The scratch at least bytes: a larger one in its place (what it held is not needed across
 * the kernels' calls). 0, or -1 out of memory (tp_err says). */
static int scratch_at_least(Runner *r, size_t bytes)
{
	int id = r->id_scratch;
	if (r->size[id] >= bytes)
		return 0;
	const Op *a = r->alloc_of[id];
	arena_free(&r->arena, a->place, a->cat, r->buf[id], r->size[id]);
	r->buf[id] = arena_alloc(&r->arena, a->place, a->cat, bytes);
	r->size[id] = r->buf[id] ? bytes : 0;
	if (r->buf[id])
		return 0;
	r->tp_failed = 1;
	return px_fail(&r->tp_err, PX_ERR_RUNTIME, "out of memory growing the MoE scratch to %zu "
		       "bytes", bytes);
}

/* The (micro-batch, unit) index of op's activations, as u_act's. */
static int act_slot(const Runner *r, const Op *op)
{
	return op->mb * r->p->n_units + op->unit;
}

void runner_moe_free_acts(Runner *r, const Op *op)
{
	if (!r->moe_slot_acts || op->unit < 0 || !is_moe_unit(r, op->unit))
		return;
	int k = act_slot(r, op);
	if (r->moe_slot_acts[k])
		arena_free(&r->arena, op->place, op->cat, r->moe_slot_acts[k], r->moe_slot_bytes[k]);
	r->moe_slot_acts[k] = NULL, r->moe_cap[k] = -1;
}

/* Dropless: the gate's counts agreed into the capacity (under tensor parallelism rounded up to
 * a multiple of t, which splits it, and for top-1 at most the rank's tokens: top1gating), the
 * slot part allocated at it (beside the activations, in their category), the scratch grown to
 * it, then the rest of the block. */
static void dropless_forward(Runner *r, const Op *op, const void *params, const void *x,
			     void *y, void *acts)
{
	MoeCpu m = r->moe;
	long long cap = agree_capacity(r, moe_cpu_block_gate(&r->cfg, &m, r->B, r->T, params, x,
							     acts, scores(r),
							     r->buf[r->id_scratch]));
	if (cap < 1)
		return;
	int t = r->gtp.t > 1 ? r->gtp.t : 1, tokens = r->B * r->T;
	cap = (cap + t - 1) / t * t;
	if (m.k == 1 && cap > tokens)
		cap = tokens;
	if (cap % t) { /* moe/mappings.py _drop_tokens asserts that t divides it */
		r->tp_failed = 1;
		px_fail(&r->tp_err, PX_ERR_RUNTIME, "unit %d: a dropless capacity of %lld tokens "
			"(top-1's at most the rank's %d) that tensor parallelism of %d does not divide",
			op->unit, cap, tokens, t);
		return;
	}
	int k = act_slot(r, op), id = r->u_act[k];
	const Op *a = r->alloc_of[id];
	m.cap = (int)cap;
	runner_moe_free_acts(r, a); /* a full recompute's forward again */
	size_t bytes = moe_cpu_block_acts(&r->cfg, &m, r->B, r->T).slot_bytes;
	r->moe_slot_acts[k] = arena_alloc(&r->arena, a->place, a->cat, bytes);
	if (!r->moe_slot_acts[k]) {
		r->tp_failed = 1;
		px_fail(&r->tp_err, PX_ERR_RUNTIME, "out of memory allocating unit %d's MoE slots "
			"(%zu bytes at capacity %lld)", op->unit, bytes, cap);
		return;
	}
	r->moe_slot_bytes[k] = bytes, r->moe_cap[k] = (int)cap;
	if (scratch_at_least(r, moe_cpu_scratch_bytes(&r->cfg, &m, r->B, r->T)))
		return;
	m.slot_acts = r->moe_slot_acts[k];
	moe_cpu_block_experts(&r->cfg, &m, r->B, r->T, params, y, acts, r->buf[r->id_scratch]);
}

void runner_moe_forward(Runner *r, const Op *op, const void *params, const void *x, void *y,
			void *acts)
{
	name_draw(r, op);
	if (r->moe.dropless)
		dropless_forward(r, op, params, x, y, acts);
	else
		moe_cpu_block_forward(&r->cfg, &r->moe, r->B, r->T, params, x, y, acts, scores(r),
				      r->buf[r->id_scratch]);
}

void runner_moe_scores(Runner *r, void *acts)
{
	moe_cpu_block_scores(&r->cfg, &r->moe, r->B, r->T, acts, scores(r));
}

void runner_moe_backward(Runner *r, const Op *op, const void *params, float *grads,
			 const void *acts, float *dx)
{
	name_draw(r, op);
	MoeCpu m = r->moe;
	if (m.dropless) { /* at its forward's capacity, on its slots */
		int k = act_slot(r, op);
		if (r->moe_cap[k] < 1 || !r->moe_slot_acts[k]) {
			r->tp_failed = 1;
			px_fail(&r->tp_err, PX_ERR_RUNTIME, "schedule op %d: unit %d's backward in "
				"micro-batch %d before its dropless forward", (int)(op - r->s->ops),
				op->unit, op->mb);
			return;
		}
		m.cap = r->moe_cap[k], m.slot_acts = r->moe_slot_acts[k];
		if (scratch_at_least(r, moe_cpu_scratch_bytes(&r->cfg, &m, r->B, r->T)))
			return;
	}
	moe_cpu_block_backward(&r->cfg, &m, r->B, r->T, params, grads, acts, scores(r), dx, dx,
			       r->buf[r->id_scratch]);
}

/* ---- the expert flat ---- */

int runner_moe_flat_coll(Runner *r, const Op *op, PxError *err)
{
	const Plan *p = r->p;
	long long n = op->nranks, cnt = op->elems / n, base = r->st->flat_dense + op->offset;
	Comm *c = r->edp;
	if (!c || comm_size(c) != op->nranks || op->elems % n || p->stage > 1 + (op->sub ==
									    COLL_ALL_GATHER))
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a %s of %lld expert elements "
			       "over the expert-data-parallel group of %d ranks: the executor has no "
			       "communicator for it or no such reduction at ZeRO stage %d",
			       (int)(op - r->s->ops), coll_name(op->sub), (long long)op->elems,
			       op->nranks, p->stage);
	CommDtype gdt = comm_dt(r->gdt);
	if (op->sub == COLL_ALL_REDUCE) { /* stage 0-1: the expert flat's gradients, in place */
		void *a = at(r->buf[r->id_grads], base, r->gdt);
		runner_predivide(r, a, r->gdt, (size_t)op->elems);
		return comm_all_reduce(c, a, a, (size_t)op->elems, gdt, COMM_SUM, err);
	}
	if (op->sub == COLL_REDUCE_SCATTER) { /* stage 1: this rank's slice, in place */
		void *send = at(r->buf[r->id_grads], base, r->gdt);
		runner_predivide(r, send, r->gdt, (size_t)op->elems);
		return comm_reduce_scatter(c, send, at(send, r->edp_rank * cnt, r->gdt), (size_t)cnt,
					   gdt, COMM_SUM, err);
	}
	if (op->sub == COLL_ALL_GATHER) { /* stage 1-2: the updated slices, in place */
		void *recv = at(r->buf[r->id_params], base, r->pdt);
		return comm_all_gather(c, at(recv, r->edp_rank * cnt, r->pdt), recv, (size_t)cnt,
				       comm_dt(r->pdt), err);
	}
	return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: the executor does not run a %s over "
		       "the expert flat", (int)(op - r->s->ops), coll_name(op->sub));
}

long long runner_moe_part_off(const Runner *r, int u)
{
	long long fd = r->st->flat_dense;
	return fd / r->n + (r->expert_off[u] - fd) / r->n_edp;
}

int runner_moe_segments(const Runner *r, Seg *out)
{
	const Plan *p = r->p;
	long long fd = r->st->flat_dense, fe = r->st->flat_expert;
	if (!r->moe_on || fe == 0)
		return 0;
	if (p->stage == 0) {
		*out = (Seg){at(r->buf[r->id_params], fd, r->pdt), at(r->buf[r->id_grads], fd, r->gdt),
			     r->gdt, fd, fe, fd, NULL};
		return 1;
	}
	if (p->stage == 1) { /* the flat's contiguous slice */
		long long cnt = fe / r->n_edp, mine = fd + r->edp_rank * cnt, part = fd / r->n;
		*out = (Seg){at(r->buf[r->id_params], mine, r->pdt),
			     at(r->buf[r->id_grads], mine, r->gdt), r->gdt, part, cnt, mine, NULL};
		return 1;
	}
	int n = 0; /* stage 2: 1/edp of each block's experts, as its reduce-scatter left them */
	for (int u = 0; u < p->n_units; u++) {
		if (p->units[u].stage != r->stage || !p->units[u].moe)
			continue;
		long long cnt = (long long)(unit_params(r, u) - r->moe_dense) / r->n_edp;
		long long mine = r->expert_off[u] + r->edp_rank * cnt, part = runner_moe_part_off(r, u);
		out[n++] = (Seg){at(r->buf[r->id_params], mine, r->pdt),
				 runner_partition_grads(r, part), r->gdt, part, cnt, mine, NULL};
	}
	return n;
}

/* ---- set-up ---- */

int runner_moe_setup(Runner *r, PxError *err)
{
	const Plan *p = r->p;
	const ModelSpec *m = &p->sc->model;
	r->moe_on = m->experts > 0;
	r->n_edp = 1;
	if (!r->moe_on)
		return 0;
	if (p->par.ep > 1 && (!r->ep || comm_size(r->ep) != (int)p->par.ep))
		return px_fail(err, PX_ERR_RUNTIME, "expert parallelism of %lld: the executor has no "
			       "communicator for that group", p->par.ep);
	if (p->edp > 1 && (!r->edp || comm_size(r->edp) != (int)p->edp))
		return px_fail(err, PX_ERR_RUNTIME, "an expert-data-parallel group of %lld: the "
			       "executor has no communicator for it", p->edp);
	r->n_edp = (int)p->edp;
	r->edp_rank = r->edp ? comm_rank(r->edp) : 0;
	r->moe = (MoeCpu){.E = (int)m->experts, .k = (int)m->top_k, .cap = (int)p->moe_capacity,
			  .I = (int)(m->moe_I ? m->moe_I : m->I), .ep = (int)p->par.ep,
			  .r = r->ep ? comm_rank(r->ep) : 0, .t = compute_prec(r->pdt), .ctx = r,
			  .all_to_all = moe_all_to_all, .tp = r->gtp.t > 1 ? &r->gtp : NULL,
			  .scores_apart = p->sc->ckpt == CKPT_SELECTIVE,
			  .ix = r->sparse ? &r->ix : NULL, .rts = m->top_k == 1 && p->par.moe.use_rts,
			  .gumbel = m->top_k == 2 && p->par.moe.second_sampling,
			  .dropless = !p->par.moe.drop_tokens};
	if (moe_cpu_check(&r->cfg, &r->moe, r->B, r->T, err))
		return -1;
	GptTensor t[MOE_CPU_MAX_TENSORS];
	moe_cpu_unit_tensors(&r->cfg, &r->moe, t);
	r->moe_dense = 0;
	for (int i = 0; i < 9; i++) /* norm1 .. the router */
		r->moe_dense += t[i].numel;
	r->expert_off = calloc((size_t)p->n_units, sizeof(long long));
	if (!r->expert_off)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	long long off = 0; /* the stage's experts in forward order, as build.c's expert flat */
	for (int u = 0; u < p->n_units; u++) {
		r->expert_off[u] = r->st->flat_dense + off;
		if (p->units[u].stage == r->stage && p->units[u].moe)
			off += (long long)(unit_params(r, u) - r->moe_dense);
	}
	r->own_expert = (off + r->n_edp - 1) / r->n_edp * r->n_edp;
	if (!r->moe.dropless)
		return 0;
	size_t n = (size_t)r->slots * (size_t)p->n_units;
	r->moe_cap = malloc(n * sizeof(*r->moe_cap));
	r->moe_slot_acts = calloc(n, sizeof(*r->moe_slot_acts));
	r->moe_slot_bytes = calloc(n, sizeof(*r->moe_slot_bytes));
	if (!r->moe_cap || !r->moe_slot_acts || !r->moe_slot_bytes)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (size_t k = 0; k < n; k++)
		r->moe_cap[k] = -1;
	return 0;
}

void runner_moe_free(Runner *r)
{
	free(r->moe_cap);
	free(r->moe_slot_acts);
	free(r->moe_slot_bytes);
	free(r->expert_off);
}
