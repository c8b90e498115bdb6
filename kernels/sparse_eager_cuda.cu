#include "sparse_eager_cuda.h"

#include <math.h>

#include "cuda_check.h"

#define THREADS 128

/* What one thread needs of its query row: batch b, head h, token i, the head's slices. */
struct Row {
	int b, h, i, ii, hs;
	size_t row3, hoff;
	long long ks, ke;
	const float *base; /* batch element b's first token in qkv */
};

__device__ static Row row_of(const SparseIndexDev ix, size_t row, int T, int C, const float *qkv)
{
	Row r;
	r.i = (int)(row % (size_t)T);
	r.h = (int)(row / (size_t)T % (size_t)ix.NH);
	r.b = (int)(row / ((size_t)T * ix.NH));
	r.ii = r.i % ix.bs;
	r.hs = C / ix.NH;
	r.row3 = (size_t)3 * C;
	r.hoff = (size_t)r.h * r.hs;
	size_t hr = (size_t)r.h * ix.nb + (size_t)(r.i / ix.bs);
	r.ks = ix.row_start[hr];
	r.ke = ix.row_start[hr + 1];
	r.base = qkv + (size_t)r.b * T * r.row3;
	return r;
}

/* the probabilities of the row within kept block k */
__device__ static float *prow(float *probs, const SparseIndexDev ix, const Row r, long long k)
{
	return probs + (((size_t)r.b * (size_t)ix.n_kept + (size_t)k) * ix.bs + (size_t)r.ii) * ix.bs;
}

__device__ static float dot_dev(const float *a, const float *b, int n)
{
	float s = 0.0f;
	for (int x = 0; x < n; x++)
		s += a[x] * b[x];
	return s;
}

/* As sparse_eager_cpu's forward_head for one query: scores of the visible keys (kept blocks,
 * keys at or before it; the others 0), softmax with the sum in double, out = P v. */
__global__ static void forward_kernel(float *out, float *probs, const float *qkv,
				      const SparseIndexDev ix, size_t rows, int T, int C)
{
	for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
	     row += (size_t)gridDim.x * blockDim.x) {
		Row r = row_of(ix, row, T, C, qkv);
		float scale = 1.0f / sqrtf((float)r.hs), mx = -INFINITY;
		const float *q = r.base + (size_t)r.i * r.row3 + r.hoff;
		for (long long k = r.ks; k < r.ke; k++) {
			float *p = prow(probs, ix, r, k);
			for (int jj = 0; jj < ix.bs; jj++) {
				int j = ix.cols[k] * ix.bs + jj;
				p[jj] = j <= r.i ? dot_dev(q, r.base + (size_t)j * r.row3 + C + r.hoff,
							   r.hs) * scale : 0.0f;
				if (j <= r.i)
					mx = fmaxf(mx, p[jj]);
			}
		}
		double sum = 0.0;
		for (long long k = r.ks; k < r.ke; k++) {
			float *p = prow(probs, ix, r, k);
			for (int jj = 0; jj < ix.bs && ix.cols[k] * ix.bs + jj <= r.i; jj++) {
				p[jj] = expf(p[jj] - mx);
				sum += p[jj];
			}
		}
		float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
		float *o = out + ((size_t)r.b * T + r.i) * C + r.hoff;
		for (int x = 0; x < r.hs; x++)
			o[x] = 0.0f;
		for (long long k = r.ks; k < r.ke; k++) {
			float *p = prow(probs, ix, r, k);
			for (int jj = 0; jj < ix.bs && ix.cols[k] * ix.bs + jj <= r.i; jj++) {
				int j = ix.cols[k] * ix.bs + jj;
				p[jj] *= inv;
				const float *v = r.base + (size_t)j * r.row3 + 2 * (size_t)C + r.hoff;
				for (int x = 0; x < r.hs; x++)
					o[x] += p[jj] * v[x];
			}
		}
	}
}

/* As backward_head for one query: dP = dout . v, dv += P dout (atomics), dS = P (dP - sum P dP),
 * dq += scale dS k (its own row), dk += scale dS q (atomics). */
__global__ static void backward_kernel(float *dqkv, const float *dout, const float *qkv,
				       const float *probs, const SparseIndexDev ix, size_t rows,
				       int T, int C)
{
	for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
	     row += (size_t)gridDim.x * blockDim.x) {
		Row r = row_of(ix, row, T, C, qkv);
		float scale = 1.0f / sqrtf((float)r.hs);
		const float *q = r.base + (size_t)r.i * r.row3 + r.hoff;
		const float *g = dout + ((size_t)r.b * T + r.i) * C + r.hoff;
		float *dbase = dqkv + (size_t)r.b * T * r.row3, *dq = dbase + (size_t)r.i * r.row3 +
								       r.hoff;
		double pdp = 0.0;
		for (long long k = r.ks; k < r.ke; k++) {
			const float *p = prow((float *)probs, ix, r, k);
			for (int jj = 0; jj < ix.bs && ix.cols[k] * ix.bs + jj <= r.i; jj++) {
				size_t j = (size_t)ix.cols[k] * ix.bs + jj;
				const float *v = r.base + j * r.row3 + 2 * (size_t)C + r.hoff;
				float *dv = dbase + j * r.row3 + 2 * (size_t)C + r.hoff;
				pdp += p[jj] * dot_dev(g, v, r.hs);
				for (int x = 0; x < r.hs; x++)
					atomicAdd(&dv[x], p[jj] * g[x]);
			}
		}
		for (long long k = r.ks; k < r.ke; k++) {
			const float *p = prow((float *)probs, ix, r, k);
			for (int jj = 0; jj < ix.bs && ix.cols[k] * ix.bs + jj <= r.i; jj++) {
				size_t j = (size_t)ix.cols[k] * ix.bs + jj;
				const float *kk = r.base + j * r.row3 + C + r.hoff;
				const float *v = r.base + j * r.row3 + 2 * (size_t)C + r.hoff;
				float *dk = dbase + j * r.row3 + C + r.hoff;
				float ds = p[jj] * (dot_dev(g, v, r.hs) - (float)pdp) * scale;
				for (int x = 0; x < r.hs; x++) {
					dq[x] += ds * kk[x];
					atomicAdd(&dk[x], ds * q[x]);
				}
			}
		}
	}
}

extern "C" int sparse_eager_cuda_upload(SparseIndexDev *dev, const SparseIndex *ix)
{
	size_t rows = ((size_t)ix->NH * ix->nb + 1) * sizeof(long long);
	size_t cols = (size_t)(ix->n_kept ? ix->n_kept : 1) * sizeof(int);
	*dev = (SparseIndexDev){ix->NH, ix->nb, ix->bs, ix->n_kept, NULL, NULL};
	if (cudaMalloc((void **)&dev->row_start, rows) != cudaSuccess ||
	    cudaMalloc((void **)&dev->cols, cols) != cudaSuccess) {
		sparse_eager_cuda_free(dev);
		return -1;
	}
	CUDA_CHECK(cudaMemcpy(dev->row_start, ix->row_start, rows, cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemcpy(dev->cols, ix->cols, (size_t)ix->n_kept * sizeof(int),
			      cudaMemcpyHostToDevice));
	return 0;
}

extern "C" void sparse_eager_cuda_free(SparseIndexDev *dev)
{
	if (!dev)
		return;
	cudaFree(dev->row_start);
	cudaFree(dev->cols);
	dev->row_start = NULL, dev->cols = NULL;
}

extern "C" void sparse_eager_cuda_forward(CudaCtx *ctx, float *out, float *probs,
					  const float *qkv, const SparseIndexDev *ix, int B, int T,
					  int C)
{
	size_t rows = (size_t)B * ix->NH * T;
	forward_kernel<<<cuda_blocks_for(rows, THREADS), THREADS, 0, ctx->stream>>>(
		out, probs, qkv, *ix, rows, T, C);
	CUDA_CHECK_LAUNCH();
}

extern "C" void sparse_eager_cuda_backward(CudaCtx *ctx, float *dqkv, const float *dout,
					   const float *qkv, const float *probs,
					   const SparseIndexDev *ix, int B, int T, int C)
{
	size_t rows = (size_t)B * ix->NH * T;
	backward_kernel<<<cuda_blocks_for(rows, THREADS), THREADS, 0, ctx->stream>>>(
		dqkv, dout, qkv, probs, *ix, rows, T, C);
	CUDA_CHECK_LAUNCH();
}
