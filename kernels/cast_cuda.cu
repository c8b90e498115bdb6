/* cast_cuda: conversion, overflow check and unscale kernels. */
#include <string.h>

#include "cast_cuda.h"
#include "cuda_check.h"
#include "cast_dev.cuh"

#define CAST_THREADS 256

/* between two different types (cast_cuda copies a type to itself) */
__global__ static void cast_kernel(void *dst, int dst_type, const void *src, int src_type,
				   size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = castd_load(src, i, src_type);
		if (dst_type == CDT_BF16)
			((uint16_t *)dst)[i] = castd_f32_to_bf16(v);
		else if (dst_type == CDT_F16)
			((uint16_t *)dst)[i] = castd_f32_to_f16(v);
		else
			((float *)dst)[i] = v;
	}
}

static void check_dtype(CudaDtype t)
{
	CUDA_REQUIRE(t == CDT_F32 || t == CDT_BF16 || t == CDT_F16, "cast_cuda: unknown type %d",
		     (int)t);
}

void cast_cuda(CudaCtx *ctx, void *dst, CudaDtype dst_type, const void *src, CudaDtype src_type,
	       size_t n)
{
	check_dtype(dst_type);
	check_dtype(src_type);
	if (!n)
		return;
	if (dst_type == src_type) { /* a copy, bits kept: at the copy's rate (the calibration's 4.2
				      TB/s on an H200), not through a kernel's 2- or 4-byte loads */
		if (dst != src)
			CUDA_CHECK(cudaMemcpyAsync(dst, src, n * cuda_dtype_bytes(dst_type),
						   cudaMemcpyDefault, ctx->stream));
		return;
	}
	cast_kernel<<<cuda_blocks_for(n, CAST_THREADS), CAST_THREADS, 0, ctx->stream>>>(
		dst, dst_type, src, src_type, n);
	CUDA_CHECK_LAUNCH();
}

/* dst += src, each in its own type: the sum in fp32, rounded once into dst's type, as
 * exec/compute_cpu.c's add. */
__global__ static void accumulate_kernel(void *dst, int dst_type, const void *src, int src_type,
					 size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = castd_load(dst, i, dst_type) + castd_load(src, i, src_type);
		if (dst_type == CDT_BF16)
			((uint16_t *)dst)[i] = castd_f32_to_bf16(v);
		else if (dst_type == CDT_F16)
			((uint16_t *)dst)[i] = castd_f32_to_f16(v);
		else
			((float *)dst)[i] = v;
	}
}

void cast_cuda_accumulate(CudaCtx *ctx, void *dst, CudaDtype dst_type, const void *src,
			  CudaDtype src_type, size_t n)
{
	check_dtype(dst_type);
	check_dtype(src_type);
	if (!n)
		return;
	accumulate_kernel<<<cuda_blocks_for(n, CAST_THREADS), CAST_THREADS, 0, ctx->stream>>>(
		dst, dst_type, src, src_type, n);
	CUDA_CHECK_LAUNCH();
}

/* Every thread that sees a non-finite value stores 1 into the flag: the same value from all of
 * them, so the race is harmless and needs no atomic. */
__global__ static void nonfinite_kernel(double *flag, const void *x, int dtype, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		int bad;
		if (dtype == CDT_BF16)
			bad = (((const uint16_t *)x)[i] & 0x7F80u) == 0x7F80u;
		else if (dtype == CDT_F16)
			bad = (((const uint16_t *)x)[i] & 0x7C00u) == 0x7C00u;
		else
			bad = castd_f32_nonfinite(((const float *)x)[i]);
		if (bad)
			*flag = 1.0;
	}
}

__global__ static void unscale_kernel(double *flag, float *x, size_t n, float inv_scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i];
		if (castd_f32_nonfinite(v)) /* tested before scaling: a tiny inv_scale must not hide
					       an Inf, nor a huge one invent one */
			*flag = 1.0;
		x[i] = v * inv_scale;
	}
}

static int read_flag(CudaCtx *ctx, double *flag)
{
	double f = 0.0;
	cuda_ctx_download(ctx, &f, flag, sizeof(f));
	return f != 0.0;
}

int cast_cuda_has_nonfinite(CudaCtx *ctx, const void *x, CudaDtype dtype, size_t n)
{
	check_dtype(dtype);
	double *flag = ctx->scalars + CUDA_SCALAR_FLAG;
	CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(double), ctx->stream));
	if (n) {
		nonfinite_kernel<<<cuda_blocks_for(n, CAST_THREADS), CAST_THREADS, 0, ctx->stream>>>(
			flag, x, dtype, n);
		CUDA_CHECK_LAUNCH();
	}
	return read_flag(ctx, flag);
}

int cast_cuda_unscale(CudaCtx *ctx, float *x, size_t n, float inv_scale)
{
	double *flag = ctx->scalars + CUDA_SCALAR_FLAG;
	CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(double), ctx->stream));
	if (n) {
		unscale_kernel<<<cuda_blocks_for(n, CAST_THREADS), CAST_THREADS, 0, ctx->stream>>>(
			flag, x, n, inv_scale);
		CUDA_CHECK_LAUNCH();
	}
	return read_flag(ctx, flag);
}

/* ---- host builds of the device conversions ---- */

uint16_t cast_cuda_host_f32_to_bf16(float x) { return castd_f32_to_bf16(x); }
uint16_t cast_cuda_host_f32_to_f16(float x) { return castd_f32_to_f16(x); }
float cast_cuda_host_bf16_to_f32(uint16_t h) { return castd_bf16_to_f32(h); }
float cast_cuda_host_f16_to_f32(uint16_t h) { return castd_f16_to_f32(h); }
