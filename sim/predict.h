/* predict: the simulator's front door. Resolves a loaded scenario into its plan and schedule and
 * prices them: memory per place and category, the ZeRO paper's ideal model states, traffic, and
 * whether it fits. Printing and storing the result belong to the CLI. */
#ifndef PX_SIM_PREDICT_H
#define PX_SIM_PREDICT_H

#include "../engine/build.h"
#include "../engine/plan.h"
#include "memory.h"
#include "traffic.h"

typedef struct Prediction {
	Plan plan;
	Schedule sched;     /* rank 0's; with data parallelism only, every rank's is the same */
	MemResult mem;
	Traffic traffic;
	IdealStates ideal;
	double gpu_capacity_bytes, cpu_capacity_bytes, nvme_capacity_bytes; /* per rank */
	int fits_gpu, fits_cpu, fits_nvme, fits;
} Prediction;

/* Resolve the scenario's batch rules against its world size, then plan, build and price.
 * sc is updated in place (resolved DeepSpeed values). */
int predict_run(Scenario *sc, Prediction *pr, PxError *err);
void predict_free(Prediction *pr);

#endif
