#include "infer_sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GB 1e9
/* a unit's FLOPs spread over about this many GEMMs when reading the efficiency curve (opcost.c
 * reads it the same way) */
#define GEMMS_PER_UNIT 6

const char *infer_bound_name(InferBound b)
{
	static const char *const n[] = {"compute", "memory bandwidth", "communication",
					"kernel launches"};
	return (unsigned)b < N_BOUNDS ? n[b] : "?";
}

/* ---- time ---- */

static double dtype_peak(const InferScenario *sc)
{
	const GpuSpec *g = &sc->cluster.gpu;
	switch (sc->inf.dtype) {
	case IDT_BF16: return g->tflops_bf16 * 1e12;
	case IDT_FP32: return g->tflops_fp32 * 1e12;
	default: return g->tflops_fp16 * 1e12; /* int8's kernels compute in fp16 */
	}
}

double infer_coll_s(const HwProfile *hw, const GpuSpec *gpu, CollKind kind, int n, double bytes)
{
	if (n <= 1 || bytes <= 0)
		return 0;
	double steps = kind == COLL_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
	double wire = bytes * steps / n;
	double bw = n > hw->nvlink_domain ? gpu->pcie_GBps * GB * hw->pcie_efficiency :
		    gpu->nvlink_GBps / 2 * GB * hw_curve_eval(&hw->nvlink.efficiency, bytes) *
			    (kind == COLL_ALL_REDUCE ? hw->nvlink.allreduce_scale : 1);
	return steps * hw->nvlink.alpha_s + (bw > 0 ? wire / bw : INFINITY);
}

static void price_op(const InferScenario *sc, const HwProfile *hw, const Op *op, InferPhase *ph)
{
	if (op->kind == OP_COMPUTE) {
		double peak = dtype_peak(sc) * hw_curve_eval(&hw->gemm, op->flops / GEMMS_PER_UNIT);
		double hbm = sc->cluster.gpu.hbm_GBps * GB * hw->hbm_efficiency * INFER_HBM_FRACTION;
		double tc = peak > 0 ? op->flops / peak : INFINITY, tm = op->bytes / hbm;
		ph->bound_s[tc >= tm ? BOUND_COMPUTE : BOUND_MEMORY] += fmax(tc, tm);
		ph->bound_s[BOUND_LAUNCH] += INFER_UNIT_LAUNCH_S;
		ph->s += fmax(tc, tm) + INFER_UNIT_LAUNCH_S;
		ph->flops += op->flops;
		ph->bytes += op->bytes;
	} else if (op->kind == OP_COLL) {
		double t = infer_coll_s(hw, &sc->cluster.gpu, (CollKind)op->sub, op->nranks, op->bytes);
		ph->bound_s[BOUND_COMM] += t;
		ph->s += t;
		ph->comm_bytes += op->bytes;
	}
}

static void phase_bound(InferPhase *ph)
{
	ph->bound = BOUND_COMPUTE;
	for (int b = 1; b < N_BOUNDS; b++)
		if (ph->bound_s[b] > ph->bound_s[ph->bound])
			ph->bound = (InferBound)b;
}

/* The step's ops by role: prefill's once, the decode block's first iteration (all alike). */
static int price_time(const InferScenario *sc, const HwProfile *hw, InferPrediction *pr,
		      PxError *err)
{
	SchedWalk w;
	int i;
	sched_walk_init(&w, &pr->sched, pr->sched.step_begin);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &pr->sched.ops[i];
		if (op->kind == OP_END_LOOP)
			sched_walk_leave(&w);
		if (op->role == ROLE_PREFILL)
			price_op(sc, hw, op, &pr->prefill);
		else if (op->role == ROLE_DECODE)
			price_op(sc, hw, op, &pr->decode);
	}
	if (i == SCHED_WALK_ERROR)
		return -1;
	phase_bound(&pr->prefill);
	phase_bound(&pr->decode);
	const InferWorkload *wl = &sc->wl;
	/* prefill yields the first token; each decode step one more */
	pr->ttft_s = pr->prefill.s;
	pr->tpot_s = pr->decode.s;
	pr->latency_s = pr->ttft_s + (double)(wl->output_tokens - 1) * pr->tpot_s;
	pr->tokens_per_s_replica = (double)wl->batch * (double)wl->output_tokens / pr->latency_s;
	pr->tokens_per_s_gpu = pr->tokens_per_s_replica / (double)pr->plan.tp;
	pr->tokens_per_s_node = pr->tokens_per_s_gpu * (double)sc->cluster.gpus_per_node;
	return 0;
}

/* ---- memory ---- */

static double plan_peak(const InferScenario *sc, long long batch, long long ctx, PxError *err)
{
	InferPlan p;
	if (infer_plan_make(sc, batch, ctx, &p, err))
		return -1;
	double peak = fmax(infer_plan_serve_peak_bytes(&p), infer_plan_load_peak_bytes(&p));
	infer_plan_free(&p);
	return peak;
}

/* The largest x in [0, hi] with peak(x) within capacity (peak grows with x): batch at ctx when
 * by_batch, else ctx at batch. -1 on error. */
static long long largest_fit(const InferScenario *sc, double cap, long long fixed, long long hi,
			     int by_batch, PxError *err)
{
	long long lo = 0;
	while (lo < hi) {
		long long mid = lo + (hi - lo + 1) / 2;
		double peak = by_batch ? plan_peak(sc, mid, fixed, err) : plan_peak(sc, fixed, mid, err);
		if (peak < 0)
			return -1;
		if (peak <= cap)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

int infer_predict(const InferScenario *sc, const HwProfile *hw, const char *source,
		  InferPrediction *pr, PxError *err)
{
	HwProfile dflt;
	memset(pr, 0, sizeof(*pr));
	sched_init(&pr->sched, 0);
	if (!hw) {
		int known = hwprofile_default(&sc->cluster.gpu, &dflt) == 0;
		hw = &dflt;
		snprintf(pr->hw_source, sizeof(pr->hw_source), "%s %s", known ? "built-in" :
			 "generic (A100-80GB fractions)", sc->cluster.gpu.name);
	} else {
		snprintf(pr->hw_source, sizeof(pr->hw_source), "%s", source ? source : "--hw");
	}
	if (infer_plan_make(sc, sc->wl.batch, 0, &pr->plan, err) ||
	    infer_build_schedule(&pr->plan, &pr->sched, err) ||
	    sim_memory(&pr->sched, &pr->mem, NULL, NULL, err))
		return -1;
	const MemPlace *g = &pr->mem.place[PLACE_GPU];
	pr->peak_bytes = g->peak_bytes;
	pr->load_peak_bytes = infer_plan_load_peak_bytes(&pr->plan);
	pr->gpu_capacity_bytes = sc->cluster.gpu.usable_bytes;
	pr->verdict = predict_gpu_verdict(pr->peak_bytes, pr->gpu_capacity_bytes);
	long long ctx = sc->wl.prompt_tokens + sc->wl.output_tokens;
	long long ctx_hi = sc->model.lay.pos == POS_LEARNED ? sc->model.max_pos : 1LL << 24;
	if ((pr->max_batch = largest_fit(sc, pr->gpu_capacity_bytes, ctx, 1LL << 24, 1, err)) < 0 ||
	    (pr->max_ctx = largest_fit(sc, pr->gpu_capacity_bytes, sc->wl.batch, ctx_hi, 0,
				       err)) < 0)
		return -1;
	return price_time(sc, hw, pr, err);
}

void infer_predict_free(InferPrediction *pr)
{
	if (!pr)
		return;
	infer_plan_free(&pr->plan);
	sched_free(&pr->sched);
}
