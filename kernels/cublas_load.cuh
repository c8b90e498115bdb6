/* cublas_load: cuBLAS opened on first use (dlopen), not linked. Loading libcublas pulls in
 * libcublasLt, whose initialisers cost every process some 0.35 s of CPU at start (measured: an
 * empty main linked with it, 0.37 s; without, 0.01 s), a CPU-only predict, sweep or executor rank
 * included. Only a CUDA context (cuda_ctx_create) opens it. Owns the table of the few entry points
 * the kernels call, typed from cuBLAS's own header; device code only. */
#ifndef PX_CUBLAS_LOAD_CUH
#define PX_CUBLAS_LOAD_CUH

#include <cublas_v2.h>

/* cuBLAS's GEMMs are overloaded in C++ (the _64 variants' int64_t shapes), so decltype cannot
 * name them: their 32-bit signatures, as cublas_api.h declares them */
typedef cublasStatus_t (*CublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m,
				       int n, int k, const void *alpha, const void *A,
				       cudaDataType, int lda, const void *B, cudaDataType, int ldb,
				       const void *beta, void *C, cudaDataType, int ldc,
				       cublasComputeType_t, cublasGemmAlgo_t);
typedef cublasStatus_t (*CublasGemmStridedBatchedEx)(
	cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
	const void *alpha, const void *A, cudaDataType, int lda, long long stride_a, const void *B,
	cudaDataType, int ldb, long long stride_b, const void *beta, void *C, cudaDataType, int ldc,
	long long stride_c, int batch, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetWorkspace_v2) set_workspace;
	decltype(&cublasSetMathMode) set_math_mode;
	decltype(&cublasGetStatusName) status_name;     /* "CUBLAS_STATUS_INVALID_VALUE" */
	decltype(&cublasGetStatusString) status_string; /* what it means, in words */
	CublasGemmEx gemm_ex;
	CublasGemmStridedBatchedEx gemm_strided_batched_ex;
};

/* The table, filled on the first call (libcublas.so.<major of the header built against>, found
 * as the dynamic loader finds libraries: LD_LIBRARY_PATH, the binary's run path, the cache).
 * Fatal, naming the library and dlerror's reason, when it or an entry point is missing. */
const CublasApi *cublas_api(void);

#endif
