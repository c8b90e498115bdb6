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

/* S::T is the element as stored, S::DTYPE its CudaDtype; S::ld(p, i) reads p[i] into fp32, S::st(x) is x as stored and
 * S::rnf(x) is x rounded as a store would round it, kept in fp32. fp32 storage: the identity, so
 * its instantiations do the arithmetic of plain float kernels, in the same order. */
struct StoreF32 {
	typedef float T;
	enum { DTYPE = CDT_F32 };
	__device__ static inline float ld(const float *p, size_t i)
	{
		return p[i];
	}
	__device__ static inline float st(float x)
	{
		return x;
	}
};

/* bf16 or fp16 (DT = CDT_BF16, CDT_F16), precision.h's bits in a uint16_t */
template <int DT> struct Store16 {
	typedef uint16_t T;
	enum { DTYPE = DT };
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

__device__ static inline float warp_max(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
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

/* ---- column sums ----
 * A sum over N rows for each of C columns, deterministic and spread over the whole GPU: the rows
 * split into R blocks of consecutive rows; pass one gives each (column tile, row block) a block
 * of COL_X columns by COL_Y row phases, whose phases add up in order in shared memory into the
 * row block's partial (the context's col_part); pass two adds each column's R partials in row
 * block order into the result. R depends on the shape and the device's multiprocessor count
 * alone, so a run repeats bit for bit on one kind of GPU. Columns beyond what col_part holds go
 * in chunks of W. */
#define COL_BLOCKS_PER_SM 4
#define COL_MAX_ROW_BLOCKS 64

struct ColPlan {
	int R;    /* row blocks */
	int rows; /* rows per row block (the last may have fewer) */
	int W;    /* columns per chunk, a multiple of COL_X */
};

/* outs: how many sums share the pass (layernorm's dw and db: 2) */
static inline ColPlan col_plan(const CudaCtx *ctx, int N, int C, int outs)
{
	ColPlan p;
	int tiles = (C + COL_X - 1) / COL_X;
	int want = (COL_BLOCKS_PER_SM * ctx->sm_count + tiles - 1) / tiles;
	int most = (N + COL_Y - 1) / COL_Y; /* at least COL_Y rows a block */
	p.R = want < most ? want : most;
	if (p.R > COL_MAX_ROW_BLOCKS)
		p.R = COL_MAX_ROW_BLOCKS;
	if (p.R < 1)
		p.R = 1;
	p.rows = (N + p.R - 1) / p.R;
	int fit = (int)(CUDA_CTX_COL_PART_ELEMS / ((size_t)outs * p.R)) / COL_X * COL_X;
	p.W = tiles * COL_X < fit ? tiles * COL_X : fit;
	return p;
}

/* Pass one's block reduction: phase partials in order, written as row block blockIdx.y's partial
 * of column jj of the chunk (zero past the last column). */
__device__ static inline void col_block_store(float (*sh)[COL_X], float v, float *part, int W)
{
	sh[threadIdx.y][threadIdx.x] = v;
	__syncthreads();
	if (threadIdx.y == 0) {
		float t = 0.0f;
		for (int y = 0; y < COL_Y; y++)
			t += sh[y][threadIdx.x];
		part[(size_t)blockIdx.y * W + blockIdx.x * COL_X + threadIdx.x] = t;
	}
}

/* Pass two: out0[j0 + jj] += sum over r of part[r W + jj] and out1[j0 + jj] += sum over r of
 * part[(R + r) W + jj], each where not NULL */
__global__ static void col_finish_kernel(float *out0, float *out1, const float *part, int R,
					 int W, int j0, int C)
{
	int jj = blockIdx.x * blockDim.x + threadIdx.x;
	if (jj >= W || j0 + jj >= C)
		return;
	float *out[2] = {out0, out1};
	for (int k = 0; k < 2; k++) {
		if (!out[k])
			continue;
		float t = 0.0f;
		for (int r = 0; r < R; r++)
			t += part[(size_t)(k * R + r) * W + jj];
		out[k][j0 + jj] += t;
	}
}

/* The two passes over N rows of C columns, chunk by chunk: pass_one(grid, block, j0, plan)
 * launches pass one of the chunk from column j0 into ctx->col_part (outs sums of it), then pass
 * two adds its partials into out0 and out1 (either may be NULL). */
template <class PassOne>
static inline void col_sums(CudaCtx *ctx, int N, int C, int outs, float *out0, float *out1,
			    PassOne pass_one)
{
	if (N <= 0)
		return;
	ColPlan p = col_plan(ctx, N, C, outs);
	dim3 block(COL_X, COL_Y);
	for (int j0 = 0; j0 < C; j0 += p.W) {
		dim3 grid((min(p.W, C - j0) + COL_X - 1) / COL_X, p.R);
		pass_one(grid, block, j0, p);
		CUDA_CHECK_LAUNCH();
		col_finish_kernel<<<(p.W + EW_THREADS - 1) / EW_THREADS, EW_THREADS, 0,
				    ctx->stream>>>(out0, out1, ctx->col_part, p.R, p.W, j0, C);
		CUDA_CHECK_LAUNCH();
	}
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

/* The tied head, x and wte of type t, logits and the gradients fp32; the logits' rows ld >= V
 * elements apart. cuBLAS runs its 16-byte-aligned kernels only where the contiguous extent of
 * every operand is a multiple of 8 elements as well as its row stride: the logits' row (V, in
 * the forward product's output and as dx's contraction) is not when V is odd (GPT-2's 50,257),
 * and results/gpu/lease3's profile still shows those two products on the Turing align1
 * fallback. So they split at V8, V rounded down to 8: the aligned bulk, then the few remaining
 * columns (a product of extent V - V8 < 8, whose cost is negligible). dwte's product has the
 * logits' rows as its contraction and C as its row, both aligned once ld is: one product. */
static inline void opsd_lm_head_forward(CudaCtx *ctx, CudaDtype t, float *logits, const void *x,
					const void *wte, int N, int C, int V, int ld)
{
	/* logits (N, V) = x (N, C) wte^T, wte stored (V, C), in vocabulary parts (either may be
	 * empty) */
	size_t e = cuda_dtype_bytes(t);
	int cut[3] = {0, V / 8 * 8, V};
	GemmBatch a = {x, C, 0, 0};
	for (int p = 0; p < 2; p++) {
		int lo = cut[p], n = cut[p + 1] - lo;
		GemmBatch b = {(const char *)wte + (size_t)lo * C * e, C, 0, 1};
		GemmBatch o = {logits + lo, ld, 0, 0};
		if (n > 0)
			gemm_cuda_strided(ctx, t, CDT_F32, N, n, C, 1.0f, a, b, 0.0f, o);
	}
}

static inline void opsd_lm_head_backward(CudaCtx *ctx, CudaDtype t, float *dx, float *dwte,
					 const void *dlogits, const void *x, const void *wte,
					 int N, int C, int V, int ld)
{
	size_t e = cuda_dtype_bytes(t);
	int cut[3] = {0, V / 8 * 8, V};
	/* dx (N, C) += dlogits (N, V) wte (V, C), the contraction over V in the same parts */
	for (int p = 0; dx && p < 2; p++) {
		int lo = cut[p], k = cut[p + 1] - lo;
		GemmBatch a = {(const char *)dlogits + (size_t)lo * e, ld, 0, 0};
		GemmBatch b = {(const char *)wte + (size_t)lo * C * e, C, 0, 0}, o = {dx, C, 0, 0};
		if (k > 0)
			gemm_cuda_strided(ctx, t, CDT_F32, N, C, k, 1.0f, a, b, 1.0f, o);
	}
	if (dwte) { /* dwte (V, C) += dlogits^T x */
		GemmBatch a = {dlogits, ld, 0, 1}, b = {x, C, 0, 0}, o = {dwte, C, 0, 0};
		gemm_cuda_strided(ctx, t, CDT_F32, V, C, N, 1.0f, a, b, 1.0f, o);
	}
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

/* Pass one of dw[j] += sum_i dy[i][j] xhat[i][j] and db[j] += sum_i dy[i][j] (col_plan's
 * scheme), columns j0 ... j0 + W of the chunk: dw's partials first in part, then db's. */
template <class S>
__global__ static void layernorm_backward_cols_kernel(float *part, const float *stats,
						      const float *dy, const typename S::T *x,
						      int N, int C, int j0, int W, int rows)
{
	__shared__ float sh[COL_Y][COL_X];
	int j = j0 + blockIdx.x * COL_X + threadIdx.x;
	int i1 = min(N, (int)(blockIdx.y + 1) * rows);
	float sw = 0.0f, sb = 0.0f;
	if (j < C)
		for (int i = blockIdx.y * rows + threadIdx.y; i < i1; i += COL_Y) {
			float d = dy[(size_t)i * C + j];
			sw += d * ((S::ld(x, (size_t)i * C + j) - stats[i]) * stats[N + i]);
			sb += d;
		}
	col_block_store(sh, sw, part, W);
	__syncthreads(); /* sh is reused */
	col_block_store(sh, sb, part + (size_t)gridDim.y * W, W);
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
	col_sums(ctx, N, C, 2, dw, db, [&](dim3 grid, dim3 block, int j0, const ColPlan &p) {
		layernorm_backward_cols_kernel<S><<<grid, block, 0, ctx->stream>>>(
			ctx->col_part, scratch, dy, x, N, C, j0, p.W, p.rows);
	});
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

/* Attention's products are cuBLAS batched GEMMs (gemm_cuda_batched), one call per batch element
 * b over its NH heads: head h of q, k and v is the (T, hs) block of columns h hs (+ C, + 2 C) of
 * b's (T, 3 C) qkv rows, so consecutive heads are hs elements apart with rows 3 C apart; its
 * output is columns h hs of b's (T, C) rows; its probabilities the (T, T) matrix (b NH + h) T T
 * of att. The full T x T products are computed, as PyTorch eager's are: the kernels below zero
 * the masked upper triangle, so masked terms add exact zeros. The softmax and its backward are
 * warp-per-row kernels with fp32 math; 16-bit storage rounds where cuBLAS or the kernels store
 * (ops16_cpu.h lists the points). */

/* The causal softmax of one (T, T) row in place, row = (b NH + h) T + t: the scores of keys
 * 0..t (as stored by the scores GEMM, so their max is over the rounded values) become rn(e) with
 * e = exp(s - max) summed unrounded, then rn(rn(e) / sum) through the fp32 reciprocal; the keys
 * past t become 0. Lane l owns keys l, l + 32, ...: each pass reads only what the same lane
 * wrote, so no exchange is needed beyond the two warp reductions. */
template <class S>
__global__ static void attention_softmax_kernel(typename S::T *att, size_t rows, int T)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= rows)
		return;
	int t = (int)(row % T);
	typename S::T *p = att + row * T;
	float mx = -INFINITY;
	for (int t2 = lane; t2 <= t; t2 += WARP)
		mx = fmaxf(mx, S::ld(p, t2));
	mx = warp_max(mx);
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
}

/* The softmax backward of a tile of rows in place: d holds nh heads of n query rows t0..t0+n-1,
 * (n, T) each, of datt = dout v^T as stored; att points at head h0's (T, T) probabilities. Row
 * r = hh n + i (query t = t0 + i of head h0 + hh): pdp = sum_{t2 <= t} P dP in fp32, then
 * dS = rn(P (dP - pdp)) for t2 <= t and 0 past it (so a masked dP, however large, adds nothing
 * to the dq and dk products). Lanes own keys as in the forward. */
template <class S>
__global__ static void attention_softmax_backward_kernel(typename S::T *d,
							 const typename S::T *att, int nh, int n,
							 int t0, int T)
{
	size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
	int lane = threadIdx.x % WARP;
	if (row >= (size_t)nh * n)
		return;
	int hh = (int)(row / n), t = t0 + (int)(row % n);
	const typename S::T *p = att + ((size_t)hh * T + t) * T;
	typename S::T *dr = d + row * T;
	float pdp = 0.0f;
	for (int t2 = lane; t2 <= t; t2 += WARP)
		pdp += S::ld(p, t2) * S::ld(dr, t2);
	pdp = warp_sum(pdp);
	for (int t2 = lane; t2 <= t; t2 += WARP)
		dr[t2] = S::st(S::ld(p, t2) * (S::ld(dr, t2) - pdp));
	for (int t2 = t + 1 + lane; t2 < T; t2 += WARP)
		dr[t2] = S::st(0.0f);
}

/* y = rn(x): the 16-bit operand a GEMM takes of an fp32 gradient */
template <class S>
__global__ static void round_store_kernel(typename S::T *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] = S::st(x[i]);
}

static inline void opsd_attention_check(int C, int NH)
{
	CUDA_REQUIRE(NH > 0 && C > 0 && C % NH == 0,
		     "attention: C (%d) must be a positive multiple of NH (%d)", C, NH);
}

/* hs columns of rows ld apart, heads hs apart: one head of qkv, out, dout or dqkv */
static inline GemmBatch opsd_heads(const void *p, int ld, int hs, int trans)
{
	return (GemmBatch){p, ld, (long long)hs, trans};
}

template <class S>
static void opsd_attention_forward(CudaCtx *ctx, typename S::T *out, typename S::T *att,
				   const typename S::T *qkv, int B, int T, int C, int NH)
{
	opsd_attention_check(C, NH);
	if (B <= 0 || T <= 0)
		return;
	int hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
	size_t tt = (size_t)T * T;
	for (int b = 0; b < B; b++) {
		const typename S::T *base = qkv + (size_t)b * T * C3;
		/* S_h (T, T) = scale q_h (T, hs) k_h^T: k_h stored (T, hs), so transposed; each
		 * score rounded once from its fp32 sum (alpha applied in fp32) into att */
		GemmBatch s = {att + (size_t)b * NH * tt, T, (long long)tt, 0};
		gemm_cuda_batched(ctx, (CudaDtype)S::DTYPE, (CudaDtype)S::DTYPE, T, T, hs, scale,
				  opsd_heads(base, C3, hs, 0), opsd_heads(base + C, C3, hs, 1), 0.0f,
				  s, NH);
	}
	size_t rows = (size_t)B * NH * T;
	attention_softmax_kernel<S><<<row_blocks(rows), ROW_THREADS, 0, ctx->stream>>>(att, rows,
										       T);
	CUDA_CHECK_LAUNCH();
	for (int b = 0; b < B; b++) {
		const typename S::T *base = qkv + (size_t)b * T * C3;
		/* out_h (T, hs) = P_h (T, T) v_h (T, hs): out_h is columns h hs of b's (T, C) rows */
		GemmBatch p = {att + (size_t)b * NH * tt, T, (long long)tt, 0};
		gemm_cuda_batched(ctx, (CudaDtype)S::DTYPE, (CudaDtype)S::DTYPE, T, hs, T, 1.0f, p,
				  opsd_heads(base + 2 * C, C3, hs, 0), 0.0f,
				  opsd_heads(out + (size_t)b * T * C, C, hs, 0), NH);
	}
}

/* How the backward tiles its (T, T) score gradients into cap elements: whole heads (n = T rows)
 * as many at a time as fit (nh <= NH), else one head n rows at a time. 0 when not one row fits. */
static inline int opsd_attention_tile(size_t cap, int T, int NH, int *nh, int *n)
{
	size_t tt = (size_t)T * T;
	if (cap >= tt) {
		*n = T;
		*nh = cap / tt < (size_t)NH ? (int)(cap / tt) : NH;
		return 1;
	}
	*nh = 1;
	*n = (int)(cap / T);
	return *n > 0;
}

/* scratch: scratch_elems floats, at least OPS_CUDA_ATTENTION_SCRATCH_MIN_ELEMS; more makes
 * larger tiles (fewer, bigger GEMMs). 16-bit storage first rounds dout there (g = rn(dout), the
 * operand of the dv and datt products), the tiles of datt / dS follow. */
template <class S>
static void opsd_attention_backward(CudaCtx *ctx, float *dqkv, const float *dout,
				    const typename S::T *qkv, const typename S::T *att, int B,
				    int T, int C, int NH, float *scratch, size_t scratch_elems)
{
	typedef typename S::T E;
	opsd_attention_check(C, NH);
	if (B <= 0 || T <= 0)
		return;
	const CudaDtype dt = (CudaDtype)S::DTYPE;
	int hs = C / NH, C3 = 3 * C, nh_max, n_max;
	float scale = 1.0f / sqrtf((float)hs);
	size_t tt = (size_t)T * T, btc = (size_t)B * T * C;
	size_t cap = scratch_elems * sizeof(float) / sizeof(E); /* in elements of E */
	const E *g = (const E *)dout; /* fp32: dout itself */
	E *d = (E *)scratch;
	if (dt != CDT_F32) {
		CUDA_REQUIRE(cap >= btc, "attention backward: scratch of %zu floats is too small",
			     scratch_elems);
		round_store_kernel<S><<<cuda_blocks_for(btc, EW_THREADS), EW_THREADS, 0,
					ctx->stream>>>(d, dout, btc);
		CUDA_CHECK_LAUNCH();
		g = d;
		d += btc;
		cap -= btc;
	}
	CUDA_REQUIRE(opsd_attention_tile(cap, T, NH, &nh_max, &n_max),
		     "attention backward: scratch of %zu floats holds not one row of %d scores",
		     scratch_elems, T);
	for (int b = 0; b < B; b++)
		for (int h0 = 0; h0 < NH; h0 += nh_max)
			for (int t0 = 0; t0 < T; t0 += n_max) {
				int nh = NH - h0 < nh_max ? NH - h0 : nh_max;
				int n = T - t0 < n_max ? T - t0 : n_max;
				size_t hoff = (size_t)h0 * hs;
				const E *base = qkv + (size_t)b * T * C3 + hoff; /* q_h0, row 0 */
				const E *gt = g + ((size_t)b * T + t0) * C + hoff; /* g_h0, row t0 */
				const E *pt = att + ((size_t)b * NH + h0) * tt + (size_t)t0 * T;
				float *dbase = dqkv + (size_t)b * T * C3 + hoff;
				GemmBatch dtile = {d, T, (long long)n * T, 0};
				/* datt_h (n, T) = g_h (n, hs) v_h^T, v_h stored (T, hs): rounded
				 * once to E */
				gemm_cuda_batched(ctx, dt, dt, n, T, hs, 1.0f,
						  opsd_heads(gt, C, hs, 0),
						  opsd_heads(base + 2 * C, C3, hs, 1), 0.0f, dtile,
						  nh);
				/* dv_h (T, hs) += P_h^T g_h: P_h's rows t0.. stored (n, T), so
				 * transposed; the result fp32 */
				GemmBatch p = {pt, T, (long long)tt, 1};
				gemm_cuda_batched(ctx, dt, CDT_F32, T, hs, n, 1.0f, p,
						  opsd_heads(gt, C, hs, 0), 1.0f,
						  opsd_heads(dbase + 2 * C, C3, hs, 0), nh);
				size_t rows = (size_t)nh * n;
				attention_softmax_backward_kernel<S>
					<<<row_blocks(rows), ROW_THREADS, 0, ctx->stream>>>(
						d, att + ((size_t)b * NH + h0) * tt, nh, n, t0, T);
				CUDA_CHECK_LAUNCH();
				/* dq_h (n, hs) += scale dS_h (n, T) k_h (T, hs) */
				gemm_cuda_batched(ctx, dt, CDT_F32, n, hs, T, scale, dtile,
						  opsd_heads(base + C, C3, hs, 0), 1.0f,
						  opsd_heads(dbase + (size_t)t0 * C3, C3, hs, 0), nh);
				/* dk_h (T, hs) += scale dS_h^T q_h: dS_h stored (n, T), transposed;
				 * q_h's rows t0.. (n, hs) */
				GemmBatch ds_t = {d, T, (long long)n * T, 1};
				gemm_cuda_batched(ctx, dt, CDT_F32, T, hs, n, scale, ds_t,
						  opsd_heads(base + (size_t)t0 * C3, C3, hs, 0), 1.0f,
						  opsd_heads(dbase + C, C3, hs, 0), nh);
			}
}

#endif
