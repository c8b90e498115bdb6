/* calib_gpu: `parallax calibrate` on CUDA GPUs: the single GPU's measurements (matrix products,
 * copies, the CUDA runtime's memory: kernels/bench_cuda, exec/gpumem) and, with more than one
 * rank, each rank's device and communication backend (run_gpu's rule) and the collectives
 * (calib_coll). Options, the host-only path and writing the file are cmd_calibrate.c's. */
#ifndef PX_CLI_CALIB_GPU_H
#define PX_CLI_CALIB_GPU_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "../engine/err.h"
#include "../exec/comm.h"

typedef struct CalibOpts {
	const char *out, *gpu; /* gpu: a catalog name, or NULL (from the device) */
	const char *backend;   /* "cuda", "cpu" */
	const char *comm;      /* "auto", "nccl", "mpi" */
	const char *link;      /* --link: "nvlink", "network" (cpu with --gpu only) */
	const char *part;      /* --part FILE: a CPU level's ranks write their level there */
	int cpu_profile;       /* --backend cpu without --gpu: this machine's CPU profile */
	int fp32, quick, ranks, coll_only, hang_rank;
	double deadline;
} CalibOpts;

/* ---- cmd_calibrate.c's, shared ---- */

/* The profile's start: "_comment" (what measured it, on what, when: stamp) and "gpu". */
cJSON *calib_profile_base(const char *gpu, const char *device, const char *stamp);
void calib_stamp(char *buf, size_t n); /* "2025-01-31 12:00 UTC" */
/* j as text to path.tmp, read back as a profile, renamed: whole or nothing. */
int calib_write_profile(const char *path, const cJSON *j, PxError *err);
/* Rank r of the injected hang stops answering (sleeps) here. */
void calib_maybe_hang(const CalibOpts *o, int rank);

#ifdef PX_HAVE_CUDA
/* One GPU, one process: the profile without collectives. */
int calib_gpu_single(const CalibOpts *o, PxError *err);
/* Every rank of the launcher's job; rank 0 writes the profile. */
int calib_gpu_ranks(const CalibOpts *o, const CommEnv *env, PxError *err);
#endif

#endif
