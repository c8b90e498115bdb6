/* cuda_check: what the .cu files of kernels/ share and C code never sees: the fatal check macros
 * (file:line, the failing expression and CUDA's or cuBLAS's own message), the CudaCtx struct and
 * launch-shape helpers. Device code only; the public API is in cuda_ctx.h and its siblings. */
#ifndef PX_CUDA_CHECK_H
#define PX_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "cublas_load.cuh"
#include "cuda_ctx.h"

struct CudaCtx {
	int device;
	char name[256];        /* cudaDeviceProp.name */
	cudaStream_t stream;   /* every kernel and cuBLAS call of this context runs here */
	cublasHandle_t cublas; /* bound to stream, workspace set to `workspace` */
	void *workspace;       /* CUDA_CTX_WORKSPACE_BYTES of device memory */
	double *scalars;       /* CUDA_CTX_N_SCALARS doubles on the device, see below */
	float *col_part;       /* CUDA_CTX_COL_PART_ELEMS floats: the column sums' partials */
	int sm_count;          /* multiprocessors, to size the column sums' grids */
};

/* Device scalars of a context: reductions whose result the host reads. */
enum { CUDA_SCALAR_SUM = 0, CUDA_SCALAR_FLAG = 1, CUDA_CTX_N_SCALARS = 2 };

/* The column sums' workspace (ops_dev.cuh): each row block's partial sums, added in block order by
 * a second kernel. 256 KiB, used in stream order by one kernel pair at a time. */
#define CUDA_CTX_COL_PART_ELEMS ((size_t)1 << 16)

/* cuda_set_who's label followed by ": ", or "" when none is set. */
const char *cuda_who_prefix(void);

/* Fatal: these are programming or hardware errors a run cannot go on from (an executor main or a
 * test would print and exit anyway), so the kernels' API stays free of error plumbing. Each
 * message starts with cuda_set_who's label (the rank), then file:line. */
#define CUDA_CHECK(expr)                                                                     \
	do {                                                                                 \
		cudaError_t e_ = (expr);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			fprintf(stderr, "%s%s:%d: %s: %s (%s)\n", cuda_who_prefix(),         \
				__FILE__, __LINE__, #expr, cudaGetErrorString(e_),           \
				cudaGetErrorName(e_));                                       \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

/* "CUBLAS_STATUS_INVALID_VALUE (7): an unsupported value or parameter was passed to the
 * function", cuBLAS's own words (a status comes from a call through the loaded table) */
static inline const char *cublas_status_text(cublasStatus_t s)
{
	static char text[256];
	const CublasApi *api = cublas_api();
	snprintf(text, sizeof(text), "%s (%d): %s", api->status_name(s), (int)s,
		 api->status_string(s));
	return text;
}

#define CUBLAS_CHECK(expr)                                                                   \
	do {                                                                                 \
		cublasStatus_t s_ = (expr);                                                  \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
			fprintf(stderr, "%s%s:%d: %s: cuBLAS %s\n", cuda_who_prefix(),       \
				__FILE__, __LINE__, #expr, cublas_status_text(s_));          \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

/* After every <<<...>>>: a bad launch configuration is reported here, not by a later call. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* Fatal on a caller's mistake that would otherwise corrupt memory (a shape the kernel cannot do). */
#define CUDA_REQUIRE(cond, ...)                                                              \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "%s%s:%d: ", cuda_who_prefix(), __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                                        \
			fputc('\n', stderr);                                                 \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

/* Blocks for n elements at `threads` a block, capped for grid-stride loops. */
static inline unsigned cuda_blocks_for(size_t n, unsigned threads)
{
	size_t b = (n + threads - 1) / threads;
	if (b < 1)
		b = 1;
	return b > 65535u * 16u ? 65535u * 16u : (unsigned)b;
}

#endif
