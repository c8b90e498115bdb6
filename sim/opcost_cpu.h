/* opcost_cpu: how long one op of a schedule takes on the CPU executor (exec/runner.c over
 * exec/compute_cpu.c), from the level of a CPU profile (hwcpu.h) measured with as many ranks as
 * the scenario runs on its machine: a unit's kernel (its products at the measured sgemm rates
 * plus the kernel's fitted non-GEMM time), the storage loops around it (its working parameters
 * copied in, its gradients added out, its buffers zeroed), a collective's MPI time and the
 * reduced slice added into the partition, the optimizer's loops over the partition. opcost.c
 * hands a profile with a "cpu" section here; when ops run is timeline.c's. docs/time_model.md,
 * "The CPU executor". */
#ifndef PX_SIM_OPCOST_CPU_H
#define PX_SIM_OPCOST_CPU_H

#include "../engine/plan.h"
#include "../engine/schedule.h"
#include "hwprofile.h"

/* Whether hw's CPU section can price plan p: a backend "cpu" scenario on one machine (nodes 1),
 * data and expert parallelism only, a level measured at the machine's ranks
 * (cluster.gpus_per_node) and the kernels of the scenario's dtype; a 1-bit optimizer's compressed
 * step also needs the level's all_to_all. 0, or -1 with err (PX_ERR_INPUT) saying what is missing and
 * how to get it. */
int opcost_cpu_check(const Plan *p, const HwProfile *hw, PxError *err);

/* Durations in seconds on a rank of stage `stage` (the profile passed opcost_cpu_check). */
double opcost_cpu_compute_s(const Plan *p, const HwProfile *hw, const Op *op, int stage);
double opcost_cpu_coll_s(const Plan *p, const HwProfile *hw, const Op *op);
double opcost_cpu_copy_s(const Plan *p, const HwProfile *hw, const Op *op);
/* An allocation inside the step: the executor's memory comes zeroed (exec/compute.h). */
double opcost_cpu_alloc_s(const Plan *p, const HwProfile *hw, const Op *op);

/* The level's best sgemm rate, FLOP/s: what a CPU step's MFU divides by. */
double opcost_cpu_peak(const Plan *p, const HwProfile *hw);

#endif
