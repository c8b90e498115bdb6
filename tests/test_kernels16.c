/* Kernels, 16-bit compute: the rounding points of ops16_cpu worked by hand on bf16 bit patterns;
 * gpt16_cpu's units at PREC_F32 (where no rounding happens) against gpt_cpu's, a second
 * composition of the same ops, bit for bit; and at bf16 / fp16 against fp32 within bounds from
 * the formats' unit roundoff. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../exec/procmem.h"
#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/ops16_cpu.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/precision.h"
#include "../kernels/rng.h"
#include "suites.h"

static const GptConfig TINY = {.V = 64, .max_T = 16, .C = 32, .L = 2, .NH = 4};
enum { B = 2, T = 8 };

static void *zalloc(size_t bytes)
{
	void *p = calloc(1, bytes ? bytes : 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	return p;
}

static float *normals(size_t n, float std, uint64_t seed)
{
	float *x = zalloc(n * sizeof(float));
	PxRng r;
	rng_init(&r, seed, 0);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
	return x;
}

/* x rounded to t, as a new t array */
static void *narrow(PrecisionType t, const float *x, size_t n)
{
	void *y = zalloc(n * precision_bytes(t));
	ops16_round(t, y, x, n);
	return y;
}

static float *widen(PrecisionType t, const void *x, size_t n)
{
	float *y = zalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		y[i] = precision_load(x, i, t);
	return y;
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return m > 0 ? d / m : d;
}

/* ---- rounding points by hand ---- */

/* bf16 keeps 7 fraction bits: near 1 its spacing is 2^-7, unit roundoff 2^-8. */
static void test_rounding_points(void)
{
	const PrecisionType t = PREC_BF16;
	/* residual: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.0 (0x3F80);
	 * (1 + 2^-7) + 2^-8 is halfway between 0x3F81 and 0x3F82: to the even 0x3F82 */
	float a[2] = {1.0f, 1.0f + 0x1p-7f}, b[2] = {0x1p-8f, 0x1p-8f};
	uint16_t a16[2], b16[2], y16[2];
	ops16_round(t, a16, a, 2);
	ops16_round(t, b16, b, 2);
	ops16_residual_forward(t, y16, a16, b16, 2);
	CU_ASSERT_EQUAL(y16[0], 0x3F80);
	CU_ASSERT_EQUAL(y16[1], 0x3F82);

	/* matmul: 1 + 3 2^-10 + 3 2^-10 = 1 + 0.75 2^-7 summed in fp32 (exact) and rounded once
	 * gives 1 + 2^-7 (0x3F81); rounding after each addition would leave 1.0 twice (each 3 2^-10
	 * is under half the spacing) */
	float x[3] = {1, 1, 1}, w[3] = {1, 3 * 0x1p-10f, 3 * 0x1p-10f};
	uint16_t x16[3], w16[3], y1;
	ops16_round(t, x16, x, 3);
	ops16_round(t, w16, w, 3);
	ops16_matmul_forward(t, &y1, x16, w16, NULL, 1, 3, 1);
	CU_ASSERT_EQUAL(y1, 0x3F81);

	/* attention over two equal keys: scores equal, each probability exactly 1/2 (0x3F00), and
	 * the output the mean of the two values 1 and 1 + 2^-6: 1 + 2^-7 (0x3F81), all exact.
	 * qkv per token [q | k | v] with C = NH = 1. */
	float qkv[6] = {0.5f, 2.0f, 1.0f, 0.5f, 2.0f, 1.0f + 0x1p-6f};
	uint16_t qkv16[6], out16[2], att16[4];
	ops16_round(t, qkv16, qkv, 6);
	ops16_attention_forward(t, out16, att16, qkv16, 1, 2, 1, 1);
	CU_ASSERT_EQUAL(att16[0], 0x3F80); /* token 0 sees only itself */
	CU_ASSERT_EQUAL(att16[1], 0);      /* masked */
	CU_ASSERT_EQUAL(att16[2], 0x3F00);
	CU_ASSERT_EQUAL(att16[3], 0x3F00);
	CU_ASSERT_EQUAL(out16[0], 0x3F80);
	CU_ASSERT_EQUAL(out16[1], 0x3F81);
}

/* Attention backward on the same two tokens (att = [[1, 0], [1/2, 1/2]], q = 1/2, k = 2,
 * v = 1 and 1 + 2^-6, scale 1), dout = [3, 1 + 2^-7 + 2^-10]:
 *   g = rn(dout) = [3, 1 + 2^-7] (2^-10 is under half of bf16's 2^-7 spacing near 1);
 *   datt = rn(g v): row 0: 3; row 1: 1 + 2^-7 and rn((1 + 2^-7)(1 + 2^-6)) =
 *     rn(1 + 3 2^-7 + 2^-13) = 1 + 3 2^-7;
 *   pdp: row 0: 3; row 1: (1 + 2^-7) / 2 + (1 + 3 2^-7) / 2 = 1 + 2^-6;
 *   dS = rn(att (datt - pdp)): row 0: 0; row 1: -2^-8, 2^-8 (all exact);
 *   dq = dS k: 0 and (-2^-8 + 2^-8) 2 = 0; dk = dS^T q: -2^-8 / 2 = -2^-9, 2^-8 / 2 = 2^-9;
 *   dv = att^T g: 3 + (1 + 2^-7) / 2 = 3.5 + 2^-8, (1 + 2^-7) / 2 = 0.5 + 2^-8.
 * Unrounded, g would add 2^-11 to dv[1], and datt's lost 2^-13 would move dS to -+(2^-8 + 2^-15)
 * (representable in bf16) and dk to -+(2^-9 + 2^-16). */
static void test_attention_backward_points(void)
{
	const PrecisionType t = PREC_BF16;
	float qkv[6] = {0.5f, 2.0f, 1.0f, 0.5f, 2.0f, 1.0f + 0x1p-6f};
	float dout[2] = {3.0f, 1.0f + 0x1p-7f + 0x1p-10f}, dqkv[6] = {0};
	uint16_t qkv16[6], out16[2], att16[4];
	ops16_round(t, qkv16, qkv, 6);
	ops16_attention_forward(t, out16, att16, qkv16, 1, 2, 1, 1);
	ops16_attention_backward(t, dqkv, dout, qkv16, att16, 1, 2, 1, 1);
	const float want[6] = {0.0f, -0x1p-9f, 3.5f + 0x1p-8f, 0.0f, 0x1p-9f, 0.5f + 0x1p-8f};
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(dqkv[i], want[i]);
	/* accumulates: a second call adds the same again, exactly */
	ops16_attention_backward(t, dqkv, dout, qkv16, att16, 1, 2, 1, 1);
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(dqkv[i], 2 * want[i]);
}

/* The 16-bit attention backward against fp32's ops_attention_backward on the same rounded qkv and
 * att, normwise per tensor: g, datt and dS each carry one rounding (u); dS = att (datt - pdp)
 * passes datt's error on amplified by |datt| / |datt - pdp|, which over a row of T = 8 random
 * terms is a few; dq and dk sum T such terms, dv T terms of rounded g: 8u. */
static void test_attention_backward_bound(void)
{
	enum { AB = 2, AT = 8, AC = 16, ANH = 2 };
	size_t nqkv = (size_t)AB * AT * 3 * AC, nout = (size_t)AB * AT * AC;
	size_t natt = (size_t)AB * ANH * AT * AT;
	for (int k = 0; k < 2; k++) {
		PrecisionType t = k ? PREC_F16 : PREC_BF16;
		double u = k ? 0x1p-11 : 0x1p-8;
		float *qkv = normals(nqkv, 1, 31), *dout = normals(nout, 1, 32);
		void *q16 = narrow(t, qkv, nqkv), *out16 = zalloc(nout * 2), *att16 = zalloc(natt * 2);
		ops16_attention_forward(t, out16, att16, q16, AB, AT, AC, ANH);
		float *qf = widen(t, q16, nqkv), *af = widen(t, att16, natt);
		float *got = zalloc(nqkv * sizeof(float)), *ref = zalloc(nqkv * sizeof(float));
		ops16_attention_backward(t, got, dout, q16, att16, AB, AT, AC, ANH);
		ops_attention_backward(ref, dout, qf, af, AB, AT, AC, ANH);
		double e = rel_err(got, ref, nqkv);
		printf("\n  attention backward t %d: %.2f u", (int)t, e / u);
		CU_ASSERT(e <= 8 * u);
		CU_ASSERT(e > 0); /* it did round */
		free(qkv), free(dout), free(q16), free(out16), free(att16), free(qf), free(af);
		free(got), free(ref);
	}
}

/* ---- units ---- */

/* One block and the head, forward and backward, at type t from the same fp32 parameters and
 * inputs as gpt_cpu's fp32 units; the outputs widened to fp32. */
typedef struct UnitRun {
	float *y, *dx, *grads, *hgrads, *dwte, *hdx;
	float loss;
} UnitRun;

static void run_units(PrecisionType t, int fp32_units, UnitRun *o)
{
	const GptConfig *c = &TINY;
	size_t btc = (size_t)B * T * c->C, np = gpt_cpu_unit_params(c, 1), vc = (size_t)c->V * c->C;
	size_t nh = gpt_cpu_unit_params(c, c->L + 1), e = precision_bytes(t);
	float *p1 = zalloc(np * sizeof(float)), *ph = zalloc(nh * sizeof(float));
	float *wte = normals(vc, 0.02f, 5);
	float *x = normals(btc, 1, 7), *dy = normals(btc, 1, 8);
	int tgt[B * T];
	for (int i = 0; i < B * T; i++)
		tgt[i] = (i * 37 + 11) % c->V;
	gpt_cpu_init_unit(c, 1, p1, 3);
	gpt_cpu_init_unit(c, c->L + 1, ph, 3);

	size_t block_bytes = fp32_units ? gpt_cpu_block_act_bytes(c, B, T) :
					  gpt16_block_act_bytes(c, t, B, T);
	size_t head_bytes = fp32_units ? gpt_cpu_head_act_bytes(c, B, T) :
					 gpt16_head_act_bytes(c, t, B, T);
	void *acts = zalloc(block_bytes), *hacts = zalloc(head_bytes);
	float *scratch = zalloc(gpt_cpu_scratch_bytes(c, B, T));
	o->grads = zalloc(np * sizeof(float));
	o->hgrads = zalloc(nh * sizeof(float));
	o->dwte = zalloc(vc * sizeof(float));
	o->dx = zalloc(btc * sizeof(float));
	o->hdx = zalloc(btc * sizeof(float));
	if (fp32_units) {
		o->y = zalloc(btc * sizeof(float));
		gpt_cpu_block_forward(c, B, T, p1, x, o->y, acts);
		gpt_cpu_block_backward(c, B, T, p1, o->grads, acts, dy, o->dx, scratch);
		o->loss = gpt_cpu_head_forward(c, B, T, ph, wte, x, tgt, hacts);
		gpt_cpu_head_backward(c, B, T, ph, wte, o->hgrads, o->dwte, hacts, tgt, 1.0f, o->hdx,
				      scratch);
	} else {
		void *p16 = narrow(t, p1, np), *ph16 = narrow(t, ph, nh), *w16 = narrow(t, wte, vc);
		void *x16 = narrow(t, x, btc), *y16 = zalloc(btc * e);
		gpt16_block_forward(c, t, B, T, p16, x16, y16, acts);
		gpt16_block_backward(c, t, B, T, p16, o->grads, acts, dy, o->dx, scratch);
		o->loss = gpt16_head_forward(c, t, B, T, ph16, w16, x16, tgt, hacts);
		gpt16_head_backward(c, t, B, T, ph16, w16, o->hgrads, o->dwte, hacts, tgt, 1.0f,
				    o->hdx, scratch);
		o->y = widen(t, y16, btc);
		free(p16), free(ph16), free(w16), free(x16), free(y16);
	}
	free(p1), free(ph), free(wte), free(x), free(dy), free(acts), free(hacts), free(scratch);
}

static void unit_run_free(UnitRun *o)
{
	free(o->y), free(o->dx), free(o->grads), free(o->hgrads), free(o->dwte), free(o->hdx);
}

/* With no rounding (PREC_F32) the 16-bit composition runs the fp32 ops in the same order on the
 * same layouts, so the block is bit for bit gpt_cpu's; the head's dwte sums its rows in chunks
 * (gpt16_head_chunk_rows), which may reorder fp32 sums: within 1e-6 of the largest value. */
static void test_f32_matches_gpt_cpu(void)
{
	const GptConfig *c = &TINY;
	size_t btc = (size_t)B * T * c->C, np = gpt_cpu_unit_params(c, 1);
	UnitRun ref, got;
	run_units(PREC_F32, 1, &ref);
	run_units(PREC_F32, 0, &got);
	CU_ASSERT_EQUAL(memcmp(ref.y, got.y, btc * sizeof(float)), 0);
	CU_ASSERT_EQUAL(memcmp(ref.dx, got.dx, btc * sizeof(float)), 0);
	CU_ASSERT_EQUAL(memcmp(ref.grads, got.grads, np * sizeof(float)), 0);
	CU_ASSERT_EQUAL(ref.loss, got.loss);
	CU_ASSERT(rel_err(got.hdx, ref.hdx, btc) < 1e-6);
	CU_ASSERT(rel_err(got.dwte, ref.dwte, (size_t)c->V * c->C) < 1e-6);
	CU_ASSERT(rel_err(got.hgrads, ref.hgrads, 2 * (size_t)c->C) < 1e-6);
	unit_run_free(&ref), unit_run_free(&got);
}

/* The 16-bit units against fp32 ones, max-normwise per tensor (max |got - want| / max |want|), in
 * units of the format's unit roundoff u (bf16 2^-8, fp16 2^-11; Higham, Accuracy and Stability
 * of Numerical Algorithms, 2.1). Inputs and parameters are rounded once (u each); every op adds at
 * most one rounding of its output and passes its inputs' relative errors on, scaled by its
 * condition; products are exact and sums fp32, so the reductions (K = C, 4C, N = 16, V = 64 terms,
 * K 2^-24 << u) add nothing visible. Forward, the block output is x + two small branches: x's
 * rounding and the output's (2u) plus the branches' few u of a much smaller magnitude: bound 4u.
 * The loss: logits from two rounded operands and a rounded norm (3u relative, times |logit| <
 * 1 here) move each log-softmax by less than 6u: bound 8u, absolute. Backward: the input gradient
 * is dy plus branches, 4u as forward; parameter gradients are sums of products of a gradient
 * rounded once or twice along its chain (dy, d fc, d qkv: each a rounded fp32 value whose own
 * error is a few u) and an activation carrying the forward's few u; cancellation in sums over N =
 * 16 rows can amplify a term's relative error by the ratio sum |terms| / |sum|, about sqrt(N) = 4
 * for random signs: 16 u. The head's parameter gradients come through dlogits rounded once and
 * the rounded norm output: 16 u too. A wrong offset or a missed rounding is O(1) or O(2^-8) off. */
static void check_against_fp32(PrecisionType t, double u)
{
	const GptConfig *c = &TINY;
	size_t btc = (size_t)B * T * c->C, np = gpt_cpu_unit_params(c, 1);
	UnitRun ref, got;
	run_units(PREC_F32, 1, &ref);
	run_units(t, 0, &got);
	double e_y = rel_err(got.y, ref.y, btc), e_dx = rel_err(got.dx, ref.dx, btc);
	double e_hdx = rel_err(got.hdx, ref.hdx, btc);
	double e_dwte = rel_err(got.dwte, ref.dwte, (size_t)c->V * c->C);
	double e_hg = rel_err(got.hgrads, ref.hgrads, 2 * (size_t)c->C);
	double e_g = 0;
	GptTensor tens[GPT_CPU_MAX_TENSORS];
	int n = gpt_cpu_unit_tensors(c, 1, tens);
	for (int i = 0, off = 0; i < n; off += (int)tens[i].numel, i++)
		e_g = fmax(e_g, rel_err(got.grads + off, ref.grads + off, tens[i].numel));
	double e_loss = fabs((double)got.loss - ref.loss);
	printf("\n  t %d: in u: y %.2f dx %.2f grads %.2f loss %.2f head dx %.2f dwte %.2f norm %.2f",
	       (int)t, e_y / u, e_dx / u, e_g / u, e_loss / u, e_hdx / u, e_dwte / u, e_hg / u);
	CU_ASSERT(e_y <= 4 * u);
	CU_ASSERT(e_dx <= 4 * u);
	CU_ASSERT(e_g <= 16 * u);
	CU_ASSERT(e_loss <= 8 * u);
	CU_ASSERT(e_hdx <= 16 * u);
	CU_ASSERT(e_dwte <= 16 * u);
	CU_ASSERT(e_hg <= 16 * u);
	/* and the 16-bit run did round: not the fp32 numbers themselves */
	CU_ASSERT(e_y > 0 && e_g > 0);
	(void)np;
	unit_run_free(&ref), unit_run_free(&got);
}

static void test_bf16_units(void)
{
	check_against_fp32(PREC_BF16, 0x1p-8);
}

static void test_f16_units(void)
{
	check_against_fp32(PREC_F16, 0x1p-11);
}

/* Sizes: the block's 16-bit activations are engine/activ.c's 2 B T (16 C + NH T) = 2 x 16 x 544
 * = 17408 bytes here (half of gpt_cpu's 34816); the head keeps 2 x 2C + 4V = 384 bytes a token = 6144; the dlogits chunk holds
 * (8 BTC - BTC - 2N) floats / 2V = (4096 - 512 - 32) x 4 / 128 = 111 rows, so all 16. */
static void test_sizes(void)
{
	CU_ASSERT_EQUAL(gpt16_block_act_bytes(&TINY, PREC_BF16, B, T), 17408);
	CU_ASSERT_EQUAL(gpt16_block_act_bytes(&TINY, PREC_F32, B, T),
			gpt_cpu_block_act_bytes(&TINY, B, T));
	CU_ASSERT_EQUAL(gpt16_head_act_bytes(&TINY, PREC_BF16, B, T), 6144);
	CU_ASSERT_EQUAL(gpt16_head_chunk_rows(&TINY, PREC_BF16, B, T), 16);
	/* GPT-2 at B T = 1: (7 768 - 2) 4 / (2 50257) = 0.2 rows: refused with the reason */
	GptConfig big = {.V = 50257, .max_T = 1024, .C = 768, .L = 12, .NH = 12};
	PxError err;
	CU_ASSERT_EQUAL(gpt16_check(&big, PREC_BF16, 1, 1, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "V (50257)"));
	/* at B T = 8192 (8 x 1024): (7 x 8192 x 768 - 2 x 8192) x 4 / (2 x 50257) = 1751 rows */
	CU_ASSERT_EQUAL(gpt16_head_chunk_rows(&big, PREC_BF16, 8, 1024), 1751);
}

/* The 16-bit kernels' fp32 temporaries are kept between calls (ops16_cpu.c): a product whose
 * fp32 output is 2048 x 4608 floats (36 MiB, above glibc's largest mmap threshold, so malloc
 * would map it at every call and free unmap it) takes its first touches once; three more calls
 * take well under the 9,216 page faults one fresh 36 MiB block costs (the bound allows the C
 * library and the BLAS their few). */
static void test_temporaries_kept(void)
{
	enum { N = 2048, CI = 64, CO = 4608 };
	uint16_t *x = zalloc((size_t)N * CI * 2), *w = zalloc((size_t)CI * CO * 2);
	uint16_t *y = zalloc((size_t)N * CO * 2);
	ops16_matmul_forward(PREC_BF16, y, x, w, NULL, N, CI, CO);
	long long f0 = procmem_minor_faults();
	for (int i = 0; i < 3; i++)
		ops16_matmul_forward(PREC_BF16, y, x, w, NULL, N, CI, CO);
	long long faults = procmem_minor_faults() - f0;
	if (faults >= 1000)
		fprintf(stderr, "\nthree repeated 16-bit products took %lld page faults\n", faults);
	CU_ASSERT(f0 >= 0 && faults < 1000);
	free(x), free(w), free(y);
}

int test_kernels16_register(void)
{
	return PX_ADD_SUITE("kernels16", {"16-bit rounding points by hand", test_rounding_points},
			    {"16-bit attention backward rounding points by hand",
			     test_attention_backward_points},
			    {"16-bit attention backward against fp32 within u bounds",
			     test_attention_backward_bound},
			    {"16-bit units at fp32 are gpt_cpu's", test_f32_matches_gpt_cpu},
			    {"bf16 units against fp32 within u bounds", test_bf16_units},
			    {"fp16 units against fp32 within u bounds", test_f16_units},
			    {"16-bit unit sizes", test_sizes},
			    {"16-bit temporaries kept between calls", test_temporaries_kept});
}
