/* run_guard: what `parallax run` will need, said before anything starts: the host memory of one
 * rank's executor buffers at their peak and of all ranks on this machine (from the prediction for
 * the executor's backend), the memory this machine has available, and an estimate of a step's
 * time; and the refusal when the memory does not fit. Starting ranks and running them are
 * cmd_run.c's and launch.c's. */
#ifndef PX_CLI_RUN_GUARD_H
#define PX_CLI_RUN_GUARD_H

#include <stdio.h>

#include "../sim/predict.h"

typedef struct RunNeed {
	double rank_bytes;      /* host memory one rank's buffers take at their peak: with backend
				   cpu the device place is host memory too; with cuda only the host
				   place (offload, pinned) */
	double device_bytes;    /* backend cuda: one rank's device peak (not checked here);
				   else 0 */
	int ranks;              /* ranks on this machine */
	double total_bytes;     /* rank_bytes x ranks */
	double flops_per_step;  /* one rank's compute ops in one optimizer step */
} RunNeed;

/* What the ranks of pr (one stage, data parallel: every rank alike) need, ranks of them here. */
void run_need(const Prediction *pr, int ranks, RunNeed *need);

/* Memory this machine can give now: MemAvailable of /proc/meminfo, lowered to what the control
 * group's limit leaves (cgroup v2's memory.max less memory.current, or v1's) where one is set.
 * source says which ("MemAvailable in /proc/meminfo"). 0, or -1 when neither can be read. */
int run_mem_available(double *bytes, char *source, size_t source_bytes);

/* This machine's rate for the executor's matrix products, FLOP/s: the fp32 GEMM of a linear
 * layer, y (n, c_out) = x (n, c_in) w, through the CPU kernels with all of the BLAS's threads,
 * the fastest of the calls made in about 50 ms; n and c_in at most 1024 and c_out 4096 (at most
 * 37 MiB of buffers). */
double run_cpu_gemm_flops_per_s(int n, int c_in, int c_out);

/* Before a run: when need->total_bytes exceeds avail_bytes, print the refusal (what it needs per
 * rank and in all, what is available and from where, what to change) to stderr and return 2;
 * otherwise print the needs and the step-time estimate as '#' lines to out (when out is not
 * NULL) and return 0. est_s: the estimated seconds a step (<= 0: none), est_how: how it was
 * made. */
int run_guard_report(const char *scenario, const char *backend, const RunNeed *need,
		     double avail_bytes, const char *avail_source, double est_s,
		     const char *est_how, FILE *out);

#endif
