/* runner_tp: the runner's tensor parallelism. The units' collectives run inside the kernels
 * (kernels/gpt_tp_cpu.h calls them back, Megatron's column and row splits); each call takes the
 * schedule's next op after the unit's compute op, which must be a tensor-parallel collective of
 * the same kind and size (engine/build.c's tp_colls), and runs on the tensor-parallel
 * communicator, so that the schedule the simulator prices is the one that ran, op for op. The walk
 * then passes over the ops the kernels took. Which tensors the group replicates (left out of the
 * gradient norm but on rank 0) is here too. */
#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"
#include "runner_int.h"

/* ---- the kernels' collectives ---- */

const Op *runner_kernel_take(Runner *r, CommGroup g, CollKind kind, size_t total,
			     size_t elem_bytes, int sized)
{
	if (r->tp_failed)
		return NULL;
	const Schedule *s = r->s;
	int i = r->tp_next;
	const Op *op = i < s->n ? &s->ops[i] : NULL;
	if (!op || op->kind != OP_COLL || op->group != g || op->sub != (int)kind ||
	    op->unit != r->tp_unit || (sized && op->elems != (long long)total) ||
	    op->elem_bytes != (int)elem_bytes) {
		r->tp_failed = 1;
		px_fail(&r->tp_err, PX_ERR_RUNTIME, "schedule op %d: unit %d's kernels make a %s %s "
			"of %zu elements of %zu bytes, the schedule has %s there", i, r->tp_unit,
			group_name(g), coll_name(kind), total, elem_bytes,
			op ? (op->kind == OP_COLL ? coll_name(op->sub) : op_kind_name(op->kind)) :
			     "nothing");
		return NULL;
	}
	r->tp_next++;
	return op;
}

void runner_kernel_timed(Runner *r, CollKind kind, double t0)
{
	double dt = px_now_s() - t0;
	r->tp_s += dt;
	r->op_s[N_COMPS + kind] += dt;
}

/* The tensor-parallel op the kernels' call of kind over total elements of type dt takes, or
 * NULL (tp_err says why). A dropless MoE block's gathers of its capacity are of the gate's size,
 * the schedule's the plan's estimate of it (its attention's collectives are all-reduces). */
static const Op *take(Runner *r, CollKind kind, size_t total, PrecisionType dt)
{
	int sized = !(r->moe.dropless && kind == COLL_ALL_GATHER && is_moe_unit(r, r->tp_unit));
	return runner_kernel_take(r, GROUP_TP, kind, total, precision_bytes(dt), sized);
}


static void tp_all_reduce(void *ctx, void *buf, size_t n, PrecisionType dt, GptTpOp how)
{
	Runner *r = ctx;
	if (!take(r, COLL_ALL_REDUCE, n, dt))
		return;
	double t0 = px_now_s();
	CommRedOp op = how == GPT_TP_MAX ? COMM_MAX : COMM_SUM;
	if (comm_all_reduce(r->tp, buf, buf, n, comm_prec(dt), op, &r->tp_err))
		r->tp_failed = 1;
	runner_kernel_timed(r, COLL_ALL_REDUCE, t0);
}

static void tp_all_gather(void *ctx, const void *in, void *out, size_t n, PrecisionType dt)
{
	Runner *r = ctx;
	if (!take(r, COLL_ALL_GATHER, n * (size_t)r->gtp.t, dt))
		return;
	double t0 = px_now_s();
	if (comm_all_gather(r->tp, in, out, n, comm_prec(dt), &r->tp_err))
		r->tp_failed = 1;
	runner_kernel_timed(r, COLL_ALL_GATHER, t0);
}

static void tp_reduce_scatter(void *ctx, const void *in, void *out, size_t n, PrecisionType dt)
{
	Runner *r = ctx;
	if (!take(r, COLL_REDUCE_SCATTER, n * (size_t)r->gtp.t, dt))
		return;
	double t0 = px_now_s();
	if (comm_reduce_scatter(r->tp, in, out, n, comm_prec(dt), COMM_SUM, &r->tp_err))
		r->tp_failed = 1;
	runner_kernel_timed(r, COLL_REDUCE_SCATTER, t0);
}

void runner_tp_begin(Runner *r, int i)
{
	r->tp_unit = r->s->ops[i].unit;
	r->tp_next = i + 1;
	r->tp_skip = 0;
}

int runner_tp_end(Runner *r, int i, PxError *err)
{
	if (r->gtp.t <= 1 && !r->moe_on)
		return 0;
	if (r->tp_failed) {
		*err = r->tp_err;
		return -1;
	}
	const Op *left = r->tp_next < r->s->n ? &r->s->ops[r->tp_next] : NULL;
	if (left && left->kind == OP_COLL && (left->group == GROUP_TP || left->group == GROUP_EP) &&
	    left->unit == r->tp_unit)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a %s %s of %lld elements after "
			       "unit %d's compute (op %d) that its kernels did not make", r->tp_next,
			       group_name(left->group), coll_name(left->sub), (long long)left->elems,
			       r->tp_unit, i);
	r->tp_skip = r->tp_next - (i + 1);
	return 0;
}

int runner_tp_pass(Runner *r, int i, PxError *err)
{
	if (r->tp_skip > 0) {
		r->tp_skip--;
		return 0;
	}
	const Op *op = &r->s->ops[i];
	return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a %s %s of %lld elements (%s) that no "
		       "unit's kernels made", i, group_name(op->group), coll_name(op->sub),
		       (long long)op->elems, role_name(op->role));
}

/* ---- set-up ---- */

/* Which of unit u's tensors (in its storage order) every rank of the tensor-parallel group holds
 * whole: those whose shard is the whole tensor (norms, the row-split layers' biases, the
 * positions; an MoE block's router and local experts). Their count. */
static int replicated_tensors(const Runner *r, int u, int rep[MOE_CPU_MAX_TENSORS])
{
	GptTensor whole[MOE_CPU_MAX_TENSORS], shard[MOE_CPU_MAX_TENSORS];
	int k;
	if (is_moe_unit(r, u)) {
		MoeCpu alone = r->moe;
		alone.tp = NULL;
		k = moe_cpu_unit_tensors(&r->cfg, &alone, whole);
		moe_cpu_unit_tensors(&r->cfg, &r->moe, shard);
	} else {
		k = gpt_cpu_unit_tensors(&r->cfg, u, whole);
		gpt_tp_unit_tensors(&r->cfg, r->gtp.t, u, shard);
	}
	for (int j = 0; j < k; j++)
		rep[j] = shard[j].numel == whole[j].numel;
	return k;
}

/* The flat ranges of this stage's replicated tensors (replicated_tensors), in order, into
 * r->rep, each at its place in the group's flattened copy: an MoE block's experts lie in the
 * expert flat (runner_moe.c), the rest in the dense flat. */
static int replicated_ranges(Runner *r)
{
	const Plan *p = r->p;
	int n = 0;
	r->rep = calloc((size_t)p->n_units * MOE_CPU_MAX_TENSORS + 1, sizeof(*r->rep));
	if (!r->rep)
		return -1;
	r->rep_elems = 0;
	for (int u = 0; r->gtp.t > 1 && u < p->n_units; u++) {
		if (p->units[u].stage != r->stage)
			continue;
		int rep[MOE_CPU_MAX_TENSORS], k = replicated_tensors(r, u, rep);
		long long off = p->units[u].flat_off, e_off = is_moe_unit(r, u) ? r->expert_off[u] : 0;
		for (int j = 0; j < k && j < p->units[u].n_tensors; j++) {
			long long len = p->units[u].tensor_local[j];
			long long *at = p->units[u].tensor_expert[j] ? &e_off : &off;
			if (rep[j]) {
				r->rep[n++] = (RepPiece){*at, *at + len, r->rep_elems};
				r->rep_elems += len;
			}
			*at += len;
		}
	}
	r->n_rep = n;
	return 0;
}

/* Into r->rep at n, the part of [lo, hi) of a flat (at `at` in the group's copy) that this rank's
 * slice [from, from + len) of it holds, in partition coordinates (the slice starts at part_off
 * there). */
static void rep_slice(Runner *r, int *n, long long lo, long long hi, long long at, long long from,
		      long long len, long long part_off)
{
	long long a = lo > from ? lo : from, z = hi < from + len ? hi : from + len;
	if (z > a)
		r->rep[(*n)++] = (RepPiece){part_off + a - from, part_off + z - from, at + a - lo};
}

/* ZeRO-3: the replicated tensors' pieces in this rank's partition (units' own flats and the
 * persistent parameters' flat, each split over dp), in partition coordinates, as the optimizer's
 * segments run (runner_make_segments), into r->rep. */
static int stage3_ranges(Runner *r)
{
	const Plan *p = r->p;
	int n = 0;
	r->rep = calloc((size_t)p->n_units * 2 * MOE_CPU_MAX_TENSORS + 1, sizeof(*r->rep));
	if (!r->rep)
		return -1;
	r->rep_elems = 0;
	for (int u = 0; r->gtp.t > 1 && u < p->n_units; u++) {
		const UnitPlan *up = &p->units[u];
		int rep[MOE_CPU_MAX_TENSORS], k = replicated_tensors(r, u, rep);
		long long o = 0, q = r->persist_off[u];
		for (int j = 0; j < k && j < up->n_tensors; j++) {
			long long len = up->tensor_local[j];
			int persistent = is_persistent(r, len);
			if (rep[j]) {
				if (persistent)
					rep_slice(r, &n, q, q + len, r->rep_elems, r->rank * r->persist_cnt,
						  r->persist_cnt, r->st->persist_part_off);
				else
					rep_slice(r, &n, o, o + len, r->rep_elems, r->rank * up->part_dense,
						  up->part_dense, up->part_off);
				r->rep_elems += len;
			}
			if (persistent)
				q += len;
			else
				o += len;
		}
	}
	r->n_rep = n;
	return 0;
}

static int by_lo(const void *a, const void *b)
{
	long long x = ((const ElemRange *)a)->lo, y = ((const ElemRange *)b)->lo;
	return (x > y) - (x < y);
}

/* The ranges the gradient norm leaves out on this rank (runner_int.h's norm_skip), in the
 * coordinates of the optimizer's segments (the flat at ZeRO 0-2, the partition at 3): the
 * replica, and off rank 0 the replicated tensors (their gradients are equal on every rank, at
 * the norm: summed over the group under sequence parallelism, whole without). */
int runner_norm_ranges(Runner *r)
{
	if (r->p->stage == 3 ? stage3_ranges(r) : replicated_ranges(r))
		return -1;
	r->norm_skip = calloc((size_t)r->n_rep + 1, sizeof(*r->norm_skip));
	if (!r->norm_skip)
		return -1;
	int n = 0;
	if (r->replica_hi > r->replica_lo)
		r->norm_skip[n++] = (ElemRange){r->replica_lo, r->replica_hi};
	for (int k = 0; r->gtp.r > 0 && k < r->n_rep; k++)
		r->norm_skip[n++] = (ElemRange){r->rep[k].lo, r->rep[k].hi};
	qsort(r->norm_skip, (size_t)n, sizeof(*r->norm_skip), by_lo);
	r->n_norm_skip = n;
	return 0;
}

/* Each piece of r->rep between the gradients and its place in buf (in r->gdt): into buf (in) or
 * back. Before the data-parallel reduction (ZeRO 0-1) the pieces are the full flat's; after it
 * (ZeRO 2-3) they are read where the optimizer's segments keep them. */
static void move_pieces(Runner *r, void *buf, int in)
{
	for (int k = 0; k < r->n_rep; k++) {
		const RepPiece *rp = &r->rep[k];
		for (int i = 0; i < (r->p->stage < 2 ? 1 : r->n_segs); i++) {
			void *g;
			Dtype gdt = r->gdt;
			long long a = rp->lo, z = rp->hi;
			if (r->p->stage < 2) {
				g = at(r->buf[r->id_grads], a, gdt);
			} else {
				const Seg *sg = &r->segs[i];
				long long base = sg->flat_off >= 0 ? sg->flat_off : sg->part_off;
				a = a > base ? a : base;
				z = z < base + sg->n ? z : base + sg->n;
				if (z <= a)
					continue;
				g = at(sg->grads, a - base, sg->gdt), gdt = sg->gdt;
			}
			void *b = at(buf, rp->at + a - rp->lo, r->gdt);
			if (in)
				r->cb->convert(r->cx, b, r->gdt, g, gdt, (size_t)(z - a));
			else
				r->cb->convert(r->cx, g, gdt, b, r->gdt, (size_t)(z - a));
		}
	}
}

/* Megatron's _allreduce_layernorm_grads: at ZeRO 0-1 the whole replicated gradients, before the
 * data-parallel reduction; at 2-3 after it (finalize_model_grads' order, Megatron's distributed
 * optimizer's), over the same full-size flattened copy, of which each rank's partition takes
 * its own pieces back (the others' places hold zeros on every rank of the group, which shares
 * the rank's data-parallel partition). */
int runner_tp_replicated(Runner *r, const Op *op, PxError *err)
{
	if (!r->tp || op->buf < 0 || r->rep_elems != op->elems)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: an all-reduce of %lld replicated "
			       "gradients over the tensor-parallel group; this rank's replicated tensors "
			       "hold %lld", (int)(op - r->s->ops), (long long)op->elems, r->rep_elems);
	void *buf = r->buf[op->buf];
	if (r->p->stage >= 2) {
		if (runner_wait_all(r, err)) /* every reduced slice is in the partition */
			return -1;
		r->cb->zero(r->cx, PLACE_GPU, buf, (size_t)op->elems * dt_bytes(r->gdt));
	}
	move_pieces(r, buf, 1);
	if (comm_all_reduce(r->tp, buf, buf, (size_t)op->elems, comm_dt(r->gdt), COMM_SUM, err))
		return -1;
	move_pieces(r, buf, 0);
	return 0;
}

int runner_tp_setup(Runner *r, PxError *err)
{
	r->gtp = (GptTp){.r = 0, .t = 1};
	if (r->p->par.tp > 1) {
		if (!r->tp || comm_size(r->tp) != (int)r->p->par.tp)
			return px_fail(err, PX_ERR_RUNTIME, "tensor parallelism of %lld: the executor "
				       "has no communicator for that group", r->p->par.tp);
		if (!r->cb->set_tp)
			return px_fail(err, PX_ERR_INPUT, "the %s compute backend has no "
				       "tensor-parallel units", r->cb->name);
		r->gtp = (GptTp){.r = comm_rank(r->tp), .t = comm_size(r->tp), .sp = r->p->shape.sp,
				 .ctx = r, .all_reduce = tp_all_reduce, .all_gather = tp_all_gather,
				 .reduce_scatter = tp_reduce_scatter};
		if (gpt_tp_check(&r->cfg, &r->gtp, r->B, r->T, err))
			return -1;
		r->cb->set_tp(r->cx, &r->gtp);
	}
	return 0;
}
