#include "store.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/metrics.h"
#include "paths.h"

/* Notes as one text: "not modelled: ...\nwarning: ...", and why the step time was not priced
 * when it was not ("step time not priced: ..."; compare shows it beside a measured time).
 * Caller frees. */
static char *notes_text(const PxNotes *n, const Prediction *pr)
{
	size_t len = 1 + (pr->time_known ? 0 : strlen(pr->time_note) + 32);
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
	if (!pr->time_known) {
		strcat(s, "step time not priced: ");
		strcat(s, pr->time_note);
		strcat(s, "\n");
	}
	return s;
}

int store_prediction(PxDb *db, const Scenario *sc, const Prediction *pr, long long *run_id,
		     PxError *err)
{
	const Plan *p = &pr->plan;
	int rc = -1, n_stages = pr->n_stages;
	long long world = p->world;
	char *json = scenario_resolved_json(sc, world, p->dp);
	char *notes = notes_text(&sc->notes, pr);
	Metric *m = calloc((size_t)n_stages * METRICS_MAX, sizeof(*m));
	int *n = calloc((size_t)n_stages, sizeof(*n));
	/* every rank of a pipeline stage runs the same schedule and gets its stage's values */
	DbMetric *rows = calloc((size_t)world * METRICS_MAX, sizeof(*rows));
	size_t k = 0;

	if (!json || !notes || !m || !n || !rows) {
		px_fail(err, PX_ERR_RUNTIME, "out of memory storing %s", sc->name);
		goto out;
	}
	for (int s = 0; s < n_stages; s++)
		n[s] = metrics_collect(pr, s, m + (size_t)s * METRICS_MAX);
	for (long long r = 0; r < world; r++) {
		int s = (int)parallel_stage_of(&p->par, r);
		const Metric *ms = m + (size_t)s * METRICS_MAX;
		for (int i = 0; i < n[s]; i++)
			if (ms[i].known)
				rows[k++] = (DbMetric){.rank = (int)r, .name = ms[i].name,
						       .value = ms[i].value, .unit = ms[i].unit};
	}
	DbRun run = {.scenario_name = sc->name, .scenario_json = json, .kind = "predicted",
		     .status = "ok", .notes = notes, .metrics = rows, .n_metrics = k,
		     .world_size = world};
	rc = db_write_run(db, &run, run_id, err);
out:
	free(rows);
	free(n);
	free(m);
	free(notes);
	cJSON_free(json);
	return rc;
}

int store_each(const char *db_path, int quiet, void *items, int n, StoreItem store, PxError *err)
{
	PxDb *db;
	char dflt[PATH_MAX];
	const char *path = paths_db(db_path, dflt, sizeof(dflt), 1, err);
	if (!path || db_open(path, &db, err))
		return -1;
	for (int i = 0; i < n; i++) {
		long long id;
		const char *name;
		if (store(db, items, i, &name, &id, err)) {
			db_close(db);
			return -1;
		}
		if (!quiet)
			printf("# stored %s as predicted run %lld in %s\n", name, id, path);
	}
	db_close(db);
	return 0;
}
