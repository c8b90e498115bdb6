/* infer_report: `parallax predict` for inference scenarios: the report a person reads (fixed-width
 * tables, '#' metadata lines), its JSON twin, the metrics stored in the results database
 * ("infer.*", docs/schema.md) and the command's flow (everything read and priced before anything
 * is printed or written). Computes nothing: sim/infer_sim.c does. */
#ifndef PX_CLI_INFER_REPORT_H
#define PX_CLI_INFER_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "../db/db.h"
#include "../sim/infer_sim.h"
#include "../sim/metrics.h"

void infer_report_table(FILE *f, const InferScenario *sc, const InferPrediction *pr);
cJSON *infer_report_json(const InferScenario *sc, const InferPrediction *pr);
/* The metrics of every rank (all alike); returns their count (at most METRICS_MAX). */
int infer_metrics_collect(const InferScenario *sc, const InferPrediction *pr, Metric *out);
int infer_store(PxDb *db, const InferScenario *sc, const InferPrediction *pr, long long *run_id,
		PxError *err);

/* Options cmd_predict passes on. */
typedef struct InferPredictOpts {
	const JsonOverrides *ov;
	int json, no_db;
	const char *db_path, *hw;
} InferPredictOpts;

/* Predict the n inference scenarios at paths (each found as cmd_predict finds one), print and
 * store them; the exit status (0, 1 runtime, 2 bad input, with the message on stderr). */
int infer_predict_command(const InferPredictOpts *o, char **paths, int n);

#endif
