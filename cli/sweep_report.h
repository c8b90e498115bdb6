/* sweep_report: a sweep's summary and best points as a table (or JSON), whether they come from the
 * database (the whole stored sweep) or from one invocation without a database. The best points'
 * configurations are shown by the settings that differ among them, one column each. It neither
 * prices nor stores anything. */
#ifndef PX_CLI_SWEEP_REPORT_H
#define PX_CLI_SWEEP_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "../sim/sweep.h"

typedef struct SweepReport {
	const char *name;
	long long n_points;          /* in the whole sweep */
	long long counts[4];         /* by PointStatus, of the points the report covers */
	long long covered;           /* their sum */
	long long tight;             /* of those priced or unpriced (sized, fitting), how many are
					tight: within the margin of usable memory */
	const char *scope;           /* "stored" (the database) or "this run" */
	SweepObjective objective;
	const PointResult *best;     /* best first */
	int n_best;
	int infer;                   /* an inference sweep: TTFT, TPOT, latency, tokens/s per GPU */
} SweepReport;

void sweep_report_print(FILE *f, const SweepReport *r);
/* The usual short name of a layout key ("zero" for deepspeed.zero_optimization.stage, "micro",
 * "tp", "ckpt", ...), or NULL for a key without one. */
const char *sweep_key_short(const char *key);
/* The same as one JSON object; caller frees (cJSON_Delete). NULL when out of memory. */
cJSON *sweep_report_json(const SweepReport *r);

#endif
