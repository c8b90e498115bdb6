#include "store.h"

#include <stdlib.h>
#include <string.h>

#include "../sim/metrics.h"

/* Notes as one text: "not modelled: ...\nwarning: ...". Caller frees. */
static char *notes_text(const PxNotes *n)
{
	size_t len = 1;
	for (int i = 0; i < n->n_not_modelled; i++)
		len += strlen(n->not_modelled[i]) + 16;
	for (int i = 0; i < n->n_warnings; i++)
		len += strlen(n->warnings[i]) + 2;
	char *s = calloc(len, 1);
	if (!s)
		return NULL;
	for (int i = 0; i < n->n_not_modelled; i++) {
		strcat(s, "not modelled: ");
		strcat(s, n->not_modelled[i]);
		strcat(s, "\n");
	}
	for (int i = 0; i < n->n_warnings; i++) {
		strcat(s, n->warnings[i]);
		strcat(s, "\n");
	}
	return s;
}

int store_prediction(PxDb *db, const Scenario *sc, const Prediction *pr, long long *run_id,
		     PxError *err)
{
	Metric m[METRICS_MAX];
	int n = metrics_collect(pr, m), rc = -1;
	long long world = pr->plan.world;
	char *json = scenario_resolved_json(sc, world, pr->plan.dp);
	char *notes = notes_text(&sc->notes);
	/* every data-parallel rank runs the same schedule, so each gets the same values */
	DbMetric *rows = calloc((size_t)(n * world), sizeof(*rows));
	size_t k = 0;

	if (!json || !notes || !rows) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory storing %s", sc->name);
		goto out;
	}
	for (long long r = 0; r < world; r++)
		for (int i = 0; i < n; i++)
			if (m[i].known)
				rows[k++] = (DbMetric){.rank = (int)r, .name = m[i].name,
						       .value = m[i].value, .unit = m[i].unit};
	DbRun run = {.scenario_name = sc->name, .scenario_json = json, .kind = "predicted",
		     .status = "ok", .notes = notes, .metrics = rows, .n_metrics = k};
	rc = db_write_run(db, &run, run_id, err);
out:
	free(rows);
	free(notes);
	cJSON_free(json);
	return rc;
}
