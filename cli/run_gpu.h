/* run_gpu: what `parallax run --backend cuda` adds to a run before and around the executor: the
 * device each rank takes, the communication backend (NCCL with a GPU per rank, else MPI staged
 * through host memory: many ranks on one GPU, for correctness and memory only), the device memory
 * readings at start-up, after the CUDA context, the communicator and cuBLAS, and what they
 * attribute to the CUDA runtime. The training loop itself is cmd_run.c's. */
#ifndef PX_CLI_RUN_GPU_H
#define PX_CLI_RUN_GPU_H

#include "../exec/comm.h"
#include "../exec/compute.h"
#include "../exec/gpumem.h"
#include "../exec/runner.h"

typedef struct RunGpu {
	int device;             /* CUDA ordinal this rank computes on */
	int n_devices;
	const CommBackend *comm; /* NULL: the CPU run's (MPI on host memory) */
	const char *comm_name;  /* "nccl", "mpi-staged" */
	GpuMem mem;
	int have_mem;           /* mem was initialised */
} RunGpu;

/* Choose the device (the launcher's local rank, modulo the devices) and the communication backend
 * ("auto": NCCL when 2+ ranks each have a GPU of the node and NCCL is built, else MPI staged;
 * "nccl" or "mpi" to insist), and take the start-up and context readings. 0, or -1 with err (no
 * device, a backend this build lacks, NCCL asked for with ranks sharing a GPU). */
int run_gpu_setup(RunGpu *g, const CommEnv *env, const char *comm, PxError *err);
void run_gpu_free(RunGpu *g); /* NULL and a zeroed struct are fine */

/* Open (on) or close the range a profiler started with `--profile-from-start off` records
 * (cudaProfilerStart/Stop; Nsight Compute's and Nsight Systems' convention): run brackets the step
 * PX_CUDA_PROFILE_STEP names with it. Nothing without CUDA or before run_gpu_setup. */
void run_gpu_profile(const RunGpu *g, int on);

/* A labelled reading (after the communicator: "nccl" or "mpi-staged"; after cuBLAS: "cublas"). */
void run_gpu_snapshot(RunGpu *g, const char *label);

/* The CUDA runtime's memory as the readings attribute it: this process's own (NVML) where it is
 * reported, else the device's (exact with one rank per GPU). Differences of the readings taken in
 * the order start-up, context, communicator, cuBLAS. */
void run_gpu_runtime(const RunGpu *g, RunnerRuntime *rt);

/* The device's peak reading so far: this process's bytes where NVML reports them, else the
 * device's used memory above start-up. -1 when there is none. */
double run_gpu_peak_bytes(const RunGpu *g);

/* all_gather of count host doubles per rank into all (host), through the compute backend's memory
 * when cb is not the CPU's (NCCL reads device memory only). */
int run_gpu_gather(Comm *world, const ComputeBackend *cb, void *cx, const double *mine,
		   double *all, int count, PxError *err);

#endif
