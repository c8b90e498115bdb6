/* gpt_cuda's layer units against gpt_cpu's, unit by unit and composed into a few training steps,
 * and (without a GPU) that the GPU ops' extra scratch fits where gpt_cuda places it. Tolerances:
 * see test_gpt_units and kernels/README.md; the per-op ones are test_kernels_cuda.c's. Without a
 * device the GPU tests are registered inactive and one line says why. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"

#ifdef PX_HAVE_CUDA

#include "../kernels/gpt16_cpu.h"
#include "../kernels/gpt_cpu.h"
#include "../kernels/gpt_cuda.h"
#include "../kernels/precision.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/ops_cuda.h"
#include "../kernels/optim_cuda.h"
#include "cuda_fixtures.h"

/* gpt_cuda against gpt_cpu, unit by unit, on gpt_cpu_init's weights and random stream inputs. A
 * unit chains about ten ops whose individual agreements above are 1e-5 relative or better, on
 * well-conditioned values at init (normalised inputs, std 0.02 weights); normwise 1e-4 relative,
 * per tensor, leaves a factor of ten for the chaining while any wrong offset, missing term or
 * race shows as an O(1) relative error. The block's backward runs in place (dx = dy) on the GPU
 * as gpt_cpu_backward does, against a separate dx on the CPU. */
static const GptConfig GPU_TINY = {.V = 97, .max_T = 40, .C = 96, .L = 2, .NH = 3};

/* rows of the GPU head's probabilities, ops_cuda_logits_ld(V) apart (104 for V = 97), into the
 * CPU's dense layout */
static void dense_probs(float *dst, const float *src, size_t rows, int V)
{
	size_t ld = (size_t)ops_cuda_logits_ld(V);
	for (size_t i = 0; i < rows; i++)
		memmove(dst + i * V, src + i * ld, (size_t)V * sizeof(float));
}

static void test_gpt_units(void)
{
	enum { B = 2, T = 33 };
	const GptConfig *c = &GPU_TINY;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(gpt_cpu_check(c, B, T, &err), 0);
	size_t np = gpt_cpu_n_params(c), btc = (size_t)B * T * c->C;
	size_t nblk = gpt_cpu_block_acts(c, B, T).total_elems;
	size_t nhead = gpt_cpu_head_act_bytes(c, B, T) / 4, nscr = gpt_cpu_scratch_bytes(c, B, T) / 4;
	size_t ghead_n = gpt_cuda_head_act_bytes(c, PREC_F32, B, T) / 4;
	CU_ASSERT_EQUAL(ghead_n, nhead + (size_t)B * T * 7); /* rows of 97 padded to 104 */
	float *p = cfx_floats(np);
	gpt_cpu_init(c, p, 5);
	int *tok = cfx_tokens((size_t)B * T, c->V, 151);
	int *tgt = cfx_tokens((size_t)B * T, c->V, 152);
	float *gp = cfx_up(p, np), *gg = cfx_up(NULL, np);
	int *gtok = cfx_put(tok, (size_t)B * T * 4), *gtgt = cfx_put(tgt, (size_t)B * T * 4);
	float *gx = cfx_up(NULL, btc), *gy = cfx_up(NULL, btc), *gacts = cfx_up(NULL, nblk);
	float *ghead = cfx_up(NULL, ghead_n), *gscr = cfx_up(NULL, nscr);
	size_t blk = gpt_cpu_unit_offset(c, 1), head = gpt_cpu_unit_offset(c, c->L + 1);
	char what[96];

	/* embeddings */
	float *y = cfx_floats(btc);
	gpt_cpu_embed_forward(c, B, T, p, tok, y);
	gpt_cuda_embed_forward(cfx_ctx(), c, B, T, gp, gtok, gx);
	float *hy = cfx_down(gx, btc);
	CU_ASSERT_EQUAL(cfx_same_bits("gpt embed forward", hy, y, btc, 4), 0);
	free(hy);

	/* block 1 forward on x ~ N(0, 1), every saved activation region compared */
	float *x = cfx_random(btc, 1, 153), *acts = cfx_floats(nblk);
	gpt_cpu_block_forward(c, B, T, p + blk, x, y, acts);
	cuda_ctx_upload(cfx_ctx(), gx, x, btc * 4);
	gpt_cuda_block_forward(cfx_ctx(), c, B, T, gp + blk, gx, gy, gacts, NULL, NULL);
	hy = cfx_down(gy, btc);
	float *hacts = cfx_down(gacts, nblk);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt block forward y", hy, y, btc, 1e-4), 0);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	size_t starts[] = {a.x_in, a.ln1, a.qkv, a.atty, a.res2, a.ln2, a.fc, a.gelu, a.att,
			   a.total_elems};
	const char *names[] = {"x_in", "ln1", "qkv", "atty", "res2", "ln2", "fc", "gelu", "att"};
	for (int i = 0; i < 9; i++) {
		snprintf(what, sizeof(what), "gpt block forward acts.%s", names[i]);
		CU_ASSERT_EQUAL(cfx_close_norm(what, hacts + starts[i], acts + starts[i],
					   starts[i + 1] - starts[i], 1e-4),
				0);
	}

	/* block 1 backward: the GPU gets the CPU's own activations, so only backward is compared */
	float *dy = cfx_random(btc, 1, 154), *dx = cfx_floats(btc), *g = cfx_floats(np);
	float *scr = cfx_floats(nscr);
	gpt_cpu_block_backward(c, B, T, p + blk, g + blk, acts, dy, dx, scr);
	cuda_ctx_upload(cfx_ctx(), gacts, acts, nblk * 4);
	cuda_ctx_upload(cfx_ctx(), gy, dy, btc * 4);
	gpt_cuda_block_backward(cfx_ctx(), c, B, T, gp + blk, gg + blk, gacts, NULL, NULL, gy, gy,
				gscr);
	float *hdx = cfx_down(gy, btc), *hg = cfx_down(gg, np);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt block backward dx", hdx, dx, btc, 1e-4), 0);
	GptTensor t[GPT_CPU_MAX_TENSORS];
	int nt = gpt_cpu_unit_tensors(c, 1, t);
	size_t off = blk;
	for (int i = 0; i < nt; i++) {
		snprintf(what, sizeof(what), "gpt block backward d %s", t[i].name);
		CU_ASSERT_EQUAL(cfx_close_norm(what, hg + off, g + off, t[i].numel, 1e-4), 0);
		off += t[i].numel;
	}
	free(hdx), free(hg);

	/* head: loss and probabilities, then backward into the head's grads and the tied dwte */
	float *hacts_cpu = cfx_floats(nhead);
	float wloss = gpt_cpu_head_forward(c, B, T, p + head, p, x, tgt, hacts_cpu);
	cuda_ctx_upload(cfx_ctx(), gx, x, btc * 4);
	float gloss = gpt_cuda_head_forward(cfx_ctx(), c, B, T, gp + head, gp, gx, gtgt, ghead);
	CU_ASSERT(fabsf(gloss - wloss) <= 1e-5f * fabsf(wloss));
	float *hh = cfx_down(ghead, ghead_n), *hp = cfx_floats((size_t)B * T * c->V);
	dense_probs(hp, gpt_cpu_head_probs(c, B, T, hh), (size_t)B * T, c->V);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt head probs", hp, gpt_cpu_head_probs(c, B, T, hacts_cpu),
				   (size_t)B * T * c->V, 1e-4),
			0);
	free(hp);
	gpt_cpu_head_backward(c, B, T, p + head, p, g + head, g, hacts_cpu, tgt, 1.0f, dx, scr);
	cuda_ctx_upload(cfx_ctx(), ghead, hh, ghead_n * 4); /* the GPU's own forward acts */
	gpt_cuda_head_backward(cfx_ctx(), c, B, T, gp + head, gp, gg + head, gg, ghead, gtgt, 1.0f, gy,
			       gscr);
	hdx = cfx_down(gy, btc);
	hg = cfx_down(gg, np);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt head backward dx", hdx, dx, btc, 1e-4), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt head backward d final_norm", hg + head, g + head, 2 * c->C,
				   1e-4),
			0);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt head backward d wte", hg, g, (size_t)c->V * c->C, 1e-4), 0);

	/* embeddings backward on top of the tied gradient */
	gpt_cpu_embed_backward(c, B, T, g, tok, dy);
	cuda_ctx_upload(cfx_ctx(), gy, dy, btc * 4);
	gpt_cuda_embed_backward(cfx_ctx(), c, B, T, gg, gtok, gy);
	free(hg);
	hg = cfx_down(gg, np);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt embed backward", hg, g, gpt_cpu_unit_params(c, 0), 1e-4), 0);

	free(p), free(tok), free(tgt), free(y), free(hy), free(x), free(acts), free(hacts);
	free(dy), free(dx), free(g), free(scr), free(hacts_cpu), free(hh), free(hdx), free(hg);
	cuda_ctx_free(gp), cuda_ctx_free(gg), cuda_ctx_free(gtok), cuda_ctx_free(gtgt);
	cuda_ctx_free(gx), cuda_ctx_free(gy), cuda_ctx_free(gacts), cuda_ctx_free(ghead);
	cuda_ctx_free(gscr);
}

/* The whole tiny model, units composed as gpt_cpu_forward / gpt_cpu_backward compose them, for a
 * few AdamW steps on the GPU and the CPU side by side: losses within 1e-4 relative each step
 * (the per-unit agreement, carried through steps that each move the weights by ~lr). */
static void test_gpt_training_steps(void)
{
	enum { B = 2, T = 16, STEPS = 3 };
	const GptConfig *c = &GPU_TINY;
	PxError err = {0};
	GptCpuBuffers cb;
	CU_ASSERT_EQUAL_FATAL(gpt_cpu_buffers_init(&cb, c, B, T, &err), 0);
	size_t np = gpt_cpu_n_params(c), btc = (size_t)B * T * c->C;
	size_t nblk = gpt_cpu_block_acts(c, B, T).total_elems;
	size_t nhead = gpt_cuda_head_act_bytes(c, PREC_F32, B, T) / 4;
	size_t nscr = gpt_cpu_scratch_bytes(c, B, T) / 4;
	float *p = cfx_floats(np), *g = cfx_floats(np), *m = cfx_floats(np), *v = cfx_floats(np);
	gpt_cpu_init(c, p, 9);
	int *tok = cfx_tokens((size_t)B * T, c->V, 161);
	int *tgt = cfx_tokens((size_t)B * T, c->V, 162);
	float *gp = cfx_up(p, np), *gg = cfx_up(NULL, np), *gm = cfx_up(NULL, np);
	float *gv = cfx_up(NULL, np);
	int *gtok = cfx_put(tok, (size_t)B * T * 4), *gtgt = cfx_put(tgt, (size_t)B * T * 4);
	float *gacts = cfx_up(NULL, nblk * c->L), *ghead = cfx_up(NULL, nhead);
	float *gscr = cfx_up(NULL, nscr);
	float *gs = cfx_up(NULL, btc);
	size_t head = gpt_cpu_unit_offset(c, c->L + 1);
	OpsAdamw h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0};
	for (long step = 1; step <= STEPS; step++) {
		float wloss = gpt_cpu_forward(&cb, p, tok, tgt);
		memset(g, 0, np * 4);
		gpt_cpu_backward(&cb, p, g, tok, tgt, 1.0f);
		ops_adamw_step(p, m, v, g, np, &h, step, 1.0f);

		gpt_cuda_embed_forward(cfx_ctx(), c, B, T, gp, gtok, gs);
		for (int l = 0; l < c->L; l++)
			gpt_cuda_block_forward(cfx_ctx(), c, B, T, gp + gpt_cpu_unit_offset(c, l + 1), gs,
					       gs, gacts + (size_t)l * nblk, NULL, NULL);
		float gloss = gpt_cuda_head_forward(cfx_ctx(), c, B, T, gp + head, gp, gs, gtgt, ghead);
		cuda_ctx_zero(cfx_ctx(), gg, np * 4);
		gpt_cuda_head_backward(cfx_ctx(), c, B, T, gp + head, gp, gg + head, gg, ghead, gtgt, 1.0f,
				       gs, gscr);
		for (int l = c->L - 1; l >= 0; l--) {
			size_t off = gpt_cpu_unit_offset(c, l + 1);
			gpt_cuda_block_backward(cfx_ctx(), c, B, T, gp + off, gg + off,
						gacts + (size_t)l * nblk, NULL, NULL, gs, gs,
						gscr);
		}
		gpt_cuda_embed_backward(cfx_ctx(), c, B, T, gg, gtok, gs);
		if (step == 1) {
			float *hg = cfx_down(gg, np);
			CU_ASSERT_EQUAL(cfx_close_norm("gpt model gradients", hg, g, np, 1e-4), 0);
			free(hg);
		}
		optim_cuda_adamw_step(cfx_ctx(), gp, gm, gv, gg, np, &h, step, 1.0f);
		if (!(fabsf(gloss - wloss) <= 1e-4f * wloss))
			fprintf(stderr, "\ngpt step %ld: loss %.7f on the GPU, %.7f on the CPU\n", step,
				gloss, wloss);
		CU_ASSERT(fabsf(gloss - wloss) <= 1e-4f * wloss);
	}
	free(p), free(g), free(m), free(v), free(tok), free(tgt);
	cuda_ctx_free(gp), cuda_ctx_free(gg), cuda_ctx_free(gm), cuda_ctx_free(gv);
	cuda_ctx_free(gtok), cuda_ctx_free(gtgt), cuda_ctx_free(gacts), cuda_ctx_free(ghead);
	cuda_ctx_free(gscr), cuda_ctx_free(gs);
	gpt_cpu_buffers_free(&cb);
}

/* gpt_cuda_block_backward puts the layernorm statistics (2 N floats) in wide_b and gives attention
 * wide_a's last three quarters (3 B T C floats), which hold its minimum, (B T C + 1) / 2 + T,
 * since B T C >= T. Checked at the extremes of the shapes. */
static void test_scratch_fits(void)
{
	const int shapes[][4] = {{2, 33, 96, 3}, {1, 1, 1, 1}, {8, 1024, 768, 12}, {1, 7, 64, 64}};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int B = shapes[i][0], T = shapes[i][1], C = shapes[i][2]; /* [3]: NH, unused */
		size_t btc = (size_t)B * T * C;
		CU_ASSERT(OPS_CUDA_ATTENTION_SCRATCH_MIN_ELEMS(B, T, C) <= 3 * btc);
		CU_ASSERT(OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(B * T) <= 4 * btc);
		/* the head: dlnf (B T C) then the statistics, inside 8 B T C */
		CU_ASSERT(btc + OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(B * T) <= 8 * btc);
	}
}

/* ---- 16-bit units ---- */

/* n t values as fp32 */
static float *widen16(const uint16_t *x, size_t n, PrecisionType t)
{
	float *y = cfx_floats(n);
	for (size_t i = 0; i < n; i++)
		y[i] = precision_load(x, i, t);
	return y;
}

/* A device t array as fp32 on the host */
static float *down16(const void *dev, size_t n, PrecisionType t)
{
	uint16_t *h = malloc(2 * n + 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(h);
	cuda_ctx_download(cfx_ctx(), h, dev, 2 * n);
	float *y = widen16(h, n, t);
	free(h);
	return y;
}

/* gpt16_cuda's units against gpt16_cpu's on the same 16-bit parameters and inputs. Both round at
 * the same points, so they differ only where an fp32 sum, added in another order (within the
 * per-op tolerances of test_kernels_cuda, 1e-5 relative or better), lands on the other side of a
 * rounding boundary of t: that value then differs by one ulp of t, 2u relative (u = 2^-8 bf16,
 * 2^-11 fp16), and an op downstream passes such a flip on at its condition (about 1 for these
 * normalised, init-scale values). Max-normwise per tensor: 4u for forward values (two flips'
 * worth on the largest element); 8u for the fp32 gradients, sums of products in which a
 * flipped rounded gradient (dy, d fc, d qkv) moves terms by 2u each, with cancellation over the
 * N = 66 rows; the embeddings' forward is one rounding of the same sum of two values: bit for
 * bit. The loss: an lnf flip moves a logit by at most 2u |w| |lnf| (|w| ~ 0.1 at init, |lnf| <
 * 4), 2e-3 at bf16, shared by N = 66 rows: 1e-3 absolute bounds it at both types. A wrong offset
 * or a missed rounding shows as O(1) or as a systematic 2^-8. */
static void check_gpt16_units(CudaDtype ct, PrecisionType t, double u)
{
	enum { B = 2, T = 33 };
	const GptConfig *c = &GPU_TINY;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(gpt16_check(c, t, B, T, &err), 0);
	size_t np = gpt_cpu_n_params(c), btc = (size_t)B * T * c->C;
	size_t nblk = gpt_cpu_block_acts(c, B, T).total_elems, vc = (size_t)c->V * c->C;
	size_t bhead = gpt16_head_act_bytes(c, t, B, T), bscr = gpt_cpu_scratch_bytes(c, B, T);
	size_t ghead_b = gpt_cuda_head_act_bytes(c, t, B, T);
	float *p32 = cfx_floats(np);
	gpt_cpu_init(c, p32, 5);
	uint16_t *p = cfx_round16(p32, np, ct); /* rounds p32 in place too */
	int *tok = cfx_tokens((size_t)B * T, c->V, 171), *tgt = cfx_tokens((size_t)B * T, c->V, 172);
	float *x32 = cfx_random(btc, 1, 173), *dy = cfx_random(btc, 1, 174);
	uint16_t *x = cfx_round16(x32, btc, ct);
	size_t blk = gpt_cpu_unit_offset(c, 1), head = gpt_cpu_unit_offset(c, c->L + 1);
	void *gp = cfx_put(p, 2 * np), *gx = cfx_put(x, 2 * btc), *gy = cfx_put(NULL, 2 * btc);
	void *gacts = cfx_put(NULL, 2 * nblk), *ghead = cfx_put(NULL, ghead_b);
	int *gtok = cfx_put(tok, (size_t)B * T * 4), *gtgt = cfx_put(tgt, (size_t)B * T * 4);
	float *gg = cfx_up(NULL, np), *gscr = cfx_up(NULL, bscr / 4), *gdx = cfx_up(NULL, btc);
	uint16_t *y = calloc(btc, 2), *acts = calloc(nblk, 2), *hacts = calloc(bhead, 1);
	float *g = cfx_floats(np), *dx = cfx_floats(btc), *scr = cfx_floats(bscr / 4);
	CU_ASSERT_PTR_NOT_NULL_FATAL(y && acts && hacts);
	char what[96];

	/* embeddings */
	gpt16_embed_forward(c, t, B, T, p, tok, y);
	gpt16_cuda_embed_forward(cfx_ctx(), c, ct, B, T, gp, gtok, gy);
	uint16_t *hy16 = malloc(2 * btc);
	cuda_ctx_download(cfx_ctx(), hy16, gy, 2 * btc);
	CU_ASSERT_EQUAL(cfx_same_bits("gpt16 embed forward", hy16, y, btc, 2), 0);
	free(hy16);

	/* block 1 forward: output and every saved activation */
	gpt16_block_forward(c, t, B, T, (char *)p + 2 * blk, x, y, acts);
	gpt16_cuda_block_forward(cfx_ctx(), c, ct, B, T, (char *)gp + 2 * blk, gx, gy, gacts, NULL);
	float *want = widen16(y, btc, t), *got = down16(gy, btc, t);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 block forward y", got, want, btc, 4 * u), 0);
	free(want), free(got);
	float *wacts = widen16(acts, nblk, t), *gacts_h = down16(gacts, nblk, t);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	size_t starts[] = {a.x_in, a.ln1, a.qkv, a.atty, a.res2, a.ln2, a.fc, a.gelu, a.att,
			   a.total_elems};
	const char *names[] = {"x_in", "ln1", "qkv", "atty", "res2", "ln2", "fc", "gelu", "att"};
	for (int i = 0; i < 9; i++) {
		snprintf(what, sizeof(what), "gpt16 block forward acts.%s", names[i]);
		CU_ASSERT_EQUAL(cfx_close_norm(what, gacts_h + starts[i], wacts + starts[i],
					       starts[i + 1] - starts[i], 4 * u),
				0);
	}
	free(wacts), free(gacts_h);

	/* block 1 backward from the CPU's activations, in place on the GPU */
	gpt16_block_backward(c, t, B, T, (char *)p + 2 * blk, g + blk, acts, dy, dx, scr);
	cuda_ctx_upload(cfx_ctx(), gacts, acts, 2 * nblk);
	cuda_ctx_upload(cfx_ctx(), gdx, dy, btc * 4);
	gpt16_cuda_block_backward(cfx_ctx(), c, ct, B, T, (char *)gp + 2 * blk, gg + blk, gacts, NULL,
				  gdx, gdx, gscr);
	float *hdx = cfx_down(gdx, btc), *hg = cfx_down(gg, np);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 block backward dx", hdx, dx, btc, 8 * u), 0);
	GptTensor tn[GPT_CPU_MAX_TENSORS];
	int nt = gpt_cpu_unit_tensors(c, 1, tn);
	for (int i = 0, off = (int)blk; i < nt; off += (int)tn[i].numel, i++) {
		snprintf(what, sizeof(what), "gpt16 block backward d %s", tn[i].name);
		CU_ASSERT_EQUAL(cfx_close_norm(what, hg + off, g + off, tn[i].numel, 8 * u), 0);
	}
	free(hdx), free(hg);

	/* head: loss and probabilities, then backward from the GPU's own forward */
	float wloss = gpt16_head_forward(c, t, B, T, (char *)p + 2 * head, p, x, tgt, hacts);
	float gloss = gpt16_cuda_head_forward(cfx_ctx(), c, ct, B, T, (char *)gp + 2 * head, gp, gx,
					      gtgt, ghead);
	CU_ASSERT(fabsf(gloss - wloss) <= 1e-3f);
	uint16_t *hh = malloc(ghead_b), *hd = malloc(bhead);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hh && hd);
	cuda_ctx_download(cfx_ctx(), hh, ghead, ghead_b);
	memcpy(hd, hh, 2 * 2 * btc); /* x_in and ln_f, then the probabilities made dense */
	dense_probs(gpt16_head_probs(c, t, B, T, hd), gpt16_head_probs(c, t, B, T, hh),
		    (size_t)B * T, c->V);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 head probs", gpt16_head_probs(c, t, B, T, hd),
				       gpt16_head_probs(c, t, B, T, hacts), (size_t)B * T * c->V,
				       4 * u),
			0);
	memcpy(hacts, hd, bhead); /* both backwards from the GPU's forward */
	free(hd);
	gpt16_head_backward(c, t, B, T, (char *)p + 2 * head, p, g + head, g, hacts, tgt, 1.0f, dx,
			    scr);
	gpt16_cuda_head_backward(cfx_ctx(), c, ct, B, T, (char *)gp + 2 * head, gp, gg + head, gg,
				 ghead, gtgt, 1.0f, gdx, gscr);
	hdx = cfx_down(gdx, btc);
	hg = cfx_down(gg, np);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 head backward dx", hdx, dx, btc, 8 * u), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 head backward d final_norm", hg + head, g + head,
				       2 * (size_t)c->C, 8 * u),
			0);
	CU_ASSERT_EQUAL(cfx_close_norm("gpt16 head backward d wte", hg, g, vc, 8 * u), 0);

	free(p32), free(p), free(tok), free(tgt), free(x32), free(dy), free(x), free(y), free(acts);
	free(hacts), free(g), free(dx), free(scr), free(hh), free(hdx), free(hg);
	cuda_ctx_free(gp), cuda_ctx_free(gx), cuda_ctx_free(gy), cuda_ctx_free(gacts);
	cuda_ctx_free(ghead), cuda_ctx_free(gtok), cuda_ctx_free(gtgt), cuda_ctx_free(gg);
	cuda_ctx_free(gscr), cuda_ctx_free(gdx);
}

static void test_gpt16_units_bf16(void)
{
	check_gpt16_units(CDT_BF16, PREC_BF16, 0x1p-8);
}

static void test_gpt16_units_f16(void)
{
	check_gpt16_units(CDT_F16, PREC_F16, 0x1p-11);
}

static const PxTestCase GPU_TESTS[] = {
	{"gpt units vs gpt_cpu", test_gpt_units},
	{"gpt training steps vs gpt_cpu", test_gpt_training_steps},
	{"gpt16 bf16 units vs gpt16_cpu", test_gpt16_units_bf16},
	{"gpt16 fp16 units vs gpt16_cpu", test_gpt16_units_f16},
};

static const PxTestCase CPU_TESTS[] = {
	{"gpu scratch fits in gpt_cpu's scratch", test_scratch_fits},
};

int test_gpt_cuda_register(void)
{
	return cfx_register("gpt_cuda", "test_gpt_cuda", CPU_TESTS,
			    (int)(sizeof(CPU_TESTS) / sizeof(CPU_TESTS[0])), GPU_TESTS,
			    (int)(sizeof(GPU_TESTS) / sizeof(GPU_TESTS[0])));
}

#else /* no CUDA at build time */

int test_gpt_cuda_register(void)
{
	printf("test_gpt_cuda: skipped: built without CUDA (no nvcc under CUDA_HOME); no tests "
	       "registered\n");
	return 0;
}

#endif
