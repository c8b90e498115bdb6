#include "streams.h"

#include "build.h"

/* Pipeline sends and receives couple stages; tensor- and expert-parallel collectives block the
 * compute stream (Megatron does not overlap them); stage-3 parameter gathers before the optimizer
 * run on the prefetch stream; gradient reductions before it on the reduction stream when
 * overlap_comm is on, else on the compute stream; the one-value all-reduces (fp16 overflow,
 * gradient norm) need every reduction done first; the rest (parameter all-gathers after the
 * optimizer) block. */
SchedCollClass sched_coll_class(const Plan *p, const Op *op, int after_optimizer)
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
