#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static long long ceil_div(long long a, long long b)
{
	return (a + b - 1) / b;
}

IdealStates plan_ideal_states(double psi, long long nd, int stage, int p_bytes, int g_bytes,
			      int k_bytes)
{
	IdealStates s;
	double n = (double)nd;
	s.params_bytes = p_bytes * psi / (stage >= 3 ? n : 1);
	s.grads_bytes = g_bytes * psi / (stage >= 2 ? n : 1);
	s.optimizer_bytes = k_bytes * psi / (stage >= 1 ? n : 1);
	s.total_bytes = s.params_bytes + s.grads_bytes + s.optimizer_bytes;
	return s;
}

/* ---- per-unit partitioning and cost ---- */

/* Forward FLOPs of one micro-batch through a unit: 2 per multiply-add of every matrix product, plus
 * the attention products QK^T and AV (2 * 2 * b * s^2 * h). */
static double unit_fwd_flops(const ModelSpec *m, int unit, const UnitPlan *u, long long tokens,
			     long long s)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 2.0 * (double)tokens * (double)u->params;
	if (unit == 0)
		return 0; /* embedding lookups */
	if (unit > m->L) /* LM head (tied or not) or pooler */
		return m->has_lm_head ? 2.0 * (double)tokens * (double)(m->V * m->h) :
					2.0 * (double)tokens * (double)(m->h * m->h);
	double matmul = 0;
	for (int i = 0; i < u->n_tensors; i++)
		if (u->tensor_elems[i] > m->h) /* weights, not biases or norms */
			matmul += (double)u->tensor_elems[i];
	return 2.0 * (double)tokens * matmul + 4.0 * (double)tokens * (double)s * (double)m->h;
}

static void plan_unit(Plan *p, int idx)
{
	const ModelSpec *m = &p->sc->model;
	const DsZero *z = &p->sc->ds.zero;
	UnitPlan *u = &p->units[idx];
	ModelTensor t[MODEL_MAX_TENSORS];

	u->n_tensors = model_unit_tensors(m, idx, t);
	for (int i = 0; i < u->n_tensors; i++) {
		long long n = t[i].numel;
		u->tensor_elems[i] = n;
		u->params += n;
		if (p->stage == 3 && (double)n <= z->persistence_threshold_elems)
			u->persist_elems += n;
		else
			u->part_elems += ceil_div(n, p->dp);
	}
	u->gather_part = u->part_elems;
	u->gather_elems = u->part_elems * p->dp;
	if (p->stage == 3 && idx == model_n_units(m) - 1 && model_tied_elems(m)) {
		/* the tied LM head borrows the token embedding: gathered again for the head */
		long long tied = ceil_div(model_tied_elems(m), p->dp);
		u->gather_part += tied;
		u->gather_elems += tied * p->dp;
	}
	long long tokens = p->shape.s * p->shape.b;
	u->fwd_flops = unit_fwd_flops(m, idx, u, tokens, p->shape.s);
	if (idx >= 1 && idx <= m->L) {
		u->act_bytes = activ_block_bytes(m, &p->shape, p->sc->ckpt);
		u->ckpt_bytes = activ_checkpoint_bytes(m, &p->shape, p->sc->ds.partition_activations);
	} else if (idx == model_n_units(m) - 1) {
		u->act_bytes = activ_ends_bytes(m, &p->shape);
	}
}

static Place offload_place(OffloadDevice d)
{
	return d == DEV_CPU ? PLACE_CPU : d == DEV_NVME ? PLACE_NVME : PLACE_GPU;
}

int plan_build(Plan *p, const Scenario *sc, PxError *err)
{
	const DsConfig *ds = &sc->ds;

	memset(p, 0, sizeof(*p));
	p->sc = sc;
	p->world = cluster_world(&sc->cluster);
	p->dp = p->world; /* tensor, pipeline and expert parallelism arrive later */
	p->stage = ds->zero.stage;
	p->n_params = (long long)llround(sc->model.n_params);

	p->mixed = ds->dtype != DT_FP32;
	p->param_bytes = dtype_bytes(ds->dtype);
	p->grad_bytes = dtype_bytes(ds->grad_dtype);
	p->comm_bytes = dtype_bytes(ds->comm_dtype);
	p->master_bytes = p->mixed ? 4 : 0;
	p->state_bytes = 4 * ds->optimizer_states;
	p->opt_place = offload_place(ds->zero.offload_optimizer.device);
	p->param_place = offload_place(ds->zero.offload_param.device);
	p->ckpt_place = ds->cpu_checkpointing && sc->ckpt == CKPT_FULL ? PLACE_CPU : PLACE_GPU;
	p->reduce_bucket_elems = ds->zero.reduce_bucket_elems;
	p->allgather_bucket_elems = ds->zero.allgather_bucket_elems;

	p->shape = (ActivShape){.s = sc->seq, .b = ds->micro_batch, .t = 1, .sp = 0,
				.elem_bytes = p->param_bytes};
	p->activations_known = sc->model.arch != ARCH_PARAMS_ONLY;

	p->n_units = model_n_units(&sc->model);
	p->units = calloc((size_t)p->n_units, sizeof(*p->units));
	if (!p->units)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < p->n_units; i++) {
		plan_unit(p, i);
		p->persist_elems += p->units[i].persist_elems;
	}

	p->flat_elems = p->stage == 0 ? p->n_params : ceil_div(p->n_params, p->dp) * p->dp;
	if (p->stage == 0)
		p->part_elems = p->n_params;
	else if (p->stage < 3)
		p->part_elems = p->flat_elems / p->dp;
	else {
		/* persistent tensors are still partitioned for the optimizer (DeepSpeed keeps a
		 * partition of every parameter); the rest already are, per tensor */
		p->part_elems = ceil_div(p->persist_elems, p->dp);
		for (int i = 0; i < p->n_units; i++)
			p->part_elems += p->units[i].part_elems;
	}
	return 0;
}

void plan_free(Plan *p)
{
	if (!p)
		return;
	free(p->units);
	p->units = NULL;
}
