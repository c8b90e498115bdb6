/* ops16_cpu: the ops of ops_cpu.h for 16-bit mixed-precision compute, as the reference the CUDA
 * twins (ops_cuda.h's *_t functions) are tested against: activations and parameters stored in a
 * 16-bit type t (PREC_BF16 or PREC_F16; PREC_F32 rounds nowhere), every sum and every
 * normalisation, softmax and loss in fp32 or wider, gradients in fp32. At PREC_F32 the linear,
 * normalisation, activation and attention functions are ops_cpu's on the same arrays (no copies),
 * which is how gpt_tp_cpu runs fp32 through them. Each function says where it rounds to t; the
 * CUDA kernels round at exactly those points, so the two differ only in the order of their sums
 * (kernels/README.md). Shapes, names and the accumulate convention are
 * ops_cpu.h's. Temporaries come from malloc; running out of memory is fatal (a reference for
 * tests and small runs, with nothing to hand an error to). */
#ifndef PX_OPS16_CPU_H
#define PX_OPS16_CPU_H

#include <stddef.h>

#include "precision.h"
#include "sparse_eager_cpu.h"

/* dst (n, type t) = src rounded; src fp32 */
void ops16_round(PrecisionType t, void *dst, const float *src, size_t n);
/* dst (n, fp32) = src (type t), exact */
void ops16_widen(PrecisionType t, float *dst, const void *src, size_t n);

/* ---- linear layers: products of t values summed in fp32 ---- */

/* y = rn(b + x w): the bias and the product summed in fp32, rounded once. x, w, b, y of type t;
 * b may be NULL. */
void ops16_matmul_forward(PrecisionType t, void *y, const void *x, const void *w, const void *b,
			  int N, int C_in, int C_out);
/* dx += dy w^T, dw += x^T dy, db += column sums of dy: dy, x, w of type t, gradients fp32. */
void ops16_matmul_backward(PrecisionType t, float *dx, float *dw, float *db, const void *dy,
			   const void *x, const void *w, int N, int C_in, int C_out);
/* logits (N, V) fp32 = x wte^T, x and wte of type t: the loss stays in fp32. */
void ops16_lm_head_forward(PrecisionType t, float *logits, const void *x, const void *wte, int N,
			   int C, int V);
/* dx (N, C) += dlogits wte; dwte (V, C) += dlogits^T x: dlogits, x, wte of type t; dx, dwte fp32. */
void ops16_lm_head_backward(PrecisionType t, float *dx, float *dwte, const void *dlogits,
			    const void *x, const void *wte, int N, int C, int V);

/* ---- normalisation, activation, residual, embedding ---- */

/* y = rn((x - mean) rstd w + b), statistics in double as ops_layernorm_forward's. */
void ops16_layernorm_forward(PrecisionType t, void *y, const void *x, const void *w, const void *b,
			     int N, int C);
/* ops_layernorm_backward with x and w of type t; dy, dx, dw, db fp32. */
void ops16_layernorm_backward(PrecisionType t, float *dx, float *dw, float *db, const float *dy,
			      const void *x, const void *w, int N, int C);
/* y = rn(gelu(x)); dx += dy gelu'(x), x of type t, dx and dy fp32. */
void ops16_gelu_forward(PrecisionType t, void *y, const void *x, size_t n);
void ops16_gelu_backward(PrecisionType t, float *dx, const float *dy, const void *x, size_t n);
/* y = rn(a + b) */
void ops16_residual_forward(PrecisionType t, void *y, const void *a, const void *b, size_t n);
/* y = rn(wte[token] + wpe[t]) */
void ops16_embed_forward(PrecisionType t, void *y, const int *tokens, const void *wte,
			 const void *wpe, int B, int T, int C);

/* ---- attention ---- */

/* ops_attention_forward on qkv of type t. Per query row, rounding where the CUDA twin stores
 * into att: s = rn(q.k / sqrt(hs)) over the visible keys (the scores GEMM's output); m = max s;
 * e = exp(s - m), summed unrounded (in double here) and stored rn(e); att = rn(rn(e) / sum)
 * (multiplied by the rounded reciprocal); out = rn(sum att v), the sum in fp32 from the rounded
 * att (the output GEMM's). */
void ops16_attention_forward(PrecisionType t, void *out, void *att, const void *qkv, int B, int T,
			     int C, int NH);
/* The gradients from qkv and att of type t; dout and dqkv fp32, dqkv accumulated. Rounding where
 * the CUDA twin's GEMMs take 16-bit operands: g = rn(dout); datt = rn(g v^T) (fp32 sum of hs
 * terms); pdp = sum_{t2 <= t} att datt in fp32; dS = rn(att (datt - pdp)), 0 past the diagonal;
 * then dq += s (dS k), dk += s (dS^T q), dv += att^T g with s = 1 / sqrt(hs), each product summed
 * in fp32 before it is scaled and added. PREC_F32 is ops_attention_backward itself. */
void ops16_attention_backward(PrecisionType t, float *dqkv, const float *dout, const void *qkv,
			      const void *att, int B, int T, int C, int NH);

/* Block-sparse attention over ix's kept blocks (kernels/sparse_eager_cpu.h), of type t: the dense
 * ops' rounding at the same places, probs the kept blocks' probabilities in t (stored where
 * sparse_eager_probs_elems counts them). With every block of a causal layout kept the forward is
 * ops16_attention_forward's, to the bit; the backward sums dq and dk per query row as the fp32
 * sparse op does, rounding dP and dS as the dense op does. PREC_F32 is sparse_eager_forward /
 * backward itself. */
void ops16_sparse_attention_forward(PrecisionType t, void *out, void *probs, const void *qkv,
				    const SparseIndex *ix, int B, int T, int C);
void ops16_sparse_attention_backward(PrecisionType t, float *dqkv, const float *dout,
				     const void *qkv, const void *probs, const SparseIndex *ix,
				     int B, int T, int C);

#endif
