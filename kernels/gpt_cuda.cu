/* gpt_cuda: gpt_cpu's units, op for op, on ops_cuda. Read beside gpt_cpu.c: the order of the ops,
 * the buffers and the scratch regions are the same, so the two can be checked line against line. */
#include "cuda_check.h"
#include "gpt_cuda.h"
#include "ops_cuda.h"

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
			    const float *x, float *y, float *acts)
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
	ops_cuda_attention_forward(ctx, acts + a.atty, acts + a.att, acts + a.qkv, B, T, C, c->NH);
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
 * wide_b, dead once its contents have been consumed; attention's per-row sums (B NH T <= B T C
 * floats) into wide_b's last quarter, past the 3 B T C of d qkv. */
void gpt_cuda_block_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			     float *grads, const float *acts, const float *dy, float *dx,
			     float *scratch)
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
	ops_cuda_attention_backward(ctx, wide_b, wide_a, acts + a.qkv, acts + a.att, B, T, C, c->NH,
				    wide_b + 3 * btc);
	cuda_ctx_zero(ctx, wide_a, btc * fsz);
	ops_cuda_matmul_backward(ctx, wide_a, grads + p.qkv_w, grads + p.qkv_b, wide_b, acts + a.ln1,
				 params + p.qkv_w, N, C, 3 * C);
	ops_cuda_layernorm_backward(ctx, dx, grads + p.ln1_w, grads + p.ln1_b, wide_a, acts + a.x_in,
				    params + p.ln1_w, N, C, wide_b);
}

/* ---- head ---- */

/* head activations, as gpt_cpu's: x_in (B, T, C) | ln_f (B, T, C) | probs (B, T, V) */

float gpt_cuda_head_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, const float *x, const int *targets, float *acts)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;

	cuda_ctx_copy(ctx, x_in, x, btc * sizeof(float));
	ops_cuda_layernorm_forward(ctx, lnf, NULL, NULL, x_in, params, params + C, N, C);
	ops_cuda_lm_head_forward(ctx, probs, lnf, wte, N, C, c->V);
	return ops_cuda_crossentropy_forward(ctx, probs, probs, targets, N, c->V);
}

void gpt_cuda_head_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, float *grads, float *dwte, float *acts,
			    const int *targets, float dloss, float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;
	float *dlnf = scratch, *ln_scratch = scratch + btc; /* 2 N more; scratch holds 8 B T C */

	ops_cuda_crossentropy_backward(ctx, probs, probs, targets, N, c->V, dloss);
	cuda_ctx_zero(ctx, dlnf, btc * sizeof(float));
	ops_cuda_lm_head_backward(ctx, dlnf, dwte, probs, lnf, wte, N, C, c->V);
	cuda_ctx_zero(ctx, dx, btc * sizeof(float));
	ops_cuda_layernorm_backward(ctx, dx, grads, grads + C, dlnf, x_in, params, N, C, ln_scratch);
}
