/* gemm_cuda: matrix products on the GPU through cuBLAS (cublasGemmEx), row-major as ops_cpu.h's,
 * in fp32 (fp32 in, fp32 compute, no TF32) or with bf16 / fp16 inputs and fp32 accumulation
 * (CUBLAS_COMPUTE_32F) writing fp32 or 16-bit outputs. It owns the row-major to column-major
 * mapping and nothing else: the layer ops built on it (linear layers, the tied LM head) are
 * ops_cuda's. All pointers are device pointers; calls queue on the context's stream. */
#ifndef PX_GEMM_CUDA_H
#define PX_GEMM_CUDA_H

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C (M, N) = alpha op(A) op(B) + beta C, every matrix row-major and dense: op(A) is (M, K), stored
 * (M, K) or, transposed, (K, M); op(B) is (K, N), stored (K, N) or (N, K). A and B are of type ab
 * (both the same), C of type c; accumulation is fp32 whatever the types. For CDT_F32 inputs c
 * must be CDT_F32. M, N, K >= 0 (a zero dimension is a no-op, beta still applied by cuBLAS only
 * when M N > 0). */
void gemm_cuda(CudaCtx *ctx, CudaDtype ab, CudaDtype c, int trans_a, int trans_b, int M, int N,
	       int K, float alpha, const void *A, const void *B, float beta, void *C);

/* 0 when the combination of types is one gemm_cuda accepts, else -1: the argument check gemm_cuda
 * makes before calling cuBLAS, exposed so it can be tested without a GPU. */
int gemm_cuda_check_types(CudaDtype ab, CudaDtype c);

#ifdef __cplusplus
}
#endif

#endif
