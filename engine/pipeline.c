#include "pipeline.h"

#include <math.h>
#include <stdlib.h>

/* ---- partition ---- */

/* Cut the blocks (units 1 .. n_blocks) into n chunks of equal block counts. */
static void cut_uniform(long long n_blocks, long long n, int *bounds)
{
	for (long long j = 0; j < n; j++)
		bounds[j] = (int)(1 + j * n_blocks / n);
}

/* Cut where the running parameter count is nearest to j/n of the total, every chunk keeping at
 * least one block (DeepSpeed's "parameters" method balances the same count). */
static void cut_parameters(const long long *unit_params, int n_units, long long n, int *bounds)
{
	double total = 0, run = 0;
	for (int u = 0; u < n_units; u++)
		total += (double)unit_params[u];
	int u = 0;
	bounds[0] = 1;
	for (long long j = 1; j < n; j++) {
		double target = total * (double)j / (double)n;
		int lo = bounds[j - 1] + 1, hi = n_units - 1 - (int)(n - j); /* room for the rest */
		while (u < lo) /* the parameters before unit lo */
			run += (double)unit_params[u++];
		int best = lo;
		double best_gap = fabs(run - target), acc = run;
		for (int c = lo + 1; c <= hi; c++) {
			acc += (double)unit_params[c - 1];
			if (fabs(acc - target) < best_gap)
				best_gap = fabs(acc - target), best = c;
		}
		bounds[j] = best;
	}
}

int pipe_partition(PartitionMethod method, const long long *unit_params, int n_units,
		   long long n_blocks, long long pp, long long v, int *bounds, PxError *err)
{
	long long n = pp * v;
	if (n > n_blocks)
		return px_fail(err, PX_ERR_INPUT, "parallelism: %lld pipeline stages x %lld virtual "
			       "stages = %lld model chunks, but the model has only %lld layers", pp, v,
			       n, n_blocks);
	if (method != PART_PARAMETERS && n_blocks % n)
		return px_fail(err, PX_ERR_INPUT, "parallelism: %lld layers do not divide into %lld "
			       "pipeline stages x %lld virtual stages", n_blocks, pp, v);
	if (method == PART_PARAMETERS)
		cut_parameters(unit_params, n_units, n, bounds);
	else
		cut_uniform(n_blocks, n, bounds);
	bounds[0] = 0;        /* the embedding rides with the first chunk */
	bounds[n] = n_units;  /* and the head with the last */
	return 0;
}

/* ---- order ---- */

/* Megatron's interleaved schedule: the k-th forward (or backward) of a stage works on
 * micro-batch (k / (p v)) p + k % p of local chunk (k % (p v)) / p, backwards in reverse chunk
 * order; warm-up runs (p - s - 1) * 2 + (v - 1) * p forwards. With v = 1 this is plain 1F1B. */
static PipeStep virtual_step(int forward, long long k, long long p, long long v)
{
	long long group = k % (p * v);
	PipeStep st = {.forward = forward, .mb = (int)((k / (p * v)) * p + k % p)};
	long long chunk = group / p;
	st.chunk = (int)(forward ? chunk : v - 1 - chunk);
	return st;
}

int pipe_order(PipeSchedule sched, long long pp, long long v, long long m, long long s,
	       PipeStep *out)
{
	int n = 0;
	if (sched == PIPE_GPIPE) {
		for (long long i = 0; i < m; i++)
			out[n++] = (PipeStep){1, (int)i, 0};
		for (long long i = 0; i < m; i++)
			out[n++] = (PipeStep){0, (int)i, 0};
		return n;
	}
	long long total = m * v;
	long long warmup = sched == PIPE_INTERLEAVED ? (pp - s - 1) * 2 + (v - 1) * pp : pp - s - 1;
	if (warmup > total)
		warmup = total;
	long long f = 0, b = 0;
	for (; f < warmup; f++)
		out[n++] = virtual_step(1, f, pp, v);
	while (f < total) { /* steady state: one forward, one backward */
		out[n++] = virtual_step(1, f++, pp, v);
		out[n++] = virtual_step(0, b++, pp, v);
	}
	while (b < total)
		out[n++] = virtual_step(0, b++, pp, v);
	return n;
}
