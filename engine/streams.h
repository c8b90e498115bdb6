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

/* The class of collective op in plan p's schedule; after_optimizer: the step's optimizer has
 * already run (later gathers and reductions are not the overlapped ones). Inline: the replay asks
 * it for every collective of every priced point (a call into another file cost make bench's
 * shard 0/10 about 11%: 16,500 against 18,600 points per CPU-second).
 * Pipeline sends and receives couple stages; tensor- and expert-parallel collectives block the
 * compute stream (Megatron does not overlap them); stage-3 parameter gathers before the optimizer
 * run on the prefetch stream; gradient reductions before it on the reduction stream when
 * overlap_comm is on, else on the compute stream; the one-value all-reduces (fp16 overflow,
 * gradient norm) need every reduction done first; the rest (parameter all-gathers after the
 * optimizer) block. */
static inline SchedCollClass sched_coll_class(const Plan *p, const Op *op, int after_optimizer)
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
	if (op->unit == BUILD_UNIT_OVERFLOW || op->unit == BUILD_UNIT_GRAD_NORM)
		return SCC_BARRIER;
	if (!zero_group || after_optimizer)
		return SCC_SYNC;
	if (kind == COLL_ALL_GATHER)
		return op->unit >= 0 ? SCC_PREFETCH : SCC_SYNC;
	if (kind == COLL_REDUCE_SCATTER || kind == COLL_ALL_REDUCE || kind == COLL_ALL_TO_ALL)
		return p->sc->ds.zero.overlap_comm ? SCC_REDUCE : SCC_SYNC;
	return SCC_SYNC;
}

/* 1 when the class runs on a stream of its own, started at its op and waited for later. */
static inline int sched_coll_overlaps(SchedCollClass k)
{
	return k == SCC_PREFETCH || k == SCC_REDUCE;
}

#endif
