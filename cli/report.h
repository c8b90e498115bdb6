/* report: how a prediction reads to a person (fixed-width tables, '#' metadata lines) and to a
 * program (one JSON object with the same numbers). Computes nothing. */
#ifndef PX_CLI_REPORT_H
#define PX_CLI_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "../sim/predict.h"

/* The full report of one scenario. */
void report_table(FILE *f, const Scenario *sc, const Prediction *pr);
/* One line per scenario, for many scenarios at once. */
void report_summary_header(FILE *f);
void report_summary_line(FILE *f, const Scenario *sc, const Prediction *pr);
/* The JSON twin; caller frees with cJSON_Delete. */
cJSON *report_json(const Scenario *sc, const Prediction *pr);
/* The 1-bit optimizers' kinds of step and run average (report_onebit.c): nothing, or NULL, when
 * the prediction has none. */
void report_onebit_table(FILE *f, const Prediction *pr);
cJSON *report_onebit_json(const Prediction *pr);

#endif
