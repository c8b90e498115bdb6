/* runner_onebit: DeepSpeed's OnebitAdam (runtime/fp16/onebit/adam.py) in the runner. A run is
 * made of two kinds of step (engine/onebit.h): the warm-up's, whose gradients are all-reduced in
 * full precision and whose update is Adam's without bias correction, and the compressed ones,
 * where the gradients stay this rank's own, each tensor's momentum is updated from them and
 * averaged by the 1-bit compressed all-reduce with error feedback (exec/onebit_comm.c), and the
 * variance stays frozen. Each kind has its schedule (build.c builds the compressed one with
 * plan.onebit_step); the runner runs the one of each step's kind. In fp32 each tensor is
 * exchanged on its own; in fp16 DeepSpeed wraps the optimizer in FP16_Optimizer, whose one fp32
 * flat of all parameters is exchanged whole, its gradients unscaled into fp32 first. What the
 * schedule states is checked against what the kernels count: each compressed all-reduce must name
 * a tensor's place (fp16: the whole flat's) as gpt_cpu lays it out, and the error buffers are
 * sized from the kernels' tensors. */
#include <string.h>
#include <strings.h>

#include "../engine/onebit.h"
#include "../kernels/gpt_cpu.h"
#include "onebit_comm.h"
#include "runner_int.h"

const char *runner_onebit_supported(const Plan *p)
{
	const Scenario *sc = p->sc;
	const OptimKind *k = sc->ds.opt;
	if (!k || k->error_feedback == EF_NONE)
		return NULL;
	if (strcasecmp(k->name, "OneBitAdam"))
		return "OneBitAdam among the 1-bit optimizers (ZeroOneAdam's and OneBitLamb's steps "
		       "are predicted, not run)";
	if (sc->ds.dtype == DT_BF16)
		return "1-bit Adam in fp32 or fp16 (DeepSpeed's 1-bit optimizers run under "
		       "FP16_Optimizer, not bf16's)";
	if (sc->backend != BACKEND_CPU)
		return "1-bit Adam on backend \"cpu\" (its compressed all-reduce works on host "
		       "arrays)";
	if (p->par.tp > 1 || p->par.pp > 1 || sc->model.experts)
		return "1-bit Adam with data parallelism alone";
	return NULL;
}

double runner_onebit_error_bytes(const Runner *r)
{
	long long padded = 0, n = r->n;
	GptTensor t[GPT_CPU_MAX_TENSORS];
	if (r->p->mixed) /* FP16_Optimizer's flat: one pair */
		padded = optim_onebit_padded_elems((long long)gpt_cpu_n_params(&r->cfg), n);
	for (int u = 0; !r->p->mixed && u < r->p->n_units; u++)
		for (int i = 0, k = gpt_cpu_unit_tensors(&r->cfg, u, t); i < k; i++)
			padded += optim_onebit_padded_elems((long long)t[i].numel, n);
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

int runner_set_compressed(Runner *r, Schedule *c, PxError *err)
{
	const Schedule *w = r->s_warm;
	const Plan *p = r->p;
	if (!r->onebit)
		return px_fail(err, PX_ERR_RUNTIME, "a compressed schedule for a plan without a 1-bit "
			       "optimizer");
	if (sched_validate(c, err))
		return -1;
	if (c->rank != w->rank || c->n_bufs != w->n_bufs || c->step_begin != w->step_begin ||
	    memcmp(c->ops, w->ops, (size_t)w->step_begin * sizeof(Op)))
		return px_fail(err, PX_ERR_RUNTIME, "the compressed steps' schedule does not share the "
			       "warm-up's set-up (its allocations)");
	GptTensor t[GPT_CPU_MAX_TENSORS];
	int u = 0, k = 0, nt = 0;
	long long at = 0, covered = 0;
	if (p->mixed) { /* the flat, whole, unpadded between its buckets */
		t[0] = (GptTensor){"the flat of all parameters", gpt_cpu_n_params(&r->cfg)};
		u = p->n_units, nt = 1;
		if (r->own_flat != (long long)t[0].numel)
			return px_fail(err, PX_ERR_RUNTIME, "1-bit Adam in fp16 exchanges the flat of "
				       "all parameters whole; this rank's flat of %lld has padding "
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
			nt = gpt_cpu_unit_tensors(&r->cfg, u, t);
			at = p->units[u++].flat_off;
			k = 0;
		}
		if (check_exchange(r, c, i, at, (long long)t[k].numel, t[k].name, err))
			return -1;
		at += (long long)t[k++].numel;
		covered++;
	}
	if (covered && (k != nt || u != p->n_units))
		return px_fail(err, PX_ERR_RUNTIME, "the compressed step exchanges %lld tensors' "
			       "momenta and leaves the kernels' others out", covered);
	r->s_compressed = c;
	return 0;
}

int runner_onebit_begin_step(Runner *r, PxError *err)
{
	r->exchanged = 0;
	if (!r->onebit)
		return 0;
	r->step_kind = onebit_step_kind(&r->p->sc->ds.onebit, 0, r->opt_steps + 1);
	if (r->step_kind == ONEBIT_COMPRESSED && !r->s_compressed)
		return px_fail(err, PX_ERR_RUNTIME, "step %ld of 1-bit Adam is a compressed one and "
			       "the runner has no compressed schedule (runner_set_compressed)",
			       r->opt_steps + 1);
	r->s = r->step_kind == ONEBIT_COMPRESSED ? r->s_compressed : r->s_warm;
	return 0;
}

int runner_onebit_coll(Runner *r, const Op *op, PxError *err)
{
	if (op->role != ROLE_ONEBIT_SIGNS)
		return 0; /* run with the signs' op */
	const Schedule *s = r->s;
	const SchedSlice *sl = &s->slices[op->slice]; /* runner_set_compressed checked them */
	const Op *server = op + 2;
	const Seg *sg = &r->segs[0]; /* stage 0: the whole flat (runner_onebit_supported) */
	float *m = (float *)r->buf[r->id_states] + sl->part_off, *ef = r->buf[op->buf];
	const void *g = at(sg->grads, sl->part_off - sg->part_off, sg->gdt);
	if (r->have_overflow && r->overflow)
		return 0; /* fp16 overflow: DeepSpeed skips the optimizer's step, exchange and all */
	if (sg->gdt != DT_FP32) { /* FP16_Optimizer's fp32 gradients, which the update reads */
		float *g32 = (float *)r->buf[r->id_grad32] + sl->part_off;
		to_f32(r, g32, g, (size_t)sl->part_elems, sg->gdt);
		g = g32;
	}
	ops_momentum_update(m, g, (size_t)sl->part_elems, r->p->sc->ds.beta1,
			    runner_grad_factor(r, NULL));
	if (onebit_comm_allreduce(r->dp, m, (size_t)sl->part_elems, (size_t)op->elems * 8,
				  ef + op->offset, ef + server->offset, err))
		return -1;
	r->exchanged = 1;
	return 0;
}

void runner_onebit_update(Runner *r, const Seg *sg, float *w, float *m, float *v, const float *g,
			  const OpsAdamw *h, float factor)
{
	OpsOnebitMoments k = r->step_kind == ONEBIT_FULL ? OPS_ONEBIT_BOTH :
			     r->exchanged ? OPS_ONEBIT_NONE : OPS_ONEBIT_MOMENTUM;
	ops_onebit_adam_step(w, m, v, g, (size_t)sg->n, h, k, factor);
}
