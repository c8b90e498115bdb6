#include "activ.h"

/* Per block, in elements of s*b (d = element bytes, m = 1 byte per dropout mask when dropout is on):
 *   kept whole on every tensor-parallel rank (split by t only with sequence parallelism):
 *     attention: norm1 input h, QKV input h, output dropout mask     -> 2dh + mh
 *     MLP: norm2 input h, MLP input h, output dropout mask            -> 2dh + mh
 *                                                              (together 10h in 16-bit)
 *   split by t: Q h, K kv, V kv, output-projection input h           -> d(2h + 2kv)
 *     MLP fc output I and GELU output I (gated MLP: gate I, silu(gate) I, up I and their
 *     product I, as autograd keeps them)                             -> 2dI (4dI)
 *                                                              (together 24h)
 *   attention scores, per head a*s: softmax output d, dropout mask m, dropout output d
 *                                                                     -> (2d + m)as  (= 5as)
 *     or, with FlashAttention, the fp32 log-sum-exp of each head's row -> 4a
 *     (FlashAttention-2 regenerates its dropout mask from the RNG state in backward) */
typedef struct BlockParts {
	double attn_repl, attn_split, scores, mlp_repl, mlp_split;
} BlockParts;

static BlockParts block_parts(const ModelSpec *m, const ActivShape *x)
{
	double d = x->elem_bytes, mask = m->dropout ? 1 : 0;
	double h = (double)m->h, kv = (double)(m->kv_heads * (m->h / m->a)), I = (double)m->I;
	double sb = (double)x->s * (double)x->b;
	BlockParts p;

	p.attn_repl = sb * (2 * d * h + mask * h);
	p.attn_split = sb * d * (2 * h + 2 * kv);
	p.scores = x->flash ? sb * (double)m->a * 4 :
			      sb * (double)m->a * (double)x->s * (d + mask + (m->dropout ? d : 0));
	p.mlp_repl = sb * (2 * d * h + mask * h);
	p.mlp_split = sb * d * (m->gated_mlp ? 4 : 2) * I;
	return p;
}

/* the scores a block keeps on this rank (with FlashAttention: the log-sum-exps) */
static double kept_scores(const BlockParts *p, const ActivShape *x, CkptMode mode)
{
	int recomputed = mode == CKPT_SELECTIVE && !x->flash;
	return recomputed ? 0 : p->scores / x->t;
}

static double attention_bytes(const BlockParts *p, const ActivShape *x, CkptMode mode)
{
	double t = x->t, repl = x->sp ? p->attn_repl / t : p->attn_repl;
	return repl + p->attn_split / t + kept_scores(p, x, mode);
}

double activ_block_scores_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode)
{
	if (m->arch == ARCH_PARAMS_ONLY || x->flash)
		return 0;
	BlockParts p = block_parts(m, x);
	return kept_scores(&p, x, mode);
}

double activ_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	BlockParts p = block_parts(m, x);
	double t = x->t, mlp_repl = x->sp ? p.mlp_repl / t : p.mlp_repl;
	return attention_bytes(&p, x, mode) + mlp_repl + p.mlp_split / t;
}

/* An MoE block keeps the attention part as a dense block does; its MLP keeps, on this rank:
 * norm2 input (d per token), the router's fp32 logits and probabilities (8E bytes per token),
 * the dispatched tokens the local experts receive (slots x h) with the experts' intermediates as
 * a dense MLP's (slots x 2I, gated 4I), the combined outputs coming back (slots x h), and the
 * output dropout mask. Experts are not split by tensor parallelism. */
double activ_moe_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode,
			     long long slots)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	BlockParts p = block_parts(m, x);
	double d = x->elem_bytes, sb = (double)x->s * (double)x->b, n = (double)slots;
	double h = (double)m->h, I = (double)m->I, mask = m->dropout ? 1 : 0;
	double mlp = sb * (d * h + 8.0 * (double)m->experts + mask * h) +
		     n * d * (2 * h + (m->gated_mlp ? 4 : 2) * I);
	return attention_bytes(&p, x, mode) + mlp;
}

double activ_checkpoint_bytes(const ModelSpec *m, const ActivShape *x, int partitioned)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	double input = (double)x->s * (double)x->b * (double)m->h * x->elem_bytes;
	return (x->sp || partitioned) ? input / x->t : input;
}

/* Korthikanti's (sbhL/t)(p/L + δ(p=1)(4/L)(1 + V/h)): the first stage keeps an embedding dropout
 * mask of sbh per micro-batch in flight (the p/L term); the last keeps the final norm's input and
 * output (2d sbh) and the softmax in fp32 (4 sbV): 4sbh + 4sbV in 16-bit. */
double activ_embed_bytes(const ModelSpec *m, const ActivShape *x)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	double sb = (double)x->s * (double)x->b;
	return sb * (double)m->h * (m->dropout ? 1 : 0) / x->t;
}

double activ_head_bytes(const ModelSpec *m, const ActivShape *x)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	double d = x->elem_bytes, sb = (double)x->s * (double)x->b;
	double head = sb * (double)m->h * 2 * d;
	if (m->has_lm_head)
		head += sb * (double)m->V * 4;
	return head / x->t;
}

double activ_ends_bytes(const ModelSpec *m, const ActivShape *x)
{
	return activ_embed_bytes(m, x) + activ_head_bytes(m, x);
}
