/* opcost: how long one op of a schedule takes on a rank: a compute op (its GEMMs against the
 * GPU's peak and the profile's efficiency curve, its memory-bound work against HBM), a collective
 * (latency plus wire bytes over NVLink or the network), a host or NVMe copy; and a cache that
 * prices each distinct op once per replay. A CPU profile's ops are opcost_cpu.c's. When ops run,
 * and what waits for what, is timeline.c's. Formulas and sources: docs/time_model.md. */
#ifndef PX_SIM_OPCOST_H
#define PX_SIM_OPCOST_H

#include "../engine/plan.h"
#include "../engine/schedule.h"
#include "hwprofile.h"

/* Durations on a rank of pipeline stage `stage`, in seconds. A collective (a receive costs 0: its
 * send carries the bytes); P2P sends go to the next stage when forward is 1, to the previous one
 * otherwise. */
double opcost_coll_s(const Plan *p, const HwProfile *hw, const Op *op, int stage, int forward);
double opcost_compute_s(const Plan *p, const HwProfile *hw, const Op *op, int stage);
/* The same, and in *host_wait_s (when not NULL) how much of it the GPU waits for the host to
 * issue the pass's kernels: its kernels' issue time over its GPU time, or 0 (host overhead,
 * docs/time_model.md). */
double opcost_compute_wait_s(const Plan *p, const HwProfile *hw, const Op *op, int stage,
			     double *host_wait_s);
double opcost_copy_s(const Plan *p, const HwProfile *hw, const Op *op);

/* The dense peak of the plan's compute dtype on its GPU, FLOP/s (bf16, fp16; fp32 otherwise). */
/* The precision the GEMMs run in: the training dtype (DeepSpeed's and the executor's alike: the
 * executor's units compute on working copies in the parameters' dtype), or torch autocast's. */
Dtype opcost_compute_dtype(const Plan *p);
double opcost_dtype_peak(const Plan *p);

/* Durations of compute ops and collectives, each priced once and then looked up by everything it
 * depends on, compared exactly: the same value opcost_compute_s or opcost_coll_s would give. One
 * cache serves one plan and one profile (a replay); create returns NULL when out of memory,
 * destroy accepts NULL. */
typedef struct OpCostCache OpCostCache;
OpCostCache *opcost_cache_create(void);
void opcost_cache_destroy(OpCostCache *c);
double opcost_cached_s(OpCostCache *c, const Plan *p, const HwProfile *hw, const Op *op, int stage,
		       int forward);
/* The same, with a compute op's host wait in *host_wait_s (0 for other ops). */
double opcost_cached_wait_s(OpCostCache *c, const Plan *p, const HwProfile *hw, const Op *op,
			    int stage, int forward, double *host_wait_s);

#endif
