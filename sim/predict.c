#include "predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 1-bit optimizer's kinds of step hold different buffers (1-bit LAMB copies its momenta in
 * compressed steps only: lamb.py exp_avg_last_step), so stage s's memory is its highest kind's:
 * into *own the schedule of the kind whose GPU peak is highest, if not the warm-up's (the
 * prediction's own, sp->sched), with sp->mem its replay but each category's own peak the
 * highest over the kinds. *own is left empty (n 0) when the warm-up's is the highest. */
static int onebit_memory(Prediction *pr, int s, Schedule *own, PxError *err)
{
	Plan *p = &pr->plan;
	StagePrediction *sp = &pr->stages[s];
	const OptimKind *ok = p->sc->ds.opt;
	memset(own, 0, sizeof(*own));
	if (!ok || ok->error_feedback == EF_NONE || p->dp < 2)
		return 0;
	for (int k = ONEBIT_COMPRESSED; k < N_ONEBIT_STEPS; k++) {
		if (!onebit_has_kind(optim_zero_one(ok), k))
			continue;
		Schedule sk;
		MemResult m;
		p->onebit_step = k;
		int rc = build_schedule(p, s, &sk, err);
		p->onebit_step = ONEBIT_FULL;
		if (rc || sim_memory(&sk, &m, NULL, NULL, err)) {
			if (!rc)
				sched_free(&sk);
			return -1;
		}
		for (int pl = 0; pl < N_PLACES; pl++)
			for (int c = 0; c < N_CATS; c++)
				m.place[pl].cat_peak[c] = fmax(m.place[pl].cat_peak[c],
							       sp->mem.place[pl].cat_peak[c]);
		if (m.place[PLACE_GPU].peak_bytes <= sp->mem.place[PLACE_GPU].peak_bytes) {
			for (int pl = 0; pl < N_PLACES; pl++)
				memcpy(sp->mem.place[pl].cat_peak, m.place[pl].cat_peak,
				       sizeof(m.place[pl].cat_peak));
			sched_free(&sk);
			continue;
		}
		sp->mem = m;
		if (own->n)
			sched_free(own);
		*own = sk;
	}
	return 0;
}

static int price_stage(Prediction *pr, int s, int traffic, PxError *err)
{
	const Plan *p = &pr->plan;
	StagePrediction *sp = &pr->stages[s];
	Schedule kind;
	if (build_schedule(p, s, &sp->sched, err) || sim_memory(&sp->sched, &sp->mem, NULL, NULL, err) ||
	    onebit_memory(pr, s, &kind, err))
		return -1;
	Schedule *mem_sched = kind.n ? &kind : &sp->sched; /* the one whose peak is the memory's */
	int rc = traffic ? sim_traffic(&sp->sched, p->spans, p->par.algo,
				       p->sc->cluster.gpus_per_node, &sp->traffic, err) : 0;
	if (!rc && traffic) { /* the executor's: with PX_CUDA_ALLOC or PX_CPU_ALLOC=caching */
		rc = alloc_replay(mem_sched, p->sc->backend != BACKEND_GPU, &p->sc->alloc_conf,
				  &sp->alloc, err);
		sp->alloc_known = !rc;
	}
	if (!rc)
		moment_find(p, mem_sched, &sp->mem, PLACE_GPU, &sp->gpu_moment);
	if (kind.n)
		sched_free(&kind);
	if (rc)
		return -1;
	sp->ideal = plan_stage_ideal(p, s);
	sp->verdict = predict_gpu_verdict(sp->mem.place[PLACE_GPU].peak_bytes,
					  pr->gpu_capacity_bytes);
	sp->fits_gpu = sp->mem.place[PLACE_GPU].peak_bytes <= pr->gpu_capacity_bytes;
	sp->fits_cpu = sp->mem.place[PLACE_CPU].peak_bytes <= pr->cpu_capacity_bytes;
	sp->fits_nvme = sp->mem.place[PLACE_NVME].peak_bytes <= pr->nvme_capacity_bytes;
	sp->fits = sp->fits_gpu && sp->fits_cpu && sp->fits_nvme;
	if (!sp->fits)
		sp->verdict = VERDICT_NO_FIT;
	return 0;
}

const char *predict_verdict_name(Verdict v)
{
	static const char *const names[] = {"fits", "tight", "does not fit"};
	return v <= VERDICT_NO_FIT ? names[v] : "?";
}

Verdict predict_gpu_verdict(double peak_bytes, double usable_bytes)
{
	if (peak_bytes > usable_bytes)
		return VERDICT_NO_FIT;
	return peak_bytes > usable_bytes - usable_bytes * PREDICT_TIGHT_MARGIN ? VERDICT_TIGHT :
										  VERDICT_FITS;
}

int predict_run(Scenario *sc, Prediction *pr, PxError *err)
{
	if (predict_memory(sc, pr, err))
		return -1;
	if (sc->backend == BACKEND_CPU) { /* a machine's CPU profile prices it: predict_time */
		snprintf(pr->time_note, sizeof(pr->time_note), "backend cpu: no CPU hardware profile "
			 "(`parallax calibrate --backend cpu` measures this machine into one)");
		if (sim_onebit_price(pr, NULL, err)) {
			predict_free(pr);
			return -1;
		}
		return 0;
	}
	HwProfile hw;
	char source[256];
	snprintf(source, sizeof(source), "built-in %s", sc->cluster.gpu.name);
	hwprofile_default(&sc->cluster.gpu, &hw);
	if (predict_time(pr, &hw, source, err)) {
		predict_free(pr);
		return -1;
	}
	return 0;
}

static int predict_stages(Scenario *sc, Prediction *pr, int traffic, PxError *err)
{
	memset(pr, 0, sizeof(*pr));
	const ParallelSpec *q = &sc->par;
	long long world = cluster_world(&sc->cluster);
	if (world % (q->tp * q->pp))
		return px_fail(err, PX_ERR_INPUT, "%s: parallelism: the world of %lld GPUs does not "
			       "divide into tp %lld x pp %lld", sc->path, world, q->tp, q->pp);
	if (dsconfig_resolve(&sc->ds, &sc->model, &sc->train_args, world / (q->tp * q->pp), err))
		return -1;
	if (plan_build(&pr->plan, sc, err))
		return -1;
	if (build_check_size(&pr->plan, err)) { /* before any schedule is built */
		plan_free(&pr->plan);
		return -1;
	}

	const ClusterSpec *c = &sc->cluster;
	pr->gpu_capacity_bytes = c->gpu.usable_bytes;
	pr->gpu_capacity_source = c->gpu.usable_source;
	pr->gpu_memory_bytes = c->gpu.mem_bytes;
	pr->gpu_margin_bytes = c->gpu.usable_bytes * PREDICT_TIGHT_MARGIN;
	pr->cpu_capacity_bytes = c->gpu.cpu_mem_bytes / (double)c->gpus_per_node;
	pr->nvme_capacity_bytes = c->gpu.nvme_bytes / (double)c->gpus_per_node;
	pr->n_stages = (int)pr->plan.par.pp;
	pr->stages = calloc((size_t)pr->n_stages, sizeof(*pr->stages));
	if (!pr->stages) {
		predict_free(pr);
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	}
	pr->fits = 1;
	pr->verdict = VERDICT_FITS;
	for (int s = 0; s < pr->n_stages; s++) {
		if (price_stage(pr, s, traffic, err)) {
			predict_free(pr);
			return -1;
		}
		pr->fits &= pr->stages[s].fits;
		if (pr->stages[s].verdict > pr->verdict)
			pr->verdict = pr->stages[s].verdict;
		if (pr->stages[s].mem.place[PLACE_GPU].peak_bytes >
		    pr->stages[pr->worst].mem.place[PLACE_GPU].peak_bytes)
			pr->worst = s;
	}
	return 0;
}

int predict_memory(Scenario *sc, Prediction *pr, PxError *err)
{
	return predict_stages(sc, pr, 1, err);
}

int predict_fit(Scenario *sc, Prediction *pr, PxError *err)
{
	return predict_stages(sc, pr, 0, err);
}

int predict_time(Prediction *pr, const HwProfile *hw, const char *source, PxError *err)
{
	Schedule *st[4096];
	PxError why = {0};
	if (pr->n_stages > 4096)
		return px_fail(err, PX_ERR_INPUT, "more than 4096 pipeline stages");
	for (int s = 0; s < pr->n_stages; s++)
		st[s] = &pr->stages[s].sched;
	timeline_result_free(&pr->time);
	pr->hw = *hw;
	pr->hw.cpu = NULL; /* hw's own: the caller's to free (hw_source names the profile) */
	snprintf(pr->hw_source, sizeof(pr->hw_source), "%s", source);
	pr->time_known = 0;
	pr->time_note[0] = '\0';
	if (timeline_run(&pr->plan, st, hw, &pr->time, &why)) {
		if (why.code == PX_ERR_RUNTIME)
			return px_fail(err, why.code, "%s", why.msg);
		snprintf(pr->time_note, sizeof(pr->time_note), "%s", why.msg);
		return sim_onebit_price(pr, NULL, err);
	}
	pr->time_known = 1;
	return sim_onebit_price(pr, hw, err);
}

void predict_free(Prediction *pr)
{
	if (!pr)
		return;
	for (int s = 0; pr->stages && s < pr->n_stages; s++)
		sched_free(&pr->stages[s].sched);
	free(pr->stages);
	pr->stages = NULL;
	timeline_result_free(&pr->time);
	plan_free(&pr->plan);
}

void predict_stage_order(const Prediction *pr, int *order)
{
	for (int i = 0; i < pr->n_stages; i++)
		order[i] = i;
	for (int i = 1; i < pr->n_stages; i++) /* insertion sort: a few hundred stages at most */
		for (int j = i; j > 0; j--) {
			double a = pr->stages[order[j]].mem.place[PLACE_GPU].peak_bytes;
			double b = pr->stages[order[j - 1]].mem.place[PLACE_GPU].peak_bytes;
			if (a <= b)
				break;
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
}
