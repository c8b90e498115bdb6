/* runner_lamb: DeepSpeed's OnebitLamb (runtime/fp16/onebit/lamb.py) in the runner, on the one
 * flat of fused momenta its compressed all-reduce exchanges (build_step.c: one exchange of the
 * stage's flat). Its warm-up steps all-reduce the gradients in full and update each tensor as LAMB
 * without bias correction, averaging each tensor's LAMB coefficient; its compressed steps copy
 * the momenta (the schedule's step temporary, BUF_OPT_STEP_TEMP), update each tensor's momentum
 * from this rank's gradients and scale it by the tensor's coefficient (set once, at the first
 * compressed step, to bring every tensor's momentum to the mean scale), average the flat through
 * the compressed all-reduce, then update each tensor with its frozen coefficient times a factor
 * from the fresh variance that the rebuilt gradients keep (kernels/lamb_cpu.c). The tensors are
 * this rank's (runner_onebit_tensors: its shards, its stage's) at their units' places in the
 * flat, each tensor's norms its own, as DeepSpeed takes them on each rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/onebit.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/lamb_cpu.h"
#include "../kernels/ops_cpu.h"
#include "onebit_comm.h"
#include "runner_int.h"

int runner_lamb_create(Runner *r, PxError *err)
{
	GptTensor t[GPT_CPU_MAX_TENSORS + 1];
	int n = 0;
	for (int u = 0; u < r->p->n_units; u++)
		n += runner_onebit_tensors(r, u, t);
	r->n_lamb = n;
	r->lamb_scaling = calloc((size_t)n, sizeof(float));
	r->lamb_coeff = calloc((size_t)n, sizeof(double));
	r->lamb_last = malloc((size_t)n * sizeof(double));
	r->lamb_off = malloc((size_t)n * sizeof(long long));
	r->lamb_n = malloc((size_t)n * sizeof(size_t));
	if (!r->lamb_scaling || !r->lamb_coeff || !r->lamb_last || !r->lamb_off || !r->lamb_n)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory for 1-bit LAMB's coefficients");
	int k = 0; /* the kernels' tensors at their units' places in the flat */
	for (int u = 0; u < r->p->n_units; u++) {
		long long at = r->p->units[u].flat_off;
		for (int i = 0, nt = runner_onebit_tensors(r, u, t); i < nt; i++, k++) {
			r->lamb_off[k] = at, r->lamb_n[k] = t[i].numel;
			r->lamb_last[k] = 1.0; /* lamb.py: state['last_factor'] = 1.0 */
			at += (long long)t[i].numel;
		}
	}
	return 0;
}

void runner_lamb_free(Runner *r)
{
	free(r->lamb_scaling);
	free(r->lamb_coeff);
	free(r->lamb_last);
	free(r->lamb_off);
	free(r->lamb_n);
}

static LambHyper hyper(const Runner *r, double lr)
{
	const DsConfig *ds = &r->p->sc->ds;
	const OneBitParams *o = &ds->onebit;
	return (LambHyper){lr, ds->beta1, ds->beta2, ds->eps, ds->weight_decay, o->max_coeff,
			   o->min_coeff, o->coeff_beta, o->factor_max, o->factor_min,
			   o->factor_threshold};
}

/* The compressed step's arrays: weights (the fp32 master's in fp16), the three states, the copy
 * of the momenta. */
typedef struct LambArrays {
	float *w, *m, *v, *vf, *m_last;
} LambArrays;

static LambArrays arrays(Runner *r)
{
	long long part = r->st->part_elems;
	float *m = r->buf[r->id_states];
	float *w = r->p->mixed ? (float *)r->buf[r->id_master] : (float *)r->segs[0].params;
	float *last = r->id_step_temp >= 0 ? r->buf[r->id_step_temp] : NULL;
	return (LambArrays){w, m, m + part, m + 2 * part, last};
}

/* Before the exchange: the momenta copied, each tensor's scaling set at the first compressed
 * step, each momentum updated from g (fp32, scaled by factor) and scaled. */
static void compressed_begin(Runner *r, const LambArrays *a, const float *g, float factor)
{
	long long part = r->st->part_elems;
	memcpy(a->m_last, a->m, (size_t)part * sizeof(float));
	if (!r->have_scaling) { /* lamb.py: united_scale / this momentum's rms */
		double united = 0;
		for (int k = 0; k < r->n_lamb; k++) {
			double rms = sqrt(ops_sum_squares(a->m + r->lamb_off[k], r->lamb_n[k]) /
					  (double)r->lamb_n[k]);
			r->lamb_scaling[k] = (float)rms;
			united += rms;
		}
		united /= r->n_lamb;
		for (int k = 0; k < r->n_lamb; k++)
			r->lamb_scaling[k] = (float)(united / r->lamb_scaling[k]);
		r->have_scaling = 1;
	}
	for (int k = 0; k < r->n_lamb; k++)
		lamb_cpu_momentum(a->m + r->lamb_off[k], g + r->lamb_off[k], r->lamb_n[k],
				  r->p->sc->ds.beta1, factor, r->lamb_scaling[k]);
}

/* After the exchange: each tensor unscaled and updated. */
static void compressed_end(Runner *r, const LambArrays *a, double lr)
{
	LambHyper h = hyper(r, lr);
	for (int k = 0; k < r->n_lamb; k++) {
		long long o = r->lamb_off[k];
		lamb_cpu_compressed(a->w + o, a->m + o, a->m_last + o, a->v + o, a->vf + o,
				    r->lamb_n[k], &h, r->lamb_scaling[k], r->lamb_coeff[k],
				    &r->lamb_last[k]);
	}
}

int runner_lamb_check(const Schedule *c, PxError *err)
{
	return runner_check_step_temp(c, 1, "1-bit LAMB's compressed step", "copy of the momenta",
				      err);
}

int runner_lamb_exchange(Runner *r, const Op *op, PxError *err)
{
	LambArrays a = arrays(r);
	const SchedSlice *sl = &r->s->slices[op->slice];
	float *ef = r->buf[op->buf];
	compressed_begin(r, &a, runner_onebit_grads(r, sl), runner_grad_factor(r, NULL));
	if (onebit_comm_allreduce(r->dp, a.m + sl->part_off, (size_t)sl->part_elems,
				  (size_t)op->elems * 8, ef + op->offset, ef + (op + 2)->offset, err))
		return -1;
	compressed_end(r, &a, dsconfig_lr(&r->p->sc->ds, r->opt_steps + 1));
	return 0;
}

void runner_lamb_update(Runner *r, const float *g, const OpsAdamw *h, float factor)
{
	if (r->exchanged)
		return; /* a compressed step: updated with its exchange */
	LambArrays a = arrays(r);
	if (r->step_kind == ONEBIT_COMPRESSED) { /* one rank: nothing to exchange */
		compressed_begin(r, &a, g, factor);
		compressed_end(r, &a, h->lr);
		return;
	}
	LambHyper lh = hyper(r, h->lr);
	int fresh = r->opt_steps == r->p->sc->ds.onebit.freeze_step;
	for (int k = 0; k < r->n_lamb; k++) {
		long long o = r->lamb_off[k];
		lamb_cpu_warmup(a.w + o, a.m + o, a.v + o, a.vf + o, g + o, r->lamb_n[k], &lh, factor,
				fresh, &r->lamb_coeff[k]);
	}
}
