/* bench_cuda: timed matrix products and copies (see the header). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "cast_dev.cuh"
#include "cuda_check.h"
#include "gemm_cuda.h"

#define BENCH_THREADS 256

/* A hash of the index, as a float in [-1, 1), in the buffer's type: cheap random data. */
__global__ static void fill_kernel(void *x, int type, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = (uint32_t)i * 2654435761u ^ seed;
		h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
		float v = (float)(h >> 8) / 8388608.0f - 1.0f;
		if (type == CDT_BF16)
			((uint16_t *)x)[i] = castd_f32_to_bf16(v);
		else if (type == CDT_F16)
			((uint16_t *)x)[i] = castd_f32_to_f16(v);
		else
			((float *)x)[i] = v;
	}
}

static void fill(CudaCtx *ctx, void *x, CudaDtype t, size_t n, uint32_t seed)
{
	fill_kernel<<<cuda_blocks_for(n, BENCH_THREADS), BENCH_THREADS, 0, ctx->stream>>>(x, t, n,
											 seed);
	CUDA_CHECK_LAUNCH();
}

static int by_value(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Median milliseconds of reps runs of what(arg), after two warm-up runs. */
static float median_ms(CudaCtx *ctx, int reps, void (*what)(CudaCtx *, void *), void *arg)
{
	cudaEvent_t a, b;
	float *ms = (float *)calloc((size_t)reps, sizeof(float));
	CUDA_REQUIRE(ms && reps > 0, "bench_cuda: %d repetitions", reps);
	CUDA_CHECK(cudaEventCreate(&a));
	CUDA_CHECK(cudaEventCreate(&b));
	what(ctx, arg);
	what(ctx, arg);
	for (int r = 0; r < reps; r++) {
		CUDA_CHECK(cudaEventRecord(a, ctx->stream));
		what(ctx, arg);
		CUDA_CHECK(cudaEventRecord(b, ctx->stream));
		CUDA_CHECK(cudaEventSynchronize(b));
		CUDA_CHECK(cudaEventElapsedTime(&ms[r], a, b));
	}
	qsort(ms, (size_t)reps, sizeof(float), by_value);
	float m = ms[reps / 2];
	free(ms);
	CUDA_CHECK(cudaEventDestroy(a));
	CUDA_CHECK(cudaEventDestroy(b));
	return m;
}

typedef struct GemmArgs {
	CudaDtype ab;
	int n;
	void *A, *B, *C;
} GemmArgs;

static void run_gemm(CudaCtx *ctx, void *p)
{
	GemmArgs *g = (GemmArgs *)p;
	gemm_cuda(ctx, g->ab, g->ab == CDT_F32 ? CDT_F32 : g->ab, 0, 0, g->n, g->n, g->n, 1.0f, g->A,
		  g->B, 0.0f, g->C);
}

double bench_cuda_gemm_flops(CudaCtx *ctx, CudaDtype ab, int n, int reps)
{
	size_t elems = (size_t)n * (size_t)n, bytes = elems * cuda_dtype_bytes(ab);
	GemmArgs g = {ab, n, cuda_ctx_alloc(bytes), cuda_ctx_alloc(bytes), cuda_ctx_alloc(bytes)};
	fill(ctx, g.A, ab, elems, 1);
	fill(ctx, g.B, ab, elems, 2);
	float ms = median_ms(ctx, reps, run_gemm, &g);
	cuda_ctx_free(g.A), cuda_ctx_free(g.B), cuda_ctx_free(g.C);
	return 2.0 * (double)n * (double)n * (double)n / (ms * 1e-3);
}

typedef struct CopyArgs {
	void *dst, *src;
	size_t bytes;
} CopyArgs;

static void run_copy(CudaCtx *ctx, void *p)
{
	CopyArgs *c = (CopyArgs *)p;
	CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDefault, ctx->stream));
}

double bench_cuda_copy_Bps(CudaCtx *ctx, int kind, size_t bytes, int reps)
{
	void *dev = cuda_ctx_alloc(bytes), *other = NULL;
	if (kind == 0)
		other = cuda_ctx_alloc(bytes);
	else
		CUDA_CHECK(cudaMallocHost(&other, bytes));
	fill(ctx, dev, CDT_F32, bytes / 4, 3);
	if (kind != 0)
		memset(other, 0, bytes); /* touch the host pages */
	CopyArgs c = {kind == 2 ? other : dev, kind == 2 ? dev : other, bytes};
	if (kind == 0)
		c.dst = other, c.src = dev;
	if (kind == 1)
		c.dst = dev, c.src = other;
	float ms = median_ms(ctx, reps, run_copy, &c);
	cuda_ctx_free(dev);
	if (kind == 0)
		cuda_ctx_free(other);
	else
		CUDA_CHECK(cudaFreeHost(other));
	return (kind == 0 ? 2.0 : 1.0) * (double)bytes / (ms * 1e-3);
}
