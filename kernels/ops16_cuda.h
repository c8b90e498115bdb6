/* ops16_cuda: the device twins of ops16_cpu.h, the ops of 16-bit mixed-precision compute:
 * activations and parameters of type t (CDT_BF16 or CDT_F16, as precision.h's bits), sums,
 * norms, softmax and the loss in fp32 registers, gradients fp32, rounding to t at exactly the
 * points ops16_cpu.h names. Same shapes and conventions as ops_cuda.h; device pointers, work
 * queued on the context's stream. The 16-bit matrix products go through gemm_cuda (fp32
 * accumulation); the linear layers' backward is ops_cuda_matmul_backward_16. */
#ifndef PX_OPS16_CUDA_H
#define PX_OPS16_CUDA_H

#include <stddef.h>

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst (t) = src (fp32) rounded */
void ops16_cuda_round(CudaCtx *ctx, CudaDtype t, void *dst, const float *src, size_t n);
/* y = rn(b + x w): the bias copied into y, then one GEMM with beta = 1 reading it back (exact)
 * and rounding the fp32 sum once. b may be NULL. */
void ops16_cuda_matmul_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, const void *w,
			       const void *b, int N, int C_in, int C_out);
/* the LM head as ops_cuda_lm_head_*'s, x, wte and dlogits of type t: logits' rows ld apart */
void ops16_cuda_lm_head_forward(CudaCtx *ctx, CudaDtype t, float *logits, const void *x,
				const void *wte, int N, int C, int V, int ld);
void ops16_cuda_lm_head_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dwte,
				 const void *dlogits, const void *x, const void *wte, int N, int C,
				 int V, int ld);
void ops16_cuda_layernorm_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x,
				  const void *w, const void *b, int N, int C);
/* scratch: OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(N) floats, as ops_cuda_layernorm_backward's */
void ops16_cuda_layernorm_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				   const float *dy, const void *x, const void *w, int N, int C,
				   float *scratch);
void ops16_cuda_gelu_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, size_t n);
void ops16_cuda_gelu_backward(CudaCtx *ctx, CudaDtype t, float *dx, const float *dy,
			      const void *x, size_t n);
void ops16_cuda_residual_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *a, const void *b,
				 size_t n);
void ops16_cuda_embed_forward(CudaCtx *ctx, CudaDtype t, void *y, const int *tokens,
			      const void *wte, const void *wpe, int B, int T, int C);
void ops16_cuda_attention_forward(CudaCtx *ctx, CudaDtype t, void *out, void *att,
				  const void *qkv, int B, int T, int C, int NH);
/* scratch as ops_cuda_attention_backward's (scratch_elems floats, at least
 * OPS_CUDA_ATTENTION_SCRATCH_MIN_ELEMS) */
void ops16_cuda_attention_backward(CudaCtx *ctx, CudaDtype t, float *dqkv, const float *dout,
				   const void *qkv, const void *att, int B, int T, int C, int NH,
				   float *scratch, size_t scratch_elems);

#ifdef __cplusplus
}
#endif

#endif
