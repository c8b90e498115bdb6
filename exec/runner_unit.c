/* runner_unit: the runner's units at work. A unit's parameters brought into the model layout in
 * the compute type (from the stage's flat, or stage 3's gathered flat and persistent tensors),
 * its forward, recompute and backward on the compute backend, and its gradients moved to where
 * the schedule reduces them (BF16_Optimizer's update_hp_grads among them). */
#include "runner_int.h"

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
long long runner_tied_off(const Runner *r)
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
			to_work(r, at(dst, (long long)own, r->pdt), at(flat, runner_tied_off(r), r->pdt), vc);
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
			add_into(r, at(flat, runner_tied_off(r), d), g + own, DT_FP32, vc, d);
		return;
	}
	if (u == r->head) { /* its own now; the token embedding's share waits for its buffer
			       (runner_head_grads) unless that tensor is persistent */
		if (p->stage == 2)
			add_into(r, grad_dest(r, op), g, DT_FP32, own, r->gdt);
		else
			unit3_store_grads(r, u, g, p->units[u].own_gather > 0 ? grad_dest(r, op) : NULL,
					  MODEL_MAX_TENSORS);
		if (p->fsdp) /* its share of the tied embedding's, after its own (runner_fsdp_cat) */
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
void runner_head_grads(Runner *r, int tied_id)
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
void runner_accumulate_hp(Runner *r, const Op *op)
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

void runner_forward(Runner *r, const Op *op)
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
			runner_moe_forward(r, op, params, x, x, acts);
		else
			r->cb->block_forward(r->cx, params, x, x, acts, scratch_buf(r));
	}
}

void runner_recompute(Runner *r, const Op *op)
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
		runner_moe_forward(r, op, params, in, in, unit_buf(r, r->u_act, op));
	else
		r->cb->block_forward(r->cx, params, in, in, unit_buf(r, r->u_act, op),
				     scratch_buf(r));
}

void runner_backward(Runner *r, const Op *op)
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
		runner_moe_backward(r, op, params, grads, acts, dx);
	} else {
		r->cb->block_backward(r->cx, params, grads, acts, dx, dx, scratch);
	}
	move_grads(r, op);
}
