/* cast_cuda: bulk fp32 <-> bf16 / fp16 conversion on the GPU with precision.h's rounding (to
 * nearest even, bit-identical), and the two halves of dynamic loss scaling: the overflow check
 * (any Inf or NaN in a buffer) and the unscale that goes with it. It does not choose the scale or
 * skip steps (the executor's loss scaler does). Device pointers; the context's stream. */
#ifndef PX_CAST_CUDA_H
#define PX_CAST_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[i] converted, over n elements of types dst_type and src_type (any pair, the same
 * type being a copy). dst and src do not overlap. */
void cast_cuda(CudaCtx *ctx, void *dst, CudaDtype dst_type, const void *src, CudaDtype src_type,
	       size_t n);

/* dst[i] += src[i] over n elements, each in its own type: the sum in fp32, rounded once into
 * dst's type (to nearest even). dst and src do not overlap. */
void cast_cuda_accumulate(CudaCtx *ctx, void *dst, CudaDtype dst_type, const void *src,
			  CudaDtype src_type, size_t n);

/* 1 when any of the n values (of type dtype) is Inf or NaN, else 0. Synchronises. */
int cast_cuda_has_nonfinite(CudaCtx *ctx, const void *x, CudaDtype dtype, size_t n);

/* Loss-scale unscaling: x[i] *= inv_scale over n fp32 values, in place; returns 1 when any value
 * was Inf or NaN before scaling (the step must be skipped and the scale lowered), else 0.
 * Synchronises. */
int cast_cuda_unscale(CudaCtx *ctx, float *x, size_t n, float inv_scale);

/* The host build of the device conversion functions (cast_dev.cuh), for testing them against
 * precision.h without a GPU. */
uint16_t cast_cuda_host_f32_to_bf16(float x);
uint16_t cast_cuda_host_f32_to_f16(float x);
float cast_cuda_host_bf16_to_f32(uint16_t h);
float cast_cuda_host_f16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
