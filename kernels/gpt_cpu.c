#include "gpt_cpu.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "par_cpu.h"
#include "rng.h"

/* ---- checks ---- */

int gpt_cpu_check(const GptConfig *c, int B, int T, PxError *err)
{
	if (c->V <= 0 || c->max_T <= 0 || c->C <= 0 || c->L <= 0 || c->NH <= 0)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_cpu: V, max_T, C, L and NH must be positive, got %d, %d, %d, %d, %d",
			       c->V, c->max_T, c->C, c->L, c->NH);
	if (c->C % c->NH)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_cpu: C (%d) must be a multiple of NH (%d)", c->C, c->NH);
	if (B <= 0 || T <= 0 || T > c->max_T)
		return px_fail(err, PX_ERR_INPUT,
			       "gpt_cpu: need B >= 1 and 1 <= T <= max_T (%d), got B = %d, T = %d",
			       c->max_T, B, T);
	if ((long long)B * T > INT_MAX)
		return px_fail(err, PX_ERR_INPUT, "gpt_cpu: B * T = %lld exceeds %d tokens",
			       (long long)B * T, INT_MAX);
	return 0;
}

int gpt_cpu_check_tokens(const GptConfig *c, const int *tokens, size_t n, PxError *err)
{
	for (size_t i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= c->V)
			return px_fail(err, PX_ERR_INPUT,
				       "gpt_cpu: token %zu is %d; tokens must be in [0, %d)", i,
				       tokens[i], c->V);
	return 0;
}

/* ---- parameter layout ---- */

static int add(GptTensor *t, int n, const char *name, size_t numel)
{
	t[n].name = name;
	t[n].numel = numel;
	return n + 1;
}

int gpt_cpu_unit_tensors(const GptConfig *c, int unit, GptTensor out[GPT_CPU_MAX_TENSORS])
{
	size_t C = (size_t)c->C;
	int n = 0;
	if (unit == 0) {
		n = add(out, n, "embed.tokens", (size_t)c->V * C);
		return add(out, n, "embed.positions", (size_t)c->max_T * C);
	}
	if (unit == c->L + 1) {
		n = add(out, n, "final_norm.weight", C);
		return add(out, n, "final_norm.bias", C);
	}
	if (unit < 0 || unit > c->L + 1)
		return 0;
	n = add(out, n, "norm1.weight", C);
	n = add(out, n, "norm1.bias", C);
	n = add(out, n, "attn.c_attn.weight", C * 3 * C);
	n = add(out, n, "attn.c_attn.bias", 3 * C);
	n = add(out, n, "attn.o.weight", C * C);
	n = add(out, n, "attn.o.bias", C);
	n = add(out, n, "norm2.weight", C);
	n = add(out, n, "norm2.bias", C);
	n = add(out, n, "mlp.fc.weight", C * 4 * C);
	n = add(out, n, "mlp.fc.bias", 4 * C);
	n = add(out, n, "mlp.down.weight", 4 * C * C);
	return add(out, n, "mlp.down.bias", C);
}

size_t gpt_cpu_unit_params(const GptConfig *c, int unit)
{
	GptTensor t[GPT_CPU_MAX_TENSORS];
	size_t sum = 0;
	int n = gpt_cpu_unit_tensors(c, unit, t);
	for (int i = 0; i < n; i++)
		sum += t[i].numel;
	return sum;
}

size_t gpt_cpu_unit_offset(const GptConfig *c, int unit)
{
	size_t off = 0;
	for (int u = 0; u < unit; u++)
		off += gpt_cpu_unit_params(c, u);
	return off;
}

size_t gpt_cpu_n_params(const GptConfig *c)
{
	return gpt_cpu_unit_offset(c, gpt_cpu_n_units(c));
}

GptBlockLayout gpt_cpu_block_layout(const GptConfig *c)
{
	/* offsets follow gpt_cpu_unit_tensors, so the names and the arithmetic cannot drift apart */
	GptTensor t[GPT_CPU_MAX_TENSORS];
	size_t off[GPT_CPU_MAX_TENSORS], sum = 0;
	int n = gpt_cpu_unit_tensors(c, 1, t);
	for (int i = 0; i < n; i++) {
		off[i] = sum;
		sum += t[i].numel;
	}
	return (GptBlockLayout){off[0], off[1], off[2], off[3], off[4],  off[5],
				off[6], off[7], off[8], off[9], off[10], off[11]};
}

/* ---- saved activations ---- */

GptBlockActs gpt_cpu_block_acts(const GptConfig *c, int B, int T)
{
	size_t btc = (size_t)B * T * c->C;
	GptBlockActs a;
	a.x_in = 0;
	a.ln1 = btc;
	a.qkv = 2 * btc;
	a.atty = 5 * btc;
	a.res2 = 6 * btc;
	a.ln2 = 7 * btc;
	a.fc = 8 * btc;
	a.gelu = 12 * btc;
	a.att = 16 * btc;
	a.total_elems = a.att + (size_t)B * c->NH * T * T;
	return a;
}

size_t gpt_cpu_block_act_bytes(const GptConfig *c, int B, int T)
{
	return gpt_cpu_block_acts(c, B, T).total_elems * sizeof(float);
}

static size_t head_act_elems(const GptConfig *c, int B, int T)
{
	return (size_t)B * T * (2 * (size_t)c->C + c->V);
}

size_t gpt_cpu_head_act_bytes(const GptConfig *c, int B, int T)
{
	return head_act_elems(c, B, T) * sizeof(float);
}

size_t gpt_cpu_scratch_bytes(const GptConfig *c, int B, int T)
{
	return 8 * (size_t)B * T * c->C * sizeof(float);
}

/* ---- embeddings ---- */

void gpt_cpu_embed_forward(const GptConfig *c, int B, int T, const float *params,
			   const int *tokens, float *y)
{
	const float *wte = params, *wpe = params + (size_t)c->V * c->C;
	ops_embed_forward(y, tokens, wte, wpe, B, T, c->C);
}

void gpt_cpu_embed_backward(const GptConfig *c, int B, int T, float *grads, const int *tokens,
			    const float *dy)
{
	ops_embed_backward(grads, grads + (size_t)c->V * c->C, dy, tokens, B, T, c->C);
}

/* ---- transformer block ---- */

void gpt_cpu_block_forward(const GptConfig *c, int B, int T, const float *params, const float *x,
			   float *y, float *acts)
{
	gpt_cpu_block_forward_att(c, B, T, params, x, y, acts, NULL, NULL);
}

/* The block with its probabilities in att: dense (ix NULL) or block-sparse over ix's blocks. */
static void block_forward(const GptConfig *c, int B, int T, const float *params, const float *x,
			  float *y, float *acts, float *att, const SparseIndex *ix)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);

	/* everything after this copy reads the kept input, which is what lets y be x */
	par_cpu_memcpy(acts + a.x_in, x, btc * sizeof(float));
	/* attention branch */
	ops_layernorm_forward(acts + a.ln1, NULL, NULL, acts + a.x_in, params + p.ln1_w,
			      params + p.ln1_b, N, C);
	ops_matmul_forward(acts + a.qkv, acts + a.ln1, params + p.qkv_w, params + p.qkv_b, N, C,
			   3 * C);
	if (ix)
		sparse_eager_forward(acts + a.atty, att, acts + a.qkv, ix, B, T, C);
	else
		ops_attention_forward(acts + a.atty, att, acts + a.qkv, B, T, C, c->NH);
	ops_matmul_forward(acts + a.res2, acts + a.atty, params + p.proj_w, params + p.proj_b, N, C,
			   C);
	ops_residual_forward(acts + a.res2, acts + a.res2, acts + a.x_in, btc);
	/* MLP branch */
	ops_layernorm_forward(acts + a.ln2, NULL, NULL, acts + a.res2, params + p.ln2_w,
			      params + p.ln2_b, N, C);
	ops_matmul_forward(acts + a.fc, acts + a.ln2, params + p.fc_w, params + p.fc_b, N, C, 4 * C);
	ops_gelu_forward(acts + a.gelu, acts + a.fc, 4 * btc);
	ops_matmul_forward(y, acts + a.gelu, params + p.down_w, params + p.down_b, N, 4 * C, C);
	ops_residual_forward(y, y, acts + a.res2, btc);
}

void gpt_cpu_block_forward_att(const GptConfig *c, int B, int T, const float *params,
			       const float *x, float *y, float *acts, float *att,
			       const SparseIndex *ix)
{
	block_forward(c, B, T, params, x, y, acts,
		      att ? att : acts + gpt_cpu_block_acts(c, B, T).att, ix);
}

/* Scratch is two (B, T, 4C) regions, wide_a and wide_b, reused stage by stage:
 *   MLP:       wide_a = d gelu, wide_b = d fc, then wide_a[0, BTC) = d ln2
 *   attention: wide_a[0, BTC) = d atty, wide_b[0, 3BTC) = d qkv, then wide_a[0, BTC) = d ln1
 * dx doubles as the gradient of res2 (dy plus the MLP branch's share through norm2), which needs
 * no buffer of its own: once dx starts changing, dy is never read again. */
void gpt_cpu_block_backward(const GptConfig *c, int B, int T, const float *params, float *grads,
			    const float *acts, const float *dy, float *dx, float *scratch)
{
	gpt_cpu_block_backward_att(c, B, T, params, grads, acts, NULL, NULL, dy, dx, scratch);
}

void gpt_cpu_block_scores(const GptConfig *c, int B, int T, float *acts, float *att,
			  const SparseIndex *ix)
{
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	/* the same arithmetic as the forward's on the same kept q, k, v: the same bits, the
	 * attention output rewritten with what it already holds */
	if (ix)
		sparse_eager_forward(acts + a.atty, att, acts + a.qkv, ix, B, T, c->C);
	else
		ops_attention_forward(acts + a.atty, att, acts + a.qkv, B, T, c->C, c->NH);
}

static void block_backward(const GptConfig *c, int B, int T, const float *params, float *grads,
			   const float *acts, const float *att, const SparseIndex *ix,
			   const float *dy, float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	GptBlockLayout p = gpt_cpu_block_layout(c);
	GptBlockActs a = gpt_cpu_block_acts(c, B, T);
	float *wide_a = scratch, *wide_b = scratch + 4 * btc;

	/* MLP branch: y = res2 + down(gelu(fc(ln2(res2)))) */
	par_cpu_memset(wide_a, 0, 4 * btc * sizeof(float));
	ops_matmul_backward(wide_a, grads + p.down_w, grads + p.down_b, dy, acts + a.gelu,
			    params + p.down_w, N, 4 * C, C);
	par_cpu_memset(wide_b, 0, 4 * btc * sizeof(float));
	ops_gelu_backward(wide_b, wide_a, acts + a.fc, 4 * btc);
	par_cpu_memset(wide_a, 0, btc * sizeof(float));
	ops_matmul_backward(wide_a, grads + p.fc_w, grads + p.fc_b, wide_b, acts + a.ln2,
			    params + p.fc_w, N, C, 4 * C);
	if (dx != dy)
		par_cpu_memcpy(dx, dy, btc * sizeof(float)); /* the residual path */
	ops_layernorm_backward(dx, grads + p.ln2_w, grads + p.ln2_b, wide_a, acts + a.res2,
			       params + p.ln2_w, N, C);

	/* attention branch: res2 = x + o(attention(qkv(ln1(x)))); dx now holds d res2 */
	par_cpu_memset(wide_a, 0, btc * sizeof(float));
	ops_matmul_backward(wide_a, grads + p.proj_w, grads + p.proj_b, dx, acts + a.atty,
			    params + p.proj_w, N, C, C);
	par_cpu_memset(wide_b, 0, 3 * btc * sizeof(float));
	if (ix)
		sparse_eager_backward(wide_b, wide_a, acts + a.qkv, att, ix, B, T, C);
	else
		ops_attention_backward(wide_b, wide_a, acts + a.qkv, att, B, T, C, c->NH);
	par_cpu_memset(wide_a, 0, btc * sizeof(float));
	ops_matmul_backward(wide_a, grads + p.qkv_w, grads + p.qkv_b, wide_b, acts + a.ln1,
			    params + p.qkv_w, N, C, 3 * C);
	ops_layernorm_backward(dx, grads + p.ln1_w, grads + p.ln1_b, wide_a, acts + a.x_in,
			       params + p.ln1_w, N, C);
}

void gpt_cpu_block_backward_att(const GptConfig *c, int B, int T, const float *params,
				float *grads, const float *acts, const float *att,
				const SparseIndex *ix, const float *dy, float *dx, float *scratch)
{
	block_backward(c, B, T, params, grads, acts,
		       att ? att : acts + gpt_cpu_block_acts(c, B, T).att, ix, dy, dx, scratch);
}

size_t gpt_cpu_block_sparse_act_bytes(const GptConfig *c, int B, int T, const SparseIndex *ix)
{
	return 4 * (gpt_cpu_block_acts(c, B, T).att + sparse_eager_probs_elems(ix, B));
}

/* ---- head ---- */

/* head activations: x_in (B, T, C) | ln_f (B, T, C) | probs (B, T, V) */

float gpt_cpu_head_forward(const GptConfig *c, int B, int T, const float *params, const float *wte,
			   const float *x, const int *targets, float *acts)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;

	par_cpu_memcpy(x_in, x, btc * sizeof(float));
	ops_layernorm_forward(lnf, NULL, NULL, x_in, params, params + C, N, C);
	ops_lm_head_forward(probs, lnf, wte, N, C, c->V);
	return ops_crossentropy_forward(probs, probs, targets, N, c->V);
}

const float *gpt_cpu_head_probs(const GptConfig *c, int B, int T, const float *acts)
{
	return acts + 2 * (size_t)B * T * c->C;
}

void gpt_cpu_head_backward(const GptConfig *c, int B, int T, const float *params, const float *wte,
			   float *grads, float *dwte, float *acts, const int *targets, float dloss,
			   float *dx, float *scratch)
{
	int N = B * T, C = c->C;
	size_t btc = (size_t)N * C;
	float *x_in = acts, *lnf = acts + btc, *probs = acts + 2 * btc;
	float *dlnf = scratch;

	ops_crossentropy_backward(probs, probs, targets, N, c->V, dloss);
	par_cpu_memset(dlnf, 0, btc * sizeof(float));
	ops_lm_head_backward(dlnf, dwte, probs, lnf, wte, N, C, c->V);
	par_cpu_memset(dx, 0, btc * sizeof(float));
	ops_layernorm_backward(dx, grads, grads + C, dlnf, x_in, params, N, C);
}

/* ---- initialisation ---- */

static void fill_normal(float *x, size_t n, float std, uint64_t seed, uint64_t stream)
{
	PxRng r;
	rng_init(&r, seed, stream);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(std * rng_normal(&r));
}

static void fill(float *x, size_t n, float value)
{
	for (size_t i = 0; i < n; i++)
		x[i] = value;
}

void gpt_cpu_init_unit(const GptConfig *c, int unit, float *params, uint64_t seed)
{
	GptTensor t[GPT_CPU_MAX_TENSORS];
	int n = gpt_cpu_unit_tensors(c, unit, t);
	/* GPT-2 scales the weights that write into the residual stream by 1/sqrt(number of residual
	 * additions) = 1/sqrt(2L), so the stream's variance does not grow with depth */
	float resid_std = GPT_CPU_INIT_STD / sqrtf(2.0f * (float)c->L);
	for (int i = 0; i < n; i++) {
		const char *name = t[i].name;
		size_t len = strlen(name);
		/* stream = (unit, tensor): fixed by the layout alone, not by earlier units' sizes */
		uint64_t stream = (uint64_t)unit * GPT_CPU_MAX_TENSORS + (uint64_t)i + 1;
		if (len >= 5 && strcmp(name + len - 5, ".bias") == 0)
			fill(params, t[i].numel, 0.0f);
		else if (strstr(name, "norm"))
			fill(params, t[i].numel, 1.0f);
		else if (!strcmp(name, "attn.o.weight") || !strcmp(name, "mlp.down.weight"))
			fill_normal(params, t[i].numel, resid_std, seed, stream);
		else
			fill_normal(params, t[i].numel, GPT_CPU_INIT_STD, seed, stream);
		params += t[i].numel;
	}
}

void gpt_cpu_init(const GptConfig *c, float *params, uint64_t seed)
{
	for (int u = 0; u < gpt_cpu_n_units(c); u++)
		gpt_cpu_init_unit(c, u, params + gpt_cpu_unit_offset(c, u), seed);
}

/* ---- whole model ---- */

int gpt_cpu_buffers_init(GptCpuBuffers *b, const GptConfig *c, int B, int T, PxError *err)
{
	memset(b, 0, sizeof(*b));
	if (gpt_cpu_check(c, B, T, err))
		return -1;
	size_t block = gpt_cpu_block_acts(c, B, T).total_elems, btc = (size_t)B * T * c->C;
	size_t head = head_act_elems(c, B, T), scratch = gpt_cpu_scratch_bytes(c, B, T) / sizeof(float);
	size_t total = (size_t)c->L * block + head + 2 * btc + scratch;
	b->slab = malloc(total * sizeof(float));
	if (!b->slab)
		return px_fail(err, PX_ERR_RUNTIME,
			       "gpt_cpu: out of memory for %zu bytes of activations; lower B or T",
			       total * sizeof(float));
	b->cfg = *c;
	b->B = B;
	b->T = T;
	b->block_acts = b->slab;
	b->head_acts = b->block_acts + (size_t)c->L * block;
	b->stream = b->head_acts + head;
	b->dstream = b->stream + btc;
	b->scratch = b->dstream + btc;
	return 0;
}

void gpt_cpu_buffers_free(GptCpuBuffers *b)
{
	if (!b)
		return;
	free(b->slab);
	memset(b, 0, sizeof(*b));
}

float gpt_cpu_forward(GptCpuBuffers *b, const float *params, const int *tokens,
		      const int *targets)
{
	const GptConfig *c = &b->cfg;
	size_t block = gpt_cpu_block_acts(c, b->B, b->T).total_elems;
	gpt_cpu_embed_forward(c, b->B, b->T, params, tokens, b->stream);
	for (int l = 0; l < c->L; l++)
		gpt_cpu_block_forward(c, b->B, b->T, params + gpt_cpu_unit_offset(c, l + 1),
				      b->stream, b->stream, b->block_acts + (size_t)l * block);
	return gpt_cpu_head_forward(c, b->B, b->T, params + gpt_cpu_unit_offset(c, c->L + 1),
				    params, b->stream, targets, b->head_acts);
}

void gpt_cpu_backward(GptCpuBuffers *b, const float *params, float *grads, const int *tokens,
		      const int *targets, float dloss)
{
	const GptConfig *c = &b->cfg;
	size_t block = gpt_cpu_block_acts(c, b->B, b->T).total_elems;
	size_t head = gpt_cpu_unit_offset(c, c->L + 1);
	/* the tied head's embedding gradient lands in unit 0's embed.tokens, before the embeddings'
	 * own backward adds theirs */
	gpt_cpu_head_backward(c, b->B, b->T, params + head, params, grads + head, grads, b->head_acts,
			      targets, dloss, b->dstream, b->scratch);
	for (int l = c->L - 1; l >= 0; l--) {
		size_t off = gpt_cpu_unit_offset(c, l + 1);
		gpt_cpu_block_backward(c, b->B, b->T, params + off, grads + off,
				       b->block_acts + (size_t)l * block, b->dstream, b->dstream,
				       b->scratch);
	}
	gpt_cpu_embed_backward(c, b->B, b->T, grads, tokens, b->dstream);
}
