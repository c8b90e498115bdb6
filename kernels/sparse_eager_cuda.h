/* sparse_eager_cuda: sparse_eager_cpu.h's block-sparse attention as the GPT units run it (the
 * kept blocks' probabilities saved for the backward, fused (B, T, 3C) q, k, v, causal inside the
 * kept blocks), on the GPU in fp32: one thread per query row, visiting its kept blocks; the key
 * and value gradients summed with atomics, so they agree with the CPU's to rounding, not bit for
 * bit. The index lives on the device (sparse_eager_cuda_upload). Dimension names as in
 * sparse_eager_cpu.h. */
#ifndef PX_SPARSE_EAGER_CUDA_H
#define PX_SPARSE_EAGER_CUDA_H

#include "cuda_ctx.h"
#include "sparse_eager_cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A SparseIndex whose row_start and cols are device copies; n_kept and the shape as the host's. */
typedef struct SparseIndexDev {
	int NH, nb, bs;
	long long n_kept;
	long long *row_start; /* NH nb + 1, device */
	int *cols;            /* n_kept, device */
} SparseIndexDev;

/* Device copies of ix's arrays (the caller frees them with sparse_eager_cuda_free); 0, or -1
 * when device memory is short. */
int sparse_eager_cuda_upload(SparseIndexDev *dev, const SparseIndex *ix);
void sparse_eager_cuda_free(SparseIndexDev *dev);

/* out (B, T, C) and probs (sparse_eager_probs_elems) as sparse_eager_forward's. */
void sparse_eager_cuda_forward(CudaCtx *ctx, float *out, float *probs, const float *qkv,
			       const SparseIndexDev *ix, int B, int T, int C);
/* dqkv (B, T, 3C) += the gradient of out given dout (B, T, C): sparse_eager_backward's. */
void sparse_eager_cuda_backward(CudaCtx *ctx, float *dqkv, const float *dout, const float *qkv,
				const float *probs, const SparseIndexDev *ix, int B, int T, int C);

#ifdef __cplusplus
}
#endif

#endif
