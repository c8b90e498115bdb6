/* parallax calibrate: measure the GPU this process runs on and write what the simulator needs as a
 * hardware profile (scenarios/hardware/'s format): bf16 GEMM efficiency by size, HBM and
 * host-to-device copy efficiency against the catalog's peaks, and the memory the CUDA context and
 * cuBLAS take. `parallax predict --hw FILE` and `parallax run --hw FILE` then use it. The timing
 * itself is kernels/bench_cuda's; the readings gpumem's. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../engine/cluster.h"
#include "../exec/gpumem.h"
#include "../sim/hwprofile.h"
#include "commands.h"

#ifdef PX_HAVE_CUDA
#include "../kernels/bench_cuda.h"
#include "../kernels/cuda_ctx.h"
#endif

static const char USAGE[] =
	"usage: parallax calibrate --out FILE [--gpu NAME] [--dtype bf16|fp32] [--quick]\n"
	"\n"
	"Measure this machine's first CUDA GPU and write a hardware profile for the simulator:\n"
	"matrix-product efficiency at 512^3 to 8192^3, device-to-device and pinned\n"
	"host-to-device copy efficiency against the catalog's peaks, and the memory the CUDA\n"
	"context and cuBLAS (with its 32 MiB workspace) take. Fields it does not measure keep the\n"
	"catalog GPU's defaults. Use it with `parallax predict --hw FILE` or `parallax run --hw\n"
	"FILE`. The file is written whole or not at all.\n"
	"\n"
	"  --out FILE   the profile to write (JSON)\n"
	"  --gpu NAME   the catalog GPU it describes (parallax gpus); default: from the device's\n"
	"               name (H100 SXM/PCIe, H200, A100 40/80GB, V100)\n"
	"  --dtype T    the matrix products' precision, whose peak the efficiencies divide: bf16\n"
	"               (default: DeepSpeed's mixed precision) or fp32 (what the executor's kernels\n"
	"               compute in: use it to predict `parallax run --backend cuda`)\n"
	"  --quick      matrix products up to 4096^3 only, fewer repetitions\n"
	"Exit status: 0 written, 1 no device or a failure while measuring, 2 bad usage.\n";

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

#ifdef PX_HAVE_CUDA

typedef struct Measured {
	char device[256], gpu[32];
	int fp32;                           /* the products were fp32, else bf16 */
	int n_gemm;
	double gemm_flops[8], gemm_rate[8]; /* FLOPs of one product, FLOP/s achieved */
	double d2d_Bps, h2d_Bps;
	double context_bytes, cublas_bytes; /* < 0: no reading */
} Measured;

static int measure(Measured *m, const char *gpu, int quick, PxError *err)
{
	char why[GPUMEM_WHY_BYTES];
	GpuMem g;
	if (gpumem_device_count(why, sizeof(why)) < 1)
		return px_fail(err, PX_ERR_RUNTIME, "no CUDA device (%s)", why);
	gpumem_init(&g, 0, NULL);
	gpumem_snapshot(&g, "start-up");
	const GpuMemSnap *ctx_snap = gpumem_context(&g);
	CudaCtx *ctx = cuda_ctx_create(0);
	const GpuMemSnap *blas_snap = gpumem_snapshot(&g, "cublas");
	m->context_bytes = ctx_snap ? gpumem_grown(&g.snaps[0], ctx_snap) : -1;
	m->cublas_bytes = ctx_snap && blas_snap ? gpumem_grown(ctx_snap, blas_snap) : -1;
	snprintf(m->device, sizeof(m->device), "%s", cuda_ctx_device_name(ctx));
	const char *name = gpu ? gpu : catalog_name(m->device);
	int rc = 0;
	if (!name || !cluster_find_gpu(name)) {
		rc = px_fail(err, PX_ERR_INPUT, "%s: not a catalog GPU (parallax gpus lists them); "
			     "name one with --gpu", name ? name : m->device);
		goto out;
	}
	snprintf(m->gpu, sizeof(m->gpu), "%s", name);
	for (int n = 512; n <= (quick ? 4096 : 8192); n *= 2) {
		m->gemm_flops[m->n_gemm] = 2.0 * n * (double)n * n;
		m->gemm_rate[m->n_gemm++] = bench_cuda_gemm_flops(ctx, m->fp32 ? CDT_F32 : CDT_BF16, n,
								  quick ? 5 : 20);
	}
	m->d2d_Bps = bench_cuda_copy_Bps(ctx, 0, (size_t)1 << 30, quick ? 5 : 20);
	m->h2d_Bps = bench_cuda_copy_Bps(ctx, 1, (size_t)256 << 20, quick ? 5 : 20);
out:
	cuda_ctx_destroy(ctx);
	gpumem_free(&g);
	return rc;
}

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

static cJSON *profile_json(const Measured *m, const GpuSpec *spec)
{
	char note[512], stamp[32];
	time_t now = time(NULL);
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M UTC", gmtime(&now));
	cJSON *j = cJSON_CreateObject(), *c = cJSON_CreateObject(), *h = cJSON_CreateObject();
	cJSON *mem = cJSON_CreateObject(), *curve = cJSON_CreateArray();
	snprintf(note, sizeof(note), "measured by parallax calibrate on %s, %s; fields not given "
		 "keep %s's built-in profile", m->device, stamp, m->gpu);
	cJSON_AddStringToObject(j, "_comment", note);
	cJSON_AddStringToObject(j, "gpu", m->gpu);
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
				"for predicting the executor, which computes in fp32" :
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
	if (m->context_bytes > 0)
		cJSON_AddNumberToObject(mem, "cuda_context_MiB", m->context_bytes / (1 << 20));
	if (m->cublas_bytes > 0)
		cJSON_AddNumberToObject(mem, "cublas_workspace_MiB", m->cublas_bytes / (1 << 20));
	cJSON_AddStringToObject(mem, "_comment", "this process's device memory (NVML, else the "
				"device's cudaMemGetInfo) after the CUDA context, then after cuBLAS and its "
				"workspace; NCCL's buffers need ranks: not measured here");
	cJSON_AddItemToObject(j, "memory", mem);
	return j;
}

/* Write text to path.tmp, check it reads back as a profile, then rename: whole or nothing. */
static int write_profile(const char *path, const char *text, PxError *err)
{
	char tmp[4096];
	HwProfile check;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return px_fail(err, PX_ERR_RUNTIME, "%s: cannot write", tmp);
	int bad = fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f));
	if (fclose(f) || bad) {
		unlink(tmp);
		return px_fail(err, PX_ERR_RUNTIME, "%s: write failed", tmp);
	}
	if (hwprofile_load(tmp, &check, err) || rename(tmp, path)) {
		unlink(tmp);
		return err->code ? -1 : px_fail(err, PX_ERR_RUNTIME, "%s: cannot rename", tmp);
	}
	return 0;
}

static int calibrate(const char *out, const char *gpu, int fp32, int quick, PxError *err)
{
	Measured m = {0};
	m.fp32 = fp32;
	if (measure(&m, gpu, quick, err))
		return -1;
	const GpuSpec *spec = cluster_find_gpu(m.gpu);
	cJSON *j = profile_json(&m, spec);
	char *text = j ? cJSON_Print(j) : NULL;
	int rc = text ? write_profile(out, text, err) : px_fail(err, PX_ERR_RUNTIME, "out of memory");
	cJSON_free(text);
	cJSON_Delete(j);
	if (rc)
		return -1;
	printf("# parallax calibrate: %s (catalog %s) -> %s\n", m.device, m.gpu, out);
	double peak = fp32 ? spec->tflops_fp32 : spec->tflops_bf16;
	printf("%-26s %14s %14s %8s\n", "measurement", "achieved", "catalog peak", "fraction");
	for (int i = 0; i < m.n_gemm; i++)
		printf("%s GEMM %4.0f^3 TFLOP/s  %14.1f %14.1f %8.3f\n", fp32 ? "fp32" : "bf16",
		       cbrt(m.gemm_flops[i] / 2), m.gemm_rate[i] / 1e12, peak,
		       m.gemm_rate[i] / 1e12 / peak);
	printf("%-26s %14.1f %14.1f %8.3f\n", "HBM copy GB/s", m.d2d_Bps / 1e9, spec->hbm_GBps,
	       m.d2d_Bps / 1e9 / spec->hbm_GBps);
	printf("%-26s %14.1f %14.1f %8.3f\n", "host-to-device GB/s", m.h2d_Bps / 1e9, spec->pcie_GBps,
	       m.h2d_Bps / 1e9 / spec->pcie_GBps);
	printf("%-26s %14.1f\n", "CUDA context MiB", m.context_bytes / (1 << 20));
	printf("%-26s %14.1f\n", "cuBLAS + workspace MiB", m.cublas_bytes / (1 << 20));
	return 0;
}

#endif

int cmd_calibrate(int argc, char **argv)
{
	static const struct option longs[] = {
		{"out", required_argument, 0, 'o'}, {"gpu", required_argument, 0, 'g'},
		{"quick", no_argument, 0, 'q'},     {"dtype", required_argument, 0, 'd'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	const char *out = NULL, *gpu = NULL;
	int quick = 0, fp32 = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 'g': gpu = optarg; break;
		case 'q': quick = 1; break;
		case 'd':
			if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
				fprintf(stderr, "parallax calibrate: --dtype %s: expected bf16 or fp32\n",
					optarg);
				return 2;
			}
			fp32 = !strcmp(optarg, "fp32");
			break;
		case 'h': fputs(USAGE, stdout); return 0;
		default: fputs(USAGE, stderr); return 2;
		}
	}
	if (!out || optind != argc) {
		fprintf(stderr, "parallax calibrate: expected --out FILE and no other arguments\n%s",
			USAGE);
		return 2;
	}
	if (gpu && !cluster_find_gpu(gpu)) {
		fprintf(stderr, "parallax calibrate: --gpu %s: not a catalog GPU (parallax gpus lists "
			"them)\n", gpu);
		return 2;
	}
#ifdef PX_HAVE_CUDA
	PxError err = {0};
	if (calibrate(out, gpu, fp32, quick, &err)) {
		fprintf(stderr, "parallax calibrate: %s\n", err.msg);
		return err.code == PX_ERR_INPUT ? 2 : 1;
	}
	return 0;
#else
	(void)quick, (void)fp32, (void)catalog_name;
	fprintf(stderr, "parallax calibrate: this parallax was built without CUDA (no nvcc under "
		"CUDA_HOME when it was built)\n");
	return 1;
#endif
}
