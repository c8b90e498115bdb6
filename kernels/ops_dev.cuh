/* ops_dev: the layer ops' kernels that fp32 and 16-bit storage share, one template per op over a
 * storage policy S (how a stored element is read into an fp32 register and how an fp32 result is
 * stored), with their launches. ops_cuda.cu instantiates them for fp32, where the policy is the
 * identity, and ops16_cuda.cu for bf16 and fp16, where every load is widened and every store
 * rounded by cast_dev.cuh, so each rounding is precision.c's and falls where ops16_cpu.h says.
 * Math is fp32 in registers in every case. Row-wise ops give one warp to a row (lanes stride the
 * channels, sums by butterfly shuffles); column sums give a thread to a column and reduce a fixed
 * number of row phases in shared memory, in a fixed order. Included by those two .cu files only;
 * not a module of its own. */
#ifndef PX_OPS_DEV_CUH
#define PX_OPS_DEV_CUH

#include <math.h>
#include <stdint.h>

#include "cast_dev.cuh"
#include "cuda_check.h"
#include "gemm_cuda.h"
#include "ops_cuda.h"
extern "C" {
#include "ops_cpu.h" /* OPS_LAYERNORM_EPS: one epsilon for all */
}

#define WARP 32
#define FULL_MASK 0xffffffffu
#define ROW_THREADS 128 /* four warps, four rows, a block */
#define EW_THREADS 256  /* elementwise kernels */
/* Column-sum blocks: COL_X columns by COL_Y row phases. */
#define COL_X 32
#define COL_Y 8

/* ---- storage policies ---- */

/* S::T is the element as stored; S::ld(p, i) reads p[i] into fp32, S::st(x) is x as stored and
 * S::rnf(x) is x rounded as a store would round it, kept in fp32. fp32 storage: the identity, so
 * its instantiations do the arithmetic of plain float kernels, in the same order. */
struct StoreF32 {
	typedef float T;
	__device__ static inline float ld(const float *p, size_t i)
	{
		return p[i];
	}
	__device__ static inline float st(float x)
	{
		return x;
	}
	__device__ static inline float rnf(float x)
	{
		return x;
	}
};

/* bf16 or fp16 (DT = CDT_BF16, CDT_F16), precision.h's bits in a uint16_t */
template <int DT> struct Store16 {
	typedef uint16_t T;
	__device__ static inline float widen(uint16_t h)
	{
		return DT == CDT_BF16 ? castd_bf16_to_f32(h) : castd_f16_to_f32(h);
	}
	__device__ static inline float ld(const uint16_t *p, size_t i)
	{
		return widen(p[i]);
	}
	__device__ static inline uint16_t st(float x)
	{
		return DT == CDT_BF16 ? castd_f32_to_bf16(x) : castd_f32_to_f16(x);
	}
	__device__ static inline float rnf(float x)
	{
		return widen(st(x));
	}
};

typedef Store16<CDT_BF16> StoreBF16;
typedef Store16<CDT_F16> StoreF16;

/* ---- shared helpers ---- */

__device__ static inline float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v; /* every lane holds the sum */
}

static inline unsigned row_blocks(size_t rows)
{
	return (unsigned)((rows + ROW_THREADS / WARP - 1) / (ROW_THREADS / WARP));
}

/* fatal unless t is one of the 16-bit types; who names the caller */
static inline void opsd_require_16(CudaDtype t, const char *who)
{
	CUDA_REQUIRE(t == CDT_BF16 || t == CDT_F16,
		     "%s: the type must be CDT_BF16 or CDT_F16, got %d", who, (int)t);
}

/* ---- linear layers ---- */

template <typename T> __global__ static void bias_fill_kernel(T *y, const T *b, size_t n, int C)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = b[i % C];
}

/* y (N, C_out) = x w + b: x, w of type t_in; y and b of type t_out, T its element (b may be
 * NULL). As the reference: the bias first, then one GEMM with beta = 1 adds the fp32 product onto
 * it (read back exactly) and rounds the sum once to t_out. */
template <typename T>
static void opsd_linear_forward(CudaCtx *ctx, CudaDtype t_in, CudaDtype t_out, T *y, const void *x,
				const void *w, const T *b, int N, int C_in, int C_out)
{
	float beta = 0.0f;
	if (b) {
		size_t n = (size_t)N * C_out;
		bias_fill_kernel<T><<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
			y, b, n, C_out);
		CUDA_CHECK_LAUNCH();
		beta = 1.0f;
	}
	gemm_cuda(ctx, t_in, t_out, 0, 0, N, C_out, C_in, 1.0f, x, w, beta, y);
}

/* The tied head, x and wte of type t, logits and the gradients fp32. */
static inline void opsd_lm_head_forward(CudaCtx *ctx, CudaDtype t, float *logits, const void *x,
					const void *wte, int N, int C, int V)
{
	/* logits (N, V) = x (N, C) wte^T, wte stored (V, C) */
	gemm_cuda(ctx, t, CDT_F32, 0, 1, N, V, C, 1.0f, x, wte, 0.0f, logits);
}

static inline void opsd_lm_head_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dwte,
					 const void *dlogits, const void *x, const void *wte,
					 int N, int C, int V)
{
	if (dx) /* dx (N, C) += dlogits (N, V) wte (V, C) */
		gemm_cuda(ctx, t, CDT_F32, 0, 0, N, C, V, 1.0f, dlogits, wte, 1.0f, dx);
	if (dwte) /* dwte (V, C) += dlogits^T x */
		gemm_cuda(ctx, t, CDT_F32, 1, 0, V, C, N, 1.0f, dlogits, x, 1.0f, dwte);
}

/* ---- layernorm ---- */

/* Two-pass mean and rstd of one row by one warp, the same formula forward and backward use. */
template <class S>
__device__ static void row_stats(const typename S::T *x, int C, int lane, float *mean,
				 float *rstd)
{
	float s = 0.0f;
	for (int i = lane; i < C; i += WARP)
		s += S::ld(x, i);
	float m = warp_sum(s) / (float)C;
	float sq = 0.0f;
	for (int i = lane; i < C; i += WARP) {
		float d = S::ld(x, i) - m;
		sq += d * d;
	}
	*mean = m;
	*rstd = 1.0f / sqrtf(warp_sum(sq) / (float)C + OPS_LAYERNORM_EPS);
}

/* mean and rstd (fp32, N each) may be NULL */
template <class S>
__global__ static void layernorm_forward_kernel(typename S::T *y, float *mean, float *rstd,
						const typename S::T *x, const typename S::T *w,
						const typename S::T *b, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const typename S::T *xr = x + (size_t)row * C;
	typename S::T *yr = y + (size_t)row * C;
	float m, r;
	row_stats<S>(xr, C, lane, &m, &r);
	for (int i = lane; i < C; i += WARP) /* y may be x: each lane rewrites what it read */
		yr[i] = S::st((S::ld(xr, i) - m) * r * S::ld(w, i) + S::ld(b, i));
	if (lane == 0 && mean)
		mean[row] = m;
	if (lane == 0 && rstd)
		rstd[row] = r;
}

template <class S>
static void opsd_layernorm_forward(CudaCtx *ctx, typename S::T *y, float *mean, float *rstd,
				   const typename S::T *x, const typename S::T *w,
				   const typename S::T *b, int N, int C)
{
	layernorm_forward_kernel<S><<<row_blocks(N), ROW_THREADS, 0, ctx->stream>>>(
		y, mean, rstd, x, w, b, N, C);
	CUDA_CHECK_LAUNCH();
}

/* dx as ops_layernorm_backward's: rstd (g - mean(g) - xhat mean(g xhat)), g = dy w; dy and dx
 * fp32. Also leaves the row's statistics in stats[row] and stats[N + row] for the column kernel. */
template <class S>
__global__ static void layernorm_backward_rows_kernel(float *dx, float *stats, const float *dy,
						      const typename S::T *x,
						      const typename S::T *w, int N, int C)
{
	int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
	if (row >= N)
		return;
	const typename S::T *xr = x + (size_t)row * C;
	const float *dyr = dy + (size_t)row * C;
	float m, r;
	row_stats<S>(xr, C, lane, &m, &r);
	if (lane == 0) {
		stats[row] = m;
		stats[N + row] = r;
	}
	if (!dx)
		return;
	float g_sum = 0.0f, gx_sum = 0.0f;
	for (int i = lane; i < C; i += WARP) {
		float g = dyr[i] * S::ld(w, i);
		g_sum += g;
		gx_sum += g * (S::ld(xr, i) - m) * r;
	}
	float g_mean = warp_sum(g_sum) / (float)C, gx_mean = warp_sum(gx_sum) / (float)C;
	float *dxr = dx + (size_t)row * C;
	for (int i = lane; i < C; i += WARP) {
		float xhat = (S::ld(xr, i) - m) * r;
		dxr[i] += r * (dyr[i] * S::ld(w, i) - g_mean - xhat * gx_mean);
	}
}

/* dw[j] += sum_i dy[i][j] xhat[i][j]; db[j] += sum_i dy[i][j]: phase y sums rows y, y + COL_Y,
 * ...; the COL_Y partials then add up in phase order, so the result does not depend on
 * scheduling. */
template <class S>
__global__ static void layernorm_backward_cols_kernel(float *dw, float *db, const float *stats,
						      const float *dy, const typename S::T *x,
						      int N, int C)
{
	__shared__ float pw[COL_Y][COL_X], pb[COL_Y][COL_X];
	int j = blockIdx.x * COL_X + threadIdx.x;
	float sw = 0.0f, sb = 0.0f;
	if (j < C)
		for (int i = threadIdx.y; i < N; i += COL_Y) {
			float d = dy[(size_t)i * C + j];
			sw += d * ((S::ld(x, (size_t)i * C + j) - stats[i]) * stats[N + i]);
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

/* scratch: OPS_CUDA_LAYERNORM_SCRATCH_ELEMS(N) floats */
template <class S>
static void opsd_layernorm_backward(CudaCtx *ctx, float *dx, float *dw, float *db, const float *dy,
				    const typename S::T *x, const typename S::T *w, int N, int C,
				    float *scratch)
{
	layernorm_backward_rows_kernel<S><<<row_blocks(N), ROW_THREADS, 0, ctx->stream>>>(
		dx, scratch, dy, x, w, N, C);
	CUDA_CHECK_LAUNCH();
	if (!dw && !db)
		return;
	dim3 block(COL_X, COL_Y);
	layernorm_backward_cols_kernel<S><<<(C + COL_X - 1) / COL_X, block, 0, ctx->stream>>>(
		dw, db, scratch, dy, x, N, C);
	CUDA_CHECK_LAUNCH();
}

/* ---- GELU ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

template <class S>
__global__ static void gelu_forward_kernel(typename S::T *y, const typename S::T *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = S::ld(x, i);
		y[i] = S::st(0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v))));
	}
}

/* dx and dy fp32 */
template <class S>
__global__ static void gelu_backward_kernel(float *dx, const float *dy, const typename S::T *x,
					    size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = S::ld(x, i);
		float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
		float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
		dx[i] += dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
	}
}

template <class S>
static void opsd_gelu_forward(CudaCtx *ctx, typename S::T *y, const typename S::T *x, size_t n)
{
	gelu_forward_kernel<S><<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(y, x,
											     n);
	CUDA_CHECK_LAUNCH();
}

template <class S>
static void opsd_gelu_backward(CudaCtx *ctx, float *dx, const float *dy, const typename S::T *x,
			       size_t n)
{
	gelu_backward_kernel<S><<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		dx, dy, x, n);
	CUDA_CHECK_LAUNCH();
}

/* ---- residual and embedding (forward) ---- */

template <class S>
__global__ static void residual_forward_kernel(typename S::T *y, const typename S::T *a,
					       const typename S::T *b, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = S::st(S::ld(a, i) + S::ld(b, i)); /* y may be a or b: read, then written */
}

template <class S>
static void opsd_residual_forward(CudaCtx *ctx, typename S::T *y, const typename S::T *a,
				  const typename S::T *b, size_t n)
{
	residual_forward_kernel<S><<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		y, a, b, n);
	CUDA_CHECK_LAUNCH();
}

template <class S>
__global__ static void embed_forward_kernel(typename S::T *y, const int *tokens,
					    const typename S::T *wte, const typename S::T *wpe,
					    int T, int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / C;
		int c = (int)(i % C), t = (int)(row % T);
		y[i] = S::st(S::ld(wte, (size_t)tokens[row] * C + c) +
			     S::ld(wpe, (size_t)t * C + c));
	}
}

template <class S>
static void opsd_embed_forward(CudaCtx *ctx, typename S::T *y, const int *tokens,
			       const typename S::T *wte, const typename S::T *wpe, int B, int T,
			       int C)
{
	size_t n = (size_t)B * T * C;
	embed_forward_kernel<S><<<cuda_blocks_for(n, EW_THREADS), EW_THREADS, 0, ctx->stream>>>(
		y, tokens, wte, wpe, T, C, n);
	CUDA_CHECK_LAUNCH();
}

/* ---- attention ---- */

/* A lane keeps head dimensions lane, lane + 32, ...: at most this many. */
#define HS_PER_LANE (OPS_CUDA_ATTENTION_MAX_HS / WARP)

/* a . b over one head, a stored as SA and b as SB; every lane gets the result */
template <class SA, class SB>
__device__ static float head_dot(const typename SA::T *a, const typename SB::T *b, int hs,
				 int lane)
{
	float s = 0.0f;
	for (int i = lane; i < hs; i += WARP)
		s += SA::ld(a, i) * SB::ld(b, i);
	return warp_sum(s);
}

/* The warp's attention row, row = (b NH + h) T + t, as its kernels index it: t is the query's
 * position in the forward and query kernels, the key's in the key kernel. */
struct AttnRow {
	size_t row, row3, hoff; /* row3: a qkv row's length 3 C; hoff: the head's offset, h hs */
	int lane, b, h, t, hs;
};

/* false for a warp past the last row */
__device__ static inline bool attn_row(AttnRow *r, int B, int T, int C, int NH)
{
	r->row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	r->lane = threadIdx.x % WARP;
	if (r->row >= (size_t)B * NH * T)
		return false;
	r->t = (int)(r->row % T);
	r->h = (int)(r->row / T % NH);
	r->b = (int)(r->row / ((size_t)T * NH));
	r->hs = C / NH;
	r->row3 = (size_t)3 * C;
	r->hoff = (size_t)r->h * r->hs;
	return true;
}

/* One warp per query row (b, h, t). The score of key t2 is written by lane t2 % 32, which is the
 * lane that later exponentiates and normalises it, so those passes need no exchange; the output
 * pass reads the whole row, after a __syncwarp that orders those writes before the reads. With
 * 16-bit att the scores, the exponentials and the probabilities are rounded where they are stored
 * (ops16_attention_forward's points): the max is over the rounded scores, the sum over the
 * unrounded exponentials. */
template <class S>
__global__ static void attention_forward_kernel(typename S::T *out, typename S::T *att,
						const typename S::T *qkv, int B, int T, int C,
						int NH, float scale)
{
	AttnRow r;
	if (!attn_row(&r, B, T, C, NH))
		return;
	int t = r.t, lane = r.lane, hs = r.hs;
	const typename S::T *base = qkv + (size_t)r.b * T * r.row3;
	const typename S::T *q = base + t * r.row3 + r.hoff;
	typename S::T *p = att + r.row * T;

	float mx = -INFINITY;
	for (int t2 = 0; t2 <= t; t2++) {
		const typename S::T *k = base + t2 * r.row3 + C + r.hoff;
		float s = S::rnf(head_dot<S, S>(q, k, hs, lane) * scale);
		if (lane == (t2 & (WARP - 1)))
			p[t2] = S::st(s);
		mx = fmaxf(mx, s);
	}
	float sum = 0.0f;
	for (int t2 = lane; t2 <= t; t2 += WARP) {
		float e = expf(S::ld(p, t2) - mx);
		p[t2] = S::st(e);
		sum += e;
	}
	float inv = 1.0f / warp_sum(sum);
	for (int t2 = lane; t2 <= t; t2 += WARP)
		p[t2] = S::st(S::ld(p, t2) * inv);
	for (int t2 = t + 1 + lane; t2 < T; t2 += WARP)
		p[t2] = S::st(0.0f);
	__syncwarp();

	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float pv = S::ld(p, t2);
		const typename S::T *v = base + t2 * r.row3 + 2 * (size_t)C + r.hoff;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += pv * S::ld(v, lane + j * WARP);
	}
	typename S::T *o = out + ((size_t)r.b * T + t) * C + r.hoff;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			o[lane + j * WARP] = S::st(acc[j]);
}

/* Query rows: pdp = sum_t2 P[t2] dP[t2] with dP[t2] = dout . v[t2], kept in pdp_out for the key
 * kernel; then dq += scale sum_t2 P[t2] (dP[t2] - pdp) k[t2]. dq belongs to this row alone.
 * qkv and att stored as S; dout, dqkv and pdp fp32. */
template <class S>
__global__ static void attention_backward_query_kernel(float *dqkv, float *pdp_out,
						       const float *dout,
						       const typename S::T *qkv,
						       const typename S::T *att, int B, int T,
						       int C, int NH, float scale)
{
	AttnRow r;
	if (!attn_row(&r, B, T, C, NH))
		return;
	int t = r.t, lane = r.lane, hs = r.hs;
	const typename S::T *base = qkv + (size_t)r.b * T * r.row3;
	const typename S::T *p = att + r.row * T;
	const float *g = dout + ((size_t)r.b * T + t) * C + r.hoff;

	float pdp = 0.0f;
	for (int t2 = 0; t2 <= t; t2++)
		pdp += S::ld(p, t2) *
		       head_dot<StoreF32, S>(g, base + t2 * r.row3 + 2 * (size_t)C + r.hoff, hs, lane);
	float acc[HS_PER_LANE] = {0};
	for (int t2 = 0; t2 <= t; t2++) {
		float dp = head_dot<StoreF32, S>(g, base + t2 * r.row3 + 2 * (size_t)C + r.hoff, hs,
						 lane);
		float ds = S::ld(p, t2) * (dp - pdp) * scale;
		const typename S::T *k = base + t2 * r.row3 + C + r.hoff;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs)
				acc[j] += ds * S::ld(k, lane + j * WARP);
	}
	float *dq = dqkv + (size_t)r.b * T * r.row3 + t * r.row3 + r.hoff;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs)
			dq[lane + j * WARP] += acc[j];
	if (lane == 0)
		pdp_out[r.row] = pdp;
}

/* Key rows (b, h, t2): dv[t2] += sum_{t >= t2} P[t][t2] dout[t];
 * dk[t2] += scale sum_{t >= t2} P[t][t2] (dout[t] . v[t2] - pdp[t]) q[t]. Types as the query
 * kernel's. */
template <class S>
__global__ static void attention_backward_key_kernel(float *dqkv, const float *pdp,
						     const float *dout, const typename S::T *qkv,
						     const typename S::T *att, int B, int T, int C,
						     int NH, float scale)
{
	AttnRow r;
	if (!attn_row(&r, B, T, C, NH))
		return;
	int t2 = r.t, lane = r.lane, hs = r.hs;
	const typename S::T *base = qkv + (size_t)r.b * T * r.row3;
	const typename S::T *v = base + t2 * r.row3 + 2 * (size_t)C + r.hoff;
	size_t head_rows = r.row - t2; /* first row of this (b, h) in att and pdp */

	float adk[HS_PER_LANE] = {0}, adv[HS_PER_LANE] = {0};
	for (int t = t2; t < T; t++) {
		float pt = S::ld(att, (head_rows + t) * T + t2);
		const float *g = dout + ((size_t)r.b * T + t) * C + r.hoff;
		const typename S::T *q = base + t * r.row3 + r.hoff;
		float dp = head_dot<StoreF32, S>(g, v, hs, lane);
		float ds = pt * (dp - pdp[head_rows + t]) * scale;
#pragma unroll
		for (int j = 0; j < HS_PER_LANE; j++)
			if (lane + j * WARP < hs) {
				adv[j] += pt * g[lane + j * WARP];
				adk[j] += ds * S::ld(q, lane + j * WARP);
			}
	}
	float *dk = dqkv + (size_t)r.b * T * r.row3 + t2 * r.row3 + C + r.hoff;
	float *dv = dk + C;
#pragma unroll
	for (int j = 0; j < HS_PER_LANE; j++)
		if (lane + j * WARP < hs) {
			dk[lane + j * WARP] += adk[j];
			dv[lane + j * WARP] += adv[j];
		}
}

static inline void opsd_attention_check(int C, int NH)
{
	CUDA_REQUIRE(NH > 0 && C % NH == 0 && C / NH <= OPS_CUDA_ATTENTION_MAX_HS,
		     "attention: C (%d) must be a multiple of NH (%d) with C / NH <= %d", C, NH,
		     OPS_CUDA_ATTENTION_MAX_HS);
}

template <class S>
static void opsd_attention_forward(CudaCtx *ctx, typename S::T *out, typename S::T *att,
				   const typename S::T *qkv, int B, int T, int C, int NH)
{
	opsd_attention_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	attention_forward_kernel<S><<<row_blocks((size_t)B * NH * T), ROW_THREADS, 0,
				      ctx->stream>>>(out, att, qkv, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
}

/* scratch: OPS_CUDA_ATTENTION_SCRATCH_ELEMS(B, T, NH) floats */
template <class S>
static void opsd_attention_backward(CudaCtx *ctx, float *dqkv, const float *dout,
				    const typename S::T *qkv, const typename S::T *att, int B,
				    int T, int C, int NH, float *scratch)
{
	opsd_attention_check(C, NH);
	float scale = 1.0f / sqrtf((float)(C / NH));
	unsigned blocks = row_blocks((size_t)B * NH * T);
	attention_backward_query_kernel<S><<<blocks, ROW_THREADS, 0, ctx->stream>>>(
		dqkv, scratch, dout, qkv, att, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
	attention_backward_key_kernel<S><<<blocks, ROW_THREADS, 0, ctx->stream>>>(
		dqkv, scratch, dout, qkv, att, B, T, C, NH, scale);
	CUDA_CHECK_LAUNCH();
}

#endif
