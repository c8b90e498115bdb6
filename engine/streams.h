/* streams: which stream a schedule's collective runs on and what must wait for it, the rules of
 * docs/time_model.md's replay table, in one place for the simulator's replay (sim/timeline.c) and
 * the executor (exec/runner.c), so that what is priced as overlapped is what runs overlapped.
 * How long anything takes is sim/'s; how a wait is done is exec/'s. */
#ifndef PX_STREAMS_H
#define PX_STREAMS_H

#include "build.h"
#include "plan.h"
#include "schedule.h"

typedef enum {
	SCC_SYNC,       /* blocks the compute stream (tp/ep, gathers after the optimizer) */
	SCC_BARRIER,    /* waits for every stream, then blocks (one-value all-reduces) */
	SCC_PREFETCH,   /* stage-3 parameter gather on the prefetch stream; the compute of the unit
			   its buffer serves waits for it */
	SCC_REDUCE,     /* gradient reduction on the reduction stream (overlap_comm), from the end
			   of the backward before it; waited for by the optimizer, the step's end
			   and whatever reuses its buffer */
	SCC_SEND,       /* pipeline send: blocks for its transfer */
	SCC_RECV,       /* pipeline receive: completes with the matching send */
	SCC_RENDEZVOUS, /* a pipeline-group collective: starts when every member stage is there */
} SchedCollClass;

/* The class of collective op in plan p's schedule, from its kind, group and role. Inline: the replay asks
 * it for every collective of every priced point (a call into another file cost make bench's
 * shard 0/10 about 11%: 16,500 against 18,600 points per CPU-second).
 * Pipeline sends and receives couple stages; tensor- and expert-parallel collectives block the
 * compute stream (Megatron does not overlap them); stage-3 parameter prefetches run on the
 * prefetch stream; gradient reductions on the reduction stream when a ZeRO optimizer has
 * overlap_comm on, or under plain PyTorch's DistributedDataParallel, else on the compute stream (without ZeRO, and under BF16_Optimizer, the
 * engine reduces in allreduce_gradients after the backward, reading no overlap_comm: engine.py
 * buffered_allreduce_fallback); the one-value all-reduces (fp16 overflow, gradient norm) need every
 * reduction done first; the rest (parameter all-gathers after the update) block. */
static inline SchedCollClass sched_coll_class(const Plan *p, const Op *op)
{
	int g = op->group, kind = op->sub;
	int zero_group = g == GROUP_DP || g == GROUP_EDP || g == GROUP_HPZ || g == GROUP_NODE ||
			 g == GROUP_XNODE;
	if (kind == COLL_P2P)
		return SCC_SEND;
	if (kind == COLL_P2P_RECV)
		return SCC_RECV;
	if (g == GROUP_PP)
		return SCC_RENDEZVOUS;
	if (g == GROUP_TP || g == GROUP_EP)
		return SCC_SYNC;
	if (op->role == ROLE_OVERFLOW || op->role == ROLE_GRAD_NORM)
		return SCC_BARRIER;
	if (!zero_group)
		return SCC_SYNC;
	if (op->role == ROLE_PREFETCH)
		return SCC_PREFETCH;
	if (op->role == ROLE_GRAD_REDUCE)
		return p->overlap_comm ? SCC_REDUCE : SCC_SYNC;
	return SCC_SYNC;
}

/* 1 when the class runs on a stream of its own, started at its op and waited for later. */
static inline int sched_coll_overlaps(SchedCollClass k)
{
	return k == SCC_PREFETCH || k == SCC_REDUCE;
}

#endif
