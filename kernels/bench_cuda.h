/* bench_cuda: the rates `parallax calibrate` reads off a GPU: a matrix product's FLOP rate at one
 * shape and a copy's bandwidth, each the median of timed repetitions (CUDA events) after a
 * warm-up, on random data (never zeros, which run faster). It measures; what the rates mean for
 * the time model is cli/cmd_calibrate.c's. Fatal on CUDA errors, as the rest of kernels/. */
#ifndef PX_BENCH_CUDA_H
#define PX_BENCH_CUDA_H

#include <stddef.h>

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FLOP/s of C (n, n) = A (n, n) B (n, n) through gemm_cuda with inputs of type ab (fp32 output
 * for fp32 inputs, else 16-bit) and fp32 accumulation: 2 n^3 FLOPs per product. */
double bench_cuda_gemm_flops(CudaCtx *ctx, CudaDtype ab, int n, int reps);

/* Bytes/s of a copy of bytes: kind 0 device to device (read + written counted, as nccl-tests and
 * vendors count HBM), 1 pinned host to device, 2 device to pinned host. */
double bench_cuda_copy_Bps(CudaCtx *ctx, int kind, size_t bytes, int reps);

#ifdef __cplusplus
}
#endif

#endif
