/* The 1-bit optimizers' section of parallax predict's report (sim/onebit.h): each kind of step's
 * bytes and time, and the run's average, as a table and as its JSON twin. */
#include "report.h"

#include <stdio.h>

#define GiB (1024.0 * 1024.0 * 1024.0)

/* The kinds in the order a run meets them. */
static const OneBitStep ORDER[N_ONEBIT_STEPS] = {ONEBIT_INIT, ONEBIT_FULL, ONEBIT_COMPRESSED,
						 ONEBIT_LOCAL};

void report_onebit_table(FILE *f, const Prediction *pr)
{
	const OneBitRun *o = &pr->onebit;
	if (!o->active)
		return;
	fprintf(f, "\n1-bit %s: communication per rank per optimizer step, by kind of step\n",
		pr->plan.sc->ds.optimizer);
	fprintf(f, "%-12s %8s %14s %14s %12s %12s\n", "step", "colls", "sent GiB", "dp sent GiB",
		"step s", "steps");
	for (int i = 0; i < N_ONEBIT_STEPS; i++) {
		int k = ORDER[i];
		if (!onebit_has_kind(o->zero_one, k))
			continue;
		char t[32], n[32];
		snprintf(t, sizeof(t), o->time_known ? "%.4f" : "-", o->step_s[k]);
		snprintf(n, sizeof(n), o->n_steps > 0 ? "%lld" : "-", o->counts[k]);
		fprintf(f, "%-12s %8lld %14.6f %14.6f %12s %12s\n", onebit_step_name(k), o->n_colls[k],
			o->wire_bytes[k] / GiB, o->dp_wire_bytes[k] / GiB, t, n);
	}
	if (o->n_steps > 0) {
		char t[32];
		snprintf(t, sizeof(t), o->time_known ? "%.4f" : "-", o->avg_step_s);
		fprintf(f, "%-12s %8s %14.6f %14.6f %12s %12lld\n", "run average", "",
			o->avg_wire_bytes / GiB, o->avg_dp_wire_bytes / GiB, t, o->n_steps);
	}
	fprintf(f, "# full: gradients all-reduced in full precision (warm-up); compressed: sign bits "
		"and one fp32 scale per rank and chunk (all-to-all, then all-gathers)%s; init: step 1, "
		"the gradients all-reduced and the still-zero momenta compressed as the error "
		"buffers are set up, no update\n",
		o->zero_one ? "; local: 0/1 Adam's steps between synchronisations" : "");
	fprintf(f, "# data-parallel volume: compressed step %.1fx less than full", o->compressed_reduction);
	if (o->n_steps > 0)
		fprintf(f, "; over the run's %lld steps (%s) %.2fx less\n", o->n_steps,
			o->steps_source, o->dp_volume_reduction);
	else
		fprintf(f, "; no run average: give scheduler.params.total_num_steps or "
			"training_args.max_steps (--set training_args.max_steps=N)\n");
	if (pr->time_known && !o->time_known)
		fprintf(f, "# step time by kind: not priced: %s\n", o->time_note);
	fprintf(f, "# error feedback: %.3f GiB per rank (worker error padded to a multiple of dp "
		"lcm(dp, 8), server error 1/dp of it)\n", o->error_bytes / GiB);
}

cJSON *report_onebit_json(const Prediction *pr)
{
	const OneBitRun *o = &pr->onebit;
	if (!o->active)
		return NULL;
	cJSON *j = cJSON_CreateObject();
	cJSON *steps = cJSON_AddObjectToObject(j, "steps");
	for (int i = 0; i < N_ONEBIT_STEPS; i++) {
		int k = ORDER[i];
		if (!onebit_has_kind(o->zero_one, k))
			continue;
		cJSON *s = cJSON_AddObjectToObject(steps, onebit_step_name(k));
		cJSON_AddNumberToObject(s, "collectives", (double)o->n_colls[k]);
		cJSON_AddNumberToObject(s, "sent_bytes", o->wire_bytes[k]);
		cJSON_AddNumberToObject(s, "dp_sent_bytes", o->dp_wire_bytes[k]);
		if (o->time_known)
			cJSON_AddNumberToObject(s, "step_s", o->step_s[k]);
		if (o->n_steps > 0)
			cJSON_AddNumberToObject(s, "count", (double)o->counts[k]);
	}
	if (pr->time_known && !o->time_known)
		cJSON_AddStringToObject(j, "step_time_not_priced", o->time_note);
	cJSON_AddNumberToObject(j, "compressed_volume_reduction", o->compressed_reduction);
	cJSON_AddNumberToObject(j, "error_feedback_bytes", o->error_bytes);
	if (o->n_steps > 0) {
		cJSON *r = cJSON_AddObjectToObject(j, "run");
		cJSON_AddNumberToObject(r, "steps", (double)o->n_steps);
		cJSON_AddStringToObject(r, "steps_from", o->steps_source);
		cJSON_AddNumberToObject(r, "sent_bytes_per_step", o->avg_wire_bytes);
		cJSON_AddNumberToObject(r, "dp_sent_bytes_per_step", o->avg_dp_wire_bytes);
		if (o->time_known)
			cJSON_AddNumberToObject(r, "step_s", o->avg_step_s);
		cJSON_AddNumberToObject(r, "dp_volume_reduction", o->dp_volume_reduction);
	}
	return j;
}
