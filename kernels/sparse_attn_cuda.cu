#include "sparse_attn_cuda.h"

#include <math.h>

#include "cuda_check.h"

#define THREADS 128

/* the (batch, head) of query row `row` of B NH T rows, and its slices' offsets */
struct RowAt {
	size_t bh, i;
};

__device__ static RowAt row_at(size_t row, int T)
{
	RowAt r = {row / (size_t)T, row % (size_t)T};
	return r;
}

__device__ static float dot_dev(const float *a, const float *b, int n)
{
	float s = 0;
	for (int x = 0; x < n; x++)
		s += a[x] * b[x];
	return s;
}

/* One thread per query row; keys visited as sparse_attn_cpu's FOR_KEPT: kept blocks of the row's
 * block row, keys up to the query under a causal mask. Two passes: the largest score, then the
 * exponentials and the weighted sum of v. */
__device__ static void forward_row(float *out, float *lse, const float *q, const float *k,
				   const float *v, const unsigned char *layout, size_t row, int NH,
				   int T, int hs, int bs, int causal, float scale)
{
	RowAt r = row_at(row, T);
	int nb = T / bs, i = (int)r.i, h = (int)(r.bh % (size_t)NH);
	size_t th = (size_t)T * hs, base = r.bh * th;
	const unsigned char *lay = layout + ((size_t)h * nb + i / bs) * nb;
	const float *qi = q + base + (size_t)i * hs;
	float *o = out + base + (size_t)i * hs, m = -INFINITY, sum = 0;
	for (int c = 0; c < nb; c++)
		if (lay[c])
			for (int j = c * bs; j < (c + 1) * bs && (!causal || j <= i); j++)
				m = fmaxf(m, scale * dot_dev(qi, k + base + (size_t)j * hs, hs));
	for (int x = 0; x < hs; x++)
		o[x] = 0;
	if (m == -INFINITY) {
		lse[row] = -INFINITY;
		return;
	}
	for (int c = 0; c < nb; c++)
		if (lay[c])
			for (int j = c * bs; j < (c + 1) * bs && (!causal || j <= i); j++) {
				float p = expf(scale * dot_dev(qi, k + base + (size_t)j * hs, hs) - m);
				sum += p;
				for (int x = 0; x < hs; x++)
					o[x] += p * v[base + (size_t)j * hs + x];
			}
	for (int x = 0; x < hs; x++)
		o[x] /= sum;
	lse[row] = m + logf(sum);
}

/* One thread per query row: dq of its row alone, dk and dv of the keys it attends to by atomics. */
__device__ static void backward_row(float *dq, float *dk, float *dv, const float *dout,
				    const float *q, const float *k, const float *v, const float *out,
				    const float *lse, const unsigned char *layout, size_t row, int NH,
				    int T, int hs, int bs, int causal, float scale)
{
	if (lse[row] == -INFINITY)
		return;
	RowAt r = row_at(row, T);
	int nb = T / bs, i = (int)r.i, h = (int)(r.bh % (size_t)NH);
	size_t th = (size_t)T * hs, base = r.bh * th, at = base + (size_t)i * hs;
	const unsigned char *lay = layout + ((size_t)h * nb + i / bs) * nb;
	float d = dot_dev(dout + at, out + at, hs);
	for (int c = 0; c < nb; c++)
		if (lay[c])
			for (int j = c * bs; j < (c + 1) * bs && (!causal || j <= i); j++) {
				size_t kj = base + (size_t)j * hs;
				float p = expf(scale * dot_dev(q + at, k + kj, hs) - lse[row]);
				float ds = p * (dot_dev(dout + at, v + kj, hs) - d);
				for (int x = 0; x < hs; x++) {
					atomicAdd(&dv[kj + x], p * dout[at + x]);
					dq[at + x] += scale * ds * k[kj + x];
					atomicAdd(&dk[kj + x], scale * ds * q[at + x]);
				}
			}
}

/* grid-stride over the rows (cuda_blocks_for caps the grid) */
__global__ static void forward_kernel(float *out, float *lse, const float *q, const float *k,
				      const float *v, const unsigned char *layout, size_t rows,
				      int NH, int T, int hs, int bs, int causal, float scale)
{
	for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
	     row += (size_t)gridDim.x * blockDim.x)
		forward_row(out, lse, q, k, v, layout, row, NH, T, hs, bs, causal, scale);
}

__global__ static void backward_kernel(float *dq, float *dk, float *dv, const float *dout,
				       const float *q, const float *k, const float *v,
				       const float *out, const float *lse,
				       const unsigned char *layout, size_t rows, int NH, int T,
				       int hs, int bs, int causal, float scale)
{
	for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
	     row += (size_t)gridDim.x * blockDim.x)
		backward_row(dq, dk, dv, dout, q, k, v, out, lse, layout, row, NH, T, hs, bs,
			     causal, scale);
}

static void check_shape(int T, int bs)
{
	CUDA_REQUIRE(bs > 0 && T % bs == 0, "sparse_attn_cuda: T %d is not a multiple of the block %d",
		     T, bs);
}

extern "C" void sparse_attn_cuda_forward(CudaCtx *ctx, float *out, float *lse, const float *q,
					 const float *k, const float *v,
					 const unsigned char *layout, int B, int NH, int T, int hs,
					 int bs, int causal)
{
	check_shape(T, bs);
	size_t rows = (size_t)B * NH * T;
	forward_kernel<<<cuda_blocks_for(rows, THREADS), THREADS, 0, ctx->stream>>>(
		out, lse, q, k, v, layout, rows, NH, T, hs, bs, causal, 1.0f / sqrtf((float)hs));
	CUDA_CHECK_LAUNCH();
}

extern "C" void sparse_attn_cuda_backward(CudaCtx *ctx, float *dq, float *dk, float *dv,
					  const float *dout, const float *q, const float *k,
					  const float *v, const float *out, const float *lse,
					  const unsigned char *layout, int B, int NH, int T, int hs,
					  int bs, int causal)
{
	check_shape(T, bs);
	size_t rows = (size_t)B * NH * T;
	backward_kernel<<<cuda_blocks_for(rows, THREADS), THREADS, 0, ctx->stream>>>(
		dq, dk, dv, dout, q, k, v, out, lse, layout, rows, NH, T, hs, bs, causal,
		1.0f / sqrtf((float)hs));
	CUDA_CHECK_LAUNCH();
}
