/* cuda_ctx: device selection, stream, cuBLAS handle and workspace, device-memory helpers. */
#include <string.h>

#include "cuda_check.h"

static char who_prefix[80]; /* "rank 3 of 8: ", or empty */

void cuda_set_who(const char *who)
{
	if (!who || !*who)
		who_prefix[0] = '\0';
	else
		snprintf(who_prefix, sizeof(who_prefix), "%s: ", who);
}

const char *cuda_who_prefix(void)
{
	return who_prefix;
}

int cuda_ctx_available(char *reason, size_t reason_len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaSuccess && n > 0)
		return 1;
	if (reason && reason_len) {
		if (e != cudaSuccess)
			snprintf(reason, reason_len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
		else
			snprintf(reason, reason_len, "cudaGetDeviceCount: 0 devices");
	}
	/* the error of the failed call is also kept as the last error; clear it so a later
	 * cudaGetLastError does not report it against an unrelated launch */
	(void)cudaGetLastError();
	return 0;
}

const char *cuda_ctx_blas_status_name(int status)
{
	return cublas_api()->status_name((cublasStatus_t)status);
}

CudaCtx *cuda_ctx_create(int device)
{
	int n = 0;
	CUDA_CHECK(cudaGetDeviceCount(&n));
	CUDA_REQUIRE(device >= 0 && device < n, "cuda_ctx: device %d does not exist; %d found",
		     device, n);
	CudaCtx *ctx = (CudaCtx *)calloc(1, sizeof(*ctx));
	CUDA_REQUIRE(ctx, "cuda_ctx: out of host memory");
	ctx->device = device;
	CUDA_CHECK(cudaSetDevice(device));
	cudaDeviceProp prop;
	CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
	snprintf(ctx->name, sizeof(ctx->name), "%s", prop.name);
	CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
	const CublasApi *blas = cublas_api();
	CUBLAS_CHECK(blas->create(&ctx->cublas));
	CUBLAS_CHECK(blas->set_stream(ctx->cublas, ctx->stream));
	ctx->workspace = cuda_ctx_alloc(CUDA_CTX_WORKSPACE_BYTES);
	CUBLAS_CHECK(blas->set_workspace(ctx->cublas, ctx->workspace, CUDA_CTX_WORKSPACE_BYTES));
	/* fp32 products stay fp32: no silent TF32 (cuBLAS's default, said explicitly so that an
	 * environment's NVIDIA_TF32_OVERRIDE is the only way in) */
	CUBLAS_CHECK(blas->set_math_mode(ctx->cublas, CUBLAS_DEFAULT_MATH));
	ctx->scalars = (double *)cuda_ctx_alloc(CUDA_CTX_N_SCALARS * sizeof(double));
	ctx->col_part = (float *)cuda_ctx_alloc(CUDA_CTX_COL_PART_ELEMS * sizeof(float));
	ctx->sm_count = prop.multiProcessorCount;
	return ctx;
}

void cuda_ctx_destroy(CudaCtx *ctx)
{
	if (!ctx)
		return;
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
	CUBLAS_CHECK(cublas_api()->destroy(ctx->cublas));
	cuda_ctx_free(ctx->workspace);
	cuda_ctx_free(ctx->scalars);
	cuda_ctx_free(ctx->col_part);
	CUDA_CHECK(cudaStreamDestroy(ctx->stream));
	free(ctx);
}

void cuda_ctx_sync(CudaCtx *ctx)
{
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}

void *cuda_ctx_stream(const CudaCtx *ctx)
{
	return ctx->stream;
}

const char *cuda_ctx_device_name(const CudaCtx *ctx)
{
	return ctx->name;
}

/* ---- device memory ---- */

void *cuda_ctx_alloc(size_t bytes)
{
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
	CUDA_REQUIRE(e == cudaSuccess, "cuda_ctx: cudaMalloc of %zu bytes: %s", bytes,
		     cudaGetErrorString(e));
	return p;
}

void cuda_ctx_free(void *dev)
{
	if (dev)
		CUDA_CHECK(cudaFree(dev));
}

void cuda_ctx_upload(CudaCtx *ctx, void *dev, const void *host, size_t bytes)
{
	CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}

void cuda_ctx_download(CudaCtx *ctx, void *host, const void *dev, size_t bytes)
{
	CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}

void cuda_ctx_copy(CudaCtx *ctx, void *dst, const void *src, size_t bytes)
{
	if (bytes && dst != src)
		CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

void cuda_ctx_zero(CudaCtx *ctx, void *dev, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(cudaMemsetAsync(dev, 0, bytes, ctx->stream));
}
