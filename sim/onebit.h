/* onebit (sim): what a run with a 1-bit optimizer (OnebitAdam, ZeroOneAdam, OnebitLamb) costs step
 * by step: each kind of step it is made of (engine/onebit.h) built and priced once (bytes per rank
 * and, where the profile prices the scenario, step time), how many of each a run of N steps has,
 * and the average. The step kinds' schedules are built here and freed; the prediction's own
 * schedules stay the warm-up's. Printing is the CLI's. */
#ifndef PX_SIM_ONEBIT_H
#define PX_SIM_ONEBIT_H

#include "../engine/onebit.h"
#include "hwprofile.h"
#include "traffic.h"

struct Prediction;

typedef struct OneBitRun {
	int active;         /* a 1-bit optimizer over two or more data-parallel ranks */
	int zero_one;       /* 0/1 Adam (its three kinds of step) */
	/* the run's length: scheduler.params.total_num_steps, else training_args.max_steps;
	 * 0 when neither gives one (no average), steps_source then NULL */
	long long n_steps;
	const char *steps_source;
	long long counts[N_ONEBIT_STEPS];
	/* per kind of step, pipeline stage 0's rank (every stage runs its own tensors' exchange):
	 * bytes it sends, of them over the data-parallel group, and its collectives */
	double wire_bytes[N_ONEBIT_STEPS], dp_wire_bytes[N_ONEBIT_STEPS];
	long long n_colls[N_ONEBIT_STEPS];
	double payload_bytes[N_ONEBIT_STEPS][N_COLLS]; /* issued per collective kind */
	int time_known;     /* step_s priced (the prediction's step time was, and every kind's) */
	char time_note[512]; /* why not, where the prediction's step time was priced */
	double step_s[N_ONEBIT_STEPS];
	/* over the run (n_steps > 0): the averages per step, and the full-precision step's
	 * data-parallel bytes over the average's (the volume reduction, Tang et al. 2021) */
	double avg_wire_bytes, avg_dp_wire_bytes, avg_step_s, dp_volume_reduction;
	/* the compressed step's data-parallel bytes against the warm-up's */
	double compressed_reduction;
	double error_bytes; /* stage 0's error-feedback buffers */
} OneBitRun;

/* Price pr's scenario's kinds of step into pr->onebit (inactive without a 1-bit optimizer or with
 * one data-parallel rank); hw: the profile pr's step time was priced with, or NULL (bytes only).
 * 0, or -1 with err (out of memory, a schedule the replay refuses). */
int sim_onebit_price(struct Prediction *pr, const HwProfile *hw, PxError *err);

#endif
