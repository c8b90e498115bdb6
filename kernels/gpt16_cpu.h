/* gpt16_cpu: gpt_cpu's layer units computing as mixed-precision training does, the reference for
 * gpt_cuda's 16-bit units: parameters (the unit's working copy, model layout, gpt_cpu_unit_tensors
 * order) and the saved activations in a 16-bit type t, matrix products of t values summed in
 * fp32, norms, softmax and the loss in fp32 from t loads, every gradient (the unit's parameter
 * gradients and the one passed between units, dy / dx) in fp32. The hidden stream between units
 * (x, y) is of type t. Layouts are gpt_cpu's in elements (gpt_cpu_block_acts); only the element
 * size changes. Where each op rounds: ops16_cpu.h. */
#ifndef PX_GPT16_CPU_H
#define PX_GPT16_CPU_H

#include <stddef.h>

#include "../engine/err.h"
#include "gpt_cpu.h"
#include "precision.h"

/* gpt_cpu_check, and that the head's backward can round at least one row of dlogits at a time
 * in the scratch (V <= 14 B T C, with t 16-bit). */
int gpt16_check(const GptConfig *c, PrecisionType t, int B, int T, PxError *err);

/* bytes(t) B T (16 C + NH T): engine/activ.c's activ_block_bytes at elem_bytes = bytes(t). */
size_t gpt16_block_act_bytes(const GptConfig *c, PrecisionType t, int B, int T);
/* B T (2 C bytes(t) + 4 V): the input and final-norm output in t, the probabilities in fp32
 * (activ_head_bytes at elem_bytes = bytes(t)). */
size_t gpt16_head_act_bytes(const GptConfig *c, PrecisionType t, int B, int T);
/* The same with the probabilities' rows ld >= V floats apart (the CUDA twin's, gpt_cuda.h). */
size_t gpt16_head_act_bytes_ld(const GptConfig *c, PrecisionType t, int B, int T, int ld);
/* The fp32 probabilities inside the head's acts. */
float *gpt16_head_probs(const GptConfig *c, PrecisionType t, int B, int T, void *acts);
/* Rows of dlogits the head's backward rounds to t at a time, in the scratch
 * (gpt_cpu_scratch_bytes) past dlnf and the layernorm statistics; 0 when not even one fits. The
 * CUDA twin takes the same chunks. */
int gpt16_head_chunk_rows(const GptConfig *c, PrecisionType t, int B, int T);
/* The same for rows ld >= V elements apart (the CUDA twin's). */
int gpt16_head_chunk_rows_ld(const GptConfig *c, PrecisionType t, int B, int T, int ld);

/* As gpt_cpu's units, params, x, y and acts of type t. Backwards accumulate fp32 grads and write
 * the fp32 dx (which may be dy). scratch: gpt_cpu_scratch_bytes, fp32-aligned. */
void gpt16_embed_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const int *tokens, void *y);
void gpt16_block_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *x, void *y, void *acts);
void gpt16_block_backward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			  float *grads, const void *acts, const float *dy, float *dx, float *scratch);
/* Selective recompute, as gpt_cpu's _att units: the probabilities att (B, NH, T, T) of type t
 * apart from acts, which then needs only the elements before gpt_cpu_block_acts' att offset;
 * gpt16_block_scores rebuilds them (and the attention output) from the kept q, k, v before the
 * backward, bit for bit the forward's; with ix (block-sparse, below; NULL: dense) att holds the
 * kept blocks' probabilities; att NULL: they lie at their place in acts. */
void gpt16_block_forward_att(const GptConfig *c, PrecisionType t, int B, int T,
			     const void *params, const void *x, void *y, void *acts, void *att,
			     const SparseIndex *ix);
void gpt16_block_scores(const GptConfig *c, PrecisionType t, int B, int T, void *acts, void *att,
			const SparseIndex *ix);
void gpt16_block_backward_att(const GptConfig *c, PrecisionType t, int B, int T,
			      const void *params, float *grads, const void *acts, const void *att,
			      const SparseIndex *ix, const float *dy, float *dx, float *scratch);
/* Block-sparse attention (deepspeed.sparse_attention), as gpt_cpu's: the _att block with ix and
 * att NULL keeps the kept blocks' probabilities in t at the end of acts in place of the dense
 * (B, NH, T, T), gpt16_block_sparse_act_bytes in all; the attention is
 * ops16_sparse_attention_forward / backward. */
size_t gpt16_block_sparse_act_bytes(const GptConfig *c, PrecisionType t, int B, int T,
				    const SparseIndex *ix);
/* The block's attention branch alone, as the block runs it, on any buffer holding its tensors at
 * a's offsets (elements of t): forward res2 = x_in + o(attention(qkv(ln1(x_in)))); backward with
 * d res2 (fp32) in dx on entry, adding the branch's gradient to it (dx = d x_in) and accumulating
 * its parameters' fp32 grads, in 7 B T C floats of scratch. att: the probabilities (B, NH, T, T)
 * apart from acts (selective recompute), or NULL: at a's att; ix: block-sparse attention's kept
 * blocks (their probabilities in that place), or NULL: dense. kernels/moe_cpu's blocks use
 * them. */
void gpt16_attention_forward(const GptConfig *c, PrecisionType t, int B, int T,
			     const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			     void *acts, void *att, const SparseIndex *ix);
void gpt16_attention_backward(const GptConfig *c, PrecisionType t, int B, int T,
			      const GptBlockLayout *p, const GptBlockActs *a, const void *params,
			      float *grads, const void *acts, const void *att, const SparseIndex *ix,
			      float *dx, float *scratch);
/* wte: the tied embed.tokens of type t (V, C). Returns the mean loss (0 when targets is NULL). */
float gpt16_head_forward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *wte, const void *x, const int *targets, void *acts);
void gpt16_head_backward(const GptConfig *c, PrecisionType t, int B, int T, const void *params,
			 const void *wte, float *grads, float *dwte, void *acts,
			 const int *targets, float dloss, float *dx, float *scratch);
/* The embeddings' backward is gpt_cpu_embed_backward: fp32 dy into fp32 grads. */

#endif
