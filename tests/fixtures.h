/* fixtures: scenarios written from JSON text into a temporary file and loaded, for engine tests. */
#ifndef PX_TEST_FIXTURES_H
#define PX_TEST_FIXTURES_H

#include "../engine/pipeline.h"
#include "../sim/predict.h"

/* Load a scenario from JSON text; CU_FAIL and return -1 (with the error printed) on failure. */
int fx_load(Scenario *sc, const char *json);
/* Load and predict; on success both must be freed (fx_free). */
int fx_predict(Scenario *sc, Prediction *pr, const char *json);
void fx_free(Scenario *sc, Prediction *pr);
/* Buffers of kind what (BufWhat) in s from op from on: the most live at once; *allocs (may be
 * NULL) counts their allocations, *left (may be NULL) those still live at the end. */
int fx_live_bufs(const Schedule *s, int from, int what, int *allocs, int *left);
/* Load the scenario at path (with ov, which may be NULL) and predict it, asserting that it is
 * refused as bad input; err holds why. */
void fx_refused(const char *path, const JsonOverrides *ov, PxError *err);
/* The scenario json written to NAME in a fresh folder is refused naming the file and saying says:
 * by the engine (fx_refused) and by `parallax predict`, which exits 2. */
void fx_check_refused(const char *name, const char *json, const char *says);
/* Whether one of the notes (warnings or not modelled) holds fragment. */
int fx_noted(const PxNotes *n, const char *fragment);
/* fx_predict of a printf-formatted scenario (up to 4 KiB). */
int fx_predictf(Scenario *sc, Prediction *pr, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A model read from config.json text (printf-formatted, up to 4 KiB), as a scenario's model
 * section is; CU_FAIL and return -1 on failure or on any warning. */
int fx_modelf(ModelSpec *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse the bundled config scenarios/models/NAME.json into m; it must load without a warning
 * (CU_FAIL and -1 otherwise, with the error or warnings printed). */
int fx_bundled_model(const char *name, ModelSpec *m);

/* A model object from a bundled config file: "\"model\": \"ABS/scenarios/models/NAME.json\"". */
const char *fx_model(const char *name);

/* A run of scenarios/published/manifest.json: its fields, each asserted a string (fatal otherwise),
 * its source asserted cited among the manifest's sources and its split calibration or held-out
 * (held_out 1), its near_copy_of (NULL without) asserted a cited source of a held-out run. */
typedef struct PxPublishedRun {
	const char *scenario, *source, *split, *metric, *near_copy_of;
	int held_out;
} PxPublishedRun;
/* The manifest loaded into man (asserted; the caller frees it with jdoc_free) and its runs. */
const cJSON *px_manifest_runs(JsonDoc *man);
PxPublishedRun px_manifest_run(const JsonDoc *man, const cJSON *run);

#endif
