/* ops_cuda: the layer ops on fp32 tensors. The ops that also run on 16-bit storage are
 * ops_dev.cuh's templates, instantiated here for fp32 (StoreF32: plain loads and stores);
 * this file holds the fp32-only kernels (column sums, residual and embedding backward, the
 * loss) and the linear layers on gemm_cuda. */
#include "ops_dev.cuh"

/* ---- column sums ---- */

/* Pass one of db[j] += sum_i dy[i][j] (ops_dev.cuh's col_plan), columns j0 ... j0 + W */
__global__ static void col_sum_kernel(float *part, const void *dy, int dtype, int N, int C, int j0,
				      int W, int rows)
{
	__shared__ float sh[COL_Y][COL_X];
	int j = j0 + blockIdx.x * COL_X + threadIdx.x;
	int i1 = min(N, (int)(blockIdx.y + 1) * rows);
	float s = 0.0f;
	if (j < C)
		for (int i = blockIdx.y * rows + threadIdx.y; i < i1; i += COL_Y)
			s += castd_load(dy, (size_t)i * C + j, dtype);
	col_block_store(sh, s, part, W);
}

static void col_sum(CudaCtx *ctx, float *db, const void *dy, CudaDtype t, int N, int C)
{
	col_sums(ctx, N, C, 1, db, NULL, [&](dim3 grid, dim3 block, int j0, const ColPlan &p) {
		col_sum_kernel<<<grid, block, 0, ctx->stream>>>(ctx->col_part, dy, t, N, C, j0, p.W,
							       p.rows);
	});
}

/* ---- linear layers ---- */

static void matmul_backward_typed(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				  const void *dy, const void *x, const void *w, int N, int C_in,
				  int C_out)
{
	if (dx) /* dx (N, C_in) += dy (N, C_out) w^T, w stored (C_in, C_out) */
		gemm_cuda(ctx, t, CDT_F32, 0, 1, N, C_in, C_out, 1.0f, dy, w, 1.0f, dx);
	if (dw) /* dw (C_in, C_out) += x^T dy, x stored (N, C_in) */
		gemm_cuda(ctx, t, CDT_F32, 1, 0, C_in, C_out, N, 1.0f, x, dy, 1.0f, dw);
	if (db)
		col_sum(ctx, db, dy, t, N, C_out);
}

void ops_cuda_matmul_forward(CudaCtx *ctx, float *y, const float *x, const float *w,
			     const float *b, int N, int C_in, int C_out)
{
	opsd_linear_forward<float>(ctx, CDT_F32, CDT_F32, y, x, w, b, N, C_in, C_out);
}

void ops_cuda_matmul_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
			      const float *x, const float *w, int N, int C_in, int C_out)
{
	matmul_backward_typed(ctx, CDT_F32, dx, dw, db, dy, x, w, N, C_in, C_out);
}

/* bf16 / fp16 in, fp32 out and fp32 bias */
void ops_cuda_matmul_forward_16(CudaCtx *ctx, CudaDtype t, float *y, const void *x, const void *w,
				const float *b, int N, int C_in, int C_out)
{
	opsd_require_16(t, "ops_cuda_matmul_forward_16");
	opsd_linear_forward<float>(ctx, t, CDT_F32, y, x, w, b, N, C_in, C_out);
}

void ops_cuda_matmul_backward_16(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				 const void *dy, const void *x, const void *w, int N, int C_in,
				 int C_out)
{
	opsd_require_16(t, "ops_cuda_matmul_backward_16");
	matmul_backward_typed(ctx, t, dx, dw, db, dy, x, w, N, C_in, C_out);
}

void ops_cuda_lm_head_forward(CudaCtx *ctx, float *logits, const float *x, const float *wte, int N,
			      int C, int V, int ld)
{
	opsd_lm_head_forward(ctx, CDT_F32, logits, x, wte, N, C, V, ld);
}

void ops_cuda_lm_head_backward(CudaCtx *ctx, float *dx, float *dwte, const float *dlogits,
			       const float *x, const float *wte, int N, int C, int V, int ld)
{
	opsd_lm_head_backward(ctx, CDT_F32, dx, dwte, dlogits, x, wte, N, C, V, ld);
}

/* ---- layernorm, GELU, attention: ops_dev.cuh's kernels on fp32 ---- */

void ops_cuda_layernorm_forward(CudaCtx *ctx, float *y, float *mean, float *rstd, const float *x,
				const float *w, const float *b, int N, int C)
{
	opsd_layernorm_forward<StoreF32>(ctx, y, mean, rstd, x, w, b, N, C);
}

void ops_cuda_layernorm_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
				 const float *x, const float *w, int N, int C, float *scratch)
{
	opsd_layernorm_backward<StoreF32>(ctx, dx, dw, db, dy, x, w, N, C, scratch);
}

void ops_cuda_gelu_forward(CudaCtx *ctx, float *y, const float *x, size_t n)
{
	opsd_gelu_forward<StoreF32>(ctx, y, x, n);
}

void ops_cuda_gelu_backward(CudaCtx *ctx, float *dx, const float *dy, const float *x, size_t n)
{
	opsd_gelu_backward<StoreF32>(ctx, dx, dy, x, n);
}

void ops_cuda_attention_forward(CudaCtx *ctx, float *out, float *att, const float *qkv, int B,
				int T, int C, int NH)
{
	opsd_attention_forward<StoreF32>(ctx, out, att, qkv, B, T, C, NH);
}

void ops_cuda_attention_backward(CudaCtx *ctx, float *dqkv, const float *dout, const float *qkv,
				 const float *att, int B, int T, int C, int NH, float *scratch,
				 size_t scratch_elems)
{
	opsd_attention_backward<StoreF32>(ctx, dqkv, dout, qkv, att, B, T, C, NH, scratch,
					  scratch_elems);
}

/* ---- residual and embedding ---- */

__global__ static void residual_backward_kernel(float *da, float *db, const float *dy, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = dy[i]; /* read once: da or db may be dy's own buffer */
		da[i] += g;
		db[i] += g;
	}
}

void ops_cuda_residual_forward(CudaCtx *ctx, float *y, const float *a, const float *b, size_t n)
{
	opsd_residual_forward<StoreF32>(ctx, y, a, b, n);
}

void ops_cuda_residual_backward(CudaCtx *ctx, float *da, float *db, const float *dy, size_t n)
{
	residual_backward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		da, db, dy, n);
	CUDA_CHECK_LAUNCH();
}

__global__ static void embed_backward_wte_kernel(float *dwte, const float *dy, const int *tokens,
						 int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / C;
		atomicAdd(dwte + (size_t)tokens[row] * C + i % C, dy[i]);
	}
}

/* one thread per (t, c), adding the batch in order as the reference does */
__global__ static void embed_backward_wpe_kernel(float *dwpe, const float *dy, int B, int T, int C)
{
	size_t n = (size_t)T * C;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float s = dwpe[i];
		for (int b = 0; b < B; b++)
			s += dy[(size_t)b * n + i];
		dwpe[i] = s;
	}
}

void ops_cuda_embed_forward(CudaCtx *ctx, float *y, const int *tokens, const float *wte,
			    const float *wpe, int B, int T, int C)
{
	opsd_embed_forward<StoreF32>(ctx, y, tokens, wte, wpe, B, T, C);
}

void ops_cuda_embed_backward(CudaCtx *ctx, float *dwte, float *dwpe, const float *dy,
			     const int *tokens, int B, int T, int C)
{
	size_t n = (size_t)B * T * C;
	if (dwte) {
		embed_backward_wte_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0,
					    ctx->stream>>>(dwte, dy, tokens, C, n);
		CUDA_CHECK_LAUNCH();
	}
	if (dwpe) {
		size_t tc = (size_t)T * C;
		embed_backward_wpe_kernel<<<cuda_blocks_for(tc, EW_THREADS), EW_THREADS, 0,
					    ctx->stream>>>(dwpe, dy, B, T, C);
		CUDA_CHECK_LAUNCH();
	}
}

/* ---- loss ---- */

#define CE_THREADS 512

/* A softmax's running state over some logits: their max m and sum of exp(l - m). */
struct SoftmaxAcc {
	float m, s;
};

__device__ static inline SoftmaxAcc softmax_merge(SoftmaxAcc a, SoftmaxAcc b)
{
	float m = fmaxf(a.m, b.m);
	if (m == -INFINITY) /* both empty: nothing to rescale */
		return a;
	return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

/* The block's merged state, in a fixed order (lanes by butterfly, then warps in order): every
 * thread gets it. */
__device__ static SoftmaxAcc block_softmax(SoftmaxAcc v)
{
	__shared__ SoftmaxAcc part[CE_THREADS / WARP];
	__shared__ SoftmaxAcc result;
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
	for (int o = WARP / 2; o > 0; o >>= 1) {
		SoftmaxAcc u = {__shfl_xor_sync(FULL_MASK, v.m, o), __shfl_xor_sync(FULL_MASK, v.s, o)};
		v = softmax_merge(v, u);
	}
	if (lane == 0)
		part[w] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		SoftmaxAcc t = part[0];
		for (int i = 1; i < CE_THREADS / WARP; i++)
			t = softmax_merge(t, part[i]);
		result = t;
	}
	__syncthreads();
	return result;
}

/* One block per row, two passes over it: the max and the sum of exponentials together (the sum
 * rescaled whenever the max grows: Milakov and Gimelshein's online softmax), then the
 * probabilities written. The row's loss log(sum) - (logit[target] - max) goes into the
 * context's double accumulator. */
__global__ static void crossentropy_forward_kernel(float *probs, const float *logits,
						   const int *targets, int V, int ld,
						   double *loss_sum)
{
	size_t row = blockIdx.x;
	const float *l = logits + row * ld;
	float *p = probs + row * ld;
	SoftmaxAcc acc = {-INFINITY, 0.0f};
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float x = l[j];
		if (x > acc.m) {
			acc.s = acc.s * expf(acc.m - x) + 1.0f;
			acc.m = x;
		} else if (acc.m > -INFINITY) { /* -inf after -inf adds nothing (not exp(NaN)) */
			acc.s += expf(x - acc.m);
		}
	}
	/* the target's logit is read before the barriers in block_softmax, so before any thread
	 * overwrites logits with probabilities */
	float lt = targets ? l[targets[row]] : 0.0f;
	acc = block_softmax(acc);
	float inv = 1.0f / acc.s;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		p[j] = expf(l[j] - acc.m) * inv;
	if (targets && threadIdx.x == 0)
		atomicAdd(loss_sum, (double)logf(acc.s) - ((double)lt - (double)acc.m));
}

float ops_cuda_crossentropy_forward(CudaCtx *ctx, float *probs, const float *logits,
				    const int *targets, int N, int V, int ld)
{
	CUDA_REQUIRE(ld >= V, "ops_cuda_crossentropy_forward: row stride %d below V %d", ld, V);
	double *acc = ctx->scalars + CUDA_SCALAR_SUM;
	if (targets)
		CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), ctx->stream));
	if (N > 0) {
		crossentropy_forward_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(probs, logits,
									       targets, V, ld, acc);
		CUDA_CHECK_LAUNCH();
	}
	if (!targets)
		return 0.0f;
	double sum = 0.0;
	cuda_ctx_download(ctx, &sum, acc, sizeof(sum));
	return (float)(sum / N);
}

/* one block per row: no division by V per element */
__global__ static void crossentropy_backward_kernel(float *dlogits, const float *probs,
						    const int *targets, int V, int ld, float s)
{
	size_t row = blockIdx.x;
	int target = targets[row];
	const float *p = probs + row * ld;
	float *d = dlogits + row * ld;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		d[j] = s * (p[j] - (j == target ? 1.0f : 0.0f));
}

void ops_cuda_crossentropy_backward(CudaCtx *ctx, float *dlogits, const float *probs,
				    const int *targets, int N, int V, int ld, float dloss)
{
	CUDA_REQUIRE(ld >= V, "ops_cuda_crossentropy_backward: row stride %d below V %d", ld, V);
	if (N <= 0)
		return;
	crossentropy_backward_kernel<<<N, EW_THREADS, 0, ctx->stream>>>(dlogits, probs, targets, V,
									 ld, dloss / (float)N);
	CUDA_CHECK_LAUNCH();
}
