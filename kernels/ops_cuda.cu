/* ops_cuda: the layer ops on fp32 tensors. The ops that also run on 16-bit storage are
 * ops_dev.cuh's templates, instantiated here for fp32 (StoreF32: plain loads and stores);
 * this file holds the fp32-only kernels (column sums, residual and embedding backward, the
 * loss) and the linear layers on gemm_cuda. */
#include "ops_dev.cuh"

/* ---- column sums ---- */

/* db[j] += sum_i dy[i][j]: phase y sums rows y, y + COL_Y, ...; the COL_Y partials then add up in
 * phase order, so the result does not depend on scheduling. */
__global__ static void col_sum_kernel(float *db, const void *dy, int dtype, int N, int C)
{
	__shared__ float part[COL_Y][COL_X];
	int j = blockIdx.x * COL_X + threadIdx.x;
	float s = 0.0f;
	if (j < C)
		for (int i = threadIdx.y; i < N; i += COL_Y)
			s += castd_load(dy, (size_t)i * C + j, dtype);
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && j < C) {
		float t = 0.0f;
		for (int y = 0; y < COL_Y; y++)
			t += part[y][threadIdx.x];
		db[j] += t;
	}
}

static void col_sum(CudaCtx *ctx, float *db, const void *dy, CudaDtype t, int N, int C)
{
	dim3 block(COL_X, COL_Y);
	col_sum_kernel<<<(C + COL_X - 1) / COL_X, block, 0, ctx->stream>>>(db, dy, t, N, C);
	CUDA_CHECK_LAUNCH();
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
			      int C, int V)
{
	opsd_lm_head_forward(ctx, CDT_F32, logits, x, wte, N, C, V);
}

void ops_cuda_lm_head_backward(CudaCtx *ctx, float *dx, float *dwte, const float *dlogits,
			       const float *x, const float *wte, int N, int C, int V)
{
	opsd_lm_head_backward(ctx, CDT_F32, dx, dwte, dlogits, x, wte, N, C, V);
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

/* Block-wide reduction through one shared slot per warp; every thread gets the result. */
__device__ static float block_reduce(float v, int is_max)
{
	__shared__ float part[CE_THREADS / WARP];
	__shared__ float result;
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
	v = is_max ? warp_max(v) : warp_sum(v);
	if (lane == 0)
		part[w] = v;
	__syncthreads();
	if (w == 0) {
		float x = lane < CE_THREADS / WARP ? part[lane] : (is_max ? -INFINITY : 0.0f);
		x = is_max ? warp_max(x) : warp_sum(x);
		if (lane == 0)
			result = x;
	}
	__syncthreads();
	return result;
}

/* One block per row: max, then exp and sum, then normalise; the row's loss
 * log(sum) - (logit[target] - max) goes into the context's double accumulator. */
__global__ static void crossentropy_forward_kernel(float *probs, const float *logits,
						   const int *targets, int V, double *loss_sum)
{
	size_t row = blockIdx.x;
	const float *l = logits + row * V;
	float *p = probs + row * V;
	float mx = -INFINITY;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		mx = fmaxf(mx, l[j]);
	/* the target's logit is read before the barrier in block_reduce, so before any thread
	 * overwrites logits with probabilities */
	float lt = targets ? l[targets[row]] : 0.0f;
	mx = block_reduce(mx, 1);
	float sum = 0.0f;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float e = expf(l[j] - mx);
		p[j] = e;
		sum += e;
	}
	sum = block_reduce(sum, 0);
	float inv = 1.0f / sum;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		p[j] *= inv;
	if (targets && threadIdx.x == 0)
		atomicAdd(loss_sum, (double)logf(sum) - ((double)lt - (double)mx));
}

float ops_cuda_crossentropy_forward(CudaCtx *ctx, float *probs, const float *logits,
				    const int *targets, int N, int V)
{
	double *acc = ctx->scalars + CUDA_SCALAR_SUM;
	if (targets)
		CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), ctx->stream));
	if (N > 0) {
		crossentropy_forward_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(probs, logits,
									       targets, V, acc);
		CUDA_CHECK_LAUNCH();
	}
	if (!targets)
		return 0.0f;
	double sum = 0.0;
	cuda_ctx_download(ctx, &sum, acc, sizeof(sum));
	return (float)(sum / N);
}

__global__ static void crossentropy_backward_kernel(float *dlogits, const float *probs,
						    const int *targets, int V, size_t n, float s)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / V;
		int j = (int)(i % V);
		dlogits[i] = s * (probs[i] - (j == targets[row] ? 1.0f : 0.0f));
	}
}

void ops_cuda_crossentropy_backward(CudaCtx *ctx, float *dlogits, const float *probs,
				    const int *targets, int N, int V, float dloss)
{
	size_t n = (size_t)N * V;
	crossentropy_backward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0,
				       ctx->stream>>>(dlogits, probs, targets, V, n,
						      dloss / (float)N);
	CUDA_CHECK_LAUNCH();
}