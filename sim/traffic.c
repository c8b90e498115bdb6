#include "traffic.h"

#include <string.h>

double traffic_ring_wire_bytes(CollKind kind, double payload, int n)
{
	if (n <= 1)
		return 0;
	switch (kind) {
	case COLL_ALL_REDUCE:
		return payload * 2.0 * (n - 1) / n;
	case COLL_ALL_GATHER:
	case COLL_REDUCE_SCATTER:
	case COLL_ALL_TO_ALL:
		return payload * (double)(n - 1) / n;
	default:
		return payload;
	}
}

double traffic_payload_total(const Traffic *t)
{
	double sum = 0;
	for (int k = 0; k < N_COLLS; k++)
		sum += t->payload_bytes[k];
	return sum;
}

static void add(Traffic *t, const Op *op, double times)
{
	switch (op->kind) {
	case OP_COLL: {
		double wire = traffic_ring_wire_bytes(op->sub, op->bytes, op->nranks);
		t->payload_bytes[op->sub] += times * op->bytes;
		t->wire_bytes[op->sub] += times * wire;
		t->group_payload_bytes[op->group] += times * op->bytes;
		t->n_colls[op->sub] += (long long)times;
		t->wire_total_bytes += times * wire;
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

int sim_traffic(const Schedule *s, Traffic *t, PxError *err)
{
	double times = 1;
	memset(t, 0, sizeof(*t));
	for (int i = s->step_begin; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_LOOP) {
			if (times != 1)
				return px_fail(err, PX_ERR_RUNTIME, "schedule op %d: nested loop", i);
			times = (double)op->count;
		} else if (op->kind == OP_END_LOOP) {
			times = 1;
		} else {
			add(t, op, times);
		}
	}
	return 0;
}
