#include "calib_gpu.h"

#ifdef PX_HAVE_CUDA

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../engine/cluster.h"
#include "../exec/compute.h"
#include "../exec/gpumem.h"
#include "../kernels/bench_cuda.h"
#include "../kernels/cuda_ctx.h"
#include "calib_coll.h"
#include "run_gpu.h"

typedef struct Measured {
	char device[256], gpu[32];
	int fp32;                           /* the products were fp32, else bf16 */
	int coll_only;                      /* name the device only: no products, no copies */
	int n_gemm;
	double gemm_flops[8], gemm_rate[8]; /* FLOPs of one product, FLOP/s achieved */
	double d2d_Bps, h2d_Bps;
	double context_bytes, cublas_bytes; /* <= 0: no reading */
	double nccl_bytes;                  /* <= 0: no reading (one rank, or not NCCL) */
} Measured;

/* The catalog name for a device name, or NULL. */
static const char *catalog_name(const char *device)
{
	if (strstr(device, "H200"))
		return "H200";
	if (strstr(device, "H100"))
		return strstr(device, "PCIe") ? "H100-PCIe" : "H100-SXM";
	if (strstr(device, "A100"))
		return strstr(device, "40GB") ? "A100-40GB" : "A100-80GB";
	if (strstr(device, "V100"))
		return "V100-32GB";
	return NULL;
}

/* ---- measuring one GPU ---- */

/* The CUDA runtime's memory. One process: readings of its own, start-up, context, cuBLAS. More
 * ranks: run_gpu's, taken before the communicator started and after it (NCCL's buffers). */
static const GpuMemSnap *memory_before(GpuMem *g, RunGpu *rg)
{
	if (rg)
		return NULL;
	gpumem_init(g, 0, NULL);
	gpumem_snapshot(g, "start-up");
	return gpumem_context(g);
}

static void memory_after(Measured *m, GpuMem *g, const GpuMemSnap *ctx_snap, RunGpu *rg)
{
	if (rg) {
		RunnerRuntime rt;
		run_gpu_snapshot(rg, "cublas");
		run_gpu_runtime(rg, &rt);
		m->context_bytes = rt.cuda_context_bytes;
		m->cublas_bytes = rt.cublas_workspace_bytes;
		m->nccl_bytes = !strcmp(rg->comm_name, "nccl") ? rt.nccl_bytes : -1;
		return;
	}
	const GpuMemSnap *blas_snap = gpumem_snapshot(g, "cublas");
	m->context_bytes = ctx_snap ? gpumem_grown(&g->snaps[0], ctx_snap) : -1;
	m->cublas_bytes = ctx_snap && blas_snap ? gpumem_grown(ctx_snap, blas_snap) : -1;
	m->nccl_bytes = -1;
}

/* rg: the rank's device and readings with more than one rank, else NULL (device 0). */
static int measure(Measured *m, const char *gpu, int quick, RunGpu *rg, PxError *err)
{
	char why[GPUMEM_WHY_BYTES];
	GpuMem g = {0};
	if (gpumem_device_count(why, sizeof(why)) < 1)
		return px_fail(err, PX_ERR_RUNTIME, "no CUDA device (%s)", why);
	const GpuMemSnap *ctx_snap = memory_before(&g, rg);
	CudaCtx *ctx = cuda_ctx_create(rg ? rg->device : 0);
	memory_after(m, &g, ctx_snap, rg);
	snprintf(m->device, sizeof(m->device), "%s", cuda_ctx_device_name(ctx));
	const char *name = gpu ? gpu : catalog_name(m->device);
	int rc = 0;
	if (!name || !cluster_find_gpu(name)) {
		rc = px_fail(err, PX_ERR_INPUT, "%s: not a catalog GPU (parallax gpus lists them); "
			     "name one with --gpu", name ? name : m->device);
		goto out;
	}
	snprintf(m->gpu, sizeof(m->gpu), "%s", name);
	for (int n = 512; n <= (quick ? 4096 : 8192) && !m->coll_only; n *= 2) {
		m->gemm_flops[m->n_gemm] = 2.0 * n * (double)n * n;
		m->gemm_rate[m->n_gemm++] = bench_cuda_gemm_flops(ctx, m->fp32 ? CDT_F32 : CDT_BF16, n,
								  quick ? 5 : 20);
	}
	if (!m->coll_only) {
		m->d2d_Bps = bench_cuda_copy_Bps(ctx, 0, (size_t)1 << 30, quick ? 5 : 20);
		m->h2d_Bps = bench_cuda_copy_Bps(ctx, 1, (size_t)256 << 20, quick ? 5 : 20);
	}
out:
	cuda_ctx_destroy(ctx);
	if (!rg)
		gpumem_free(&g);
	return rc;
}

/* ---- the profile ---- */

/* A measured fraction of a catalog peak, kept inside (0, 1] as the profile requires (a rate
 * above the catalog's peak means the catalog's figure is low: say so). */
static double fraction(double rate, double peak, const char *what)
{
	double f = rate / peak;
	if (f > 1) {
		fprintf(stderr, "parallax calibrate: warning: %s measured %.3g, above the catalog's "
			"%.3g: recorded as 1\n", what, rate, peak);
		f = 1;
	}
	return f > 0 ? f : 1e-6;
}

static void compute_json(const Measured *m, const GpuSpec *spec, cJSON *j)
{
	cJSON *c = cJSON_CreateObject(), *h = cJSON_CreateObject(), *curve = cJSON_CreateArray();
	double peak = (m->fp32 ? spec->tflops_fp32 : spec->tflops_bf16) * 1e12;
	for (int i = 0; i < m->n_gemm; i++) {
		cJSON *pt = cJSON_CreateArray();
		cJSON_AddItemToArray(pt, cJSON_CreateNumber(m->gemm_flops[i]));
		cJSON_AddItemToArray(pt, cJSON_CreateNumber(
			fraction(m->gemm_rate[i], peak, "a matrix product")));
		cJSON_AddItemToArray(curve, pt);
	}
	cJSON_AddItemToObject(c, "gemm_efficiency", curve);
	cJSON_AddStringToObject(c, "_gemm_efficiency", m->fp32 ?
				"fp32 n^3 products (no TF32), n = 512 doubling up, median of timed "
				"repetitions (CUDA events) on random data, over the catalog's fp32 peak: "
				"for predicting fp32 scenarios, whose units compute in fp32" :
				"bf16 n^3 products, n = 512 doubling up, median of timed repetitions (CUDA "
				"events) on random data, over the catalog's dense bf16 peak");
	cJSON_AddNumberToObject(c, "hbm_efficiency",
				fraction(m->d2d_Bps, spec->hbm_GBps * 1e9, "HBM copy bandwidth"));
	cJSON_AddStringToObject(c, "_hbm_efficiency", "a 1 GiB device-to-device copy, bytes read and "
				"written counted, over the catalog's HBM bandwidth");
	cJSON_AddItemToObject(j, "compute", c);
	cJSON_AddNumberToObject(h, "pcie_efficiency",
				fraction(m->h2d_Bps, spec->pcie_GBps * 1e9, "host-to-device copy"));
	cJSON_AddStringToObject(h, "_pcie_efficiency", "a 256 MiB pinned host-to-device copy over "
				"the catalog's PCIe figure");
	cJSON_AddItemToObject(j, "host", h);
}

static void memory_json(const Measured *m, cJSON *j)
{
	cJSON *mem = cJSON_CreateObject();
	if (m->context_bytes > 0)
		cJSON_AddNumberToObject(mem, "cuda_context_MiB", m->context_bytes / (1 << 20));
	if (m->cublas_bytes > 0)
		cJSON_AddNumberToObject(mem, "cublas_workspace_MiB", m->cublas_bytes / (1 << 20));
	if (m->nccl_bytes > 0)
		cJSON_AddNumberToObject(mem, "nccl_MiB", m->nccl_bytes / (1 << 20));
	cJSON_AddStringToObject(mem, "_comment", m->nccl_bytes > 0 ?
				"rank 0's device memory (NVML, else the device's cudaMemGetInfo) after "
				"the CUDA context, after NCCL's communicator, then after cuBLAS and its "
				"workspace" :
				"this process's device memory (NVML, else the device's cudaMemGetInfo) "
				"after the CUDA context, then after cuBLAS and its workspace; NCCL's "
				"buffers need ranks with a GPU each: not measured here");
	cJSON_AddItemToObject(j, "memory", mem);
}

/* The whole profile; coll (NULL: one GPU) adds the collectives. */
static cJSON *profile_json(const Measured *m, const CalibColl *coll)
{
	char stamp[32];
	calib_stamp(stamp, sizeof(stamp));
	const GpuSpec *spec = cluster_find_gpu(m->gpu);
	cJSON *j = calib_profile_base(m->gpu, m->device, stamp);
	if (!m->coll_only) {
		compute_json(m, spec, j);
		memory_json(m, j);
	}
	if (coll)
		calib_coll_json(coll, j, stamp);
	else
		calib_coll_json_single(j);
	return j;
}

static void print_measured(const Measured *m, const char *out)
{
	const GpuSpec *spec = cluster_find_gpu(m->gpu);
	printf("# parallax calibrate: %s (catalog %s) -> %s\n", m->device, m->gpu, out);
	if (m->coll_only)
		return;
	double peak = m->fp32 ? spec->tflops_fp32 : spec->tflops_bf16;
	printf("%-26s %14s %14s %8s\n", "measurement", "achieved", "catalog peak", "fraction");
	for (int i = 0; i < m->n_gemm; i++)
		printf("%s GEMM %4.0f^3 TFLOP/s  %14.1f %14.1f %8.3f\n", m->fp32 ? "fp32" : "bf16",
		       cbrt(m->gemm_flops[i] / 2), m->gemm_rate[i] / 1e12, peak,
		       m->gemm_rate[i] / 1e12 / peak);
	printf("%-26s %14.1f %14.1f %8.3f\n", "HBM copy GB/s", m->d2d_Bps / 1e9, spec->hbm_GBps,
	       m->d2d_Bps / 1e9 / spec->hbm_GBps);
	printf("%-26s %14.1f %14.1f %8.3f\n", "host-to-device GB/s", m->h2d_Bps / 1e9,
	       spec->pcie_GBps, m->h2d_Bps / 1e9 / spec->pcie_GBps);
	printf("%-26s %14.1f\n", "CUDA context MiB", m->context_bytes / (1 << 20));
	printf("%-26s %14.1f\n", "cuBLAS + workspace MiB", m->cublas_bytes / (1 << 20));
	if (m->nccl_bytes > 0)
		printf("%-26s %14.1f\n", "NCCL communicator MiB", m->nccl_bytes / (1 << 20));
}

static int write_and_print(const Measured *m, const CalibColl *coll, const char *out,
			   PxError *err)
{
	cJSON *j = profile_json(m, coll);
	int rc = j ? calib_write_profile(out, j, err) : px_fail(err, PX_ERR_RUNTIME, "out of memory");
	cJSON_Delete(j);
	if (rc)
		return -1;
	print_measured(m, out);
	if (coll)
		calib_coll_print(coll, stdout);
	return 0;
}

int calib_gpu_single(const CalibOpts *o, PxError *err)
{
	Measured m = {0};
	m.fp32 = o->fp32;
	if (measure(&m, o->gpu, o->quick, NULL, err))
		return -1;
	return write_and_print(&m, NULL, o->out, err);
}

/* ---- more than one rank ---- */

/* Rank 0 measured its GPU (failed: 1 where that failed) while the others waited here: now every
 * rank learns whether it failed. */
static int agree(Comm *world, const ComputeBackend *cb, void *cx, float failed, PxError *err)
{
	PxError werr = {0};
	if (collbench_max(world, cb, cx, &failed, 1, &werr))
		return err->code ? -1 : (*err = werr, -1);
	if (failed && comm_rank(world) != 0)
		return px_fail(err, PX_ERR_RUNTIME, "rank 0 failed measuring its GPU");
	return failed ? -1 : 0;
}

/* After the communicator: rank 0 measures its GPU, every rank times the collectives over the
 * link its backend and placement make (NCCL: NVLink on one node, the network across nodes;
 * MPI staged: none), rank 0 writes. */
static int measure_ranks(const CalibOpts *o, RunGpu *g, Comm *world, PxError *err)
{
	ComputeShape shape = {.B = 1, .T = 1, .device = g->device, .dt = DT_FP32};
	const ComputeBackend *cb = &compute_cuda_backend;
	const CommEnv *env = comm_env(world);
	Measured m = {0};
	CalibColl coll;
	void *cx = NULL;
	int rc = -1;
	m.fp32 = o->fp32;
	m.coll_only = o->coll_only;
	/* rank 0's products must not share the GPU with the collectives: the others wait (up to
	 * 10 minutes) in agree() */
	if (comm_set_deadline(world, o->deadline > 0 && o->deadline < 600 ? 600 : o->deadline, err))
		goto out;
	/* rank 0 measures before its compute context exists, so that the cuBLAS reading is its
	 * own; on failure it still joins agree(), which tells the others */
	float failed = comm_rank(world) == 0 && measure(&m, o->gpu, o->quick, g, err);
	if (cb->create(&shape, &cx, err) || agree(world, cb, cx, failed, err) ||
	    comm_set_deadline(world, o->deadline, err))
		goto out;
	calib_maybe_hang(o, comm_rank(world));
	int nccl = !strcmp(g->comm_name, "nccl");
	const char *link = !nccl ? NULL : env->local_size < env->size ? "network" : "nvlink";
	const GpuSpec *spec = comm_rank(world) == 0 ? cluster_find_gpu(m.gpu) : NULL;
	if (calib_coll_measure(&coll, world, cb, cx, o->quick, spec, g->comm_name, link, err))
		goto out;
	rc = comm_rank(world) == 0 ? write_and_print(&m, &coll, o->out, err) : 0;
out:
	if (cx)
		cb->destroy(cx);
	return rc;
}

int calib_gpu_ranks(const CalibOpts *o, const CommEnv *env, PxError *err)
{
	RunGpu g;
	CommConfig cfg;
	Comm *world = NULL;
	int rc = -1;
	if (run_gpu_setup(&g, env, o->comm, err))
		goto out;
	comm_config_init(&cfg);
	cfg.deadline_s = o->deadline;
	if (comm_init(g.comm, &cfg, &world, err))
		goto out;
	run_gpu_snapshot(&g, g.comm_name);
	rc = measure_ranks(o, &g, world, err);
	PxError ferr;
	if (comm_finalize(world, &ferr) && !rc)
		rc = (*err = ferr, -1);
out:
	run_gpu_free(&g);
	return rc;
}

#endif
