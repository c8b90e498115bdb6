/* cuda_fixtures: what the GPU suites share: random host arrays, comparisons that print their worst
 * miss, device buffers on one lazily created context, and the registration that marks GPU tests
 * inactive, saying why, on a machine without a device. Only in builds with CUDA. */
#ifndef PX_TEST_CUDA_FIXTURES_H
#define PX_TEST_CUDA_FIXTURES_H

#ifdef PX_HAVE_CUDA

#include <stddef.h>
#include <stdint.h>

#include "../kernels/cuda_ctx.h"
#include "suites.h"

#define CFX_U (1.0 / 16777216.0) /* u = 2^-24, fp32's unit roundoff */

/* ---- host arrays: calloc'ed (CU_FAIL_FATAL when out of memory), the caller frees ---- */

float *cfx_floats(size_t n);                            /* zeros */
float *cfx_random(size_t n, float std, uint64_t seed); /* normal(0, std) */
float *cfx_copy(const float *x, size_t n);
float *cfx_abs(const float *x, size_t n);
int *cfx_tokens(size_t n, int V, uint64_t seed); /* uniform in [0, V) */
/* Round x to bf16 or fp16 in place (precision.h) and return the bits (the caller frees). */
uint16_t *cfx_round16(float *x, size_t n, CudaDtype t);

/* ---- comparisons: 0 when all agree, else 1 after printing the count and the worst miss ---- */

/* |got - want| <= atol + rtol |want| elementwise; NaN is a miss */
int cfx_close_elem(const char *what, const float *got, const float *want, size_t n, double atol,
		   double rtol);
/* |got - want| <= bound[i] elementwise */
int cfx_close_bound(const char *what, const float *got, const float *want, const float *bound,
		    size_t n);
/* max |got - want| <= rel max |want| */
int cfx_close_norm(const char *what, const float *got, const float *want, size_t n, double rel);
/* bit for bit, n elements of elem bytes */
int cfx_same_bits(const char *what, const void *got, const void *want, size_t n, size_t elem);

/* ---- the device ---- */

/* Device 0's context, created on first use, destroyed by the suite's cleanup. */
CudaCtx *cfx_ctx(void);
/* A device copy of host (zeros when host is NULL); free with cuda_ctx_free. */
void *cfx_put(const void *host, size_t bytes);
float *cfx_up(const float *host, size_t n);
/* A host copy of n device floats; the caller frees. */
float *cfx_down(const float *dev, size_t n);
/* Rows of cols floats, ld >= cols apart on the device and dense on the host: cfx_up_rows uploads
 * host (rows, cols) with every padding element NaN, so that a kernel reading one shows; cfx_down_rows
 * downloads and drops the padding (the caller frees). */
float *cfx_up_rows(const float *host, size_t rows, size_t cols, size_t ld);
float *cfx_down_rows(const float *dev, size_t rows, size_t cols, size_t ld);

/* Add suite `name` with the tests that need no GPU and those that do. Without a device the GPU
 * tests are registered inactive (CUnit's summary counts them as such, not as passed) and one line
 * says "<file>: skipped: no CUDA device (<reason>)". Returns 0 or -1. */
int cfx_register(const char *name, const char *file, const PxTestCase *cpu, int n_cpu,
		 const PxTestCase *gpu, int n_gpu);

#endif
#endif
