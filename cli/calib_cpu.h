/* calib_cpu: `parallax calibrate --backend cpu` (without --gpu): this machine's rates for the CPU
 * executor, written as a CPU profile (sim/hwcpu.h's "cpu" section): for each number k of ranks
 * (1, 2, 4, ... up to --ranks), k MPI ranks measure at once, in step, so that what they share
 * (cores, caches, memory bandwidth) is in every figure: OpenBLAS sgemm over a grid of shapes, the
 * executor's unit kernels at a few shapes (their time less their products', fitted per element),
 * its storage and optimizer loops, memmove and memset bandwidth, and with k > 1 the MPI
 * collectives by size (exec/collbench). Options and the GPU modes are cmd_calibrate.c's; how the
 * simulator uses the figures, sim/opcost_cpu.c's. */
#ifndef PX_CLI_CALIB_CPU_H
#define PX_CLI_CALIB_CPU_H

#include "../exec/comm.h"
#include "calib_gpu.h"

/* Not under a launcher: each level in turn (level 1 in this process, the others as k ranks under
 * mpirun), then the profile o->out written whole. Under a launcher: the launcher's ranks measure
 * one level; with o->part rank 0 writes that level's object there for the parent to collect,
 * without it the profile of that one level. Returns 0, an exit status (mpirun's) or -1 with err. */
int calib_cpu_main(const CalibOpts *o, const CommEnv *env, int launched, PxError *err);

#endif
