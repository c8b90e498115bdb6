/* build_fsdp: PyTorch FSDP's units in a schedule (build_priv.h): their gathers, reshards and
 * per-unit reduce-scatters as torch's FSDP1 hooks run them, no_sync's kept gradients. The
 * stage-3 gathers themselves are build.c's. */
#include "build_priv.h"

/* ---- FSDP (Plan.fsdp): FullyShardedDataParallel's units, as torch's FSDP1 runs them
 * (torch/distributed/fsdp/_runtime_utils.py). Each transformer layer is a unit; the root unit holds
 * the rest (the model's first and last units: the embedding, the final norm and the head), one
 * flat gathered before the first unit's forward and kept until the backward ends
 * (_post_forward_reshard does not free the root's). ---- */

static int fsdp_is_root(const Plan *p, int u)
{
	return u == 0 || u == p->n_units - 1;
}

/* FSDP: the tied embedding's elements whose gradient the head makes (its lm_head reads the
 * embedding the root holds once), 0 for other units or an untied head. */
long long build_fsdp_tied(const Plan *p, int u)
{
	return p->fsdp && u == p->n_units - 1 ? tied_local(p) : 0;
}

/* The next layer after u in direction dir (+1, -1) with a flat of its own (a layer the auto-wrap
 * policy leaves wholly to the root has none), or -1 at the model's ends. */
static int next_own(const Plan *p, int u, int dir)
{
	for (u += dir; u >= 1 && u < p->n_units - 1; u += dir)
		if (p->units[u].own_gather > 0)
			return u;
	return -1;
}

/* Before unit u's forward: its flat (the root's two units at the first), and the next layer's,
 * which the host issues while the device computes this one (limit_all_gathers lets it run one
 * unit ahead; forward_prefetch asks for the same). */
void build_fsdp_forward_gather(Builder *b, int u)
{
	int last = b->p->n_units - 1, next = next_own(b->p, u, 1);
	build_gather(b, u, 0);
	if (u == 0)
		build_gather(b, last, 0);
	if (next >= 0)
		build_gather(b, next, 0);
}

/* After unit u's forward: FULL_SHARD frees a layer's gathered flat (reshard after forward);
 * SHARD_GRAD_OP keeps it for the backward. */
void build_fsdp_forward_done(Builder *b, int u)
{
	const Plan *p = b->p;
	if (!scenario_fsdp_reshards(p->sc->fsdp.sharding) || fsdp_is_root(p, u) ||
	    p->units[u].own_gather == 0)
		return;
	if (p->fsdp2 && p->hpz > 1 && b->fsdp_post[u] < 0) /* reshard_after_forward N: 1/N kept */
		b->fsdp_post[u] = alloc(b, PLACE_GPU, CAT_PARAMS, BUF_FSDP_POST_FORWARD, u,
					(double)(p->units[u].gather_dense / p->hpz) * p->param_bytes);
	build_ungather(b, u);
}

/* Unit u gathered for its backward (FSDP2 with reshard_after_forward N: from the 1/N kept over N
 * ranks, build_gather's secondary gather, which then goes). */
static void fsdp_gather_back(Builder *b, int u)
{
	build_gather(b, u, 1);
	release(b, &b->fsdp_post[u]);
}

/* Before unit u's backward: its flat (gathered again under FULL_SHARD), and under BACKWARD_PRE the
 * next unit's in backward order, issued by u's pre-backward hook (_prefetch_handles). */
void build_fsdp_backward_gather(Builder *b, int u)
{
	int next = next_own(b->p, u, -1);
	fsdp_gather_back(b, u);
	if (b->p->sc->fsdp.backward_prefetch == FSDP_BACKWARD_PRE && next >= 0)
		fsdp_gather_back(b, next);
}

/* Unit u's gradients are whole: its post-backward hook frees its gathered flat (both strategies
 * when it reduces; under no_sync SHARD_GRAD_OP keeps it: _should_free_in_backward), and under
 * BACKWARD_POST gathers the next unit. The root's hook runs once, after its first unit's
 * backward. */
static void fsdp_reshard(Builder *b, int u)
{
	const Plan *p = b->p;
	if (u == p->n_units - 1)
		return;
	if (scenario_fsdp_reshards(p->sc->fsdp.sharding) || b->fsdp_sync) {
		build_ungather(b, u);
		if (u == 0)
			build_ungather(b, p->n_units - 1);
	}
	int next = next_own(p, u, -1);
	if (p->sc->fsdp.backward_prefetch == FSDP_BACKWARD_POST && next >= 0)
		fsdp_gather_back(b, next);
}

/* One reduce-scatter of unit u's flat gradient, held in buf from element off, over the
 * data-parallel group in param_dtype (_post_backward_hook): the output shard (new_sharded_grad),
 * cast to the shard's dtype (_cast_grad_to_param_dtype), becomes the unit's gradient shard the
 * first time and is added into it after. */
static void fsdp_reduce(Builder *b, int u, int buf, long long off)
{
	const Plan *p = b->p;
	const UnitPlan *up = &p->units[u];
	double mine = (double)up->part_dense;
	int first = b->fsdp_shard[u] < 0, same = p->comm_bytes == p->shard_bytes;
	/* the shard is allocated first: in the reduce dtype FSDP casts the output into it, both
	 * live at that moment; the executor adds the reduced slice straight in
	 * (exec/runner_coll.c) */
	if (first)
		b->fsdp_shard[u] = alloc(b, PLACE_GPU, CAT_GRADS, BUF_GRAD_PART, u,
					 mine * p->shard_bytes);
	int out = first && same ? -1 : alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_REDUCED, u,
					      mine * p->comm_bytes);
	slice(b, coll(b, COLL_REDUCE_SCATTER, ROLE_GRAD_REDUCE, p->shard_group, u, up->own_gather,
		      p->comm_bytes, buf, off), -1, up->part_off, up->part_dense);
	if (p->shard_group == GROUP_NODE) /* HYBRID_SHARD: the shard summed over the replicas
					     (allreduce_hook on new_sharded_grad) */
		slice(b, coll(b, COLL_ALL_REDUCE, ROLE_GRAD_REDUCE, GROUP_XNODE, u, up->part_dense,
			      p->comm_bytes, first && same ? b->fsdp_shard[u] : out, 0),
		      -1, up->part_off, up->part_dense);
	int cast = !first && !same ? alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_REDUCED, u,
					   mine * p->shard_bytes) : -1;
	release(b, &out);
	if (!first) { /* into the shard (the op names it: sched_grads_to) */
		compute_moving(b, COMP_GRAD_ACCUM, u, mine, 3 * mine * p->shard_bytes);
		if (!b->oom)
			sched_grads_to(b->s, b->fsdp_shard[u], 0);
	}
	release(b, &cast);
	if (p->opt_place != PLACE_GPU) /* CPUOffload: _cpu_grad.copy_(the shard) */
		copy(b, COPY_D2H, ROLE_GRAD_REDUCE, u, mine * p->shard_bytes);
}

/* Unit u's gradients after its backward, held in b->own_grads (its tensors' .grad, autograd's
 * separate pieces until the unit is done): autograd's cat of them into the flat's gradient (the
 * split's backward: a whole flat beside them for a moment), added in place into the one kept
 * under no_sync; then the hook frees the gathered weights and, when this micro-batch reduces,
 * reduce-scatters it and frees it, or under no_sync keeps it. The root's last unit waits for
 * its first. A layer's gradients of what it leaves to the root (plan_fsdp_wrap) stay as pieces
 * until the root's hook cats them into its flat. */
void build_fsdp_unit_grads(Builder *b, int u)
{
	const Plan *p = b->p;
	int last = p->n_units - 1;
	if (u == last) {
		b->fsdp_head = b->own_grads;
		b->own_grads = -1;
		return;
	}
	double elems = (double)(p->units[u].own_gather + (u == 0 ? p->units[last].own_gather : 0));
	int flat = elems > 0 ? alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_UNSHARDED, u,
				     elems * p->grad_bytes) : -1;
	release(b, &b->own_grads);
	if (p->units[u].fsdp_left > 0 && b->fsdp_left[u] < 0) /* the pieces the cat left */
		b->fsdp_left[u] = alloc(b, PLACE_GPU, CAT_GRADS, BUF_FSDP_ROOT_GRADS, u,
					(double)p->units[u].fsdp_left * p->grad_bytes);
	if (flat < 0) /* a layer wholly the root's: no hook of its own */
		return;
	if (u == 0) {
		release(b, &b->fsdp_head);
		for (int k = 1; k < last; k++)
			release(b, &b->fsdp_left[k]);
	}
	if (b->fsdp_acc[u] >= 0) { /* AccumulateGrad adds the new one into .grad, the op's */
		compute_moving(b, COMP_GRAD_ACCUM, u, elems, 3 * elems * p->grad_bytes);
		if (!b->oom)
			sched_grads_to(b->s, b->fsdp_acc[u], 0);
		release(b, &flat);
		flat = b->fsdp_acc[u];
		b->fsdp_acc[u] = -1;
	}
	fsdp_reshard(b, u);
	if (!b->fsdp_sync) {
		b->fsdp_acc[u] = flat;
		return;
	}
	fsdp_reduce(b, u, flat, 0);
	if (u == 0)
		fsdp_reduce(b, last, flat, p->units[0].own_gather);
	release(b, &flat);
}
