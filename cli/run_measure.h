/* run_measure: what `parallax run` measures on each rank, apart from the schedule's own numbers:
 * the arena's bytes by category and its pool's high-water, the process's resident peak and page
 * faults, the NVMe swap files' blocks and traffic, the transport's counters per collective kind (a 1-bit optimizer's kinds of step apart),
 * the time per kind of op and per step (the first, warm-up step apart), and the device's readings
 * on the CUDA backend; as one vector per rank (for one all-gather) and as the database's rows. */
#ifndef PX_CLI_RUN_MEASURE_H
#define PX_CLI_RUN_MEASURE_H

#include "../db/db.h"
#include "../engine/onebit.h"
#include "../exec/comm.h"
#include "../exec/runner.h"
#include "run_gpu.h"

enum {
	/* the bytes requested by category (the arena's labels), the allocator's high-water per
	 * place, the requested peaks, the process's figures (pool, VmHWM, page faults), the caching
	 * allocator's reserve (PX_CPU_ALLOC or PX_CUDA_ALLOC=caching) */
	MEAS_MEMORY = 3 * N_CATS + 3 + 2 + 4 + 1,
	/* then the 1-bit compressed steps' by kind, 0/1 Adam's local steps' wire bytes, and the
	 * 1-bit initialisation step's by kind */
	MEAS_COMM = 2 * N_COLLS + 1 + N_COLLS + 1 + 1 + N_COLLS + 1,
	/* the NVMe swap files' bytes requested by category, and the bytes read and written per
	 * step (exec/swapfile.h: what pread and pwrite moved) */
	MEAS_NVME = N_CATS + 2,
	MEAS_GPU = 4, /* the device's own peak reading, the CUDA runtime's three parts */
	/* the steady step, the first step, whether the steady one is the first, and a 1-bit
	 * optimizer's compressed and local steps' */
	MEAS_TIME = 3 + 2,
	MEAS_N = MEAS_MEMORY + MEAS_NVME + MEAS_COMM + RUNNER_N_TIMES + MEAS_GPU + MEAS_TIME + 1
};

/* What a run notes as it goes: its steps' times, the first (the warm-up: its buffers are
 * mapped, its caches cold) apart from the steady ones after it, the page faults, and the resident
 * set before the executor's set-up. */
typedef struct RunMarks {
	long steps;                      /* finished */
	double first_s;                  /* the first one's wall time */
	double op_first[RUNNER_N_TIMES]; /* runner_op_times after the first */
	long long faults0, faults1;      /* minor page faults before and after the first */
	double rss_setup_bytes;          /* VmRSS before runner_create (MPI, libraries, ...) */
	/* a 1-bit optimizer's steps other than full ones (StepResult.onebit_step: compressed, 0/1
	 * Adam's local, and the initialisation step), by kind: how many, and what they issued and sent per collective kind
	 * (the counters' gain over each such step) */
	long kind_steps[N_ONEBIT_STEPS];
	double kind_payload[N_ONEBIT_STEPS][N_COLLS], kind_wire[N_ONEBIT_STEPS][N_COLLS];
	/* the steady steps (after the first) by kind of step (ONEBIT_FULL for any other
	 * optimizer's): how many, and their wall time summed */
	long steady_n[N_ONEBIT_STEPS];
	double steady_s[N_ONEBIT_STEPS];
} RunMarks;

/* What the counters hold per collective kind, summed over the groups. */
void run_comm_totals(Comm *world, double pay[N_COLLS], double wire[N_COLLS]);
/* A 1-bit step of kind `step` ended: what the counters gained since pay0 and wire0 (before it)
 * is its. */
void run_clock_onebit(RunMarks *k, int step, Comm *world, const double *pay0,
		      const double *wire0);
/* A step of kind `kind` (StepResult.onebit_step) finished in dt seconds. */
void run_clock_step(RunMarks *k, const Runner *run, double dt, int kind);
/* The mean steady step: the full-precision steps among 2..N (every step but a 1-bit
 * optimizer's compressed and local ones, which the prediction's time.step_s is not); with one
 * step, the first (warm-up included); NaN when no steady step was full. */
double run_clock_step_s(const RunMarks *k);
/* The mean steady step of kind `kind`, NaN when none was. */
double run_clock_kind_s(const RunMarks *k, int kind);
/* This rank's MEAS_N measurements into v (gpu: the CUDA backend's device side, or NULL). */
void run_measure(RunGpu *gpu, const Runner *run, Comm *world, const RunMarks *clk, double *v);
/* The rows of n ranks' measurements (all: MEAS_N each), the first of them rank rank0, named in
 * names; how many rows. */
int run_measured_rows(const double *all, int rank0, int world, int steps, DbMetric *rows,
		      char (*names)[64]);

#endif
