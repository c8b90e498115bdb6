/* infer_trace: a serving workload's requests from a trace file, as an inference scenario's
 * "workload": {"batching": "continuous", "trace": FILE} names it (FILE relative to the
 * scenario's folder): CSV, a header "arrival_s,prompt_tokens,output_tokens" and one request a
 * line, arrival times in seconds from any origin, not decreasing; blank lines and lines starting
 * with '#' are skipped. The header may add two columns, "prefix_id,prefix_tokens": requests of
 * the same prefix_id (a whole number, 0: none) begin with the same prefix_tokens tokens (at most
 * the prompt's; of two requests of one id, the shorter prefix is what both share), as a system
 * prompt shared by a service's requests: what vLLM's prefix caching reuses. Owns reading and
 * checking the file; what the requests cost is sim/infer_replay.h's. */
#ifndef PX_INFER_TRACE_H
#define PX_INFER_TRACE_H

#include "err.h"

typedef struct InferRequest {
	double arrival_s;
	long long prompt_tokens, output_tokens;
	long long prefix_id, prefix_tokens; /* 0 and 0 without the prefix columns */
} InferRequest;

typedef struct InferTrace {
	InferRequest *req; /* owned; NULL when the workload has no trace */
	long long n;
	int prefixes;      /* the header has the prefix columns */
	char path[1024];
} InferTrace;

#define INFER_TRACE_MAX_REQUESTS 1000000LL

/* Read path into t (zeroed first). Refused (PX_ERR_INPUT), naming path:line and the column, with
 * nothing held: a missing or different header, a line with another number of columns than the
 * header, a field that is not a number, a token count below 1 or above 2^24, a prefix id below 0
 * or prefix_tokens outside 0..prompt_tokens (or not 0 with id 0), an arrival earlier than the one
 * before, fewer than 2 requests or all arriving
 * at once (no rate), more than INFER_TRACE_MAX_REQUESTS. */
int infer_trace_load(const char *path, InferTrace *t, PxError *err);
void infer_trace_free(InferTrace *t);

/* The trace's means: requests a second over its span ((n - 1) / (last - first arrival)), prompt
 * and output tokens per request, rounded to whole tokens (at least 1). */
void infer_trace_means(const InferTrace *t, double *rate, long long *prompt, long long *output);

#endif
