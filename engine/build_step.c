/* build_step: the schedule after the micro-batches (build_priv.h): the boundary's reductions,
 * the overflow and norm all-reduces, the optimizer's update sub-group by sub-group (the 1-bit
 * optimizers' compressed exchange included) and the parameters' all-gather. */
#include "build_priv.h"

#include "onebit.h"
#include "optim.h"

/* ---- the 1-bit optimizers' compressed all-reduce ---- */

/* One compressed all-reduce (onebit.h) of the elems elements of the optimizer partition from
 * part_off (-1: where they lie is not stated), whose worker error starts at element w_off of the
 * error buffer and server error at s_off. */
static void onebit_allreduce(Builder *b, long long elems, long long part_off, long long w_off,
			     long long s_off)
{
	OneBitVolume v = onebit_volume(elems, b->p->dp);
	if (v.padded_elems == 0)
		return;
	slice(b, coll(b, COLL_ALL_TO_ALL, ROLE_ONEBIT_SIGNS, GROUP_DP, -1, v.sign_bytes, 1, b->id_ef,
		      w_off), -1, part_off, elems);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SCALES, GROUP_DP, -1, b->p->dp, 4, -1, 0);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SERVER_SIGNS, GROUP_DP, -1, v.sign_bytes, 1, b->id_ef,
	     s_off);
	coll(b, COLL_ALL_GATHER, ROLE_ONEBIT_SERVER_SCALES, GROUP_DP, -1, b->p->dp, 4, -1, 0);
}

/* The compressed step's exchange: one compressed all-reduce per parameter tensor in forward order
 * (OnebitAdam, ZeroOneAdam in fp32: each tensor's state), or one of the flat (OnebitLamb's fused
 * momentum; FP16_Optimizer's one fp32 flat per group). The error buffer holds the worker errors
 * one after another, then the server errors in the same order (plan.c sized it). A tensor's
 * place in the partition (stage 0's: the stage's flat) is its unit's flat offset and the tensors
 * before it; an MoE block's is not stated (its experts lie after the dense flat). */
static void onebit_exchange(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	long long local = st->local_dense + st->local_expert, n = p->dp;
	if (p->sc->ds.opt->error_feedback == EF_FLAT || p->mixed) {
		long long padded = optim_onebit_padded_elems(local, n);
		onebit_allreduce(b, local, 0, 0, padded);
		return;
	}
	long long total = 0, w_off = 0, s_off;
	for (int u = 0; u < p->n_units; u++)
		for (int i = 0; p->units[u].stage == b->stage && i < p->units[u].n_tensors; i++)
			if (p->units[u].tensor_local[i] > 0)
				total += optim_onebit_padded_elems(p->units[u].tensor_local[i], n);
	s_off = total;
	for (int u = 0; u < p->n_units; u++) {
		const UnitPlan *up = &p->units[u];
		long long at = up->flat_off;
		for (int i = 0; up->stage == b->stage && i < up->n_tensors; i++) {
			long long e = up->tensor_local[i];
			if (e <= 0)
				continue;
			long long padded = optim_onebit_padded_elems(e, n);
			onebit_allreduce(b, e, up->moe ? -1 : at, w_off, s_off);
			at += e;
			w_off += padded;
			s_off += padded / n;
		}
	}
}

/* The last op (a stage-3 sub-group's) covers partition elements lo .. lo + n - 1. */
static void in_group(Builder *b, int ranged, long long lo, long long n)
{
	if (ranged && !b->oom)
		DO(sched_set_slice(b->s, -1, lo, n));
}

/* The update of partition elements lo .. lo + n - 1 (a stage-3 sub-group when ranged, whose
 * ops state its range; else the partition). The fp32 gradients it reads (FP16_Optimizer's flat
 * of them): DeepSpeed's ZeRO optimizers make them from the gradient tensors they update in two
 * copies (stage_1_and_2.py step: flatten(averaged_gradients).to(fp32); stage3.py
 * _prepare_fp32_grad_for_sub_group, freed after the sub-group's update): torch.cat's flat in
 * the gradients' type, live until its fp32 copy exists; in fp32 training the flat is the copy.
 * On NVMe the optimizer swaps in the sub-group's fp32 master weights and states and the fp32
 * gradients swapped out at the boundary (partitioned_optimizer_swapper.py
 * swap_in_optimizer_state), and after the update swaps out the first two. */
static void group_step(Builder *b, long long lo, long long n, int ranged, int onebit)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	double part = (double)st->part_elems, elems = (double)n;
	double fp32_elems = p->flattens_grads ? elems : part;
	int fp32_grads = -1, flat = -1;
	if (p->flattens_grads && p->grad_bytes != 4 &&
	    (flat = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_FLAT, -1, fp32_elems * p->grad_bytes)) >= 0)
		in_group(b, ranged, lo, n);
	if (((p->mixed && p->grad_bytes != 4 && !p->fsdp) || p->flattens_grads) &&
	    p->opt_place == PLACE_GPU &&
	    (fp32_grads = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_FP32, -1, fp32_elems * 4)) >= 0)
		in_group(b, ranged, lo, n);
	release(b, &flat);
	/* what the update allocates while it runs (plan.c plan_step_temp_bytes): torch's Adam's
	 * copies of the second moment, or 1-bit LAMB's copy of its momenta (lamb.py
	 * exp_avg_last_step), taken before the exchange that averages them, in compressed steps
	 * only (its warm-up steps take none; the prediction's memory is its highest kind of step's,
	 * sim/predict.c) */
	const OptimKind *ok = p->sc->ds.opt;
	int step_temp = -1, lamb = ok && ok->error_feedback == EF_FLAT;
	/* a 1-bit optimizer's initialisation step exchanges its zero momenta and updates nothing */
	int init = ok && ok->error_feedback != EF_NONE && p->onebit_step == ONEBIT_INIT;
	double temp = st->opt_step_temp_bytes; /* the largest sub-group's at stage 3: this one's */
	if (ranged && st->step_elems > 0)
		temp *= elems / (double)st->step_elems;
	if (temp > 0 && !init && !(lamb && p->onebit_step == ONEBIT_FULL) &&
	    (step_temp = alloc(b, p->opt_place, CAT_OPTIM, BUF_OPT_STEP_TEMP, -1, temp)) >= 0)
		in_group(b, ranged, lo, n);
	if ((onebit && p->onebit_step == ONEBIT_COMPRESSED) || init)
		onebit_exchange(b);
	double state = elems * p->master_bytes +
		       (part > 0 ? st->opt_state_bytes * (elems / part) : 0);
	if (p->opt_place == PLACE_NVME) {
		copy(b, COPY_NVME_READ, ROLE_OPTIMIZER, -1, state + elems * 4);
		in_group(b, ranged, lo, n);
	}
	/* an Adam-like update reads and writes every state and reads the gradient, about 10 FLOPs
	 * per element, in one pass when fused, in several otherwise (optim.h's extra_bytes) */
	double passes = elems * optim_impl(p->opt_impl)->extra_bytes;
	/* (the initialisation step's is the step that sets up its states and moves nothing) */
	DO(sched_compute(b->s, COMP_OPTIMIZER, -1, init ? 0 : 10 * elems,
			 init ? 0 : 2 * state + elems * (4 + p->shard_bytes) + passes));
	in_group(b, ranged, lo, n);
	if (p->opt_place == PLACE_NVME) {
		copy(b, COPY_NVME_WRITE, ROLE_OPTIMIZER, -1, state);
		in_group(b, ranged, lo, n);
	}
	release(b, &fp32_grads);
	release(b, &step_temp);
	/* the updated 16-bit parameters: to the device's partition from the host's optimizer, to
	 * the host's partition (stage-3 parameter offload) from the device's, or with the partition
	 * on NVMe (stage 3) into the host flat (a host copy, not priced as one) and the part beyond
	 * it swapped out to NVMe */
	long long swapped = lo + n - max_ll(lo, st->param_resident);
	if (p->param_place == PLACE_NVME && swapped > 0) {
		copy(b, COPY_NVME_WRITE, ROLE_PARAM_UPDATE, -1, (double)swapped * p->param_bytes);
		in_group(b, ranged, lo, n);
	} else if (p->param_place != PLACE_NVME &&
		   (p->opt_place != p->param_place || (p->stage < 3 && p->opt_place != PLACE_GPU))) {
		/* from the host's optimizer to the device, or from the device's to the host */
		copy(b, p->opt_place == PLACE_GPU ? COPY_D2H : COPY_H2D, ROLE_PARAM_UPDATE, -1,
		     elems * p->param_bytes);
		in_group(b, ranged, lo, n);
	}
}

void build_optimizer_step(Builder *b)
{
	const Plan *p = b->p;
	const StagePlan *st = &p->stages[b->stage];
	double part = (double)st->part_elems;
	long long tied = tied_local(p);

	/* ZeRO-Infinity: at the gradient accumulation boundary the last backward's hooks swap the
	 * partition's fp32 gradients out to NVMe (stage3.py partition_grads, swap_out_gradients),
	 * for the optimizer to read back with its states */
	if (p->opt_place == PLACE_NVME)
		copy(b, COPY_NVME_WRITE, ROLE_GRAD_REDUCE, -1, part * 4);

	/* sequence parallelism: each rank's gradients of the replicated tensors (norms, the row-split
	 * layers' biases, the positions) are its rows' share, summed over the tensor-parallel group
	 * in one flattened buffer before the data-parallel reduction (Megatron's
	 * finalize_model_grads: _allreduce_layernorm_grads) */
	if (p->par.tp > 1 && p->shape.sp) {
		long long rep = 0;
		for (int u = 0; u < p->n_units; u++)
			rep += p->units[u].stage == b->stage ? p->units[u].tp_replicated : 0;
		int flat = alloc(b, PLACE_GPU, CAT_BUFFERS, BUF_SP_GRADS, -1,
				 (double)rep * p->grad_bytes);
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_TP, -1, rep, p->grad_bytes, flat, 0);
		release(b, &flat);
	}

	/* the tied embedding's two copies (first and last stage) sum their gradients: unit 0's
	 * first tensor (embed.tokens) on the first stage, the copy after the head's own tensors on
	 * the last (plan.c) */
	if (p->par.pp > 1 && tied && (b->stage == 0 || b->stage == p->par.pp - 1)) {
		const UnitPlan *at = &p->units[b->stage == 0 ? 0 : p->n_units - 1];
		long long off = b->stage == 0 ? at->flat_off : at->flat_off + at->local_dense - tied;
		DO(sched_coll(b->s, COLL_ALL_REDUCE, ROLE_TIED_GRADS, GROUP_PP, 2, -1, tied,
			      p->grad_bytes, b->id_grads, off));
	}

	/* a 1-bit optimizer's compressed and local steps turn the gradient all-reduce off
	 * (enable_backward_allreduce = False): the compressed exchange replaces it */
	const OptimKind *ok = p->sc->ds.opt;
	int onebit = ok && ok->error_feedback != EF_NONE &&
		     (p->onebit_step == ONEBIT_COMPRESSED || p->onebit_step == ONEBIT_LOCAL);
	if (p->bf16_optimizer) {
		build_bf16_reduce(b);
	} else if (p->sc->framework == FRAMEWORK_PYTORCH || p->fsdp) {
		/* DistributedDataParallel reduced them in the last backward (build_ddp_ready),
		 * FSDP in each unit's post-backward hook (build_fsdp_unit_grads) */
	} else if (p->stage == 0 && !onebit) {
		build_engine_allreduce(b);
	} else if (p->stage == 1 && !onebit) {
		CollKind kind = build_zero_reduce_kind(p);
		/* stage 1 copies each bucket's gradients into a contiguous buffer and reduces it
		 * there (reduce_independent_p_g_buckets_and_remove_grads), its slice going back to
		 * where the update reads it (copy_grads_in_partition) */
		build_release_buckets(b); /* a pipelined last stage's, from its backwards */
		build_alloc_buckets(b, p->par.pp > 1 ? 1 : build_bucket_count(p));
		for (int i = st->n_buckets - 1; i >= 0; i--) { /* in the order backward filled them */
			int via = build_next_bucket(b);
			int send, cast = build_zero_cast(b, kind, st->buckets[i].u_lo,
							 st->buckets[i].padded, st->buckets[i].padded / p->dp,
							 &send);
			slice(b, coll(b, kind, ROLE_GRAD_REDUCE, GROUP_DP, st->buckets[i].u_lo,
				      st->buckets[i].padded, p->comm_bytes,
				      via >= 0 ? via : b->id_grads, via >= 0 ? 0 : st->buckets[i].flat_off),
			      i, st->buckets[i].flat_off / p->dp, st->buckets[i].padded / p->dp);
			build_cast_through(b, &cast, &send, st->buckets[i].flat_off);
		}
		/* one reduce-scatter of the expert flat, whose slices are the contiguous partition
		 * the parameter update gathers whole (below); chunks of it would leave each rank a
		 * piece of every chunk, not the slice it updates and sends; cast as the dense
		 * buckets are (its memory only: the executor runs no cast with experts) */
		int send, cast = build_zero_cast(b, kind, -1, st->flat_expert,
						 st->flat_expert / p->spans[GROUP_EDP].n, &send);
		build_expert_flat(b, kind, ROLE_GRAD_REDUCE, st->flat_expert, p->comm_bytes,
				  st->flat_dense / p->dp);
		build_cast_through(b, &cast, &send, -1); /* no slice names it */
		build_release_buckets(b);
	}
	if (p->stage == 1 && p->opt_place != PLACE_GPU)
		copy(b, COPY_D2H, ROLE_GRAD_REDUCE, -1, part * p->grad_bytes);

	/* DeepSpeed agrees on fp16 overflow and on the global gradient norm with one-value
	 * all-reduces: over the data-parallel group (a partitioned stage holds only part of the
	 * gradients), then over the pipeline's stages, each of which holds its own layers'
	 * (stage_1_and_2.py and runtime/utils.py all-reduce over the model-parallel group, of which
	 * the pipe grid's stages are part, as are the tensor-parallel ranks, each of which holds
	 * its shards; Megatron's clip_grad_norm likewise) */
	int fp16 = p->sc->ds.dtype == DT_FP16, clip = p->sc->ds.gradient_clipping > 0;
	/* plain PyTorch's ranks hold the same all-reduced gradients: its GradScaler and
	 * clip_grad_norm_ look at their own, with no all-reduce; FSDP's ShardedGradScaler
	 * all-reduces its inf check over the group, as its clip_grad_norm_ does the norm */
	int ds = p->sc->framework == FRAMEWORK_DEEPSPEED || p->fsdp;
	if (p->fsdp)
		fp16 = fp16 || p->sc->ds.autocast == DT_FP16;
	if (fp16 && ds)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_DP, -1, 1, 4, -1, 0);
	if (fp16)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_TP, -1, 1, 4, -1, 0);
	if (fp16)
		coll(b, COLL_ALL_REDUCE, ROLE_OVERFLOW, GROUP_PP, -1, 1, 4, -1, 0);
	/* (BF16_Optimizer takes the norm of its whole all-reduced gradients on every rank,
	 * all-reduced over the model-parallel group only: the schedule sums the partitions'
	 * squares over dp instead, the same norm for one 4-byte all-reduce more) */
	if (clip && p->stage >= 1) /* FSDP's clip_grad_norm_ over its process group: under
				      HYBRID_SHARD the node's, whose shards make the whole model */
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, p->shard_group, -1, 1, 4, -1, 0);
	if (clip)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_TP, -1, 1, 4, -1, 0);
	if (clip)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_PP, -1, 1, 4, -1, 0);
	/* fp32 without ZeRO the engine clips itself (engine.py clip_fp32_gradients): its
	 * clip_grad_norm_ (runtime/utils.py) then averages the ranks' norms over the data-parallel
	 * group, MoE or not */
	if (clip && p->stage == 0 && !p->mixed && ds)
		coll(b, COLL_ALL_REDUCE, ROLE_GRAD_NORM, GROUP_DP, -1, 1, 4, -1, 0);

	/* stage 3 steps its sub-groups one after another (stage3.py step: _prepare_sub_group,
	 * _optimizer_step, _reassign_or_swap_out_partitioned_parameters, _release_sub_group), each
	 * op stating the sub-group's range; stage 0-2 the partition at once */
	long long whole[1] = {st->part_elems};
	const long long *ends = st->n_subgroups ? st->subgroup_end : whole;
	int n_groups = st->n_subgroups ? st->n_subgroups : 1, ranged = st->n_subgroups > 0;
	for (int k = 0; k < n_groups; k++) {
		long long lo = k ? ends[k - 1] : 0;
		group_step(b, lo, ends[k] - lo, ranged, onebit);
	}

	if (p->stage == 1 || p->stage == 2) {
		for (int i = st->n_buckets - 1; i >= 0; i--)
			slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_DP,
				      st->buckets[i].u_lo, st->buckets[i].padded, p->param_bytes,
				      b->id_params, st->buckets[i].flat_off),
			      i, st->buckets[i].flat_off / p->dp, st->buckets[i].padded / p->dp);
		/* one all_gather_into_tensor per parameter group (runtime/utils.py): the expert
		 * group's flat whole at stage 1, whose reduce-scatter left each rank its contiguous
		 * slice; at stage 2 each block's experts, as their reductions left the slices */
		if (p->stage == 1)
			build_expert_flat(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, st->flat_expert,
					  p->param_bytes, st->flat_dense / p->dp);
		for (int u = 0; p->stage == 2 && u < p->n_units; u++) {
			const UnitPlan *up = &p->units[u];
			if (up->stage == b->stage && up->local_expert > 0)
				slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_EDP, u,
					      up->local_expert, p->param_bytes, -1,
					      b->expert_start[u]),
				      -1, build_expert_part_off(b, u), up->local_expert / p->edp);
		}
	}
	/* FSDP: the Trainer's zero_grad after the step drops the gradient shards (set_to_none) */
	for (int u = 0; p->fsdp && u < p->n_units; u++)
		release(b, &b->fsdp_shard[u]);
	if (p->stage == 3 && st->persist_elems > 0) {
		long long persist = ceil_div(st->persist_elems, p->dp);
		slice(b, coll(b, COLL_ALL_GATHER, ROLE_PARAM_UPDATE, GROUP_DP, -1, persist * p->dp,
			      p->param_bytes, b->id_persist, 0), -1, st->persist_part_off, persist);
	}
}
