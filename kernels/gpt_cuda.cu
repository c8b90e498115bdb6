/* gpt_cuda: gpt_cpu's units, op for op, on ops_cuda. Read beside gpt_cpu.c: the order of the ops,
 * the buffers and the scratch regions are the same, so the two can be checked line against line. */
#include "cuda_check.h"
#include "gpt_cuda.h"
#include "ops16_cuda.h"
#include "ops_cuda.h"
#include "sparse_eager_cuda.h"

/* ---- embeddings ---- */

void gpt_cuda_embed_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const int *tokens, float *y)
{
	const float *wte = params, *wpe = params + (size_t)c->V * c->C;
	ops_cuda_embed_forward(ctx, y, tokens, wte, wpe, B, T, c->C);
}

void gpt_cuda_embed_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, float *grads,
			     const int *tokens, const float *dy)
{
	ops_cuda_embed_backward(ctx, grads, grads + (size_t)c->V * c->C, dy, tokens, B, T, c->C);
}

/* ---- transformer block ---- */

void gpt_cuda_block_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *x, float *y, float *acts, float *att,
			    const SparseIndexDev *ix)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);

	cuda_ctx_copy(ctx, acts + a.x_in, x, btc * sizeof(float)); /* lets y be x */
	ops_cuda_layernorm_forward(ctx, acts + a.ln1, NULL, NULL, acts + a.x_in, params + p.ln1_w,
				   params + p.ln1_b, N, C);
	ops_cuda_matmul_forward(ctx, acts + a.qkv, acts + a.ln1, params + p.qkv_w, params + p.qkv_b,
				N, C, 3 * C);
	if (ix) /* block-sparse: the kept blocks' probabilities in the scores' place */
		sparse_eager_cuda_forward(ctx, acts + a.atty, att ? att : acts + a.att, acts + a.qkv,
					  ix, B, T, C);
	else
		ops_cuda_attention_forward(ctx, acts + a.atty, att ? att : acts + a.att, acts + a.qkv,
					   B, T, C, c->NH);
	ops_cuda_matmul_forward(ctx, acts + a.res2, acts + a.atty, params + p.proj_w,
				params + p.proj_b, N, C, C);
	ops_cuda_residual_forward(ctx, acts + a.res2, acts + a.res2, acts + a.x_in, btc);
	ops_cuda_layernorm_forward(ctx, acts + a.ln2, NULL, NULL, acts + a.res2, params + p.ln2_w,
				   params + p.ln2_b, N, C);
	ops_cuda_matmul_forward(ctx, acts + a.fc, acts + a.ln2, params + p.fc_w, params + p.fc_b, N,
				C, 4 * C);
	ops_cuda_gelu_forward(ctx, acts + a.gelu, acts + a.fc, 4 * btc);
	ops_cuda_matmul_forward(ctx, y, acts + a.gelu, params + p.down_w, params + p.down_b, N,
				4 * C, C);
	ops_cuda_residual_forward(ctx, y, y, acts + a.res2, btc);
}

/* Scratch as gpt_cpu_block_backward's: wide_a and wide_b, (B, T, 4C) each. The GPU ops' own
 * scratch goes where the CPU's has nothing live: the layernorm statistics (2 N floats) into
 * wide_b, dead once its contents have been consumed; attention's score-gradient tiles into
 * wide_a's last three quarters (3 B T C floats), past d atty, dead until d ln1 is zeroed there. */
void gpt_cuda_block_scores(CudaCtx *ctx, const GptConfig *c, int B, int T, float *acts,
			   float *att, const SparseIndexDev *ix)
{
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	/* the forward's kernel on the same kept q, k, v: the same bits */
	if (ix)
		sparse_eager_cuda_forward(ctx, acts + a.atty, att, acts + a.qkv, ix, B, T, c->C);
	else
		ops_cuda_attention_forward(ctx, acts + a.atty, att, acts + a.qkv, B, T, c->C, c->NH);
}

void gpt_cuda_block_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			     float *grads, const float *acts, const float *att,
			     const SparseIndexDev *ix, const float *dy, float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C, fsz = sizeof(float);
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	float *wide_a = scratch, *wide_b = scratch + 4 * btc;

	/* MLP branch */
	cuda_ctx_zero(ctx, wide_a, 4 * btc * fsz);
	ops_cuda_matmul_backward(ctx, wide_a, grads + p.down_w, grads + p.down_b, dy, acts + a.gelu,
				 params + p.down_w, N, 4 * C, C);
	cuda_ctx_zero(ctx, wide_b, 4 * btc * fsz);
	ops_cuda_gelu_backward(ctx, wide_b, wide_a, acts + a.fc, 4 * btc);
	cuda_ctx_zero(ctx, wide_a, btc * fsz);
	ops_cuda_matmul_backward(ctx, wide_a, grads + p.fc_w, grads + p.fc_b, wide_b, acts + a.ln2,
				 params + p.fc_w, N, C, 4 * C);
	cuda_ctx_copy(ctx, dx, dy, btc * fsz); /* the residual path; nothing when dx is dy */
	ops_cuda_layernorm_backward(ctx, dx, grads + p.ln2_w, grads + p.ln2_b, wide_a, acts + a.res2,
				    params + p.ln2_w, N, C, wide_b);

	/* attention branch; dx holds d res2 */
	cuda_ctx_zero(ctx, wide_a, btc * fsz);
	ops_cuda_matmul_backward(ctx, wide_a, grads + p.proj_w, grads + p.proj_b, dx, acts + a.atty,
				 params + p.proj_w, N, C, C);
	cuda_ctx_zero(ctx, wide_b, 3 * btc * fsz);
	if (ix)
		sparse_eager_cuda_backward(ctx, wide_b, wide_a, acts + a.qkv,
					   att ? att : acts + a.att, ix, B, T, C);
	else
		ops_cuda_attention_backward(ctx, wide_b, wide_a, acts + a.qkv,
					    att ? att : acts + a.att, B, T, C, c->NH, wide_a + btc,
					    3 * btc);
	cuda_ctx_zero(ctx, wide_a, btc * fsz);
	ops_cuda_matmul_backward(ctx, wide_a, grads + p.qkv_w, grads + p.qkv_b, wide_b, acts + a.ln1,
				 params + p.qkv_w, N, C, 3 * C);
	ops_cuda_layernorm_backward(ctx, dx, grads + p.ln1_w, grads + p.ln1_b, wide_a, acts + a.x_in,
				    params + p.ln1_w, N, C, wide_b);
}

/* ---- head ---- */

size_t gpt_cuda_head_act_bytes(const GptConfig *c, PrecisionType t, int B, int T)
{
	return gpt16_head_act_bytes_ld(c, t, B, T, ops_cuda_logits_ld(c->V));
}

/* head activations, as gpt_cpu's but for the probabilities' rows, ld = ops_cuda_logits_ld(V)
 * apart (gpt_cuda_head_act_bytes): x_in (B, T, C) | ln_f (B, T, C) | probs (B, T, ld) */

float gpt_cuda_head_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, const float *x, const int *targets, float *acts)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;

	cuda_ctx_copy(ctx, x_in, x, btc * sizeof(float));
	ops_cuda_layernorm_forward(ctx, lnf, NULL, NULL, x_in, params, params + C, N, C);
	int ld = ops_cuda_logits_ld(c->V);
	ops_cuda_lm_head_forward(ctx, probs, lnf, wte, N, C, c->V, ld);
	return ops_cuda_crossentropy_forward(ctx, probs, probs, targets, N, c->V, ld);
}

void gpt_cuda_head_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, float *grads, float *dwte, float *acts,
			    const int *targets, float dloss, float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;
	float *dlnf = scratch, *ln_scratch = scratch + btc; /* 2 N more; scratch holds 8 B T C */

	int ld = ops_cuda_logits_ld(c->V);
	ops_cuda_crossentropy_backward(ctx, probs, probs, targets, N, c->V, ld, dloss);
	cuda_ctx_zero(ctx, dlnf, btc * sizeof(float));
	ops_cuda_lm_head_backward(ctx, dlnf, dwte, probs, lnf, wte, N, C, c->V, ld);
	cuda_ctx_zero(ctx, dx, btc * sizeof(float));
	ops_cuda_layernorm_backward(ctx, dx, grads, grads + C, dlnf, x_in, params, N, C, ln_scratch);
}

/* ---- 16-bit units: gpt16_cpu.c's, op for op ---- */

static PrecisionType prec(CudaDtype t)
{
	return t == CDT_BF16 ? PREC_BF16 : PREC_F16;
}

/* element i of a 16-bit array */
static void *el16(const void *base, size_t i)
{
	return (char *)base + 2 * i;
}

void gpt16_cuda_embed_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const int *tokens, void *y)
{
	ops16_cuda_embed_forward(ctx, t, y, tokens, params, el16(params, (size_t)c->V * c->C), B, T,
				 c->C);
}

#define P(f) el16(params, p.f)
#define A(f) el16(acts, a.f)

void gpt16_cuda_block_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *x, void *y, void *acts, void *att)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);

	cuda_ctx_copy(ctx, A(x_in), x, 2 * btc); /* lets y be x */
	ops16_cuda_layernorm_forward(ctx, t, A(ln1), A(x_in), P(ln1_w), P(ln1_b), N, C);
	ops16_cuda_matmul_forward(ctx, t, A(qkv), A(ln1), P(qkv_w), P(qkv_b), N, C, 3 * C);
	ops16_cuda_attention_forward(ctx, t, A(atty), att ? att : A(att), A(qkv), B, T, C, c->NH);
	ops16_cuda_matmul_forward(ctx, t, A(res2), A(atty), P(proj_w), P(proj_b), N, C, C);
	ops16_cuda_residual_forward(ctx, t, A(res2), A(res2), A(x_in), btc);
	ops16_cuda_layernorm_forward(ctx, t, A(ln2), A(res2), P(ln2_w), P(ln2_b), N, C);
	ops16_cuda_matmul_forward(ctx, t, A(fc), A(ln2), P(fc_w), P(fc_b), N, C, 4 * C);
	ops16_cuda_gelu_forward(ctx, t, A(gelu), A(fc), 4 * btc);
	ops16_cuda_matmul_forward(ctx, t, y, A(gelu), P(down_w), P(down_b), N, 4 * C, C);
	ops16_cuda_residual_forward(ctx, t, y, y, A(res2), btc);
}

/* gpt16_block_backward's scratch plan; the layernorm statistics (2 N floats) at wide_a + 3 BTC,
 * past the rounded d fc (2 BTC floats' worth) or d qkv (1.5 BTC); attention's rounded dout and
 * score-gradient tiles in wide_a past d atty (3 BTC floats) as in the fp32 unit: the statistics
 * there are dead between the two layernorms, and the rounded d qkv overwrites it all after. */
void gpt16_cuda_block_scores(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			     void *acts, void *att)
{
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	ops16_cuda_attention_forward(ctx, t, A(atty), att, A(qkv), B, T, c->C, c->NH);
}

void gpt16_cuda_block_backward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			       const void *params, float *grads, const void *acts, const void *att,
			       const float *dy, float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C, fsz = sizeof(float);
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	float *wide_a = scratch, *wide_b = scratch + 4 * btc, *ln_stats = wide_a + 3 * btc;

	/* MLP branch */
	ops16_cuda_round(ctx, t, wide_b, dy, btc);
	cuda_ctx_zero(ctx, wide_a, 4 * btc * fsz);
	ops_cuda_matmul_backward_16(ctx, t, wide_a, grads + p.down_w, grads + p.down_b, wide_b,
				    A(gelu), P(down_w), N, 4 * C, C);
	cuda_ctx_zero(ctx, wide_b, 4 * btc * fsz);
	ops16_cuda_gelu_backward(ctx, t, wide_b, wide_a, A(fc), 4 * btc);
	ops16_cuda_round(ctx, t, wide_a, wide_b, 4 * btc);
	cuda_ctx_zero(ctx, wide_b, btc * fsz);
	ops_cuda_matmul_backward_16(ctx, t, wide_b, grads + p.fc_w, grads + p.fc_b, wide_a, A(ln2),
				    P(fc_w), N, C, 4 * C);
	cuda_ctx_copy(ctx, dx, dy, btc * fsz); /* the residual path; nothing when dx is dy */
	ops16_cuda_layernorm_backward(ctx, t, dx, grads + p.ln2_w, grads + p.ln2_b, wide_b, A(res2),
				      P(ln2_w), N, C, ln_stats);

	/* attention branch; dx holds d res2 */
	ops16_cuda_round(ctx, t, wide_b, dx, btc);
	cuda_ctx_zero(ctx, wide_a, btc * fsz);
	ops_cuda_matmul_backward_16(ctx, t, wide_a, grads + p.proj_w, grads + p.proj_b, wide_b,
				    A(atty), P(proj_w), N, C, C);
	cuda_ctx_zero(ctx, wide_b, 3 * btc * fsz);
	ops16_cuda_attention_backward(ctx, t, wide_b, wide_a, A(qkv), att ? att : A(att), B, T, C,
				      c->NH, wide_a + btc, 3 * btc);
	ops16_cuda_round(ctx, t, wide_a, wide_b, 3 * btc);
	cuda_ctx_zero(ctx, wide_b, btc * fsz);
	ops_cuda_matmul_backward_16(ctx, t, wide_b, grads + p.qkv_w, grads + p.qkv_b, wide_a, A(ln1),
				    P(qkv_w), N, C, 3 * C);
	ops16_cuda_layernorm_backward(ctx, t, dx, grads + p.ln1_w, grads + p.ln1_b, wide_b, A(x_in),
				      P(ln1_w), N, C, ln_stats);
}

#undef P
#undef A

float gpt16_cuda_head_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *wte, const void *x,
			      const int *targets, void *acts)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	void *x_in = acts, *lnf = el16(acts, btc);
	float *probs = gpt16_head_probs(c, prec(t), B, T, acts);

	cuda_ctx_copy(ctx, x_in, x, 2 * btc);
	ops16_cuda_layernorm_forward(ctx, t, lnf, x_in, params, el16(params, C), N, C);
	int ld = ops_cuda_logits_ld(c->V);
	ops16_cuda_lm_head_forward(ctx, t, probs, lnf, wte, N, C, c->V, ld);
	return ops_cuda_crossentropy_forward(ctx, probs, probs, targets, N, c->V, ld);
}

/* gpt16_head_backward's chunks: dlnf at the scratch's start, the layernorm statistics after it,
 * the rounded rows of dlogits after those, ld apart as the probabilities' (so as many of them at
 * a time as gpt16_head_chunk_rows_ld allows for rows of ld). */
void gpt16_cuda_head_backward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *wte, float *grads, float *dwte,
			      void *acts, const int *targets, float dloss, float *dx,
			      float *scratch)
{
	int N = B * T, C = c->C, V = c->V, ld = ops_cuda_logits_ld(V);
	int rows = gpt16_head_chunk_rows_ld(c, prec(t), B, T, ld);
	CUDA_REQUIRE(rows >= 1, "gpt16_cuda_head_backward: no row of %d logits fits the scratch", ld);
	size_t btc = (size_t)N * C;
	void *x_in = acts, *lnf = el16(acts, btc);
	float *probs = gpt16_head_probs(c, prec(t), B, T, acts);
	float *dlnf = scratch, *ln_stats = scratch + btc, *d16 = ln_stats + 2 * (size_t)N;

	ops_cuda_crossentropy_backward(ctx, probs, probs, targets, N, V, ld, dloss);
	cuda_ctx_zero(ctx, dlnf, btc * sizeof(float));
	for (int r0 = 0; r0 < N; r0 += rows) {
		int n = N - r0 < rows ? N - r0 : rows;
		/* the padding columns go along, rounded and never read */
		ops16_cuda_round(ctx, t, d16, probs + (size_t)r0 * ld, (size_t)n * ld);
		ops16_cuda_lm_head_backward(ctx, t, dlnf + (size_t)r0 * C, dwte, d16,
					    el16(lnf, (size_t)r0 * C), wte, n, C, V, ld);
	}
	cuda_ctx_zero(ctx, dx, btc * sizeof(float));
	ops16_cuda_layernorm_backward(ctx, t, dx, grads, grads + C, dlnf, x_in, params, N, C,
				      ln_stats);
}
