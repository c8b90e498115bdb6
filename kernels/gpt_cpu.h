/* gpt_cpu: a GPT-2 decoder (pre-LN blocks, learned positions, LM head tied to the token embedding)
 * composed from ops_cpu one layer unit at a time, in engine/model.c's unit and tensor order: unit 0
 * the embeddings, units 1..L the blocks, unit L+1 the final norm, whose head borrows embed.tokens.
 * It owns the unit layouts, the saved-activation layout and the deterministic init. Parameters,
 * gradients and buffers are the caller's; which unit runs when, and recompute, the executor's. */
#ifndef PX_GPT_CPU_H
#define PX_GPT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/err.h"
#include "sparse_eager_cpu.h"

/* Dimension names as in ops_cpu.h (B, T, C, V, NH, hs = C / NH, N = B * T). */
typedef struct GptConfig {
	int V;     /* vocabulary */
	int max_T; /* rows of the position table: the longest sequence */
	int C;     /* channels */
	int L;     /* blocks */
	int NH;    /* heads; C % NH == 0 */
} GptConfig;

/* GPT-2's initializer_range */
#define GPT_CPU_INIT_STD 0.02f

/* 0, or -1 with err filled, unless every dimension is positive, C % NH == 0, T <= max_T and
 * B * T fits an int. The unit functions below assume a configuration and shape that pass. */
int gpt_cpu_check(const GptConfig *c, int B, int T, PxError *err);
/* 0, or -1 naming the first token outside [0, V). */
int gpt_cpu_check_tokens(const GptConfig *c, const int *tokens, size_t n, PxError *err);

/* ---- parameter layout ---- */

static inline int gpt_cpu_n_units(const GptConfig *c) { return c->L + 2; }

#define GPT_CPU_MAX_TENSORS 12

typedef struct GptTensor {
	const char *name; /* engine/model.c's name: "attn.c_attn.weight" */
	size_t numel;
} GptTensor;

/* The tensors a unit owns, in storage order, with engine/model.c's names; returns their count
 * (0 for a unit outside 0..L+1). The head's tied embed.tokens is not among its tensors. */
int gpt_cpu_unit_tensors(const GptConfig *c, int unit, GptTensor out[GPT_CPU_MAX_TENSORS]);
/* Elements of one unit's contiguous parameter array (and of its gradient array): V C + max_T C for
 * the embeddings, 12 C^2 + 13 C for a block, 2 C for the head. */
size_t gpt_cpu_unit_params(const GptConfig *c, int unit);
/* Where unit starts in the whole model's flat array (units in order), and that array's size. */
size_t gpt_cpu_unit_offset(const GptConfig *c, int unit);
size_t gpt_cpu_n_params(const GptConfig *c);

/* Element offsets of a block's tensors inside its unit array, in storage order. */
typedef struct GptBlockLayout {
	size_t ln1_w, ln1_b;   /* (C), (C) */
	size_t qkv_w, qkv_b;   /* (C, 3C), (3C) */
	size_t proj_w, proj_b; /* (C, C), (C): attn.o */
	size_t ln2_w, ln2_b;   /* (C), (C) */
	size_t fc_w, fc_b;     /* (C, 4C), (4C) */
	size_t down_w, down_b; /* (4C, C), (C) */
} GptBlockLayout;
GptBlockLayout gpt_cpu_block_layout(const GptConfig *c);

/* ---- saved activations ---- */

/* Element offsets inside one block's activation buffer: what block backward reads, nothing else. */
typedef struct GptBlockActs {
	size_t x_in; /* (B, T, C) the block's input: norm1's input */
	size_t ln1;  /* (B, T, C) norm1's output: c_attn's input */
	size_t qkv;  /* (B, T, 3C) */
	size_t atty; /* (B, T, C) attention output: attn.o's input */
	size_t res2; /* (B, T, C) x + attention branch: norm2's input */
	size_t ln2;  /* (B, T, C) norm2's output: mlp.fc's input */
	size_t fc;   /* (B, T, 4C) mlp.fc's output: GELU's input */
	size_t gelu; /* (B, T, 4C) GELU's output: mlp.down's input */
	size_t att;  /* (B, NH, T, T) softmax probabilities */
	size_t total_elems; /* B T (16 C + NH T) */
} GptBlockActs;
GptBlockActs gpt_cpu_block_acts(const GptConfig *c, int B, int T);

/* Bytes of fp32 activations one block forward keeps for its backward:
 * 4 B T (16 C + NH T). LayerNorm statistics are recomputed in backward rather than kept, so this is
 * exactly engine/activ.c's activ_block_bytes for 4-byte activations, no dropout, no recompute. */
size_t gpt_cpu_block_act_bytes(const GptConfig *c, int B, int T);
/* The head keeps its input (B, T, C), final-norm output (B, T, C) and probabilities (B, T, V):
 * 4 B T (2 C + V). The embeddings keep nothing (backward needs only the tokens). */
size_t gpt_cpu_head_act_bytes(const GptConfig *c, int B, int T);
/* Scratch for any one unit backward (the block's, 8 B T C floats, bounds the head's B T C):
 * temporaries that live only during the call. */
size_t gpt_cpu_scratch_bytes(const GptConfig *c, int B, int T);

/* ---- layer units ---- */

/* Each takes its unit's parameters as one contiguous fp32 array in the order of
 * gpt_cpu_unit_tensors. Backwards ACCUMULATE into the unit's gradient array (same layout), so
 * micro-batches add up; the gradient they pass down (dx) is WRITTEN. */

/* y (B, T, C) = token + position embeddings of tokens (B, T). */
void gpt_cpu_embed_forward(const GptConfig *c, int B, int T, const float *params,
			   const int *tokens, float *y);
void gpt_cpu_embed_backward(const GptConfig *c, int B, int T, float *grads, const int *tokens,
			    const float *dy);

/* y (B, T, C) = block(x): x + attn(ln1(x)), then + mlp(ln2(.)). acts receives the block's saved
 * activations (gpt_cpu_block_act_bytes); y may be x. Full recompute is this call again on the
 * kept input. */
void gpt_cpu_block_forward(const GptConfig *c, int B, int T, const float *params, const float *x,
			   float *y, float *acts);
/* From dy (B, T, C) and the acts of the matching forward: dx (B, T, C) written, which may be dy;
 * grads accumulated. scratch: gpt_cpu_scratch_bytes. */
void gpt_cpu_block_backward(const GptConfig *c, int B, int T, const float *params, float *grads,
			    const float *acts, const float *dy, float *dx, float *scratch);
/* Selective recompute (Korthikanti et al. 2022): the same block with the attention
 * probabilities att (B, NH, T, T) apart from acts, which then needs only the elements before
 * gpt_cpu_block_acts' att offset; and their rebuilding before the backward from the kept q, k, v
 * (QK^T, softmax, softmax x V), bit for bit the forward's. With ix (block-sparse attention, below;
 * NULL: dense) att holds the kept blocks' probabilities, sparse_eager_probs_elems of them.
 * att NULL: the probabilities at their place in acts (the block without recompute; under ix,
 * gpt_cpu_block_sparse_act_bytes in all). */
void gpt_cpu_block_forward_att(const GptConfig *c, int B, int T, const float *params,
			       const float *x, float *y, float *acts, float *att,
			       const SparseIndex *ix);
void gpt_cpu_block_scores(const GptConfig *c, int B, int T, float *acts, float *att,
			  const SparseIndex *ix);
void gpt_cpu_block_backward_att(const GptConfig *c, int B, int T, const float *params,
				float *grads, const float *acts, const float *att,
				const SparseIndex *ix, const float *dy, float *dx, float *scratch);

/* Block-sparse attention (deepspeed.sparse_attention; kernels/sparse_eager_cpu.h) is the _att
 * block with ix: its kept blocks' probabilities at the end of acts in place of the dense
 * (B, NH, T, T). Full recompute is the forward again.
 * 4 (B T 16 C + B n_kept bs^2): the dense block's activations with the kept blocks'
 * probabilities for the scores. */
size_t gpt_cpu_block_sparse_act_bytes(const GptConfig *c, int B, int T, const SparseIndex *ix);

/* Final norm, logits = ln_f(x) wte^T, softmax and the mean cross-entropy over the B T targets
 * (each in [0, V): gpt_cpu_check_tokens), which it returns. params: the head unit (final_norm
 * weight and bias); wte (V, C): the tied embed.tokens, the first V C elements of unit 0. acts:
 * gpt_cpu_head_act_bytes. targets NULL: probabilities only, returns 0. */
float gpt_cpu_head_forward(const GptConfig *c, int B, int T, const float *params, const float *wte,
			   const float *x, const int *targets, float *acts);
/* The probabilities (B, T, V) inside the head's acts, valid after head forward and until head
 * backward. Points into acts. */
const float *gpt_cpu_head_probs(const GptConfig *c, int B, int T, const float *acts);
/* grads: the head unit's; dwte: the tied embedding's gradient (unit 0's first V C elements), both
 * accumulated. dloss as ops_crossentropy_backward's (1, the loss scale, 1 / accumulation steps).
 * Turns the saved probabilities into dlogits in place, so acts serve one backward: run head
 * forward again before another. */
void gpt_cpu_head_backward(const GptConfig *c, int B, int T, const float *params, const float *wte,
			   float *grads, float *dwte, float *acts, const int *targets, float dloss,
			   float *dx, float *scratch);

/* ---- initialisation ---- */

/* GPT-2's init of one unit from seed: weights and embeddings normal(0, GPT_CPU_INIT_STD), the two
 * residual projections (attn.o, mlp.down) scaled by 1 / sqrt(2 L), biases 0, norm weights 1. Each
 * tensor draws from its own stream of the seed, so a rank initialises only the units (or shards)
 * it holds and every rank agrees. */
void gpt_cpu_init_unit(const GptConfig *c, int unit, float *params, uint64_t seed);
/* Every unit into the flat array (gpt_cpu_n_params elements). */
void gpt_cpu_init(const GptConfig *c, float *params, uint64_t seed);

/* ---- whole model ---- */

/* Activations and temporaries of a whole model at one micro-batch shape, for the tests and a
 * single-process trainer. Caller-owned struct: gpt_cpu_buffers_init / gpt_cpu_buffers_free. */
typedef struct GptCpuBuffers {
	GptConfig cfg;
	int B, T;
	float *slab;       /* owned; every pointer below points into it */
	float *block_acts; /* L x gpt_cpu_block_acts().total_elems, block 1 first */
	float *head_acts;  /* (B, T, 2C + V) */
	float *stream;     /* (B, T, C) the residual stream, unit to unit */
	float *dstream;    /* (B, T, C) its gradient */
	float *scratch;    /* gpt_cpu_scratch_bytes */
} GptCpuBuffers;

/* 0, or -1 with err filled (bad shape, out of memory). */
int gpt_cpu_buffers_init(GptCpuBuffers *b, const GptConfig *c, int B, int T, PxError *err);
/* Accepts NULL and a zeroed struct. */
void gpt_cpu_buffers_free(GptCpuBuffers *b);

/* Every unit forward over params (flat, gpt_cpu_n_params); returns the mean loss (0 when targets
 * is NULL). tokens and targets are (B, T). */
float gpt_cpu_forward(GptCpuBuffers *b, const float *params, const int *tokens,
		      const int *targets);
/* Every unit backward after gpt_cpu_forward with targets; accumulates into grads (flat). */
void gpt_cpu_backward(GptCpuBuffers *b, const float *params, float *grads, const int *tokens,
		      const int *targets, float dloss);

#endif
