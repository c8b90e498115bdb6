#include "collbench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/clock.h"

const CollKind collbench_kinds[COLLBENCH_KINDS] = {COLL_ALL_REDUCE, COLL_ALL_GATHER,
						    COLL_REDUCE_SCATTER, COLL_ALL_TO_ALL};

/* ---- formulas ---- */

/* nccl-tests' doc/PERFORMANCE.md, "Summary": the bus bandwidth is the algorithm bandwidth times
 * the share of the array each rank's link carries in the best algorithm, which makes it
 * comparable with the hardware's peak whatever n is. */
double collbench_bus_factor(CollKind kind, int n)
{
	if (n < 2)
		return 0;
	if (kind == COLL_ALL_REDUCE)
		return 2.0 * (n - 1) / n;
	if (kind == COLL_ALL_GATHER || kind == COLL_REDUCE_SCATTER || kind == COLL_ALL_TO_ALL)
		return (double)(n - 1) / n;
	return 0;
}

int collbench_ring_steps(CollKind kind, int n)
{
	return n < 2 ? 0 : kind == COLL_ALL_REDUCE ? 2 * (n - 1) : n - 1;
}

double collbench_algbw_Bps(double size_bytes, double time_s)
{
	return time_s > 0 ? size_bytes / time_s : 0;
}

double collbench_busbw_Bps(CollKind kind, int n, double size_bytes, double time_s)
{
	return collbench_algbw_Bps(size_bytes, time_s) * collbench_bus_factor(kind, n);
}

/* ---- measuring ---- */

void collbench_opts_init(CollBenchOpts *o, int quick)
{
	o->min_bytes = 1024;
	o->max_bytes = quick ? (size_t)4 << 20 : (size_t)256 << 20;
	o->warmup = quick ? 2 : 5;
	o->iters = quick ? 5 : 20;
	o->dt = COMM_FP32;
}

/* One call of kind on a size of count elements in all (all_gather, reduce_scatter, all_to_all:
 * count / n per rank, all_to_all's block to each rank), out of place. */
static int call(Comm *c, CollKind kind, void *send, void *recv, size_t count, CommDtype dt,
		PxError *err)
{
	size_t per_rank = count / (size_t)comm_size(c);
	if (kind == COLL_ALL_GATHER)
		return comm_all_gather(c, send, recv, per_rank, dt, err);
	if (kind == COLL_REDUCE_SCATTER)
		return comm_reduce_scatter(c, send, recv, per_rank, dt, COMM_SUM, err);
	if (kind == COLL_ALL_TO_ALL)
		return comm_all_to_all(c, send, recv, per_rank, dt, err);
	return comm_all_reduce(c, send, recv, count, dt, COMM_SUM, err);
}

/* Warm-up, then every rank starts together (a barrier) and times iters back-to-back calls; each
 * call returns once its results are there (comm.h: blocking calls wait for the device too), so
 * the host clock measures the whole transfer, as nccl-tests' blocking mode does. */
static int time_one(Comm *c, const CollBenchOpts *o, CollKind kind, void *send, void *recv,
		    size_t count, double *time_s, PxError *err)
{
	for (int i = 0; i < o->warmup; i++)
		if (call(c, kind, send, recv, count, o->dt, err))
			return -1;
	if (comm_barrier(c, err))
		return -1;
	double t0 = px_now_s();
	for (int i = 0; i < o->iters; i++)
		if (call(c, kind, send, recv, count, o->dt, err))
			return -1;
	*time_s = (px_now_s() - t0) / o->iters;
	return 0;
}

static void *mem_alloc(const ComputeBackend *cb, void *cx, size_t bytes)
{
	return cb ? cb->alloc(cx, PLACE_GPU, bytes) : calloc(1, bytes ? bytes : 1);
}

static void mem_release(const ComputeBackend *cb, void *cx, void *p)
{
	if (!p)
		return;
	if (cb)
		cb->release(cx, PLACE_GPU, p);
	else
		free(p);
}

int collbench_max(Comm *c, const ComputeBackend *cb, void *cx, float *v, int n, PxError *err)
{
	size_t bytes = (size_t)n * sizeof(float);
	if (!cb)
		return comm_all_reduce(c, v, v, (size_t)n, COMM_FP32, COMM_MAX, err);
	void *dev = mem_alloc(cb, cx, bytes);
	if (!dev)
		return px_fail(err, PX_ERR_RUNTIME, "out of device memory for %zu bytes", bytes);
	cb->from_host(cx, dev, v, bytes);
	int rc = comm_all_reduce(c, dev, dev, (size_t)n, COMM_FP32, COMM_MAX, err);
	if (!rc)
		cb->to_host(cx, v, dev, bytes);
	mem_release(cb, cx, dev);
	return rc;
}

/* The sizes o asks for, each a whole number of elements per rank. */
static void plan_sizes(const CollBenchOpts *o, int n, CollBench *b)
{
	size_t unit = (size_t)n * comm_dtype_bytes(o->dt);
	b->n_sizes = 0;
	for (size_t s = o->min_bytes; s && s <= o->max_bytes && b->n_sizes < COLLBENCH_MAX_SIZES;
	     s *= 4) {
		size_t size = s / unit * unit;
		if (size && (b->n_sizes == 0 || size > b->size_bytes[b->n_sizes - 1]))
			b->size_bytes[b->n_sizes++] = (double)size;
	}
}

int collbench_run(Comm *c, const CollBenchOpts *o, const ComputeBackend *cb, void *cx,
		  CollBench *b, PxError *err)
{
	float t[COLLBENCH_KINDS * COLLBENCH_MAX_SIZES] = {0};
	int n = comm_size(c), rc = -1;
	size_t el = comm_dtype_bytes(o->dt);
	memset(b, 0, sizeof(*b));
	b->nranks = n;
	b->dt = o->dt;
	plan_sizes(o, n, b);
	if (!b->n_sizes)
		return px_fail(err, PX_ERR_INPUT, "collective sizes %zu to %zu bytes hold no element "
			       "per rank for %d ranks", o->min_bytes, o->max_bytes, n);
	size_t most = (size_t)b->size_bytes[b->n_sizes - 1];
	void *send = mem_alloc(cb, cx, most), *recv = mem_alloc(cb, cx, most);
	if (!send || !recv) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory for two %zu-byte collective buffers", most);
		goto out;
	}
	for (int s = 0; s < b->n_sizes; s++)
		for (int k = 0; k < COLLBENCH_KINDS; k++) {
			double dt;
			if (time_one(c, o, collbench_kinds[k], send, recv,
				     (size_t)b->size_bytes[s] / el, &dt, err))
				goto out;
			t[k * COLLBENCH_MAX_SIZES + s] = (float)dt;
		}
	/* the slowest rank's time is the collective's (nccl-tests reports the same maximum) */
	if (collbench_max(c, cb, cx, t, COLLBENCH_KINDS * COLLBENCH_MAX_SIZES, err))
		goto out;
	for (int k = 0; k < COLLBENCH_KINDS; k++)
		for (int s = 0; s < b->n_sizes; s++)
			b->time_s[k][s] = t[k * COLLBENCH_MAX_SIZES + s];
	rc = 0;
out:
	mem_release(cb, cx, send);
	mem_release(cb, cx, recv);
	return rc;
}

void collbench_envelope(const CollBench *b, int k, double *out)
{
	double least = INFINITY;
	for (int s = b->n_sizes - 1; s >= 0; s--) {
		if (b->time_s[k][s] < least)
			least = b->time_s[k][s];
		out[s] = least;
	}
}

/* ---- the profile's link ----
 * sim/opcost.c prices a collective of size S over n ranks of one link class as
 *     base_s + steps x alpha_s + S x factor / (peak x efficiency(S)),
 * steps and factor as above. The fit inverts that model so that it reproduces the measured times
 * (one rank count cannot tell a call's base latency from its steps': base_s is left 0 and
 * alpha_s holds both):
 *  - alpha_s: the smallest size's time over the ring's steps, the mean of all_gather's and
 *    reduce_scatter's. At 1 KiB the transfer itself is a small part of the time (1 KiB at 100 GB/s
 *    is 10 ns against microseconds of latency), so this is the per-step latency plus the call's
 *    own overhead, which the simulator must charge per call too. all_reduce is left out of the
 *    latency: a library may run small all-reduces with another algorithm than the ring (NCCL's
 *    tree, LL protocols; MPI's recursive doubling), whose time is not 2(n-1) ring steps; its
 *    measured small time is printed beside the fit's 2(n-1) alpha_s for comparison.
 *  - efficiency(S): the bus bandwidth of what remains once the latency is taken off, so that the
 *    latency is not counted twice (a raw busBw at a small size already contains it):
 *        efficiency = S x (n-1)/n / (t - (n-1) alpha_s) / peak,
 *    t the mean of all_gather's and reduce_scatter's times (the curve serves both). Sizes whose
 *    transfer is under a quarter of t are left out: there the difference is mostly timing noise,
 *    and the curve is flat below its first point, where the latency dominates anyway.
 *  - allreduce_scale: all_reduce's raw busBw at the largest size over all_gather's and
 *    reduce_scatter's mean there (sim/hwprofile.h's definition), within the profile's 0.25 to 4. */

#define LATENCY_SHARE 0.25

static double ag_rs_mean(const CollBench *b, int s)
{
	return (b->time_s[1][s] + b->time_s[2][s]) / 2;
}

static double clamp_eff(double e, int *clamped)
{
	if (e > 1) {
		++*clamped;
		return 1;
	}
	return e > 1e-6 ? e : 1e-6;
}

void collbench_fit(const CollBench *b, double peak_Bps, CollBenchFit *f)
{
	int n = b->nranks, last = b->n_sizes - 1, steps = collbench_ring_steps(COLL_ALL_GATHER, n);
	double factor = collbench_bus_factor(COLL_ALL_GATHER, n);
	HwCurve *c = &f->link.efficiency;
	memset(f, 0, sizeof(*f));
	for (int k = 0; k < COLLBENCH_KINDS; k++)
		for (int s = 0; s < b->n_sizes; s++)
			f->busbw_Bps[k][s] = collbench_busbw_Bps(collbench_kinds[k], n, b->size_bytes[s],
								 b->time_s[k][s]);
	if (n < 2 || last < 0)
		return;
	f->link.alpha_s = ag_rs_mean(b, 0) / steps;
	for (int s = 0; s < b->n_sizes && c->n < HW_CURVE_MAX; s++) {
		double t = ag_rs_mean(b, s), wire = t - steps * f->link.alpha_s;
		if (wire < LATENCY_SHARE * t) {
			f->n_latency++;
			continue;
		}
		c->x[c->n] = b->size_bytes[s];
		c->y[c->n++] = clamp_eff(b->size_bytes[s] * factor / wire / peak_Bps, &f->n_clamped);
	}
	if (!c->n) {
		f->raw = 1;
		c->x[0] = b->size_bytes[last];
		c->y[0] = clamp_eff(b->size_bytes[last] * factor / ag_rs_mean(b, last) / peak_Bps,
				    &f->n_clamped);
		c->n = 1;
	}
	double ring = (f->busbw_Bps[1][last] + f->busbw_Bps[2][last]) / 2;
	double scale = ring > 0 ? f->busbw_Bps[0][last] / ring : 1;
	f->link.allreduce_scale = scale < 0.25 ? 0.25 : scale > 4 ? 4 : scale;
}
