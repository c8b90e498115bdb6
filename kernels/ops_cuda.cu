/* ops_cuda: the layer ops' kernels. Row-wise ops give one warp to a row (lanes stride the
 * channels, sums by butterfly shuffles); column sums (bias and norm gradients) give a thread to a
 * column and reduce a fixed number of row phases in shared memory, in a fixed order. */
#include <math.h>

#include "cuda_check.h"
#include "gemm_cuda.h"
#include "ops_cuda.h"
#include "cast_dev.cuh"
extern "C" {
#include "ops_cpu.h" /* OPS_LAYERNORM_EPS: one epsilon for both */
}

#define WARP 32
#define FULL_MASK 0xffffffffu
#define ROW_THREADS 128 /* four warps, four rows, a block */
#define EW_THREADS 256  /* elementwise kernels */

__device__ static float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v; /* every lane holds the sum */
}

__device__ static float warp_max(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

static unsigned row_blocks(size_t rows)
{
	return (unsigned)((rows + ROW_THREADS / WARP - 1) / (ROW_THREADS / WARP));
}

/* ---- column sums ---- */

/* Column-sum blocks: COL_X columns by COL_Y row phases. */
#define COL_X 32
#define COL_Y 8

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

__global__ static void bias_fill_kernel(float *y, const float *b, size_t n, int C)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = b[i % C];
}

/* y (N, C_out) = x w + b with x, w of type t (fp32 accumulation in every case) */
static void matmul_forward_typed(CudaCtx *ctx, CudaDtype t, float *y, const void *x, const void *w,
				 const float *b, int N, int C_in, int C_out)
{
	/* as the reference: the bias first, then one GEMM with beta = 1 adds the product onto it */
	float beta = 0.0f;
	if (b) {
		size_t n = (size_t)N * C_out;
		bias_fill_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
			y, b, n, C_out);
		CUDA_CHECK_LAUNCH();
		beta = 1.0f;
	}
	gemm_cuda(ctx, t, CDT_F32, 0, 0, N, C_out, C_in, 1.0f, x, w, beta, y);
}

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
	matmul_forward_typed(ctx, CDT_F32, y, x, w, b, N, C_in, C_out);
}

void ops_cuda_matmul_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
			      const float *x, const float *w, int N, int C_in, int C_out)
{
	matmul_backward_typed(ctx, CDT_F32, dx, dw, db, dy, x, w, N, C_in, C_out);
}

static void require_16(CudaDtype t)
{
	CUDA_REQUIRE(t == CDT_BF16 || t == CDT_F16,
		     "ops_cuda: the 16-bit linear layer takes CDT_BF16 or CDT_F16, got %d", (int)t);
}

void ops_cuda_matmul_forward_16(CudaCtx *ctx, CudaDtype t, float *y, const void *x, const void *w,
				const float *b, int N, int C_in, int C_out)
{
	require_16(t);
	matmul_forward_typed(ctx, t, y, x, w, b, N, C_in, C_out);
}

void ops_cuda_matmul_backward_16(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				 const void *dy, const void *x, const void *w, int N, int C_in,
				 int C_out)
{
	require_16(t);
	matmul_backward_typed(ctx, t, dx, dw, db, dy, x, w, N, C_in, C_out);
}

void ops_cuda_lm_head_forward(CudaCtx *ctx, float *logits, const float *x, const float *wte, int N,
			      int C, int V)
{
	/* logits (N, V) = x (N, C) wte^T, wte stored (V, C) */
	gemm_cuda(ctx, CDT_F32, CDT_F32, 0, 1, N, V, C, 1.0f, x, wte, 0.0f, logits);
}

void ops_cuda_lm_head_backward(CudaCtx *ctx, float *dx, float *dwte, const float *dlogits,
			       const float *x, const float *wte, int N, int C, int V)
{
	if (dx) /* dx (N, C) += dlogits (N, V) wte (V, C) */
		gemm_cuda(ctx, CDT_F32, CDT_F32, 0, 0, N, C, V, 1.0f, dlogits, wte, 1.0f, dx);
	if (dwte) /* dwte (V, C) += dlogits^T x */
		gemm_cuda(ctx, CDT_F32, CDT_F32, 1, 0, V, C, N, 1.0f, dlogits, x, 1.0f, dwte);
}

/* ---- layernorm ---- */

/* Two-pass mean and rstd of one row by one warp, the same formula forward and backward use. */
__device__ static void row_stats(const float *x, int C, int lane, float *mean, float *rstd)
{
	float s = 0.0f;
	for (int i = lane; i < C; i += WARP)
		s += x[i];
	float m = warp_sum(s) / (float)C;
	float sq = 0.0f;
	for (int i = lane; i < C; i += WARP)
		sq += (x[i] - m) * (x[i] - m);
	*mean = m;
	*rstd = 1.0f / sqrtf(warp_sum(sq) / (float)C + OPS_LAYERNORM_EPS);
}

__global__ static void layernorm_forward_kernel(float *y, float *mean, float *rstd, const float *x,
						const float *w, const float *b, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const float *xr = x + (size_t)row * C;
	float *yr = y + (size_t)row * C;
	float m, r;
	row_stats(xr, C, lane, &m, &r);
	for (int i = lane; i < C; i += WARP)
		yr[i] = (xr[i] - m) * r * w[i] + b[i]; /* y may be x: each lane rewrites what it read */
	if (lane == 0 && mean)
		mean[row] = m;
	if (lane == 0 && rstd)
		rstd[row] = r;
}

void ops_cuda_layernorm_forward(CudaCtx *ctx, float *y, float *mean, float *rstd, const float *x,
				const float *w, const float *b, int N, int C)
{
	layernorm_forward_kernel<<<row_blocks(N), ROW_THREADS, 0, ctx->stream>>>(y, mean, rstd, x, w,
										 b, N, C);
	CUDA_CHECK_LAUNCH();
}

/* dx as ops_layernorm_backward's: rstd (g - mean(g) - xhat mean(g xhat)), g = dy w. Also leaves
 * the row's statistics in stats[row] and stats[N + row] for the column kernel. */
__global__ static void layernorm_backward_rows_kernel(float *dx, float *stats, const float *dy,
						      const float *x, const float *w, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const float *xr = x + (size_t)row * C, *dyr = dy + (size_t)row * C;
	float m, r;
	row_stats(xr, C, lane, &m, &r);
	if (lane == 0) {
		stats[row] = m;
		stats[N + row] = r;
	}
	if (!dx)
		return;
	float g_sum = 0.0f, gx_sum = 0.0f;
	for (int i = lane; i < C; i += WARP) {
		float g = dyr[i] * w[i];
		g_sum += g;
		gx_sum += g * (xr[i] - m) * r;
	}
	float g_mean = warp_sum(g_sum) / (float)C, gx_mean = warp_sum(gx_sum) / (float)C;
	float *dxr = dx + (size_t)row * C;
	for (int i = lane; i < C; i += WARP) {
		float xhat = (xr[i] - m) * r;
		dxr[i] += r * (dyr[i] * w[i] - g_mean - xhat * gx_mean);
	}
}

/* dw[j] += sum_i dy[i][j] xhat[i][j]; db[j] += sum_i dy[i][j]; fixed-order as col_sum_kernel. */
__global__ static void layernorm_backward_cols_kernel(float *dw, float *db, const float *stats,
						      const float *dy, const float *x, int N, int C)
{
	__shared__ float pw[COL_Y][COL_X], pb[COL_Y][COL_X];
	int j = blockIdx.x * COL_X + threadIdx.x;
	float sw = 0.0f, sb = 0.0f;
	if (j < C)
		for (int i = threadIdx.y; i < N; i += COL_Y) {
			float d = dy[(size_t)i * C + j];
			sw += d * ((x[(size_t)i * C + j] - stats[i]) * stats[N + i]);
			sb += d;
		}
	pw[threadIdx.y][threadIdx.x] = sw;
	pb[threadIdx.y][threadIdx.x] = sb;
	__syncthreads();
	if (threadIdx.y == 0 && j < C) {
		float tw = 0.0f, tb = 0.0f;
		for (int y = 0; y < COL_Y; y++) {
			tw += pw[y][threadIdx.x];
			tb += pb[y][threadIdx.x];
		}
		if (dw)
			dw[j] += tw;
		if (db)
			db[j] += tb;
	}
}

void ops_cuda_layernorm_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
				 const float *x, const float *w, int N, int C, float *scratch)
{
	layernorm_backward_rows_kernel<<<row_blocks(N), ROW_THREADS, 0, ctx->stream>>>(
		dx, scratch, dy, x, w, N, C);
	CUDA_CHECK_LAUNCH();
	if (!dw && !db)
		return;
	dim3 block(COL_X, COL_Y);
	layernorm_backward_cols_kernel<<<(C + COL_X - 1) / COL_X, block, 0, ctx->stream>>>(
		dw, db, scratch, dy, x, N, C);
	CUDA_CHECK_LAUNCH();
}

/* ---- GELU ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

__global__ static void gelu_forward_kernel(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i];
		y[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
	}
}

__global__ static void gelu_backward_kernel(float *dx, const float *dy, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i];
		float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
		float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
		dx[i] += dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
	}
}

void ops_cuda_gelu_forward(CudaCtx *ctx, float *y, const float *x, size_t n)
{
	gelu_forward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(y, x, n);
	CUDA_CHECK_LAUNCH();
}

void ops_cuda_gelu_backward(CudaCtx *ctx, float *dx, const float *dy, const float *x, size_t n)
{
	gelu_backward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(dx, dy,
											     x, n);
	CUDA_CHECK_LAUNCH();
}

/* ---- attention ---- */

/* A lane keeps head dimensions lane, lane + 32, ...: at most this many. */
#define HS_PER_LANE (OPS_CUDA_ATTENTION_MAX_HS / WARP)

/* q . k over one head, every lane getting the result */
__device__ static float head_dot(const float *a, const float *b, int hs, int lane)
{
	float s = 0.0f;
	for (int i = lane; i < hs; i += WARP)
		s += a[i] * b[i];
	return warp_sum(s);
}

/* One warp per query row (b, h, t). The score of key t2 is written by lane t2 % 32, which is the
 * lane that later exponentiates and normalises it, so those passes need no exchange; the output
 * pass reads the whole row, after a __syncwarp that orders those writes before the reads. */
__global__ static void attention_forward_kernel(float *out, float *att, const float *qkv, int B,
						int T, int C, int NH, float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C;
	const float *base = qkv + (size_t)b * T * row3;
	const float *q = base + t * row3 + (size_t)h * hs;
	float *p = att + row * T; /* row = (b NH + h) T + t */

	float mx = -INFINITY;
	for (int t2 = 0; t2 <= t; t2++) {
		float s = head_dot(q, base + t2 * row3 + C + (size_t)h * hs, hs, lane) * scale;
		if (lane == (t2 & (WARP - 1)))
			p[t2] = s;
		mx = fmaxf(mx, s);
	}
	float sum = 0.0f;
	for (int t2 = lane; t2 <= t; t2 += WARP) {
		float e = expf(p[t2] - mx);
		p[t2] = e;
		sum += e;
	}
	float inv = 1.0f / warp_sum(sum);
	for (int t2 = lane; t2 <= t; t2 += WARP)
		p[t2] *= inv;
	for (int t2 = t + 1 + lane; t2 < T; t2 += WARP)
		p[t2] = 0.0f;
	__syncwarp();

	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float pv = p[t2];
		const float *v = base + t2 * row3 + 2 * (size_t)C + (size_t)h * hs;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += pv * v[lane + j * WARP];
	}
	float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			o[lane + j * WARP] = acc[j];
}

/* Query rows: pdp = sum_t2 P[t2] dP[t2] with dP[t2] = dout . v[t2], kept in pdp_out for the key
 * kernel; then dq += scale sum_t2 P[t2] (dP[t2] - pdp) k[t2]. dq belongs to this row alone. */
__global__ static void attention_backward_query_kernel(float *dqkv, float *pdp_out,
						       const float *dout, const float *qkv,
						       const float *att, int B, int T, int C, int NH,
						       float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C, hoff = (size_t)h * hs;
	const float *base = qkv + (size_t)b * T * row3;
	const float *p = att + row * T;
	const float *g = dout + ((size_t)b * T + t) * C + hoff;

	float pdp = 0.0f;
	for (int t2 = 0; t2 <= t; t2++)
		pdp += p[t2] * head_dot(g, base + t2 * row3 + 2 * (size_t)C + hoff, hs, lane);
	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float dp = head_dot(g, base + t2 * row3 + 2 * (size_t)C + hoff, hs, lane);
		float ds = p[t2] * (dp - pdp) * scale;
		const float *k = base + t2 * row3 + C + hoff;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += ds * k[lane + j * WARP];
	}
	float *dq = dqkv + (size_t)b * T * row3 + t * row3 + hoff;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			dq[lane + j * WARP] += acc[j];
	if (lane == 0)
		pdp_out[row] = pdp;
}

/* Key rows (b, h, t2): dv[t2] += sum_{t >= t2} P[t][t2] dout[t];
 * dk[t2] += scale sum_{t >= t2} P[t][t2] (dout[t] . v[t2] - pdp[t]) q[t]. */
__global__ static void attention_backward_key_kernel(float *dqkv, const float *pdp,
						     const float *dout, const float *qkv,
						     const float *att, int B, int T, int C, int NH,
						     float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t2 = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C, hoff = (size_t)h * hs;
	const float *base = qkv + (size_t)b * T * row3;
	const float *v = base + t2 * row3 + 2 * (size_t)C + hoff;
	size_t head_rows = row - t2; /* first row of this (b, h) in att and pdp */

	float adk[HS_PER_LANE] = {0}, adv[HS_PER_LANE] = {0};
	for (int t = t2; t < T; t++) {
		float pt = att[(head_rows + t) * T + t2];
		const float *g = dout + ((size_t)b * T + t) * C + hoff;
		const float *q = base + t * row3 + hoff;
		float ds = pt * (head_dot(g, v, hs, lane) - pdp[head_rows + t]) * scale;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs) {
				adv[j] += pt * g[lane + j * WARP];
				adk[j] += ds * q[lane + j * WARP];
			}
	}
	float *dk = dqkv + (size_t)b * T * row3 + t2 * row3 + C + hoff;
	float *dv = dk + C;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs) {
			dk[lane + j * WARP] += adk[j];
			dv[lane + j * WARP] += adv[j];
		}
}

static void attention_check(int C, int NH)
{
	CUDA_REQUIRE(NH > 0 && C % NH == 0 && C / NH <= OPS_CUDA_ATTENTION_MAX_HS,
		     "ops_cuda attention: C (%d) must be a multiple of NH (%d) with C / NH <= %d", C,
		     NH, OPS_CUDA_ATTENTION_MAX_HS);
}

void ops_cuda_attention_forward(CudaCtx *ctx, float *out, float *att, const float *qkv, int B,
				int T, int C, int NH)
{
	attention_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	attention_forward_kernel<<<row_blocks((size_t)B * NH * T), ROW_THREADS, 0, ctx->stream>>>(
		out, att, qkv, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
}

void ops_cuda_attention_backward(CudaCtx *ctx, float *dqkv, const float *dout, const float *qkv,
				 const float *att, int B, int T, int C, int NH, float *scratch)
{
	attention_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	unsigned blocks = row_blocks((size_t)B * NH * T);
	attention_backward_query_kernel<<<blocks, ROW_THREADS, 0, ctx->stream>>>(
		dqkv, scratch, dout, qkv, att, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
	attention_backward_key_kernel<<<blocks, ROW_THREADS, 0, ctx->stream>>>(
		dqkv, scratch, dout, qkv, att, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
}

/* ---- residual and embedding ---- */

__global__ static void residual_forward_kernel(float *y, const float *a, const float *b, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = a[i] + b[i];
}

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
	residual_forward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		y, a, b, n);
	CUDA_CHECK_LAUNCH();
}

void ops_cuda_residual_backward(CudaCtx *ctx, float *da, float *db, const float *dy, size_t n)
{
	residual_backward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		da, db, dy, n);
	CUDA_CHECK_LAUNCH();
}

__global__ static void embed_forward_kernel(float *y, const int *tokens, const float *wte,
					    const float *wpe, int T, int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / C;
		int c = (int)(i % C), t = (int)(row % T);
		y[i] = wte[(size_t)tokens[row] * C + c] + wpe[(size_t)t * C + c];
	}
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
	size_t n = (size_t)B * T * C;
	embed_forward_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		y, tokens, wte, wpe, T, C, n);
	CUDA_CHECK_LAUNCH();
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
