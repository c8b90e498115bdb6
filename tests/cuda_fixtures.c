/* cuda_fixtures: shared helpers of the GPU suites (see the header). */
#include "cuda_fixtures.h"

#ifdef PX_HAVE_CUDA

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/precision.h"
#include "../kernels/rng.h"

/* ---- host helpers ---- */

float *cfx_floats(size_t n)
{
	float *x = calloc(n ? n : 1, sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(x);
	return x;
}

float *cfx_random(size_t n, float std, uint64_t seed)
{
	float *x = cfx_floats(n);
	PxRng r;
	rng_init(&r, seed, 7);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
	return x;
}

float *cfx_copy(const float *x, size_t n)
{
	float *y = cfx_floats(n);
	memcpy(y, x, n * sizeof(float));
	return y;
}

float *cfx_abs(const float *x, size_t n)
{
	float *y = cfx_floats(n);
	for (size_t i = 0; i < n; i++)
		y[i] = fabsf(x[i]);
	return y;
}

int *cfx_tokens(size_t n, int V, uint64_t seed)
{
	int *t = calloc(n ? n : 1, sizeof(int));
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	PxRng r;
	rng_init(&r, seed, 9);
	for (size_t i = 0; i < n; i++)
		t[i] = (int)(rng_next_u64(&r) % (uint64_t)V);
	return t;
}

/* ---- comparisons: each prints the worst miss and returns the number of misses ---- */

static int report(const char *what, size_t bad, size_t worst, double got, double want,
		  double tol)
{
	if (bad)
		fprintf(stderr, "\n%s: %zu misses; worst at %zu: got %.9g, want %.9g, tolerance %.3g\n",
			what, bad, worst, got, want, tol);
	return bad ? 1 : 0;
}

/* |got - want| <= atol + rtol |want| elementwise; a NaN anywhere is a miss */
int cfx_close_elem(const char *what, const float *got, const float *want, size_t n, double atol,
		      double rtol)
{
	size_t bad = 0, worst = 0;
	double worst_ex = -1;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]), tol = atol + rtol * fabs(want[i]);
		if (!(d <= tol)) {
			bad++;
			if (!(d - tol <= worst_ex)) {
				worst_ex = d - tol;
				worst = i;
			}
		}
	}
	return report(what, bad, worst, got[worst], want[worst], atol + rtol * fabs(want[worst]));
}

/* |got - want| <= bound[i] elementwise */
int cfx_close_bound(const char *what, const float *got, const float *want, const float *bound,
		       size_t n)
{
	size_t bad = 0, worst = 0;
	double worst_ex = -1;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= bound[i])) {
			bad++;
			if (!(d - bound[i] <= worst_ex)) {
				worst_ex = d - bound[i];
				worst = i;
			}
		}
	}
	return report(what, bad, worst, got[worst], want[worst], bound[worst]);
}

/* normwise: max |got - want| <= rel max |want| (for composed units, where elementwise error
 * bounds are not worth deriving: see test_gpt_units) */
int cfx_close_norm(const char *what, const float *got, const float *want, size_t n, double rel)
{
	double maxw = 0, maxd = 0;
	size_t worst = 0, bad = 0;
	for (size_t i = 0; i < n; i++)
		if (fabs(want[i]) > maxw)
			maxw = fabs(want[i]);
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= maxd)) {
			maxd = d;
			worst = i;
		}
	}
	double tol = rel * maxw + 1e-30;
	if (!(maxd <= tol))
		bad = 1;
	return report(what, bad, worst, got[worst], want[worst], tol);
}

/* bit for bit (NaNs included) */
int cfx_same_bits(const char *what, const void *got, const void *want, size_t n, size_t elem)
{
	const unsigned char *g = got, *w = want;
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp(g + i * elem, w + i * elem, elem)) {
			if (!bad)
				first = i;
			bad++;
		}
	if (bad)
		fprintf(stderr, "\n%s: %zu of %zu differ in their bits, the first at %zu\n", what, bad,
			n, first);
	return bad ? 1 : 0;
}

/* ---- the device ---- */

static CudaCtx *g_ctx; /* created by the first GPU test, destroyed by a suite's cleanup */

CudaCtx *cfx_ctx(void)
{
	if (!g_ctx)
		g_ctx = cuda_ctx_create(0);
	return g_ctx;
}

static int suite_cleanup(void)
{
	cuda_ctx_destroy(g_ctx);
	g_ctx = NULL;
	return 0;
}

void *cfx_put(const void *host, size_t bytes)
{
	void *d = cuda_ctx_alloc(bytes);
	if (host)
		cuda_ctx_upload(cfx_ctx(), d, host, bytes);
	else
		cuda_ctx_zero(cfx_ctx(), d, bytes);
	return d;
}

float *cfx_up(const float *host, size_t n) { return cfx_put(host, n * sizeof(float)); }

float *cfx_down(const float *dev, size_t n)
{
	float *h = cfx_floats(n);
	cuda_ctx_download(cfx_ctx(), h, dev, n * sizeof(float));
	return h;
}

float *cfx_up_rows(const float *host, size_t rows, size_t cols, size_t ld)
{
	float *h = cfx_floats(rows * ld);
	for (size_t i = 0; i < rows; i++)
		for (size_t j = 0; j < ld; j++)
			h[i * ld + j] = j < cols ? (host ? host[i * cols + j] : 0.0f) : NAN;
	float *d = cfx_up(h, rows * ld);
	free(h);
	return d;
}

float *cfx_down_rows(const float *dev, size_t rows, size_t cols, size_t ld)
{
	float *h = cfx_down(dev, rows * ld);
	for (size_t i = 0; i < rows; i++)
		memmove(h + i * cols, h + i * ld, cols * sizeof(float));
	return h;
}

/* Round x to 16 bits in place (so the reference sees the GPU's inputs) and return the bits. */
uint16_t *cfx_round16(float *x, size_t n, CudaDtype t)
{
	uint16_t *b = malloc(n * 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	(t == CDT_BF16 ? precision_f32_to_bf16_n : precision_f32_to_f16_n)(b, x, n);
	(t == CDT_BF16 ? precision_bf16_to_f32_n : precision_f16_to_f32_n)(x, b, n);
	return b;
}

/* ---- registration ---- */

int cfx_register(const char *name, const char *file, const PxTestCase *cpu, int n_cpu,
		 const PxTestCase *gpu, int n_gpu)
{
	CU_pSuite s = CU_add_suite(name, NULL, suite_cleanup);
	if (!s)
		return -1;
	for (int i = 0; i < n_cpu; i++)
		if (!px_add_case(s, &cpu[i]))
			return -1;
	char reason[256];
	int avail = cuda_ctx_available(reason, sizeof(reason));
	for (int i = 0; i < n_gpu; i++) {
		CU_pTest t = CU_add_test(s, gpu[i].name, gpu[i].fn);
		if (!t)
			return -1;
		if (!avail && CU_set_test_active(t, CU_FALSE) != CUE_SUCCESS)
			return -1;
	}
	if (!avail) {
		/* CUnit counts an inactive test as a failure unless told otherwise; a global
		 * setting, which no other suite relies on */
		CU_set_fail_on_inactive(CU_FALSE);
		printf("%s: skipped: no CUDA device (%s); %d GPU tests inactive, %d CPU-side tests "
		       "run\n",
		       file, reason, n_gpu, n_cpu);
	}
	return 0;
}

#else
typedef int cfx_no_cuda; /* ISO C wants a declaration in every translation unit */
#endif
