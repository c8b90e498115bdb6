#include "run_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PX_HAVE_CUDA
#include <cuda_profiler_api.h>

#include "../kernels/cuda_ctx.h"
#endif

/* The NCCL backend where this build has one, else NULL. */
static const CommBackend *nccl_backend(void)
{
#ifdef PX_HAVE_NCCL
	return &comm_nccl_backend;
#else
	return NULL;
#endif
}

int run_gpu_setup(RunGpu *g, const CommEnv *env, const char *comm, PxError *err)
{
	memset(g, 0, sizeof(*g));
#ifndef PX_HAVE_CUDA
	(void)env, (void)comm, (void)nccl_backend;
	return px_fail(err, PX_ERR_INPUT, "--backend cuda: this parallax was built without CUDA (no "
		       "nvcc under CUDA_HOME when it was built)");
#else
	char why[GPUMEM_WHY_BYTES];
	if (strcmp(comm, "auto") && strcmp(comm, "nccl") && strcmp(comm, "mpi"))
		return px_fail(err, PX_ERR_INPUT, "--comm %s: expected auto, nccl or mpi", comm);
	g->n_devices = gpumem_device_count(why, sizeof(why));
	if (g->n_devices < 1)
		return px_fail(err, PX_ERR_RUNTIME, "--backend cuda: no CUDA device (%s)", why);
	g->device = env->local_rank % g->n_devices;
	char who[64]; /* a fatal CUDA error names the rank it happened on */
	snprintf(who, sizeof(who), "rank %d of %d (device %d)", env->rank, env->size, g->device);
	cuda_set_who(who);
	int shared = env->local_size > g->n_devices;
	/* auto: NCCL where every rank has a GPU of its own, but not for one rank alone, which has
	 * nothing to send: its communicator would hold device memory for nothing (582 MiB with NCCL
	 * 2.28 on an H200, measured: results/gpu/) */
	int nccl = !strcmp(comm, "nccl") ||
		   (!strcmp(comm, "auto") && !shared && env->size > 1 && nccl_backend());
	if (nccl && !nccl_backend())
		return px_fail(err, PX_ERR_INPUT, "--comm nccl: this parallax was built without NCCL");
	if (nccl && shared)
		return px_fail(err, PX_ERR_INPUT, "--comm nccl: %d ranks share %d GPU(s) on this node and "
			       "NCCL runs one rank per GPU; use --comm mpi (staged through host memory, "
			       "for correctness and memory only)", env->local_size, g->n_devices);
	g->comm = nccl ? nccl_backend() : &comm_mpi_staged_backend;
	g->comm_name = nccl ? "nccl" : "mpi-staged";
	gpumem_init(&g->mem, g->device, NULL);
	g->have_mem = 1;
	gpumem_snapshot(&g->mem, "start-up");
	gpumem_context(&g->mem);
	return 0;
#endif
}

void run_gpu_free(RunGpu *g)
{
	if (g && g->have_mem)
		gpumem_free(&g->mem);
}

void run_gpu_profile(const RunGpu *g, int on)
{
#ifdef PX_HAVE_CUDA
	if (g && g->have_mem)
		(void)(on ? cudaProfilerStart() : cudaProfilerStop());
#else
	(void)g, (void)on;
#endif
}

void run_gpu_snapshot(RunGpu *g, const char *label)
{
	gpumem_snapshot(&g->mem, label);
}

static const GpuMemSnap *find(const RunGpu *g, const char *label)
{
	for (int i = 0; i < g->mem.n_snaps; i++)
		if (!strcmp(g->mem.snaps[i].label, label))
			return &g->mem.snaps[i];
	return NULL;
}

/* b's reading minus a's (gpumem_grown); 0 when a snapshot or its readings are missing */
static double grown(const GpuMemSnap *a, const GpuMemSnap *b)
{
	double g = a && b ? gpumem_grown(a, b) : -1;
	return g == -1 ? 0 : g;
}

void run_gpu_runtime(const RunGpu *g, RunnerRuntime *rt)
{
	const GpuMemSnap *start = find(g, "start-up"), *ctx = find(g, "context");
	const GpuMemSnap *comm = find(g, g->comm_name), *blas = find(g, "cublas");
	memset(rt, 0, sizeof(*rt));
	rt->cuda_context_bytes = grown(start, ctx);
	rt->nccl_bytes = grown(ctx, comm);
	rt->cublas_workspace_bytes = grown(comm, blas);
}

double run_gpu_peak_bytes(const RunGpu *g)
{
	const GpuMemSnap *p = &g->mem.peak, *start = find(g, "start-up");
	if (p->process_ok)
		return (double)p->process_bytes;
	if (p->device_ok && start && start->device_ok)
		return (double)(p->used_bytes - start->used_bytes);
	return -1;
}

int run_gpu_gather(Comm *world, const ComputeBackend *cb, void *cx, const double *mine,
		   double *all, int count, PxError *err)
{
	int n = comm_size(world);
	size_t bytes = (size_t)count * sizeof(double);
	if (!cb || cb == &compute_cpu_backend) /* doubles as pairs of fp32 */
		return comm_all_gather(world, mine, all, (size_t)count * 2, COMM_FP32, err);
	char *dev = cb->alloc(cx, PLACE_GPU, bytes * (size_t)n);
	if (!dev)
		return px_fail(err, PX_ERR_RUNTIME, "out of device memory gathering measurements");
	cb->from_host(cx, dev + (size_t)comm_rank(world) * bytes, mine, bytes);
	int rc = comm_all_gather(world, dev + (size_t)comm_rank(world) * bytes, dev,
				 (size_t)count * 2, COMM_FP32, err);
	if (!rc)
		cb->to_host(cx, all, dev, bytes * (size_t)n);
	cb->release(cx, PLACE_GPU, dev);
	return rc;
}
