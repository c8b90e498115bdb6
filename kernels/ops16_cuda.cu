/* ops16_cuda: the 16-bit kernels, in ops_cuda.cu's structure line for line (one warp a row,
 * column sums in fixed row phases, the same attention passes) with every load of a 16-bit tensor
 * widened to fp32 and every store rounded by cast_dev.cuh, so each rounding is precision.c's bit
 * for bit and falls where ops16_cpu.h says. Each kernel is one template over the type
 * (CDT_BF16, CDT_F16), dispatched once at launch. */
#include <math.h>
#include <stdint.h>

#include "cast_cuda.h"
#include "cast_dev.cuh"
#include "cuda_check.h"
#include "gemm_cuda.h"
#include "ops16_cuda.h"
#include "ops_cuda.h"
extern "C" {
#include "ops_cpu.h" /* OPS_LAYERNORM_EPS */
}

#define WARP 32
#define FULL_MASK 0xffffffffu
#define ROW_THREADS 128 /* four warps, four rows, a block */
#define EW_THREADS 256
#define COL_X 32
#define COL_Y 8
#define HS_PER_LANE (OPS_CUDA_ATTENTION_MAX_HS / WARP)
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

typedef uint16_t h16;

template <int DT> __device__ static inline float ld(const h16 *p, size_t i)
{
	return DT == CDT_BF16 ? castd_bf16_to_f32(p[i]) : castd_f16_to_f32(p[i]);
}

template <int DT> __device__ static inline h16 rn(float x)
{
	return DT == CDT_BF16 ? castd_f32_to_bf16(x) : castd_f32_to_f16(x);
}

template <int DT> __device__ static inline float rnf(float x) /* x rounded to DT and back */
{
	h16 h = rn<DT>(x);
	return ld<DT>(&h, 0);
}

__device__ static float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

static unsigned row_blocks(size_t rows)
{
	return (unsigned)((rows + ROW_THREADS / WARP - 1) / (ROW_THREADS / WARP));
}

static void require_16(CudaDtype t)
{
	CUDA_REQUIRE(t == CDT_BF16 || t == CDT_F16,
		     "ops16_cuda: the type must be CDT_BF16 or CDT_F16, got %d", (int)t);
}

/* launch kernel<t> with the arguments that follow, then check the launch */
#define LAUNCH16(t, kernel, grid, block, ...)                                                    \
	do {                                                                                     \
		require_16(t);                                                                   \
		if ((t) == CDT_BF16)                                                             \
			kernel<CDT_BF16><<<(grid), (block), 0, ctx->stream>>>(__VA_ARGS__);      \
		else                                                                             \
			kernel<CDT_F16><<<(grid), (block), 0, ctx->stream>>>(__VA_ARGS__);       \
		CUDA_CHECK_LAUNCH();                                                             \
	} while (0)

void ops16_cuda_round(CudaCtx *ctx, CudaDtype t, void *dst, const float *src, size_t n)
{
	require_16(t);
	cast_cuda(ctx, dst, t, src, CDT_F32, n);
}

/* ---- linear layers ---- */

__global__ static void bias_fill16_kernel(h16 *y, const h16 *b, size_t n, int C)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = b[i % C];
}

void ops16_cuda_matmul_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, const void *w,
			       const void *b, int N, int C_in, int C_out)
{
	require_16(t);
	float beta = 0.0f;
	if (b) {
		size_t n = (size_t)N * C_out;
		bias_fill16_kernel<<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
			(h16 *)y, (const h16 *)b, n, C_out);
		CUDA_CHECK_LAUNCH();
		beta = 1.0f;
	}
	gemm_cuda(ctx, t, t, 0, 0, N, C_out, C_in, 1.0f, x, w, beta, y);
}

void ops16_cuda_lm_head_forward(CudaCtx *ctx, CudaDtype t, float *logits, const void *x,
				const void *wte, int N, int C, int V)
{
	require_16(t);
	gemm_cuda(ctx, t, CDT_F32, 0, 1, N, V, C, 1.0f, x, wte, 0.0f, logits);
}

void ops16_cuda_lm_head_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dwte,
				 const void *dlogits, const void *x, const void *wte, int N, int C,
				 int V)
{
	require_16(t);
	if (dx) /* dx (N, C) += dlogits (N, V) wte (V, C) */
		gemm_cuda(ctx, t, CDT_F32, 0, 0, N, C, V, 1.0f, dlogits, wte, 1.0f, dx);
	if (dwte) /* dwte (V, C) += dlogits^T x */
		gemm_cuda(ctx, t, CDT_F32, 1, 0, V, C, N, 1.0f, dlogits, x, 1.0f, dwte);
}

/* ---- layernorm ---- */

template <int DT>
__device__ static void row_stats16(const h16 *x, int C, int lane, float *mean, float *rstd)
{
	float s = 0.0f;
	for (int i = lane; i < C; i += WARP)
		s += ld<DT>(x, i);
	float m = warp_sum(s) / (float)C;
	float sq = 0.0f;
	for (int i = lane; i < C; i += WARP) {
		float d = ld<DT>(x, i) - m;
		sq += d * d;
	}
	*mean = m;
	*rstd = 1.0f / sqrtf(warp_sum(sq) / (float)C + OPS_LAYERNORM_EPS);
}

template <int DT>
__global__ static void layernorm_forward16_kernel(h16 *y, const h16 *x, const h16 *w,
						  const h16 *b, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const h16 *xr = x + (size_t)row * C;
	h16 *yr = y + (size_t)row * C;
	float m, r;
	row_stats16<DT>(xr, C, lane, &m, &r);
	for (int i = lane; i < C; i += WARP)
		yr[i] = rn<DT>((ld<DT>(xr, i) - m) * r * ld<DT>(w, i) + ld<DT>(b, i));
}

void ops16_cuda_layernorm_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x,
				  const void *w, const void *b, int N, int C)
{
	LAUNCH16(t, layernorm_forward16_kernel, row_blocks(N), ROW_THREADS, (h16 *)y,
		 (const h16 *)x, (const h16 *)w, (const h16 *)b, N, C);
}

template <int DT>
__global__ static void layernorm_backward_rows16_kernel(float *dx, float *stats, const float *dy,
							const h16 *x, const h16 *w, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const h16 *xr = x + (size_t)row * C;
	const float *dyr = dy + (size_t)row * C;
	float m, r;
	row_stats16<DT>(xr, C, lane, &m, &r);
	if (lane == 0) {
		stats[row] = m;
		stats[N + row] = r;
	}
	if (!dx)
		return;
	float g_sum = 0.0f, gx_sum = 0.0f;
	for (int i = lane; i < C; i += WARP) {
		float g = dyr[i] * ld<DT>(w, i);
		g_sum += g;
		gx_sum += g * (ld<DT>(xr, i) - m) * r;
	}
	float g_mean = warp_sum(g_sum) / (float)C, gx_mean = warp_sum(gx_sum) / (float)C;
	float *dxr = dx + (size_t)row * C;
	for (int i = lane; i < C; i += WARP) {
		float xhat = (ld<DT>(xr, i) - m) * r;
		dxr[i] += r * (dyr[i] * ld<DT>(w, i) - g_mean - xhat * gx_mean);
	}
}

template <int DT>
__global__ static void layernorm_backward_cols16_kernel(float *dw, float *db, const float *stats,
							const float *dy, const h16 *x, int N, int C)
{
	__shared__ float pw[COL_Y][COL_X], pb[COL_Y][COL_X];
	int j = blockIdx.x * COL_X + threadIdx.x;
	float sw = 0.0f, sb = 0.0f;
	if (j < C)
		for (int i = threadIdx.y; i < N; i += COL_Y) {
			float d = dy[(size_t)i * C + j];
			sw += d * ((ld<DT>(x, (size_t)i * C + j) - stats[i]) * stats[N + i]);
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

void ops16_cuda_layernorm_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dw, float *db,
				   const float *dy, const void *x, const void *w, int N, int C,
				   float *scratch)
{
	LAUNCH16(t, layernorm_backward_rows16_kernel, row_blocks(N), ROW_THREADS, dx, scratch, dy,
		 (const h16 *)x, (const h16 *)w, N, C);
	if (!dw && !db)
		return;
	dim3 block(COL_X, COL_Y);
	LAUNCH16(t, layernorm_backward_cols16_kernel, (C + COL_X - 1) / COL_X, block, dw, db,
		 scratch, dy, (const h16 *)x, N, C);
}

/* ---- GELU, residual, embedding ---- */

template <int DT> __global__ static void gelu_forward16_kernel(h16 *y, const h16 *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = ld<DT>(x, i);
		y[i] = rn<DT>(0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v))));
	}
}

template <int DT>
__global__ static void gelu_backward16_kernel(float *dx, const float *dy, const h16 *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = ld<DT>(x, i);
		float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
		float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
		dx[i] += dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
	}
}

void ops16_cuda_gelu_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *x, size_t n)
{
	LAUNCH16(t, gelu_forward16_kernel, cuda_blocks_for(n, EW_THREADS), EW_THREADS, (h16 *)y,
		 (const h16 *)x, n);
}

void ops16_cuda_gelu_backward(CudaCtx *ctx, CudaDtype t, float *dx, const float *dy,
			      const void *x, size_t n)
{
	LAUNCH16(t, gelu_backward16_kernel, cuda_blocks_for(n, EW_THREADS), EW_THREADS, dx, dy,
		 (const h16 *)x, n);
}

template <int DT>
__global__ static void residual16_kernel(h16 *y, const h16 *a, const h16 *b, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = rn<DT>(ld<DT>(a, i) + ld<DT>(b, i)); /* y may be a or b: read, then written */
}

void ops16_cuda_residual_forward(CudaCtx *ctx, CudaDtype t, void *y, const void *a, const void *b,
				 size_t n)
{
	LAUNCH16(t, residual16_kernel, cuda_blocks_for(n, EW_THREADS), EW_THREADS, (h16 *)y,
		 (const h16 *)a, (const h16 *)b, n);
}

template <int DT>
__global__ static void embed16_kernel(h16 *y, const int *tokens, const h16 *wte, const h16 *wpe,
				      int T, int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / C;
		int c = (int)(i % C), t = (int)(row % T);
		y[i] = rn<DT>(ld<DT>(wte, (size_t)tokens[row] * C + c) + ld<DT>(wpe, (size_t)t * C + c));
	}
}

void ops16_cuda_embed_forward(CudaCtx *ctx, CudaDtype t, void *y, const int *tokens,
			      const void *wte, const void *wpe, int B, int T, int C)
{
	size_t n = (size_t)B * T * C;
	LAUNCH16(t, embed16_kernel, cuda_blocks_for(n, EW_THREADS), EW_THREADS, (h16 *)y, tokens,
		 (const h16 *)wte, (const h16 *)wpe, T, C, n);
}

/* ---- attention ---- */

/* a . b over one head, both of type DT or (dot_fh) a fp32; every lane gets the result */
template <int DT> __device__ static float dot_hh(const h16 *a, const h16 *b, int hs, int lane)
{
	float s = 0.0f;
	for (int i = lane; i < hs; i += WARP)
		s += ld<DT>(a, i) * ld<DT>(b, i);
	return warp_sum(s);
}

template <int DT> __device__ static float dot_fh(const float *a, const h16 *b, int hs, int lane)
{
	float s = 0.0f;
	for (int i = lane; i < hs; i += WARP)
		s += a[i] * ld<DT>(b, i);
	return warp_sum(s);
}

/* As attention_forward_kernel in ops_cuda.cu, att of type DT, so the scores, the exponentials
 * and the probabilities are rounded where they are stored (ops16_attention_forward's points); the
 * max is over the rounded scores and the sum over the unrounded exponentials. */
template <int DT>
__global__ static void attention_forward16_kernel(h16 *out, h16 *att, const h16 *qkv, int B,
						  int T, int C, int NH, float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C;
	const h16 *base = qkv + (size_t)b * T * row3;
	const h16 *q = base + t * row3 + (size_t)h * hs;
	h16 *p = att + row * T;

	float mx = -INFINITY;
	for (int t2 = 0; t2 <= t; t2++) {
		float s = rnf<DT>(dot_hh<DT>(q, base + t2 * row3 + C + (size_t)h * hs, hs, lane) *
				  scale);
		if (lane == (t2 & (WARP - 1)))
			p[t2] = rn<DT>(s);
		mx = fmaxf(mx, s);
	}
	float sum = 0.0f;
	for (int t2 = lane; t2 <= t; t2 += WARP) {
		float e = expf(ld<DT>(p, t2) - mx);
		p[t2] = rn<DT>(e);
		sum += e;
	}
	float inv = 1.0f / warp_sum(sum);
	for (int t2 = lane; t2 <= t; t2 += WARP)
		p[t2] = rn<DT>(ld<DT>(p, t2) * inv);
	for (int t2 = t + 1 + lane; t2 < T; t2 += WARP)
		p[t2] = rn<DT>(0.0f);
	__syncwarp();

	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float pv = ld<DT>(p, t2);
		const h16 *v = base + t2 * row3 + 2 * (size_t)C + (size_t)h * hs;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += pv * ld<DT>(v, lane + j * WARP);
	}
	h16 *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			o[lane + j * WARP] = rn<DT>(acc[j]);
}

/* As attention_backward_query_kernel, qkv and att of type DT; dout and dqkv fp32. */
template <int DT>
__global__ static void attention_backward_query16_kernel(float *dqkv, float *pdp_out,
							 const float *dout, const h16 *qkv,
							 const h16 *att, int B, int T, int C,
							 int NH, float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C, hoff = (size_t)h * hs;
	const h16 *base = qkv + (size_t)b * T * row3;
	const h16 *p = att + row * T;
	const float *g = dout + ((size_t)b * T + t) * C + hoff;

	float pdp = 0.0f;
	for (int t2 = 0; t2 <= t; t2++)
		pdp += ld<DT>(p, t2) * dot_fh<DT>(g, base + t2 * row3 + 2 * (size_t)C + hoff, hs, lane);
	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float dp = dot_fh<DT>(g, base + t2 * row3 + 2 * (size_t)C + hoff, hs, lane);
		float ds = ld<DT>(p, t2) * (dp - pdp) * scale;
		const h16 *k = base + t2 * row3 + C + hoff;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += ds * ld<DT>(k, lane + j * WARP);
	}
	float *dq = dqkv + (size_t)b * T * row3 + t * row3 + hoff;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			dq[lane + j * WARP] += acc[j];
	if (lane == 0)
		pdp_out[row] = pdp;
}

/* As attention_backward_key_kernel, qkv and att of type DT. */
template <int DT>
__global__ static void attention_backward_key16_kernel(float *dqkv, const float *pdp,
						       const float *dout, const h16 *qkv,
						       const h16 *att, int B, int T, int C, int NH,
						       float scale)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)B * NH * T)
		return;
	int t2 = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / ((size_t)T * NH));
	int hs = C / NH;
	size_t row3 = (size_t)3 * C, hoff = (size_t)h * hs;
	const h16 *base = qkv + (size_t)b * T * row3;
	const h16 *v = base + t2 * row3 + 2 * (size_t)C + hoff;
	size_t head_rows = row - t2;

	float adk[HS_PER_LANE] = {0}, adv[HS_PER_LANE] = {0};
	for (int t = t2; t < T; t++) {
		float pt = ld<DT>(att, (head_rows + t) * T + t2);
		const float *g = dout + ((size_t)b * T + t) * C + hoff;
		const h16 *q = base + t * row3 + hoff;
		float ds = pt * (dot_fh<DT>(g, v, hs, lane) - pdp[head_rows + t]) * scale;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs) {
				adv[j] += pt * g[lane + j * WARP];
				adk[j] += ds * ld<DT>(q, lane + j * WARP);
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

static void attention16_check(int C, int NH)
{
	CUDA_REQUIRE(NH > 0 && C % NH == 0 && C / NH <= OPS_CUDA_ATTENTION_MAX_HS,
		     "ops16_cuda attention: C (%d) must be a multiple of NH (%d) with C / NH <= %d",
		     C, NH, OPS_CUDA_ATTENTION_MAX_HS);
}

void ops16_cuda_attention_forward(CudaCtx *ctx, CudaDtype t, void *out, void *att,
				  const void *qkv, int B, int T, int C, int NH)
{
	attention16_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	LAUNCH16(t, attention_forward16_kernel, row_blocks((size_t)B * NH * T), ROW_THREADS,
		 (h16 *)out, (h16 *)att, (const h16 *)qkv, B, T, C, NH, scale);
}

void ops16_cuda_attention_backward(CudaCtx *ctx, CudaDtype t, float *dqkv, const float *dout,
				   const void *qkv, const void *att, int B, int T, int C, int NH,
				   float *scratch)
{
	attention16_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	unsigned blocks = row_blocks((size_t)B * NH * T);
	LAUNCH16(t, attention_backward_query16_kernel, blocks, ROW_THREADS, dqkv, scratch, dout,
		 (const h16 *)qkv, (const h16 *)att, B, T, C, NH, scale);
	LAUNCH16(t, attention_backward_key16_kernel, blocks, ROW_THREADS, dqkv, scratch, dout,
		 (const h16 *)qkv, (const h16 *)att, B, T, C, NH, scale);
}
