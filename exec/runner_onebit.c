/* runner_onebit: DeepSpeed's OnebitAdam (runtime/fp16/onebit/adam.py) and ZeroOneAdam
 * (zoadam.py) in the runner. A run is made of kinds of step (engine/onebit.h), each with its
 * schedule (build_step.c builds them with plan.onebit_step); the runner runs the one of each step's
 * kind.
 * - 1-bit Adam: the warm-up's steps all-reduce the gradients in full precision and update as Adam
 *   without bias correction; the compressed ones keep each rank's own gradients, update each
 *   tensor's momentum from them, average it by the 1-bit compressed all-reduce with error
 *   feedback (exec/onebit_comm.c), and leave the variance frozen.
 * - 0/1 Adam: until var_freeze_step, a step either all-reduces the gradients in full and updates
 *   both moments, or averages this rank's gradients through the compressed all-reduce (into the
 *   momentum accumulator, idle then) and updates the momentum alone. After it, with the variance
 *   frozen, each step updates the weights from this rank's gradients and adds the update to the
 *   accumulator; every local_step_interval-th step synchronises: the weights go back to the last
 *   synchronisation's, the accumulator (times sqrt(v) + eps) is averaged through the compressed
 *   all-reduce, and the momentum and weights are set from it (kernels/ops_cpu.h
 *   ops_zero_one_step). The error buffers are zeroed where the variance freezes.
 * In fp32 each tensor is exchanged on its own; in fp16 DeepSpeed wraps the optimizer in
 * FP16_Optimizer, whose one fp32 flat of the stage's parameters is exchanged whole, its gradients
 * unscaled into fp32 first. Beside tensor and pipeline parallelism the exchanges run over the
 * data-parallel group on this rank's tensors: its shards, its stage's (runner_onebit_tensors). What the schedule states is checked against what the kernels count: each
 * compressed all-reduce must name a tensor's place (fp16: the whole flat's) as gpt_cpu lays it
 * out, and the error buffers are sized from the kernels' tensors. */
#include <string.h>
#include <strings.h>

#include "../engine/onebit.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/gpt_tp_cpu.h"
#include "onebit_comm.h"
#include "runner_int.h"

const char *runner_onebit_supported(const Plan *p)
{
	const Scenario *sc = p->sc;
	const OptimKind *k = sc->ds.opt;
	if (!k || k->error_feedback == EF_NONE)
		return NULL;
	if (sc->backend != BACKEND_CPU)
		return "the 1-bit optimizers on backend \"cpu\" (their compressed all-reduce works on "
		       "host arrays)";
	if (sc->model.experts)
		return "the 1-bit optimizers without experts";
	return NULL;
}

int runner_onebit_tensors(const Runner *r, int u, GptTensor t[GPT_CPU_MAX_TENSORS + 1])
{
	if (r->p->units[u].stage != r->stage)
		return 0;
	int n = gpt_tp_unit_tensors(&r->cfg, r->gtp.t, u, t);
	if (u == r->head && r->n_stages > 1)
		t[n++] = (GptTensor){"the head's copy of embed.tokens", tied_elems(r)};
	return n;
}

double runner_onebit_error_bytes(const Runner *r)
{
	long long padded = 0, n = r->n, flat = 0;
	GptTensor t[GPT_CPU_MAX_TENSORS + 1];
	for (int u = 0; u < r->p->n_units; u++)
		for (int i = 0, k = runner_onebit_tensors(r, u, t); i < k; i++) {
			flat += (long long)t[i].numel;
			if (!r->p->mixed && !r->lamb)
				padded += optim_onebit_padded_elems((long long)t[i].numel, n);
		}
	if (r->p->mixed || r->lamb) /* FP16_Optimizer's flat, 1-bit LAMB's fused momenta: one pair */
		padded = optim_onebit_padded_elems(flat, n);
	/* every padded size divides by n: the server errors, one chunk of each, sum to padded / n */
	return 4.0 * (double)padded + 4.0 * (double)(padded / n);
}

/* Compressed all-reduce op i of s (its signs' op) against the kernels' tensor at element at of
 * the partition (numel elements, named name): its slice, the three ops after it, its error
 * buffer's room. */
static int check_exchange(const Runner *r, const Schedule *s, int i, long long at, long long numel,
			  const char *name, PxError *err)
{
	const Op *op = &s->ops[i];
	const SchedSlice *sl = op->slice >= 0 ? &s->slices[op->slice] : NULL;
	if (!sl || sl->part_off != at || sl->part_elems != numel)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a compressed all-reduce of %lld "
			       "elements at %lld; the kernels' next tensor, %s, has %lld at %lld",
			       i, sl ? (long long)sl->part_elems : -1LL,
			       sl ? (long long)sl->part_off : -1LL, name, numel, at);
	static const OpRole after[3] = {ROLE_ONEBIT_SCALES, ROLE_ONEBIT_SERVER_SIGNS,
					ROLE_ONEBIT_SERVER_SCALES};
	for (int k = 0; k < 3; k++)
		if (i + 1 + k >= s->n || s->ops[i + 1 + k].kind != OP_COLL ||
		    s->ops[i + 1 + k].role != after[k])
			return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a compressed all-reduce's "
				       "signs not followed by its scales, the server's signs and its "
				       "scales", i);
	const Op *server = &s->ops[i + 2];
	long long padded = op->elems * 8, n = r->n;
	double room = op->buf >= 0 && server->buf == op->buf ? (double)r->size[op->buf] / 4 : -1;
	if (padded < numel || padded % (8 * n) || op->offset + padded > room ||
	    server->offset + padded / n > room)
		return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a compressed all-reduce of %lld "
			       "elements padded to %lld, its errors at %lld and %lld of a buffer of "
			       "%.0f: not a padding of 8 x %lld ranks inside the error buffer", i,
			       numel, padded, (long long)op->offset, (long long)server->offset, room, n);
	return 0;
}

/* Schedule c of a step kind shares the warm-up's set-up (its allocations, whose ids come first);
 * its step may allocate other buffers (1-bit LAMB's compressed steps copy the momenta; the
 * warm-up's engine flattens its buckets), for which the runner makes room. */
static int shares_setup(Runner *r, Schedule *c, PxError *err)
{
	const Schedule *w = r->s_warm;
	if (sched_validate(c, err))
		return -1;
	if (c->rank != w->rank || c->step_begin != w->step_begin ||
	    memcmp(c->ops, w->ops, (size_t)w->step_begin * sizeof(Op)))
		return px_fail(err, PX_ERR_RUNTIME, "a 1-bit optimizer's step kind's schedule does not "
			       "share the warm-up's set-up (its allocations)");
	if (runner_grow_bufs(r, c->n_bufs))
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	return 0;
}

/* Each compressed all-reduce of c names the next of the kernels' tensors (fp16: the flat), and
 * they cover them all (or c has none: one rank). */
static int check_compressed(const Runner *r, const Schedule *c, PxError *err)
{
	const Plan *p = r->p;
	GptTensor t[GPT_CPU_MAX_TENSORS + 1];
	int u = 0, k = 0, nt = 0;
	long long at = 0, covered = 0;
	if (p->mixed || r->lamb) { /* the flat, whole, unpadded between its buckets */
		long long flat = 0;
		for (int v = 0; v < p->n_units; v++)
			for (int i = 0, nv = runner_onebit_tensors(r, v, t); i < nv; i++)
				flat += (long long)t[i].numel;
		t[0] = (GptTensor){"the flat of the stage's parameters", (size_t)flat};
		u = p->n_units, nt = 1;
		if (r->own_flat != (long long)t[0].numel)
			return px_fail(err, PX_ERR_RUNTIME, "1-bit LAMB and the 1-bit optimizers in fp16 "
				       "exchange the flat of all parameters whole; this rank's flat of "
				       "%lld has padding "
				       "between its buckets (%lld parameters)", r->own_flat,
				       (long long)t[0].numel);
	}
	for (int i = c->step_begin; i < c->n; i++) {
		if (c->ops[i].kind != OP_COLL || c->ops[i].role != ROLE_ONEBIT_SIGNS)
			continue;
		while (k == nt) { /* the next unit's tensors, where the plan places the unit */
			if (u == p->n_units)
				return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a compressed "
					       "all-reduce past the kernels' last tensor", i);
			nt = runner_onebit_tensors(r, u, t);
			at = p->units[u++].flat_off;
			k = 0;
		}
		if (check_exchange(r, c, i, at, (long long)t[k].numel, t[k].name, err))
			return -1;
		at += (long long)t[k++].numel;
		covered++;
	}
	while (u < p->n_units && !runner_onebit_tensors(r, u, t)) /* the later stages' units */
		u++;
	if (covered && (k != nt || u != p->n_units))
		return px_fail(err, PX_ERR_RUNTIME, "the compressed step exchanges %lld tensors' "
			       "momenta and leaves the kernels' others out", covered);
	return 0;
}

int runner_set_onebit(Runner *r, int kind, Schedule *c, PxError *err)
{
	if (!r->onebit)
		return px_fail(err, PX_ERR_RUNTIME, "a 1-bit step kind's schedule for a plan without a "
			       "1-bit optimizer");
	if (kind <= ONEBIT_FULL || kind >= N_ONEBIT_STEPS ||
	    !onebit_has_kind(r->zero_one, (OneBitStep)kind))
		return px_fail(err, PX_ERR_RUNTIME, "a schedule for 1-bit step kind %d, which %s does "
			       "not take", kind, r->p->sc->ds.opt->name);
	if (shares_setup(r, c, err))
		return -1;
	if (kind == ONEBIT_LOCAL) {
		for (int i = c->step_begin; i < c->n; i++) /* fp16's overflow flag still travels */
			if (c->ops[i].kind == OP_COLL && (c->ops[i].role == ROLE_GRAD_REDUCE ||
							  c->ops[i].role == ROLE_ONEBIT_SIGNS))
				return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: a local step of "
					       "0/1 Adam exchanges gradients or momenta (%s)", i,
					       coll_name(c->ops[i].sub));
		r->s_local = c;
		return 0;
	}
	if (check_compressed(r, c, err))
		return -1;
	if (kind == ONEBIT_INIT) {
		r->s_init = c;
		return 0;
	}
	if (r->lamb && runner_lamb_check(c, err))
		return -1;
	r->s_compressed = c;
	return 0;
}

int runner_onebit_begin_step(Runner *r, PxError *err)
{
	r->exchanged = 0;
	if (!r->onebit)
		return 0;
	long long step = r->opt_steps + 1;
	const OneBitParams *o = &r->p->sc->ds.onebit;
	r->step_kind = onebit_step_kind(o, r->zero_one, step);
	r->frozen = r->zero_one && onebit_zero_one_frozen(o, step);
	const Schedule *s = r->step_kind == ONEBIT_COMPRESSED ? r->s_compressed :
			    r->step_kind == ONEBIT_LOCAL ? r->s_local :
			    r->step_kind == ONEBIT_INIT ? r->s_init : r->s_warm;
	if (!s)
		return px_fail(err, PX_ERR_RUNTIME, "step %lld of %s is a%s %s one and the runner has "
			       "no schedule for it (runner_set_onebit)", step, r->p->sc->ds.opt->name,
			       r->step_kind == ONEBIT_INIT ? "n" : "",
			       onebit_step_name((OneBitStep)r->step_kind));
	r->s = s;
	return 0;
}

const float *runner_onebit_grads(Runner *r, const SchedSlice *sl)
{
	const Seg *sg = &r->segs[0]; /* stage 0: the whole flat (runner_onebit_supported) */
	const void *g = at(sg->grads, sl->part_off - sg->part_off, sg->gdt);
	if (sg->gdt == DT_FP32)
		return g;
	float *g32 = (float *)r->buf[r->id_grad32] + sl->part_off;
	to_f32(r, g32, g, (size_t)sl->part_elems, sg->gdt);
	return g32;
}

/* The weights the update of a slice of the partition moves (fp16: the fp32 master's). */
static float *slice_weights(Runner *r, const SchedSlice *sl)
{
	const Seg *sg = &r->segs[0];
	return r->p->mixed ? (float *)r->buf[r->id_master] + sl->part_off :
			     (float *)sg->params + (sl->part_off - sg->part_off);
}

/* 0/1 Adam's synchronising step on n elements: the local update, then the accumulator u averaged
 * by the compressed all-reduce op (NULL on one rank: nothing to average), then the momentum and
 * weights set from it (zoadam.py). */
static int zero_one_sync(Runner *r, const Op *op, float *w, float *m, const float *v, float *u,
			 const float *g, size_t n, const OpsAdamw *h, float factor, PxError *err)
{
	ops_zero_one_step(w, m, v, u, g, n, h, OPS_ZO_LOCAL, factor, 0);
	ops_zero_one_step(w, m, v, u, NULL, n, h, OPS_ZO_SYNC_BEGIN, 1.0f, 0);
	if (op) {
		float *ef = r->buf[op->buf];
		if (onebit_comm_allreduce(r->dp, u, n, (size_t)op->elems * 8, ef + op->offset,
					  ef + (op + 2)->offset, err))
			return -1;
	}
	ops_zero_one_step(w, m, v, u, NULL, n, h, OPS_ZO_SYNC_END, 1.0f, r->lrs + h->lr);
	return 0;
}

int runner_onebit_coll(Runner *r, const Op *op, PxError *err)
{
	if (op->role != ROLE_ONEBIT_SIGNS)
		return 0; /* run with the signs' op */
	if (r->have_overflow && r->overflow)
		return 0; /* fp16 overflow: DeepSpeed skips the optimizer's step, exchange and all */
	r->exchanged = 1;
	const SchedSlice *sl = &r->s->slices[op->slice]; /* runner_set_onebit checked them */
	const DsConfig *ds = &r->p->sc->ds;
	size_t n = (size_t)sl->part_elems, padded = (size_t)op->elems * 8;
	long long part = r->st->part_elems;
	float *m = (float *)r->buf[r->id_states] + sl->part_off, *v = m + part, *u = v + part;
	float *ef = r->buf[op->buf], *we = ef + op->offset, *se = ef + (op + 2)->offset;
	if (r->step_kind == ONEBIT_INIT) /* what the optimizer exchanges as it sets up its error
					    buffers, still zero: 1-bit Adam's and LAMB's momenta,
					    0/1 Adam's accumulator; no moment moves */
		return onebit_comm_allreduce(r->dp, r->zero_one ? u : m, n, padded, we, se, err);
	if (r->lamb)
		return runner_lamb_exchange(r, op, err);
	const float *g = runner_onebit_grads(r, sl);
	float factor = runner_grad_factor(r, NULL);
	if (!r->zero_one) { /* 1-bit Adam: the momentum, updated here, averaged */
		ops_momentum_update(m, g, n, ds->beta1, factor);
		return onebit_comm_allreduce(r->dp, m, n, padded, we, se, err);
	}
	if (!r->frozen) { /* this rank's gradients averaged through the idle accumulator */
		for (size_t k = 0; k < n; k++)
			u[k] = g[k] * factor;
		if (onebit_comm_allreduce(r->dp, u, n, padded, we, se, err))
			return -1;
		ops_momentum_update(m, u, n, ds->beta1, 1.0f);
		memset(u, 0, n * sizeof(float));
		return 0;
	}
	double lr = dsconfig_lr(ds, r->opt_steps + 1);
	OpsAdamw h = {lr, ds->beta1, ds->beta2, ds->eps, ds->weight_decay};
	return zero_one_sync(r, op, slice_weights(r, sl), m, v, u, g, n, &h, factor, err);
}

void runner_onebit_update(Runner *r, const Seg *sg, float *w, float *m, float *v, const float *g,
			  const OpsAdamw *h, float factor)
{
	if (r->lamb) {
		runner_lamb_update(r, g, h, factor);
		return;
	}
	size_t n = (size_t)sg->n;
	float *u = v + r->st->part_elems;
	if (r->zero_one && r->frozen) {
		if (r->exchanged)
			return; /* a synchronising step: updated with its exchange */
		if (r->step_kind == ONEBIT_COMPRESSED) /* one rank synchronises with itself */
			zero_one_sync(r, NULL, w, m, v, u, g, n, h, factor, NULL);
		else
			ops_zero_one_step(w, m, v, u, g, n, h, OPS_ZO_LOCAL, factor, 0);
		return;
	}
	/* a compressed step's moments were updated with its exchange; on one rank 1-bit Adam
	 * updates its momentum from the gradients and 0/1 Adam neither moment (zoadam.py compresses
	 * and updates under `if self.size > 1`) */
	OpsOnebitMoments k = r->step_kind == ONEBIT_FULL ? OPS_ONEBIT_BOTH :
			     r->exchanged || r->zero_one ? OPS_ONEBIT_NONE : OPS_ONEBIT_MOMENTUM;
	ops_onebit_adam_step(w, m, v, g, n, h, k, factor);
}

void runner_onebit_step_done(Runner *r, double lr)
{
	if (!r->zero_one)
		return;
	if (r->frozen)
		r->lrs = r->step_kind == ONEBIT_COMPRESSED ? 0 : r->lrs + lr;
	const OneBitParams *o = &r->p->sc->ds.onebit;
	if (!r->frozen && onebit_zero_one_frozen(o, r->opt_steps + 1) && r->id_errors >= 0)
		zero(r, r->id_errors); /* zoadam.py: reinitial_error_buffer */
}
