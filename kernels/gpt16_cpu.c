#include "gpt16_cpu.h"

#include <string.h>

#include "ops16_cpu.h"
#include "ops_cpu.h"
#include "par_cpu.h"

/* ---- sizes ---- */

/* where the head's dlogits chunks start in the scratch, in floats: past dlnf (B T C) and the
 * CUDA layernorm's row statistics (2 N) */
static size_t chunk_off(const GptConfig *c, int B, int T)
{
	return (size_t)B * T * c->C + 2 * (size_t)B * T;
}

int gpt16_head_chunk_rows_ld(const GptConfig *c, PrecisionType t, int B, int T, int ld)
{
	size_t cap = gpt_cpu_scratch_bytes(c, B, T) - chunk_off(c, B, T) * sizeof(float);
	size_t rows = cap / (precision_bytes(t) * (size_t)ld), n = (size_t)B * T;
	return (int)(rows < n ? rows : n);
}

int gpt16_head_chunk_rows(const GptConfig *c, PrecisionType t, int B, int T)
{
	return gpt16_head_chunk_rows_ld(c, t, B, T, c->V);
}

int gpt16_check(const GptConfig *c, PrecisionType t, int B, int T, PxError *err)
{
	if (gpt_cpu_check(c, B, T, err))
		return -1;
	if (gpt16_head_chunk_rows(c, t, B, T) < 1)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt16_cpu: V (%d) too large for the head's scratch at B T C = %lld; "
			       "raise B or T", c->V, (long long)B * T * c->C);
	return 0;
}

size_t gpt16_block_act_bytes(const GptConfig *c, PrecisionType t, int B, int T)
{
	return gpt_cpu_block_acts(c, B, T).total_elems * precision_bytes(t);
}

size_t gpt16_block_sparse_act_bytes(const GptConfig *c, PrecisionType t, int B, int T,
				    const SparseIndex *ix)
{
	return (gpt_cpu_block_acts(c, B, T).att + sparse_eager_probs_elems(ix, B)) *
	       precision_bytes(t);
}

size_t gpt16_head_act_bytes_ld(const GptConfig *c, PrecisionType t, int B, int T, int ld)
{
	size_t bt = (size_t)B * T;
	return bt * (2 * (size_t)c->C * precision_bytes(t) + 4 * (size_t)ld);
}

size_t gpt16_head_act_bytes(const GptConfig *c, PrecisionType t, int B, int T)
{
	return gpt16_head_act_bytes_ld(c, t, B, T, c->V);
}

float *gpt16_head_probs(const GptConfig *c, PrecisionType t, int B, int T, void *acts)
{
	return precision_at(acts, 2 * (size_t)B * T * c->C, t);
}

/* ---- embeddings ---- */

void gpt16_embed_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const int *tokens, void *y)
{
	const void *wpe = precision_at(params, (size_t)c->V * c->C, t);
	ops16_embed_forward(t, y, tokens, params, wpe, B, T, c->C);
}

/* ---- transformer block ---- */

#define P(f) precision_at(params, p->f, t)
#define A(f) precision_at(acts, a->f, t)

/* The attention branch, dense (ix NULL) or block-sparse over ix's blocks, whose probabilities
 * then lie where the dense (B, NH, T, T) would begin; att, when not NULL, holds the dense
 * probabilities instead (selective recompute's, apart from acts) */
static void attention_forward(const GptConfig *c, PrecisionType t, int B, int T,
			      const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			      void *acts, void *att, const SparseIndex *ix)
{
	int N = B * T, C = c->C;
	void *probs = att ? att : A(att);
	ops16_layernorm_forward(t, A(ln1), A(x_in), P(ln1_w), P(ln1_b), N, C);
	ops16_matmul_forward(t, A(qkv), A(ln1), P(qkv_w), P(qkv_b), N, C, 3 * C);
	if (ix)
		ops16_sparse_attention_forward(t, A(atty), probs, A(qkv), ix, B, T, C);
	else
		ops16_attention_forward(t, A(atty), probs, A(qkv), B, T, C, c->NH);
	ops16_matmul_forward(t, A(res2), A(atty), P(proj_w), P(proj_b), N, C, C);
	ops16_residual_forward(t, A(res2), A(res2), A(x_in), (size_t)N * C);
}

void gpt16_attention_forward(const GptConfig *c, PrecisionType t, int B, int T,
			     const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			     void *acts, void *att, const SparseIndex *ix)
{
	attention_forward(c, t, B, T, p, a, params, acts, att, ix);
}

static void block_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			  const void *x, void *y, void *acts, void *att, const SparseIndex *ix)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	GptBlockLayout lay = gpt_cpu_block_layout(c), *p = &lay;
	GptBlockActs offs = gpt_cpu_block_acts(c, B, T), *a = &offs;

	par_cpu_memcpy(A(x_in), x, btc * precision_bytes(t)); /* lets y be x */
	attention_forward(c, t, B, T, p, a, params, acts, att, ix);
	ops16_layernorm_forward(t, A(ln2), A(res2), P(ln2_w), P(ln2_b), N, C);
	ops16_matmul_forward(t, A(fc), A(ln2), P(fc_w), P(fc_b), N, C, 4 * C);
	ops16_gelu_forward(t, A(gelu), A(fc), 4 * btc);
	ops16_matmul_forward(t, y, A(gelu), P(down_w), P(down_b), N, 4 * C, C);
	ops16_residual_forward(t, y, y, A(res2), btc);
}

void gpt16_block_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *x, void *y, void *acts)
{
	block_forward(c, t, B, T, params, x, y, acts, NULL, NULL);
}

void gpt16_block_forward_att(const GptConfig *c, PrecisionType t, int B, int T,
			     const void *params, const void *x, void *y, void *acts, void *att,
			     const SparseIndex *ix)
{
	block_forward(c, t, B, T, params, x, y, acts, att, ix);
}

void gpt16_block_scores(const GptConfig *c, PrecisionType t, int B, int T, void *acts, void *att,
			const SparseIndex *ix)
{
	GptBlockActs offs = gpt_cpu_block_acts(c, B, T), *a = &offs;
	/* the forward's arithmetic on the same kept q, k, v: the same bits, the attention output
	 * rewritten with what it already holds */
	if (ix)
		ops16_sparse_attention_forward(t, A(atty), att, A(qkv), ix, B, T, c->C);
	else
		ops16_attention_forward(t, A(atty), att, A(qkv), B, T, c->C, c->NH);
}

/* Scratch as gpt_cpu_block_backward's, wide_a and wide_b of 4 B T C floats, with the gradients
 * each matrix product takes rounded to t first (16-bit GEMM operands), parked where the fp32
 * region they came from, or one already consumed, lies dead:
 *   MLP:       wide_b <- rn(dy); wide_a = d gelu; wide_b = d fc; wide_a <- rn(d fc);
 *              wide_b[0, BTC) = d ln2
 *   attention: wide_b <- rn(d res2); wide_a[0, BTC) = d atty; wide_b[0, 3BTC) = d qkv;
 *              wide_a <- rn(d qkv); wide_b[0, BTC) = d ln1
 * The CUDA twin puts its layernorm statistics at wide_a + 3 BTC (and the head's at dlnf's end),
 * its attention's rounded dout and score-gradient tiles at wide_a + BTC (3 BTC floats): regions
 * dead at the time. */
static void attention_backward(const GptConfig *c, PrecisionType t, int B, int T,
			       const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			       float *grads, const void *acts, float *dx, float *scratch,
			       const void *att, const SparseIndex *ix)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C, fsz = sizeof(float);
	float *wide_a = scratch, *wide_b = scratch + 4 * btc;
	const void *probs = att ? att : A(att);

	ops16_round(t, wide_b, dx, btc);
	par_cpu_memset(wide_a, 0, btc * fsz);
	ops16_matmul_backward(t, wide_a, grads + p->proj_w, grads + p->proj_b, wide_b, A(atty),
			      P(proj_w), N, C, C);
	par_cpu_memset(wide_b, 0, 3 * btc * fsz);
	if (ix)
		ops16_sparse_attention_backward(t, wide_b, wide_a, A(qkv), probs, ix, B, T, C);
	else
		ops16_attention_backward(t, wide_b, wide_a, A(qkv), probs, B, T, C, c->NH);
	ops16_round(t, wide_a, wide_b, 3 * btc);
	par_cpu_memset(wide_b, 0, btc * fsz);
	ops16_matmul_backward(t, wide_b, grads + p->qkv_w, grads + p->qkv_b, wide_a, A(ln1),
			      P(qkv_w), N, C, 3 * C);
	ops16_layernorm_backward(t, dx, grads + p->ln1_w, grads + p->ln1_b, wide_b, A(x_in),
				 P(ln1_w), N, C);
}

void gpt16_attention_backward(const GptConfig *c, PrecisionType t, int B, int T,
			      const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			      float *grads, const void *acts, const void *att, const SparseIndex *ix,
			      float *dx, float *scratch)
{
	attention_backward(c, t, B, T, p, a, params, grads, acts, dx, scratch, att, ix);
}

static void block_backward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			   float *grads, const void *acts, const float *dy, float *dx, float *scratch,
			   const void *att, const SparseIndex *ix)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C, fsz = sizeof(float);
	GptBlockLayout lay = gpt_cpu_block_layout(c), *p = &lay;
	GptBlockActs offs = gpt_cpu_block_acts(c, B, T), *a = &offs;
	float *wide_a = scratch, *wide_b = scratch + 4 * btc;

	/* MLP branch */
	ops16_round(t, wide_b, dy, btc);
	par_cpu_memset(wide_a, 0, 4 * btc * fsz);
	ops16_matmul_backward(t, wide_a, grads + p->down_w, grads + p->down_b, wide_b, A(gelu),
			      P(down_w), N, 4 * C, C);
	par_cpu_memset(wide_b, 0, 4 * btc * fsz);
	ops16_gelu_backward(t, wide_b, wide_a, A(fc), 4 * btc);
	ops16_round(t, wide_a, wide_b, 4 * btc);
	par_cpu_memset(wide_b, 0, btc * fsz);
	ops16_matmul_backward(t, wide_b, grads + p->fc_w, grads + p->fc_b, wide_a, A(ln2),
			      P(fc_w), N, C, 4 * C);
	if (dx != dy)
		par_cpu_memcpy(dx, dy, btc * fsz); /* the residual path */
	ops16_layernorm_backward(t, dx, grads + p->ln2_w, grads + p->ln2_b, wide_b, A(res2),
				 P(ln2_w), N, C);

	/* attention branch; dx holds d res2 */
	attention_backward(c, t, B, T, p, a, params, grads, acts, dx, scratch, att, ix);
}

void gpt16_block_backward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			  float *grads, const void *acts, const float *dy, float *dx, float *scratch)
{
	block_backward(c, t, B, T, params, grads, acts, dy, dx, scratch, NULL, NULL);
}

void gpt16_block_backward_att(const GptConfig *c, PrecisionType t, int B, int T,
			      const void *params, float *grads, const void *acts, const void *att,
			      const SparseIndex *ix, const float *dy, float *dx, float *scratch)
{
	block_backward(c, t, B, T, params, grads, acts, dy, dx, scratch, att, ix);
}
#undef P
#undef A

/* ---- head ---- */

/* head activations: x_in (B, T, C) and ln_f (B, T, C) of type t | probs (B, T, V) fp32 */

float gpt16_head_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *wte, const void *x, const int *targets, void *acts)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	void *x_in = acts, *lnf = precision_at(acts, btc, t);
	float *probs = gpt16_head_probs(c, t, B, T, acts);

	par_cpu_memcpy(x_in, x, btc * precision_bytes(t));
	ops16_layernorm_forward(t, lnf, x_in, params, precision_at(params, C, t), N, C);
	ops16_lm_head_forward(t, probs, lnf, wte, N, C, c->V);
	return ops_crossentropy_forward(probs, probs, targets, N, c->V);
}

/* dlogits (fp32, in place of the probabilities) go through the two products in chunks of
 * gpt16_head_chunk_rows rows, each rounded to t into the scratch: rows of dx are independent and
 * dwte sums chunk by chunk, so only dwte's order of summation depends on the chunking. */
void gpt16_head_backward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *wte, float *grads, float *dwte, void *acts,
			 const int *targets, float dloss, float *dx, float *scratch)
{
	int N = B * T, C = c->C, V = c->V, rows = gpt16_head_chunk_rows(c, t, B, T);
	size_t btc = (size_t)N * C;
	void *x_in = acts, *lnf = precision_at(acts, btc, t), *d16 = scratch + chunk_off(c, B, T);
	float *probs = gpt16_head_probs(c, t, B, T, acts), *dlnf = scratch;

	ops_crossentropy_backward(probs, probs, targets, N, V, dloss);
	par_cpu_memset(dlnf, 0, btc * sizeof(float));
	for (int r0 = 0; r0 < N; r0 += rows) {
		int n = N - r0 < rows ? N - r0 : rows;
		ops16_round(t, d16, probs + (size_t)r0 * V, (size_t)n * V);
		ops16_lm_head_backward(t, dlnf + (size_t)r0 * C, dwte, d16,
				       precision_at(lnf, (size_t)r0 * C, t), wte, n, C, V);
	}
	par_cpu_memset(dx, 0, btc * sizeof(float));
	ops16_layernorm_backward(t, dx, grads, grads + C, dlnf, x_in, params, N, C);
}
