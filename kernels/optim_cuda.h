/* optim_cuda: the optimizer steps and the gradient-norm sum of ops_cpu.h on the GPU (AdamW, SGD,
 * sum of squares), and the mixed-precision AdamW: fp32 master weights and moments updated from
 * fp32, bf16 or fp16 gradients, writing the low-precision working copy in the same pass. It does
 * not decide the loss scale or the clipping coefficient: callers fold both into grad_scale as
 * ops_adamw_step's callers do. Device pointers; the context's stream. */
#ifndef PX_OPTIM_CUDA_H
#define PX_OPTIM_CUDA_H

#include <stddef.h>

#include "cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "ops_cpu.h" /* OpsAdamw */

/* As ops_adamw_step, element for element (the per-step constants formed on the host in double,
 * exactly as there). */
void optim_cuda_adamw_step(CudaCtx *ctx, float *param, float *m, float *v, const float *grad,
			   size_t n, const OpsAdamw *h, long step, float grad_scale);

/* The same update with grad of type grad_type (read exactly as fp32), and, when param_lp is not
 * NULL, the updated master weight also written to param_lp of type lp_type, rounded to nearest
 * even as precision.h rounds (lp_type CDT_F32 writes a plain copy). */
void optim_cuda_adamw_mixed(CudaCtx *ctx, float *master, float *m, float *v, const void *grad,
			    CudaDtype grad_type, void *param_lp, CudaDtype lp_type, size_t n,
			    const OpsAdamw *h, long step, float grad_scale);

/* As ops_sgd_step (buf may be NULL when momentum is 0). */
void optim_cuda_sgd_step(CudaCtx *ctx, float *param, float *buf, const float *grad, size_t n,
			 float lr, float momentum, float weight_decay, float grad_scale);

/* Sum of squares of n values of type dtype, accumulated in double (per thread, per block, then
 * across blocks by atomicAdd on a double). Synchronises. */
double optim_cuda_sum_squares(CudaCtx *ctx, const void *x, CudaDtype dtype, size_t n);

#ifdef __cplusplus
}
#endif

#endif
