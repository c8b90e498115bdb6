/* gemm_cuda: row-major products through cublasGemmEx. */
#include "cuda_check.h"
#include "gemm_cuda.h"

static cudaDataType_t cuda_type(CudaDtype t)
{
	switch (t) {
	case CDT_BF16:
		return CUDA_R_16BF;
	case CDT_F16:
		return CUDA_R_16F;
	default:
		return CUDA_R_32F;
	}
}

int gemm_cuda_check_types(CudaDtype ab, CudaDtype c)
{
	if (ab != CDT_F32 && ab != CDT_BF16 && ab != CDT_F16)
		return -1;
	if (c != CDT_F32 && c != CDT_BF16 && c != CDT_F16)
		return -1;
	if (ab == CDT_F32 && c != CDT_F32)
		return -1; /* cuBLAS has no fp32-in, 16-bit-out product with fp32 compute */
	if (ab != CDT_F32 && c != CDT_F32 && c != ab)
		return -1; /* bf16 in, fp16 out (or the reverse) is not a cuBLAS combination */
	return 0;
}

/* cuBLAS is column-major, and a row-major (R, S) matrix with rows ld apart is the column-major
 * (S, R) matrix of its transpose with leading dimension ld. So row-major C = op(A) op(B) is
 * column-major C^T = op(B)^T op(A)^T: the same call with the operands swapped and M, N
 * exchanged, each operand keeping its own transpose flag and row stride. cuBLAS wants each
 * leading dimension at least the rows of the column-major matrix as stored (>= 1 even when K = 0,
 * where C = beta C). */
void gemm_cuda_strided(CudaCtx *ctx, CudaDtype ab, CudaDtype ct, int M, int N, int K, float alpha,
		       GemmBatch a, GemmBatch b, float beta, GemmBatch c)
{
	CUDA_REQUIRE(gemm_cuda_check_types(ab, ct) == 0,
		     "gemm_cuda: inputs of type %d with output of type %d are not supported", (int)ab,
		     (int)ct);
	CUDA_REQUIRE(M >= 0 && N >= 0 && K >= 0, "gemm_cuda: negative shape %d x %d x %d", M, N, K);
	if (M == 0 || N == 0)
		return;
	CUDA_REQUIRE(a.ld >= (a.trans ? M : K) && b.ld >= (b.trans ? K : N) && c.ld >= N,
		     "gemm_cuda: row strides %d, %d, %d shorter than the rows", a.ld, b.ld, c.ld);
	int lda = a.ld > 0 ? a.ld : 1, ldb = b.ld > 0 ? b.ld : 1;
	cublasOperation_t op_a = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t op_b = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	/* CUBLAS_COMPUTE_32F: fp32 accumulation, and for fp32 inputs no TF32 (that would be
	 * CUBLAS_COMPUTE_32F_FAST_TF32); alpha and beta are then floats */
	CUBLAS_CHECK(cublas_api()->gemm_ex(ctx->cublas, op_b, op_a, N, M, K, &alpha, b.ptr,
					   cuda_type(ab), ldb, a.ptr, cuda_type(ab), lda, &beta,
					   (void *)c.ptr, cuda_type(ct), c.ld, CUBLAS_COMPUTE_32F,
					   CUBLAS_GEMM_DEFAULT));
}

void gemm_cuda(CudaCtx *ctx, CudaDtype ab, CudaDtype c, int trans_a, int trans_b, int M, int N,
	       int K, float alpha, const void *A, const void *B, float beta, void *C)
{
	GemmBatch a = {A, trans_a ? M : K, 0, trans_a}, b = {B, trans_b ? K : N, 0, trans_b};
	GemmBatch o = {C, N, 0, 0};
	gemm_cuda_strided(ctx, ab, c, M, N, K, alpha, a, b, beta, o);
}

/* The same exchange as gemm_cuda's: column-major C_i^T (N, M) = op(B_i)^T op(A_i)^T, where each
 * row-major matrix with rows ld apart is the column-major transpose with leading dimension ld, so
 * every operand passes its own ld, stride and flag, B first. cuBLAS wants each leading dimension
 * at least the rows of the column-major matrix as stored: N for C, the stored row length for A
 * and B, which a row stride >= its row length satisfies. */
void gemm_cuda_batched(CudaCtx *ctx, CudaDtype ab, CudaDtype ct, int M, int N, int K, float alpha,
		       GemmBatch a, GemmBatch b, float beta, GemmBatch c, int batch)
{
	CUDA_REQUIRE(gemm_cuda_check_types(ab, ct) == 0,
		     "gemm_cuda_batched: inputs of type %d with output of type %d are not supported",
		     (int)ab, (int)ct);
	CUDA_REQUIRE(M > 0 && N > 0 && K > 0 && batch > 0,
		     "gemm_cuda_batched: shape %d x %d x %d, batch %d: all must be positive", M, N, K,
		     batch);
	CUDA_REQUIRE(a.ld >= (a.trans ? M : K) && b.ld >= (b.trans ? K : N) && c.ld >= N,
		     "gemm_cuda_batched: row strides %d, %d, %d shorter than the rows", a.ld, b.ld,
		     c.ld);
	cublasOperation_t op_a = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t op_b = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	CUBLAS_CHECK(cublas_api()->gemm_strided_batched_ex(
		ctx->cublas, op_b, op_a, N, M, K, &alpha, b.ptr, cuda_type(ab), b.ld, b.stride,
		a.ptr, cuda_type(ab), a.ld, a.stride, &beta, (void *)c.ptr, cuda_type(ct), c.ld,
		c.stride, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
