/* ops_cuda: the layer ops of ops_cpu.h on the GPU, fp32 in and out, one function per ops_cpu
 * function with the same shapes, the same accumulate-into-gradients convention and the same
 * in-place permissions. Its kernels are ops_cuda.cu's and, shared with ops16_cuda, ops_dev.cuh's;
 * matrix products go through gemm_cuda, optimizer steps and casts are optim_cuda's. Pointers are device pointers (tokens and targets too); everything
 * queues on the context's stream, and only functions returning a host value synchronise.
 * Dimension names as in ops_cpu.h. */
#ifndef PX_OPS_CUDA_H
#define PX_OPS_CUDA_H

#include <stddef.h>

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- linear layers (cuBLAS, fp32 without TF32) ---- */

void ops_cuda_matmul_forward(CudaCtx *ctx, float *y, const float *x, const float *w,
			     const float *b, int N, int C_in, int C_out);
void ops_cuda_matmul_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
			      const float *x, const float *w, int N, int C_in, int C_out);
/* The tied LM head as ops_lm_head_*'s, except that the rows of logits and dlogits are ld >= V
 * elements apart: ops_cuda_logits_ld(V) keeps them 16-byte aligned, so that cuBLAS runs its
 * aligned kernels where an odd vocabulary (GPT-2's 50,257) would send it to its slow
 * one-element-aligned fallbacks. The padding columns are neither read nor written. */
void ops_cuda_lm_head_forward(CudaCtx *ctx, float *logits, const float *x, const float *wte, int N,
			      int C, int V, int ld);
void ops_cuda_lm_head_backward(CudaCtx *ctx, float *dx, float *dwte, const float *dlogits,
			       const float *x, const float *wte, int N, int C, int V, int ld);
/* V rounded up to a multiple of 8: 32 bytes of fp32, 16 of a 16-bit copy of the same rows */
static inline int ops_cuda_logits_ld(int V)
{
	return (V + 7) / 8 * 8;
}

/* The 16-bit path of the same layers: x, w and dy in bf16 or fp16 (type t, as precision.h's
 * bits), products accumulated in fp32 (gemm_cuda), y and the gradients fp32, accumulated as
 * above; the bias stays fp32. What a bf16 step runs its matrix products through. */
void ops_cuda_matmul_forward_16(CudaCtx *ctx, CudaDtype t, float *y, const void *x, const void *w,
				const float *b, int N, int C_in, int C_out);
void ops_cuda_matmul_backward_16(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				 const void *dy, const void *x, const void *w, int N, int C_in,
				 int C_out);

/* ---- normalisation and activation ---- */

void ops_cuda_layernorm_forward(CudaCtx *ctx, float *y, float *mean, float *rstd, const float *x,
				const float *w, const float *b, int N, int C);
/* scratch: 2 N floats (each row's mean and rstd, passed from the row kernel that computes dx to
 * the column kernel that sums dw and db, so the sums need no atomics and are deterministic). */
#define OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(N) (2 * (size_t)(N))
void ops_cuda_layernorm_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
				 const float *x, const float *w, int N, int C, float *scratch);
void ops_cuda_gelu_forward(CudaCtx *ctx, float *y, const float *x, size_t n);
void ops_cuda_gelu_backward(CudaCtx *ctx, float *dx, const float *dy, const float *x, size_t n);

/* ---- attention ---- */

/* Causal attention on cuBLAS batched GEMMs (full T x T products, the masked triangle zeroed by
 * the softmax kernels; ops_dev.cuh). Forward needs no scratch: the scores go into att, which the
 * softmax turns into probabilities in place. */
void ops_cuda_attention_forward(CudaCtx *ctx, float *out, float *att, const float *qkv, int B,
				int T, int C, int NH);
/* scratch: scratch_elems floats, at least OPS_CUDA_ATTENTION_SCRATCH_MIN_ELEMS (room for the
 * 16-bit twin's rounded dout, B T C 16-bit elements, and one row of T scores): the backward tiles
 * the score gradients datt / dS, (T, T) a head, into whatever it is given (whole heads when they
 * fit, else rows of one head), so more scratch means fewer, larger GEMMs. */
#define OPS_CUDA_ATTENTION_SCRATCH_MIN_ELEMS(B, T, C)                                            \
	(((size_t)(B) * (T) * (C) + 1) / 2 + (size_t)(T))
void ops_cuda_attention_backward(CudaCtx *ctx, float *dqkv, const float *dout, const float *qkv,
				 const float *att, int B, int T, int C, int NH, float *scratch,
				 size_t scratch_elems);

/* ---- residual and embedding ---- */

void ops_cuda_residual_forward(CudaCtx *ctx, float *y, const float *a, const float *b, size_t n);
void ops_cuda_residual_backward(CudaCtx *ctx, float *da, float *db, const float *dy, size_t n);
void ops_cuda_embed_forward(CudaCtx *ctx, float *y, const int *tokens, const float *wte,
			    const float *wpe, int B, int T, int C);
/* dwpe is summed over the batch in order (deterministic); dwte by atomicAdd, since any rows may
 * share a token, so its rounding depends on the order the additions land in. */
void ops_cuda_embed_backward(CudaCtx *ctx, float *dwte, float *dwpe, const float *dy,
			     const int *tokens, int B, int T, int C);

/* ---- loss ---- */

/* As ops_crossentropy_forward; returns the mean loss over the N rows (synchronises) or, with
 * targets NULL, 0 without synchronising. */
float ops_cuda_crossentropy_forward(CudaCtx *ctx, float *probs, const float *logits,
				    const int *targets, int N, int V, int ld);
void ops_cuda_crossentropy_backward(CudaCtx *ctx, float *dlogits, const float *probs,
				    const int *targets, int N, int V, int ld, float dloss);

#ifdef __cplusplus
}
#endif

#endif
