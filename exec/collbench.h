/* collbench: time the executor's collectives the way nccl-tests does (all_reduce, all_gather,
 * reduce_scatter and all_to_all from 1 KiB up by factors of 4, warm-up then timed repetitions,
 * each size's time the slowest rank's), its algorithm and bus bandwidths, and the latency and
 * efficiency curve a hardware profile's link takes from them. It owns no communicator and no device: the caller
 * passes a Comm, and buffers come from a compute backend's device memory or the host. Writing the
 * profile is the CLI's; what the link's fields mean to the simulator is sim/hwprofile's. */
#ifndef PX_EXEC_COLLBENCH_H
#define PX_EXEC_COLLBENCH_H

#include <stddef.h>

#include "../sim/hwprofile.h"
#include "comm.h"
#include "compute.h"

#define COLLBENCH_KINDS 4
#define COLLBENCH_MAX_SIZES 12

/* The kinds timed, in the order of CollBench's rows: all_reduce, all_gather, reduce_scatter,
 * all_to_all (the 1-bit optimizers' and expert parallelism's). */
extern const CollKind collbench_kinds[COLLBENCH_KINDS];

/* ---- formulas (nccl-tests' doc/PERFORMANCE.md) ---- */

/* busBw over algBw: 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
 * all_to_all; 0 for other kinds or n < 2. */
double collbench_bus_factor(CollKind kind, int n);
/* Steps of a ring: 2(n-1) for all_reduce (reduce-scatter then all-gather), n-1 for the others
 * (all_to_all: the pairwise exchange's n-1 partners). */
int collbench_ring_steps(CollKind kind, int n);
/* algBw = size / time, size the whole array in bytes (nccl-tests "size") */
double collbench_algbw_Bps(double size_bytes, double time_s);
double collbench_busbw_Bps(CollKind kind, int n, double size_bytes, double time_s);

/* ---- measuring ---- */

typedef struct CollBenchOpts {
	size_t min_bytes, max_bytes; /* sizes min x 4^k up to max (at most COLLBENCH_MAX_SIZES) */
	int warmup, iters;           /* untimed calls, then timed ones, per size and kind */
	CommDtype dt;
} CollBenchOpts;

/* min 1 KiB, max 256 MiB (quick: 4 MiB), 5 + 20 calls (quick: 2 + 5), fp32: nccl-tests' defaults
 * of -w 5 -n 20 -d float. */
void collbench_opts_init(CollBenchOpts *o, int quick);

typedef struct CollBench {
	int nranks;
	CommDtype dt;
	int n_sizes;
	double size_bytes[COLLBENCH_MAX_SIZES];                /* nccl-tests "size", increasing */
	double time_s[COLLBENCH_KINDS][COLLBENCH_MAX_SIZES];   /* one call, the slowest rank's mean */
} CollBench;

/* Every rank of c calls it alike. Buffers are cb's device memory (PLACE_GPU, context cx), or host
 * memory when cb is NULL. Sizes are rounded down to a multiple of n x the element size
 * (all_gather, reduce_scatter and all_to_all split the array evenly); a size under one element
 * per rank is left out. Fills b on every rank. 0, or -1 with err (a collective's error, out of memory). */
int collbench_run(Comm *c, const CollBenchOpts *o, const ComputeBackend *cb, void *cx,
		  CollBench *b, PxError *err);

/* Kind k's times (row k of b) as a size curve reads them: each size's time the least of its own
 * and every larger size's. A collective of more bytes does not take less time, so a point above a
 * larger size's is a burst of other load on a shared machine that the rounds did not filter
 * out. out: b->n_sizes values. */
void collbench_envelope(const CollBench *b, int k, double *out);

/* The element-wise maximum over c's ranks of n host floats, in place, through cb's device memory
 * when cb is not NULL (NCCL reads device memory only). */
int collbench_max(Comm *c, const ComputeBackend *cb, void *cx, float *v, int n, PxError *err);

/* ---- the profile's link ---- */

typedef struct CollBenchFit {
	HwLink link;       /* alpha_s, efficiency over peak (clamped into (0, 1]), allreduce_scale */
	int n_latency;     /* smallest sizes left out of the curve: latency-bound (see collbench.c) */
	int n_clamped;     /* points above the peak, recorded as 1 */
	int raw;           /* every size was latency-bound: the curve is the largest size's busBw */
	double busbw_Bps[COLLBENCH_KINDS][COLLBENCH_MAX_SIZES]; /* nccl-tests' busBw, for tables */
} CollBenchFit;

/* Fit the simulator's model of a link (sim/opcost.c: a ring of n-1 steps of alpha_s each, twice
 * for all_reduce, plus size x bus factor / (peak x efficiency)) to b. peak_Bps: the link's
 * one-direction peak per GPU. */
void collbench_fit(const CollBench *b, double peak_Bps, CollBenchFit *f);

#endif
