/* runner_coll: the runner's collectives and host copies. A collective op runs over its group's
 * communicator, blocking or started on its stream (runner.c's "streams" wait for it), and this
 * rank's reduced slice goes where the update reads it; under optimizer offload the copies take
 * the gradients to the host and the updated parameters back. The pipeline's, tensor-parallel,
 * MoE, ZeRO++ and 1-bit collectives are their own files' (runner_collective hands them over). */
#include <math.h>

#include "../engine/streams.h"
#include "runner_int.h"

/* ---- collectives ---- */

/* *x over c's ranks, through the backend's memory */
int runner_all_reduce_scalar(Runner *r, Comm *c, float *x, CommRedOp op, PxError *err)
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
void runner_recycle(Runner *r, int buf)
{
	if (buf == r->id_pgrads)
		zero(r, r->id_pgrads);
	else if (buf >= 0)
		r->zero_first[buf] = 1;
}

/* Whether op reduces stage 1's gradients through a contiguous buffer (build_step.c): copied in from
 * the full gradients, the slice going back (stage1_slice_back). */
int runner_stage1_via_bucket(const Runner *r, const Op *op)
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
void runner_consume(Runner *r, const Op *op, const void *mine, size_t cnt)
{
	if (runner_stage1_via_bucket(r, op)) {
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
 * copies it to the host instead (runner_copy). The bucket is zeroed for reuse. */
static int slice_reduced(Runner *r, const Op *op, void *mine, size_t cnt, Pending *q)
{
	if (r->offload && !runner_stage1_via_bucket(r, op) && !r->p->fsdp) /* FSDP's go to the device's
									shard, then copied */
		return pend_push(r, q);
	if (!q) {
		runner_consume(r, op, mine, cnt);
		runner_recycle(r, op->buf);
		return 0;
	}
	q->mine = mine, q->cnt = cnt;
	if (op->buf == r->id_pgrads)
		q->recycle_buf = op->buf; /* zeroed once reduced */
	else
		runner_recycle(r, op->buf);
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

/* BF16_Optimizer's reduction in communication_data_type (build_bf16_reduce): op's elements
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

/* A ZeRO reduction through a copy cast to communication_data_type (its slice's cast,
 * build_zero_cast), blocking (the cast back follows at once), this rank's reduced slice then going
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
	if (runner_stage1_via_bucket(r, op))
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

/* Stage 0's engine bucket (build_engine_allreduce), flattened when it was allocated, or a
 * DistributedDataParallel bucket (build_ddp_ready), copied into the reducer's flat now:
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

/* FSDP's HYBRID_SHARD: a unit's reduce-scatter output (or its fresh shard) summed over the nodes
 * (allreduce_hook), blocking once the reduce-scatter into it has landed, then cast into the
 * unit's fp32 shard. */
static int fsdp_hybrid_all_reduce(Runner *r, const Op *op, Comm *c, PxError *err)
{
	int u = op->unit, into_shard = r->alloc_of[op->buf]->what == BUF_GRAD_PART;
	Dtype dt = into_shard ? DT_FP32 : r->gdt;
	if (runner_wait_all(r, err) || comm_all_reduce(c, r->buf[op->buf], r->buf[op->buf],
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
int runner_collective(Runner *r, const Op *op, PxError *err)
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
		if (runner_all_reduce_scalar(r, c, &x, op->role == ROLE_OVERFLOW ? COMM_MAX : COMM_SUM,
					     err))
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
			runner_recycle(r, op->buf);
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
	int via = runner_stage1_via_bucket(r, op);
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
int runner_is_params_copy(const Op *op)
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
 * - after the optimizer (runner_is_params_copy): the updated master weights, rounded into the
 *   parameters (unless the step was skipped);
 * - host to device of a unit (stage 3 parameter offload): the partition's slice, which the
 *   all-gather after it reads from the host partition directly. */
int runner_copy(Runner *r, const Op *op, PxError *err)
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
		runner_recycle(r, op->buf);
		return 0;
	}
	if (op->sub == COPY_D2H && op->unit < 0 && p->stage == 1 && r->offload) {
		for (int i = 0; i < r->n_segs; i++) /* this rank's slices of the full gradients */
			to_f32(r, r->segs[i].grads, r->segs[i].dev_grads, (size_t)r->segs[i].n, r->gdt);
		return 0;
	}
	if (runner_is_params_copy(op)) {
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
