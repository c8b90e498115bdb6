/* streams: which stream a schedule's collective runs on and what must wait for it, the rules of
 * docs/time_model.md's replay table, in one place for the simulator's replay (sim/timeline.c) and
 * the executor (exec/runner.c), so that what is priced as overlapped is what runs overlapped.
 * How long anything takes is sim/'s; how a wait is done is exec/'s. */
#ifndef PX_STREAMS_H
#define PX_STREAMS_H

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
 * already run (later gathers and reductions are not the overlapped ones). */
SchedCollClass sched_coll_class(const Plan *p, const Op *op, int after_optimizer);

/* 1 when the class runs on a stream of its own, started at its op and waited for later. */
static inline int sched_coll_overlaps(SchedCollClass k)
{
	return k == SCC_PREFETCH || k == SCC_REDUCE;
}

#endif
