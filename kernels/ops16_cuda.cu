/* ops16_cuda: the 16-bit ops, ops_dev.cuh's kernels instantiated for bf16 and fp16 storage
 * (StoreBF16, StoreF16: every load of a 16-bit tensor widened to fp32, every store rounded by
 * cast_dev.cuh, so each rounding is precision.c's bit for bit and falls where ops16_cpu.h says),
 * the type dispatched once at each call. */
#include "cast_cuda.h"
#include "ops16_cuda.h"
#include "ops_dev.cuh"

typedef uint16_t h16;

/* fn<StoreBF16> or fn<StoreF16> by t, with the arguments that follow */
#define CALL16(t, fn, ...)                                                                       \
	do {                                                                                     \
		opsd_require_16(t, "ops16_cuda");                                                \
		if ((t) == CDT_BF16)                                                             \
			fn<StoreBF16>(__VA_ARGS__);                                              \
		else                                                                             \
			fn<StoreF16>(__VA_ARGS__);                                               \
	} while (0)

void ops16_cuda_round(CudaCtx *ctx, CudaDtype t, void *dst, const float *src, size_t n)
{
	opsd_require_16(t, "ops16_cuda");
	cast_cuda(ctx, dst, t, src, CDT_F32, n);
}

/* ---- linear layers ---- */

void ops16_cuda_matmul_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, const void *w,
			       const void *b, int N, int C_in, int C_out)
{
	opsd_require_16(t, "ops16_cuda");
	opsd_linear_forward<h16>(ctx, t, t, (h16 *)y, x, w, (const h16 *)b, N, C_in, C_out);
}

void ops16_cuda_lm_head_forward(CudaCtx *ctx, CudaDtype t, float *logits, const void *x,
				const void *wte, int N, int C, int V, int ld)
{
	opsd_require_16(t, "ops16_cuda");
	opsd_lm_head_forward(ctx, t, logits, x, wte, N, C, V, ld);
}

void ops16_cuda_lm_head_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dwte,
				 const void *dlogits, const void *x, const void *wte, int N, int C,
				 int V, int ld)
{
	opsd_require_16(t, "ops16_cuda");
	opsd_lm_head_backward(ctx, t, dx, dwte, dlogits, x, wte, N, C, V, ld);
}

/* ---- layernorm, GELU, residual, embedding, attention ---- */

void ops16_cuda_layernorm_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x,
				  const void *w, const void *b, int N, int C)
{
	CALL16(t, opsd_layernorm_forward, ctx, (h16 *)y, NULL, NULL, (const h16 *)x,
	       (const h16 *)w, (const h16 *)b, N, C);
}

void ops16_cuda_layernorm_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				   const float *dy, const void *x, const void *w, int N, int C,
				   float *scratch)
{
	CALL16(t, opsd_layernorm_backward, ctx, dx, dw, db, dy, (const h16 *)x, (const h16 *)w, N,
	       C, scratch);
}

void ops16_cuda_gelu_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, size_t n)
{
	CALL16(t, opsd_gelu_forward, ctx, (h16 *)y, (const h16 *)x, n);
}

void ops16_cuda_gelu_backward(CudaCtx *ctx, CudaDtype t, float *dx, const float *dy,
			      const void *x, size_t n)
{
	CALL16(t, opsd_gelu_backward, ctx, dx, dy, (const h16 *)x, n);
}

void ops16_cuda_residual_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *a, const void *b,
				 size_t n)
{
	CALL16(t, opsd_residual_forward, ctx, (h16 *)y, (const h16 *)a, (const h16 *)b, n);
}

void ops16_cuda_embed_forward(CudaCtx *ctx, CudaDtype t, void *y, const int *tokens,
			      const void *wte, const void *wpe, int B, int T, int C)
{
	CALL16(t, opsd_embed_forward, ctx, (h16 *)y, tokens, (const h16 *)wte, (const h16 *)wpe, B,
	       T, C);
}

void ops16_cuda_attention_forward(CudaCtx *ctx, CudaDtype t, void *out, void *att,
				  const void *qkv, int B, int T, int C, int NH)
{
	CALL16(t, opsd_attention_forward, ctx, (h16 *)out, (h16 *)att, (const h16 *)qkv, B, T, C,
	       NH);
}

void ops16_cuda_attention_backward(CudaCtx *ctx, CudaDtype t, float *dqkv, const float *dout,
				   const void *qkv, const void *att, int B, int T, int C, int NH,
				   float *scratch, size_t scratch_elems)
{
	CALL16(t, opsd_attention_backward, ctx, dqkv, dout, (const h16 *)qkv, (const h16 *)att, B,
	       T, C, NH, scratch, scratch_elems);
}
