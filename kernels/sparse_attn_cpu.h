/* sparse_attn_cpu: block-sparse attention forward and backward in plain C, fp32, computing only the
 * blocks a layout (engine/sparse_layout.h: heads x nb x nb bytes, 1 = computed) keeps, as
 * DeepSpeed's block-sparse kernels do; causal additionally masks keys after the query inside the
 * kept blocks. The reference sparse_attn_cuda is tested against. It knows shapes and layouts, not
 * models: the GPT units run sparse_eager_cpu.h's eager variant, which this one is the reference of.
 * Dimensions: B = batch, NH = heads, T = sequence (a multiple of bs), hs = head size, bs = block
 * side, nb = T / bs. q, k, v, out and their gradients are (B, NH, T, hs); lse is (B, NH, T). */
#ifndef PX_SPARSE_ATTN_CPU_H
#define PX_SPARSE_ATTN_CPU_H

/* out = softmax(q k^T / sqrt(hs) over the kept keys) v, and each row's log-sum-exp of its scaled
 * scores in lse (what the backward rebuilds the probabilities from; -INFINITY for a row that keeps
 * no key, whose output is 0). */
void sparse_attn_forward(float *out, float *lse, const float *q, const float *k, const float *v,
			 const unsigned char *layout, int B, int NH, int T, int hs, int bs,
			 int causal);
/* dq, dk, dv += the gradients of the forward's out given dout, from q, k, v, out and lse; the
 * probabilities are rebuilt from lse, so only the kept blocks are touched. */
void sparse_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
			  const float *k, const float *v, const float *out, const float *lse,
			  const unsigned char *layout, int B, int NH, int T, int hs, int bs,
			  int causal);

#endif
