/* Kernels: the plain-C reference compute. 16-bit conversions against bit patterns worked by hand;
 * every op's backward against central finite differences of its own forward; ops on inputs whose
 * exact outputs are derived in the comments; the tiny GPT's layout against engine/model.c and
 * engine/activ.c, its gradients against finite differences, and a short training run. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/activ.h"
#include "../engine/model.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/ops_cpu.h"
#include "fixtures.h"
#include "../kernels/precision.h"
#include "../kernels/rng.h"
#include "suites.h"

/* ---- helpers ---- */

static float *alloc_floats(size_t n)
{
	float *x = calloc(n ? n : 1, sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(x);
	return x;
}

static float *random_floats(size_t n, float std, uint64_t seed)
{
	float *x = alloc_floats(n);
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
	return x;
}

static double dot_double(const float *a, const float *b, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/* Finite differences. The ops compute in float, so the probe loss (a double sum) carries rounding
 * noise of order 1e-7 relative; a central difference with step h = 1e-2 turns that into about
 * 1e-5 absolute, while its truncation error, h^2 f'''/6, is about 1e-5 relative for these smooth
 * functions of O(1) inputs. Tolerances of 2e-4 absolute plus 2e-3 relative sit about ten times
 * above the worst miss measured (2e-5, on the whole model) and far below what a wrong or missing
 * term costs: an O(1) fraction of gradients that are mostly 1e-3 to 1e-1. */
#define FD_STEP 1e-2f
#define FD_ATOL 2e-4
#define FD_RTOL 2e-3

typedef double (*ProbeFn)(void *ctx);

/* d probe / d x[i] by a central difference; the step actually taken is the float difference. */
static double fd_grad(float *x, size_t i, float step, ProbeFn probe, void *ctx)
{
	float old = x[i], up = old + step, down = old - step;
	x[i] = up;
	double lp = probe(ctx);
	x[i] = down;
	double lm = probe(ctx);
	x[i] = old;
	return (lp - lm) / ((double)up - (double)down);
}

static int grad_close(double analytic, double numeric, double atol, double rtol)
{
	double scale = fabs(analytic) > fabs(numeric) ? fabs(analytic) : fabs(numeric);
	return fabs(analytic - numeric) <= atol + rtol * scale;
}

/* Compare the analytic gradient g of every element of x with finite differences; count misses. */
static int check_all(const char *what, float *x, const float *g, size_t n, ProbeFn probe, void *ctx)
{
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		double num = fd_grad(x, i, FD_STEP, probe, ctx);
		if (!grad_close(g[i], num, FD_ATOL, FD_RTOL)) {
			if (bad < 5)
				fprintf(stderr, "\n%s[%zu]: analytic %.6g, numeric %.6g", what, i,
					(double)g[i], num);
			bad++;
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	return bad;
}

/* ---- precision ---- */

/* bf16 is the top half of an fp32, rounded to nearest even on the dropped 16 bits. */
static void test_bf16_patterns(void)
{
	CU_ASSERT_EQUAL(precision_f32_to_bf16(1.0f), 0x3F80);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(-2.0f), 0xC000);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(0.0f), 0x0000);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(-0.0f), 0x8000);
	/* 1/3 = 0x3EAAAAAB: dropped half 0xAAAB > 0x8000 rounds up to 0x3EAB */
	CU_ASSERT_EQUAL(precision_f32_to_bf16(1.0f / 3.0f), 0x3EAB);
	/* ties: 1 + 2^-8 = 0x3F808000 sits halfway between 0x3F80 and 0x3F81, goes to the even
	 * 0x3F80; 1 + 3 * 2^-8 = 0x3F818000 halfway between 0x3F81 and 0x3F82 goes to 0x3F82 */
	CU_ASSERT_EQUAL(precision_f32_to_bf16(1.00390625f), 0x3F80);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(1.01171875f), 0x3F82);
	/* just above the tie rounds up: 1 + 2^-8 + 2^-23 */
	CU_ASSERT_EQUAL(precision_f32_to_bf16(1.00390625f + 0x1p-23f), 0x3F81);
	/* FLT_MAX (0x7F7FFFFF) is more than half an ulp above bf16's largest finite, 0x7F7F: Inf */
	CU_ASSERT_EQUAL(precision_f32_to_bf16(3.4028234663852886e38f), 0x7F80);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(INFINITY), 0x7F80);
	CU_ASSERT_EQUAL(precision_f32_to_bf16(-INFINITY), 0xFF80);
	/* a NaN whose payload sits only in the low bits must not become Inf */
	uint32_t snan_bits = 0x7F800001u;
	float snan;
	memcpy(&snan, &snan_bits, sizeof(snan));
	uint16_t h = precision_f32_to_bf16(snan);
	CU_ASSERT((h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0);
	CU_ASSERT(isnan(precision_bf16_to_f32(precision_f32_to_bf16(NAN))));
	/* subnormal fp32 keeps bf16's subnormals: 2^-133 = 0x00010000 -> 0x0001 */
	CU_ASSERT_EQUAL(precision_f32_to_bf16(0x1p-133f), 0x0001);
	CU_ASSERT_EQUAL(precision_bf16_to_f32(0x3F80), 1.0f);
	CU_ASSERT_EQUAL(precision_bf16_to_f32(0x4049), 3.140625f); /* 1.5703125 * 2 */
}

/* fp16: 1 sign, 5 exponent bits (bias 15), 10 mantissa bits; largest 65504, smallest normal 2^-14,
 * smallest subnormal 2^-24. */
static void test_f16_patterns(void)
{
	CU_ASSERT_EQUAL(precision_f32_to_f16(1.0f), 0x3C00);
	CU_ASSERT_EQUAL(precision_f32_to_f16(-2.0f), 0xC000);
	CU_ASSERT_EQUAL(precision_f32_to_f16(0.5f), 0x3800);
	CU_ASSERT_EQUAL(precision_f32_to_f16(-0.0f), 0x8000);
	CU_ASSERT_EQUAL(precision_f32_to_f16(65504.0f), 0x7BFF);
	/* 1/3 = 1.0101...b x 2^-2: mantissa 0x155 then 0101... (below half) -> 0x3555 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(1.0f / 3.0f), 0x3555);
	/* ties: 1 + 2^-11 halfway between 0x3C00 and 0x3C01 -> even 0x3C00; 1 + 3 * 2^-11 -> 0x3C02 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);
	CU_ASSERT_EQUAL(precision_f32_to_f16(1.0f + 0x3p-11f), 0x3C02);
	CU_ASSERT_EQUAL(precision_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
	/* overflow: 65519 rounds down to 65504; 65520 is the tie with 65536 and goes to the even
	 * side, which is past the largest: Inf; as do larger values and fp32 Inf */
	CU_ASSERT_EQUAL(precision_f32_to_f16(65519.0f), 0x7BFF);
	CU_ASSERT_EQUAL(precision_f32_to_f16(65520.0f), 0x7C00);
	CU_ASSERT_EQUAL(precision_f32_to_f16(1e6f), 0x7C00);
	CU_ASSERT_EQUAL(precision_f32_to_f16(-1e6f), 0xFC00);
	CU_ASSERT_EQUAL(precision_f32_to_f16(INFINITY), 0x7C00);
	/* normals and subnormals at the bottom of the range */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x1p-14f), 0x0400);
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x1p-24f), 0x0001);
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x3FFp-24f), 0x03FF);
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x1p-25f), 0x0000);   /* tie 0 / 2^-24 -> even 0 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x3p-26f), 0x0001);   /* 0.75 units -> 1 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x3p-25f), 0x0002);   /* 1.5 units: tie -> even 2 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x5p-25f), 0x0002);   /* 2.5 units: tie -> even 2 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x7FFp-25f), 0x0400); /* 1023.5 units -> 2^-14 */
	CU_ASSERT_EQUAL(precision_f32_to_f16(-0x1p-30f), 0x8000);  /* underflow keeps the sign */
	CU_ASSERT_EQUAL(precision_f32_to_f16(0x1p-140f), 0x0000);  /* an fp32 subnormal */
	/* NaN stays NaN, even with its payload only in bits fp16 drops */
	uint32_t snan_bits = 0xFF800001u;
	float snan;
	memcpy(&snan, &snan_bits, sizeof(snan));
	uint16_t h = precision_f32_to_f16(snan);
	CU_ASSERT((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0 && (h & 0x8000));
	CU_ASSERT(isnan(precision_f16_to_f32(precision_f32_to_f16(NAN))));
	/* back to fp32 */
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x3C00), 1.0f);
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x7BFF), 65504.0f);
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x0001), 0x1p-24f);
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x03FF), 0x3FFp-24f);
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x8400), -0x1p-14f);
	CU_ASSERT_EQUAL(precision_f16_to_f32(0x3555), 0x555p-12f);
	CU_ASSERT(isinf(precision_f16_to_f32(0xFC00)) && precision_f16_to_f32(0xFC00) < 0);
	CU_ASSERT(isnan(precision_f16_to_f32(0x7E00)));
	CU_ASSERT(signbit(precision_f16_to_f32(0x8000)));
}

/* Every 16-bit pattern is exactly an fp32 value, so 16 -> 32 -> 16 is the identity for all 65536
 * (NaNs stay NaN); and the midpoint between two neighbouring fp16 values goes to the even one. */
static void test_round_trips(void)
{
	int bad_bf = 0, bad_h = 0, bad_mid = 0;
	for (uint32_t u = 0; u <= 0xFFFF; u++) {
		uint16_t b = (uint16_t)u;
		float fb = precision_bf16_to_f32(b), fh = precision_f16_to_f32(b);
		if (isnan(fb) ? !isnan(precision_bf16_to_f32(precision_f32_to_bf16(fb)))
			      : precision_f32_to_bf16(fb) != b)
			bad_bf++;
		if (isnan(fh) ? !isnan(precision_f16_to_f32(precision_f32_to_f16(fh)))
			      : precision_f32_to_f16(fh) != b)
			bad_h++;
		/* positive finite neighbours below the largest: the midpoint is exact in fp32 */
		if (b < 0x7BFF) {
			float mid = (float)(((double)fh + precision_f16_to_f32((uint16_t)(b + 1))) / 2);
			uint16_t even = (b & 1) ? (uint16_t)(b + 1) : b;
			if (precision_f32_to_f16(mid) != even)
				bad_mid++;
		}
	}
	CU_ASSERT_EQUAL(bad_bf, 0);
	CU_ASSERT_EQUAL(bad_h, 0);
	CU_ASSERT_EQUAL(bad_mid, 0);
}

static void test_bulk_and_nonfinite(void)
{
	float src[5] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 1.0f / 3.0f}, back[5];
	uint16_t h[5];
	precision_f32_to_f16_n(h, src, 5);
	CU_ASSERT(h[0] == 0x3C00 && h[1] == 0xC000 && h[2] == 0x7BFF && h[3] == 0x0001 &&
		  h[4] == 0x3555);
	precision_f16_to_f32_n(back, h, 5);
	CU_ASSERT(back[0] == 1.0f && back[2] == 65504.0f && back[3] == 0x1p-24f);
	precision_f32_to_bf16_n(h, src, 5);
	CU_ASSERT(h[0] == 0x3F80 && h[1] == 0xC000 && h[4] == 0x3EAB);
	precision_bf16_to_f32_n(back, h, 5);
	CU_ASSERT(back[0] == 1.0f && back[1] == -2.0f);

	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 5), 0);
	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 0), 0);
	src[3] = INFINITY;
	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 5), 1);
	src[3] = -INFINITY;
	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 5), 1);
	src[3] = NAN;
	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 5), 1);
	CU_ASSERT_EQUAL(precision_has_nonfinite(src, 3), 0);
	/* the fp16 overflow a loss scaler watches for: 70000 is finite in fp32, Inf once in fp16 */
	float big = precision_f16_to_f32(precision_f32_to_f16(70000.0f));
	CU_ASSERT_EQUAL(precision_has_nonfinite(&big, 1), 1);
}

/* ---- rng ---- */

/* splitmix64 from seed 0: the first outputs of the reference implementation (Vigna's
 * splitmix64.c, also xoshiro's recommended seeder): 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
 * 0x06C45D188009454F. */
static void test_rng(void)
{
	PxRng r;
	rng_init(&r, 0, 0);
	CU_ASSERT_EQUAL(rng_next_u64(&r), 0xE220A8397B1DCDAFull);
	CU_ASSERT_EQUAL(rng_next_u64(&r), 0x6E789E6AA1B965F4ull);
	CU_ASSERT_EQUAL(rng_next_u64(&r), 0x06C45D188009454Full);

	/* normal samples: mean 0 and variance 1 within 5 standard errors for n = 40000
	 * (s.e. of the mean 1/200, of the variance sqrt(2/n) = 0.0071) */
	int n = 40000;
	double sum = 0, sq = 0;
	rng_init(&r, 42, 7);
	for (int i = 0; i < n; i++) {
		double z = rng_normal(&r);
		sum += z;
		sq += z * z;
	}
	double mean = sum / n, var = sq / n - mean * mean;
	CU_ASSERT(fabs(mean) < 0.025);
	CU_ASSERT(fabs(var - 1.0) < 0.036);

	/* streams differ; the same stream repeats */
	PxRng a, b;
	rng_init(&a, 5, 1);
	rng_init(&b, 5, 2);
	CU_ASSERT_NOT_EQUAL(rng_next_u64(&a), rng_next_u64(&b));
	rng_init(&b, 5, 1);
	rng_init(&a, 5, 1);
	CU_ASSERT_EQUAL(rng_next_u64(&a), rng_next_u64(&b));
}

/* ---- ops: exact cases ---- */

/* x = [1, 2, 3, 4]: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, so
 * xhat = [-1.5, -0.5, 0.5, 1.5] / sqrt(1.25 + 1e-5) = [-1.341635, -0.447212, 0.447212, 1.341635]
 * (sqrt(1.25001) = 1.1180384); with w = [1, 1, 2, 0.5], b = [0, 1, 0, -1]:
 * y = [-1.341635, 0.552788, 0.894423, -0.329182]. */
static void test_layernorm_by_hand(void)
{
	float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, b[4] = {0, 1, 0, -1}, y[4], mean, rstd;
	const double want[4] = {-1.341635, 0.552788, 0.894423, -0.329182};
	ops_layernorm_forward(y, &mean, &rstd, x, w, b, 1, 4);
	CU_ASSERT_DOUBLE_EQUAL(mean, 2.5, 1e-7);
	CU_ASSERT_DOUBLE_EQUAL(rstd, 0.894423, 1e-6);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_DOUBLE_EQUAL(y[i], want[i], 2e-6);
}

/* tanh-GELU evaluated in double from its formula, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
 * gelu(1) = 0.8411919906 (the value PyTorch's gelu(approximate='tanh') prints), gelu(-1) =
 * -0.1588080094, gelu(2) = 1.9545976941, gelu(0.5) = 0.3457140098, gelu(-3) = -0.0036373921. */
static void test_gelu_values(void)
{
	float x[6] = {0, 1, -1, 2, 0.5f, -3}, y[6];
	const double want[6] = {0, 0.8411919906, -0.1588080094, 1.9545976941, 0.3457140098,
				-0.0036373921};
	ops_gelu_forward(y, x, 6);
	for (int i = 0; i < 6; i++)
		CU_ASSERT_DOUBLE_EQUAL(y[i], want[i], 2e-7 * (1 + fabs(want[i])));
}

/* Two heads of size 1 (C = 2, NH = 2, scale 1/sqrt(1) = 1), T = 2.
 * Head 0 (column 0): k = [0, 1], q[1] = ln 3, so token 1's scores are [0, ln 3] and its softmax
 * [1/4, 3/4]; with v = [2, 6] its output is 2/4 + 18/4 = 5. Head 1 (column 1): q = 0, scores 0, a
 * uniform [1/2, 1/2] over v = [10, 20]: 15. Token 0 sees only itself: outputs [2, 10]. */
static void test_attention_by_hand(void)
{
	/* per token [q0 q1 | k0 k1 | v0 v1] */
	float qkv[12] = {0, 0, 0, 0, 2, 10, logf(3.0f), 0, 1, 0, 6, 20};
	float out[4], att[2 * 2 * 2];
	ops_attention_forward(out, att, qkv, 1, 2, 2, 2);
	CU_ASSERT_DOUBLE_EQUAL(out[0], 2, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(out[1], 10, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(out[2], 5, 1e-5);
	CU_ASSERT_DOUBLE_EQUAL(out[3], 15, 1e-5);
	/* att (B, NH, T, T): head 0 rows [1 0], [1/4 3/4]; head 1 rows [1 0], [1/2 1/2] */
	const float want[8] = {1, 0, 0.25f, 0.75f, 1, 0, 0.5f, 0.5f};
	for (int i = 0; i < 8; i++)
		CU_ASSERT_DOUBLE_EQUAL(att[i], want[i], 1e-6);
}

/* All-equal logits: every exp(l - max) is exactly 1, the sum exactly V, the loss log(V) with
 * nothing lost, and each probability 1/V. Two classes with logits [0, ln 3], target 1: p =
 * [1/4, 3/4], loss = ln(4/3) = 0.2876821; dlogits = p - onehot = [0.25, -0.25] (N = 1). */
static void test_crossentropy_by_hand(void)
{
	int V = 64, N = 3, targets[3] = {0, 17, 63};
	float *logits = alloc_floats((size_t)N * V);
	for (int i = 0; i < N * V; i++)
		logits[i] = 3.7f;
	float loss = ops_crossentropy_forward(logits, logits, targets, N, V);
	CU_ASSERT_EQUAL(loss, (float)log(64.0));
	CU_ASSERT_EQUAL(logits[5], 1.0f / 64);
	free(logits);

	float l2[2] = {0, logf(3.0f)}, p2[2], d2[2];
	int t2 = 1;
	CU_ASSERT_DOUBLE_EQUAL(ops_crossentropy_forward(p2, l2, &t2, 1, 2), 0.2876821, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(p2[0], 0.25, 1e-7);
	ops_crossentropy_backward(d2, p2, &t2, 1, 2, 1.0f);
	CU_ASSERT_DOUBLE_EQUAL(d2[0], 0.25, 1e-7);
	CU_ASSERT_DOUBLE_EQUAL(d2[1], -0.25, 1e-7);
	/* targets NULL: probabilities only */
	CU_ASSERT_EQUAL(ops_crossentropy_forward(p2, l2, NULL, 1, 2), 0.0f);
	CU_ASSERT_DOUBLE_EQUAL(p2[1], 0.75, 1e-7);
}

/* AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, p = 1, a constant gradient 0.5:
 *   step 1: m = 0.05, v = 0.00025; m_hat = 0.05/0.1 = 0.5, v_hat = 0.00025/0.001 = 0.25,
 *           update 0.5 / (0.5 + 1e-8) = 1 - 2e-8; p = 1 - 0.1 (1 - 2e-8 + 0.01 * 1) = 0.899
 *   step 2: m = 0.095, v = 0.00049975; m_hat = 0.095/0.19 = 0.5,
 *           v_hat = 0.00049975/0.001999 = 0.25;
 *           p = 0.899 - 0.1 (1 + 0.01 * 0.899) = 0.798101
 * A sign change at step 2 (gradient -0.25) shows the bias correction doing real work:
 *   m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
 *   m_hat = 0.02/0.19 = 0.1052632, v_hat = 0.00031225/0.001999 = 0.1562031, sqrt = 0.3952255,
 *   p = 0.899 - 0.1 (0.1052632/0.3952255 + 0.00899) = 0.899 - 0.1 (0.2663370 + 0.00899)
 *     = 0.8714673.
 * torch's foreach form (ops_adamw_foreach_step) gives the same values and leaves its
 * denominators sqrt(v_hat) + eps behind: 0.5 + 1e-8 after step 1, 0.5 and 0.3952255 after step 2
 * (torch's exp_avg_sq_sqrt, the copy it holds while it runs). */
static void test_adamw_by_hand(void)
{
	OpsAdamw h = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
	for (int foreach = 0; foreach < 2; foreach++) {
		float p[2] = {1, 1}, m[2] = {0, 0}, v[2] = {0, 0}, d[2] = {0, 0};
		/* element 1 gets the gradient scaled by a loss scale 1024 and unscaled by grad_scale */
		float g[2] = {0.5f, 0.5f}, gs = 512.0f, g2[2] = {0.5f, -0.25f};
		const float *g1[2] = {g, &gs}, *gb[2] = {g2, g2 + 1};
		const float scale[2] = {1.0f, 1.0f / 1024};
		for (int step = 1; step <= 2; step++)
			for (int i = 0; i < 2; i++) {
				const float *gi = step == 1 ? g1[i] : gb[i];
				float sc = step == 1 ? scale[i] : 1.0f;
				if (foreach)
					ops_adamw_foreach_step(p + i, m + i, v + i, gi, 1, &h, step, sc,
							       d + i);
				else
					ops_adamw_step(p + i, m + i, v + i, gi, 1, &h, step, sc);
				if (step == 1) {
					CU_ASSERT_DOUBLE_EQUAL(p[i], 0.899, 1e-6);
					CU_ASSERT_DOUBLE_EQUAL(m[i], 0.05, 1e-8);
					CU_ASSERT_DOUBLE_EQUAL(v[i], 0.00025, 1e-9);
					if (foreach)
						CU_ASSERT_DOUBLE_EQUAL(d[i], 0.5 + 1e-8, 1e-7);
				}
			}
		CU_ASSERT_DOUBLE_EQUAL(p[0], 0.798101, 2e-6);
		CU_ASSERT_DOUBLE_EQUAL(p[1], 0.8714673, 2e-6);
		if (foreach) {
			CU_ASSERT_DOUBLE_EQUAL(d[0], 0.5, 1e-6);
			CU_ASSERT_DOUBLE_EQUAL(d[1], 0.3952255, 1e-6);
		}
	}
}

/* SGD, lr 0.1, momentum 0.9, p = 1, gradient 0.5: buf = 0.5, p = 0.95; then buf = 0.45 + 0.5 =
 * 0.95, p = 0.855. With weight decay 0.1 and no momentum: g = 0.5 + 0.1, p = 1 - 0.06 = 0.94. */
static void test_sgd_and_norm_by_hand(void)
{
	float p = 1, buf = 0, g = 0.5f;
	ops_sgd_step(&p, &buf, &g, 1, 0.1f, 0.9f, 0.0f, 1.0f);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.95, 1e-7);
	ops_sgd_step(&p, &buf, &g, 1, 0.1f, 0.9f, 0.0f, 1.0f);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.855, 1e-6);
	p = 1;
	ops_sgd_step(&p, NULL, &g, 1, 0.1f, 0.0f, 0.1f, 1.0f);
	CU_ASSERT_DOUBLE_EQUAL(p, 0.94, 1e-7);

	/* [3, 4, 0]: sum of squares 25, norm 5; clipping to 1 scales by 1 / (5 + 1e-6) */
	float x[3] = {3, 4, 0};
	CU_ASSERT_EQUAL(ops_sum_squares(x, 3), 25.0);
	CU_ASSERT_DOUBLE_EQUAL(ops_clip_coef(5.0, 1.0f), 1.0 / (5.0 + 1e-6), 1e-7);
	CU_ASSERT_EQUAL(ops_clip_coef(5.0, 10.0f), 1.0f);
	CU_ASSERT_EQUAL(ops_clip_coef(5.0, 0.0f), 1.0f);
}

/* ---- ops: backward against finite differences ---- */

/* Each probe is sum(y * r) for a fixed random r, so the analytic input gradient is the op's
 * backward with dy = r. */
typedef struct OpCase {
	int B, T, C, NH, C_out, V;
	float *x, *w, *b, *y, *r, *aux;
	int *tokens;
	size_t n_out;
} OpCase;

static double probe_matmul(void *ctx)
{
	OpCase *k = ctx;
	ops_matmul_forward(k->y, k->x, k->w, k->b, k->B, k->C, k->C_out);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_matmul_backward(void)
{
	OpCase k = {.B = 5, .C = 4, .C_out = 3};
	k.n_out = (size_t)k.B * k.C_out;
	k.x = random_floats((size_t)k.B * k.C, 1, 1);
	k.w = random_floats((size_t)k.C * k.C_out, 1, 2);
	k.b = random_floats((size_t)k.C_out, 1, 3);
	k.r = random_floats(k.n_out, 1, 4);
	k.y = alloc_floats(k.n_out);
	float *dx = alloc_floats((size_t)k.B * k.C), *dw = alloc_floats((size_t)k.C * k.C_out);
	float *db = alloc_floats((size_t)k.C_out);
	ops_matmul_backward(dx, dw, db, k.r, k.x, k.w, k.B, k.C, k.C_out);
	check_all("matmul dx", k.x, dx, (size_t)k.B * k.C, probe_matmul, &k);
	check_all("matmul dw", k.w, dw, (size_t)k.C * k.C_out, probe_matmul, &k);
	check_all("matmul db", k.b, db, (size_t)k.C_out, probe_matmul, &k);
	/* accumulation: a second backward doubles every gradient */
	ops_matmul_backward(dx, dw, db, k.r, k.x, k.w, k.B, k.C, k.C_out);
	float *dx1 = alloc_floats((size_t)k.B * k.C);
	ops_matmul_backward(dx1, NULL, NULL, k.r, k.x, k.w, k.B, k.C, k.C_out);
	for (int i = 0; i < k.B * k.C; i++)
		CU_ASSERT_DOUBLE_EQUAL(dx[i], 2 * dx1[i], 1e-5);
	free(k.x), free(k.w), free(k.b), free(k.r), free(k.y), free(dx), free(dw), free(db),
		free(dx1);
}

static double probe_lm_head(void *ctx)
{
	OpCase *k = ctx;
	ops_lm_head_forward(k->y, k->x, k->w, k->B, k->C, k->V);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_lm_head_backward(void)
{
	OpCase k = {.B = 4, .C = 3, .V = 5};
	k.n_out = (size_t)k.B * k.V;
	k.x = random_floats((size_t)k.B * k.C, 1, 11);
	k.w = random_floats((size_t)k.V * k.C, 1, 12);
	k.r = random_floats(k.n_out, 1, 13);
	k.y = alloc_floats(k.n_out);
	float *dx = alloc_floats((size_t)k.B * k.C), *dw = alloc_floats((size_t)k.V * k.C);
	ops_lm_head_backward(dx, dw, k.r, k.x, k.w, k.B, k.C, k.V);
	check_all("lm_head dx", k.x, dx, (size_t)k.B * k.C, probe_lm_head, &k);
	check_all("lm_head dwte", k.w, dw, (size_t)k.V * k.C, probe_lm_head, &k);
	free(k.x), free(k.w), free(k.r), free(k.y), free(dx), free(dw);
}

static double probe_layernorm(void *ctx)
{
	OpCase *k = ctx;
	ops_layernorm_forward(k->y, NULL, NULL, k->x, k->w, k->b, k->B, k->C);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_layernorm_backward(void)
{
	OpCase k = {.B = 3, .C = 8};
	size_t n = (size_t)k.B * k.C;
	k.n_out = n;
	k.x = random_floats(n, 1, 21);
	k.w = random_floats((size_t)k.C, 0.5f, 22);
	k.b = random_floats((size_t)k.C, 0.5f, 23);
	for (int i = 0; i < k.C; i++)
		k.w[i] += 1.0f;
	k.r = random_floats(n, 1, 24);
	k.y = alloc_floats(n);
	float *dx = alloc_floats(n), *dw = alloc_floats((size_t)k.C), *db = alloc_floats((size_t)k.C);
	ops_layernorm_backward(dx, dw, db, k.r, k.x, k.w, k.B, k.C);
	check_all("layernorm dx", k.x, dx, n, probe_layernorm, &k);
	check_all("layernorm dw", k.w, dw, (size_t)k.C, probe_layernorm, &k);
	check_all("layernorm db", k.b, db, (size_t)k.C, probe_layernorm, &k);
	free(k.x), free(k.w), free(k.b), free(k.r), free(k.y), free(dx), free(dw), free(db);
}

static double probe_gelu(void *ctx)
{
	OpCase *k = ctx;
	ops_gelu_forward(k->y, k->x, k->n_out);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_gelu_backward(void)
{
	OpCase k = {.n_out = 40};
	k.x = random_floats(k.n_out, 2, 31); /* spans the curved part around 0 and both tails */
	k.r = random_floats(k.n_out, 1, 32);
	k.y = alloc_floats(k.n_out);
	float *dx = alloc_floats(k.n_out);
	ops_gelu_backward(dx, k.r, k.x, k.n_out);
	check_all("gelu dx", k.x, dx, k.n_out, probe_gelu, &k);
	free(k.x), free(k.r), free(k.y), free(dx);
}

static double probe_attention(void *ctx)
{
	OpCase *k = ctx;
	ops_attention_forward(k->y, k->aux, k->x, k->B, k->T, k->C, k->NH);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_attention_backward(void)
{
	OpCase k = {.B = 2, .T = 5, .C = 6, .NH = 2};
	size_t nq = (size_t)k.B * k.T * 3 * k.C;
	k.n_out = (size_t)k.B * k.T * k.C;
	k.x = random_floats(nq, 1, 41);
	k.r = random_floats(k.n_out, 1, 42);
	k.y = alloc_floats(k.n_out);
	k.aux = alloc_floats((size_t)k.B * k.NH * k.T * k.T);
	float *dqkv = alloc_floats(nq);
	probe_attention(&k); /* fills att for backward */
	ops_attention_backward(dqkv, k.r, k.x, k.aux, k.B, k.T, k.C, k.NH);
	check_all("attention dqkv", k.x, dqkv, nq, probe_attention, &k);
	/* causality: nothing of the last token's k or v reaches earlier outputs, so with r zero
	 * everywhere but token 0, their gradient is exactly 0 */
	memset(dqkv, 0, nq * sizeof(float));
	float *r0 = alloc_floats(k.n_out);
	memcpy(r0, k.r, (size_t)k.C * sizeof(float));
	probe_attention(&k);
	ops_attention_backward(dqkv, r0, k.x, k.aux, k.B, k.T, k.C, k.NH);
	for (int i = 0; i < 3 * k.C; i++)
		CU_ASSERT_EQUAL(dqkv[(size_t)(k.T - 1) * 3 * k.C + i], 0.0f);
	free(k.x), free(k.r), free(k.y), free(k.aux), free(dqkv), free(r0);
}

static double probe_embed(void *ctx)
{
	OpCase *k = ctx;
	ops_embed_forward(k->y, k->tokens, k->w, k->b, k->B, k->T, k->C);
	return dot_double(k->y, k->r, k->n_out);
}

static void test_embed_and_residual_backward(void)
{
	int tokens[6] = {3, 1, 3, 0, 3, 2}; /* token 3 three times: its row sums three gradients */
	OpCase k = {.B = 2, .T = 3, .C = 4, .V = 5, .tokens = tokens};
	k.n_out = (size_t)k.B * k.T * k.C;
	k.w = random_floats((size_t)k.V * k.C, 1, 51);  /* wte */
	k.b = random_floats((size_t)4 * k.C, 1, 52);    /* wpe, max_T = 4 */
	k.r = random_floats(k.n_out, 1, 53);
	k.y = alloc_floats(k.n_out);
	float *dwte = alloc_floats((size_t)k.V * k.C), *dwpe = alloc_floats((size_t)4 * k.C);
	ops_embed_backward(dwte, dwpe, k.r, k.tokens, k.B, k.T, k.C);
	check_all("embed dwte", k.w, dwte, (size_t)k.V * k.C, probe_embed, &k);
	check_all("embed dwpe", k.b, dwpe, (size_t)4 * k.C, probe_embed, &k);
	/* token 4 is unused and position 3 beyond T: exactly zero */
	for (int i = 0; i < k.C; i++) {
		CU_ASSERT_EQUAL(dwte[4 * k.C + i], 0.0f);
		CU_ASSERT_EQUAL(dwpe[3 * k.C + i], 0.0f);
	}
	/* residual: y = a + b, so da = db = dy, accumulated */
	float a[2] = {1, 2}, bb[2] = {3, 4}, y[2], dy[2] = {0.5f, -1}, da[2] = {1, 1}, db[2] = {0, 0};
	ops_residual_forward(y, a, bb, 2);
	CU_ASSERT(y[0] == 4 && y[1] == 6);
	ops_residual_backward(da, db, dy, 2);
	CU_ASSERT(da[0] == 1.5f && da[1] == 0 && db[0] == 0.5f && db[1] == -1);
	free(k.w), free(k.b), free(k.r), free(k.y), free(dwte), free(dwpe);
}

typedef struct CeCase {
	float *logits, *probs;
	const int *targets;
	int N, V;
} CeCase;

static double probe_crossentropy(void *ctx)
{
	CeCase *k = ctx;
	return ops_crossentropy_forward(k->probs, k->logits, k->targets, k->N, k->V);
}

static void test_crossentropy_backward(void)
{
	int targets[3] = {0, 4, 2};
	CeCase k = {.N = 3, .V = 6, .targets = targets};
	size_t n = (size_t)k.N * k.V;
	k.logits = random_floats(n, 2, 61);
	k.probs = alloc_floats(n);
	float *d = alloc_floats(n);
	probe_crossentropy(&k);
	ops_crossentropy_backward(d, k.probs, targets, k.N, k.V, 1.0f);
	check_all("crossentropy dlogits", k.logits, d, n, probe_crossentropy, &k);
	/* in place, with dloss = 8: eight times the same, bit for bit (a power of two) */
	probe_crossentropy(&k);
	ops_crossentropy_backward(k.probs, k.probs, targets, k.N, k.V, 8.0f);
	for (size_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(k.probs[i], 8 * d[i]);
	free(k.logits), free(k.probs), free(d);
}

/* ---- GPT: layout against the engine ---- */

/* The tiny model of the GPT tests: V = 64, max_T = 16, C = 32, L = 2, NH = 4; B = 2, T = 8. */
static const GptConfig TINY = {.V = 64, .max_T = 16, .C = 32, .L = 2, .NH = 4};
enum { TINY_B = 2, TINY_T = 8 };

/* GPT-2 as the engine reads its config.json, without dropout (the executor has none). */
static ModelSpec engine_gpt2(const GptConfig *c)
{
	ModelSpec m;
	if (fx_modelf(&m, "{\"model_type\": \"gpt2\", \"n_embd\": %d, \"n_layer\": %d, "
		      "\"n_head\": %d, \"vocab_size\": %d, \"n_positions\": %d, \"attn_pdrop\": 0, "
		      "\"resid_pdrop\": 0, \"embd_pdrop\": 0}", c->C, c->L, c->NH, c->V, c->max_T))
		memset(&m, 0, sizeof(m));
	return m;
}

/* Names, order and sizes of every unit's tensors as engine/model.c lists them, and the saved
 * activations as engine/activ.c counts them (4-byte activations, no dropout, nothing recomputed),
 * so the executor's allocator and the simulator agree byte for byte. By hand for the tiny model:
 * 4 B T (16 C + NH T) = 4 * 16 * (512 + 32) = 34816 bytes a block. */
static void test_layout_matches_engine(void)
{
	GptConfig cfgs[2] = {TINY, {.V = 50257, .max_T = 1024, .C = 768, .L = 12, .NH = 12}};
	for (int k = 0; k < 2; k++) {
		const GptConfig *c = &cfgs[k];
		ModelSpec m = engine_gpt2(c);
		for (int u = 0; u < gpt_cpu_n_units(c); u++) {
			GptTensor g[GPT_CPU_MAX_TENSORS];
			ModelTensor e[MODEL_MAX_TENSORS];
			int ng = gpt_cpu_unit_tensors(c, u, g), ne = model_unit_tensors(&m, u, e);
			CU_ASSERT_EQUAL(ng, ne);
			for (int i = 0; i < ng && i < ne; i++) {
				CU_ASSERT_STRING_EQUAL(g[i].name, e[i].name);
				CU_ASSERT_EQUAL((long long)g[i].numel, e[i].numel);
			}
			CU_ASSERT_EQUAL((long long)gpt_cpu_unit_params(c, u), model_unit_params(&m, u));
		}
		ActivShape x = {.s = 8, .b = 2, .t = 1, .sp = 0, .elem_bytes = 4};
		CU_ASSERT_EQUAL((double)gpt_cpu_block_act_bytes(c, 2, 8),
				activ_block_bytes(&m, &x, CKPT_NONE));
	}
	CU_ASSERT_EQUAL(gpt_cpu_block_act_bytes(&TINY, TINY_B, TINY_T), 34816);
	/* Hugging Face's num_parameters() of GPT2LMHeadModel("gpt2"), tied head */
	CU_ASSERT_EQUAL(gpt_cpu_n_params(&cfgs[1]), 124439808);
	/* tiny: 64*32 + 16*32 + 2 (12*32^2 + 13*32) + 2*32 = 2048 + 512 + 25408 + 64 */
	CU_ASSERT_EQUAL(gpt_cpu_n_params(&TINY), 28032);
	/* head: 4 B T (2C + V) = 4 * 16 * 128; scratch 8 B T C floats */
	CU_ASSERT_EQUAL(gpt_cpu_head_act_bytes(&TINY, TINY_B, TINY_T), 8192);
	CU_ASSERT_EQUAL(gpt_cpu_scratch_bytes(&TINY, TINY_B, TINY_T), 16384);

	PxError err = {0};
	GptConfig bad = TINY;
	bad.NH = 5;
	CU_ASSERT_EQUAL(gpt_cpu_check(&bad, 1, 8, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "multiple of NH"));
	CU_ASSERT_EQUAL(gpt_cpu_check(&TINY, 1, 17, &err), -1);
	CU_ASSERT_EQUAL(gpt_cpu_check(&TINY, 1, 16, &err), 0);
	int toks[3] = {0, 63, 64};
	CU_ASSERT_EQUAL(gpt_cpu_check_tokens(&TINY, toks, 2, &err), 0);
	CU_ASSERT_EQUAL(gpt_cpu_check_tokens(&TINY, toks, 3, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "token 2 is 64"));
}

/* GPT-2's init: N(0, 0.02) weights and embeddings, N(0, 0.02/sqrt(2L)) residual projections,
 * zero biases, unit norm weights; per-unit init equals the slice of the whole-model init. */
static void test_init(void)
{
	GptConfig c = {.V = 256, .max_T = 64, .C = 64, .L = 3, .NH = 4};
	size_t n = gpt_cpu_n_params(&c);
	float *p = alloc_floats(n), *q = alloc_floats(n);
	gpt_cpu_init(&c, p, 1234);
	for (int u = 0; u < gpt_cpu_n_units(&c); u++) {
		GptTensor t[GPT_CPU_MAX_TENSORS];
		int nt = gpt_cpu_unit_tensors(&c, u, t);
		const float *x = p + gpt_cpu_unit_offset(&c, u);
		for (int i = 0; i < nt; x += t[i].numel, i++) {
			double s = 0, sq = 0;
			for (size_t j = 0; j < t[i].numel; j++)
				s += x[j], sq += (double)x[j] * x[j];
			double mean = s / t[i].numel, std = sqrt(sq / t[i].numel - mean * mean);
			const char *nm = t[i].name;
			if (strstr(nm, ".bias")) {
				CU_ASSERT(s == 0 && sq == 0);
			} else if (strstr(nm, "norm")) {
				CU_ASSERT(mean == 1 && std == 0);
			} else {
				double want = (!strcmp(nm, "attn.o.weight") ||
					       !strcmp(nm, "mlp.down.weight"))
						      ? 0.02 / sqrt(2.0 * c.L)
						      : 0.02;
				/* >= 4096 samples: the sample std is within 5% with margin */
				if (fabs(std / want - 1) > 0.05)
					fprintf(stderr, "\n%s: std %g, want %g", nm, std, want);
				CU_ASSERT(fabs(std / want - 1) < 0.05);
				CU_ASSERT(fabs(mean) < 0.1 * want);
			}
		}
	}
	/* one unit alone, as a rank holding only it would draw it */
	gpt_cpu_init_unit(&c, 2, q, 1234);
	CU_ASSERT_EQUAL(memcmp(q, p + gpt_cpu_unit_offset(&c, 2),
			       gpt_cpu_unit_params(&c, 2) * sizeof(float)), 0);
	gpt_cpu_init(&c, q, 1235);
	CU_ASSERT_NOT_EQUAL(memcmp(q, p, n * sizeof(float)), 0);
	free(p), free(q);
}

/* ---- GPT: forward, backward, training ---- */

static void random_tokens(int *t, size_t n, int V, uint64_t seed)
{
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		t[i] = (int)(rng_next_u64(&r) % (uint64_t)V);
}

/* Small init logits make the predictions nearly uniform, so the loss is close to ln V = ln 64 =
 * 4.1589. Above it by about 0.02 in expectation: logits have variance C 0.02^2 = 0.013 after the
 * final norm (+0.006), and each token's own logit is lifted by about |wte row|^2 / std(x) = 0.46
 * (+0.009 on a random target); 128 tokens put the sampling noise near 0.01. */
static void test_loss_at_init(void)
{
	enum { B = 8, T = 16 };
	GptCpuBuffers b;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&b, &TINY, B, T, &err), 0);
	float *p = alloc_floats(gpt_cpu_n_params(&TINY));
	int tok[B * T], tgt[B * T];
	gpt_cpu_init(&TINY, p, 7);
	random_tokens(tok, B * T, TINY.V, 1);
	random_tokens(tgt, B * T, TINY.V, 2);
	float loss = gpt_cpu_forward(&b, p, tok, tgt);
	if (fabs(loss - log(64.0) - 0.015) >= 0.04)
		fprintf(stderr, "\nloss at init %.5f, ln 64 = %.5f\n", loss, log(64.0));
	CU_ASSERT(fabs(loss - log(64.0) - 0.015) < 0.04);
	/* without targets: probabilities, each row summing to 1 */
	CU_ASSERT_EQUAL(gpt_cpu_forward(&b, p, tok, NULL), 0.0f);
	const float *probs = gpt_cpu_head_probs(&TINY, B, T, b.head_acts);
	double row = 0;
	for (int j = 0; j < TINY.V; j++)
		row += probs[j];
	CU_ASSERT_DOUBLE_EQUAL(row, 1.0, 1e-5);
	free(p);
	gpt_cpu_buffers_free(&b);
	gpt_cpu_buffers_free(NULL);
}

typedef struct GptCase {
	GptCpuBuffers buf;
	float *params, *grads;
	int tok[TINY_B * TINY_T], tgt[TINY_B * TINY_T];
} GptCase;

static double probe_gpt(void *ctx)
{
	GptCase *k = ctx;
	return gpt_cpu_forward(&k->buf, k->params, k->tok, k->tgt);
}

/* Parameters for gradient checks: the init plus N(0, 0.1) everywhere, so that biases, norm
 * parameters and attention patterns are all away from their special init values and every path
 * carries a gradient of a measurable size. */
static int gpt_case_init(GptCase *k)
{
	PxError err = {0};
	if (gpt_cpu_buffers_init(&k->buf, &TINY, TINY_B, TINY_T, &err)) {
		CU_FAIL(err.msg);
		return -1;
	}
	size_t n = gpt_cpu_n_params(&TINY);
	k->params = alloc_floats(n);
	k->grads = alloc_floats(n);
	gpt_cpu_init(&TINY, k->params, 99);
	float *noise = random_floats(n, 0.1f, 100);
	for (size_t i = 0; i < n; i++)
		k->params[i] += noise[i];
	free(noise);
	random_tokens(k->tok, TINY_B * TINY_T, TINY.V, 101);
	random_tokens(k->tgt, TINY_B * TINY_T, TINY.V, 102);
	return 0;
}

static void gpt_case_free(GptCase *k)
{
	free(k->params);
	free(k->grads);
	gpt_cpu_buffers_free(&k->buf);
}

/* Every tensor of every unit: 6 random entries against central differences of the whole model's
 * loss, with the ops' step and tolerances (the loss is a mean of 16 float-computed terms, so its
 * noise is no larger than theirs). embed.positions rows at or past T get no gradient and must
 * read exactly 0. */
static void test_gpt_gradients(void)
{
	GptCase k;
	if (gpt_case_init(&k))
		return;
	gpt_cpu_forward(&k.buf, k.params, k.tok, k.tgt);
	gpt_cpu_backward(&k.buf, k.params, k.grads, k.tok, k.tgt, 1.0f);
	PxRng r;
	rng_init(&r, 5, 0);
	int checked = 0, bad = 0;
	for (int u = 0; u < gpt_cpu_n_units(&TINY); u++) {
		GptTensor t[GPT_CPU_MAX_TENSORS];
		int nt = gpt_cpu_unit_tensors(&TINY, u, t);
		size_t off = gpt_cpu_unit_offset(&TINY, u);
		for (int i = 0; i < nt; off += t[i].numel, i++) {
			size_t span = t[i].numel;
			if (!strcmp(t[i].name, "embed.positions"))
				span = (size_t)TINY_T * TINY.C; /* the rows this T reaches */
			for (int s = 0; s < 6; s++) {
				size_t j = off + rng_next_u64(&r) % span;
				double num = fd_grad(k.params, j, FD_STEP, probe_gpt, &k);
				checked++;
				if (!grad_close(k.grads[j], num, FD_ATOL, FD_RTOL)) {
					fprintf(stderr, "\nunit %d %s[%zu]: analytic %.6g, numeric "
						"%.6g", u, t[i].name, j - off, (double)k.grads[j], num);
					bad++;
				}
			}
			if (!strcmp(t[i].name, "embed.positions"))
				for (size_t j = span; j < t[i].numel; j++)
					CU_ASSERT_EQUAL(k.grads[off + j], 0.0f);
		}
	}
	CU_ASSERT_EQUAL(checked, 6 * (2 + 12 * TINY.L + 2));
	CU_ASSERT_EQUAL(bad, 0);
	gpt_case_free(&k);
}

/* The per-unit contract the executor relies on: a block forward run twice (full recompute) keeps
 * the same activations bit for bit; y may be x and dx may be dy; two micro-batches' backwards
 * accumulate to the sum; dloss scales the gradients. */
static void test_gpt_unit_contract(void)
{
	GptCase k;
	if (gpt_case_init(&k))
		return;
	const GptConfig *c = &TINY;
	int B = TINY_B, T = TINY_T;
	size_t btc = (size_t)B * T * c->C, na = gpt_cpu_block_acts(c, B, T).total_elems;
	size_t np = gpt_cpu_unit_params(c, 1);
	const float *p1 = k.params + gpt_cpu_unit_offset(c, 1);
	float *x = random_floats(btc, 1, 200), *dy = random_floats(btc, 1, 201);
	float *y = alloc_floats(btc), *xy = alloc_floats(btc), *dx = alloc_floats(btc);
	float *acts = alloc_floats(na), *acts2 = alloc_floats(na);
	float *scratch = alloc_floats(gpt_cpu_scratch_bytes(c, B, T) / sizeof(float));
	float *g = alloc_floats(np), *g2 = alloc_floats(np);

	gpt_cpu_block_forward(c, B, T, p1, x, y, acts);
	memcpy(xy, x, btc * sizeof(float));
	gpt_cpu_block_forward(c, B, T, p1, xy, xy, acts2); /* in place */
	CU_ASSERT_EQUAL(memcmp(acts, acts2, na * sizeof(float)), 0);
	CU_ASSERT_EQUAL(memcmp(y, xy, btc * sizeof(float)), 0);

	gpt_cpu_block_backward(c, B, T, p1, g, acts, dy, dx, scratch);
	memcpy(xy, dy, btc * sizeof(float));
	gpt_cpu_block_backward(c, B, T, p1, g2, acts2, xy, xy, scratch); /* in place */
	CU_ASSERT_EQUAL(memcmp(dx, xy, btc * sizeof(float)), 0);
	CU_ASSERT_EQUAL(memcmp(g, g2, np * sizeof(float)), 0);
	gpt_cpu_block_backward(c, B, T, p1, g2, acts2, dy, dx, scratch); /* a second micro-batch */
	int bad = 0;
	for (size_t i = 0; i < np; i++)
		bad += fabsf(g2[i] - 2 * g[i]) > 1e-5f * (1 + fabsf(g[i]));
	CU_ASSERT_EQUAL(bad, 0);

	/* the whole model: dloss 4 gives four times the gradients of dloss 1 (a power of two, and
	 * every gradient is linear in it: equal to float rounding) */
	size_t n = gpt_cpu_n_params(c);
	float *ga = alloc_floats(n);
	gpt_cpu_forward(&k.buf, k.params, k.tok, k.tgt);
	gpt_cpu_backward(&k.buf, k.params, k.grads, k.tok, k.tgt, 1.0f);
	gpt_cpu_forward(&k.buf, k.params, k.tok, k.tgt);
	gpt_cpu_backward(&k.buf, k.params, ga, k.tok, k.tgt, 4.0f);
	bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += fabsf(ga[i] - 4 * k.grads[i]) > 1e-5f * (1 + fabsf(ga[i]));
	CU_ASSERT_EQUAL(bad, 0);

	free(x), free(dy), free(y), free(xy), free(dx), free(acts), free(acts2), free(scratch);
	free(g), free(g2), free(ga);
	gpt_case_free(&k);
}

/* Training sanity: sequences of t[i+1] = (5 t[i] + 3) mod 64 (a full-period LCG: 5 - 1 divisible
 * by 4, 3 odd) from random starts. Each next token is a function of the current one, so a model
 * that learns the map drives the loss toward 0; 150 AdamW steps must take it from about ln 64 =
 * 4.16 to below half of that. Clipping at norm 1 exercises the fused unscale + clip scale. */
static void test_training_drops_loss(void)
{
	enum { B = 4, T = 16, STEPS = 150 };
	const GptConfig *c = &TINY;
	GptCpuBuffers b;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&b, c, B, T, &err), 0);
	size_t n = gpt_cpu_n_params(c);
	float *p = alloc_floats(n), *g = alloc_floats(n), *m = alloc_floats(n), *v = alloc_floats(n);
	gpt_cpu_init(c, p, 3);
	OpsAdamw h = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.01};
	int seq[B * (T + 1)], tok[B * T], tgt[B * T];
	PxRng r;
	rng_init(&r, 17, 0);
	float first = 0, last = 0;
	clock_t t0 = clock();
	for (int step = 1; step <= STEPS; step++) {
		for (int i = 0; i < B; i++) {
			int *s = seq + i * (T + 1);
			s[0] = (int)(rng_next_u64(&r) % 64);
			for (int j = 0; j < T; j++)
				s[j + 1] = (5 * s[j] + 3) % 64;
			memcpy(tok + i * T, s, T * sizeof(int));
			memcpy(tgt + i * T, s + 1, T * sizeof(int));
		}
		float loss = gpt_cpu_forward(&b, p, tok, tgt);
		memset(g, 0, n * sizeof(float));
		gpt_cpu_backward(&b, p, g, tok, tgt, 1.0f);
		float coef = ops_clip_coef(sqrt(ops_sum_squares(g, n)), 1.0f);
		ops_adamw_step(p, m, v, g, n, &h, step, coef);
		if (step == 1)
			first = loss;
		last = loss;
	}
	double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	if (!(last < 0.1))
		fprintf(stderr, "\ntraining: loss %.4f -> %.4f in %d steps\n", first, last, STEPS);
	CU_ASSERT(fabs(first - log(64.0)) < 0.1);
	CU_ASSERT(last < 0.5 * log(64.0));
	CU_ASSERT(last < 0.1); /* it reaches about 0.001: the map is learnt, not just its marginals */
	CU_ASSERT(secs < 10); /* about 0.1 s plain; generous for sanitizer builds */
	free(p), free(g), free(m), free(v);
	gpt_cpu_buffers_free(&b);
}

int test_kernels_register(void)
{
	return PX_ADD_SUITE("kernels", {"bf16 bit patterns", test_bf16_patterns},
			    {"fp16 bit patterns", test_f16_patterns},
			    {"16-bit round trips and midpoints", test_round_trips},
			    {"bulk conversion and non-finite check", test_bulk_and_nonfinite},
			    {"splitmix64 and normal samples", test_rng},
			    {"layernorm by hand", test_layernorm_by_hand},
			    {"gelu values", test_gelu_values},
			    {"attention by hand", test_attention_by_hand},
			    {"cross-entropy by hand", test_crossentropy_by_hand},
			    {"adamw by hand", test_adamw_by_hand},
			    {"sgd and grad norm by hand", test_sgd_and_norm_by_hand},
			    {"matmul backward vs finite differences", test_matmul_backward},
			    {"lm head backward vs finite differences", test_lm_head_backward},
			    {"layernorm backward vs finite differences", test_layernorm_backward},
			    {"gelu backward vs finite differences", test_gelu_backward},
			    {"attention backward vs finite differences", test_attention_backward},
			    {"embedding and residual backward", test_embed_and_residual_backward},
			    {"cross-entropy backward vs finite differences",
			     test_crossentropy_backward},
			    {"gpt layout matches engine model and activations",
			     test_layout_matches_engine},
			    {"gpt init", test_init},
			    {"gpt loss at init", test_loss_at_init},
			    {"gpt gradients vs finite differences", test_gpt_gradients},
			    {"gpt unit contract", test_gpt_unit_contract},
			    {"gpt training drops the loss", test_training_drops_loss});
}
