/* sparse_eager_cpu: block-sparse attention as the GPT units run it under deepspeed.sparse_attention
 * (engine/sparse_layout.h's layouts), eager: the softmax probabilities of the kept blocks are kept
 * for the backward, as DeepSpeed's block-sparse softmax keeps its output, bs x bs per kept block
 * and nothing for the others. It works on the units' fused (B, T, 3C) q, k, v like
 * ops_attention_forward, with the causal mask inside the kept blocks; with every block of a causal
 * layout kept it does the dense op's arithmetic in the dense op's order, bit for bit.
 * sparse_attn_cpu.h is the flash-style reference on (B, NH, T, hs) arrays it is tested against.
 * Dimensions: B batch, T sequence (nb blocks of bs), C channels in NH heads. */
#ifndef PX_SPARSE_EAGER_CPU_H
#define PX_SPARSE_EAGER_CPU_H

#include <stddef.h>

#include "precision.h"

/* A layout's kept blocks in storage order: for head h and query block row r, the key blocks
 * cols[row_start[h nb + r] .. row_start[h nb + r + 1]), ascending. The probabilities of batch
 * element b's kept block k (that order, heads one after another) are the bs x bs floats from
 * (b n_kept + k) bs^2, query row by query row. */
typedef struct SparseIndex {
	int NH, nb, bs;
	long long n_kept;      /* kept blocks over all heads */
	long long *row_start;  /* NH nb + 1 */
	int *cols;             /* n_kept */
} SparseIndex;

/* The index of layout (NH x nb x nb bytes, 1 = kept). 0, or -1 when out of memory. */
int sparse_index_build(SparseIndex *ix, const unsigned char *layout, int NH, int nb, int bs);
void sparse_index_free(SparseIndex *ix);
/* Floats of the probabilities of B batch elements: B n_kept bs^2. */
size_t sparse_eager_probs_elems(const SparseIndex *ix, int B);

/* out (B, T, C) = softmax over each query's visible keys (kept blocks, at or before it) of
 * q k^T / sqrt(hs), times v; probs receives the probabilities (0 where masked). T = nb bs. A
 * query with no visible key gets 0. */
void sparse_eager_forward(float *out, float *probs, const float *qkv, const SparseIndex *ix,
			  int B, int T, int C);
/* dqkv (B, T, 3C) += the gradient of out given dout (B, T, C), from qkv and probs. */
void sparse_eager_backward(float *dqkv, const float *dout, const float *qkv, const float *probs,
			   const SparseIndex *ix, int B, int T, int C);

/* The same as a 16-bit unit of type t computes it (ops16_cpu.h's sparse attention): from q, k, v
 * and (backward) the probabilities already rounded to t, each product's result rounded to t
 * where its kernel stores it, as ops16_attention_forward / backward round theirs (scores, their
 * exponentials, the probabilities; dP and dS), sums in fp32; out and dqkv as fp32 for the caller
 * to round. t = PREC_F32: sparse_eager_forward / backward. */
void sparse_eager_forward_as(PrecisionType t, float *out, float *probs, const float *qkv,
			     const SparseIndex *ix, int B, int T, int C);
void sparse_eager_backward_as(PrecisionType t, float *dqkv, const float *dout, const float *qkv,
			      const float *probs, const SparseIndex *ix, int B, int T, int C);

#endif
