#include "onebit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "predict.h"

/* Stage 0's traffic (and, with hw, every stage's time) for steps of kind k. The prediction's own
 * schedules are the warm-up's (ONEBIT_FULL) and are read as they are. */
static int price_kind(Prediction *pr, OneBitStep k, const HwProfile *hw, PxError *err)
{
	Plan *p = &pr->plan;
	OneBitRun *o = &pr->onebit;
	int n = pr->n_stages, rc = 0;
	Schedule *st[4096];
	Traffic t;
	if (n > 4096)
		return px_fail(err, PX_ERR_INPUT, "more than 4096 pipeline stages");
	Schedule *own = calloc((size_t)n, sizeof(*own));
	if (!own)
		return px_fail(err, PX_ERR_RUNTIME, "out of memory");
	p->onebit_step = k;
	int built = 0;
	for (; built < n && !rc; built++) {
		rc = k == ONEBIT_FULL ? 0 : build_schedule(p, built, &own[built], err);
		st[built] = k == ONEBIT_FULL ? &pr->stages[built].sched : &own[built];
	}
	if (!rc)
		rc = sim_traffic(st[0], p->spans, p->par.algo, p->sc->cluster.gpus_per_node, &t, err);
	if (!rc) {
		o->wire_bytes[k] = t.wire_total_bytes;
		o->dp_wire_bytes[k] = t.group_wire_bytes[GROUP_DP];
		o->n_colls[k] = 0;
		for (int c = 0; c < N_COLLS; c++)
			o->n_colls[k] += t.n_colls[c], o->payload_bytes[k][c] = t.payload_bytes[c];
	}
	if (!rc && hw && o->time_known) {
		TimeResult tr;
		PxError why = {0};
		memset(&tr, 0, sizeof(tr));
		if (timeline_run(p, st, hw, &tr, &why)) {
			if (why.code == PX_ERR_RUNTIME)
				rc = px_fail(err, why.code, "%s", why.msg);
			o->time_known = 0;
			snprintf(o->time_note, sizeof(o->time_note), "the %s step: %.450s",
				 onebit_step_name(k), why.msg);
		} else {
			o->step_s[k] = tr.step_s;
		}
		timeline_result_free(&tr);
	}
	p->onebit_step = ONEBIT_FULL;
	for (int s = 0; s < built && k != ONEBIT_FULL; s++)
		sched_free(&own[s]);
	free(own);
	return rc;
}

int sim_onebit_price(Prediction *pr, const HwProfile *hw, PxError *err)
{
	OneBitRun *o = &pr->onebit;
	const Scenario *sc = pr->plan.sc;
	const OptimKind *k = sc->ds.opt;
	memset(o, 0, sizeof(*o));
	if (!k || k->error_feedback == EF_NONE || pr->plan.dp < 2)
		return 0;
	o->active = 1;
	o->zero_one = optim_zero_one(k);
	o->error_bytes = pr->plan.stages[0].error_feedback_bytes;
	o->time_known = hw && pr->time_known;
	for (OneBitStep s = 0; s < N_ONEBIT_STEPS; s++) {
		if (!onebit_has_kind(o->zero_one, s))
			continue;
		if (price_kind(pr, s, hw, err))
			return -1;
	}
	if (o->time_known)
		o->step_s[ONEBIT_FULL] = pr->time.step_s;
	if (sc->ds.total_num_steps > 0)
		o->n_steps = sc->ds.total_num_steps, o->steps_source = "scheduler.params.total_num_steps";
	else if (sc->train_args.max_steps > 0)
		o->n_steps = sc->train_args.max_steps, o->steps_source = "training_args.max_steps";
	if (o->dp_wire_bytes[ONEBIT_COMPRESSED] > 0)
		o->compressed_reduction = o->dp_wire_bytes[ONEBIT_FULL] /
					  o->dp_wire_bytes[ONEBIT_COMPRESSED];
	if (o->n_steps <= 0)
		return 0;
	onebit_count_steps(&sc->ds.onebit, o->zero_one, o->n_steps, o->counts);
	for (OneBitStep s = 0; s < N_ONEBIT_STEPS; s++) {
		double f = (double)o->counts[s] / (double)o->n_steps;
		o->avg_wire_bytes += f * o->wire_bytes[s];
		o->avg_dp_wire_bytes += f * o->dp_wire_bytes[s];
		o->avg_step_s += f * o->step_s[s];
	}
	if (o->avg_dp_wire_bytes > 0)
		o->dp_volume_reduction = o->dp_wire_bytes[ONEBIT_FULL] / o->avg_dp_wire_bytes;
	return 0;
}
