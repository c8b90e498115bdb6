#include "activ.h"

/* Per block, in elements of s*b (d = element bytes, m = 1 byte per dropout mask when dropout is on):
 *   kept whole on every tensor-parallel rank (split by t only with sequence parallelism):
 *     norm1 input h, QKV input h, attention-output dropout mask, norm2 input h, MLP input h,
 *     MLP-output dropout mask                                   -> 4dh + 2mh   (= 10h in 16-bit)
 *   split by t: Q h, K kv, V kv, output-projection input h, MLP fc output I and GELU output I
 *     (gated MLP: gate I, silu(gate) I, up I and their product I, as autograd keeps them)
 *                                                               -> d(2h + 2kv + 2I)  (= 24h)
 *   attention scores, per head a*s: softmax output d, dropout mask m, dropout output d
 *                                                               -> (2d + m)as  (= 5as), split by t */
static double block_parts(const ModelSpec *m, const ActivShape *x, double *repl, double *split,
			  double *scores)
{
	double d = x->elem_bytes, mask = m->dropout ? 1 : 0;
	double h = (double)m->h, kv = (double)(m->kv_heads * (m->h / m->a)), I = (double)m->I;
	double sb = (double)x->s * (double)x->b;

	*repl = sb * (4 * d * h + 2 * mask * h);
	*split = sb * d * (2 * h + 2 * kv + (m->gated_mlp ? 4 : 2) * I);
	*scores = sb * (double)m->a * (double)x->s * (d + mask + (m->dropout ? d : 0));
	return sb;
}

double activ_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode)
{
	double repl, split, scores, t = x->t;
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	block_parts(m, x, &repl, &split, &scores);
	if (mode == CKPT_SELECTIVE)
		scores = 0;
	return (x->sp ? repl / t : repl) + split / t + scores / t;
}

double activ_checkpoint_bytes(const ModelSpec *m, const ActivShape *x, int partitioned)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	double input = (double)x->s * (double)x->b * (double)m->h * x->elem_bytes;
	return (x->sp || partitioned) ? input / x->t : input;
}

double activ_ends_bytes(const ModelSpec *m, const ActivShape *x)
{
	if (m->arch == ARCH_PARAMS_ONLY)
		return 0;
	double d = x->elem_bytes, sb = (double)x->s * (double)x->b;
	double mask = m->dropout ? 1 : 0;
	/* embedding-output dropout mask; final-norm input and output; logits and their fp32 softmax */
	double ends = sb * (double)m->h * (mask + 2 * d);
	if (m->has_lm_head)
		ends += sb * (double)m->V * 2 * d;
	return ends / x->t;
}
