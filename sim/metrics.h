/* metrics: a prediction as a flat list of named values ("memory.gpu.peak_bytes"), the one naming
 * that the JSON output, the results database and the executors' measurements share. */
#ifndef PX_SIM_METRICS_H
#define PX_SIM_METRICS_H

#include "predict.h"

typedef struct Metric {
	char name[64];    /* dotted: "comm.all_gather_bytes" */
	double value;
	const char *unit; /* "bytes", "flops", "1" */
	int known;        /* 0: unknown (a params-only model's activations): JSON null, not stored */
} Metric;

#define METRICS_MAX 160

/* m[n] = a known value named name (at most METRICS_MAX entries: beyond, nothing is added);
 * returns the new count. */
int metrics_put(Metric *m, int n, const char *name, double value, const char *unit);

/* Fill out (METRICS_MAX entries) with the metrics of every rank of pipeline stage `stage`;
 * returns their count. */
int metrics_collect(const Prediction *pr, int stage, Metric *out);

#endif
