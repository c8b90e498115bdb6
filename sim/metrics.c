#include "metrics.h"

#include <stdio.h>

int metrics_put(Metric *m, int n, const char *name, double value, const char *unit)
{
	if (n >= METRICS_MAX)
		return n;
	snprintf(m[n].name, sizeof(m[n].name), "%s", name);
	m[n].value = value;
	m[n].unit = unit;
	m[n].known = 1;
	return n + 1;
}

/* The step time (the slowest stage's, the same for every rank) and this stage's breakdown. */
static int put_time(const Prediction *pr, int stage, Metric *m, int n)
{
	const TimeResult *t = &pr->time;
	const StageTime *st = pr->time_known ? &t->stages[stage] : NULL;
	const TimeBreakdown bd = st ? st->bd : (TimeBreakdown){0};
	char name[64];
	int first = n;
	n = metrics_put(m, n, "time.step_s", t->step_s, "s");
	n = metrics_put(m, n, "time.stage_end_s", st ? st->end_s : 0, "s");
	n = metrics_put(m, n, "time.slowest_stage", t->slowest, "1");
	n = metrics_put(m, n, "time.tokens_per_s", t->tokens_per_s, "tokens/s");
	n = metrics_put(m, n, "time.tflops_per_gpu", t->tflops_per_gpu, "TFLOP/s");
	n = metrics_put(m, n, "time.hw_tflops_per_gpu", t->hw_tflops_per_gpu, "TFLOP/s");
	n = metrics_put(m, n, "time.mfu", t->mfu, "1");
	n = metrics_put(m, n, "time.hfu", t->hfu, "1");
	n = metrics_put(m, n, "time.breakdown.compute_s", bd.compute_s, "s");
	n = metrics_put(m, n, "time.breakdown.fwd_s", bd.fwd_s, "s");
	n = metrics_put(m, n, "time.breakdown.bwd_s", bd.bwd_s, "s");
	n = metrics_put(m, n, "time.breakdown.recompute_s", bd.recompute_s, "s");
	n = metrics_put(m, n, "time.breakdown.optimizer_s", bd.optimizer_s, "s");
	n = metrics_put(m, n, "time.breakdown.host_wait_s", bd.host_wait_s, "s");
	n = metrics_put(m, n, "time.breakdown.bubble_s", bd.bubble_s, "s");
	n = metrics_put(m, n, "time.breakdown.offload_stall_s", bd.offload_stall_s, "s");
	for (int g = 0; g < N_GROUPS; g++) {
		snprintf(name, sizeof(name), "time.breakdown.comm.%s_s", group_name(g));
		n = metrics_put(m, n, name, bd.comm_s[g], "s");
	}
	/* a 1-bit optimizer's other kinds of step (time.step_s is the warm-up's, full) */
	const OneBitRun *o = &pr->onebit;
	for (int k = ONEBIT_COMPRESSED; o->active && k < N_ONEBIT_STEPS; k++) {
		if (!onebit_has_kind(o->zero_one, k))
			continue;
		snprintf(name, sizeof(name), "time.onebit_%s.step_s", onebit_step_name(k));
		int at = n;
		n = metrics_put(m, n, name, o->step_s[k], "s");
		if (!o->time_known && n > at)
			m[at].known = 0;
	}
	for (int i = first; !pr->time_known && i < n; i++)
		m[i].known = 0;
	return n;
}

/* A 1-bit optimizer's step of kind k: what it issues per collective kind and sends in all,
 * as comm.onebit_<kind>.* */
static int put_onebit_kind(const Prediction *pr, OneBitStep k, Metric *m, int n)
{
	char name[sizeof(m->name)];
	for (int c = 0; c < N_COLLS; c++) {
		snprintf(name, sizeof(name), "comm.onebit_%s.%s_bytes", onebit_step_name(k),
			 coll_name(c));
		n = metrics_put(m, n, name, pr->onebit.payload_bytes[k][c], "bytes");
	}
	snprintf(name, sizeof(name), "comm.onebit_%s.wire_bytes", onebit_step_name(k));
	return metrics_put(m, n, name, pr->onebit.wire_bytes[k], "bytes");
}

int metrics_collect(const Prediction *pr, int stage, Metric *m)
{
	const Plan *p = &pr->plan;
	const StagePrediction *sp = &pr->stages[stage];
	const Traffic *t = &sp->traffic;
	char name[64];
	int n = 0;

	n = metrics_put(m, n, "pipeline_stage", stage, "1");
	n = metrics_put(m, n, "memory.ideal_model_states_bytes", sp->ideal.total_bytes, "bytes");
	n = metrics_put(m, n, "memory.ideal.params_bytes", sp->ideal.params_bytes, "bytes");
	n = metrics_put(m, n, "memory.ideal.grads_bytes", sp->ideal.grads_bytes, "bytes");
	n = metrics_put(m, n, "memory.ideal.optimizer_bytes", sp->ideal.optimizer_bytes, "bytes");
	for (int pl = 0; pl < N_PLACES; pl++) {
		const MemPlace *mp = &sp->mem.place[pl];
		for (int c = 0; c < N_CATS; c++) {
			snprintf(name, sizeof(name), "memory.%s.%s_bytes", place_name(pl), cat_name(c));
			n = metrics_put(m, n, name, mp->at_peak[c], "bytes");
			if (pl == PLACE_GPU && c == CAT_ACTIV && !p->activations_known)
				m[n - 1].known = 0;
		}
		if (pl == PLACE_GPU) { /* each category's own peak, e.g. activations' */
			for (int c = 0; c < N_CATS; c++) {
				snprintf(name, sizeof(name), "memory.gpu.peak.%s_bytes", cat_name(c));
				n = metrics_put(m, n, name, mp->cat_peak[c], "bytes");
				if (c == CAT_ACTIV && !p->activations_known)
					m[n - 1].known = 0;
			}
		}
		snprintf(name, sizeof(name), "memory.%s.%s", place_name(pl),
			 pl == PLACE_NVME ? "bytes" : "peak_bytes");
		n = metrics_put(m, n, name, mp->peak_bytes, "bytes");
	}
	if (p->cuda_runtime) { /* the CUDA runtime's parts of the overhead, as the cluster gives them */
		const ClusterSpec *c = &p->sc->cluster;
		n = metrics_put(m, n, "memory.gpu.runtime.cuda_context_bytes", c->cuda_context_bytes, "bytes");
		n = metrics_put(m, n, "memory.gpu.runtime.cublas_workspace_bytes", c->cublas_workspace_bytes,
			"bytes");
		n = metrics_put(m, n, "memory.gpu.runtime.nccl_bytes", c->nccl_buffers_bytes, "bytes");
	}
	if (sp->alloc_known) { /* PyTorch's caching allocator, modelled (sim/allocator.h) */
		n = metrics_put(m, n, "memory.gpu.torch.max_allocated_bytes", sp->alloc.allocated_bytes,
			"bytes");
		n = metrics_put(m, n, "memory.gpu.torch.max_reserved_bytes", sp->alloc.reserved_bytes, "bytes");
		n = metrics_put(m, n, "memory.gpu.smi_peak_bytes", sp->alloc.smi_bytes, "bytes");
	}
	n = metrics_put(m, n, "memory.gpu_capacity_bytes", pr->gpu_capacity_bytes, "bytes");
	n = metrics_put(m, n, "memory.cpu_capacity_bytes", pr->cpu_capacity_bytes, "bytes");
	n = metrics_put(m, n, "memory.nvme_capacity_bytes", pr->nvme_capacity_bytes, "bytes");
	n = metrics_put(m, n, "memory.fits", sp->fits, "1");
	/* the verdict (0 fits, 1 tight, 2 does not fit), the figures it came from, and the moment
	 * of the GPU peak (phase: sim/moment.h's PeakPhase; unit -1 and micro-batch 0: none) */
	n = metrics_put(m, n, "memory.verdict", sp->verdict, "1");
	n = metrics_put(m, n, "memory.gpu_memory_bytes", pr->gpu_memory_bytes, "bytes");
	n = metrics_put(m, n, "memory.gpu_margin_bytes", pr->gpu_margin_bytes, "bytes");
	n = metrics_put(m, n, "memory.gpu_margin_fraction", PREDICT_TIGHT_MARGIN, "1");
	n = metrics_put(m, n, "memory.gpu.peak_moment.phase", sp->gpu_moment.phase, "1");
	n = metrics_put(m, n, "memory.gpu.peak_moment.unit", sp->gpu_moment.unit, "1");
	n = metrics_put(m, n, "memory.gpu.peak_moment.micro_batch", sp->gpu_moment.micro_batch, "1");

	for (int k = 0; k < N_COLLS; k++) {
		snprintf(name, sizeof(name), "comm.%s_bytes", coll_name(k));
		n = metrics_put(m, n, name, t->payload_bytes[k], "bytes");
	}
	n = metrics_put(m, n, "comm.wire_bytes", t->wire_total_bytes, "bytes");
	n = metrics_put(m, n, "comm.link.intra_node_bytes", t->intra_node_bytes, "bytes");
	n = metrics_put(m, n, "comm.link.inter_node_bytes", t->inter_node_bytes, "bytes");
	n = metrics_put(m, n, "comm.link.node_egress_bytes", t->node_egress_bytes, "bytes");
	for (int g = 0; g < N_GROUPS; g++) {
		snprintf(name, sizeof(name), "comm.group.%s_bytes", group_name(g));
		n = metrics_put(m, n, name, t->group_payload_bytes[g], "bytes");
		snprintf(name, sizeof(name), "comm.group_wire.%s_bytes", group_name(g));
		n = metrics_put(m, n, name, t->group_wire_bytes[g], "bytes");
	}
	/* a 1-bit optimizer's compressed steps and its initialisation step (stage 0's rank,
	 * sim/onebit.h; the figures above are the warm-up's steps'), and 0/1 Adam's local steps'
	 * wire bytes */
	if (pr->onebit.active && stage == 0) {
		n = put_onebit_kind(pr, ONEBIT_COMPRESSED, m, n);
		if (pr->onebit.zero_one)
			n = metrics_put(m, n, "comm.onebit_local.wire_bytes",
					pr->onebit.wire_bytes[ONEBIT_LOCAL], "bytes");
		n = put_onebit_kind(pr, ONEBIT_INIT, m, n);
	}
	for (int d = 0; d < N_COPIES; d++) {
		snprintf(name, sizeof(name), "copy.%s_bytes", copy_name(d));
		n = metrics_put(m, n, name, t->copy_bytes[d], "bytes");
	}
	n = metrics_put(m, n, "compute.flops", t->flops_total, "flops");
	return put_time(pr, stage, m, n);
}
