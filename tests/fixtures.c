#include "fixtures.h"

#include <CUnit/CUnit.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

int fx_load(Scenario *sc, const char *json)
{
	char path[512];
	PxError err = {0};
	snprintf(path, sizeof(path), "%s/scenario.json", px_test_tmpdir());
	px_test_write_file(path, json);
	if (scenario_load(sc, path, NULL, &err)) {
		fprintf(stderr, "\nfixture: %s\n", err.msg);
		CU_FAIL("scenario_load failed");
		return -1;
	}
	return 0;
}

int fx_predict(Scenario *sc, Prediction *pr, const char *json)
{
	PxError err = {0};
	if (fx_load(sc, json))
		return -1;
	if (predict_run(sc, pr, &err)) {
		fprintf(stderr, "\nfixture: %s\n", err.msg);
		CU_FAIL("predict_run failed");
		scenario_free(sc);
		return -1;
	}
	return 0;
}

int fx_noted(const PxNotes *n, const char *fragment)
{
	for (int i = 0; i < n->n_warnings; i++)
		if (strstr(n->warnings[i], fragment))
			return 1;
	for (int i = 0; i < n->n_not_modelled; i++)
		if (strstr(n->not_modelled[i], fragment))
			return 1;
	return 0;
}

int fx_predictf(Scenario *sc, Prediction *pr, const char *fmt, ...)
{
	char json[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(json, sizeof(json), fmt, ap);
	va_end(ap);
	return fx_predict(sc, pr, json);
}

void fx_free(Scenario *sc, Prediction *pr)
{
	predict_free(pr);
	scenario_free(sc);
}

int fx_live_bufs(const Schedule *s, int from, int what, int *allocs, int *left)
{
	int live = 0, most = 0, n = 0;
	char *ours = calloc((size_t)s->n_bufs + 1, 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ours);
	for (int i = from; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind == OP_ALLOC && op->what == what) {
			ours[op->buf] = 1, n++;
			most = ++live > most ? live : most;
		} else if (op->kind == OP_FREE && op->buf >= 0 && ours[op->buf]) {
			live--;
		}
	}
	free(ours);
	if (allocs)
		*allocs = n;
	if (left)
		*left = live;
	return most;
}

void fx_refused(const char *path, const JsonOverrides *ov, PxError *err)
{
	Scenario sc;
	Prediction pr;
	int rc = scenario_load(&sc, path, ov, err);
	if (rc == 0) {
		rc = predict_run(&sc, &pr, err);
		if (rc == 0)
			predict_free(&pr);
		scenario_free(&sc);
	}
	CU_ASSERT_EQUAL(rc, -1);
	CU_ASSERT_EQUAL(err->code, PX_ERR_INPUT);
}

const char *fx_model(const char *name)
{
	static char buf[4][1024];
	static int next;
	char rel[256];
	char *out = buf[next++ % 4];
	snprintf(rel, sizeof(rel), "scenarios/models/%s.json", name);
	snprintf(out, sizeof(buf[0]), "\"model\": \"%s\"", px_test_path(rel));
	return out;
}

int fx_modelf(ModelSpec *m, const char *fmt, ...)
{
	char json[4096];
	JsonDoc d = {0};
	JsonObj o;
	PxError err = {0};
	PxNotes notes;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(json, sizeof(json), fmt, ap);
	va_end(ap);
	px_notes_init(&notes);
	int rc = jdoc_parse(&d, "model.json", json, &err);
	if (rc == 0) {
		jobj_make(&o, &d, d.root, "", "model", NULL);
		rc = model_parse(&o, m, &notes, &err);
	}
	if (rc)
		fprintf(stderr, "\nfixture: %s\n", err.msg);
	for (int i = 0; i < notes.n_warnings; i++)
		fprintf(stderr, "\nfixture: %s\n", notes.warnings[i]);
	if (rc || notes.n_warnings)
		CU_FAIL("model fixture failed or warned");
	rc = rc || notes.n_warnings ? -1 : 0;
	px_notes_free(&notes);
	jdoc_free(&d);
	return rc;
}

int fx_bundled_model(const char *name, ModelSpec *m)
{
	char rel[256];
	JsonDoc d = {0};
	JsonObj o;
	PxError err = {0};
	PxNotes notes;
	px_notes_init(&notes);
	snprintf(rel, sizeof(rel), "scenarios/models/%s.json", name);
	int rc = jdoc_load_file(&d, px_test_path(rel), &err);
	if (rc == 0) {
		jobj_make(&o, &d, d.root, "", "model", NULL);
		rc = model_parse(&o, m, &notes, &err);
	}
	if (rc)
		fprintf(stderr, "\n%s: %s\n", name, err.msg);
	for (int i = 0; i < notes.n_warnings; i++)
		fprintf(stderr, "\n%s\n", notes.warnings[i]);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(notes.n_warnings, 0);
	rc = rc || notes.n_warnings ? -1 : 0;
	px_notes_free(&notes);
	jdoc_free(&d);
	return rc;
}

const cJSON *px_manifest_runs(JsonDoc *man)
{
	PxError err = {0};
	CU_ASSERT_FATAL(jdoc_load_file(man, px_test_path("scenarios/published/manifest.json"),
				       &err) == 0);
	const cJSON *runs = cJSON_GetObjectItemCaseSensitive(man->root, "runs");
	CU_ASSERT_FATAL(cJSON_IsArray(runs) &&
			cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(man->root, "sources")));
	return runs;
}

PxPublishedRun px_manifest_run(const JsonDoc *man, const cJSON *run)
{
	const cJSON *sources = cJSON_GetObjectItemCaseSensitive(man->root, "sources");
	const cJSON *f[4], *copy = cJSON_GetObjectItemCaseSensitive(run, "near_copy_of");
	static const char *const keys[4] = {"scenario", "source", "split", "metric"};
	for (int i = 0; i < 4; i++) {
		f[i] = cJSON_GetObjectItemCaseSensitive(run, keys[i]);
		CU_ASSERT_FATAL(cJSON_IsString(f[i]));
	}
	PxPublishedRun r = {f[0]->valuestring, f[1]->valuestring, f[2]->valuestring,
			    f[3]->valuestring, NULL, !strcmp(f[2]->valuestring, "held-out")};
	CU_ASSERT(cJSON_HasObjectItem(sources, r.source)); /* every source cited */
	CU_ASSERT(r.held_out || !strcmp(r.split, "calibration"));
	if (copy) { /* of a calibration source the manifest names */
		CU_ASSERT(r.held_out && cJSON_IsString(copy) &&
			  cJSON_HasObjectItem(sources, copy->valuestring));
		r.near_copy_of = cJSON_IsString(copy) ? copy->valuestring : "";
	}
	return r;
}

void fx_check_refused(const char *name, const char *json, const char *says)
{
	char path[512], out[4096];
	snprintf(path, sizeof(path), "%s/%s", px_test_tmpdir(), name);
	px_test_write_file(path, json);
	PxError err = {0};
	fx_refused(path, NULL, &err);
	PX_ASSERT_HAS(err.msg, says);
	PX_ASSERT_HAS(err.msg, path);
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "predict '%s' --no-db", path), 2);
	PX_ASSERT_HAS(out, path);
	PX_ASSERT_HAS(out, says);
}
