#include "activ.h"

/* Per block, in elements per token of its sequence (d = element bytes; a dropout mask is 1 byte
 * an element, kept where the config's dropout is on):
 *   kept whole on every tensor-parallel rank (split by t only with sequence parallelism):
 *     attention: norm1's input h and its output, the QKV input, h      -> 2dh (+ mask h)
 *     MLP: norm2's input h and the MLP input h                          -> 2dh (+ mask h)
 *                                                              (together 10h in 16-bit)
 *     a sandwich (Gemma 2) also keeps each post-norm's input: 3h a branch; a parallel block
 *     (GPT-J, Falcon, NeoX) keeps its input and the one norm output both branches read (2h),
 *     or its two norms' outputs (3h); latent attention (DeepSeek) keeps its q and kv latents
 *     before and after their norms (2 q_lora + 2 kv_lora)
 *   split by t: Q a d, K kv d, V kv dv, the output projection's input a dv (2h + 2kv when
 *     d = h/a; latent attention's K and V are per head, a d and a dv); with query/key norms
 *     their inputs too (Q and K again)                                  -> d(2h + 2kv)
 *     MLP fc output I and GELU output I (gated MLP: gate I, silu(gate) I, up I and their
 *     product I, as autograd keeps them)                             -> 2dI (4dI)
 *                                                              (together 24h)
 *   attention scores, per head a*s: softmax output d, dropout mask m, dropout output d
 *                                                                     -> (2d + m)as  (= 5as)
 *     or, with FlashAttention, the fp32 log-sum-exp of each head's row -> 4a
 *     (FlashAttention-2 regenerates its dropout mask from the RNG state in backward)
 * A decoder block of an encoder-decoder adds its attention over the encoder: norm input and q
 * input (2h), Q and the output projection's input per decoder token, K and V per encoder token,
 * and a s_enc scores per decoder token. */
typedef struct BlockParts {
	double attn_repl, attn_split, scores, mlp_repl, mlp_split;
} BlockParts;

static double dec_seq(const ActivShape *x)
{
	return (double)(x->s_dec ? x->s_dec : x->s);
}

/* the block's own sequence: the decoder's in an encoder-decoder's decoder */
static double self_seq(const ModelSpec *m, int unit, const ActivShape *x)
{
	return model_unit_is_decoder(m, unit) ? dec_seq(x) : (double)x->s;
}

/* one attention's scores per query row and head */
static double score_row(const ModelSpec *m, const ActivShape *x, double s_kv)
{
	double d = x->elem_bytes, mask = m->attn_dropout ? 1 : 0;
	return x->flash ? 4 : s_kv * (d + mask + (m->attn_dropout ? d : 0));
}


/* What one norm of Hugging Face's keeps beyond its input (Korthikanti's count), bytes a token,
 * the input in_bytes a value: nn.LayerNorm (native_layer_norm) the row's fp32 mean and rstd, 8;
 * LlamaRMSNorm (hidden.to(float32), pow, mean, rsqrt, the product, .to(dtype), times the weight)
 * the fp32 copy its pow and product keep in place of the input (4h for in_bytes h) and the
 * normalized rows its weight's product keeps (in_bytes h), with the fp32 rsqrt of each row, 4:
 * 4h + 4 more whatever the dtype (in fp32 the copy is the input itself, and the normalized rows
 * 4h); GemmaRMSNorm (x.float(), pow, mean, rsqrt, the product, times 1 + weight.float(), then
 * type_as) the same fp32 copy and rsqrt, and its normalized rows in fp32, 4h, which the product
 * with 1 + weight keeps before the cast: (4 - in_bytes) h + 4h + 4 more (6h + 4 on a 16-bit
 * input, 4h + 4 on an fp32 one). Other norms: none counted. */
static double hf_norm_extra(const ModelSpec *m, double in_bytes)
{
	double h = (double)m->h;
	if (m->lay.norm == NORM_LAYER)
		return 8;
	if (model_gemma_modules(m))
		return (4 - in_bytes) * h + 4 * h + 4;
	return model_llama_modules(m) ? 4 * h + 4 : 0;
}

/* Whether a norm keeps an fp32 input where the 16-bit count has a 16-bit one: under torch
 * autocast over fp32 weights every norm, the residual stream being fp32 (autocast_parts); over
 * 16-bit weights (ActivShape.weights16) only nn.LayerNorm, which autocast runs in fp32 from an
 * fp32 copy of its input (an RMSNorm module's own upcast is hf_norm_extra's). */
static int norm_fp32_input(const ModelSpec *m, const ActivShape *x)
{
	return x->autocast && (!x->weights16 || m->lay.norm == NORM_LAYER);
}

/* The dtype a norm's input has (norm_fp32_input), else the activations'. */
static double norm_in_bytes(const ModelSpec *m, const ActivShape *x)
{
	return norm_fp32_input(m, x) ? 4 : x->elem_bytes;
}

/* What a block's Hugging Face eager modules keep beyond the count above (modeling_gpt2.py,
 * modeling_llama.py, modeling_gemma.py, modeling_gemma2.py, activations.py): each norm's
 * hf_norm_extra, one norm to each branch (two to each under the sandwich, one shared by a
 * parallel block's two); NewGELUActivation ("gelu_new"), 0.5 x (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))) in elementwise ops, keeps its input (pow's), tanh's output and both factors of
 * the last product, 0.5 x and 1 + tanh: 4 I where a fused GELU keeps its input alone, 3 d I
 * more; Llama's eager attention (and Gemma's, its copy) keeps its softmax's fp32 output
 * (softmax(dtype=float32)) beside the 16-bit copy the product with V reads, 4 a s more, and
 * under grouped-query attention the keys and values repeat_kv made for every head, (a - kv) d_h
 * each more than the kv heads' (FlashAttention-2's kernel takes the kv heads as they are);
 * Gemma-2's soft-capping of the scores (divided by the cap, tanh, times the cap, before the mask
 * and the softmax) keeps tanh's output, d a s more (the divisions and products by a number keep
 * nothing). */
static void hf_eager_parts(const ModelSpec *m, const ActivShape *x, double sb, double s_kept,
			   BlockParts *p)
{
	const ModelLayout *y = &m->lay;
	double per = hf_norm_extra(m, norm_in_bytes(m, x)) * (y->place == NORM_SANDWICH ? 2 : 1);
	double d = x->elem_bytes;
	p->attn_repl += sb * per;
	if (y->parallel != 1)
		p->mlp_repl += sb * per;
	if (m->gelu_new && !y->gated)
		p->mlp_split += sb * d * 3 * (double)m->I;
	if (!model_hf_llama_attention(m) || x->flash || x->attn_block > 0)
		return;
	if (d < 4)
		p->scores += sb * (double)m->a * s_kept * 4;
	if (m->attn_softcap > 0)
		p->scores += sb * (double)m->a * s_kept * d;
	p->attn_split += sb * d * 2 * (double)(m->a - m->kv_heads) * (double)m->head_dim;
}

/* What torch autocast (fp32 weights, 16-bit compute; the CUDA op lists of torch.amp) keeps beyond
 * the 16-bit count: the residual stream is fp32 (an fp32 embedding output, then each branch's
 * 16-bit output added to it promotes), so each norm (layer_norm runs in fp32) keeps an fp32 input,
 * 2h bytes more a token (over 16-bit weights, FSDP's, a LayerNorm's fp32 copy of its input
 * only: norm_fp32_input); softmax runs in fp32 and keeps its fp32 output, which the product with
 * V reads through a 16-bit cast it keeps: 4 + 2 bytes a score where the 16-bit count has 2, or
 * with dropout 4 + 1 + 2 (output, mask, the cast of dropout's fp32 output) where it has 2 + 1 + 2
 * (Llama's and Gemma's Hugging Face attention already count their fp32 softmax, hf_eager_parts);
 * Hugging Face's NewGELUActivation computes torch.pow in fp32 and the rest in fp32 after it,
 * keeping pow's fp32 input, tanh's fp32 output and the fp32 1 + tanh (0.5 x stays 16-bit): 6 I
 * bytes more. */
static void autocast_parts(const ModelSpec *m, const ActivShape *x, double sb, double s_kept,
			   BlockParts *p)
{
	const ModelLayout *y = &m->lay;
	double h = (double)m->h, norm = norm_fp32_input(m, x) ? 2 * h : 0;
	p->attn_repl += sb * norm;
	if (y->parallel != 1)
		p->mlp_repl += sb * norm;
	if (!x->flash && !(x->hf_eager && model_hf_llama_attention(m)))
		p->scores += sb * (double)m->a * s_kept * (m->attn_dropout ? 2 : 4);
	if (x->hf_eager && m->gelu_new && !y->gated)
		p->mlp_split += sb * 6 * (double)m->I;
}

static BlockParts block_parts(const ModelSpec *m, int unit, const ActivShape *x)
{
	const ModelLayout *y = &m->lay;
	double d = x->elem_bytes, mask = m->dropout ? 1 : 0;
	double h = (double)m->h, a = (double)m->a, hd = (double)m->head_dim;
	double dv = (double)m->v_head_dim, kvh = (double)m->kv_heads;
	double q = a * hd, o_in = a * dv, k = y->mla ? a * hd : kvh * hd, v = y->mla ? a * dv : kvh * dv;
	double s = self_seq(m, unit, x), sb = s * (double)x->b, sb_enc = (double)x->s * (double)x->b;
	double attn_w, mlp_w, split = q + k + v + o_in;
	BlockParts p;

	if (y->parallel) {
		attn_w = y->parallel == 2 ? 3 * h : 2 * h;
		mlp_w = 0;
	} else {
		attn_w = mlp_w = y->place == NORM_SANDWICH ? 3 * h : 2 * h;
	}
	if (y->mla)
		attn_w += 2 * (double)m->q_lora + 2 * (double)m->kv_lora;
	if (y->qk_norm != QKNORM_NONE)
		split += q + kvh * hd;
	if (y->L_enc && unit == y->L_enc) /* the encoder's final norm, input and output */
		mlp_w += 2 * h;
	p.attn_repl = sb * (d * attn_w + mask * h);
	p.attn_split = sb * d * split;
	/* a block-sparse layout keeps n block^2 of each head's s^2 scores: n block^2 / s a row */
	double s_kept = x->attn_block > 0 ? x->attn_blocks * (double)(x->attn_block * x->attn_block) / s
					  : s;
	p.scores = sb * a * score_row(m, x, s_kept);
	if (model_unit_is_decoder(m, unit)) {
		p.attn_repl += sb * (d * 2 * h + mask * h);
		p.attn_split += sb * d * (q + o_in) + sb_enc * d * kvh * (hd + dv);
		p.scores += sb * a * score_row(m, x, (double)x->s);
	}
	p.mlp_repl = sb * (d * mlp_w + mask * h);
	p.mlp_split = sb * d * (y->gated ? 4 : 2) * (double)m->I;
	if (x->hf_eager)
		hf_eager_parts(m, x, sb, s_kept, &p);
	if (x->autocast)
		autocast_parts(m, x, sb, s_kept, &p);
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

static double dense_block(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode)
{
	BlockParts p = block_parts(m, unit, x);
	double t = x->t, mlp_repl = x->sp ? p.mlp_repl / t : p.mlp_repl;
	return attention_bytes(&p, x, mode) + mlp_repl + p.mlp_split / t;
}

/* An MoE block keeps the attention part as a dense block does; its MLP keeps, on this rank:
 * norm2's input and output (2d per token: the output is the router's and the dispatch's input,
 * which the router's backward reads), the router's fp32 logits and probabilities (8E bytes per
 * token), and for DeepSpeed's MoE layer in a 16-bit model the fp32 copies its gate multiplies
 * (sharded_moe.py TopKGate.forward: F.linear(input.float(), wg.weight.float()), whose backward
 * keeps both: 4h bytes a token and the router's 4hE; in fp32 .float() is the tensor itself;
 * Hugging Face's MoE models gate in the model's type),
 * the dispatched tokens the local experts receive (slots x h) with the experts' intermediates as
 * a dense MLP's (slots x 2I, gated 4I, I the experts' own), the combined outputs coming back
 * (slots x h), and the output dropout mask. Experts are not split by tensor parallelism. Shared
 * experts are a dense MLP over every token (its input h, its intermediates split by t), with
 * Qwen2-MoE's gate keeping its output and the experts' output (h + 1). */
static double moe_block(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode,
			long long slots)
{
	BlockParts p = block_parts(m, unit, x);
	double d = x->elem_bytes, sb = self_seq(m, unit, x) * (double)x->b, n = (double)slots;
	double h = (double)m->h, I = (double)(m->moe_I ? m->moe_I : m->I), mask = m->dropout ? 1 : 0;
	double per = m->lay.gated ? 4 : 2;
	double mlp = sb * (d * 2 * h + 8.0 * (double)m->experts + mask * h) +
		     n * d * (2 * h + per * I);
	if (m->ds_gate && d < 4) /* the gate's fp32 input and weight (above) */
		mlp += sb * 4 * h + 4 * h * (double)m->experts;
	if (m->shared_I)
		mlp += sb * d * h + sb * d * per * (double)m->shared_I / x->t;
	if (m->shared_gate)
		mlp += sb * d * (h + 1);
	return attention_bytes(&p, x, mode) + mlp;
}

/* Korthikanti's (sbhL/t)(p/L + δ(p=1)(4/L)(1 + V/h)): the first stage keeps an embedding dropout
 * mask of sbh per micro-batch in flight (the p/L term; an encoder-decoder's two stacks each drop
 * their embeddings), and OPT-350m's project_in its input; the last keeps the final norm's input
 * and output (2d sbh; BERT's pooler its input and output; without a final norm the head's input
 * only), project_out's output, and the softmax in fp32 (4 sbV): 4sbh + 4sbV in 16-bit. Under
 * tensor parallelism the softmax is vocabulary-parallel (sbV/t each); the norm's tensors are
 * the stream's, whole on every rank without sequence parallelism (Korthikanti's formula divides
 * them by t, which holds with it). */
static double embed_bytes(const ModelSpec *m, const ActivShape *x)
{
	const ModelLayout *y = &m->lay;
	double s = (double)x->s + (y->L_enc ? dec_seq(x) : 0), sb = s * (double)x->b;
	double bytes = sb * (double)m->h * (m->dropout ? 1 : 0);
	if (y->embed_dim && y->embed_dim != m->h)
		bytes += sb * (double)y->embed_dim * x->elem_bytes;
	return x->sp ? bytes / x->t : bytes; /* the stream's: whole on every rank without sp */
}

static double head_bytes(const ModelSpec *m, const ActivShape *x)
{
	const ModelLayout *y = &m->lay;
	double d = x->elem_bytes, sb = (y->L_enc ? dec_seq(x) : (double)x->s) * (double)x->b;
	double h = (double)m->h, b = (double)x->b;
	double head = sb * h * (y->final_norm ? 2 : 1) * d;
	if (y->embed_dim && y->embed_dim != m->h)
		head += sb * (double)y->embed_dim * d;
	if (y->pooler) /* tanh's output; its input is a view of the encoder's output, kept above */
		head += b * h * d;
	/* a classifier's input: its dropout's output and mask; without a dropout it reads what
	 * is kept above (the pooler's output, the encoder's or the final norm's) */
	if (y->cls_labels && y->cls_dropout && m->dropout)
		head += (y->cls_tokens ? sb : b) * h * (d + 1);
	if (y->head_transform) /* the dense layer's output (the activation's input), the
				  activation's (the norm's input), the norm's (the decoder's) */
		head += sb * h * 3 * d + (x->hf_eager ? sb * hf_norm_extra(m, d) : 0);
	long long a = x->logits_align > 1 ? x->logits_align : 1;
	double row = (double)((m->V + a - 1) / a * a); /* a logits row, as the executor pads it */
	/* the log-softmax's output, fp32 (Korthikanti's count; Hugging Face's causal-LM loss
	 * upcasts); BertForMaskedLM's and T5's CrossEntropyLoss keep it in the logits' type, fp32
	 * only under autocast */
	double ls = x->hf_eager && !model_hf_loss_upcasts(m) && !x->autocast ? d : 4;
	double logits = y->lm_head ? sb * row * ls : 0; /* vocabulary-parallel: V/t each */
	if (x->hf_eager && y->final_norm) /* what Hugging Face's final norm keeps beyond it */
		head += sb * hf_norm_extra(m, norm_in_bytes(m, x));
	/* Gemma-2's soft-capping of the logits (Gemma2ForCausalLM: divided, tanh, multiplied,
	 * before the loss) keeps tanh's output in the logits' dtype */
	if (x->hf_eager && y->lm_head && m->final_softcap > 0)
		logits += sb * (double)m->V * d;
	if (norm_fp32_input(m, x) && y->final_norm) /* its fp32 input (autocast_parts) */
		head += sb * 2 * (double)m->h;
	/* the final norm's input and output are the stream's: whole on every tensor-parallel rank,
	 * split by rows only under sequence parallelism */
	return x->sp ? (head + logits) / x->t : head + logits / x->t;
}

/* ---- by unit ---- */

static int is_block(const ModelSpec *m, int unit)
{
	return unit >= 1 && unit <= m->L;
}

double activ_unit_bytes(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode,
			long long slots)
{
	if (!model_known(m))
		return 0;
	if (unit == 0)
		return embed_bytes(m, x);
	if (!is_block(m, unit))
		return head_bytes(m, x);
	return model_unit_is_moe(m, unit) ? moe_block(m, unit, x, mode, slots) :
					    dense_block(m, unit, x, mode);
}

double activ_unit_scores_bytes(const ModelSpec *m, int unit, const ActivShape *x, CkptMode mode)
{
	if (!model_known(m) || x->flash || !is_block(m, unit))
		return 0;
	BlockParts p = block_parts(m, unit, x);
	return kept_scores(&p, x, mode);
}

double activ_unit_checkpoint_bytes(const ModelSpec *m, int unit, const ActivShape *x,
				   int partitioned)
{
	if (!model_known(m) || !is_block(m, unit))
		return 0;
	double input = self_seq(m, unit, x) * (double)x->b * (double)m->h * x->elem_bytes;
	if (m->lay.L_enc && unit == m->lay.L_enc) /* the encoder's output, which decoders read */
		input += (double)x->s * (double)x->b * (double)m->h * x->elem_bytes;
	return (x->sp || partitioned) ? input / x->t : input;
}

/* ---- the first block and the ends ---- */

double activ_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode)
{
	return model_known(m) ? dense_block(m, 1, x, mode) : 0;
}

double activ_block_scores_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode)
{
	return activ_unit_scores_bytes(m, 1, x, mode);
}

double activ_checkpoint_bytes(const ModelSpec *m, const ActivShape *x, int partitioned)
{
	return activ_unit_checkpoint_bytes(m, 1, x, partitioned);
}

double activ_moe_block_bytes(const ModelSpec *m, const ActivShape *x, CkptMode mode,
			     long long slots)
{
	return model_known(m) ? moe_block(m, 1, x, mode, slots) : 0;
}

double activ_embed_bytes(const ModelSpec *m, const ActivShape *x)
{
	return activ_unit_bytes(m, 0, x, CKPT_NONE, 0);
}

double activ_head_bytes(const ModelSpec *m, const ActivShape *x)
{
	return activ_unit_bytes(m, (int)m->L + 1, x, CKPT_NONE, 0);
}

double activ_ends_bytes(const ModelSpec *m, const ActivShape *x)
{
	return activ_embed_bytes(m, x) + activ_head_bytes(m, x);
}
