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
	return hw->nvlink.base_s + steps * hw->nvlink.alpha_s + (bw > 0 ? wire / bw : INFINITY);
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
static int price_phases(const InferScenario *sc, const HwProfile *hw, const Schedule *sched,
			InferPhase *prefill, InferPhase *decode, PxError *err)
{
	SchedWalk w;
	int i;
	memset(prefill, 0, sizeof(*prefill));
	memset(decode, 0, sizeof(*decode));
	sched_walk_init(&w, sched, sched->step_begin);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) {
		const Op *op = &sched->ops[i];
		if (op->kind == OP_END_LOOP)
			sched_walk_leave(&w);
		if (op->role == ROLE_PREFILL)
			price_op(sc, hw, op, prefill);
		else if (op->role == ROLE_DECODE)
			price_op(sc, hw, op, decode);
	}
	if (i == SCHED_WALK_ERROR)
		return -1;
	phase_bound(prefill);
	phase_bound(decode);
	return 0;
}

static int price_time(const InferScenario *sc, const HwProfile *hw, InferPrediction *pr,
		      PxError *err)
{
	if (price_phases(sc, hw, &pr->sched, &pr->prefill, &pr->decode, err))
		return -1;
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

int infer_price_batch(const InferScenario *sc, const HwProfile *hw, long long b,
		      InferPhase *prefill, InferPhase *decode, PxError *err)
{
	InferPlan p;
	Schedule s;
	sched_init(&s, 0);
	int rc = infer_plan_make(sc, b, 0, &p, err);
	if (!rc) {
		rc = infer_build_schedule(&p, &s, err) ||
		     price_phases(sc, hw, &s, prefill, decode, err) ? -1 : 0;
		infer_plan_free(&p);
	}
	sched_free(&s);
	return rc;
}

int infer_price_ragged(const InferPlan *p, const HwProfile *hw, const InferRagged *r,
		       InferPhase *step, PxError *err)
{
	Schedule s;
	InferPhase none;
	int rc = infer_build_ragged(p, r, &s, err) ||
		 price_phases(p->sc, hw, &s, &none, step, err) ? -1 : 0;
	sched_free(&s);
	return rc;
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

/* What one search point costs: the peak of sc (whose depth is the point when depth) at a batch
 * and context, one of them the point. */
typedef struct Probe {
	InferScenario sc;     /* a shallow copy */
	long long fixed;      /* the batch (by ctx or depth) or the ctx (by batch) */
	long long ctx;        /* depth: the context */
	int by;               /* 0: ctx at batch fixed; 1: batch at ctx fixed; 2: depth */
} Probe;

static double probe_peak(Probe *q, long long x, PxError *err)
{
	if (q->by == 2) {
		q->sc.model.L = x;
		q->sc.model.n_params = model_count_params(&q->sc.model);
		return plan_peak(&q->sc, q->fixed, q->ctx, err);
	}
	return q->by ? plan_peak(&q->sc, x, q->fixed, err) : plan_peak(&q->sc, q->fixed, x, err);
}

/* The largest x in [lo, hi] whose peak is within cap (peak grows with x; lo's is, or lo is 0):
 * -1 on error. */
static long long most_within(Probe *q, double cap, long long lo, long long hi, PxError *err)
{
	while (lo < hi) {
		long long mid = lo + (hi - lo + 1) / 2;
		double peak = probe_peak(q, mid, err);
		if (peak < 0)
			return -1;
		if (peak <= cap)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* The largest x in [0, hi] with peak(x) within capacity (peak grows with x): batch at ctx when
 * by_batch, else ctx at batch. -1 on error. */
static long long largest_fit(const InferScenario *sc, double cap, long long fixed, long long hi,
			     int by_batch, PxError *err)
{
	Probe q = {.sc = *sc, .fixed = fixed, .by = by_batch};
	return most_within(&q, cap, 0, hi, err);
}

/* The most blocks of sc's model (its width, embeddings and head kept) whose peak at batch and ctx
 * (0: the plan's own context) fits cap, and that model's parameters; 0 when not one block fits.
 * -1 on error. */
static long long deepest_fit(const InferScenario *sc, double cap, long long batch, long long ctx,
			     double *params, PxError *err)
{
	Probe q = {.sc = *sc, .fixed = batch, .ctx = ctx, .by = 2};
	long long lo = 0, hi = sc->model.L > 0 ? sc->model.L : 1;
	for (;;) { /* hi past the answer (or 2^20 blocks), lo below it */
		double peak = probe_peak(&q, hi, err);
		if (peak < 0)
			return -1;
		if (peak > cap || hi >= (1LL << 20)) {
			if (peak <= cap)
				lo = hi;
			break;
		}
		lo = hi;
		hi *= 2;
	}
	long long most = most_within(&q, cap, lo, hi, err);
	if (most < 0)
		return -1;
	q.sc.model.L = most;
	*params = most ? model_count_params(&q.sc.model) : 0;
	return most;
}

/* ---- continuous batching ---- */

/* Decode steps' time at n sequences; -1 on error. */
static double decode_s(const InferScenario *sc, const HwProfile *hw, long long n, PxError *err)
{
	InferPhase pf, dec;
	return infer_price_batch(sc, hw, n, &pf, &dec, err) ? -1 : dec.s;
}

/* The steady state's figures that follow from its TTFT, TPOT and concurrency (pr->cb's):
 * latency, the requests in the system (Little's law), the KV cache at that occupancy, the
 * generated tokens a second. */
static void steady_figures(const InferScenario *sc, InferPrediction *pr)
{
	InferContinuous *c = &pr->cb;
	double so = (double)sc->wl.output_tokens;
	pr->latency_s = pr->ttft_s + (so - 1) * pr->tpot_s;
	c->in_system = c->rate_replica * pr->latency_s;
	c->kv_bytes = (c->concurrency * c->mean_ctx_tokens -
		       fmax(0, c->concurrency - 1) * fmin(pr->plan.shared_tokens, c->mean_ctx_tokens)) *
		      pr->plan.kv_bytes_per_token;
	pr->tokens_per_s_replica = c->rate_replica * so;
	pr->tokens_per_s_gpu = pr->tokens_per_s_replica / (double)pr->plan.tp;
	pr->tokens_per_s_node = pr->tokens_per_s_gpu * (double)sc->cluster.gpus_per_node;
}

/* A steady state's excess at n sequences: capacity over demand, in sequences, growing with n;
 * 0, or -1 with err. */
typedef int (*ExcessAt)(void *ctx, long long n, double *g, PxError *err);

/* The smallest whole n in [1, hi] with g(n) >= 0, by bisection (the caller has found g(hi) >= 0);
 * the steady state lies between n - 1 and n, where the caller interpolates. */
static int first_enough(ExcessAt g, void *ctx, long long hi, long long *n, PxError *err)
{
	long long lo = 1;
	while (lo < hi) {
		long long mid = lo + (hi - lo) / 2;
		double v;
		if (g(ctx, mid, &v, err))
			return -1;
		if (v >= 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	*n = lo;
	return 0;
}

/* ---- continuous batching under Dynamic SplitFuse (docs/inference.md) ---- */

/* FastGen's forwards with n sequences decoding: each forward gives them a token; while prompts
 * wait, it also carries c prompt tokens (a full forward): what the budget leaves, avail =
 * max_ragged_batch_size - n, for a prompt longer than that, which goes in sp / avail chunks (its
 * tokens' causal pairs c (sp + 1) / 2 a forward, its earlier chunks' (sp - c) / 2 tokens read);
 * a shorter prompt in one forward of its own sp tokens (packing several prompts into one forward
 * when they queue is left out: a bound on the throughput at high load). The prompts keep full
 * forwards busy a share rho = lambda (sp / c) T_full of the time, and the forwards run at
 * rho / T_full + (1 - rho) / T_dec a second: a decoding sequence's TPOT is one over that. */
typedef struct Fused {
	double avail;  /* prompt tokens a full forward carries: c */
	double full_s; /* a full forward: n decoding tokens and avail prompt tokens */
	double dec_s;  /* a forward of the n decoding tokens alone */
	double util;   /* rho */
	double tpot_s;
} Fused;

/* The forwards at n decoding sequences (n >= 1) and lambda requests/s on the replica: 0, 1 when
 * they cannot keep up (no room for a prompt token, or rho >= 1), -1 with err. */
static int fused_at(const InferPlan *p, const HwProfile *hw, double lambda, long long n,
		    Fused *f, PxError *err)
{
	const InferWorkload *wl = &p->sc->wl;
	double sp = (double)wl->prompt_tokens, ctx = sp + (double)wl->output_tokens / 2;
	double hit = wl->cached_prefix, rest = sp - hit; /* a prompt's tokens to compute */
	long long avail = wl->token_budget - n;
	if (avail < 1)
		return 1;
	double c = fmin((double)avail, rest);
	InferRagged full = {.decode_seqs = n, .decode_ctx = ctx, .chunk_tokens = (long long)c,
			    .chunk_pairs = c * (hit + (rest + 1) / 2),
			    .chunk_prior = hit + fmax(0, (rest - c) / 2),
			    .logit_rows = (double)n + c / rest};
	InferRagged dec = {.decode_seqs = n, .decode_ctx = ctx, .logit_rows = (double)n};
	InferPhase ph;
	if (infer_price_ragged(p, hw, &full, &ph, err))
		return -1;
	f->full_s = ph.s;
	if (infer_price_ragged(p, hw, &dec, &ph, err))
		return -1;
	f->dec_s = ph.s;
	f->avail = c;
	f->util = lambda * rest / c * f->full_s;
	if (f->util >= 1)
		return 1;
	f->tpot_s = 1 / (f->util / f->full_s + (1 - f->util) / f->dec_s);
	return 0;
}

typedef struct FusedCtx {
	const InferPlan *plan;
	const HwProfile *hw;
	double lambda, so;
} FusedCtx;

/* g(n) = n - lambda (so - 1) TPOT(n); below 0 where the forwards cannot keep up. */
static int fused_excess(void *ctx, long long n, double *g, PxError *err)
{
	const FusedCtx *x = ctx;
	Fused f;
	int rc = fused_at(x->plan, x->hw, x->lambda, n, &f, err);
	if (rc < 0)
		return -1;
	*g = rc ? -1 : (double)n - x->lambda * (x->so - 1) * f.tpot_s;
	return 0;
}

/* The steady state under Dynamic SplitFuse: the smallest n with n >= lambda (so - 1) TPOT(n)
 * (Little's law: each request decodes so - 1 tokens, one a forward), linear between whole n.
 * TTFT: a prompt waits for the prompts ahead (M/D/1: rho X / (2 (1 - rho)), X = its sp / avail
 * full forwards) and for the decode-only forwards' mean residual (half of one: the vacations of
 * an exhaustive M/G/1, as price_continuous says), then its own forwards (one at least). Fills pr->cb and the time figures as
 * price_continuous does. */
static int price_fused(const InferScenario *sc, const HwProfile *hw, InferPrediction *pr,
		       PxError *err)
{
	InferContinuous *c = &pr->cb;
	const InferWorkload *wl = &sc->wl;
	double so = (double)wl->output_tokens, sp = (double)wl->prompt_tokens;
	double lambda = c->rate_replica;
	long long most = c->max_concurrency;
	if (most > wl->max_ragged_seqs)
		most = wl->max_ragged_seqs;
	if (most > wl->token_budget - 1)
		most = wl->token_budget - 1;
	Fused lo_f, hi_f = {0};
	long long lo, hi = most;
	int rc = most < 1 ? 1 : fused_at(&pr->plan, hw, lambda, hi, &hi_f, err);
	if (rc < 0)
		return -1;
	c->prefill_util = hi_f.util;
	if (rc || (double)hi < lambda * (so - 1) * hi_f.tpot_s) {
		snprintf(c->why, sizeof(c->why), "overloaded: at %lld decoding sequences (memory's, "
			 "batch_size's or the forward's limit) the forwards of %lld tokens cannot "
			 "keep up with %.4g requests/s per replica", most, wl->token_budget,
			 lambda);
		return 0;
	}
	FusedCtx fc = {&pr->plan, hw, lambda, so};
	if (first_enough(fused_excess, &fc, hi, &lo, err) ||
	    (lo < hi && fused_at(&pr->plan, hw, lambda, lo, &hi_f, err) < 0))
		return -1;
	Fused at = hi_f;
	if (lo == 1) { /* fewer than one sequence decoding on average: batch 1's forwards */
		c->concurrency = lambda * (so - 1) * hi_f.tpot_s;
	} else { /* g(n) = n - lambda (so - 1) TPOT(n), linear between lo - 1 and lo */
		if (fused_at(&pr->plan, hw, lambda, lo - 1, &lo_f, err) < 0)
			return -1;
		double g_lo = (double)(lo - 1) - lambda * (so - 1) * lo_f.tpot_s;
		double g_hi = (double)lo - lambda * (so - 1) * hi_f.tpot_s;
		double f = -g_lo / (g_hi - g_lo);
		c->concurrency = (double)(lo - 1) + f;
		at.tpot_s = lo_f.tpot_s + f * (hi_f.tpot_s - lo_f.tpot_s);
		at.util = lo_f.util + f * (hi_f.util - lo_f.util);
		at.dec_s = lo_f.dec_s + f * (hi_f.dec_s - lo_f.dec_s);
		at.full_s = lo_f.full_s + f * (hi_f.full_s - lo_f.full_s);
	}
	c->stable = 1;
	double rest = sp - wl->cached_prefix; /* what a prompt computes */
	double x = rest / at.avail * at.full_s; /* a prompt's work, in full forwards' time */
	c->prefill_util = at.util;
	c->prefill_s = fmax(1, rest / at.avail) * at.full_s;
	c->prefill_sq_s2 = c->prefill_s * c->prefill_s;
	c->decode_step_s = at.tpot_s;
	pr->ttft_s = at.util * x / (2 * (1 - at.util)) + fmin(1, c->concurrency) * at.dec_s / 2 +
		     c->prefill_s;
	pr->tpot_s = at.tpot_s;
	steady_figures(sc, pr);
	return 0;
}

/* g(n) = n (1 - rho) - lambda (so - 1) T_d(n): decode's capacity over its demand, in sequences;
 * it grows with n while a step's time grows more slowly than its batch. */
static int excess(const InferScenario *sc, const HwProfile *hw, const InferContinuous *c,
		  long long n, double *g, double *td, PxError *err)
{
	if ((*td = decode_s(sc, hw, n, err)) < 0)
		return -1;
	*g = (double)n * (1 - c->prefill_util) -
	     c->rate_replica * (double)(sc->wl.output_tokens - 1) * *td;
	return 0;
}

typedef struct ContCtx {
	const InferScenario *sc;
	const HwProfile *hw;
	const InferContinuous *c;
} ContCtx;

static int cont_excess(void *ctx, long long n, double *g, PxError *err)
{
	const ContCtx *x = ctx;
	double td;
	return excess(x->sc, x->hw, x->c, n, g, &td, err);
}

/* The steady state (docs/inference.md): rho = lambda T_pf; the smallest N with
 * N (1 - rho) = lambda (so - 1) T_d(N), T_d linear between whole batches (Little's law for the
 * decode phase: N sequences, each (so - 1) steps of T_d / (1 - rho)). Fills pr->cb and the
 * time figures; pr->cb.stable 0 when the replica cannot keep up. */
static int price_continuous(const InferScenario *sc, const HwProfile *hw, InferPrediction *pr,
			    PxError *err)
{
	InferContinuous *c = &pr->cb;
	const InferWorkload *wl = &sc->wl;
	double so = (double)wl->output_tokens;
	InferPhase dec_hi;
	c->rate_replica = wl->request_rate / (double)pr->plan.replicas;
	c->mean_ctx_tokens = (double)wl->prompt_tokens + so / 2;
	if (infer_price_batch(sc, hw, 1, &pr->prefill, &dec_hi, err))
		return -1;
	/* prefill times: the mean prompt's, or a replayed trace's own, whose spread lengthens the
	 * wait */
	c->prefill_s = pr->replayed ? pr->replay.prefill_mean_s : pr->prefill.s;
	c->prefill_sq_s2 = pr->replayed ? pr->replay.prefill_sq_mean_s2 :
					  c->prefill_s * c->prefill_s;
	c->prefill_util = c->rate_replica * c->prefill_s;
	if (c->max_concurrency < 1) {
		snprintf(c->why, sizeof(c->why), "not one sequence of %.0f tokens fits beside the "
			 "weights", c->mean_ctx_tokens);
		return 0;
	}
	if (infer_sched_ragged(wl))
		return price_fused(sc, hw, pr, err);
	if (c->prefill_util >= 1) {
		snprintf(c->why, sizeof(c->why), "overloaded: the prefills alone need %.3g of the "
			 "time (%.4g requests/s x %.4g s each per replica)", c->prefill_util,
			 c->rate_replica, c->prefill_s);
		return 0;
	}
	/* the smallest whole n with g(n) >= 0 */
	long long lo, hi = c->max_concurrency;
	double g_hi, td_hi, g_lo, td_lo;
	if (excess(sc, hw, c, hi, &g_hi, &td_hi, err))
		return -1;
	if (g_hi < 0) {
		snprintf(c->why, sizeof(c->why), "overloaded: %lld concurrent sequences (memory's or "
			 "batch_size's limit) decode %.4g tokens/s per replica, %.4g needed",
			 hi, (double)hi * (1 - c->prefill_util) / td_hi,
			 c->rate_replica * (so - 1));
		return 0;
	}
	ContCtx cc = {sc, hw, c};
	if (first_enough(cont_excess, &cc, hi, &lo, err) ||
	    (lo < hi && excess(sc, hw, c, lo, &g_hi, &td_hi, err)))
		return -1;
	if (lo == 1) { /* fewer than one sequence on average: a step costs batch 1's */
		if (excess(sc, hw, c, 1, &g_hi, &td_hi, err))
			return -1;
		c->decode_step_s = td_hi;
		c->concurrency = c->rate_replica * (so - 1) * td_hi / (1 - c->prefill_util);
	} else { /* g is linear between lo - 1 and lo: its root */
		if (excess(sc, hw, c, lo - 1, &g_lo, &td_lo, err))
			return -1;
		double f = -g_lo / (g_hi - g_lo);
		c->concurrency = (double)(lo - 1) + f;
		c->decode_step_s = td_lo + f * (td_hi - td_lo);
	}
	c->stable = 1;
	/* a prompt waits for the prefills ahead of it: M/G/1's mean wait lambda E[T^2] /
	 * (2 (1 - rho)) (Pollaczek-Khinchine; M/D/1's rho T / (2 (1 - rho)) for one length); and
	 * for the decode steps the server takes whenever no prompt waits: an M/G/1 queue served
	 * exhaustively with multiple vacations, whose wait is M/G/1's plus the vacation's mean
	 * residual, E[V^2] / (2 E[V]) = T_d / 2 for steps of one length (Fuhrmann and Cooper's
	 * decomposition, 1985), whenever the prompt arrives: also during a prefill, since the queue
	 * it joins began behind a step; below one sequence on average the steps run a share
	 * min(1, N) of such gaps (batch 1's, lambda (so - 1) T_d of the time) */
	double decoding = fmin(1, c->concurrency);
	pr->ttft_s = c->prefill_s + c->rate_replica * c->prefill_sq_s2 /
					    (2 * (1 - c->prefill_util)) +
		     decoding * c->decode_step_s / 2;
	pr->tpot_s = c->decode_step_s / (1 - c->prefill_util);
	steady_figures(sc, pr);
	return 0;
}

/* Continuous batching: memory's limit at the mean context, the steady state, then the plan,
 * schedule and memory replay at its concurrency (rounded up) for the report. */
static int predict_continuous(const InferScenario *sc0, const HwProfile *hw, InferPrediction *pr,
			      PxError *err)
{
	pr->paged = *sc0;
	pr->paged.inf.kernel_inject = 0;
	const InferScenario *sc = &pr->paged;
	const InferWorkload *wl = &sc->wl;
	long long ctx = wl->prompt_tokens + (wl->output_tokens + 1) / 2;
	double cap = sc->cluster.gpu.usable_bytes;
	long long most = largest_fit(sc, cap, ctx, 1LL << 24, 1, err);
	if (most < 0)
		return -1;
	pr->cb.max_concurrency = wl->batch_given && wl->batch < most ? wl->batch : most;
	/* the replicas: a plan at batch 1 says them */
	if (infer_plan_make(sc, 1, ctx, &pr->plan, err))
		return -1;
	if (wl->trace.n > 0) { /* the KV cache's tokens: one sequence's longest context */
		long long seqs = wl->batch_given ? wl->batch : wl->trace.n;
		if (wl->scheduler == SCHED_VLLM_V1 && wl->max_ragged_seqs < seqs)
			seqs = wl->max_ragged_seqs; /* max_num_seqs */
		InferReplayRoom room = {.replicas = pr->plan.replicas, .tp = pr->plan.tp,
					.max_seqs = seqs, .block = wl->block,
					.watermark = wl->watermark};
		pr->replayed = 1;
		if ((room.kv_tokens = largest_fit(sc, cap, 1, 1LL << 40, 0, err)) < 0 ||
		    infer_replay(sc, hw, &room, &pr->replay, err))
			return -1;
	}
	if (price_continuous(sc, hw, pr, err)) /* after the replay: its prefills' moments */
		return -1;
	long long b = pr->cb.stable ? (long long)ceil(pr->cb.concurrency - 1e-9) : 1;
	if (b < 1)
		b = 1;
	infer_plan_free(&pr->plan);
	InferPhase pf;
	if (infer_plan_make(sc, b, ctx, &pr->plan, err) ||
	    infer_build_schedule(&pr->plan, &pr->sched, err) ||
	    sim_memory(&pr->sched, &pr->mem, NULL, NULL, err) ||
	    (pr->cb.stable && infer_price_batch(sc, hw, b, &pf, &pr->decode, err)))
		return -1;
	pr->peak_bytes = pr->mem.place[PLACE_GPU].peak_bytes;
	pr->load_peak_bytes = infer_plan_load_peak_bytes(&pr->plan);
	pr->gpu_capacity_bytes = cap;
	pr->verdict = predict_gpu_verdict(pr->peak_bytes, cap);
	pr->max_batch = most;
	pr->fit_batch = b, pr->fit_ctx = ctx;
	if ((pr->max_ctx = largest_fit(sc, cap, b, 1LL << 24, 0, err)) < 0)
		return -1;
	return (pr->max_layers = deepest_fit(sc, cap, b, ctx, &pr->max_params, err)) < 0 ? -1 : 0;
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
	if (sc->wl.continuous)
		return predict_continuous(sc, hw, pr, err);
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
	pr->fit_batch = sc->wl.batch, pr->fit_ctx = ctx;
	if ((pr->max_batch = largest_fit(sc, pr->gpu_capacity_bytes, ctx, 1LL << 24, 1, err)) < 0 ||
	    (pr->max_ctx = largest_fit(sc, pr->gpu_capacity_bytes, sc->wl.batch, ctx_hi, 0,
				       err)) < 0 ||
	    (pr->max_layers = deepest_fit(sc, pr->gpu_capacity_bytes, sc->wl.batch, 0,
					  &pr->max_params, err)) < 0)
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
