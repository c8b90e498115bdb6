/* infer_run: `parallax run` of an inference scenario: the GPT-2 executor serves its workload for
 * real on host ranks (exec/infer_runner.c walks the schedule), and rank 0 prints the generated
 * tokens, what it measured beside what the prediction says (memory per category as allocated,
 * bytes moved by the transport, time to first token, time per output token, tokens/s) and stores
 * both runs, linked, in the results database. cmd_run.c parses the options and hands over. */
#ifndef PX_CLI_INFER_RUN_H
#define PX_CLI_INFER_RUN_H

#include "../engine/jdoc.h"

typedef struct InferRunOpts {
	const JsonOverrides *ov;  /* the --set list with the executor's backend and cluster */
	const char *scenario, *db_path;
	int ranks, json, no_db;
	long long seed;
	double deadline;
	const char *training_only; /* a training option given ("--save"), or NULL */
} InferRunOpts;

/* The exit status: 0, 1 runtime failure, 2 bad input or a scenario the executor does not run,
 * 124 a rank hung. launched: under a launcher already (else ranks > 1 starts mpirun with argv). */
int infer_run(const InferRunOpts *o, int launched, char **argv, int argc);

#endif
