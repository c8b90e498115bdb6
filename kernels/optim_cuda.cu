/* optim_cuda: optimizer and gradient-norm kernels. */
#include <math.h>

#include "cuda_check.h"
#include "optim_cuda.h"
#include "cast_dev.cuh"

#define OPT_THREADS 256

/* AdamW's per-step constants, rounded from double once, as ops_adamw_step forms them. */
typedef struct AdamwConsts {
	float b1, b2, one_b1, one_b2, step_size, rsqrt_bc2, eps, decay;
} AdamwConsts;

static AdamwConsts adamw_consts(const OpsAdamw *h, long step)
{
	AdamwConsts k;
	k.b1 = (float)h->beta1;
	k.b2 = (float)h->beta2;
	k.one_b1 = (float)(1.0 - h->beta1);
	k.one_b2 = (float)(1.0 - h->beta2);
	k.step_size = (float)(h->lr / (1.0 - pow(h->beta1, (double)step)));
	k.rsqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)step)));
	k.eps = (float)h->eps;
	k.decay = (float)(h->lr * h->weight_decay);
	return k;
}

/* One element's update; returns the new parameter. Written with the _rn intrinsics, which the
 * compiler never contracts into fused multiply-adds, in the reference's order of evaluation, so
 * the result is ops_adamw_step's bit for bit: the reference does not fuse either, being built as
 * ISO C (-std=c11), where GCC does not contract (GCC 12 emits no vfmadd even at -march=haswell).
 * A host compiler that did would make the bit-for-bit tests fail by an ulp, not pass wrongly. */
__device__ static float adamw_one(float p, float *m, float *v, float g, const AdamwConsts &k)
{
	float mi = __fadd_rn(__fmul_rn(k.b1, *m), __fmul_rn(k.one_b1, g));
	float vi = __fadd_rn(__fmul_rn(k.b2, *v), __fmul_rn(__fmul_rn(k.one_b2, g), g));
	*m = mi;
	*v = vi;
	float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.rsqrt_bc2), k.eps);
	float upd = __fadd_rn(__fdiv_rn(__fmul_rn(k.step_size, mi), denom), __fmul_rn(k.decay, p));
	return __fsub_rn(p, upd);
}

__global__ static void adamw_kernel(float *param, float *m, float *v, const void *grad,
				    int grad_type, void *lp, int lp_type, size_t n, AdamwConsts k,
				    float grad_scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = __fmul_rn(castd_load(grad, i, grad_type), grad_scale);
		float p = adamw_one(param[i], m + i, v + i, g, k);
		param[i] = p;
		if (!lp)
			continue;
		if (lp_type == CDT_BF16)
			((uint16_t *)lp)[i] = castd_f32_to_bf16(p);
		else if (lp_type == CDT_F16)
			((uint16_t *)lp)[i] = castd_f32_to_f16(p);
		else
			((float *)lp)[i] = p;
	}
}

static void check_dtype(CudaDtype t)
{
	CUDA_REQUIRE(t == CDT_F32 || t == CDT_BF16 || t == CDT_F16, "optim_cuda: unknown type %d",
		     (int)t);
}

void optim_cuda_adamw_mixed(CudaCtx *ctx, float *master, float *m, float *v, const void *grad,
			    CudaDtype grad_type, void *param_lp, CudaDtype lp_type, size_t n,
			    const OpsAdamw *h, long step, float grad_scale)
{
	check_dtype(grad_type);
	check_dtype(lp_type);
	CUDA_REQUIRE(step >= 1, "optim_cuda: AdamW steps count from 1, got %ld", step);
	if (!n)
		return;
	adamw_kernel<<<cuda_blocks_for(n, OPT_THREADS), OPT_THREADS, 0, ctx->stream>>>(
		master, m, v, grad, grad_type, param_lp, lp_type, n, adamw_consts(h, step),
		grad_scale);
	CUDA_CHECK_LAUNCH();
}

void optim_cuda_adamw_step(CudaCtx *ctx, float *param, float *m, float *v, const float *grad,
			   size_t n, const OpsAdamw *h, long step, float grad_scale)
{
	optim_cuda_adamw_mixed(ctx, param, m, v, grad, CDT_F32, NULL, CDT_F32, n, h, step,
			       grad_scale);
}

__global__ static void sgd_kernel(float *param, float *buf, const float *grad, size_t n, float lr,
				  float momentum, float weight_decay, float grad_scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		/* _rn intrinsics: no FMA contraction, so bit for bit ops_sgd_step */
		float g = __fadd_rn(__fmul_rn(grad[i], grad_scale), __fmul_rn(weight_decay, param[i]));
		if (buf) {
			buf[i] = __fadd_rn(__fmul_rn(momentum, buf[i]), g);
			g = buf[i];
		}
		param[i] = __fsub_rn(param[i], __fmul_rn(lr, g));
	}
}

void optim_cuda_sgd_step(CudaCtx *ctx, float *param, float *buf, const float *grad, size_t n,
			 float lr, float momentum, float weight_decay, float grad_scale)
{
	if (!n)
		return;
	/* as the reference: no momentum state is kept when momentum is 0 */
	float *state = momentum != 0.0f ? buf : NULL;
	sgd_kernel<<<cuda_blocks_for(n, OPT_THREADS), OPT_THREADS, 0, ctx->stream>>>(
		param, state, grad, n, lr, momentum, weight_decay, grad_scale);
	CUDA_CHECK_LAUNCH();
}

__global__ static void sum_squares_kernel(double *sum, const void *x, int dtype, size_t n)
{
	__shared__ double part[OPT_THREADS];
	double s = 0.0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		double v = castd_load(x, i, dtype);
		s += v * v;
	}
	part[threadIdx.x] = s;
	__syncthreads();
	for (int w = OPT_THREADS / 2; w > 0; w >>= 1) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		atomicAdd(sum, part[0]);
}

double optim_cuda_sum_squares(CudaCtx *ctx, const void *x, CudaDtype dtype, size_t n)
{
	check_dtype(dtype);
	double *acc = ctx->scalars + CUDA_SCALAR_SUM;
	CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), ctx->stream));
	if (n) {
		/* a few blocks a multiprocessor's worth is plenty for a bandwidth-bound sum */
		unsigned blocks = cuda_blocks_for(n, OPT_THREADS);
		if (blocks > 1024)
			blocks = 1024;
		sum_squares_kernel<<<blocks, OPT_THREADS, 0, ctx->stream>>>(acc, x, dtype, n);
		CUDA_CHECK_LAUNCH();
	}
	double s = 0.0;
	cuda_ctx_download(ctx, &s, acc, sizeof(s));
	return s;
}
