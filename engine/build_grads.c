/* build_grads: the gradients' reductions in a schedule (build_priv.h): ZeRO 1-3's buckets,
 * reduce-scatters and all-reduces, where a unit's backward writes its gradients, BF16_Optimizer's
 * and DeepSpeed's engine's all-reduces at the boundary, and DistributedDataParallel's buckets.
 * FSDP's per-unit reductions are build_fsdp.c's. */
#include "build_priv.h"

#include <math.h>
#include <stdlib.h>

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
void build_release_prev(Builder *b, Bucket *k)
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
int build_zero_cast(Builder *b, CollKind kind, int unit, long long elems, long long mine,
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
void build_cast_through(Builder *b, int *cast, int *send, long long part_off)
{
	if (*cast >= 0 && part_off >= 0 && !b->oom)
		sched_set_cast(b->s, *cast, *send);
	release(b, send);
	release(b, cast);
}

void build_flush_bucket(Builder *b, Bucket *k)
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
		int send, cast = build_zero_cast(b, kind, k->unit, k->elems, mine, &send);
		slice(b, coll(b, kind, ROLE_GRAD_REDUCE, k->group, k->unit, k->elems, p->comm_bytes,
			      buf, offset), k->plan_bucket, k->part_off, mine);
		build_cast_through(b, &cast, &send, k->part_off);
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
	build_release_prev(b, k);
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
		build_flush_bucket(b, k);
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
void build_reduce_dense(Builder *b, int unit, int plan_bucket, long long part_off,
			 long long elems, int buf, long long offset)
{
	b->dense.elems = elems;
	b->dense.unit = unit;
	b->dense.plan_bucket = plan_bucket;
	b->dense.part_off = part_off;
	b->dense.buf = buf;
	b->dense.offset = offset;
	build_flush_bucket(b, &b->dense);
}

/* Stage 1-2's contiguous gradient buffers at a backward: two under overlap_comm. */
int build_bucket_count(const Plan *p)
{
	return p->overlap_comm && p->stage < 3 ? 2 : 1;
}

void build_release_buckets(Builder *b)
{
	release(b, &b->buckets[0]);
	release(b, &b->buckets[1]);
	b->n_buckets = 0;
}

int build_next_bucket(Builder *b)
{
	if (b->n_buckets == 0)
		return -1;
	int id = b->buckets[b->cur_bucket];
	b->cur_bucket = (b->cur_bucket + 1) % b->n_buckets;
	return id;
}

/* Stage 2-3 on one data-parallel rank with the optimizer on the device: nothing reduces or
 * copies the gradients, which go straight into the partition. */
int build_grads_direct(const Plan *p)
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
void build_grads_dest(Builder *b, int u, int *buf, long long *off)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	*buf = -1, *off = 0;
	if (p->stage < 2) {
		*buf = b->id_lp >= 0 ? b->id_lp : b->id_grads, *off = up->flat_off;
		return;
	}
	if (build_grads_direct(p)) {
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

/* Whether the contiguous gradient buffers are DeepSpeed's own (build_alloc_buckets): the
 * executor's copy whole units instead. */
int build_ds_ipg_buffers(const Plan *p)
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
long long build_xl_grad_elems(const Plan *p, int u)
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
int build_expert_grads_held(const Plan *p, int u)
{
	return p->stage == 2 && p->units[u].local_expert > 0 &&
	       (p->edp > 1 || p->opt_place != PLACE_GPU);
}

/* Stage 2: where MoE block u's slice of its experts (1/edp of them) starts in this rank's
 * partition: after the dense partition, the blocks in the expert flat's order. */
long long build_expert_part_off(const Builder *b, int u)
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
	k->part_off = build_expert_part_off(b, u);
	k->buf = egrads;
	k->offset = 0;
	hold(b, k, egrads);
	build_flush_bucket(b, k);
}

void build_unit_grads(Builder *b, int u, int egrads)
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
			build_reduce_dense(b, u, -1, up->part_off, up->own_gather,
					   build_next_bucket(b), 0);
		return;
	}
	int i = b->bucket_of[u];
	const BucketPlan *k = i >= 0 ? &p->stages[b->stage].buckets[i] : NULL;
	if (k && u == k->u_lo) /* the bucket's last unit to finish backward */
		build_reduce_dense(b, k->u_lo, i, k->flat_off / p->dp, k->padded,
				   build_next_bucket(b), 0);
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
void build_accumulate_hp(Builder *b, int lo, int hi)
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
 * parameter larger than that is reduced from its own gradient instead (build_xl_grad_elems), and
 * DeepSpeed splits a unit larger than the buffer between buckets a tensor at a time, whose
 * reductions the schedule keeps a unit's (the same bytes). The executor, which copies whole units
 * into its buckets, sizes its buffers to the largest reduction of whole units where that is
 * more. Stage 1-2 allocate n of them at each backward, two under overlap_comm
 * (stage_1_and_2.py backward: buf_0, buf_1; build_bucket_count), freed at the epilogue (stage 2
 * each micro-batch; stage 1 fills them only at the boundary's reductions, reduce_gradients,
 * which under pipelining makes one of its own, the pipe engine's backward having no epilogue);
 * stage 3 one at set-up, kept (stage3.py __init__: __ipg_bucket_flat_buffer), whose next copy
 * waits on the reduction stream. */
void build_alloc_buckets(Builder *b, int n)
{
	const Plan *p = b->p;
	b->n_buckets = b->cur_bucket = 0;
	b->buckets[0] = b->buckets[1] = -1;
	if (!p->zero_optimizer || !p->contiguous_grads)
		return;
	double elems = build_ds_ipg_buffers(p) ? p->reduce_bucket_elems :
		       fmax(p->reduce_bucket_elems, (double)p->stages[b->stage].bucket_fill);
	for (int i = 0; i < n && i < 2; i++)
		if ((b->buckets[i] = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_REDUCE_BUCKET, -1,
					   elems * p->grad_bytes)) >= 0)
			b->n_buckets = i + 1;
}

/* ---- after the micro-batches: reduction, optimizer, parameter gather ---- */

/* One collective over the stage's expert flat (after its dense one, named by offset); part_base:
 * where this rank's slice of it starts in its partition (-1: none stated). */
void build_expert_flat(Builder *b, CollKind kind, OpRole role, long long total, int elem_bytes,
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
void build_bf16_reduce(Builder *b)
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
		build_expert_flat(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, st->flat_expert,
				  p->comm_bytes, st->flat_dense / p->dp);
	release(b, &cast);
}

/* engine.py's MEMORY_OPT_ALLREDUCE_SIZE: the gradient elements DeepSpeed's engine gathers into
 * one bucket before flattening and all-reducing it (allreduce_gradients' default). */
#define DS_ENGINE_BUCKET_ELEMS 500000000LL

/* One of the engine's buckets (build_engine_allreduce): elems gradients from element off of the
 * stage's flat (the experts after the dense elements) copied into a new tensor, cast to
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
	build_cast_through(b, &cast, &none, off);
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
void build_engine_allreduce(Builder *b)
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
int build_ddp_plan(Builder *b)
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
void build_ddp_ready(Builder *b, long long lo)
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
