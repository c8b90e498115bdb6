/* Kernels on the GPU against their plain-C references (kernels/ops_cpu.c, precision.c) on random
 * inputs, each with its tolerance and the reason for it next to the test (gpt_cuda's units against
 * gpt_cpu: test_gpt_cuda.c). Without a CUDA device the GPU tests are registered but marked
 * inactive (CUnit reports them as such, not as passed) and one line says why; without CUDA at
 * build time no test is registered and one line says that. The tests that need no GPU (the device
 * casts' host build against precision.c, argument checks) run wherever CUDA is built.
 *
 * u = 2^-24, fp32's unit roundoff. A sum of K products computed in any order, with or without
 * fused multiply-adds, is within gamma_K = K u / (1 - K u) of sum |terms| of the exact value
 * (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1), so two fp32
 * implementations are within 2 gamma_K of each other; GEMM tests use 4 (K + 2) u sum |terms|
 * elementwise, the factor 2 more allowing tensor cores' fp32 accumulation to truncate rather
 * than round. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

#ifdef PX_HAVE_CUDA

#include <cblas.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../kernels/cast_cuda.h"
#include "../kernels/cuda_ctx.h"
#include "../kernels/gemm_cuda.h"
#include "../kernels/ops16_cpu.h"
#include "../kernels/ops16_cuda.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/ops_cuda.h"
#include "../kernels/optim_cuda.h"
#include "../kernels/precision.h"
#include "../kernels/rng.h"
#include "cuda_fixtures.h"

/* ---- the context ---- */

/* The device has a name; uploads, device copies, zero fills and downloads round-trip exactly and
 * in stream order. */
static void test_ctx_memory(void)
{
	enum { n = 1000 };
	CU_ASSERT(strlen(cuda_ctx_device_name(cfx_ctx())) > 0);
	float *x = cfx_random(n, 1, 3);
	float *a = cfx_up(x, n), *b = cfx_up(NULL, n);
	cuda_ctx_copy(cfx_ctx(), b, a, n * sizeof(float));
	cuda_ctx_zero(cfx_ctx(), a, n / 2 * sizeof(float));
	float *hb = cfx_down(b, n), *ha = cfx_down(a, n);
	CU_ASSERT_EQUAL(cfx_same_bits("copy round trip", hb, x, n, 4), 0);
	float *want = cfx_copy(x, n);
	memset(want, 0, n / 2 * sizeof(float));
	CU_ASSERT_EQUAL(cfx_same_bits("zero fill", ha, want, n, 4), 0);
	cuda_ctx_sync(cfx_ctx());
	free(x), free(hb), free(ha), free(want);
	cuda_ctx_free(a), cuda_ctx_free(b);
	cuda_ctx_free(NULL); /* accepted, as free() */
}

/* ---- GEMM ---- */

/* bound = 4 (K + 2) u (|beta C0| + |alpha| |A| |B|), the two implementations' error bound (top of
 * file), computed with the reference itself on absolute values */
static float *gemm_bound(int ta, int tb, int M, int N, int K, float alpha, const float *A,
			 const float *B, float beta, const float *C0)
{
	float *aA = cfx_abs(A, (size_t)M * K), *aB = cfx_abs(B, (size_t)K * N);
	float *bound = cfx_abs(C0, (size_t)M * N);
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
		    N, K, fabsf(alpha), aA, ta ? M : K, aB, tb ? K : N, fabsf(beta), bound, N);
	for (size_t i = 0; i < (size_t)M * N; i++)
		bound[i] = (float)(4.0 * (K + 2) * CFX_U * bound[i]) + 1e-30f;
	free(aA), free(aB);
	return bound;
}

/* Every transpose combination of the generic GEMM, fp32 in and out, alpha and beta not 1, against
 * cblas_sgemm; odd sizes so no dimension is a multiple of a tile. */
static void test_gemm_f32(void)
{
	enum { M = 37, N = 53, K = 71 };
	float alpha = 0.75f, beta = -1.5f;
	float *A = cfx_random((size_t)M * K, 1, 1), *B = cfx_random((size_t)K * N, 1, 2);
	float *C0 = cfx_random((size_t)M * N, 1, 3);
	float *dA = cfx_up(A, (size_t)M * K), *dB = cfx_up(B, (size_t)K * N);
	float *dC = cfx_up(NULL, (size_t)M * N);
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			float *want = cfx_copy(C0, (size_t)M * N);
			cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
				    tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, ta ? M : K, B,
				    tb ? K : N, beta, want, N);
			cuda_ctx_upload(cfx_ctx(), dC, C0, (size_t)M * N * sizeof(float));
			gemm_cuda(cfx_ctx(), CDT_F32, CDT_F32, ta, tb, M, N, K, alpha, dA, dB, beta, dC);
			float *got = cfx_down(dC, (size_t)M * N);
			float *bound = gemm_bound(ta, tb, M, N, K, alpha, A, B, beta, C0);
			char what[64];
			snprintf(what, sizeof(what), "gemm f32 ta=%d tb=%d", ta, tb);
			CU_ASSERT_EQUAL(cfx_close_bound(what, got, want, bound, (size_t)M * N), 0);
			free(want), free(got), free(bound);
		}
	cuda_ctx_free(dA), cuda_ctx_free(dB), cuda_ctx_free(dC);
	free(A), free(B), free(C0);
}

/* 16-bit inputs with fp32 accumulation: the inputs are rounded to 16 bits on the host, and the
 * reference multiplies those rounded values in fp32. A product of two bf16 (8-bit significands) or
 * fp16 (11-bit) values is exact in fp32, so the fp32 bound applies unchanged; a 16-bit output adds
 * its own rounding, half an ulp: 2^-8 |want| for bf16, 2^-11 for fp16. */
static void gemm_16(CudaDtype ab, CudaDtype c)
{
	enum { M = 45, N = 38, K = 129 };
	float alpha = 1.0f, beta = 0.5f;
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = cfx_random(na, 1, 11), *B = cfx_random(nb, 1, 12), *C0 = cfx_random(nc, 1, 13);
	uint16_t *A16 = malloc(na * 2), *B16 = malloc(nb * 2), *C16 = malloc(nc * 2);
	CU_ASSERT_FATAL(A16 && B16 && C16);
	void (*to16)(uint16_t *, const float *, size_t) =
		ab == CDT_BF16 ? precision_f32_to_bf16_n : precision_f32_to_f16_n;
	void (*from16)(float *, const uint16_t *, size_t) =
		ab == CDT_BF16 ? precision_bf16_to_f32_n : precision_f16_to_f32_n;
	to16(A16, A, na);
	to16(B16, B, nb);
	from16(A, A16, na); /* the reference sees exactly what the GPU sees */
	from16(B, B16, nb);
	if (c != CDT_F32) {
		to16(C16, C0, nc);
		from16(C0, C16, nc);
	}
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			float *want = cfx_copy(C0, nc);
			cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
				    tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, ta ? M : K, B,
				    tb ? K : N, beta, want, N);
			/* A and B are stored (M, K) and (K, N) here whatever the flags: transposing
			 * only reinterprets the same random data, which is all the test needs */
			void *dA = cfx_put(A16, na * 2), *dB = cfx_put(B16, nb * 2);
			void *dC = c == CDT_F32 ? cfx_put(C0, nc * 4) : cfx_put(C16, nc * 2);
			gemm_cuda(cfx_ctx(), ab, c, ta, tb, M, N, K, alpha, dA, dB, beta, dC);
			float *got = cfx_floats(nc);
			if (c == CDT_F32) {
				cuda_ctx_download(cfx_ctx(), got, dC, nc * 4);
			} else {
				uint16_t *g16 = malloc(nc * 2);
				CU_ASSERT_PTR_NOT_NULL_FATAL(g16);
				cuda_ctx_download(cfx_ctx(), g16, dC, nc * 2);
				from16(got, g16, nc);
				free(g16);
			}
			float *bound = gemm_bound(ta, tb, M, N, K, alpha, A, B, beta, C0);
			double out_u = c == CDT_BF16 ? 1.0 / 256 : c == CDT_F16 ? 1.0 / 2048 : 0.0;
			for (size_t i = 0; i < nc; i++)
				bound[i] += (float)(out_u * fabs(want[i]));
			char what[80];
			snprintf(what, sizeof(what), "gemm %s in, %s out, ta=%d tb=%d",
				 ab == CDT_BF16 ? "bf16" : "fp16", c == CDT_F32 ? "fp32" : "16-bit",
				 ta, tb);
			CU_ASSERT_EQUAL(cfx_close_bound(what, got, want, bound, nc), 0);
			cuda_ctx_free(dA), cuda_ctx_free(dB), cuda_ctx_free(dC);
			free(want), free(got), free(bound);
		}
	free(A), free(B), free(C0), free(A16), free(B16), free(C16);
}

static void test_gemm_bf16(void)
{
	gemm_16(CDT_BF16, CDT_F32);
	gemm_16(CDT_BF16, CDT_BF16);
}

static void test_gemm_f16(void)
{
	gemm_16(CDT_F16, CDT_F32);
	gemm_16(CDT_F16, CDT_F16);
}

/* ---- linear layers ---- */

/* Forward with and without bias, backward accumulating into random gradients; GEMM bounds with
 * K = C_in (forward), C_out (dx) and N (dw); db's column sums of N terms the same way. */
static void test_matmul(void)
{
	enum { N = 37, CI = 72, CO = 200 };
	size_t nx = (size_t)N * CI, nw = (size_t)CI * CO, ny = (size_t)N * CO;
	float *x = cfx_random(nx, 1, 21), *w = cfx_random(nw, 1, 22), *b = cfx_random(CO, 1, 23);
	float *dy = cfx_random(ny, 1, 24), *dx0 = cfx_random(nx, 1, 25);
	float *dw0 = cfx_random(nw, 1, 26);
	float *db0 = cfx_random(CO, 1, 27);
	float *dx_ = cfx_up(x, nx), *dw_ = cfx_up(w, nw), *db_ = cfx_up(b, CO);
	float *ddy = cfx_up(dy, ny);
	float *dyout = cfx_up(NULL, ny);
	float *ax = cfx_abs(x, nx), *aw = cfx_abs(w, nw), *ab = cfx_abs(b, CO);
	float *ady = cfx_abs(dy, ny);

	for (int with_bias = 0; with_bias < 2; with_bias++) {
		float *want = cfx_floats(ny), *bound = cfx_floats(ny);
		ops_matmul_forward(want, x, w, with_bias ? b : NULL, N, CI, CO);
		ops_cuda_matmul_forward(cfx_ctx(), dyout, dx_, dw_, with_bias ? db_ : NULL, N, CI, CO);
		ops_matmul_forward(bound, ax, aw, with_bias ? ab : NULL, N, CI, CO);
		for (size_t i = 0; i < ny; i++)
			bound[i] = (float)(4.0 * (CI + 2) * CFX_U * bound[i]);
		float *got = cfx_down(dyout, ny);
		CU_ASSERT_EQUAL(cfx_close_bound(with_bias ? "matmul forward (bias)" : "matmul forward",
					    got, want, bound, ny),
				0);
		free(want), free(bound), free(got);
	}

	float *wdx = cfx_copy(dx0, nx), *wdw = cfx_copy(dw0, nw), *wdb = cfx_copy(db0, CO);
	ops_matmul_backward(wdx, wdw, wdb, dy, x, w, N, CI, CO);
	float *gdx = cfx_up(dx0, nx), *gdw = cfx_up(dw0, nw), *gdb = cfx_up(db0, CO);
	ops_cuda_matmul_backward(cfx_ctx(), gdx, gdw, gdb, ddy, dx_, dw_, N, CI, CO);
	float *bx = cfx_abs(dx0, nx), *bw = cfx_abs(dw0, nw), *bb = cfx_abs(db0, CO);
	ops_matmul_backward(bx, bw, bb, ady, ax, aw, N, CI, CO);
	for (size_t i = 0; i < nx; i++)
		bx[i] = (float)(4.0 * (CO + 2) * CFX_U * bx[i]);
	for (size_t i = 0; i < nw; i++)
		bw[i] = (float)(4.0 * (N + 2) * CFX_U * bw[i]);
	for (size_t i = 0; i < CO; i++)
		bb[i] = (float)(4.0 * (N + 2) * CFX_U * bb[i]);
	float *hx = cfx_down(gdx, nx), *hw = cfx_down(gdw, nw), *hb = cfx_down(gdb, CO);
	CU_ASSERT_EQUAL(cfx_close_bound("matmul backward dx", hx, wdx, bx, nx), 0);
	CU_ASSERT_EQUAL(cfx_close_bound("matmul backward dw", hw, wdw, bw, nw), 0);
	CU_ASSERT_EQUAL(cfx_close_bound("matmul backward db", hb, wdb, bb, CO), 0);

	free(hx), free(hw), free(hb), free(bx), free(bw), free(bb), free(wdx), free(wdw), free(wdb);
	cuda_ctx_free(gdx), cuda_ctx_free(gdw), cuda_ctx_free(gdb);
	cuda_ctx_free(dx_), cuda_ctx_free(dw_), cuda_ctx_free(db_), cuda_ctx_free(ddy);
	cuda_ctx_free(dyout);
	free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0);
	free(ax), free(aw), free(ab), free(ady);
}

/* The 16-bit linear layer against the fp32 reference on the same rounded x, w and dy: products of
 * 16-bit values are exact in fp32, so the fp32 GEMM bounds of test_matmul apply unchanged. */
static void test_matmul_16(void)
{
	enum { N = 41, CI = 96, CO = 130 };
	size_t nx = (size_t)N * CI, nw = (size_t)CI * CO, ny = (size_t)N * CO;
	for (int k = 0; k < 2; k++) {
		CudaDtype t = k ? CDT_F16 : CDT_BF16;
		float *x = cfx_random(nx, 1, 201), *w = cfx_random(nw, 1, 202);
		float *b = cfx_random(CO, 1, 203);
		float *dy = cfx_random(ny, 1, 204), *dx0 = cfx_random(nx, 1, 205);
		float *dw0 = cfx_random(nw, 1, 206), *db0 = cfx_random(CO, 1, 207);
		uint16_t *x16 = cfx_round16(x, nx, t), *w16 = cfx_round16(w, nw, t);
		uint16_t *dy16 = cfx_round16(dy, ny, t);
		void *gx = cfx_put(x16, nx * 2), *gw = cfx_put(w16, nw * 2);
		void *gdy = cfx_put(dy16, ny * 2);
		float *gb = cfx_up(b, CO), *gy = cfx_up(NULL, ny);
		float *gdx = cfx_up(dx0, nx), *gdw = cfx_up(dw0, nw), *gdb = cfx_up(db0, CO);
		float *ax = cfx_abs(x, nx), *aw = cfx_abs(w, nw), *ab = cfx_abs(b, CO);
		float *ady = cfx_abs(dy, ny);

		float *want = cfx_floats(ny), *bound = cfx_floats(ny);
		ops_matmul_forward(want, x, w, b, N, CI, CO);
		ops_matmul_forward(bound, ax, aw, ab, N, CI, CO);
		for (size_t i = 0; i < ny; i++)
			bound[i] = (float)(4.0 * (CI + 2) * CFX_U * bound[i]);
		ops_cuda_matmul_forward_16(cfx_ctx(), t, gy, gx, gw, gb, N, CI, CO);
		float *got = cfx_down(gy, ny);
		CU_ASSERT_EQUAL(cfx_close_bound(k ? "matmul fp16 forward" : "matmul bf16 forward", got,
					    want, bound, ny),
				0);

		float *wdx = cfx_copy(dx0, nx), *wdw = cfx_copy(dw0, nw), *wdb = cfx_copy(db0, CO);
		ops_matmul_backward(wdx, wdw, wdb, dy, x, w, N, CI, CO);
		float *bx = cfx_abs(dx0, nx), *bw = cfx_abs(dw0, nw), *bb = cfx_abs(db0, CO);
		ops_matmul_backward(bx, bw, bb, ady, ax, aw, N, CI, CO);
		for (size_t i = 0; i < nx; i++)
			bx[i] = (float)(4.0 * (CO + 2) * CFX_U * bx[i]);
		for (size_t i = 0; i < nw; i++)
			bw[i] = (float)(4.0 * (N + 2) * CFX_U * bw[i]);
		for (size_t i = 0; i < CO; i++)
			bb[i] = (float)(4.0 * (N + 2) * CFX_U * bb[i]);
		ops_cuda_matmul_backward_16(cfx_ctx(), t, gdx, gdw, gdb, gdy, gx, gw, N, CI, CO);
		float *hx = cfx_down(gdx, nx), *hw = cfx_down(gdw, nw), *hb = cfx_down(gdb, CO);
		CU_ASSERT_EQUAL(cfx_close_bound("matmul 16-bit backward dx", hx, wdx, bx, nx), 0);
		CU_ASSERT_EQUAL(cfx_close_bound("matmul 16-bit backward dw", hw, wdw, bw, nw), 0);
		CU_ASSERT_EQUAL(cfx_close_bound("matmul 16-bit backward db", hb, wdb, bb, CO), 0);

		free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(x16);
		free(w16), free(dy16), free(ax), free(aw), free(ab), free(ady), free(want), free(bound);
		free(got), free(wdx), free(wdw), free(wdb), free(bx), free(bw), free(bb), free(hx);
		free(hw), free(hb);
		cuda_ctx_free(gx), cuda_ctx_free(gw), cuda_ctx_free(gdy), cuda_ctx_free(gb);
		cuda_ctx_free(gy), cuda_ctx_free(gdx), cuda_ctx_free(gdw), cuda_ctx_free(gdb);
	}
}

/* 1 when every padding element of the device's rows (ld apart) is still NaN, as cfx_up_rows
 * left it: nothing was written there */
static int padding_untouched(const float *dev, size_t rows, size_t cols, size_t ld)
{
	float *h = cfx_down(dev, rows * ld);
	int ok = 1;
	for (size_t i = 0; i < rows; i++)
		for (size_t j = cols; j < ld; j++)
			ok &= isnan(h[i * ld + j]) != 0;
	free(h);
	return ok;
}

/* The tied LM head: K = C forward, V for dx, N for dwte. The logits' rows on the device are
 * ops_cuda_logits_ld(V) apart (V = 131 is odd, as GPT-2's 50,257), the padding NaN: a product
 * that read it would turn dx or dwte to NaN, one that wrote it would leave a number there. */
static void test_lm_head(void)
{
	enum { N = 29, C = 48, V = 131 };
	int ld = ops_cuda_logits_ld(V);
	size_t nx = (size_t)N * C, nw = (size_t)V * C, nl = (size_t)N * V;
	float *x = cfx_random(nx, 1, 31), *wte = cfx_random(nw, 1, 32), *dl = cfx_random(nl, 1, 33);
	float *dx0 = cfx_random(nx, 1, 34), *dwte0 = cfx_random(nw, 1, 35);
	float *ax = cfx_abs(x, nx), *aw = cfx_abs(wte, nw), *adl = cfx_abs(dl, nl);
	float *gx = cfx_up(x, nx), *gw = cfx_up(wte, nw), *gl = cfx_up_rows(NULL, N, V, ld);
	float *gdl = cfx_up_rows(dl, N, V, ld);
	CU_ASSERT_EQUAL(ld, 136);

	float *want = cfx_floats(nl), *bound = cfx_floats(nl);
	ops_lm_head_forward(want, x, wte, N, C, V);
	ops_lm_head_forward(bound, ax, aw, N, C, V);
	for (size_t i = 0; i < nl; i++)
		bound[i] = (float)(4.0 * (C + 2) * CFX_U * bound[i]);
	ops_cuda_lm_head_forward(cfx_ctx(), gl, gx, gw, N, C, V, ld);
	float *got = cfx_down_rows(gl, N, V, ld);
	CU_ASSERT_EQUAL(cfx_close_bound("lm head forward", got, want, bound, nl), 0);
	CU_ASSERT(padding_untouched(gl, N, V, ld));

	float *wdx = cfx_copy(dx0, nx), *wdw = cfx_copy(dwte0, nw);
	ops_lm_head_backward(wdx, wdw, dl, x, wte, N, C, V);
	float *bx = cfx_abs(dx0, nx), *bw = cfx_abs(dwte0, nw);
	ops_lm_head_backward(bx, bw, adl, ax, aw, N, C, V);
	for (size_t i = 0; i < nx; i++)
		bx[i] = (float)(4.0 * (V + 2) * CFX_U * bx[i]);
	for (size_t i = 0; i < nw; i++)
		bw[i] = (float)(4.0 * (N + 2) * CFX_U * bw[i]);
	float *gdx = cfx_up(dx0, nx), *gdw = cfx_up(dwte0, nw);
	ops_cuda_lm_head_backward(cfx_ctx(), gdx, gdw, gdl, gx, gw, N, C, V, ld);
	float *hx = cfx_down(gdx, nx), *hw = cfx_down(gdw, nw);
	CU_ASSERT_EQUAL(cfx_close_bound("lm head backward dx", hx, wdx, bx, nx), 0);
	CU_ASSERT_EQUAL(cfx_close_bound("lm head backward dwte", hw, wdw, bw, nw), 0);

	free(want), free(bound), free(got), free(wdx), free(wdw), free(bx), free(bw), free(hx);
	free(hw), free(x), free(wte), free(dl), free(dx0), free(dwte0), free(ax), free(aw), free(adl);
	cuda_ctx_free(gx), cuda_ctx_free(gw), cuda_ctx_free(gl), cuda_ctx_free(gdl);
	cuda_ctx_free(gdx), cuda_ctx_free(gdw);
}

/* ---- layernorm ---- */

/* Rows of C = 200 (not a multiple of the warp) with a non-zero mean, so the two-pass statistics
 * matter. The reference forms mean and variance in double, the GPU in fp32 by lanes and a
 * butterfly: each of mean and rstd is then off by at most about gamma_C relative, 1.2e-5 for
 * C = 200 at the worst and ~1e-7 typically, and y = xhat w + b inherits that on |xhat w| <~ 4:
 * atol 1e-5 with rtol 1e-5 sits at the worst case. Backward: dx's two means of C terms, the same
 * reasoning, atol 1e-5 + rtol 1e-4 with |dx| up to ~10 times |dy|; dw and db are column sums over
 * N rows reordered into row blocks and phases, so 4 (N + 2) u of sum |terms|, computed from the
 * inputs. Three shapes: the one above (8 row blocks of 9 rows), 4,096 rows of 40 (the most row
 * blocks, 64, a column tile each) and 9 rows of 40,000 (one row block; dw's and db's partials
 * overflow the context's workspace, so two column chunks). */
static void layernorm_case(int N, int C)
{
	size_t n = (size_t)N * C;
	float *x = cfx_random(n, 1, 41), *w = cfx_random(C, 1, 42), *b = cfx_random(C, 1, 43);
	for (size_t i = 0; i < n; i++)
		x[i] += 3.0f;
	float *dy = cfx_random(n, 1, 44), *dx0 = cfx_random(n, 1, 45), *dw0 = cfx_random(C, 1, 46);
	float *db0 = cfx_random(C, 1, 47);
	float *gx = cfx_up(x, n), *gw = cfx_up(w, C), *gb = cfx_up(b, C), *gy = cfx_up(NULL, n);
	float *gm = cfx_up(NULL, N), *gr = cfx_up(NULL, N), *gdy = cfx_up(dy, n);
	float *scratch = cfx_up(NULL, OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(N));

	float *want = cfx_floats(n), *wm = cfx_floats(N), *wr = cfx_floats(N);
	ops_layernorm_forward(want, wm, wr, x, w, b, N, C);
	ops_cuda_layernorm_forward(cfx_ctx(), gy, gm, gr, gx, gw, gb, N, C);
	float *got = cfx_down(gy, n), *hm = cfx_down(gm, N), *hr = cfx_down(gr, N);
	CU_ASSERT_EQUAL(cfx_close_elem("layernorm forward y", got, want, n, 1e-5, 1e-5), 0);
	CU_ASSERT_EQUAL(cfx_close_elem("layernorm forward mean", hm, wm, N, 0, 1e-5), 0);
	CU_ASSERT_EQUAL(cfx_close_elem("layernorm forward rstd", hr, wr, N, 0, 1e-5), 0);
	/* in place (y = x), which the block does not use but the contract allows */
	float *gx2 = cfx_up(x, n);
	ops_cuda_layernorm_forward(cfx_ctx(), gx2, NULL, NULL, gx2, gw, gb, N, C);
	float *got2 = cfx_down(gx2, n);
	CU_ASSERT_EQUAL(cfx_close_elem("layernorm forward in place", got2, want, n, 1e-5, 1e-5), 0);

	float *wdx = cfx_copy(dx0, n), *wdw = cfx_copy(dw0, C), *wdb = cfx_copy(db0, C);
	ops_layernorm_backward(wdx, wdw, wdb, dy, x, w, N, C);
	float *gdx = cfx_up(dx0, n), *gdw = cfx_up(dw0, C), *gdb = cfx_up(db0, C);
	ops_cuda_layernorm_backward(cfx_ctx(), gdx, gdw, gdb, gdy, gx, gw, N, C, scratch);
	float *hdx = cfx_down(gdx, n), *hdw = cfx_down(gdw, C), *hdb = cfx_down(gdb, C);
	/* column bounds: xhat from the reference forward with w = 1, b = 0 */
	float *ones = cfx_floats(C), *zeros = cfx_floats(C), *xhat = cfx_floats(n);
	for (int j = 0; j < C; j++)
		ones[j] = 1.0f;
	ops_layernorm_forward(xhat, NULL, NULL, x, ones, zeros, N, C);
	float *bw = cfx_abs(dw0, C), *bb = cfx_abs(db0, C);
	for (int i = 0; i < N; i++)
		for (int j = 0; j < C; j++) {
			bw[j] += fabsf(dy[(size_t)i * C + j] * xhat[(size_t)i * C + j]);
			bb[j] += fabsf(dy[(size_t)i * C + j]);
		}
	for (int j = 0; j < C; j++) {
		/* + a few ulps of each term for xhat's own difference (the statistics above) */
		bw[j] = (float)(4.0 * (N + 2) * CFX_U * bw[j] + 1e-5 * fabs(wdw[j]));
		bb[j] = (float)(4.0 * (N + 2) * CFX_U * bb[j]);
	}
	CU_ASSERT_EQUAL(cfx_close_elem("layernorm backward dx", hdx, wdx, n, 1e-5, 1e-4), 0);
	CU_ASSERT_EQUAL(cfx_close_bound("layernorm backward dw", hdw, wdw, bw, C), 0);
	CU_ASSERT_EQUAL(cfx_close_bound("layernorm backward db", hdb, wdb, bb, C), 0);

	free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(want), free(wm);
	free(wr), free(got), free(hm), free(hr), free(got2), free(wdx), free(wdw), free(wdb);
	free(hdx), free(hdw), free(hdb), free(ones), free(zeros), free(xhat), free(bw), free(bb);
	cuda_ctx_free(gx), cuda_ctx_free(gw), cuda_ctx_free(gb), cuda_ctx_free(gy);
	cuda_ctx_free(gm), cuda_ctx_free(gr), cuda_ctx_free(gdy), cuda_ctx_free(scratch);
	cuda_ctx_free(gx2), cuda_ctx_free(gdx), cuda_ctx_free(gdw), cuda_ctx_free(gdb);
}

static void test_layernorm(void)
{
	layernorm_case(67, 200);
	layernorm_case(4096, 40);
	layernorm_case(9, 40000);
}

/* A linear layer's bias gradient alone (dx and dw NULL): db += the column sums of dy, against
 * sums in double, within 4 (N + 2) u of sum |terms| in any order. 9 rows of 70,001 columns (one
 * row block, two column chunks of the context's workspace) and 4,096 rows of 40 (64 row blocks). */
static void test_column_sums(void)
{
	const int shapes[][2] = {{9, 70001}, {4096, 40}};
	for (int k = 0; k < 2; k++) {
		int N = shapes[k][0], C = shapes[k][1];
		size_t n = (size_t)N * C;
		float *dy = cfx_random(n, 1, 51 + k), *db0 = cfx_random(C, 1, 53 + k);
		float *want = cfx_floats(C), *bound = cfx_floats(C);
		for (int j = 0; j < C; j++) {
			double s = db0[j], a = fabs(db0[j]);
			for (int i = 0; i < N; i++) {
				s += dy[(size_t)i * C + j];
				a += fabs(dy[(size_t)i * C + j]);
			}
			want[j] = (float)s;
			bound[j] = (float)(4.0 * (N + 2) * CFX_U * a);
		}
		float *gdy = cfx_up(dy, n), *gdb = cfx_up(db0, C);
		ops_cuda_matmul_backward(cfx_ctx(), NULL, NULL, gdb, gdy, NULL, NULL, N, 1, C);
		float *got = cfx_down(gdb, C);
		CU_ASSERT_EQUAL(cfx_close_bound("column sums", got, want, bound, C), 0);
		free(dy), free(db0), free(want), free(bound), free(got);
		cuda_ctx_free(gdy), cuda_ctx_free(gdb);
	}
}

/* ---- GELU ---- */

/* Same formula, same float operations; what differs is tanhf, whose CUDA version is within 2 ulp
 * (CUDA C Programming Guide, appendix on mathematical functions) against glibc's ~1 ulp, and the
 * GPU's fused multiply-adds. For |x| <= 5 that moves y by at most 0.5 |x| 4u-ish in absolute
 * terms (tanh's error is absolute near -1, where 1 + tanh cancels): atol 2e-6, rtol 1e-6. In the
 * derivative the same 2 ulp (1.2e-7) of tanh enter through 0.5 x (1 - th^2) du, at most
 * 0.5 |x| 2 |th| 1.2e-7 du <~ 6e-6 |dy| for |x| <= 7 (du <~ 6 there) with |dy| up to ~4:
 * atol 3e-5, rtol 1e-6. */
static void test_gelu(void)
{
	enum { n = 10007 };
	float *x = cfx_random(n, 1.7f, 51), *dy = cfx_random(n, 1, 52), *dx0 = cfx_random(n, 1, 53);
	float *gx = cfx_up(x, n), *gy = cfx_up(NULL, n), *gdy = cfx_up(dy, n);
	float *gdx = cfx_up(dx0, n);
	float *want = cfx_floats(n), *wdx = cfx_copy(dx0, n);
	ops_gelu_forward(want, x, n);
	ops_gelu_backward(wdx, dy, x, n);
	ops_cuda_gelu_forward(cfx_ctx(), gy, gx, n);
	ops_cuda_gelu_backward(cfx_ctx(), gdx, gdy, gx, n);
	float *got = cfx_down(gy, n), *hdx = cfx_down(gdx, n);
	CU_ASSERT_EQUAL(cfx_close_elem("gelu forward", got, want, n, 2e-6, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_elem("gelu backward", hdx, wdx, n, 3e-5, 1e-6), 0);
	free(x), free(dy), free(dx0), free(want), free(wdx), free(got), free(hdx);
	cuda_ctx_free(gx), cuda_ctx_free(gy), cuda_ctx_free(gdy), cuda_ctx_free(gdx);
}

/* ---- attention ---- */

/* The backward's scratch at three sizes, in floats: enough for 10 query rows of one head (row
 * tiles, T = 37 and 33 leaving a short last tile), for 2 whole heads (head chunks, NH = 3 leaving
 * one), and what gpt_cuda gives it (3 B T C: every head at once). The 16-bit path first takes
 * (B T C + 1) / 2 floats for the rounded dout. */
static size_t attention_scratch(int size, int B, int T, int C, int is16)
{
	size_t btc = (size_t)B * T * C, g = is16 ? (btc + 1) / 2 : 0, e = is16 ? 2 : 1;
	size_t sizes[3] = {g + (10 * (size_t)T + e - 1) / e, g + (2 * (size_t)T * T + e - 1) / e,
			   3 * btc};
	return sizes[size];
}

/* Shapes: hs = 24 and 72, T = 37 and 33 (not multiples of 8 or of a warp), NH = 3 and 2, B = 2
 * and 1. fp32: the GEMMs sum the scores' hs terms and the outputs' T terms in another order than
 * the reference (gamma_hs of sum |q k|, ~1e-6 here; the masked terms add exact zeros), softmax sums
 * in fp32 against double (gamma_T relative) and expf within 2 ulp: probabilities agree to about
 * 1e-5 relative, outputs (sums of T probability-weighted values) to atol 1e-5 + rtol 1e-5 with
 * qkv ~ N(0, 1). Backward chains three such sums per element (dP, the row sum P.dP, then
 * dq/dk/dv): atol 5e-5, rtol 1e-4. The masked upper triangle must be exactly zero. */
static void attention_case(int B, int T, int C, int NH, uint64_t seed)
{
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
	float *qkv = cfx_random(nqkv, 1, seed), *dout = cfx_random(nout, 1, seed + 1);
	float *dqkv0 = cfx_random(nqkv, 1, seed + 2);
	float *want = cfx_floats(nout), *watt = cfx_floats(natt), *wdqkv = cfx_copy(dqkv0, nqkv);
	ops_attention_forward(want, watt, qkv, B, T, C, NH);
	ops_attention_backward(wdqkv, dout, qkv, watt, B, T, C, NH);

	float *gqkv = cfx_up(qkv, nqkv), *gout = cfx_up(NULL, nout), *gatt = cfx_up(NULL, natt);
	float *gdout = cfx_up(dout, nout);
	ops_cuda_attention_forward(cfx_ctx(), gout, gatt, gqkv, B, T, C, NH);
	float *got = cfx_down(gout, nout), *hatt = cfx_down(gatt, natt);
	char what[96];
	snprintf(what, sizeof(what), "attention forward att (hs %d, T %d)", C / NH, T);
	CU_ASSERT_EQUAL(cfx_close_elem(what, hatt, watt, natt, 1e-6, 1e-5), 0);
	size_t above = 0;
	for (size_t r = 0; r < (size_t)B * NH * T; r++)
		for (int t2 = (int)(r % T) + 1; t2 < T; t2++)
			above += hatt[r * T + t2] != 0.0f;
	CU_ASSERT_EQUAL(above, 0);
	snprintf(what, sizeof(what), "attention forward out (hs %d, T %d)", C / NH, T);
	CU_ASSERT_EQUAL(cfx_close_elem(what, got, want, nout, 1e-5, 1e-5), 0);

	for (int size = 0; size < 3; size++) {
		size_t ns = attention_scratch(size, B, T, C, 0);
		float *gdqkv = cfx_up(dqkv0, nqkv), *scratch = cfx_up(NULL, ns);
		ops_cuda_attention_backward(cfx_ctx(), gdqkv, gdout, gqkv, gatt, B, T, C, NH, scratch,
					    ns);
		float *hdqkv = cfx_down(gdqkv, nqkv);
		snprintf(what, sizeof(what), "attention backward dqkv (hs %d, T %d, scratch %zu)",
			 C / NH, T, ns);
		CU_ASSERT_EQUAL(cfx_close_elem(what, hdqkv, wdqkv, nqkv, 5e-5, 1e-4), 0);
		free(hdqkv);
		cuda_ctx_free(gdqkv), cuda_ctx_free(scratch);
	}

	free(qkv), free(dout), free(dqkv0), free(want), free(watt), free(wdqkv), free(got);
	free(hatt);
	cuda_ctx_free(gqkv), cuda_ctx_free(gout), cuda_ctx_free(gatt), cuda_ctx_free(gdout);
}

/* n t values as fp32 */
static float *widen_bits(const uint16_t *x, size_t n, CudaDtype t)
{
	float *y = cfx_floats(n);
	(t == CDT_BF16 ? precision_bf16_to_f32_n : precision_f16_to_f32_n)(y, x, n);
	return y;
}

/* 16-bit: ops16_attention_* on the same rounded qkv, which rounds where the GPU stores (the
 * scores, exponentials and probabilities in att, the output; g = rn(dout), datt and dS in the
 * backward). Only the fp32 sums between those points reorder (hs, T terms: their difference,
 * ~T 2^-24 relative, is far below the 16-bit unit roundoff u), so most stored values agree bit
 * for bit; one that lies within that difference of a rounding boundary flips by one ulp (2u
 * relative) and passes it on: a flipped score moves its probability by p (1 - p) 2u |s| <= u |s|
 * / 2, a flipped probability or exponential by 2u, and the output, a convex combination of the
 * v, by the same relative amounts of max |v|. With |s| < 4 here: att and out 8u normwise.
 * Backward, a flipped datt or dS (2u of |datt|, which the subtraction of pdp can make larger
 * than |dS| itself) enters dq, dk as one of T terms and dv not at all: dqkv 16u normwise. A
 * missing or extra rounding is off by about u on every element, a wrong offset by O(1). */
static void attention16_case(CudaDtype t, int B, int T, int C, int NH, uint64_t seed)
{
	PrecisionType pt = t == CDT_BF16 ? PREC_BF16 : PREC_F16;
	double u = t == CDT_BF16 ? 0x1p-8 : 0x1p-11;
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
	float *qkv = cfx_random(nqkv, 1, seed), *dout = cfx_random(nout, 1, seed + 1);
	float *dqkv0 = cfx_random(nqkv, 1, seed + 2);
	uint16_t *qkv16 = cfx_round16(qkv, nqkv, t);
	uint16_t *wout16 = malloc(nout * 2), *watt16 = malloc(natt * 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(wout16);
	CU_ASSERT_PTR_NOT_NULL_FATAL(watt16);
	float *wdqkv = cfx_copy(dqkv0, nqkv);
	ops16_attention_forward(pt, wout16, watt16, qkv16, B, T, C, NH);
	ops16_attention_backward(pt, wdqkv, dout, qkv16, watt16, B, T, C, NH);
	float *want = widen_bits(wout16, nout, t), *watt = widen_bits(watt16, natt, t);

	void *gqkv = cfx_put(qkv16, nqkv * 2), *gout = cfx_put(NULL, nout * 2);
	void *gatt = cfx_put(NULL, natt * 2);
	float *gdout = cfx_up(dout, nout);
	ops16_cuda_attention_forward(cfx_ctx(), t, gout, gatt, gqkv, B, T, C, NH);
	uint16_t *hout16 = malloc(nout * 2), *hatt16 = malloc(natt * 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hout16);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hatt16);
	cuda_ctx_download(cfx_ctx(), hout16, gout, nout * 2);
	cuda_ctx_download(cfx_ctx(), hatt16, gatt, natt * 2);
	float *got = widen_bits(hout16, nout, t), *hatt = widen_bits(hatt16, natt, t);
	const char *name = t == CDT_BF16 ? "bf16" : "fp16";
	char what[112];
	snprintf(what, sizeof(what), "attention %s att (hs %d, T %d)", name, C / NH, T);
	CU_ASSERT_EQUAL(cfx_close_norm(what, hatt, watt, natt, 8 * u), 0);
	size_t above = 0;
	for (size_t r = 0; r < (size_t)B * NH * T; r++)
		for (int t2 = (int)(r % T) + 1; t2 < T; t2++)
			above += hatt16[r * T + t2] != 0;
	CU_ASSERT_EQUAL(above, 0);
	snprintf(what, sizeof(what), "attention %s out (hs %d, T %d)", name, C / NH, T);
	CU_ASSERT_EQUAL(cfx_close_norm(what, got, want, nout, 8 * u), 0);

	/* the backward from the reference's att, so that it is checked on its own */
	cuda_ctx_upload(cfx_ctx(), gatt, watt16, natt * 2);
	for (int size = 0; size < 3; size++) {
		size_t ns = attention_scratch(size, B, T, C, 1);
		float *gdqkv = cfx_up(dqkv0, nqkv), *scratch = cfx_up(NULL, ns);
		ops16_cuda_attention_backward(cfx_ctx(), t, gdqkv, gdout, gqkv, gatt, B, T, C, NH,
					      scratch, ns);
		float *hdqkv = cfx_down(gdqkv, nqkv);
		snprintf(what, sizeof(what), "attention %s dqkv (hs %d, T %d, scratch %zu)", name,
			 C / NH, T, ns);
		CU_ASSERT_EQUAL(cfx_close_norm(what, hdqkv, wdqkv, nqkv, 16 * u), 0);
		free(hdqkv);
		cuda_ctx_free(gdqkv), cuda_ctx_free(scratch);
	}

	free(qkv), free(dout), free(dqkv0), free(qkv16), free(wout16), free(watt16), free(wdqkv);
	free(want), free(watt), free(hout16), free(hatt16), free(got), free(hatt);
	cuda_ctx_free(gqkv), cuda_ctx_free(gout), cuda_ctx_free(gatt), cuda_ctx_free(gdout);
}

static void test_attention(void)
{
	attention_case(2, 37, 72, 3, 61);
	attention_case(1, 33, 144, 2, 71);
}

static void test_attention_16(void)
{
	for (int k = 0; k < 2; k++) {
		CudaDtype t = k ? CDT_F16 : CDT_BF16;
		attention16_case(t, 2, 37, 72, 3, 261);
		attention16_case(t, 1, 33, 144, 2, 271);
	}
}

/* ---- residual, embedding, loss ---- */

/* Residual: one rounding per element on both sides, so bit for bit. Embedding forward: copies and
 * one addition, bit for bit; dwpe adds the batch in the reference's order, bit for bit; dwte adds
 * rows that share a token by atomics in any order: each element is a sum of at most R + 1 terms
 * (R the most repeats of a token, its initial value the +1), so within 2 (R + 1) u of sum |terms|;
 * with 8 tokens over 2 x 37 positions R is about 15: atol 1e-5 on O(1) terms covers it. */
static void test_residual_embed(void)
{
	enum { B = 2, T = 37, C = 72, V = 8, MAXT = 40 };
	size_t n = (size_t)B * T * C;
	float *a = cfx_random(n, 1, 81), *b = cfx_random(n, 1, 82), *dy = cfx_random(n, 1, 83);
	float *want = cfx_floats(n);
	ops_residual_forward(want, a, b, n);
	float *ga = cfx_up(a, n), *gb = cfx_up(b, n), *gdy = cfx_up(dy, n), *gy = cfx_up(NULL, n);
	ops_cuda_residual_forward(cfx_ctx(), gy, ga, gb, n);
	float *got = cfx_down(gy, n);
	CU_ASSERT_EQUAL(cfx_same_bits("residual forward", got, want, n, 4), 0);
	float *wa = cfx_copy(a, n), *wb = cfx_copy(b, n);
	ops_residual_backward(wa, wb, dy, n);
	ops_cuda_residual_backward(cfx_ctx(), ga, gb, gdy, n);
	float *ha = cfx_down(ga, n), *hb = cfx_down(gb, n);
	CU_ASSERT_EQUAL(cfx_same_bits("residual backward da", ha, wa, n, 4), 0);
	CU_ASSERT_EQUAL(cfx_same_bits("residual backward db", hb, wb, n, 4), 0);

	int *tok = cfx_tokens((size_t)B * T, V, 84);
	float *wte = cfx_random((size_t)V * C, 1, 85), *wpe = cfx_random((size_t)MAXT * C, 1, 86);
	float *ew = cfx_floats(n);
	ops_embed_forward(ew, tok, wte, wpe, B, T, C);
	int *gtok = cfx_put(tok, (size_t)B * T * sizeof(int));
	float *gwte = cfx_up(wte, (size_t)V * C), *gwpe = cfx_up(wpe, (size_t)MAXT * C);
	ops_cuda_embed_forward(cfx_ctx(), gy, gtok, gwte, gwpe, B, T, C);
	float *eg = cfx_down(gy, n);
	CU_ASSERT_EQUAL(cfx_same_bits("embed forward", eg, ew, n, 4), 0);
	float *wdte = cfx_copy(wte, (size_t)V * C), *wdpe = cfx_copy(wpe, (size_t)MAXT * C);
	ops_embed_backward(wdte, wdpe, dy, tok, B, T, C);
	ops_cuda_embed_backward(cfx_ctx(), gwte, gwpe, gdy, gtok, B, T, C);
	float *hdte = cfx_down(gwte, (size_t)V * C), *hdpe = cfx_down(gwpe, (size_t)MAXT * C);
	CU_ASSERT_EQUAL(cfx_close_elem("embed backward dwte", hdte, wdte, (size_t)V * C, 1e-5, 0), 0);
	CU_ASSERT_EQUAL(cfx_same_bits("embed backward dwpe", hdpe, wdpe, (size_t)MAXT * C, 4), 0);

	free(a), free(b), free(dy), free(want), free(got), free(wa), free(wb), free(ha), free(hb);
	free(tok), free(wte), free(wpe), free(ew), free(eg), free(wdte), free(wdpe), free(hdte);
	free(hdpe);
	cuda_ctx_free(ga), cuda_ctx_free(gb), cuda_ctx_free(gdy), cuda_ctx_free(gy);
	cuda_ctx_free(gtok), cuda_ctx_free(gwte), cuda_ctx_free(gwpe);
}

/* Cross-entropy over V = 1000 (two strides of the 512-thread block, not a multiple of it), logits
 * of std 3 so some rows are peaked. The reference sums exp in double, the GPU in fp32 by a block
 * reduction (online: the sum rescaled as the max grows, a rounding more per new max): the sum is
 * within gamma_V ~ 6e-5 relative at the very worst (typically ~1e-6), and so each probability
 * (and expf's 2 ulp): rtol 1e-5 (plus atol 1e-9 for the smallest). The loss is log(sum) - (logit
 * - max) per row, so the same relative error on the sum is an absolute 1e-5 on the loss.
 * Backward reads the same probabilities, same formula: bit for bit. The device's rows are V + 3
 * apart, the padding NaN (a kernel reading it would spread NaN through its row's sum). */
static void test_crossentropy(void)
{
	enum { N = 23, V = 1000, LD = V + 3 };
	size_t n = (size_t)N * V;
	float *logits = cfx_random(n, 3, 91);
	int *tgt = cfx_tokens(N, V, 92);
	float *want = cfx_floats(n);
	float wloss = ops_crossentropy_forward(want, logits, tgt, N, V);
	float *gl = cfx_up_rows(logits, N, V, LD), *gp = cfx_up_rows(NULL, N, V, LD);
	int *gt = cfx_put(tgt, N * sizeof(int));
	float gloss = ops_cuda_crossentropy_forward(cfx_ctx(), gp, gl, gt, N, V, LD);
	float *got = cfx_down_rows(gp, N, V, LD);
	CU_ASSERT_EQUAL(cfx_close_elem("crossentropy probs", got, want, n, 1e-9, 1e-5), 0);
	CU_ASSERT(fabsf(gloss - wloss) <= 1e-5f);
	CU_ASSERT(padding_untouched(gp, N, V, LD));
	/* in place, probabilities only */
	CU_ASSERT(ops_cuda_crossentropy_forward(cfx_ctx(), gl, gl, NULL, N, V, LD) == 0.0f);
	float *inplace = cfx_down_rows(gl, N, V, LD);
	CU_ASSERT_EQUAL(cfx_close_elem("crossentropy in place", inplace, want, n, 1e-9, 1e-5), 0);

	/* backward from the reference's probabilities on both sides */
	float *wd = cfx_floats(n);
	ops_crossentropy_backward(wd, want, tgt, N, V, 1024.0f);
	float *gw = cfx_up_rows(want, N, V, LD);
	ops_cuda_crossentropy_backward(cfx_ctx(), gw, gw, gt, N, V, LD, 1024.0f);
	float *gd = cfx_down_rows(gw, N, V, LD);
	CU_ASSERT_EQUAL(cfx_same_bits("crossentropy backward", gd, wd, n, 4), 0);
	CU_ASSERT(padding_untouched(gw, N, V, LD));

	free(logits), free(tgt), free(want), free(got), free(inplace), free(wd), free(gd);
	cuda_ctx_free(gl), cuda_ctx_free(gp), cuda_ctx_free(gt), cuda_ctx_free(gw);
}

/* ---- optimizers, norms, casts, loss scaling ---- */

/* The optimizer kernels evaluate the reference's expressions in its order with no fused
 * multiply-adds (optim_cuda.cu), from the same host-rounded constants: bit for bit, over several
 * steps so the moments' history is covered. */
static void test_adamw_sgd(void)
{
	enum { n = 5003, STEPS = 3 };
	OpsAdamw h = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
	float *p = cfx_random(n, 1, 101), *m = cfx_floats(n), *v = cfx_floats(n);
	float *g = cfx_random(n, 1, 102);
	float *gp = cfx_up(p, n), *gm = cfx_up(NULL, n), *gv = cfx_up(NULL, n), *gg = cfx_up(g, n);
	for (long step = 1; step <= STEPS; step++) {
		ops_adamw_step(p, m, v, g, n, &h, step, 0.5f);
		optim_cuda_adamw_step(cfx_ctx(), gp, gm, gv, gg, n, &h, step, 0.5f);
	}
	float *hp = cfx_down(gp, n), *hm = cfx_down(gm, n), *hv = cfx_down(gv, n);
	CU_ASSERT_EQUAL(cfx_same_bits("adamw param", hp, p, n, 4), 0);
	CU_ASSERT_EQUAL(cfx_same_bits("adamw m", hm, m, n, 4), 0);
	CU_ASSERT_EQUAL(cfx_same_bits("adamw v", hv, v, n, 4), 0);
	free(hp), free(hm), free(hv);

	/* SGD with momentum (buf carried over steps), then without (buf NULL) */
	float *buf = cfx_floats(n), *gbuf = cfx_up(NULL, n);
	for (int step = 0; step < STEPS; step++) {
		ops_sgd_step(p, buf, g, n, 0.1f, 0.9f, 0.01f, 2.0f);
		optim_cuda_sgd_step(cfx_ctx(), gp, gbuf, gg, n, 0.1f, 0.9f, 0.01f, 2.0f);
	}
	ops_sgd_step(p, NULL, g, n, 0.1f, 0.0f, 0.0f, 1.0f);
	optim_cuda_sgd_step(cfx_ctx(), gp, NULL, gg, n, 0.1f, 0.0f, 0.0f, 1.0f);
	hp = cfx_down(gp, n);
	float *hb = cfx_down(gbuf, n);
	CU_ASSERT_EQUAL(cfx_same_bits("sgd param", hp, p, n, 4), 0);
	CU_ASSERT_EQUAL(cfx_same_bits("sgd momentum", hb, buf, n, 4), 0);
	free(hp), free(hb), free(buf), free(p), free(m), free(v), free(g);
	cuda_ctx_free(gp), cuda_ctx_free(gm), cuda_ctx_free(gv), cuda_ctx_free(gg);
	cuda_ctx_free(gbuf);
}

/* The fused mixed-precision AdamW against its composition from references: grads read from 16
 * bits exactly (precision_*_to_f32), ops_adamw_step on the fp32 masters, the result rounded by
 * precision_f32_to_* into the working copy. Bit for bit: the pieces are. */
static void test_adamw_mixed(void)
{
	enum { n = 4099 };
	OpsAdamw h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
	CudaDtype types[2] = {CDT_BF16, CDT_F16};
	for (int k = 0; k < 2; k++) {
		int bf = types[k] == CDT_BF16;
		float *p = cfx_random(n, 1, 111 + k), *g = cfx_random(n, 1e-2f, 113 + k);
		float *m = cfx_floats(n), *v = cfx_floats(n), *g32 = cfx_floats(n);
		uint16_t *g16 = malloc(n * 2), *lp = malloc(n * 2), *glp = malloc(n * 2);
		CU_ASSERT_FATAL(g16 && lp && glp);
		(bf ? precision_f32_to_bf16_n : precision_f32_to_f16_n)(g16, g, n);
		(bf ? precision_bf16_to_f32_n : precision_f16_to_f32_n)(g32, g16, n);
		float *gp = cfx_up(p, n), *gm = cfx_up(NULL, n), *gv = cfx_up(NULL, n);
		void *gg = cfx_put(g16, n * 2), *gl = cfx_put(NULL, n * 2);
		for (long step = 1; step <= 2; step++) {
			ops_adamw_step(p, m, v, g32, n, &h, step, 1.0f / 128);
			optim_cuda_adamw_mixed(cfx_ctx(), gp, gm, gv, gg, types[k], gl, types[k], n, &h,
					       step, 1.0f / 128);
		}
		(bf ? precision_f32_to_bf16_n : precision_f32_to_f16_n)(lp, p, n);
		float *hp = cfx_down(gp, n), *hm = cfx_down(gm, n), *hv = cfx_down(gv, n);
		cuda_ctx_download(cfx_ctx(), glp, gl, n * 2);
		CU_ASSERT_EQUAL(cfx_same_bits(bf ? "adamw bf16 master" : "adamw fp16 master", hp, p, n, 4),
				0);
		CU_ASSERT_EQUAL(cfx_same_bits("adamw mixed m", hm, m, n, 4), 0);
		CU_ASSERT_EQUAL(cfx_same_bits("adamw mixed v", hv, v, n, 4), 0);
		CU_ASSERT_EQUAL(cfx_same_bits(bf ? "adamw bf16 params" : "adamw fp16 params", glp, lp, n,
					  2),
				0);
		free(p), free(g), free(m), free(v), free(g32), free(g16), free(lp), free(glp);
		free(hp), free(hm), free(hv);
		cuda_ctx_free(gp), cuda_ctx_free(gm), cuda_ctx_free(gv), cuda_ctx_free(gg);
		cuda_ctx_free(gl);
	}
}

/* Sum of squares: double on both sides, summed in different orders: n terms of double rounding,
 * far below 1e-12 relative. The 16-bit form reads the values exactly, so it equals the reference
 * on the converted array to the same precision. */
static void test_sum_squares(void)
{
	enum { n = 300007 };
	float *x = cfx_random(n, 3, 121);
	float *gx = cfx_up(x, n);
	double want = ops_sum_squares(x, n), got = optim_cuda_sum_squares(cfx_ctx(), gx, CDT_F32, n);
	CU_ASSERT(fabs(got - want) <= 1e-12 * want);
	uint16_t *x16 = malloc(n * 2);
	float *x32 = cfx_floats(n);
	CU_ASSERT_PTR_NOT_NULL_FATAL(x16);
	precision_f32_to_bf16_n(x16, x, n);
	precision_bf16_to_f32_n(x32, x16, n);
	void *g16 = cfx_put(x16, n * 2);
	want = ops_sum_squares(x32, n);
	got = optim_cuda_sum_squares(cfx_ctx(), g16, CDT_BF16, n);
	CU_ASSERT(fabs(got - want) <= 1e-12 * want);
	CU_ASSERT(optim_cuda_sum_squares(cfx_ctx(), gx, CDT_F32, 0) == 0.0);
	free(x), free(x16), free(x32);
	cuda_ctx_free(gx), cuda_ctx_free(g16);
}

/* Values to convert: random normals over many scales, every special (zeros, subnormals of both
 * formats, the largest finite values and their rounding boundaries, Inf, NaNs with payloads only
 * in the low bits). */
static float *cast_inputs(size_t *count)
{
	enum { RANDOM = 60000 };
	static const uint32_t special[] = {
		0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x7F7FFFFFu,
		0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u,
		0x7F80FFFFu, 0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u,
		0x33000001u, 0x32FFFFFFu, 0x387FC000u, 0x3F808000u, 0x3F818000u, 0x3F807FFFu,
		0x7F7F8000u, 0x38800000u, 0x387FE000u, 0x337FFFFFu, 0xB3800000u};
	size_t ns = sizeof(special) / sizeof(special[0]);
	float *x = cfx_floats(RANDOM + ns);
	PxRng r;
	rng_init(&r, 131, 0);
	for (size_t i = 0; i < RANDOM; i++)
		x[i] = (float)(rng_normal(&r) * ldexp(1.0, (int)(rng_next_u64(&r) % 80) - 40));
	for (size_t i = 0; i < ns; i++)
		memcpy(x + RANDOM + i, &special[i], 4);
	*count = RANDOM + ns;
	return x;
}

/* On the GPU, every pair of types against precision.c, bit for bit. */
static void test_casts(void)
{
	size_t n;
	float *x = cast_inputs(&n);
	uint16_t *want16 = malloc(n * 2), *got16 = malloc(n * 2);
	float *want32 = cfx_floats(n), *got32 = cfx_floats(n);
	CU_ASSERT_FATAL(want16 && got16);
	float *gx = cfx_up(x, n), *gy32 = cfx_up(NULL, n);
	void *g16 = cfx_put(NULL, n * 2);
	for (int bf = 0; bf < 2; bf++) {
		CudaDtype t = bf ? CDT_BF16 : CDT_F16;
		(bf ? precision_f32_to_bf16_n : precision_f32_to_f16_n)(want16, x, n);
		cast_cuda(cfx_ctx(), g16, t, gx, CDT_F32, n);
		cuda_ctx_download(cfx_ctx(), got16, g16, n * 2);
		CU_ASSERT_EQUAL(cfx_same_bits(bf ? "cast f32 to bf16" : "cast f32 to f16", got16, want16,
					  n, 2),
				0);
		(bf ? precision_bf16_to_f32_n : precision_f16_to_f32_n)(want32, want16, n);
		cast_cuda(cfx_ctx(), gy32, CDT_F32, g16, t, n);
		cuda_ctx_download(cfx_ctx(), got32, gy32, n * 4);
		CU_ASSERT_EQUAL(cfx_same_bits(bf ? "cast bf16 to f32" : "cast f16 to f32", got32, want32,
					  n, 4),
				0);
	}
	/* 16 bits to 16 bits goes through fp32: bf16 -> fp16 equals the two reference steps */
	precision_f32_to_bf16_n(want16, x, n);
	cuda_ctx_upload(cfx_ctx(), g16, want16, n * 2);
	void *g16b = cfx_put(NULL, n * 2);
	cast_cuda(cfx_ctx(), g16b, CDT_F16, g16, CDT_BF16, n);
	cuda_ctx_download(cfx_ctx(), got16, g16b, n * 2);
	precision_bf16_to_f32_n(want32, want16, n);
	precision_f32_to_f16_n(want16, want32, n);
	CU_ASSERT_EQUAL(cfx_same_bits("cast bf16 to f16", got16, want16, n, 2), 0);
	/* a type to itself is a copy (cudaMemcpyAsync): the bits kept */
	cast_cuda(cfx_ctx(), g16, CDT_F16, g16b, CDT_F16, n);
	cuda_ctx_download(cfx_ctx(), got16, g16, n * 2);
	CU_ASSERT_EQUAL(cfx_same_bits("cast f16 to f16", got16, want16, n, 2), 0);
	cast_cuda(cfx_ctx(), gy32, CDT_F32, gx, CDT_F32, n);
	cuda_ctx_download(cfx_ctx(), got32, gy32, n * 4);
	CU_ASSERT_EQUAL(cfx_same_bits("cast f32 to f32", got32, x, n, 4), 0);
	cuda_ctx_free(g16b);
	free(x), free(want16), free(got16), free(want32), free(got32);
	cuda_ctx_free(gx), cuda_ctx_free(gy32), cuda_ctx_free(g16);
}

/* Overflow check over each type, with the one bad value first, last, or absent; unscale multiplies
 * exactly as the host does (one rounding) and reports a non-finite value present before scaling. */
static void test_loss_scaling(void)
{
	enum { n = 70001 };
	float *x = cfx_random(n, 1000, 141);
	float *gx = cfx_up(x, n);
	CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), gx, CDT_F32, n), 0);
	uint16_t *h16 = malloc(n * 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(h16);
	void *g16 = cfx_put(NULL, n * 2);
	for (int bf = 0; bf < 2; bf++) {
		CudaDtype t = bf ? CDT_BF16 : CDT_F16;
		/* x up to ~4000: finite in both 16-bit formats */
		(bf ? precision_f32_to_bf16_n : precision_f32_to_f16_n)(h16, x, n);
		cuda_ctx_upload(cfx_ctx(), g16, h16, n * 2);
		CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), g16, t, n), 0);
		uint16_t bad = bf ? 0xFF80u : 0x7E01u; /* -Inf bf16, a NaN fp16 */
		cuda_ctx_upload(cfx_ctx(), (uint16_t *)g16 + n - 1, &bad, 2);
		CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), g16, t, n), 1);
	}
	float inf = INFINITY, nan_ = NAN;
	cuda_ctx_upload(cfx_ctx(), gx, &inf, 4);
	CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), gx, CDT_F32, n), 1);
	CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), gx + 1, CDT_F32, n - 1), 0);

	/* unscale: clean buffer, then a NaN in the middle */
	cuda_ctx_upload(cfx_ctx(), gx, x, n * 4);
	float inv = 1.0f / 65536.0f * 3.0f;
	float *want = cfx_floats(n);
	for (size_t i = 0; i < n; i++)
		want[i] = x[i] * inv;
	CU_ASSERT_EQUAL(cast_cuda_unscale(cfx_ctx(), gx, n, inv), 0);
	float *got = cfx_down(gx, n);
	CU_ASSERT_EQUAL(cfx_same_bits("unscale", got, want, n, 4), 0);
	cuda_ctx_upload(cfx_ctx(), gx + n / 2, &nan_, 4);
	CU_ASSERT_EQUAL(cast_cuda_unscale(cfx_ctx(), gx, n, inv), 1);
	/* the check is on the values as they come: a finite one that the scaling overflows is not
	 * flagged (with a loss scale, inv_scale < 1 and that cannot happen) */
	float big = 3e38f;
	cuda_ctx_upload(cfx_ctx(), gx + n / 2, &big, 4);
	CU_ASSERT_EQUAL(cast_cuda_unscale(cfx_ctx(), gx, n, 4.0f), 0); /* becomes Inf after scaling */
	CU_ASSERT_EQUAL(cast_cuda_has_nonfinite(cfx_ctx(), gx, CDT_F32, n), 1);
	free(x), free(h16), free(want), free(got);
	cuda_ctx_free(gx), cuda_ctx_free(g16);
}

/* ---- tests that need no GPU ---- */

/* The device conversion code, compiled for the host, against precision.c: every 16-bit pattern
 * widened, and narrowed from the cast inputs plus, for each 16-bit value, the fp32 values at and
 * next to the midpoints with its neighbours (where rounding decides). Bit for bit. */
static void test_cast_host_build(void)
{
	size_t bad = 0;
	for (uint32_t h = 0; h <= 0xFFFFu; h++) {
		float a = cast_cuda_host_bf16_to_f32((uint16_t)h), b = precision_bf16_to_f32((uint16_t)h);
		float c = cast_cuda_host_f16_to_f32((uint16_t)h), d = precision_f16_to_f32((uint16_t)h);
		bad += memcmp(&a, &b, 4) != 0;
		bad += memcmp(&c, &d, 4) != 0;
	}
	CU_ASSERT_EQUAL(bad, 0);
	size_t n;
	float *x = cast_inputs(&n);
	for (size_t i = 0; i < n; i++) {
		bad += cast_cuda_host_f32_to_bf16(x[i]) != precision_f32_to_bf16(x[i]);
		bad += cast_cuda_host_f32_to_f16(x[i]) != precision_f32_to_f16(x[i]);
	}
	free(x);
	CU_ASSERT_EQUAL(bad, 0);
	for (uint32_t h = 0; h < 0xFFFFu; h++) {
		/* bf16: h's fp32 pattern with each low half that matters */
		static const uint32_t lows[] = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu};
		for (size_t k = 0; k < sizeof(lows) / sizeof(lows[0]); k++) {
			uint32_t u = (h << 16) | lows[k];
			float f;
			memcpy(&f, &u, 4);
			bad += cast_cuda_host_f32_to_bf16(f) != precision_f32_to_bf16(f);
		}
		/* fp16: the midpoint between h and h + 1 (exact in fp32) and its neighbours */
		if ((h & 0x7C00u) == 0x7C00u || h == 0x7FFFu)
			continue;
		double lo = precision_f16_to_f32((uint16_t)h);
		double hi = precision_f16_to_f32((uint16_t)(h + 1));
		float mid = (float)((lo + hi) / 2);
		float probes[3] = {mid, nextafterf(mid, INFINITY), nextafterf(mid, -INFINITY)};
		for (int k = 0; k < 3; k++)
			bad += cast_cuda_host_f32_to_f16(probes[k]) != precision_f32_to_f16(probes[k]);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

/* Argument checks that need no device: the GEMM type table, and what availability says. */
static void test_checks_without_gpu(void)
{
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_F32, CDT_F32), 0);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_BF16, CDT_F32), 0);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_BF16, CDT_BF16), 0);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_F16, CDT_F16), 0);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_F32, CDT_BF16), -1);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_BF16, CDT_F16), -1);
	CU_ASSERT_EQUAL(gemm_cuda_check_types(CDT_F16, CDT_BF16), -1);
	CU_ASSERT_EQUAL(gemm_cuda_check_types((CudaDtype)7, CDT_F32), -1);
	char reason[256] = "";
	int avail = cuda_ctx_available(reason, sizeof(reason));
	if (!avail) /* the reason names the call and CUDA's own message */
		CU_ASSERT(strncmp(reason, "cudaGetDeviceCount: ", 20) == 0 && strlen(reason) > 20);
	CU_ASSERT_EQUAL(cuda_ctx_available(NULL, 0), avail); /* repeatable, no state */
	CU_ASSERT(CUDA_CTX_WORKSPACE_BYTES == 32u << 20);
}

/* 1 when this process has mapped a file whose path contains name (/proc/self/maps) */
static int mapped(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, name) != NULL;
	if (f)
		fclose(f);
	return found;
}

/* cuBLAS is opened on first use, not at start (libcublasLt's initialisers cost each process
 * ~0.35 s): where no device is present nothing has opened it before this test, and asking a status
 * name opens it and resolves its entry points. The names are cuBLAS's documented cublasStatus_t
 * values (cuBLAS Library User Guide, "cublasStatus_t": SUCCESS 0, NOT_INITIALIZED 1,
 * INVALID_VALUE 7). */
static void test_blas_loads_on_use(void)
{
	if (!cuda_ctx_available(NULL, 0)) /* else a GPU test may have opened it already */
		CU_ASSERT_FALSE(mapped("libcublas"));
	CU_ASSERT_STRING_EQUAL(cuda_ctx_blas_status_name(0), "CUBLAS_STATUS_SUCCESS");
	CU_ASSERT_STRING_EQUAL(cuda_ctx_blas_status_name(1), "CUBLAS_STATUS_NOT_INITIALIZED");
	CU_ASSERT_STRING_EQUAL(cuda_ctx_blas_status_name(7), "CUBLAS_STATUS_INVALID_VALUE");
	CU_ASSERT_TRUE(mapped("libcublasLt"));
}

/* A fatal check's message starts with cuda_set_who's label, so a multi-rank log says which rank
 * failed. The shape check of gemm_cuda_batched fires before any CUDA call, so a child process
 * can take the fatal exit without a device; its stderr must read "rank 3 of 8: <file>:<line>:
 * gemm_cuda_batched: shape 0 x 4 x 4, ..." and it must exit 1. */
static void test_fatal_names_rank(void)
{
	int fd[2];
	CU_ASSERT_FATAL(pipe(fd) == 0);
	fflush(NULL);
	pid_t pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], 2);
		close(fd[0]);
		cuda_set_who("rank 3 of 8");
		GemmBatch m = {NULL, 4, 16, 0};
		gemm_cuda_batched(NULL, CDT_F32, CDT_F32, 0, 4, 4, 1.0f, m, m, 0.0f, m, 1);
		_exit(0); /* not reached when the check works */
	}
	close(fd[1]);
	char msg[512] = "";
	size_t got = 0;
	ssize_t r;
	while (got + 1 < sizeof(msg) && (r = read(fd[0], msg + got, sizeof(msg) - 1 - got)) > 0)
		got += (size_t)r;
	msg[got] = '\0';
	close(fd[0]);
	int status = 0;
	waitpid(pid, &status, 0);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 1);
	CU_ASSERT(strncmp(msg, "rank 3 of 8: ", 13) == 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "gemm_cuda_batched: shape 0 x 4 x 4"));
	cuda_set_who(NULL); /* this process: no label */
}

static const PxTestCase GPU_TESTS[] = {
	{"context and device memory", test_ctx_memory},
	{"gemm fp32, every transpose", test_gemm_f32},
	{"gemm bf16 in, fp32 accumulate", test_gemm_bf16},
	{"gemm fp16 in, fp32 accumulate", test_gemm_f16},
	{"matmul forward and backward", test_matmul},
	{"matmul bf16 / fp16 in, fp32 accumulate", test_matmul_16},
	{"lm head forward and backward", test_lm_head},
	{"column sums in row blocks and column chunks", test_column_sums},
	{"layernorm forward and backward", test_layernorm},
	{"gelu forward and backward", test_gelu},
	{"attention forward and backward", test_attention},
	{"attention bf16 / fp16 forward and backward", test_attention_16},
	{"residual and embedding", test_residual_embed},
	{"cross-entropy forward and backward", test_crossentropy},
	{"adamw and sgd bit for bit", test_adamw_sgd},
	{"mixed-precision adamw bit for bit", test_adamw_mixed},
	{"sum of squares", test_sum_squares},
	{"casts bit for bit", test_casts},
	{"loss scaling: overflow check and unscale", test_loss_scaling},
};

static const PxTestCase CPU_TESTS[] = {
	{"device casts (host build) vs precision.c", test_cast_host_build},
	{"checks without a GPU", test_checks_without_gpu},
	{"a fatal check names the rank", test_fatal_names_rank},
	{"cuBLAS opens on first use", test_blas_loads_on_use},
};

int test_kernels_cuda_register(void)
{
	return cfx_register("kernels_cuda", "test_kernels_cuda", CPU_TESTS,
			    (int)(sizeof(CPU_TESTS) / sizeof(CPU_TESTS[0])), GPU_TESTS,
			    (int)(sizeof(GPU_TESTS) / sizeof(GPU_TESTS[0])));
}

#else /* no CUDA at build time */

int test_kernels_cuda_register(void)
{
	printf("test_kernels_cuda: skipped: built without CUDA (no nvcc under CUDA_HOME); no tests "
	       "registered\n");
	return 0;
}

#endif
