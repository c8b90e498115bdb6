/* sparse_attn_cuda: sparse_attn_cpu.h's block-sparse attention on the GPU, fp32, with the same
 * shapes, layout, causal rule and accumulate-into-gradients convention; pointers (the layout's
 * too) are device pointers and everything queues on the context's stream. One thread per query
 * row, visiting only its kept blocks; the key gradients are summed with atomics, so dk and dv
 * agree with the CPU's to rounding, not bit for bit. Dimension names as in sparse_attn_cpu.h. */
#ifndef PX_SPARSE_ATTN_CUDA_H
#define PX_SPARSE_ATTN_CUDA_H

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void sparse_attn_cuda_forward(CudaCtx *ctx, float *out, float *lse, const float *q, const float *k,
			      const float *v, const unsigned char *layout, int B, int NH, int T,
			      int hs, int bs, int causal);
void sparse_attn_cuda_backward(CudaCtx *ctx, float *dq, float *dk, float *dv, const float *dout,
			       const float *q, const float *k, const float *v, const float *out,
			       const float *lse, const unsigned char *layout, int B, int NH, int T,
			       int hs, int bs, int causal);

#ifdef __cplusplus
}
#endif

#endif
