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

/* One operand or result of a batch of row-major products: matrix i of the batch starts at
 * ptr + i stride elements, and its rows are ld elements apart (ld >= the row length, so a matrix
 * may be a block of columns of a wider one, a head of a (T, 3C) qkv). trans: the operand is stored
 * transposed, as gemm_cuda's flags (ignored for the result). */
typedef struct GemmBatch {
	const void *ptr;
	int ld;
	long long stride;
	int trans;
} GemmBatch;

/* For i < batch: C_i (M, N) = alpha op(A_i) op(B_i) + beta C_i, shapes, types and accumulation as
 * gemm_cuda's (cublasGemmStridedBatchedEx); c.ptr is written. batch >= 1. */
void gemm_cuda_batched(CudaCtx *ctx, CudaDtype ab, CudaDtype ct, int M, int N, int K, float alpha,
		       GemmBatch a, GemmBatch b, float beta, GemmBatch c, int batch);

/* One product C (M, N) = alpha op(A) op(B) + beta C as gemm_cuda's, each matrix's rows ld apart
 * (the GemmBatch's stride is ignored): rows padded for alignment (the logits' of the LM head, whose
 * vocabulary may be odd, keep cuBLAS on its 16-byte-aligned kernels) or a block of columns of a
 * wider matrix. */
void gemm_cuda_strided(CudaCtx *ctx, CudaDtype ab, CudaDtype ct, int M, int N, int K, float alpha,
		       GemmBatch a, GemmBatch b, float beta, GemmBatch c);

/* 0 when the combination of types is one gemm_cuda accepts, else -1: the argument check gemm_cuda
 * makes before calling cuBLAS, exposed so it can be tested without a GPU. */
int gemm_cuda_check_types(CudaDtype ab, CudaDtype c);

#ifdef __cplusplus
}
#endif

#endif
