#include "metrics.h"

#include <stdio.h>

static int put(Metric *m, int n, const char *name, double value, const char *unit)
{
	if (n >= METRICS_MAX)
		return n;
	snprintf(m[n].name, sizeof(m[n].name), "%s", name);
	m[n].value = value;
	m[n].unit = unit;
	m[n].known = 1;
	return n + 1;
}

int metrics_collect(const Prediction *pr, int stage, Metric *m)
{
	const Plan *p = &pr->plan;
	const StagePrediction *sp = &pr->stages[stage];
	const Traffic *t = &sp->traffic;
	char name[64];
	int n = 0;

	n = put(m, n, "pipeline_stage", stage, "1");
	n = put(m, n, "memory.ideal_model_states_bytes", sp->ideal.total_bytes, "bytes");
	n = put(m, n, "memory.ideal.params_bytes", sp->ideal.params_bytes, "bytes");
	n = put(m, n, "memory.ideal.grads_bytes", sp->ideal.grads_bytes, "bytes");
	n = put(m, n, "memory.ideal.optimizer_bytes", sp->ideal.optimizer_bytes, "bytes");
	for (int pl = 0; pl < N_PLACES; pl++) {
		const MemPlace *mp = &sp->mem.place[pl];
		for (int c = 0; c < N_CATS; c++) {
			snprintf(name, sizeof(name), "memory.%s.%s_bytes", place_name(pl), cat_name(c));
			n = put(m, n, name, mp->at_peak[c], "bytes");
			if (pl == PLACE_GPU && c == CAT_ACTIV && !p->activations_known)
				m[n - 1].known = 0;
		}
		if (pl == PLACE_GPU) { /* each category's own peak, e.g. activations' */
			for (int c = 0; c < N_CATS; c++) {
				snprintf(name, sizeof(name), "memory.gpu.peak.%s_bytes", cat_name(c));
				n = put(m, n, name, mp->cat_peak[c], "bytes");
				if (c == CAT_ACTIV && !p->activations_known)
					m[n - 1].known = 0;
			}
		}
		snprintf(name, sizeof(name), "memory.%s.%s", place_name(pl),
			 pl == PLACE_NVME ? "bytes" : "peak_bytes");
		n = put(m, n, name, mp->peak_bytes, "bytes");
	}
	n = put(m, n, "memory.gpu_capacity_bytes", pr->gpu_capacity_bytes, "bytes");
	n = put(m, n, "memory.cpu_capacity_bytes", pr->cpu_capacity_bytes, "bytes");
	n = put(m, n, "memory.nvme_capacity_bytes", pr->nvme_capacity_bytes, "bytes");
	n = put(m, n, "memory.fits", sp->fits, "1");

	for (int k = 0; k < N_COLLS; k++) {
		snprintf(name, sizeof(name), "comm.%s_bytes", coll_name(k));
		n = put(m, n, name, t->payload_bytes[k], "bytes");
	}
	n = put(m, n, "comm.wire_bytes", t->wire_total_bytes, "bytes");
	n = put(m, n, "comm.link.intra_node_bytes", t->intra_node_bytes, "bytes");
	n = put(m, n, "comm.link.inter_node_bytes", t->inter_node_bytes, "bytes");
	n = put(m, n, "comm.link.node_egress_bytes", t->node_egress_bytes, "bytes");
	for (int g = 0; g < N_GROUPS; g++) {
		snprintf(name, sizeof(name), "comm.group.%s_bytes", group_name(g));
		n = put(m, n, name, t->group_payload_bytes[g], "bytes");
		snprintf(name, sizeof(name), "comm.group_wire.%s_bytes", group_name(g));
		n = put(m, n, name, t->group_wire_bytes[g], "bytes");
	}
	for (int d = 0; d < N_COPIES; d++) {
		snprintf(name, sizeof(name), "copy.%s_bytes", copy_name(d));
		n = put(m, n, name, t->copy_bytes[d], "bytes");
	}
	n = put(m, n, "compute.flops", t->flops_total, "flops");
	return n;
}
