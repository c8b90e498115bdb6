/* gpt_cuda: the device twin of gpt_cpu's layer units. Same units, same parameter layout
 * (gpt_cpu_unit_tensors, gpt_cpu_unit_offset, gpt_cpu_block_layout), same activation and scratch
 * layouts and sizes (gpt_cpu_block_acts, gpt_cpu_scratch_bytes, and gpt_cpu_head_probs works on a
 * device pointer too), same accumulate / write contract: an executor runs a unit on the GPU by
 * calling gpt_cuda_* with device pointers where it called gpt_cpu_*. One difference: the head's
 * probabilities have rows ops_cuda_logits_ld(V) >= V floats apart (gpt_cuda_head_act_bytes), so
 * the LM head's products run on cuBLAS's aligned kernels whatever the vocabulary.
 * It composes ops_cuda; layouts, checks and init stay gpt_cpu's (initialise on the host, upload). */
#ifndef PX_GPT_CUDA_H
#define PX_GPT_CUDA_H

#include "cuda_ctx.h"
#include "sparse_eager_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "gpt16_cpu.h"
#include "gpt_cpu.h"

/* Each as the gpt_cpu_* function of the same name, with every pointer (tokens and targets
 * included) on the device and the work queued on ctx's stream; the shapes must pass
 * gpt_cpu_check and the tokens gpt_cpu_check_tokens (checked on the host, before upload). */
void gpt_cuda_embed_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const int *tokens, float *y);
void gpt_cuda_embed_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, float *grads,
			     const int *tokens, const float *dy);
/* att: the probabilities apart from acts (selective recompute, as gpt_cpu's _att units), or
 * NULL: in acts; gpt_cuda_block_scores rebuilds them from the kept q, k, v. ix (NULL: dense):
 * block-sparse attention over its kept blocks (sparse_eager_cuda.h), as gpt_cpu's sparse units. */
void gpt_cuda_block_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *x, float *y, float *acts, float *att,
			    const SparseIndexDev *ix);
void gpt_cuda_block_scores(CudaCtx *ctx, const GptConfig *c, int B, int T, float *acts,
			   float *att, const SparseIndexDev *ix);
/* scratch: gpt_cpu_scratch_bytes, as on the CPU; the GPU's layernorm statistics and attention's
 * rounded dout and score-gradient tiles fit in regions of it that are dead at the time. */
void gpt_cuda_block_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			     float *grads, const float *acts, const float *att,
			     const SparseIndexDev *ix, const float *dy, float *dx, float *scratch);
/* The head's activations: gpt16_head_act_bytes with the probabilities' rows
 * ops_cuda_logits_ld(V) apart (t PREC_F32 for gpt_cuda_head_*). */
size_t gpt_cuda_head_act_bytes(const GptConfig *c, PrecisionType t, int B, int T);
/* Returns the mean loss, synchronising (0 without synchronising when targets is NULL). */
float gpt_cuda_head_forward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, const float *x, const int *targets, float *acts);
void gpt_cuda_head_backward(CudaCtx *ctx, const GptConfig *c, int B, int T, const float *params,
			    const float *wte, float *grads, float *dwte, float *acts,
			    const int *targets, float dloss, float *dx, float *scratch);

/* gpt16_cpu's units (16-bit compute of type t, CDT_BF16 or CDT_F16) on the device, with
 * gpt16_cpu's layouts and sizes; check the shape with gpt16_check on the host first. The
 * embeddings' backward is gpt_cuda_embed_backward (fp32 dy). */
void gpt16_cuda_embed_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const int *tokens, void *y);
void gpt16_cuda_block_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *x, void *y, void *acts, void *att);
void gpt16_cuda_block_scores(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			     void *acts, void *att);
void gpt16_cuda_block_backward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			       const void *params, float *grads, const void *acts, const void *att,
			       const float *dy, float *dx, float *scratch);
float gpt16_cuda_head_forward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *wte, const void *x,
			      const int *targets, void *acts);
void gpt16_cuda_head_backward(CudaCtx *ctx, const GptConfig *c, CudaDtype t, int B, int T,
			      const void *params, const void *wte, float *grads, float *dwte,
			      void *acts, const int *targets, float dloss, float *dx,
			      float *scratch);

#ifdef __cplusplus
}
#endif

#endif
