#include "traffic.h"

#include <string.h>

static double wire_scale = 1; /* traffic_test_set_wire_scale's */

void traffic_test_set_wire_scale(double scale)
{
	wire_scale = scale;
}

static double ring_wire_bytes(CollKind kind, double payload, int n)
{
	switch (kind) {
	case COLL_ALL_REDUCE:
		return n <= 1 ? 0 : payload * 2.0 * (n - 1) / n;
	case COLL_ALL_GATHER:
	case COLL_REDUCE_SCATTER:
	case COLL_ALL_TO_ALL:
		return n <= 1 ? 0 : payload * (double)(n - 1) / n;
	case COLL_P2P_RECV:
		return 0;
	default:
		return n <= 1 && kind != COLL_P2P ? 0 : payload;
	}
}

double traffic_ring_wire_bytes(CollKind kind, double payload, int n)
{
	return ring_wire_bytes(kind, payload, n) * wire_scale;
}

void traffic_split(CollKind kind, double payload, GroupSpan sp, CollAlgo algo, double *intra,
		   double *inter)
{
	double wire = traffic_ring_wire_bytes(kind, payload, (int)sp.n);
	double n = (double)sp.n, nodes = (double)sp.nodes, g = (double)sp.per_node;
	*intra = wire, *inter = 0;
	if (sp.nodes <= 1 || wire == 0)
		return;
	if (kind == COLL_ALL_TO_ALL) {
		*inter = payload * (n - g) / n;
		*intra = payload * (g - 1) / n;
	} else if (kind == COLL_P2P) { /* stage boundaries that fall between nodes */
		*inter = payload * (nodes - 1) / (n - 1);
		*intra = payload - *inter;
	} else if (algo != ALGO_RING &&
		   (kind == COLL_ALL_REDUCE || kind == COLL_ALL_GATHER || kind == COLL_REDUCE_SCATTER)) {
		double f = kind == COLL_ALL_REDUCE ? 2 : 1;
		*intra = f * payload * (g - 1) / g;
		*inter = f * (payload / g) * (nodes - 1) / nodes;
	} else { /* a ring in rank order: nodes of its n links leave a node */
		*inter = wire * nodes / n;
		*intra = wire - *inter;
	}
}

double traffic_payload_total(const Traffic *t)
{
	double sum = 0;
	for (int k = 0; k < N_COLLS; k++)
		if (k != COLL_P2P_RECV)
			sum += t->payload_bytes[k];
	return sum;
}

static void add(Traffic *t, const Op *op, double times, const GroupSpan *spans, CollAlgo algo)
{
	switch (op->kind) {
	case OP_COLL: {
		GroupSpan sp = spans[op->group];
		if (op->nranks < sp.n) /* a subset of the group (a pipeline's first and last stage,
					  for the tied embedding): apart when the group spans nodes */
			sp = sp.nodes > 1 ? (GroupSpan){op->nranks, op->nranks, 1} :
					    (GroupSpan){op->nranks, 1, op->nranks};
		sp.n = op->nranks;
		double intra, inter;
		traffic_split(op->sub, op->bytes, sp, algo, &intra, &inter);
		double wire = intra + inter;
		t->payload_bytes[op->sub] += times * op->bytes;
		t->wire_bytes[op->sub] += times * wire;
		t->n_colls[op->sub] += (long long)times;
		if (op->sub != COLL_P2P_RECV)
			t->group_payload_bytes[op->group] += times * op->bytes;
		t->group_wire_bytes[op->group] += times * wire;
		t->wire_total_bytes += times * wire;
		t->intra_node_bytes += times * intra;
		t->inter_node_bytes += times * inter;
		break;
	}
	case OP_COPY:
		t->copy_bytes[op->sub] += times * op->bytes;
		break;
	case OP_COMPUTE:
		t->flops[op->sub] += times * op->flops;
		t->flops_total += times * op->flops;
		break;
	default:
		break;
	}
}

int sim_traffic(const Schedule *s, const GroupSpan *spans, CollAlgo algo, long long gpus_per_node,
		Traffic *t, PxError *err)
{
	double times = 1;
	SchedWalk w;
	int i;
	memset(t, 0, sizeof(*t));
	sched_walk_init(&w, s, s->step_begin);
	for (; (i = sched_walk_op(&w, err)) >= 0; sched_walk_advance(&w)) { /* a body once, times */
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP) {
			times = (double)op->count;
		} else if (op->kind == OP_END_LOOP) {
			times = 1;
			sched_walk_leave(&w);
		} else {
			add(t, op, times, spans, algo);
		}
	}
	if (i == SCHED_WALK_ERROR)
		return -1;
	t->node_egress_bytes = t->inter_node_bytes * (double)gpus_per_node;
	return 0;
}
