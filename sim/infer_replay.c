#include "infer_replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_sim.h"

/* Costs, priced once each: a prefill by prompt length, a decode step by batch. */
typedef struct Costs {
	const InferScenario *sc;
	const HwProfile *hw;
	long long *lengths; /* the trace's distinct prompt lengths, ascending */
	double *prefill_s;  /* each one's prefill, < 0 until priced */
	long long n_lengths;
	double *step_s;     /* decode step at batch n (index n), < 0 until priced */
	long long priced;
} Costs;

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double prefill_of(Costs *c, long long prompt, PxError *err)
{
	long long lo = 0, hi = c->n_lengths - 1;
	while (lo < hi) {
		long long mid = (lo + hi) / 2;
		if (c->lengths[mid] < prompt)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (c->prefill_s[lo] < 0) {
		InferScenario one = *c->sc; /* shallow: only the workload's prompt differs */
		one.wl.prompt_tokens = prompt;
		InferPhase pf, dec;
		if (infer_price_batch(&one, c->hw, 1, &pf, &dec, err))
			return -1;
		c->prefill_s[lo] = pf.s;
		c->priced++;
	}
	return c->prefill_s[lo];
}

static double step_of(Costs *c, long long n, PxError *err)
{
	if (c->step_s[n] < 0) {
		InferPhase pf, dec;
		if (infer_price_batch(c->sc, c->hw, n, &pf, &dec, err))
			return -1;
		c->step_s[n] = dec.s;
	}
	return c->step_s[n];
}

/* A request in flight on a replica. */
typedef struct Live {
	long long req, left; /* its index; tokens still to generate */
	double first_s;      /* when its first token came */
} Live;

/* One replica's requests (every replicas-th from first) through the loop; ttft and latency
 * filled by request index, tpot's sum and count added. */
static int replica(Costs *c, const InferTrace *t, long long first, long long replicas,
		   long long cap, Live *live, double *ttft, double *latency, double *tpot_sum,
		   long long *tpot_n, InferReplay *out, PxError *err)
{
	long long next = first, queued = first, n_live = 0; /* [queued, next): arrived, waiting */
	double now = t->req[first].arrival_s;
	while (queued < t->n || n_live > 0) {
		while (next < t->n && t->req[next].arrival_s <= now)
			next += replicas;
		if (queued < next && n_live >= cap)
			for (long long i = queued; i < next; i += replicas)
				if (ttft[i] == -2) /* counted once */
					ttft[i] = -3, out->waited_for_room++;
		if (queued < next && n_live < cap) { /* a prompt first */
			const InferRequest *r = &t->req[queued];
			double pf = prefill_of(c, r->prompt_tokens, err);
			if (pf < 0)
				return -1;
			now += pf;
			ttft[queued] = now - r->arrival_s;
			if (r->output_tokens == 1)
				latency[queued] = now - r->arrival_s;
			else
				live[n_live++] = (Live){queued, r->output_tokens - 1, now};
			if (n_live > out->peak_concurrency)
				out->peak_concurrency = n_live;
			queued += replicas;
			continue;
		}
		if (n_live > 0) {
			double step = step_of(c, n_live, err);
			if (step < 0)
				return -1;
			now += step;
			for (long long k = 0; k < n_live;) {
				Live *l = &live[k];
				if (--l->left > 0) {
					k++;
					continue;
				}
				const InferRequest *r = &t->req[l->req];
				latency[l->req] = now - r->arrival_s;
				*tpot_sum += (now - l->first_s) / (double)(r->output_tokens - 1);
				(*tpot_n)++;
				*l = live[--n_live];
			}
			continue;
		}
		now = t->req[queued].arrival_s; /* idle until the next arrival */
	}
	if (now - t->req[0].arrival_s > out->makespan_s)
		out->makespan_s = now - t->req[0].arrival_s;
	return 0;
}

/* The q-quantile of n sorted values (nearest rank). */
static double quantile(const double *v, long long n, double q)
{
	long long k = (long long)ceil(q * (double)n) - 1;
	return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

int infer_replay(const InferScenario *sc, const HwProfile *hw, long long replicas, long long tp,
		 long long max_concurrency, InferReplay *out, PxError *err)
{
	const InferTrace *t = &sc->wl.trace;
	memset(out, 0, sizeof(*out));
	out->requests = t->n;
	if (replicas < 1 || max_concurrency < 1 || t->n < 1)
		return px_fail(err, PX_ERR_INPUT, "%s: no replica, or no room for one sequence, to "
			       "replay the trace on", t->path);
	Costs c = {.sc = sc, .hw = hw};
	long long n = t->n, cap = max_concurrency;
	c.lengths = malloc((size_t)n * sizeof(*c.lengths));
	c.prefill_s = malloc((size_t)n * sizeof(*c.prefill_s));
	c.step_s = malloc((size_t)(cap + 1) * sizeof(*c.step_s));
	Live *live = malloc((size_t)(cap < n ? cap : n) * sizeof(*live));
	double *ttft = malloc((size_t)n * sizeof(*ttft)), *lat = malloc((size_t)n * sizeof(*lat));
	int rc = 0;
	if (!c.lengths || !c.prefill_s || !c.step_s || !live || !ttft || !lat) {
		rc = px_fail(err, PX_ERR_RUNTIME, "out of memory");
		goto done;
	}
	for (long long i = 0; i < n; i++)
		c.lengths[i] = t->req[i].prompt_tokens, ttft[i] = -2, lat[i] = -1;
	qsort(c.lengths, (size_t)n, sizeof(*c.lengths), cmp_ll);
	for (long long i = 0; i < n; i++)
		if (!i || c.lengths[i] != c.lengths[c.n_lengths - 1])
			c.lengths[c.n_lengths++] = c.lengths[i];
	for (long long i = 0; i < c.n_lengths; i++)
		c.prefill_s[i] = -1;
	for (long long i = 0; i <= cap; i++)
		c.step_s[i] = -1;
	double tpot_sum = 0;
	long long tpot_n = 0;
	for (long long r = 0; r < replicas && r < n && !rc; r++)
		rc = replica(&c, t, r, replicas, cap, live, ttft, lat, &tpot_sum, &tpot_n, out, err);
	if (rc)
		goto done;
	double gen = 0, sum_ttft = 0, sum_lat = 0;
	for (long long i = 0; i < n; i++)
		gen += (double)t->req[i].output_tokens, sum_ttft += ttft[i], sum_lat += lat[i];
	qsort(ttft, (size_t)n, sizeof(*ttft), cmp_d);
	qsort(lat, (size_t)n, sizeof(*lat), cmp_d);
	out->ttft_mean_s = sum_ttft / (double)n;
	out->ttft_p50_s = quantile(ttft, n, 0.5);
	out->ttft_p99_s = quantile(ttft, n, 0.99);
	out->latency_mean_s = sum_lat / (double)n;
	out->latency_p99_s = quantile(lat, n, 0.99);
	out->tpot_mean_s = tpot_n ? tpot_sum / (double)tpot_n : 0;
	out->tokens_per_s_gpu = gen / out->makespan_s / (double)(replicas * tp);
	out->prefills_priced = c.priced;
done:
	free(c.lengths);
	free(c.prefill_s);
	free(c.step_s);
	free(live);
	free(ttft);
	free(lat);
	return rc;
}
